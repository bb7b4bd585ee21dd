#!/usr/bin/env bash
# Host tools the Cloud Hypervisor tests use besides cargo: qemu-img and qemu-io (Debian's
# qemu-utils) judge the qcow2 overlays the backend writes. Installed when missing and
# running as root with apt (a fresh Debian CI machine); warm runs only check.
set -euo pipefail
if command -v qemu-img >/dev/null && command -v qemu-io >/dev/null; then
  exit 0
fi
if command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
  echo "cloud-hypervisor tests: installing Debian's qemu-utils" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq qemu-utils >&2 || { apt-get update -qq >&2 && apt-get install -y -qq qemu-utils >&2; }
else
  echo "cloud-hypervisor tests: qemu-img/qemu-io missing: install qemu-utils" >&2
  exit 1
fi
