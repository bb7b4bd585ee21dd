#!/usr/bin/env bash
# Builds the project-owned vcsim (main.go here, importing govmomi's simulator package;
# `go install .../vcsim@latest` no longer works since govmomi v0.47) into a cache
# directory keyed by the govmomi version, the Go version and this module's sources,
# then prints the binary's path. Warm runs only stat.
set -euo pipefail
cd "$(dirname "$0")"

command -v go >/dev/null || { echo "vcsim: Go is required (https://go.dev/doc/install)" >&2; exit 1; }
go_version=$(go env GOVERSION)
govmomi_version=$(sed -n 's/^require github.com\/vmware\/govmomi //p; s/^[[:space:]]*github.com\/vmware\/govmomi \(v[^ ]*\).*/\1/p' go.mod | head -1)
src_hash=$(cat go.mod go.sum *.go | sha256sum | cut -c1-12)
cache_root=${BANLIEUE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/banlieue}
dir="$cache_root/vcsim/govmomi-${govmomi_version}_${go_version}_${src_hash}"

if [[ -x "$dir/vcsim" ]]; then
  echo "$dir/vcsim"
  exit 0
fi

echo "vcsim: building govmomi ${govmomi_version}'s simulator (first run only)" >&2
mkdir -p "$dir"
source ../go-cache.sh
CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false -trimpath" \
  go build -ldflags "-s -w" -o "$dir/vcsim.tmp" .
mv "$dir/vcsim.tmp" "$dir/vcsim"
echo "$dir/vcsim"
