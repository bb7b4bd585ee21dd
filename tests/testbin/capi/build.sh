#!/usr/bin/env bash
# Builds Cluster API's core manager and clusterctl from sigs.k8s.io/cluster-api (pinned
# in versions.env and go.mod) into a cache directory keyed by that version and the Go
# version, copies CAPI core's CRDs, webhook configurations, RBAC and metadata.yaml from
# the module next to them, then prints that directory. Warm runs only stat.
#
#   <dir>/manager            sigs.k8s.io/cluster-api/core
#   <dir>/clusterctl         sigs.k8s.io/cluster-api/cmd/clusterctl
#   <dir>/crds/*.yaml        core/config/crd/bases (cluster, addons, ipam, runtime groups)
#   <dir>/webhook/manifests.yaml   core/config/webhook/manifests.yaml
#   <dir>/rbac/*.yaml        core/config/rbac (manager-role, aggregated-manager-role, ...)
#   <dir>/metadata.yaml      CAPI's clusterctl metadata (release series -> contract)
#   <dir>/crds-kubeadm/*.yaml the kubeadm bootstrap and control-plane CRDs (to validate
#                            cluster templates that use them; their managers are not built)
#   <dir>/crds-clusterctl/*.yaml clusterctl's inventory CRD (providers.clusterctl.cluster.x-k8s.io)
set -euo pipefail
cd "$(dirname "$0")"
source ./versions.env

command -v go >/dev/null || { echo "capi: Go is required (https://go.dev/doc/install)" >&2; exit 1; }
go_version=$(go env GOVERSION)
cache_root=${BANLIEUE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/banlieue}
dir="$cache_root/capi/capi-${CAPI_VERSION}_${go_version}"

if [[ -x "$dir/manager" && -x "$dir/clusterctl" && -d "$dir/crds-kubeadm" && -d "$dir/crds-clusterctl" && -f "$dir/.complete" ]]; then
  echo "$dir"
  exit 0
fi

source ../go-cache.sh
export CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false -trimpath"
rm -rf "$dir.tmp"
mkdir -p "$dir.tmp"
src=$(go list -m -f '{{.Dir}}' sigs.k8s.io/cluster-api)
[[ -n "$src" && -d "$src/core/config" ]] || {
  go mod download sigs.k8s.io/cluster-api
  src=$(go list -m -f '{{.Dir}}' sigs.k8s.io/cluster-api)
}
minor=$(echo "$CAPI_VERSION" | cut -d. -f2)
# CAPI reads its own version from these (clusterctl compares it with provider
# metadata; the manager logs it).
ldflags="-s -w -X sigs.k8s.io/cluster-api/version.gitVersion=${CAPI_VERSION} \
  -X sigs.k8s.io/cluster-api/version.gitMajor=1 \
  -X sigs.k8s.io/cluster-api/version.gitMinor=${minor} \
  -X sigs.k8s.io/cluster-api/version.gitTreeState=clean"
echo "capi: building Cluster API ${CAPI_VERSION} manager (first run only; a few minutes)" >&2
go build -ldflags "$ldflags" -o "$dir.tmp/manager" sigs.k8s.io/cluster-api/core
echo "capi: building clusterctl ${CAPI_VERSION} (first run only)" >&2
go build -ldflags "$ldflags" -o "$dir.tmp/clusterctl" sigs.k8s.io/cluster-api/cmd/clusterctl

mkdir -p "$dir.tmp/crds" "$dir.tmp/crds-kubeadm" "$dir.tmp/crds-clusterctl" "$dir.tmp/webhook" "$dir.tmp/rbac"
cp "$src"/core/config/crd/bases/*.yaml "$dir.tmp/crds/"
cp "$src"/bootstrap/kubeadm/config/crd/bases/*.yaml "$src"/controlplane/kubeadm/config/crd/bases/*.yaml \
  "$dir.tmp/crds-kubeadm/"
cp "$src"/cmd/clusterctl/config/crd/bases/clusterctl.cluster.x-k8s.io_providers.yaml "$dir.tmp/crds-clusterctl/"
cp "$src/core/config/webhook/manifests.yaml" "$dir.tmp/webhook/"
cp "$src"/core/config/rbac/*.yaml "$dir.tmp/rbac/"
rm -f "$dir.tmp/rbac/kustomization.yaml"
cp "$src/metadata.yaml" "$dir.tmp/metadata.yaml"
echo "$CAPI_VERSION" > "$dir.tmp/VERSION"
chmod -R u+w "$dir.tmp"
touch "$dir.tmp/.complete"
rm -rf "$dir"
mv "$dir.tmp" "$dir"
echo "$dir"
