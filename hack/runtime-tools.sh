#!/usr/bin/env bash
# Copies host programs the runtime image runs beside banlieue into DIR, each under its
# own name, after checking that it runs (`TOOL --version`). The Dockerfile's build stages
# run this for qemu-img (Debian's qemu-utils, installed by the stage's apt line), which
# `migration.strategy: CopyDisk` runs from PATH to convert disks between formats; their
# shared libraries are hack/runtime-libs.sh's business.
#
# Usage: hack/runtime-tools.sh TOOL... DIR    (TOOL: an absolute path)
set -euo pipefail

if (( $# < 2 )); then
  echo "usage: $0 TOOL... DIR" >&2
  exit 2
fi
tools=("${@:1:$#-1}") dir="${!#}"

for tool in "${tools[@]}"; do
  [[ "$tool" == /* ]] || { echo "runtime-tools: $tool is not an absolute path" >&2; exit 2; }
  [[ -f "$tool" && -x "$tool" ]] || { echo "runtime-tools: no program $tool (is its package installed?)" >&2; exit 1; }
  version="$("$tool" --version </dev/null | head -n1)" || { echo "runtime-tools: $tool --version failed" >&2; exit 1; }
  echo "runtime-tools: $tool: $version" >&2
done
rm -rf "$dir"
mkdir -p "$dir"
for tool in "${tools[@]}"; do
  cp -L "$tool" "$dir/"
  chmod 0755 "$dir/$(basename "$tool")"
done
echo "runtime-tools: copied ${#tools[@]} programs into $dir" >&2
