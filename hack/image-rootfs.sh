#!/usr/bin/env bash
# Assembles the operator image's whole root filesystem in OUT, from BINARY and this
# machine's (Debian's) files: no base image. Both the Dockerfile (`FROM scratch` +
# COPY of OUT) and `make image` (tools/oci-image packs OUT) ship exactly this tree, so
# they describe the same filesystem by construction (ADR 0017).
#
#   /usr/local/bin/banlieue     BINARY
#   /usr/local/bin/qemu-img     Debian's qemu-utils (CopyDisk's conversions)
#   /usr/lib/banlieue/          every shared library either loads, glibc's included
#                               (ldd's view; LD_LIBRARY_PATH points here)
#   /lib64/ld-linux-*.so.2      the program interpreter ELF binaries name
#   /etc/ssl/certs/ca-certificates.crt   Debian's ca-certificates bundle
#   /etc/passwd, /etc/group     root, and nonroot (65532), the image's USER
#   /etc/nsswitch.conf          files, then DNS (libvirt's and glibc's lookups)
#   /tmp (1777), /home/nonroot (65532, 0700)
#
# Usage: hack/image-rootfs.sh BINARY OUT
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

(( $# == 2 )) || { echo "usage: $0 BINARY OUT" >&2; exit 2; }
binary=$1 out=$2
[[ -f "$binary" && -x "$binary" ]] || { echo "image-rootfs: no program $binary (build it first)" >&2; exit 1; }
ca=/etc/ssl/certs/ca-certificates.crt
[[ -s "$ca" ]] || { echo "image-rootfs: $ca is missing (Debian package ca-certificates)" >&2; exit 1; }

rm -rf "$out"
mkdir -p "$out"/usr/local/bin "$out"/etc/ssl/certs "$out"/tmp "$out"/home/nonroot
install -m 0755 "$binary" "$out/usr/local/bin/banlieue"
staged_tools=$(mktemp -d)
trap 'rm -rf "$staged_tools"' EXIT
hack/runtime-tools.sh /usr/bin/qemu-img "$staged_tools/bin"
install -m 0755 "$staged_tools/bin/qemu-img" "$out/usr/local/bin/qemu-img"
hack/runtime-libs.sh --all "$out/usr/local/bin/banlieue" "$out/usr/local/bin/qemu-img" "$out/usr/lib/banlieue"
chmod 0644 "$out"/usr/lib/banlieue/*
# The interpreter is found by its absolute path, before LD_LIBRARY_PATH means anything.
for program in "$out/usr/local/bin/banlieue" "$out/usr/local/bin/qemu-img"; do
  interp=$(ldd "$program" | awk '$1 ~ /^\/.*ld-linux/ {print $1; exit}')
  [[ -n "$interp" ]] || { echo "image-rootfs: $program names no program interpreter" >&2; exit 1; }
  mkdir -p "$out$(dirname "$interp")"
  install -m 0755 "$(readlink -f "$interp")" "$out$interp"
done
install -m 0644 "$ca" "$out/etc/ssl/certs/ca-certificates.crt"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$out/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$out/etc/group"
printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$out/etc/nsswitch.conf"
chmod 0644 "$out"/etc/passwd "$out"/etc/group "$out"/etc/nsswitch.conf
find "$out" -type d -exec chmod 0755 {} +
chmod 1777 "$out/tmp"
chown 65532:65532 "$out/home/nonroot" 2>/dev/null || echo "image-rootfs: not root: /home/nonroot stays owned by $(id -u) in $out" >&2
chmod 0700 "$out/home/nonroot"
echo "image-rootfs: $(find "$out" -type f | wc -l) files, $(du -sh "$out" | cut -f1) in $out" >&2
