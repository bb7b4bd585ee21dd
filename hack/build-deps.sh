#!/usr/bin/env bash
# Makes sure a `cargo build` of the workspace can link: the libvirt backend uses the
# `virt` crate, which links the C libvirt and finds it with pkg-config at build time.
# Idempotent and quick when everything is there (one pkg-config call).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if command -v pkg-config >/dev/null && pkg-config --atleast-version=6.0.0 libvirt 2>/dev/null; then
  exit 0
fi
source tests/testbin/libvirt/packages.sh
libvirt_apt_install pkg-config libvirt-dev
pkg-config --atleast-version=6.0.0 libvirt || { echo "build-deps: libvirt >= 6.0.0 not found by pkg-config" >&2; exit 1; }
