#!/usr/bin/env bash
# `cargo publish --dry-run` for every workspace crate that is published (every member
# without `publish = false`: banlieue-sdk, its helper crates and the backends). Cargo
# (>= 1.90) packages them together, so a crate whose path dependency is not on
# crates.io yet verifies against the freshly packaged one. Each package is built from
# its .crate file alone, which catches what a workspace build cannot: a file outside
# the package, a path dependency without a version, a dependency only dev-dependencies
# provided, a missing README.
#
# Libraries select no Kubernetes version (k8s-openapi's rule), so the lone builds set
# K8S_OPENAPI_ENABLED_VERSION, k8s-openapi's switch for builds without dev-dependencies
# (docs.rs does the same through `[package.metadata.docs.rs] cargo-args`). They run in
# their own target directory so the workspace's artifacts are never invalidated, and
# without debug info (nobody debugs them; 1.1 GB instead of 1.8 GB). Cold: ~10 min on
# a busy 2-core machine (k8s-openapi and kube build once per distinct feature set);
# warm: ~30 s (the seven crates themselves, from their .crate files).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

CARGO=${CARGO:-cargo}
hack/build-deps.sh

version=$("$CARGO" --version | awk '{print $2}')
if [[ "$(printf '%s\n' 1.90.0 "${version%%-*}" | sort -V | head -1)" != 1.90.0 ]]; then
  echo "publish-check: cargo $version cannot package unpublished path dependencies together; needs >= 1.90" >&2
  exit 1
fi

mapfile -t crates < <(hack/published-crates.sh)
if [[ ${#crates[@]} -eq 0 ]]; then
  echo "publish-check: no publishable crate found" >&2
  exit 1
fi
echo "publish-check: ${crates[*]}"

args=()
for crate in "${crates[@]}"; do args+=(-p "$crate"); done
target=${CARGO_TARGET_DIR:-target}/publish-check
# Cargo takes a registry package as immutable for its version: the crates verified
# against each other are all 0.1.0, and cargo keeps what it extracted from the local
# registry it packages them into (under $CARGO_HOME/registry/src/-<hash>/) and what it
# built from it. A second run would build a backend against the SDK of the first (and
# fail on anything added since): our own crates' copies and artifacts go first; the
# dependencies' (kube, k8s-openapi) stay warm.
cargo_home=${CARGO_HOME:-$HOME/.cargo}
for crate in "${crates[@]}"; do
  rm -rf "$cargo_home"/registry/src/-*/"$crate"-[0-9]* "$cargo_home"/registry/cache/-*/"$crate"-[0-9]*
done
if [[ -d "$target/debug" ]]; then
  find "$target/debug" -maxdepth 2 \( -name 'banlieue*' -o -name 'libbanlieue*' \) -exec rm -rf {} +
fi
# --allow-dirty: this checks the packages, not whether the work tree is committed.
K8S_OPENAPI_ENABLED_VERSION=1.33 CARGO_TARGET_DIR="$target" CARGO_PROFILE_DEV_DEBUG=0 \
  "$CARGO" publish --dry-run --locked --allow-dirty "${args[@]}"
echo "publish-check: ${#crates[@]} crates package and build on their own"
