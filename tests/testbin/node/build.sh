#!/usr/bin/env bash
# The real node rig's host parts: makes sure containerd, runc, the CNI plugins and
# socat are installed (Debian packages, installed only when missing), and builds the
# rig's pause image (pause/, a static Go program packed by tools/oci-image as the OCI
# archive pause.tar, reference docker.io/local/pause:1) and its probe image (probe/, one
# HTTPS GET from inside the cluster: probe.tar, docker.io/local/probe:1) into a cache
# directory keyed by the Go version and the sources (pause/, probe/, this script,
# tools/oci-image), then prints that directory. Warm runs only check.
#
# The Kubernetes binaries (kubelet, kube-proxy, ...) come from tests/testbin/build.sh;
# rig.sh runs them all in namespaces the test creates (see rig.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)

# Tools the rig runs, and the Debian package of each.
need=()
for tool in containerd:containerd ctr:containerd containerd-shim-runc-v2:containerd runc:runc \
            socat:socat iptables:iptables ip:iproute2 unshare:util-linux openssl:openssl; do
  PATH=$PATH:/usr/sbin:/sbin command -v "${tool%%:*}" >/dev/null || need+=("${tool##*:}")
done
for plugin in bridge host-local portmap loopback; do
  [[ -x /usr/lib/cni/$plugin ]] || need+=(containernetworking-plugins)
done
if ((${#need[@]})); then
  mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
  if ! command -v apt-get >/dev/null || [[ $(id -u) != 0 ]]; then
    echo "node: missing Debian packages: ${need[*]} (install them, or run as root on Debian)" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  echo "node: installing Debian packages: ${need[*]}" >&2
  args=(-y -qq --no-install-recommends)
  apt-get install "${args[@]}" "${need[@]}" >&2 || { apt-get update -qq >&2 && apt-get install "${args[@]}" "${need[@]}" >&2; }
fi

command -v go >/dev/null || { echo "node: Go is required to build the pause image (https://go.dev/doc/install)" >&2; exit 1; }
go_version=$(go env GOVERSION)
src_hash=$(cd "$repo" && cat tests/testbin/node/build.sh tests/testbin/node/pause/go.mod tests/testbin/node/pause/main.go \
  tests/testbin/node/probe/go.mod tests/testbin/node/probe/main.go tools/oci-image/Cargo.toml tools/oci-image/src/*.rs | sha256sum | cut -c1-12)
cache_root=${BANLIEUE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/banlieue}
dir="$cache_root/node/pause-1_${go_version}_${src_hash}"

if [[ -f "$dir/pause.tar" && -f "$dir/probe.tar" && -f "$dir/.complete" ]]; then
  echo "$dir"
  exit 0
fi

echo "node: building the pause and probe images (first run only)" >&2
rm -rf "$dir.tmp"
mkdir -p "$dir.tmp/rootfs" "$dir.tmp/probe-rootfs"
for program in pause probe; do
  out="$dir.tmp/rootfs"
  [[ $program == probe ]] && out="$dir.tmp/probe-rootfs"
  (
    cd "$here/$program"
    source "$repo/tests/testbin/go-cache.sh"
    CGO_ENABLED=0 GOFLAGS="-buildvcs=false -trimpath" go build -ldflags "-s -w" -o "$out/$program" .
  )
  chmod 0755 "$out" "$out/$program"
done
cargo build --quiet --release --manifest-path "$repo/Cargo.toml" -p banlieue-oci-image >&2
target_dir=$(cargo metadata --format-version 1 --no-deps --manifest-path "$repo/Cargo.toml" |
  sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
"$target_dir/release/oci-image" --rootfs "$dir.tmp/rootfs" --out "$dir.tmp/pause.tar" \
  --ref docker.io/local/pause:1 --entrypoint '["/pause"]' --user 65535:65535 >"$dir.tmp/digest"
"$target_dir/release/oci-image" --rootfs "$dir.tmp/probe-rootfs" --out "$dir.tmp/probe.tar" \
  --ref docker.io/local/probe:1 --entrypoint '["/probe"]' --user 65532:65532 >>"$dir.tmp/digest"
rm -rf "$dir.tmp/rootfs" "$dir.tmp/probe-rootfs"
rm -rf "$dir" && mv "$dir.tmp" "$dir"
touch "$dir/.complete"
echo "$dir"
