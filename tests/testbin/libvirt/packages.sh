# Sourced by build.sh and hack/build-deps.sh: installs Debian packages for the libvirt
# backend, keeping libvirt, QEMU and qemu-utils from one Debian suite. When the
# machine's qemu-utils comes from bookworm-backports (some images preinstall it), the
# backports suite is used for QEMU and libvirt too: installing bookworm's
# qemu-system-x86 would otherwise remove that qemu-utils.

# libvirt_suite: "bookworm-backports" when qemu-utils (or libvirt0) is a backports build, else "".
libvirt_suite() {
  local v
  for pkg in qemu-utils libvirt0; do
    v=$(dpkg-query -W -f='${Version}' "$pkg" 2>/dev/null || true)
    if [[ "$v" == *bpo* ]]; then echo "bookworm-backports"; return; fi
  done
  echo ""
}

# libvirt_apt_install PKG...: installs the packages (root + apt only), from the suite above.
libvirt_apt_install() {
  if ! command -v apt-get >/dev/null || [[ $(id -u) != 0 ]]; then
    echo "libvirt: missing Debian packages: $* (install them, or run as root on Debian)" >&2
    return 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  local suite args=(-y -qq --no-install-recommends)
  suite=$(libvirt_suite)
  if [[ -n "$suite" ]]; then
    local list=/etc/apt/sources.list.d/banlieue-bookworm-backports.list
    if ! grep -rqs "bookworm-backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
      echo "deb http://deb.debian.org/debian bookworm-backports main" >"$list"
      apt-get update -qq >&2
    fi
    args+=(-t "$suite")
  fi
  echo "libvirt: installing Debian packages${suite:+ from $suite}: $*" >&2
  apt-get install "${args[@]}" "$@" >&2 || { apt-get update -qq >&2 && apt-get install "${args[@]}" "$@" >&2; }
}
