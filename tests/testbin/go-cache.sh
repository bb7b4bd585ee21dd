#!/usr/bin/env bash
# The Go build cache the testbin scripts share is scratch: every tool they build lands
# in its own versioned cache dir, and a warm run only stats those. Keeping Go's cache
# (3-4 GiB after the apiserver, CAPI and vcsim) would fill small CI disks, so it lives
# in a private directory that `make testbin` and `make demo` remove once the tools exist.
#
#   source tests/testbin/go-cache.sh   # export GOCACHE=<cache root>/go-build-scratch
#   tests/testbin/go-cache.sh prune    # remove it
set -euo pipefail
go_cache_root=${BANLIEUE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/banlieue}
go_scratch="$go_cache_root/go-build-scratch"
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  case "${1:-}" in
    prune) rm -rf "$go_scratch" ;;
    *) echo "usage: $0 prune (or source it)" >&2; exit 2 ;;
  esac
else
  export GOCACHE="$go_scratch"
fi
