"""Runs fakepve (https://pypi.org/project/fakepve/) for banlieue's Proxmox tests.

Started by tests/integration/src/fakepve.rs as a child process, with the venv that
tests/testbin/fakepve/build.sh made:

    python harness.py --dir <scratch dir> [--port 0] [--time-scale 0.01]

It serves PVE's API on https://127.0.0.1:<port> (loopback only) with a self-signed
certificate, seeds a two-node cluster, storages, a template VM and credentials, and
prints ONE JSON line on stdout when ready:

    {"endpoint": "https://127.0.0.1:PORT", "caFile": "...", "caPem": "...",
     "tokenID": "root@pam!banlieue", "tokenSecret": "...",
     "username": "banlieue@pve", "password": "...", "templateID": 9000,
     "nodes": ["pve1", "pve2"], "cluster": "fakecluster"}

Then it reads one JSON command per line on stdin and answers one JSON line on stdout
({"ok": true, ...} or {"ok": false, "error": "..."}). Commands ("cmd"):

    vms                                  every VM: vmid, name, node, status, lock, template, config
    lock {vmid, lock}                    leave a VM locked (PVE's `lock` config: backup, clone, ...)
    unlock {vmid}                        clear it
    hold_config_lock {vmid, secs}        another task holds the VM config lock (secs null: until released)
    release_config_lock {vmid}
    fail {method, suffix, status, message, times}   answer matching requests with an HTTP error
    fail_next_clone {message}            the next clone task ends with TASK ERROR
    clone_delay {secs}                   each clone copies for secs real seconds (0: at once)
    clones                               clone copies running now and the most at once: {running, peak}
    lose_quorum / regain_quorum
    revoke_tickets                       every ticket becomes invalid (401)
    requests {since}                     the requests seen (method, path), from index `since`
    request_counts                       every request so far, counted by route: {"GET /nodes/{node}/qemu/{vmid}/config": 12, ...}
    floor {n}                            the fewest requests for banlieue's lifecycle on n machines at once (floor.py): requests by route and seconds to all addressed, then to all gone
    uploads                              files uploaded to storages: {name: {storage, content, data (base64)}}
    isos                                 the ISO files on each storage: {storage: [name, ...]}

PUT .../qemu/{vmid}/resize grows the drive's size= in the config, as PVE does (fakepve's
schema-driven answer alone changes nothing). A disk written to a VM's config as
`<storage>:<GiB>` is allocated then, as PVE does (fakepve keeps the text as given). The guest agent answers for every non-template VM with `agent: 1` in its config, with
one interface whose IPv4 address is 10.99.<vmid / 256>.<vmid % 256>. EOF on stdin
stops the server.
"""

import argparse
import asyncio
import base64
import json
import os
import secrets
import sys
import re
import urllib.parse
from collections import Counter

from fakepve import FakePve, TaskError
from fakepve.certs import make_cert

import floor

TEMPLATE_ID = 9000


def agent_for(vm):
    mac = 'bc:24:11:{0:02x}:{1:02x}:{2:02x}'.format((vm.vmid >> 16) & 255, (vm.vmid >> 8) & 255, vm.vmid & 255)
    return {'interfaces': [
        {'name': 'lo', 'hardware-address': '00:00:00:00:00:00',
         'ip-addresses': [{'ip-address': '127.0.0.1', 'ip-address-type': 'ipv4', 'prefix': 8},
                          {'ip-address': '::1', 'ip-address-type': 'ipv6', 'prefix': 128}]},
        {'name': 'eth0', 'hardware-address': mac,
         'ip-addresses': [{'ip-address': '10.99.{0}.{1}'.format(vm.vmid // 256 % 256, vm.vmid % 256),
                           'ip-address-type': 'ipv4', 'prefix': 24},
                          {'ip-address': 'fe80::be24:11ff:fe00:1', 'ip-address-type': 'ipv6', 'prefix': 64}]}]}


def seed(pve):
    pve.add_node('pve2')
    # local-lvm shared so clones may target either node; "fast" only on pve1.
    pve.storages['local-lvm']['shared'] = 1
    pve.storages['fast'] = {'type': 'lvmthin', 'active': 1, 'content': 'images,rootdir', 'files': set(),
                            'vgname': 'fast', 'thinpool': 'data', 'nodes': 'pve1', 'shared': 1}
    pve.add_vm(TEMPLATE_ID, 'debian-13-template', node='pve1', template=True, config={
        'scsi0': 'local-lvm:base-9000-disk-0,size=4G', 'scsihw': 'virtio-scsi-single',
        'ide2': 'local-lvm:vm-9000-cloudinit,media=cdrom', 'net0': 'virtio=BC:24:11:00:90:00,bridge=vmbr0',
        'agent': '1', 'ostype': 'l26', 'cores': 1, 'memory': '512', 'boot': 'order=scsi0',
        'smbios1': 'uuid=00000000-0000-4000-8000-000000009000', 'template': 1})


DATA_DRIVE = re.compile(r'^(ide|sata|scsi|virtio)\d+$')
NEW_VOLUME = re.compile(r'^[^/:\s]+:\d+(\.\d+)?$')
UNITS = {'K': 1 << 10, 'M': 1 << 20, 'G': 1 << 30, 'T': 1 << 40}


def size_bytes(text):
    text = str(text).strip()
    if text and text[-1].upper() in UNITS:
        return int(float(text[:-1]) * UNITS[text[-1].upper()])
    return int(float(text or 0))


def grow_drive(vm, key, size):
    """Sets the drive's size= to `size` (`20G`) or grows it by it (`+2G`)."""
    parts = str(vm.config[key]).split(',')
    props = [p for p in parts[1:] if not p.startswith('size=')]
    old = next((p[5:] for p in parts[1:] if p.startswith('size=')), '0')
    new = size_bytes(old) + size_bytes(size[1:]) if size.startswith('+') else size_bytes(size)
    vm.config[key] = ','.join([parts[0]] + sorted(props + ['size={0}G'.format(new >> 30)]))


def route(method, path):
    """`GET /nodes/{node}/qemu/{vmid}/config` for `GET /api2/json/nodes/pve1/qemu/104/config`."""
    parts = path.split('/api2/json', 1)[-1].split('/')
    out = []
    for i, part in enumerate(parts):
        before = parts[i - 1] if i else ''
        if before == 'nodes':
            part = '{node}'
        elif part.isdigit():
            part = '{vmid}'
        elif part.startswith('UPID:'):
            part = '{upid}'
        elif before == 'storage':
            part = '{storage}'
        elif before == 'content':
            out.append('{volume}')  # a volume ID may hold a '/' (local:iso/seed.iso)
            break
        out.append(part)
    return '{0} {1}'.format(method, re.sub('/+$', '', '/'.join(out)))


def view(vm):
    config = dict((k, v) for k, v in vm.config.items() if isinstance(v, (str, int, float)))
    return {'vmid': vm.vmid, 'name': vm.name, 'node': vm.node, 'status': vm.status, 'lock': vm.lock,
            'template': bool(vm.template), 'config': config, 'pending': dict(vm.pending)}


class Harness(object):
    def __init__(self, pve):
        self.pve = pve
        self.ready = None
        self.fail_clone = None
        # Clones copying now, the most at once, and how long each copy takes (real seconds).
        self.clones_running = 0
        self.clones_peak = 0
        self.clone_delay = 0.0
        original = pve.ceph_io

        async def ceph_io(vm, keys=None):
            # Called inside the clone task while the new VM holds lock 'clone'.
            if vm.lock != 'clone':
                return await original(vm, keys)
            if self.fail_clone is not None:
                message, self.fail_clone = self.fail_clone, None
                raise TaskError(message)
            self.clones_running += 1
            self.clones_peak = max(self.clones_peak, self.clones_running)
            try:
                if self.clone_delay:
                    await asyncio.sleep(self.clone_delay)
                return await original(vm, keys)
            finally:
                self.clones_running -= 1
        pve.ceph_io = ceph_io

        # fakepve keeps only the last upload's fields; keep every file's bytes.
        self.uploads = {}
        upload = pve._upload

        async def recording_upload(request):
            answer = await upload(request)
            fields = getattr(pve, 'uploaded', None) or {}
            if 'filename' in fields:
                self.uploads[fields['filename']] = {
                    'storage': request.match_info['storage'], 'content': fields.get('content'),
                    'data': base64.b64encode(fields.get('data', b'')).decode()}
            return answer
        pve._upload = recording_upload

        # fakepve answers PUT .../resize from its schema and changes nothing; grow the
        # drive's size= as PVE does, so a resized disk reads back resized.
        generic = pve._generic

        async def resizing_generic(request):
            answer = await generic(request)
            parts = request.path.rstrip('/').split('/')
            if request.method == 'PUT' and parts[-1] == 'resize' and parts[-3] == 'qemu' and answer.status < 300:
                form = dict(urllib.parse.parse_qsl((await request.read()).decode()))
                vm = pve.vm(int(parts[-2]))
                drive = vm.config.get(form.get('disk', '')) if vm else None
                if drive:
                    grow_drive(vm, form['disk'], form.get('size', ''))
            return answer
        pve._generic = resizing_generic

        # PVE allocates a disk written as `<storage>:<GiB>` when the config is written
        # (to the pending config of a running VM, else to the config), so the config
        # then names a volume with its size=; fakepve keeps the text as given. Allocate
        # as PVE does, so an added disk reads back with its volume and size.
        apply_config = pve._apply_config

        async def allocating_apply_config(vm, user, p):
            p = dict(p)
            for key, value in list(p.items()):
                text = str(value)
                if DATA_DRIVE.match(key) and NEW_VOLUME.match(text.split(',')[0]) and 'media=cdrom' not in text:
                    p[key], _ = pve._qm_new_drive(vm.vmid, key, text, None)
            return await apply_config(vm, user, p)
        pve._apply_config = allocating_apply_config

    def request_counts(self):
        # fakepve drops its oldest requests beyond max_requests; the harness raises it
        # so that none is lost between two counts.
        return Counter(route(m, p) for (m, p, _b) in self.pve.requests)

    async def agents(self):
        while True:
            for vm in list(self.pve.vms):
                if vm.template or vm.agent is not None:
                    continue
                if str(vm.config.get('agent', '0')).split(',')[0].split('=')[-1] == '1':
                    vm.agent = agent_for(vm)
            await asyncio.sleep(0.02)

    async def command(self, line):
        c = json.loads(line)
        cmd = c.get('cmd')
        pve = self.pve
        if cmd == 'vms':
            return {'vms': [view(vm) for vm in pve.vms]}
        if cmd == 'lock':
            pve.snapshot_lock(int(c['vmid']), c.get('lock', 'backup'))
        elif cmd == 'unlock':
            pve.unlock(int(c['vmid']))
        elif cmd == 'hold_config_lock':
            await pve.hold_config_lock(int(c['vmid']), c.get('secs'))
        elif cmd == 'release_config_lock':
            pve.release_config_lock(int(c['vmid']))
        elif cmd == 'fail':
            pve.fail(c['method'], c['suffix'], int(c.get('status', 500)), c.get('message', 'injected failure'),
                     times=c.get('times'))
        elif cmd == 'clone_delay':
            self.clone_delay = float(c['secs'])
        elif cmd == 'clones':
            return {'running': self.clones_running, 'peak': self.clones_peak}
        elif cmd == 'fail_next_clone':
            self.fail_clone = c.get('message', 'clone failed: injected')
        elif cmd == 'lose_quorum':
            pve.lose_quorum()
        elif cmd == 'regain_quorum':
            pve.regain_quorum()
        elif cmd == 'revoke_tickets':
            pve.revoke_tickets()
        elif cmd == 'uploads':
            return {'uploads': self.uploads}
        elif cmd == 'isos':
            return {'isos': dict((name, sorted(store.get('files', ()))) for name, store in pve.storages.items())}
        elif cmd == 'request_counts':
            return {'counts': dict(self.request_counts())}
        elif cmd == 'floor':
            r = self.ready
            return await floor.floor(pve, r['tokenID'], r['tokenSecret'], r['caFile'], r['templateID'],
                                     int(c['n']), lambda: dict(self.request_counts()))
        elif cmd == 'requests':
            since = int(c.get('since', 0))
            return {'requests': [[m, p] for (m, p, _b) in pve.requests[since:]], 'next': len(pve.requests)}
        else:
            raise ValueError('unknown command {0!r}'.format(cmd))
        return {}


async def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--dir', required=True, help='scratch directory for the certificate')
    parser.add_argument('--port', type=int, default=0)
    parser.add_argument('--time-scale', type=float, default=0.01)
    args = parser.parse_args()

    password = secrets.token_hex(16)
    pve = FakePve(user='root@pam', password=secrets.token_hex(16), host='127.0.0.1', port=args.port)
    pve.time_scale = args.time_scale
    seed(pve)
    token_id, token_secret = 'root@pam!banlieue', secrets.token_hex(16)
    pve.apitokens[token_id] = token_secret
    pve.users['banlieue@pve'] = password
    pve.max_requests = 10 ** 7
    harness = Harness(pve)

    os.makedirs(args.dir, exist_ok=True)
    certfile, keyfile, _ = make_cert(args.dir, hosts=('127.0.0.1',))
    await pve.start(certfile, keyfile)
    agents = asyncio.ensure_future(harness.agents())
    with open(certfile) as fh:
        ca_pem = fh.read()
    ready = {'endpoint': 'https://127.0.0.1:{0}'.format(pve.port), 'caFile': certfile, 'caPem': ca_pem,
             'tokenID': token_id, 'tokenSecret': token_secret, 'username': 'banlieue@pve', 'password': password,
             'templateID': TEMPLATE_ID, 'nodes': sorted(pve.nodes), 'cluster': pve.cluster_name}
    harness.ready = ready
    print(json.dumps(ready), flush=True)

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while True:
        line = await reader.readline()
        if not line:
            break
        if not line.strip():
            continue
        try:
            answer = dict(await harness.command(line), ok=True)
        except Exception as e:  # noqa: BLE001 - every failure goes back to the test
            answer = {'ok': False, 'error': '{0}: {1}'.format(type(e).__name__, e)}
        print(json.dumps(answer), flush=True)
    agents.cancel()
    await pve.stop()


if __name__ == '__main__':
    asyncio.run(main())
