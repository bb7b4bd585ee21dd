#!/usr/bin/env bash
# Builds kube-apiserver and etcd from their Go modules into a cache directory keyed by
# their versions (and the Go version), then prints that directory. Warm runs only stat.
set -euo pipefail
cd "$(dirname "$0")"
source ./versions.env

command -v go >/dev/null || { echo "testbin: Go is required (https://go.dev/doc/install)" >&2; exit 1; }
go_version=$(go env GOVERSION)
cache_root=${BANLIEUE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/banlieue}
key="k8s-${KUBERNETES_VERSION}_etcd-${ETCD_VERSION}_${go_version}"
dir="$cache_root/testbin/$key"

if [[ -x "$dir/kube-apiserver" && -x "$dir/etcd" ]]; then
  echo "$dir"
  exit 0
fi

mkdir -p "$dir"
source ./go-cache.sh
export CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false -trimpath"
ldflags="-s -w"
echo "testbin: building etcd ${ETCD_VERSION} (first run only)" >&2
go build -ldflags "$ldflags" -o "$dir/etcd.tmp" go.etcd.io/etcd/server/v3
echo "testbin: building kube-apiserver ${KUBERNETES_VERSION} (first run only; several minutes)" >&2
# The apiserver reports its version from ldflags; without them it says v0.0.0 and
# client-side version checks (kubectl, CAPI) complain.
k8s_ldflags="$ldflags -X k8s.io/component-base/version.gitVersion=${KUBERNETES_VERSION} \
  -X k8s.io/component-base/version.gitMajor=1 \
  -X k8s.io/component-base/version.gitMinor=$(echo "$KUBERNETES_VERSION" | cut -d. -f2) \
  -X k8s.io/client-go/pkg/version.gitVersion=${KUBERNETES_VERSION}"
go build -ldflags "$k8s_ldflags" -o "$dir/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver
mv "$dir/etcd.tmp" "$dir/etcd"
mv "$dir/kube-apiserver.tmp" "$dir/kube-apiserver"
echo "$dir"
