#!/bin/sh
# /init of banlieue's tiny test guest (busybox): loads the virtio drivers, reads the
# NoCloud seed (a vfat volume labelled cidata), takes a DHCP lease on eth0
# (sending the seed's hostname) and powers off on an ACPI power-button press.
# Everything it does is printed on the serial console, prefixed "banlieue-guest:".
export PATH=/bin:/sbin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
say() { echo "banlieue-guest: $*" >/dev/console; }
say "init"
# Order matters: a module's dependencies first (no modprobe/depmod here).
for m in virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci \
         failover net_failover virtio_net virtio_blk \
         fat vfat nls_cp437 nls_ascii nls_utf8 evdev button; do
  [ -f /lib/modules/$m.ko ] && { insmod /lib/modules/$m.ko 2>/dev/null || say "insmod $m failed"; }
done

# ACPI power button -> poweroff (libvirt's shutdown). busybox acpid runs
# /etc/acpi/PWRF/00000080 for the power button.
acpid -c /etc/acpi -l /dev/null

hostname=banlieue-guest
mkdir -p /mnt/seed
seed=""
for i in 1 2 3 4 5 6 7 8 9 10; do
  seed=$(findfs LABEL=cidata 2>/dev/null || findfs LABEL=CIDATA 2>/dev/null || true)
  [ -n "$seed" ] && break
  sleep 0.5
done
say "block devices: $(ls /sys/block | tr '\n' ' ')"
if [ -n "$seed" ] && mount -o ro "$seed" /mnt/seed 2>/tmp/mount.err; then
  say "seed on $seed"
  iid=$(sed -n 's/^instance-id: *//p' /mnt/seed/meta-data | tr -d "\"'")
  h=$(sed -n 's/^local-hostname: *//p' /mnt/seed/meta-data | tr -d "\"'")
  [ -n "$h" ] && hostname=$h
  say "instance-id=$iid hostname=$hostname"
  [ -f /mnt/seed/network-config ] && say "network-config present"
  if head -c 2 /mnt/seed/user-data | grep -q '^#!'; then
    cp /mnt/seed/user-data /tmp/user-data && chmod +x /tmp/user-data
    /tmp/user-data >/dev/console 2>&1 &
  fi
else
  say "no seed${seed:+ (found $seed, mount failed: $(cat /tmp/mount.err))}"
fi
hostname "$hostname"

ip link set lo up
ip link set eth0 up
udhcpc -i eth0 -s /etc/udhcpc.script -x "hostname:$hostname" -t 20 -T 1 -b -S
say "ready"
while true; do sleep 3600; done
