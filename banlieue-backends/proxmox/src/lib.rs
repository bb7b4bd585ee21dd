//! banlieue's backend for Proxmox VE: a lean typed client for PVE's `/api2/json` REST
//! API on reqwest (rustls with the ring provider) behind banlieue-sdk's
//! [`Backend`](banlieue_sdk::backend::Backend) trait.
//!
//! # Connection
//!
//! `Provider.spec.connection.endpoint` is the API's base URL, e.g.
//! `https://pve1.example:8006` (a trailing `/api2/json` is accepted). TLS is verified
//! against `caBundle` when given, else the system's roots; `insecureSkipTLSVerify`
//! turns verification off (labs only). The credentials Secret holds either
//!
//! - `tokenID` (`user@realm!name`) and `tokenSecret`: sent as
//!   `Authorization: PVEAPIToken=<tokenID>=<tokenSecret>` (recommended), or
//! - `username` (`user@realm`) and `password`: a ticket from `POST /access/ticket`,
//!   sent as the `PVEAuthCookie` cookie with the `CSRFPreventionToken` header on
//!   writes, renewed after 90 minutes (PVE's tickets expire after 2 hours) and
//!   whenever PVE answers 401.
//!
//! The operator keeps one backend per Provider, so one client and one ticket serve
//! every machine of that Provider. Credentials are [`SecretValue`]s and never appear
//! in logs, errors or `Debug` output.
//!
//! [`SecretValue`]: banlieue_sdk::backend::SecretValue
//!
//! # Machines
//!
//! `ensure` never waits for a task: it starts one, returns
//! [`Pending`](banlieue_sdk::backend::Pending) with the UPID, and polls
//! `GET /nodes/{node}/tasks/{upid}/status` on the next call. A machine goes through:
//!
//! 1. **Clone** the template (`POST /nodes/{source}/qemu/{templateID}/clone`, full or
//!    linked, `target` = `targetNode` or the failure domain, `storage`, `pool`), with
//!    the VM's `name` and a `description` carrying `banlieue.io/uid: <uid>`. The VMID
//!    comes from `vmIDRange` or `/cluster/nextid`; a clone that finds its VMID taken
//!    retries with the next (see [`vmid`]).
//! 2. **Configure** once (`PUT …/config`): sockets, cores, memory, `agent: 1`,
//!    firmware (`efi-secure`: OVMF plus `efidisk0: <storage>:1,efitype=4m,pre-enrolled-keys=1`
//!    when the VM has no EFI vars disk yet), `smbios1: uuid=<uid>` (so `providerID` = `proxmox://<uid>` is stable),
//!    `netN` (bridge, VLAN `tag`, model, MTU, MAC: the spec's, the clone's, else one
//!    derived from the UID in `BC:24:11`), `ipconfigN` / `nameserver` from IPAM,
//!    additional disks, and the tags `banlieue;banlieue-<uid>`. The UID tag marks the
//!    VM configured. Then the boot disk is grown (`PUT …/resize`) when `diskGiB` is
//!    larger.
//!
//!    **Data disk provisioning** ([`provisioning`]): PVE provisions a disk as its
//!    storage does (`GET /storage`: its `type`, and `preallocation` or `sparse`), so
//!    before the clone (and again before the configuration, and before a config write
//!    that adds disks) each new disk's `provisioning` is checked against what its
//!    storage gives; any other is a terminal `DiskProvisioningUnsupported` and nothing
//!    is made. `GET /storage` (and the template's config, for the boot disk's storage)
//!    is read only for a machine with additional disks.
//!
//!    **Bootstrap data** travels whole as a NoCloud seed ([`seed`], built in memory
//!    by `banlieue-nocloud`): an ISO 9660 + Joliet image labelled `cidata` with
//!    `meta-data` (`instance-id` = the infra object's UID), the bootstrap `user-data`
//!    verbatim and `network-config` (given, else version 2 from the NICs' IPAM,
//!    matched by MAC). Before the config write it is uploaded (`POST
//!    /nodes/{node}/storage/{storage}/upload`, multipart, `content=iso`) as
//!    `banlieue-<uid>-seed.iso` to `seedStorage`, else the first active storage with
//!    `iso` content on the VM's node, and the config attaches it as a CD-ROM
//!    (`ide2: <storage>:iso/banlieue-<uid>-seed.iso,media=cdrom`) in the slot of the
//!    template's cloud-init drive, which it replaces (else the first free IDE/SATA
//!    slot). Without bootstrap data the template's cloud-init drive stays, and PVE
//!    writes `ipconfigN` / `nameserver` to it. Ignition is not declared in [`capabilities`]: a VM asking
//!    for it is never scheduled here (and a request carrying it is a terminal `UnsupportedBootstrapFormat`).
//!    Bootstrap data never appears in logs, errors or `Debug` output. The token or
//!    user needs `Datastore.AllocateTemplate` on that storage (PVE's upload check)
//!    and `Datastore.Allocate` there to delete the seed.
//! 3. **Spec changes** of a configured VM ([`changes`]) are not applied by `ensure`:
//!    the controller assesses them from the change table ([`changes::change_table`])
//!    and hands the fields that apply now to `apply_changes`. CPUs (sockets, cores),
//!    memory and added disks are written with one `PUT …/config`; on a running VM PVE
//!    keeps them pending (`GET …/pending`) until its next start, and the machine
//!    reports `RestartRequired=True` naming them (it stays `Ready`); banlieue never
//!    restarts a VM on its own: a power cycle (`PoweredOff`, then `PoweredOn`) applies
//!    them. A grown disk (boot or additional) is grown live with `PUT …/resize`.
//!    Disks never shrink and are never removed; NICs and firmware do not change after
//!    the first configuration (`UpToDate=False ChangeRefused`). Every observation of
//!    a configured VM reads back what it runs with (`GET …/pending`: its current
//!    config, and the config its next start uses when that differs).
//! 4. **Power**: `status/start`, `status/shutdown` (with `shutdownTimeout` and
//!    `forceStop`), `status/resume` (`status/suspend` is there, but `Suspended` is
//!    not declared in [`capabilities`] until a test exercises it: refused before asking).
//! 5. **Observe**: power from `status/current`; addresses from the guest agent
//!    (`agent/network-get-interfaces`, loopback and link-local left out) plus the
//!    VM name as `Hostname`.
//!
//! `delete` stops a running VM, deletes its seed volume (`DELETE
//! /nodes/{node}/storage/{storage}/content/{volid}`: PVE's purge leaves ISO volumes),
//! then destroys it with `purge=1` and `destroy-unreferenced-disks=1`.
//!
//! **Crash safety.** A VM is found by its UID tag in `/cluster/resources`, else by
//! name plus the UID line in its description (a clone not yet configured), so a
//! restart never clones twice; a clone in flight shows as PVE's `clone` lock.
//!
//! **Errors.** PVE's envelope message and per-field `errors` become the error
//! message. 401 → terminal `Unauthorized`, 403 → `Forbidden`, 400 → `InvalidRequest`;
//! `VM is locked` and config-lock timeouts → transient `VMLocked`; lost quorum →
//! transient `NoQuorum`; other 5xx → transient `ServerError`; no connection →
//! transient `Unreachable`. A failed clone, resize or start task → terminal
//! `CloneFailed` / `ResizeFailed` / `StartFailed` with the task's exit status; a
//! failed seed upload → transient `SeedUploadFailed`; no `iso` storage on the node →
//! terminal `NoSeedStorage`. Lost quorum refuses every write; the operator retries
//! with its growing backoff and converges once the cluster is quorate again.
//!
//! # Inventory
//!
//! `check` reports `Proxmox VE <version> (release <r>)` and one failure domain per
//! online node, named after the node, with labels `topology.kubernetes.io/zone=<node>`
//! and `banlieue.io/proxmox-cluster=<cluster>`, location `node=<node>`, and resources
//! `storage` (active storages taking VM images on that node), `bridge` (its Linux and
//! OVS bridges) and, when the `vlans` setting lists any, `vlan`. Each node's
//! architecture comes from `GET /nodes/{node}/status`: its kernel's
//! `current-kernel.machine`, else an x86 `cpuinfo.vendor` (amd64), else none, and no
//! VM is placed on that node ([`inventory::node_architecture`]).
//!
//! # Settings
//!
//! | key | value | default | meaning |
//! |---|---|---|---|
//! | `taskPollInterval` | `500ms`, `2s`, ... (at most 300s) | `2s` | how soon to look at a running task again |
//! | `shutdownTimeout` | duration (or bare seconds), at most 86400s; PVE gets whole seconds, rounded up | `120s` | a shutdown's timeout before PVE stops the VM |
//! | `failedCloneBackoff` | duration, at most 3600s | `60s` | how long a failed clone is reported before it is tried again |
//! | `cluster` | text | PVE's cluster name, else the first node's | the `banlieue.io/proxmox-cluster` label |
//! | `vlans` | comma list of VLAN tags | none | published as resource `vlan` on every node (PVE cannot list the VLANs a bridge carries) |
//! | `seedStorage` | storage ID | the first active storage with `iso` content on the node | where NoCloud seeds are uploaded |
//! | `maxConcurrentCreates` | whole number, `0` for no cap | `10` | machines cloned at once (PVE limits concurrent clones from one template); the rest wait with `CreateQueued` (read by the operator) |
//!
//! Any other key (but the operator's `capabilities.*`) is refused: the Provider is
//! `Ready=False InvalidSettings`, naming it and the nearest known key.
//!
//! # Not yet supported
//!
//! - `sources.proxmox.volume` images: [`find_image`](banlieue_sdk::backend::Backend::find_image)
//!   answers a terminal `ImageSourceUnsupported` (the image's row on the Provider
//!   says so); only templates are cloned. PVE's `import-from` would do it, but
//!   fakepve, the test target, cannot import, so it is left until it can be tested.
//! - CAPI IPAM pool addresses (`ipam.mode: pool` gets DHCP until claimed).
//! - Shrinking disks, removing disks, changing NICs or firmware after the first
//!   configuration; CPU and memory hotplug (`hotplug`, `vcpus`): CPUs and memory wait
//!   for a power cycle.
//! - Ignition bootstrap data.
#![warn(missing_docs)]

mod backend;
pub mod changes;
pub mod client;
pub mod config;
pub mod inventory;
pub mod provisioning;
pub mod seed;
pub mod settings;
pub mod tasks;
pub mod vmid;

use banlieue_sdk::api::common::ProviderClass;
use banlieue_sdk::backend::{BackendCapabilities, ImageSourceKind};

pub use backend::{IMAGE_SOURCE_UNSUPPORTED, ProxmoxBackend, ProxmoxFactory};

/// The `Provider.spec.class` this backend serves.
pub const CLASS: ProviderClass = ProviderClass::Proxmox;

/// What the Proxmox VE backend does for real (published in the Provider's
/// `status.backendCapabilities`; the book's capability matrix is generated from it):
/// SeaBIOS, OVMF, and OVMF with Secure Boot (an `efidisk0` with Microsoft's keys
/// pre-enrolled); cloud-config on a NoCloud seed (no Ignition); powered on or off
/// (suspend is not exercised by a test, so it is refused); images from template VMIDs
/// (volume imports are not supported yet); no disk transfer; the change table of
/// [`changes::change_table`] (CPUs and memory at the next boot, disks grown live,
/// added disks at the next boot).
pub fn capabilities() -> BackendCapabilities {
    use banlieue_sdk::api::common::{BootstrapFormat as B, Firmware as F, PowerState as P};
    BackendCapabilities {
        changes: changes::change_table(),
        firmware: vec![F::Bios, F::Efi, F::EfiSecure],
        bootstrap_formats: vec![B::CloudConfig],
        power_states: vec![P::PoweredOn, P::PoweredOff],
        image_sources: vec![ImageSourceKind::TemplateId],
        disk_export: vec![],
        disk_import: vec![],
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn serves_its_class() {
        assert_eq!(super::CLASS.as_str(), "proxmox");
    }
}
