#!/usr/bin/env bash
# Makes sure a `cargo build` of the workspace can link: the libvirt backend uses the
# `virt` crate, which links the C libvirt and finds it with pkg-config at build time.
# Also the host programs the product runs and the Dockerfile ships: qemu-img (Debian's
# qemu-utils), which CopyDisk runs and the SDK's and backends' tests run for real, and
# which hack/check-dockerfile.sh copies into the image as the build stages do.
# Idempotent and quick when everything is there (a `command -v` and one pkg-config call).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source tests/testbin/libvirt/packages.sh

# bins/banlieue/tests/cli.rs renders the man pages with groff (groff-base; images
# without man-db lack it).
if ! command -v groff >/dev/null; then
  if command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
    apt_groff=(env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends groff-base)
    "${apt_groff[@]}" >&2 || { apt-get update -qq >&2 && "${apt_groff[@]}" >&2; }
  else
    echo "build-deps: groff is missing (Debian package groff-base): the man page test needs it" >&2
  fi
fi

# qemu-utils from the suite libvirt and QEMU come from (packages.sh). `make test`'s
# rigs (the libvirt rig, tests/fake-cloud-hypervisor/deps.sh) install it too, but
# `make dockerfile-check` and the workspace's tests need it without them, in any order.
# Missing and not installable: say so; what needs it fails by itself, clearly.
if ! command -v qemu-img >/dev/null; then
  libvirt_apt_install qemu-utils \
    || echo "build-deps: qemu-img is missing (Debian package qemu-utils): CopyDisk's tests and make dockerfile-check need it" >&2
fi

if command -v pkg-config >/dev/null && pkg-config --atleast-version=6.0.0 libvirt 2>/dev/null; then
  exit 0
fi
libvirt_apt_install pkg-config libvirt-dev
pkg-config --atleast-version=6.0.0 libvirt || { echo "build-deps: libvirt >= 6.0.0 not found by pkg-config" >&2; exit 1; }
