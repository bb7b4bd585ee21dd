#!/usr/bin/env bash
# `make docs-check`: the book's generated pages are current (like `make crds-check`),
# mdBook builds it without a warning, and every relative link and anchor in the built
# HTML resolves (external links: form only, nothing is fetched).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

mdbook=$(hack/docs-tools.sh)
cargo build --quiet --locked -p banlieue-docgen
docgen=${CARGO_TARGET_DIR:-target}/debug/banlieue-docgen

"$docgen" generate docs/book/src --check

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
if ! "$mdbook" build docs/book --dest-dir "$out/book" 2>"$out/log"; then
  cat "$out/log" >&2
  echo "docs: mdbook build failed" >&2
  exit 1
fi
# mdBook reports a bad include or a parse problem as a warning and carries on.
if grep -E ' (WARN|ERROR) ' "$out/log" >&2; then
  echo "docs: mdbook warned (above); fix the book" >&2
  exit 1
fi
"$docgen" check-links "$out/book"
