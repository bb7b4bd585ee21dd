#!/usr/bin/env bash
# Checks the Dockerfile's build stages without a container engine. For every variant
# (a `build-<variant>` stage and its `runtime-<variant>` stage), in the checkout:
#   - runs the stage's `RUN cargo build ...` and `RUN hack/...` commands exactly as
#     written (RUN flags such as --mount dropped), with the stage's ARG defaults in the
#     environment unless the caller sets them, as `docker build --build-arg` would;
#     its other RUN commands (apt-get) are the host's business: hack/build-deps.sh;
#   - checks that everything the runtime stage COPYs from it exists under WORKDIR;
#   - checks that the runtime stage ships the programs banlieue runs ($runtime_tools:
#     qemu-img, for CopyDisk) in a directory on the image's PATH;
#   - checks that every shared library the binary and those programs (every ELF file
#     the stage COPYs) need beyond the base image's glibc is in a COPYed directory on
#     the stage's LD_LIBRARY_PATH, and that a variant whose features leave libvirt out
#     does not link it;
#   - checks that the binary's --version names $BANLIEUE_GIT_REV (what the Dockerfile
#     passes) and that `bootstrap operator` deploys it as the Dockerfile's USER.
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
# `qemu-img convert`), and the PATH of the base image (distroless) unless a stage sets one.
runtime_tools=(qemu-img)
base_path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

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

# The Rust image must be able to build the workspace (rust-version in Cargo.toml).
rust_version="$(global_arg RUST_VERSION)"
msrv="$(sed -nE 's/^rust-version[[:space:]]*=[[:space:]]*"([^"]+)".*/\1/p' Cargo.toml | head -n1)"
if [[ -n "$rust_version" && -n "$msrv" ]] && [[ "$(printf '%s\n%s\n' "$msrv" "$rust_version" | sort -V | head -n1)" != "$msrv" ]]; then
  fail "RUST_VERSION $rust_version is older than the workspace's rust-version $msrv"
fi

hack/build-deps.sh
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

  # What the runtime stage takes from the build stage, mapped into the checkout.
  binary="" lib_dirs=() programs=() shipped=()
  ld_path="$(awk 'toupper($1) == "ENV" {for (i = 2; i <= NF; i++) if ($i ~ /^LD_LIBRARY_PATH=/) print substr($i, 17)}' <<<"$runtime" | tail -n1)"
  image_path="$(awk 'toupper($1) == "ENV" {for (i = 2; i <= NF; i++) if ($i ~ /^PATH=/) print substr($i, 6)}' <<<"$runtime" | tail -n1)"
  image_path="${image_path:-$base_path}"
  while read -r _ from src dest; do
    [[ "$from" == "--from=build-$variant" ]] || fail "runtime-$variant copies from elsewhere: COPY $from $src $dest"
    [[ "$src" == "$workdir"/* ]] || fail "runtime-$variant: $src is outside the build WORKDIR $workdir"
    local_src="$(in_target_dir <<<"${src#"$workdir"/}")"
    if [[ "$src" == */ ]]; then
      [[ -d "$local_src" && -n "$(ls -A "$local_src")" ]] || fail "runtime-$variant: COPY source $src: no (or an empty) $local_src after the build"
      [[ ":$ld_path:" == *":${dest%/}:"* ]] || fail "runtime-$variant: $dest is not on LD_LIBRARY_PATH ($ld_path)"
      lib_dirs+=("$local_src")
    else
      [[ -f "$local_src" ]] || fail "runtime-$variant: COPY source $src: no $local_src after the build"
      if [[ "$dest" == "$entrypoint" ]]; then
        binary="$local_src"
      elif [[ "$(head -c4 "$local_src" | od -An -tx1 | tr -d ' \n')" == 7f454c46 ]]; then
        programs+=("$local_src")
        [[ -x "$local_src" ]] || fail "runtime-$variant: $src (to $dest) is not executable"
        if [[ ":$image_path:" == *":$(dirname "$dest"):"* ]]; then shipped+=("$(basename "$dest")"); fi
      fi
    fi
  done < <(awk 'toupper($1) == "COPY"' <<<"$runtime")
  [[ -n "$binary" ]] || fail "runtime-$variant copies nothing to the ENTRYPOINT $entrypoint"
  for tool in "${runtime_tools[@]}"; do
    printf '%s\n' "${shipped[@]}" | grep -qxF "$tool" || fail "runtime-$variant does not COPY $tool into a directory on the image's PATH ($image_path)"
  done

  # Every library beyond the base image's is in the image, where the loader looks.
  for program in "$binary" "${programs[@]}"; do
    mapfile -t needed < <(hack/runtime-libs.sh --list "$program")
    for lib in "${needed[@]}"; do
      found=0
      for dir in "${lib_dirs[@]}"; do [[ -f "$dir/$lib" ]] && found=1; done
      (( found )) || fail "runtime-$variant: $program needs $lib, which the image does not have"
    done
  done
  if (( features_without_libvirt )) && ldd "$binary" | grep -q libvirt; then
    fail "runtime-$variant: $binary links libvirt although its features leave it out"
  fi

  got="$("$binary" --version)"
  want="banlieue $version (git ${git_rev:-unknown})"
  [[ "$got" == "$want" ]] || fail "runtime-$variant: --version says '$got', want '$want'"
  deployment="$("$binary" bootstrap operator --dry-run)"
  grep -qE "^[[:space:]]+runAsUser: ${user%%:*}$" <<<"$deployment" || fail "runtime-$variant: bootstrap operator does not run the manager as the image's USER ${user%%:*}"
  libs=0 libs_size=0
  if (( ${#lib_dirs[@]} )); then
    libs="$(find "${lib_dirs[@]}" -maxdepth 1 -type f | wc -l)"
    libs_size="$(du -ch "${lib_dirs[@]}" | tail -n1 | cut -f1)"
  fi
  summary+=("$(printf '       runtime-%s: %s, %s; also %s; %d extra libraries (%s)' "$variant" "$binary" "$(du -h "$binary" | cut -f1)" "${programs[*]:-nothing}" "$libs" "$libs_size")")
done

echo "Dockerfile: ${#ordered[@]} of ${#variants[@]} variants checked (default $default_variant):"
printf '  %s\n' "${summary[@]}"
