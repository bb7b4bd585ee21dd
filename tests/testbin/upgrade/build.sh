#!/usr/bin/env bash
# Builds the image an upgrade starts from: banlieue at an earlier commit (UPGRADE_FROM
# below), as `ghcr.io/banlieue-io/banlieue:<version>-<short commit>` so that it sits in
# containerd beside the image under test, plus that commit's install (deploy/crds,
# deploy/operator). Into a cache directory keyed by the commit and the Rust version;
# prints it. Warm runs only stat.
#
# The binary is built from a `git worktree` of the commit with this checkout's target
# directory (the dependencies they share are built once); the file system and the OCI
# archive come from this checkout's hack/image-rootfs.sh and tools/oci-image, with the
# Dockerfile's ENV, USER, ENTRYPOINT and CMD.
#
# Needs the commit in this clone's history: a shallow clone is unshallowed from its
# remote first; without the commit the build fails, saying so.
set -euo pipefail
cd "$(dirname "$0")/../../.."
repo=$PWD

# The last commit on main before the leader-election and readiness changes of issue 19
# (readiness of a standby, Lease release on shutdown): an upgrade across them.
UPGRADE_FROM=9f91b0b51eb944f2575155d5f09a44311798d03f
short=${UPGRADE_FROM:0:7}
rust=$(rustc --version | awk '{print $2}')
cache_root=${BANLIEUE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/banlieue}
dir="$cache_root/upgrade/from-${short}_rust-${rust}"

if [[ -f "$dir/.complete" ]]; then
  echo "$dir"
  exit 0
fi

if ! git cat-file -e "${UPGRADE_FROM}^{commit}" 2>/dev/null &&
  [[ "$(git rev-parse --is-shallow-repository)" == true ]]; then
  echo "upgrade: a shallow clone; fetching the history for $short" >&2
  git fetch --quiet --unshallow >&2 || true
fi
git cat-file -e "${UPGRADE_FROM}^{commit}" 2>/dev/null || {
  echo "upgrade: commit $UPGRADE_FROM is not in this clone: the upgrade test needs a full clone ('git fetch --unshallow')" >&2
  exit 1
}
echo "upgrade: building banlieue at $short, the image an upgrade starts from (first run only)" >&2
target_dir=$(cargo metadata --format-version 1 --no-deps --manifest-path "$repo/Cargo.toml" |
  sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
worktree="$dir.tmp/src"
git worktree add --quiet --detach "$worktree" "$UPGRADE_FROM"
trap 'git -C "$repo" worktree remove --force "$worktree" 2>/dev/null || true' EXIT
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$worktree/bins/banlieue/Cargo.toml" | head -1)
[[ -n "$version" ]] || version=$(cargo metadata --format-version 1 --no-deps --manifest-path "$worktree/Cargo.toml" |
  sed -n 's/.*"name":"banlieue","version":"\([^"]*\)".*/\1/p')
(cd "$worktree" && BANLIEUE_GIT_REV="$short" CARGO_TARGET_DIR="$target_dir" \
  cargo build --quiet --release --locked -p banlieue >&2)
cp "$target_dir/release/banlieue" "$dir.tmp/banlieue"
# The next build of this checkout must not take the earlier binary for its own.
rm -f "$target_dir/release/banlieue"
cp -r "$worktree/deploy" "$dir.tmp/deploy"

hack/image-rootfs.sh "$dir.tmp/banlieue" "$dir.tmp/rootfs" >&2
cargo build --quiet --release --manifest-path "$repo/Cargo.toml" -p banlieue-oci-image >&2
ref="ghcr.io/banlieue-io/banlieue:${version}-${short}"
"$target_dir/release/oci-image" --rootfs "$dir.tmp/rootfs" --out "$dir.tmp/banlieue.oci.tar" \
  --ref "$ref" --user 65532:65532 --entrypoint '["/usr/local/bin/banlieue"]' --cmd '["run"]' \
  --env PATH=/usr/local/bin --env LD_LIBRARY_PATH=/usr/lib/banlieue \
  --label "org.opencontainers.image.version=$version" \
  --label "org.opencontainers.image.revision=$UPGRADE_FROM" >"$dir.tmp/digest"
echo "$ref" >"$dir.tmp/ref"
rm -rf "$dir.tmp/rootfs" "$dir.tmp/banlieue"
git worktree remove --force "$worktree"
trap - EXIT
rm -rf "$dir" && mv "$dir.tmp" "$dir"
touch "$dir/.complete"
echo "$dir"
