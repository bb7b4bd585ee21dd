#!/usr/bin/env bash
# Builds the peer of `make bench-capi-peer`: Cluster API's development infrastructure
# provider (CAPD, sigs.k8s.io/cluster-api/test/infrastructure/docker, the version of
# ../capi/versions.env), whose `inMemory` backend Cluster API uses for its own scale
# tests, into a cache directory keyed by that version and the Go version, with the
# CRDs of its kinds (labelled with the contract version CAPI reads), then prints
# that directory. Warm runs only stat.
#
#   <dir>/manager      sigs.k8s.io/cluster-api/test/infrastructure/docker
#   <dir>/crds/*.yaml  config/crd/bases (its manager sets up the Docker* controllers
#                      too, so their kinds must exist even though the runs use Dev*)
set -euo pipefail
cd "$(dirname "$0")"
source ../capi/versions.env

command -v go >/dev/null || { echo "capi-peer: Go is required (https://go.dev/doc/install)" >&2; exit 1; }
go_version=$(go env GOVERSION)
cache_root=${BANLIEUE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/banlieue}
dir="$cache_root/capi-peer/capd-${CAPI_VERSION}_${go_version}"

complete() { [[ -x "$dir/manager" && -e "$dir/crds/infrastructure.cluster.x-k8s.io_dockermachines.yaml" && -e "$dir/.complete" ]]; }
if complete; then
  echo "$dir"
  exit 0
fi
mkdir -p "$(dirname "$dir")"
exec 9>"$dir.lock"
flock 9
if complete; then
  echo "$dir"
  exit 0
fi

# go.mod pins the version; a CAPI bump in ../capi/versions.env must move it too.
grep -q "sigs.k8s.io/cluster-api/test ${CAPI_VERSION}\$" go.mod || {
  echo "capi-peer: go.mod does not require sigs.k8s.io/cluster-api/test ${CAPI_VERSION} (../capi/versions.env)" >&2
  exit 1
}
source ../go-cache.sh
export CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false -trimpath"
rm -rf "$dir.tmp"
mkdir -p "$dir.tmp/crds"
trap 'rm -rf "$dir.tmp"' EXIT
package=sigs.k8s.io/cluster-api/test/infrastructure/docker
src=$(go list -m -f '{{.Dir}}' sigs.k8s.io/cluster-api/test)
[[ -n "$src" && -d "$src/infrastructure/docker/config" ]] || {
  go mod download sigs.k8s.io/cluster-api/test
  src=$(go list -m -f '{{.Dir}}' sigs.k8s.io/cluster-api/test)
}
minor=$(echo "$CAPI_VERSION" | cut -d. -f2)
ldflags="-s -w -X sigs.k8s.io/cluster-api/version.gitVersion=${CAPI_VERSION} \
  -X sigs.k8s.io/cluster-api/version.gitMajor=1 \
  -X sigs.k8s.io/cluster-api/version.gitMinor=${minor} \
  -X sigs.k8s.io/cluster-api/version.gitTreeState=clean"
echo "capi-peer: building CAPD ${CAPI_VERSION} (first run only; a few minutes)" >&2
go build -ldflags "$ldflags" -o "$dir.tmp/manager" "$package"
for f in "$src"/infrastructure/docker/config/crd/bases/infrastructure.cluster.x-k8s.io_*.yaml; do
  cp "$f" "$dir.tmp/crds/"
done
chmod -R u+w "$dir.tmp"
touch "$dir.tmp/.complete"
rm -rf "$dir"
mv "$dir.tmp" "$dir"
trap - EXIT
echo "$dir"
