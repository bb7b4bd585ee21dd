#!/usr/bin/env bash
# Builds etcd and the Kubernetes binaries (kube-apiserver; kubelet,
# kube-controller-manager, kube-scheduler and kube-proxy for the real node rig; kubectl)
# from their Go modules into a cache directory keyed by their versions (and the Go
# version), then prints that directory. The Kubernetes binaries come from one `go
# build`, so the packages they share compile once. Warm runs only stat.
set -euo pipefail
cd "$(dirname "$0")"
source ./versions.env

command -v go >/dev/null || { echo "testbin: Go is required (https://go.dev/doc/install)" >&2; exit 1; }
go_version=$(go env GOVERSION)
cache_root=${BANLIEUE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/banlieue}
key="k8s-${KUBERNETES_VERSION}_etcd-${ETCD_VERSION}_${go_version}"
dir="$cache_root/testbin/$key"

k8s_binaries=(kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubelet kubectl)
complete=1
for binary in etcd "${k8s_binaries[@]}"; do [[ -x "$dir/$binary" ]] || complete=0; done
if (( complete )); then
  echo "$dir"
  exit 0
fi

mkdir -p "$dir"
source ./go-cache.sh
export CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false -trimpath"
ldflags="-s -w"
if [[ ! -x "$dir/etcd" ]]; then
  echo "testbin: building etcd ${ETCD_VERSION} (first run only)" >&2
  go build -ldflags "$ldflags" -o "$dir/etcd.tmp" go.etcd.io/etcd/server/v3
  mv "$dir/etcd.tmp" "$dir/etcd"
fi
echo "testbin: building ${k8s_binaries[*]} ${KUBERNETES_VERSION} (first run only; ten minutes or more on 2 cores)" >&2
# The apiserver reports its version from ldflags; without them it says v0.0.0 and
# client-side version checks (kubectl, CAPI) complain.
k8s_ldflags="$ldflags -X k8s.io/component-base/version.gitVersion=${KUBERNETES_VERSION} \
  -X k8s.io/component-base/version.gitMajor=1 \
  -X k8s.io/component-base/version.gitMinor=$(echo "$KUBERNETES_VERSION" | cut -d. -f2) \
  -X k8s.io/client-go/pkg/version.gitVersion=${KUBERNETES_VERSION}"
rm -rf "$dir/k8s.tmp"
mkdir -p "$dir/k8s.tmp"
go build -ldflags "$k8s_ldflags" -o "$dir/k8s.tmp/" "${k8s_binaries[@]/#/k8s.io/kubernetes/cmd/}"
for binary in "${k8s_binaries[@]}"; do mv "$dir/k8s.tmp/$binary" "$dir/$binary"; done
rmdir "$dir/k8s.tmp"
echo "$dir"
