#!/usr/bin/env bash
# Makes sure a `cargo build` of the workspace can link: the libvirt backend uses the
# `virt` crate, which links the C libvirt and finds it with pkg-config at build time.
# Idempotent and quick when everything is there (one pkg-config call).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

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

if command -v pkg-config >/dev/null && pkg-config --atleast-version=6.0.0 libvirt 2>/dev/null; then
  exit 0
fi
source tests/testbin/libvirt/packages.sh
libvirt_apt_install pkg-config libvirt-dev
pkg-config --atleast-version=6.0.0 libvirt || { echo "build-deps: libvirt >= 6.0.0 not found by pkg-config" >&2; exit 1; }
