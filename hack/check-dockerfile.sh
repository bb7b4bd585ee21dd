#!/usr/bin/env bash
# Builds the Dockerfile's images without a container engine (`make image`), and checks
# them (`make dockerfile-check` is the same run). For every variant (a `build-<variant>`
# stage and its `runtime-<variant>` stage), in the checkout:
#   - runs the stage's `RUN cargo build ...` and `RUN hack/...` commands exactly as
#     written (RUN flags such as --mount dropped), with the stage's ARG defaults in the
#     environment unless the caller sets them, as `docker build --build-arg` would;
#     its other RUN commands (apt-get) are the host's business: hack/build-deps.sh;
#   - checks that the runtime stage is `FROM scratch` plus one COPY of the root
#     filesystem the build stage assembled (hack/image-rootfs.sh), and that this tree
#     holds the ENTRYPOINT, the programs banlieue runs ($runtime_tools: qemu-img, for
#     CopyDisk) on the image's PATH, every shared library and interpreter they load on
#     its LD_LIBRARY_PATH, and no libvirt for a variant whose features leave it out;
#   - runs `--version` inside that tree (chroot, as the image's USER) and checks it
#     names $BANLIEUE_GIT_REV, and that `bootstrap operator` deploys the Dockerfile's USER;
#   - packs the tree with the last stage's ENV, LABELs, USER, ENTRYPOINT and CMD into
#     target/image/banlieue-<version>-<variant>.oci.tar (tools/oci-image; every time is
#     the commit's), twice from two assemblies of the tree, and fails unless both
#     digests agree; target/image/digests.txt lists them.
# The default VARIANT is built last, so target/release/banlieue ends as the full build.
#
# Usage: hack/check-dockerfile.sh [DOCKERFILE]   (CARGO overrides `cargo`;
#        DOCKERFILE_VARIANTS="full" checks only the variants named)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
dockerfile="${1:-Dockerfile}"
export CARGO="${CARGO:-cargo}"
# Command lines run through `bash -c` call plain `cargo`: let CARGO decide which.
cargo_dir="$(mktemp -d)"
trap 'rm -rf "$cargo_dir"' EXIT
if [[ "$CARGO" != cargo ]]; then
  printf '#!/bin/sh\nexec %q "$@"\n' "$CARGO" >"$cargo_dir/cargo"
  chmod +x "$cargo_dir/cargo"
  export PATH="$cargo_dir:$PATH"
fi

# The Dockerfile's paths name the build's target dir `target/`; a caller's
# CARGO_TARGET_DIR moves it (cargo follows it, hack/ commands and COPY sources are
# rewritten to it).
target_dir="${CARGO_TARGET_DIR:-target}"
in_target_dir() {
  if [[ "$target_dir" == target ]]; then cat; else sed -E "s#(^|[[:space:]])target/#\\1${target_dir}/#g"; fi
}

fail() {
  echo "check-dockerfile: $*" >&2
  exit 1
}

# Programs banlieue runs that every runtime image must have on its PATH (CopyDisk's
# `qemu-img convert`).
runtime_tools=(qemu-img)

# The Dockerfile as instructions, one a line: continuations joined, comments dropped.
instructions="$(sed -e '/^[[:space:]]*#/d' "$dockerfile" | sed -e ':a' -e '/\\$/N; s/\\\n[[:space:]]*/ /; ta' | sed -e '/^[[:space:]]*$/d')"

# The instructions of stage $1 (from its FROM line to the next FROM).
stage() {
  awk -v name="$1" '
    toupper($1) == "FROM" { inside = (tolower($NF) == name && tolower($(NF-1)) == "as") }
    inside' <<<"$instructions"
}
# The value of global `ARG $1=...` (before the first FROM).
global_arg() {
  awk -v name="$1" '
    toupper($1) == "FROM" { exit }
    toupper($1) == "ARG" { split($2, kv, "="); if (kv[1] == name) print substr($2, length(name) + 2) }' <<<"$instructions"
}

default_variant="$(global_arg VARIANT)"
[[ -n "$default_variant" ]] || fail "no global 'ARG VARIANT=<default>'"
mapfile -t variants < <(awk 'toupper($1) == "FROM" && tolower($(NF-1)) == "as" && $NF ~ /^build-/ {sub(/^build-/, "", $NF); print $NF}' <<<"$instructions")
(( ${#variants[@]} > 0 )) || fail "no build-<variant> stage"
printf '%s\n' "${variants[@]}" | grep -qx "$default_variant" || fail "no build-$default_variant stage for the default VARIANT"
final_from="$(awk 'toupper($1) == "FROM" {line = $0} END {print line}' <<<"$instructions")"
[[ "$final_from" =~ ^FROM[[:space:]]+runtime-\$\{?VARIANT\}?[[:space:]]*$ ]] || fail "the last stage must be 'FROM runtime-\${VARIANT}', found: $final_from"
final="$(awk '{lines[NR] = $0} toupper($1) == "FROM" {start = NR} END {for (i = start; i <= NR; i++) print lines[i]}' <<<"$instructions")"
user="$(awk 'toupper($1) == "USER" {print $2}' <<<"$final" | tail -n1)"
[[ "$user" =~ ^[0-9]+(:[0-9]+)?$ ]] || fail "the image's USER must be numeric (runAsNonRoot needs a uid), found '${user:-none}'"
entrypoint="$(awk 'toupper($1) == "ENTRYPOINT"' <<<"$final" | sed -E 's/^ENTRYPOINT[[:space:]]+\[[[:space:]]*"([^"]+)".*/\1/')"
[[ "$entrypoint" == /* ]] || fail "the image needs an exec-form ENTRYPOINT, found '${entrypoint:-none}'"

# The image config: the final stage's ENV (PATH, LD_LIBRARY_PATH), LABELs, CMD.
ld_path="$(awk 'toupper($1) == "ENV" {for (i = 2; i <= NF; i++) if ($i ~ /^LD_LIBRARY_PATH=/) print substr($i, 17)}' <<<"$final" | tail -n1)"
image_path="$(awk 'toupper($1) == "ENV" {for (i = 2; i <= NF; i++) if ($i ~ /^PATH=/) print substr($i, 6)}' <<<"$final" | tail -n1)"
[[ -n "$image_path" && -n "$ld_path" ]] || fail "the last stage must set ENV PATH=... LD_LIBRARY_PATH=... (a scratch image has no defaults)"
entrypoint_json="$(awk 'toupper($1) == "ENTRYPOINT"' <<<"$final" | sed -E 's/^ENTRYPOINT[[:space:]]+//')"
cmd_json="$(awk 'toupper($1) == "CMD"' <<<"$final" | sed -E 's/^CMD[[:space:]]+//' | tail -n1)"
mapfile -t labels < <(awk 'toupper($1) == "LABEL"' <<<"$final" | grep -oE '[A-Za-z0-9._-]+="[^"]*"' | sed -E 's/="(.*)"$/=\1/')
image_repository="$(sed -nE 's/^pub const IMAGE_REPOSITORY: &str = "([^"]+)";/\1/p' bins/banlieue/src/install/mod.rs)"
[[ -n "$image_repository" ]] || fail "no IMAGE_REPOSITORY in bins/banlieue/src/install/mod.rs"
# Every time in the image is the commit's.
epoch="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}"
created="$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)"

# The Rust image must be able to build the workspace (rust-version in Cargo.toml).
rust_version="$(global_arg RUST_VERSION)"
msrv="$(sed -nE 's/^rust-version[[:space:]]*=[[:space:]]*"([^"]+)".*/\1/p' Cargo.toml | head -n1)"
if [[ -n "$rust_version" && -n "$msrv" ]] && [[ "$(printf '%s\n%s\n' "$msrv" "$rust_version" | sort -V | head -n1)" != "$msrv" ]]; then
  fail "RUST_VERSION $rust_version is older than the workspace's rust-version $msrv"
fi

hack/build-deps.sh
"$CARGO" build --quiet --locked --release -p banlieue-oci-image
oci_image="$target_dir/release/oci-image"
image_dir="$target_dir/image"
mkdir -p "$image_dir"
rm -f "$image_dir/digests.txt"
version="$(sed -nE '/^\[workspace.package\]/,/^\[/ s/^version[[:space:]]*=[[:space:]]*"([^"]+)".*/\1/p' Cargo.toml | head -n1)"
summary=()
mapfile -t ordered < <(printf '%s\n' "${variants[@]}" | grep -vx "$default_variant"; echo "$default_variant")
if [[ -n "${DOCKERFILE_VARIANTS:-}" ]]; then
  for wanted in $DOCKERFILE_VARIANTS; do
    printf '%s\n' "${variants[@]}" | grep -qx "$wanted" || fail "DOCKERFILE_VARIANTS: no build-$wanted stage"
  done
  mapfile -t ordered < <(printf '%s\n' "${ordered[@]}" | grep -xF -f <(tr ' ' '\n' <<<"$DOCKERFILE_VARIANTS"))
  echo "check-dockerfile: only ${ordered[*]} (DOCKERFILE_VARIANTS)" >&2
fi
for variant in "${ordered[@]}"; do
  build="$(stage "build-$variant")"
  runtime="$(stage "runtime-$variant")"
  [[ -n "$runtime" ]] || fail "build-$variant has no runtime-$variant stage"
  workdir="$(awk 'toupper($1) == "WORKDIR" {print $2}' <<<"$build" | tail -n1)"
  [[ "$workdir" == /* ]] || fail "build-$variant needs an absolute WORKDIR"

  # ARG defaults, unless the caller passes the variable (docker build --build-arg).
  env_args=()
  while read -r name value; do
    [[ -n "$name" ]] || continue
    if [[ -v "$name" ]]; then env_args+=("$name=${!name}"); else env_args+=("$name=$value"); fi
  done < <(awk 'toupper($1) == "ARG" && $2 ~ /=/ {i = index($2, "="); print substr($2, 1, i - 1), substr($2, i + 1)}' <<<"$build")
  git_rev=""
  for kv in "${env_args[@]}"; do [[ "$kv" == BANLIEUE_GIT_REV=* ]] && git_rev="${kv#*=}"; done

  cargo_builds=0
  features_without_libvirt=0
  while read -r run; do
    # `RUN [--flag=...]... command`: the command as the stage's shell would get it.
    command="$(sed -E 's/^RUN[[:space:]]+//; :f; s/^--[a-z-]+=[^[:space:]]+[[:space:]]+//; tf' <<<"$run")"
    case "$command" in
      "cargo build "*)
        [[ " $command " == *" --locked "* && " $command " == *" --release "* ]] || fail "build-$variant: cargo build without --locked --release: $command"
        if [[ " $command " == *" --no-default-features "* && "$command" != *libvirt* ]]; then features_without_libvirt=1; fi
        cargo_builds=$((cargo_builds + 1)) ;;
      hack/*) command="$(in_target_dir <<<"$command")" ;;
      *) echo "check-dockerfile: build-$variant: not run here (hack/build-deps.sh provides the host's packages): $command" >&2; continue ;;
    esac
    echo "check-dockerfile: build-$variant: ${env_args[*]} $command" >&2
    start=$SECONDS
    env "${env_args[@]}" bash -euo pipefail -c "$command" </dev/null || fail "build-$variant: failed: $command"
    summary+=("$(printf '%4ss  build-%s: %s' $((SECONDS - start)) "$variant" "$command")")
  done < <(grep -E '^RUN[[:space:]]' <<<"$build")
  (( cargo_builds > 0 )) || fail "build-$variant runs no 'cargo build'"

  # The runtime stage: FROM scratch and one COPY of the rootfs the build stage made.
  from_line="$(awk 'toupper($1) == "FROM"' <<<"$runtime")"
  [[ "$(awk '{print tolower($2)}' <<<"$from_line")" == scratch ]] || fail "runtime-$variant must be 'FROM scratch AS runtime-$variant' (hack/image-rootfs.sh makes the whole filesystem), found: $from_line"
  copies="$(awk 'toupper($1) == "COPY"' <<<"$runtime")"
  [[ "$(grep -c . <<<"$copies")" == 1 ]] || fail "runtime-$variant must COPY exactly one tree (the rootfs), found: $copies"
  read -r _ from src dest <<<"$copies"
  [[ "$from" == "--from=build-$variant" && "$dest" == / && "$src" == "$workdir"/*/ ]] || fail "runtime-$variant: want 'COPY --from=build-$variant $workdir/<rootfs>/ /', found: $copies"
  rootfs="$(in_target_dir <<<"${src#"$workdir"/}")"
  rootfs="${rootfs%/}"
  [[ -d "$rootfs" && -n "$(ls -A "$rootfs")" ]] || fail "runtime-$variant: no (or an empty) $rootfs after the build"
  binary="$rootfs$entrypoint"
  [[ -f "$binary" && -x "$binary" ]] || fail "runtime-$variant: the rootfs has no program at the ENTRYPOINT $entrypoint"
  for tool in "${runtime_tools[@]}"; do
    found=""
    IFS=: read -ra path_dirs <<<"$image_path"
    for d in "${path_dirs[@]}"; do [[ -x "$rootfs$d/$tool" ]] && found="$rootfs$d/$tool"; done
    [[ -n "$found" ]] || fail "runtime-$variant: no $tool in a directory on the image's PATH ($image_path)"
  done

  # Every library each program needs is in the rootfs where the loader looks (there is
  # no base image: glibc too), and so is its interpreter.
  mapfile -t programs < <(find "$rootfs" -type f -perm -u+x -exec sh -c 'head -c4 "$1" | od -An -tx1 | tr -d " \n" | grep -qx 7f454c46' _ {} \; -print)
  IFS=: read -ra lib_dirs <<<"$ld_path"
  for program in "${programs[@]}"; do
    [[ "$program" == */ld-linux* ]] && continue
    mapfile -t needed < <(hack/runtime-libs.sh --all --list "$program")
    for lib in "${needed[@]}"; do
      found=0
      for dir in "${lib_dirs[@]}"; do [[ -f "$rootfs$dir/$lib" ]] && found=1; done
      (( found )) || fail "runtime-$variant: $program needs $lib, which the image does not have on LD_LIBRARY_PATH ($ld_path)"
    done
    interp="$(ldd "$program" | awk '$1 ~ /^\/.*ld-linux/ {print $1; exit}')"
    [[ -z "$interp" || -f "$rootfs$interp" ]] || fail "runtime-$variant: $program's interpreter $interp is not in the image"
  done
  if (( features_without_libvirt )) && ldd "$binary" | grep -q libvirt; then
    fail "runtime-$variant: $binary links libvirt although its features leave it out"
  fi

  # The image's own filesystem runs it, as its USER, with nothing from this machine.
  want="banlieue $version (git ${git_rev:-unknown})"
  if [[ $(id -u) == 0 ]] && command -v chroot >/dev/null; then
    chroot_bin="$(command -v chroot)"
    run_in_image() { env -i PATH="$image_path" LD_LIBRARY_PATH="$ld_path" "$chroot_bin" --userspec="$user" "$rootfs" "$@"; }
    got="$(run_in_image "$entrypoint" --version)" || fail "runtime-$variant: $entrypoint --version fails inside the image's filesystem"
    for tool in "${runtime_tools[@]}"; do
      run_in_image "$tool" --version >/dev/null || fail "runtime-$variant: $tool --version fails inside the image's filesystem"
    done
  else
    echo "check-dockerfile: NOT ROOT: running $binary with this machine's loader, not inside the image's filesystem (chroot needs root)" >&2
    got="$(LD_LIBRARY_PATH="$rootfs${ld_path//:/:$rootfs}" "$binary" --version)"
  fi
  [[ "$got" == "$want" ]] || fail "runtime-$variant: --version says '$got', want '$want'"
  deployment="$("$binary" bootstrap operator --dry-run)"
  grep -qE "^[[:space:]]+runAsUser: ${user%%:*}$" <<<"$deployment" || fail "runtime-$variant: bootstrap operator does not run the manager as the image's USER ${user%%:*}"

  # The image: the rootfs packed with the final stage's config, twice from two
  # assemblies of the tree; the digests must agree.
  reference="$image_repository:$version"
  [[ "$variant" == "$default_variant" ]] || reference="$reference-$variant"
  archive="$image_dir/banlieue-$version-$variant.oci.tar"
  pack=("$oci_image" --epoch "$epoch" --user "$user" --entrypoint "$entrypoint_json" --env "PATH=$image_path" --env "LD_LIBRARY_PATH=$ld_path")
  [[ -n "$cmd_json" ]] && pack+=(--cmd "$cmd_json")
  for label in "${labels[@]}"; do pack+=(--label "$label"); done
  pack+=(--label "org.opencontainers.image.version=$version" --label "org.opencontainers.image.revision=${git_rev:-unknown}" --label "org.opencontainers.image.created=$created")
  read -r digest _ < <("${pack[@]}" --rootfs "$rootfs" --ref "$reference" --out "$archive")
  again="$(mktemp -d)"
  build_cmd="$(grep -E '^RUN[[:space:]]+hack/image-rootfs\.sh' <<<"$build" | sed -E 's/^RUN[[:space:]]+//' | in_target_dir)"
  read -r -a rootfs_args <<<"$build_cmd"
  "${rootfs_args[0]}" "${rootfs_args[1]}" "$again/rootfs" 2>/dev/null
  read -r digest_again _ < <("${pack[@]}" --rootfs "$again/rootfs" --ref "$reference" --out "$again/image.tar" 2>/dev/null)
  rm -rf "$again"
  [[ "$digest" == "$digest_again" ]] || fail "runtime-$variant: packing the image twice gave $digest and $digest_again (not reproducible)"
  echo "$digest $reference $archive" >>"$image_dir/digests.txt"
  summary+=("$(printf '       runtime-%s: %s %s, %s (%s; %d programs, %d libraries)' "$variant" "$reference" "$digest" "$archive" "$(du -h "$archive" | cut -f1)" "${#programs[@]}" "$(find "$rootfs/usr/lib/banlieue" -type f | wc -l)")")
done

echo "Dockerfile: ${#ordered[@]} of ${#variants[@]} variants checked (default $default_variant):"
printf '  %s\n' "${summary[@]}"
