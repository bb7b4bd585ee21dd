#!/usr/bin/env bash
# Runs virtlogd and libvirtd for one test run, isolated from any system libvirtd:
#   unshare --net --mount --pid --fork --mount-proc --propagation private daemons.sh STATE
# In these namespaces libvirt's fixed directories (/etc/libvirt, /run/libvirt,
# /var/lib/libvirt, /var/cache/libvirt, /var/log/libvirt) are bind mounts of
# directories under STATE, so the client socket is STATE/run/libvirt-sock (reachable
# from outside as qemu:///system?socket=STATE/run/libvirt-sock), and the bridges,
# dnsmasq and QEMU processes libvirtd starts live only in this network and PID
# namespace: when this script (PID 1 here) exits, the kernel kills them all.
set -euo pipefail
state=$1
for d in etc run lib cache log; do mkdir -p "$state/$d"; done
mkdir -p "$state/log/qemu" "$state/lib/qemu" "$state/lib/images" "$state/lib/dnsmasq" "$state/lib/network"
cat >"$state/etc/libvirtd.conf" <<CONF
unix_sock_group = "root"
unix_sock_rw_perms = "0700"
auth_unix_ro = "none"
auth_unix_rw = "none"
log_outputs = "3:file:$state/libvirtd.log"
CONF
cat >"$state/etc/qemu.conf" <<'CONF'
user = "root"
group = "root"
dynamic_ownership = 0
remember_owner = 0
security_driver = "none"
CONF
cat >"$state/etc/virtlogd.conf" <<CONF
log_outputs = "3:file:$state/virtlogd.log"
CONF
cat >"$state/etc/network.conf" <<'CONF'
firewall_backend = "iptables"
CONF
mkdir -p "$state/etc/qemu/networks/autostart" "$state/etc/storage/autostart"

bind() { mkdir -p "$2"; mount --bind "$1" "$2"; }
bind "$state/etc" /etc/libvirt
bind "$state/run" /run/libvirt
bind "$state/lib" /var/lib/libvirt
bind "$state/cache" /var/cache/libvirt
bind "$state/log" /var/log/libvirt
ip link set lo up

children=()
stop() {
  for pid in "${children[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait
  exit 0
}
trap stop TERM INT HUP
# Lifeline: stdin is a pipe the test process holds open. EOF means the test process is
# gone (even after kill -9), and then so is everything here.
exec 3<&0
{ cat <&3 >/dev/null; kill -TERM $$; } &
/usr/sbin/virtlogd --pid-file "$state/virtlogd.pid" 3<&- </dev/null &
children+=($!)
/usr/sbin/libvirtd --pid-file "$state/libvirtd.pid" 3<&- </dev/null &
children+=($!)
wait -n || true
stop
