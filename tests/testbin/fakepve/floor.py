"""The fewest PVE API requests for the lifecycle banlieue gives a machine, on N at once.

Run by harness.py's `floor {n}` command inside the harness's event loop, as a plain
HTTP client (aiohttp) of the fakepve it serves, over loopback with the API token (no
ticket, so no session). Per machine: upload the NoCloud seed ISO, clone the template,
configure (CPUs, memory, the seed as a CD-ROM, the guest agent) in one request, grow
the disk to the class's size, start, read the guest agent's addresses once running,
stop, destroy with its disks, delete the seed ISO. Every wait is one
GET /cluster/resources for all machines per round, never a poll per task or per VM.
The backend benchmark (backend-floor-bench) reports banlieue's requests and times as
ratios to these.
"""

import asyncio
import ssl
import time

import aiohttp

PREFIX = 'floor-'
FIRST_VMID = 5000
ROUND = 0.1
# The seed's bytes: what they are does not change a request count (banlieue uploads a real ISO).
SEED = b'#cloud-config\nruncmd: [echo banlieue]\n'


async def floor(pve, token_id, token_secret, cafile, template_id, n, counts):
    """Runs the lifecycle; `counts()` is the harness's request count by route."""
    base = 'https://127.0.0.1:{0}/api2/json'.format(pve.port)
    headers = {'Authorization': 'PVEAPIToken={0}={1}'.format(token_id, token_secret)}
    context = ssl.create_default_context(cafile=cafile)
    before = counts()
    started = time.monotonic()
    async with aiohttp.ClientSession(headers=headers, connector=aiohttp.TCPConnector(ssl=context)) as s:

        async def call(method, path, **kwargs):
            async with s.request(method, base + path, **kwargs) as r:
                body = await r.json(content_type=None)
                if r.status >= 300:
                    raise RuntimeError('{0} {1}: {2} {3}'.format(method, path, r.status, body))
                return body.get('data')

        async def ours():
            vms = await call('GET', '/cluster/resources', params={'type': 'vm'})
            return dict((vm['vmid'], vm) for vm in vms if str(vm.get('name', '')).startswith(PREFIX))

        async def until(done):
            while True:
                vms = await ours()
                if done(vms):
                    return vms
                await asyncio.sleep(ROUND)

        template = next(vm for vm in await call('GET', '/cluster/resources', params={'type': 'vm'})
                        if vm['vmid'] == template_id)
        node = template['node']
        vmids = [FIRST_VMID + i for i in range(n)]

        async def create(i, vmid):
            name = '{0}{1}'.format(PREFIX, i)
            # A multipart body with its length, as PVE's upload wants it (no chunking).
            boundary = 'floor{0}'.format(vmid)
            body = ('--{0}\r\nContent-Disposition: form-data; name="content"\r\n\r\niso\r\n'
                    '--{0}\r\nContent-Disposition: form-data; name="filename"; filename="{1}.iso"\r\n'
                    'Content-Type: application/octet-stream\r\n\r\n').format(boundary, name).encode() \
                + SEED + '\r\n--{0}--\r\n'.format(boundary).encode()
            await call('POST', '/nodes/{0}/storage/local/upload'.format(node), data=body,
                       headers={'Content-Type': 'multipart/form-data; boundary=' + boundary})
            await call('POST', '/nodes/{0}/qemu/{1}/clone'.format(node, template_id),
                       data={'newid': vmid, 'name': name, 'full': 1, 'storage': 'local-lvm'})

        await asyncio.gather(*(create(i, vmid) for i, vmid in enumerate(vmids)))
        await until(lambda vms: len(vms) == n and not any(vm.get('lock') for vm in vms.values()))

        async def configure(i, vmid):
            await call('POST', '/nodes/{0}/qemu/{1}/config'.format(node, vmid),
                       data={'cores': 2, 'memory': 1024, 'agent': 1,
                             'ide2': 'local:iso/{0}{1}.iso,media=cdrom'.format(PREFIX, i)})
            await call('PUT', '/nodes/{0}/qemu/{1}/resize'.format(node, vmid), data={'disk': 'scsi0', 'size': '16G'})
            await call('POST', '/nodes/{0}/qemu/{1}/status/start'.format(node, vmid))

        await asyncio.gather(*(configure(i, vmid) for i, vmid in enumerate(vmids)))
        await until(lambda vms: all(vm['status'] == 'running' for vm in vms.values()))

        async def address(vmid):
            while True:
                try:
                    got = await call('GET', '/nodes/{0}/qemu/{1}/agent/network-get-interfaces'.format(node, vmid))
                except RuntimeError:
                    got = None
                if got and any(a.get('ip-address-type') == 'ipv4' and not a['ip-address'].startswith('127.')
                               for i in got.get('result', []) for a in i.get('ip-addresses', [])):
                    return
                await asyncio.sleep(ROUND)

        await asyncio.gather(*(address(vmid) for vmid in vmids))
        ready = time.monotonic() - started
        at_ready = counts()

        deleting = time.monotonic()
        await asyncio.gather(*(call('POST', '/nodes/{0}/qemu/{1}/status/stop'.format(node, vmid)) for vmid in vmids))
        await until(lambda vms: all(vm['status'] == 'stopped' and not vm.get('lock') for vm in vms.values()))

        async def destroy(i, vmid):
            await call('DELETE', '/nodes/{0}/qemu/{1}'.format(node, vmid),
                       params={'purge': 1, 'destroy-unreferenced-disks': 1})
            await call('DELETE', '/nodes/{0}/storage/local/content/local:iso/{1}{2}.iso'.format(node, PREFIX, i))

        await asyncio.gather(*(destroy(i, vmid) for i, vmid in enumerate(vmids)))
        await until(lambda vms: not vms)
        gone = time.monotonic() - deleting
        at_gone = counts()

    def diff(after, before):
        return dict((k, v - before.get(k, 0)) for k, v in after.items() if v - before.get(k, 0) > 0)

    return {'readySeconds': ready, 'goneSeconds': gone, 'readyCalls': diff(at_ready, before),
            'goneCalls': diff(at_gone, at_ready), 'sessions': 0}
