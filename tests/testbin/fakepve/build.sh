#!/usr/bin/env bash
# Creates a Python venv with fakepve (pinned in requirements.txt) in a cache directory
# keyed by the fakepve version, the requirements and the Python version, then prints
# that venv's directory. Warm runs only check. The harness is run as
#   "$(tests/testbin/fakepve/build.sh)/bin/python" tests/testbin/fakepve/harness.py
set -euo pipefail
cd "$(dirname "$0")"

python=${PYTHON:-python3}
command -v "$python" >/dev/null || { echo "fakepve: Python 3.10+ is required" >&2; exit 1; }
# Debian ships venv/ensurepip separately (python3-venv); a fresh machine may lack it.
if ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then
  if command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
    echo "fakepve: installing Debian's python3-venv" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq python3-venv >&2 || { apt-get update -qq >&2 && apt-get install -y -qq python3-venv >&2; }
  else
    echo "fakepve: Python's venv module is missing: install python3-venv" >&2
    exit 1
  fi
fi
py_version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
fakepve_version=$(sed -n 's/^fakepve\[crypto\]==//p' requirements.txt)
req_hash=$(sha256sum requirements.txt | cut -c1-12)
cache_root=${BANLIEUE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/banlieue}
dir="$cache_root/fakepve/fakepve-${fakepve_version}_py${py_version}_${req_hash}"

if [[ -x "$dir/bin/python" && -f "$dir/.complete" ]]; then
  echo "$dir"
  exit 0
fi

echo "fakepve: creating a venv with fakepve ${fakepve_version} (first run only)" >&2
rm -rf "$dir.tmp"
"$python" -m venv "$dir.tmp"
"$dir.tmp/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps \
  --require-virtualenv -r requirements.txt >&2
"$dir.tmp/bin/python" -c 'import fakepve, cryptography' >&2
rm -rf "$dir"
mv "$dir.tmp" "$dir"
# venvs hard-code their path in scripts; bin/python is a symlink and stays valid.
touch "$dir/.complete"
echo "$dir"
