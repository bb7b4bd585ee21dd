#!/usr/bin/env bash
# Prints the workspace crates that are published to crates.io, one a line: every
# member without `publish = false`. publish-check.sh and semver-check.sh read it, so a
# new library crate is checked as soon as it joins the workspace.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
"${CARGO:-cargo}" metadata --no-deps --format-version 1 --locked | python3 -c '
import json, sys
for p in json.load(sys.stdin)["packages"]:
    if p.get("publish") != []:
        print(p["name"])
' | sort
