#!/usr/bin/env bash
# Checks that each backend feature of the `banlieue` binary pulls in its own backend
# crate and no other: for every backend, the normal dependency tree of
# `banlieue --no-default-features --features <backend>` must contain
# `banlieue-backend-<backend>` and no other `banlieue-backend-*` crate. The tree
# without any backend feature must contain none.
#
# Usage: hack/check-feature-isolation.sh   (from anywhere; CARGO overrides `cargo`)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
CARGO="${CARGO:-cargo}"
BACKENDS=(vsphere proxmox libvirt cloud-hypervisor sim)

# The banlieue-backend-* crates in the normal dependency tree for these features.
backend_crates() {
  local tree
  if ! tree="$("$CARGO" tree --quiet --locked -p banlieue --no-default-features "$@" -e normal --prefix none)"; then
    echo "cargo tree failed for: --no-default-features $*" >&2
    exit 2
  fi
  awk '$1 ~ /^banlieue-backend-/ {print $1}' <<<"$tree" | sort -u
}

failed=0
summary=()
check() {
  local label="$1" want="$2"; shift 2
  local got
  got="$(backend_crates "$@")" || exit 2
  got="$(paste -sd' ' - <<<"$got")"
  if [[ "$got" == "$want" ]]; then
    summary+=("ok    ${label}: ${got:-no backend crate}")
  else
    summary+=("FAIL  ${label}: want '${want:-none}', got '${got:-none}'")
    failed=1
  fi
}

check "no backend feature" ""
for backend in "${BACKENDS[@]}"; do
  check "--features ${backend}" "banlieue-backend-${backend}" --features "$backend"
done

echo "feature isolation of the banlieue binary:"
printf '  %s\n' "${summary[@]}"
if (( failed )); then
  echo "a backend feature pulls in another backend's crate (see above)" >&2
  exit 1
fi
