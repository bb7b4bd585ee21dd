#!/usr/bin/env bash
# Builds mdBook from crates.io at a pinned version into a cache directory keyed by that
# version and prints the binary's path. Warm runs only stat.
#
# Only the `search` feature: `serve` and `watch` (axum, tokio, notify) are for writers
# previewing locally and only add build time. Links are checked by
# `banlieue-docgen check-links` (tools/docgen) over the built HTML rather than by
# mdbook-linkcheck, whose 0.7 line is built against mdbook 0.4 and would fetch external
# links unless told not to.
set -euo pipefail

MDBOOK_VERSION=0.5.4

command -v cargo >/dev/null || { echo "docs-tools: cargo is required (rustup)" >&2; exit 1; }
cache_root=${BANLIEUE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/banlieue}
dir="$cache_root/mdbook-${MDBOOK_VERSION}"
bin="$dir/bin/mdbook"

if [[ -x "$bin" && -f "$dir/.complete" ]]; then
  echo "$bin"
  exit 0
fi

echo "docs-tools: building mdbook ${MDBOOK_VERSION} (first run only; a few minutes)" >&2
rm -rf "$dir"
# A target dir of our own: cargo install would otherwise use a temporary one and a
# failed build would start from scratch next time.
CARGO_TARGET_DIR="$cache_root/mdbook-build" cargo install --quiet --locked \
  --no-default-features --features search \
  --version "=${MDBOOK_VERSION}" --root "$dir" mdbook >&2
rm -rf "$cache_root/mdbook-build"
touch "$dir/.complete"
echo "$bin"
