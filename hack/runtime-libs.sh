#!/usr/bin/env bash
# Copies the shared libraries the BINARYs load (as `ldd` resolves them) into DIR, except
# glibc's and the GCC runtime's unless --all. hack/image-rootfs.sh runs it with --all
# (the image has no base) for banlieue (full: libvirt's client library and its
# dependencies) and qemu-img (glib, GnuTLS, zstd, liburing, ...), into one directory:
# a library two of them need is copied once.
#
# Usage: hack/runtime-libs.sh [--all] BINARY... DIR
#        hack/runtime-libs.sh [--all] --list BINARY...   (print the libraries' names,
#                                                copy nothing; hack/check-dockerfile.sh uses it)
# --all: glibc's and the GCC runtime's too, for an image with no base
# (hack/image-rootfs.sh).
set -euo pipefail

list=0 all=0
while [[ "${1:-}" == --list || "${1:-}" == --all ]]; do
  [[ "$1" == --list ]] && list=1
  [[ "$1" == --all ]] && all=1
  shift
done
if (( list ? $# < 1 : $# < 2 )); then
  echo "usage: $0 BINARY... DIR | $0 --list BINARY..." >&2
  exit 2
fi
if (( list )); then
  binaries=("$@") dir=""
else
  binaries=("${@:1:$#-1}") dir="${!#}"
fi

deps=""
for binary in "${binaries[@]}"; do
  if ! these="$(ldd "$binary")"; then
    echo "runtime-libs: ldd cannot read $binary" >&2
    exit 1
  fi
  if grep -q 'not found' <<<"$these"; then
    echo "runtime-libs: $binary needs libraries this machine lacks:" >&2
    grep 'not found' <<<"$these" >&2
    exit 1
  fi
  deps+="$these"$'\n'
done

if (( ! list )); then
  rm -rf "$dir"
  mkdir -p "$dir"
fi
count=0
while read -r name path; do
  (( all )) || case "$name" in
    ld-linux*|libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|libresolv.so.*|libutil.so.*|libanl.so.*) continue ;;
    libgcc_s.so.*|libstdc++.so.*|libgomp.so.*) continue ;;
  esac
  if (( list )); then
    echo "$name"
  else
    cp -L "$path" "$dir/$name"
  fi
  count=$((count + 1))
done < <(awk '$2 == "=>" && $3 ~ /^\// && !seen[$1]++ {print $1, $3}' <<<"$deps")
if (( ! list )); then
  echo "runtime-libs: copied $count libraries for ${binaries[*]} into $dir" >&2
fi
