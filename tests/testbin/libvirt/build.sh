#!/usr/bin/env bash
# The libvirt test rig: makes sure libvirtd, QEMU and dnsmasq are installed (Debian
# packages, one suite; see packages.sh) and builds the tiny test guest from Debian
# packages into a cache directory keyed by the kernel version and these scripts, then
# prints that directory. Warm runs only check.
#
# The guest is a qcow2 disk (guest.qcow2) with a FAT file system, SYSLINUX, Debian's
# cloud kernel and a busybox initramfs (guest-init.sh as /init): BIOS boots it like any
# disk image, so the backend clones it like a real image.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/packages.sh"

need=()
for tool in libvirtd:libvirt-daemon virtlogd:libvirt-daemon virsh:libvirt-clients \
            qemu-system-x86_64:qemu-system-x86 qemu-img:qemu-utils dnsmasq:dnsmasq-base \
            iptables:iptables unshare:util-linux ip:iproute2 mkfs.vfat:dosfstools \
            mcopy:mtools syslinux:syslinux pkg-config:pkg-config; do
  command -v "${tool%%:*}" >/dev/null || PATH=$PATH:/usr/sbin:/sbin command -v "${tool%%:*}" >/dev/null || need+=("${tool##*:}")
done
[[ -d /usr/lib/x86_64-linux-gnu/libvirt/connection-driver ]] && \
  ls /usr/lib/x86_64-linux-gnu/libvirt/connection-driver/ | grep -q qemu || need+=(libvirt-daemon-driver-qemu)
[[ -f /usr/lib/syslinux/modules/bios/ldlinux.c32 ]] || need+=(syslinux-common)
file_of_busybox=$(readlink -f /bin/busybox 2>/dev/null || true)
if [[ -z "$file_of_busybox" ]] || ! dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'ok installed'; then
  need+=(busybox-static)
fi
pkg-config --exists libvirt 2>/dev/null || need+=(libvirt-dev)
if ((${#need[@]})); then
  libvirt_apt_install "${need[@]}" qemu-utils
fi
# libvirtd's QEMU driver resolves its default user before reading qemu.conf.
getent group kvm >/dev/null || groupadd -r kvm
getent group libvirt-qemu >/dev/null || groupadd -r libvirt-qemu
getent passwd libvirt-qemu >/dev/null || useradd -r -g libvirt-qemu -G kvm -d /var/lib/libvirt -s /usr/sbin/nologin libvirt-qemu

script_hash=$(cat "$here/build.sh" "$here/guest-init.sh" | sha256sum | cut -c1-12)
cache_root=${BANLIEUE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/banlieue}
# Warm runs skip apt-cache (seconds): the guest built by these scripts stays in use
# until the scripts change or the cache is removed.
pointer="$cache_root/libvirt-guest/built-by-$script_hash"
if [[ -f "$pointer" ]]; then
  built=$(<"$pointer")
  if [[ -f "$built/guest.qcow2" && -f "$built/.complete" ]]; then
    echo "$built"
    exit 0
  fi
fi

kernel_pkg=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
if [[ -z "$kernel_pkg" ]]; then
  apt-get update -qq >&2
  kernel_pkg=$(apt-cache depends linux-image-cloud-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
fi
kernel_version=$(apt-cache policy "$kernel_pkg" | awk '/Candidate:/{print $2}')
busybox_version=$(dpkg-query -W -f='${Version}' busybox-static | tr ':~+' '___')
dir="$cache_root/libvirt-guest/${kernel_pkg}_${kernel_version}_bb${busybox_version}_${script_hash}"

if [[ -f "$dir/guest.qcow2" && -f "$dir/.complete" ]]; then
  echo "$dir" >"$pointer"
  echo "$dir"
  exit 0
fi

echo "libvirt: building the test guest from $kernel_pkg $kernel_version (first run only)" >&2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
chmod 755 "$work"   # apt-get download runs as _apt where it can
( cd "$work" && apt-get download -qq "$kernel_pkg=$kernel_version" 2>/dev/null >&2 \
  || { apt-get update -qq >&2 && apt-get download -qq "$kernel_pkg=$kernel_version" >&2; } )
dpkg -x "$work"/linux-image-*.deb "$work/kernel"
abi=${kernel_pkg#linux-image-}
cp "$work/kernel/boot/vmlinuz-$abi" "$work/vmlinuz"

root="$work/initramfs"
mkdir -p "$root"/{bin,sbin,etc/acpi/PWRF,proc,sys,dev,run,tmp,mnt,lib/modules}
cp /bin/busybox "$root/bin/busybox"
for applet in $("$root/bin/busybox" --list); do
  [[ "$applet" == busybox ]] || ln -sf busybox "$root/bin/$applet"
done
for m in virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci \
         failover net_failover virtio_net virtio_blk \
         fat vfat nls_cp437 nls_ascii nls_utf8 evdev button; do
  ko=$(find "$work/kernel/lib/modules/$abi" -name "$m.ko" -o -name "$m.ko.xz" | head -1)
  [[ -n "$ko" ]] || continue   # built in
  case "$ko" in *.xz) xz -dc "$ko" >"$root/lib/modules/$m.ko" ;; *) cp "$ko" "$root/lib/modules/$m.ko" ;; esac
done
install -m 755 "$here/guest-init.sh" "$root/init"
cat >"$root/etc/acpi/PWRF/00000080" <<'ACPI'
#!/bin/sh
echo "banlieue-guest: power button, powering off" >/dev/console
poweroff -f
ACPI
chmod 755 "$root/etc/acpi/PWRF/00000080"
cat >"$root/etc/udhcpc.script" <<'DHCP'
#!/bin/sh
case "$1" in
  deconfig) ip addr flush dev "$interface"; ip link set "$interface" up ;;
  bound|renew)
    ip addr flush dev "$interface"
    ip addr add "$ip/$mask" dev "$interface"
    [ -n "$router" ] && ip route add default via "${router%% *}" dev "$interface" 2>/dev/null
    echo "banlieue-guest: lease $ip/$mask on $interface" >/dev/console ;;
esac
DHCP
chmod 755 "$root/etc/udhcpc.script"
( cd "$root" && find . | "$root/bin/busybox" cpio -o -H newc 2>/dev/null | gzip -9 ) >"$work/initrd.img"

cat >"$work/syslinux.cfg" <<'CFG'
DEFAULT linux
PROMPT 0
TIMEOUT 0
LABEL linux
  KERNEL vmlinuz
  INITRD initrd.img
  APPEND console=ttyS0 panic=-1 quiet loglevel=3
CFG
# A FAT "superfloppy" disk: SYSLINUX's boot sector is sector 0, SeaBIOS boots it.
size_kib=$(( ( $(stat -c %s "$work/vmlinuz") + $(stat -c %s "$work/initrd.img") ) / 1024 + 4096 ))
mkfs.vfat -C -n BNLGUEST "$work/disk.img" "$size_kib" >/dev/null
syslinux --install "$work/disk.img"
mcopy -i "$work/disk.img" "$work/vmlinuz" "$work/initrd.img" "$work/syslinux.cfg" ::/
rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
qemu-img convert -f raw -O qcow2 "$work/disk.img" "$dir.tmp/guest.qcow2"
cp "$work/vmlinuz" "$work/initrd.img" "$dir.tmp/"
rm -rf "$dir" && mv "$dir.tmp" "$dir"
touch "$dir/.complete"
echo "$dir" >"$pointer"
echo "$dir"
