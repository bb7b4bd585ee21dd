#!/usr/bin/env bash
# Records tests/golden/responses/ from a live vcsim (tests/testbin/vcsim), sending the
# request files in requests/ (written by `UPDATE_GOLDEN=1 cargo test golden`) in order,
# with their @PLACEHOLDERS@ filled from earlier answers. Loopback only.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
vcsim=$("$here/../../../../tests/testbin/vcsim/build.sh")
work=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT
sleep 600 | "$vcsim" >"$work/out" 2>"$work/err" &
pid=$!
for _ in $(seq 50); do [[ -s "$work/out" ]] && break; sleep 0.1; done
read -r endpoint user password < <(python3 -c 'import json,sys; r=json.loads(open(sys.argv[1]).readline()); open(sys.argv[2],"w").write(r["caPem"]); print(r["endpoint"], r["username"], r["password"])' "$work/out" "$work/ca.pem")
declare -A vars=([PASSWORD]="$password")
# GOLDEN_OUT records elsewhere (e.g. to pick up the answers of new requests only).
out="${GOLDEN_OUT:-$here/responses}"
mkdir -p "$out"

# post NAME [FILE]: sends requests/NAME.xml (or FILE) with the session cookie, saves responses/NAME.xml.
post() {
  local body
  body=$(cat "${2:-$here/requests/$1.xml}")
  for k in "${!vars[@]}"; do body=${body//@$k@/${vars[$k]}}; done
  local cookie=()
  [[ -s "$work/cookie" ]] && cookie=(-H "Cookie: $(cat "$work/cookie")")
  curl -s --cacert "$work/ca.pem" -D "$work/headers" -H 'Content-Type: text/xml; charset=utf-8' \
    -H 'SOAPAction: urn:vim25/7.0.3.0' "${cookie[@]}" --data-binary "$body" "$endpoint/sdk" >"$out/$1.xml"
  grep -i '^set-cookie: vmware_soap_session' "$work/headers" | sed 's/^[^:]*: //; s/;.*//' | tr -d '\r' >"$work/c" || true
  [[ -s "$work/c" ]] && mv "$work/c" "$work/cookie"
  # The password never lands in a golden file.
  sed -i "s/$password/@PASSWORD@/g" "$out/$1.xml"
}
# first TAG in responses/NAME.xml: the text of its first <TAG ...>...</TAG>.
first() { python3 - "$out/$1.xml" "$2" <<'PY'
import re, sys
m = re.search(r'<%s[^>]*>([^<]*)<' % sys.argv[2], open(sys.argv[1]).read())
print(m.group(1) if m else '')
PY
}

post 01_retrieve_service_content
# Without a session, then with a wrong password.
post not_authenticated "$here/requests/06_find_by_inventory_path.xml"
vars[PASSWORD]="wrong-password"; post 02_login_wrong_password "$here/requests/02_login.xml"; vars[PASSWORD]="$password"
post 02_login
post 03_create_container_view
vars[VIEW]=$(first 03_create_container_view returnval)
post 04_retrieve_inventory
post 05_destroy_view
post 06_find_by_inventory_path
post 07_retrieve_template_snapshot
vars[SNAPSHOT]=$(first 07_retrieve_template_snapshot val)
post 08_clone_vm_task
vars[TASK]=$(first 08_clone_vm_task returnval)
sleep 0.5
post 09_retrieve_task
vars[VM]=$(first 09_retrieve_task 'val type="VirtualMachine"')
post 10_find_vm_by_uuid
post 11_reconfig_vm_task
sleep 0.3
post 12_power_on_vm_task
sleep 1 # the harness reports a guest IP
post 13_retrieve_vm
post 13b_retrieve_vm_and_task
post 14_shutdown_guest
sleep 0.3
post 16_power_off_vm_task
sleep 0.3
post 17_destroy_task
sleep 0.3
post 17b_retrieve_destroyed_vm_and_task "$here/requests/13b_retrieve_vm_and_task.xml"
post 18_clone_duplicate_name
vars[TASK]=$(first 18_clone_duplicate_name returnval)
sleep 0.3
post 18_retrieve_failed_task "$here/requests/09_retrieve_task.xml"
post 21_make_directory
# CreateVM attaches the disk as it is: put one there through the datastore file
# interface, as an import does (a descriptor, and its flat extent).
disk="$endpoint/folder/banlieue/5b2e6c1a-0d3f-4c8e-9a7b-1f2e3d4c5b6a"
files_query='dcPath=DC0&dsName=LocalDS_0'
printf '# Disk DescriptorFile\nversion=1\ncreateType="vmfs"\nRW 16384 VMFS "os-flat.vmdk"\n' |
  curl -sf --cacert "$work/ca.pem" -H "Cookie: $(cat "$work/cookie")" -T - "$disk/os.vmdk?$files_query"
head -c 8388608 /dev/zero |
  curl -sf --cacert "$work/ca.pem" -H "Cookie: $(cat "$work/cookie")" -T - "$disk/os-flat.vmdk?$files_query"
post 22_create_vm_task
vars[TASK]=$(first 22_create_vm_task returnval)
sleep 0.3
post 22_retrieve_created_task "$here/requests/09_retrieve_task.xml"
post 20_logout
ls "$out"
