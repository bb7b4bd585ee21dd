//! banlieue's backend for vSphere: a lean typed client for the vSphere Web Services
//! API (SOAP vim25 on `/sdk`) on reqwest (rustls with the ring provider) and a small
//! XML layer, behind banlieue-sdk's [`Backend`](banlieue_sdk::backend::Backend) trait.
//! Why SOAP and not the Automation REST API: docs/adr/0005-vsphere-soap-client.md.
//!
//! # Connection
//!
//! `Provider.spec.connection.endpoint` is the vCenter's URL, e.g.
//! `https://vcenter.example.com/sdk` (the `/sdk` suffix is optional). TLS is verified
//! against `caBundle` when given, else the system's roots; `insecureSkipTLSVerify`
//! turns verification off (labs only). The credentials Secret holds `username` and
//! `password`.
//!
//! The operator keeps one backend per Provider, and each backend holds **one vCenter
//! session**: it logs in on first use, every call reuses the `vmware_soap_session`
//! cookie, and a `NotAuthenticated` fault (an expired or terminated session) logs in
//! once more and repeats the call. A rejected login (`InvalidLogin`) is answered from
//! memory for a minute, so a wrong password never turns into a login storm.
//!
//! # Machines
//!
//! `ensure` never waits for a task: it starts one, returns
//! [`Pending`](banlieue_sdk::backend::Pending) with the task's ID, and reads the task's
//! `info.state` on the next call. A machine goes through:
//!
//! 1. **Clone** (`CloneVM_Task`) the template (inventory path or name) into the
//!    failure domain's datacenter and compute cluster (its root resource pool, or
//!    `resourcePool`), the datacenter's VM folder (or `folder`), on `datastore` when
//!    given; `LinkedClone` links to the template's current snapshot. The clone's
//!    config sets `numCPUs`, `numCoresPerSocket`, `memoryMB`, firmware (`efi-secure`
//!    is `efi` with `bootOptions.efiSecureBootEnabled`; set again by a reconfigure
//!    while the new machine is off when the clone did not take it),
//!    `cpuHotAddEnabled`/`memoryHotAddEnabled` (on when the spec asks `maxCPUs` /
//!    `maxMemoryMiB`, else off; set again with the configuring reconfigure when the
//!    clone did not take them: vcsim's clone keeps only `numCPUs` and `memoryMB`), and
//!    `instanceUuid` = the infra object's UID (as CAPV does), plus the `extraConfig`
//!    keys `banlieue.uid` and `banlieue.failureDomain`.
//! 2. **Configure** once (`ReconfigVM_Task`): the template's network devices, in
//!    order, moved to the machine's port groups (`network[].networkName`, standard or
//!    distributed; `macAddress` fixes the MAC), the first disk grown to `diskGiB`,
//!    `additionalDisks` added on the template's SCSI controller,
//!    `guestinfo.metadata` (instance-id, hostname, and the network config: the
//!    bootstrap data's, else cloud-init v2 made from static `ipam` and
//!    `network[].mtu` matched by MAC; DHCP with the guest's MTU needs none: a vSphere
//!    NIC has no MTU of its own, so an MTU with bootstrap data bringing its own
//!    network config, or with Ignition, is refused before the clone,
//!    `MTUUnsupported`) and `guestinfo.userdata`, or
//!    `guestinfo.ignition.config.data` for Ignition, all base64 with their
//!    `.encoding` keys, and `banlieue.configured=true`.
//! 3. **Power**: `PowerOnVM_Task`, `SuspendVM_Task`; powering off is a guest
//!    `ShutdownGuest` when VMware Tools runs, then `PowerOffVM_Task` after
//!    `shutdownTimeout` (at once without Tools).
//! 4. **Observe**: power state, guest IPs (`guest.net`, `guest.ipAddress`; loopback
//!    and link-local left out) plus the VM name as `Hostname`; `providerID` =
//!    `vsphere://<BIOS UUID>`. While powered on without an address the machine
//!    reports `WaitingForAddress` (setting `waitForAddress`).
//!
//! 5. **Change** ([`change_table`]): every observation carries what the VM runs with,
//!    read in the same property read as the rest (`config.hardware.numCPU`,
//!    `numCoresPerSocket`, `memoryMB`, the disks' `capacityInKB` — the first disk as
//!    the OS disk, the added ones by the names banlieue recorded in `banlieue.disks` —
//!    the network devices, the firmware, and `cpuHotAddEnabled`/`memoryHotAddEnabled`
//!    as the hot-add ceilings). `apply_changes` is one `ReconfigVM_Task` for every
//!    field handed over, returned pending like every task: disks grow live; CPUs and
//!    memory grow live on a VM made with hot-add (`maxCPUs`/`maxMemoryMiB` in the
//!    spec set `cpuHotAddEnabled`/`memoryHotAddEnabled` on the clone), else, like
//!    cores per socket and every shrink, only while the VM is powered off.
//!
//! `delete` powers the VM off and then destroys it (`Destroy_Task`).
//!
//! **Crash safety.** A VM is found by `FindByUuid` on its instance UUID (the UID), so a
//! restart never clones twice; a clone started before a restart and still running
//! makes the new clone fail with vSphere's `DuplicateName` (transient) until it is done.
//!
//! **Errors.** SOAP faults and failed tasks carry vSphere's fault type and message
//! into the error: `InvalidLogin` → terminal `Unauthorized`, `NoPermission` →
//! `Forbidden`, `InvalidArgument` → `InvalidRequest`, busy objects → transient `Busy`,
//! other faults → transient `VSphereFault`, no answer → transient `Unreachable`. A
//! failed clone, create, reconfigure or power-on task → terminal `CloneFailed` /
//! `CreateFailed` / `ReconfigureFailed` / `PowerOnFailed` with vSphere's message.
//!
//! # Inventory
//!
//! `check` reports the vCenter's `about.fullName` and one failure domain per
//! datacenter × compute cluster, named `<datacenter>/<cluster>`, with labels
//! `topology.kubernetes.io/region=<datacenter>` and `topology.kubernetes.io/zone=<cluster>`
//! (when they are valid label values), location `datacenter`, `cluster`, and resources
//! `datastore` (the datastores the cluster mounts) and `portGroup` (the networks it
//! reaches), which is what a VSphereCluster spanning several vCenters aggregates.
//! Its architecture is its ESXi hosts' (`summary.config.product.osType`: `vmnix-x86`
//! is amd64, `vmnix-arm64` arm64); a cluster whose hosts disagree, or that has no
//! host, reports none, and no VM is placed there ([`inventory::esx_architecture`]).
//!
//! # Disk transfer (`migration.strategy: CopyDisk`)
//!
//! [`Backend::disk_transfer`](banlieue_sdk::backend::Backend::disk_transfer) is the
//! backend itself, moving bytes through the datastore file interface
//! (`https://<vcenter>/folder/<path>?dcPath=&dsName=`) in the SOAP session, streamed,
//! with the Provider's TLS settings:
//!
//! - **export** of a powered-off VM (else a transient `MachineRunning`): each
//!   `VirtualDisk`'s flat extents into `<staging>/<name>.raw` (raw), the boot disk first
//!   as `os`; delta disks and non-flat extents are a terminal `DiskLayoutUnsupported`.
//! - **import** takes VMDKs made with `qemu-img convert -O vmdk`
//!   [`IMPORT_QEMU_IMG_OPTIONS`] (`-o subformat=monolithicFlat,adapter_type=lsilogic`):
//!   each flat extent is uploaded to `[<datastore>] banlieue/<uid>/<name>-flat.vmdk`
//!   beside an ESXi-native descriptor `<name>.vmdk`; other formats are a terminal
//!   `UnsupportedDiskFormat` that says how to convert.
//! - **create**: a request with `disks_imported` is created with `CreateVM_Task` on
//!   those files (hardware from the request, and the template's guest OS, firmware,
//!   hardware version and device types when the template exists), never cloned; a
//!   missing disk is a terminal `ImportedDiskMissing` naming it, and no VM is made.
//!   Configure and power follow as for a clone; guestinfo's `instance-id` is the
//!   request's ([`MachineRequest::instance_id`](banlieue_sdk::backend::MachineRequest::instance_id)).
//!
//! # Settings
//!
//! | key | value | default | meaning |
//! |---|---|---|---|
//! | `taskPollInterval` | `500ms`, `2s`, ... (at most 300s) | `1s` | how soon to look at a running task again |
//! | `shutdownTimeout` | duration, at most 86400s | `120s` | how long a guest shutdown may take before a power-off |
//! | `failedCloneBackoff` | duration, at most 3600s | `60s` | how long a failed clone is reported before it is tried again |
//! | `waitForAddress` | `true`/`false` | `true` | report `WaitingForAddress` until VMware Tools reports an IP |
//! | `datacenter` | name | the only one | the datacenter when neither machine nor failure domain names one |
//! | `maxConcurrentCreates` | whole number, `0` for no cap | `10` | machines cloned at once; the rest wait with `CreateQueued` (read by the operator) |
//!
//! Any other key (but the operator's `capabilities.*`) is refused: the Provider is
//! `Ready=False InvalidSettings`, naming it and the nearest known key. Not yet supported: content-library images, storage
//! policies (a terminal `StoragePolicyUnsupported`), adding network devices beyond
//! the template's (a machine asking for more networks than the template has network
//! devices is refused with `TooManyNetworkDevices` before anything is cloned), and
//! IPAM pools whose address is not allocated yet.
#![warn(missing_docs)]

mod backend;
pub mod client;
pub mod devices;
pub mod guestinfo;
pub mod inventory;
pub mod netconfig;
pub mod settings;
pub mod vmdk;

#[cfg(test)]
mod golden_tests;

use banlieue_sdk::api::common::ProviderClass;
use banlieue_sdk::api::resources::{ChangeMode, ChangeRule, MachineField};
use banlieue_sdk::backend::{BackendCapabilities, DiskTransferFormat, ImageSourceKind};

pub use backend::{IMPORT_QEMU_IMG_OPTIONS, VSphereBackend, VSphereFactory};

/// The `Provider.spec.class` this backend serves.
pub const CLASS: ProviderClass = ProviderClass::Vsphere;

/// What the vSphere backend does for real (published in the Provider's
/// `status.backendCapabilities`, and the book's capability matrix is generated from
/// it): BIOS, EFI and EFI with Secure Boot (`bootOptions.efiSecureBootEnabled`);
/// cloud-config and Ignition through `guestinfo`; powered on, off and suspended
/// (`SuspendVM_Task`, exercised against vcsim); images from templates (content-library
/// items are not supported yet); disks exported as VMDK (or raw) and imported as VMDK;
/// changes to a VM that exists as [`change_table`] says.
pub fn capabilities() -> BackendCapabilities {
    use banlieue_sdk::api::common::{BootstrapFormat as B, Firmware as F, PowerState as P};
    BackendCapabilities {
        changes: change_table(),
        firmware: vec![F::Bios, F::Efi, F::EfiSecure],
        bootstrap_formats: vec![B::CloudConfig, B::Ignition],
        power_states: vec![P::PoweredOn, P::PoweredOff, P::Suspended],
        image_sources: vec![ImageSourceKind::Template],
        disk_export: vec![DiskTransferFormat::Vmdk, DiskTransferFormat::Raw],
        disk_import: vec![DiskTransferFormat::Vmdk],
    }
}

/// The vSphere backend's change table: how a change reaches a VM that exists, as
/// implemented (one `ReconfigVM_Task`, returned `Pending` with its task) and shown on
/// vcsim by `tests/integration/tests/vsphere_changes.rs`. Not listed, so `Never`:
///
/// - data disks added or removed, and network devices added or removed: not
///   implemented yet (a new machine is needed);
/// - firmware: a guest installed for BIOS does not boot from EFI (nor back), so a made
///   machine keeps the firmware it was made with.
///
/// A device's MTU (`network[].mtu`) is no field of the table (no backend's is): it
/// reaches the guest only in the network config of `guestinfo.metadata`, written once
/// when the machine is configured and applied by cloud-init at the instance's first
/// boot, so a made machine keeps it (`Never`).
///
/// CPUs and memory grow `Live` on a VM made with hot-add (`cpuHotAddEnabled` /
/// `memoryHotAddEnabled`, which banlieue sets when the spec asks `maxCPUs` /
/// `maxMemoryMiB`), and only while powered off on one without: the table is one per
/// backend, and the difference between two VMs is in what each reports. A VM without
/// hot-add reports in `status.resources.running` a ceiling of what it has
/// (`maxCPUs` = its CPUs, `maxMemoryMiB` = its memory), so any raise is beyond it and
/// takes the row's `beyondMax`, `PowerOff` (vSphere has no configuration kept for the
/// next boot: a change it cannot take live waits for the VM to be off). A VM with
/// hot-add reports no ceiling of its own (vSphere's is the host's); the spec cannot
/// ask more than its own `maxCPUs`. They never shrink while the VM runs (`PowerOff`).
/// Cores per socket (the CPU topology) changes only while off, as on vSphere. The OS
/// disk and additional disks grow `Live` (vSphere extends a `VirtualDisk` on a
/// running VM); they never shrink (admission refuses it).
pub fn change_table() -> Vec<ChangeRule> {
    use ChangeMode::*;
    use MachineField as M;
    vec![
        ChangeRule::grow_shrink(M::Cpus, Live, PowerOff).with_beyond_max(PowerOff),
        ChangeRule::both(M::CoresPerSocket, PowerOff),
        ChangeRule::grow_shrink(M::MemoryMib, Live, PowerOff).with_beyond_max(PowerOff),
        ChangeRule::grow_shrink(M::OsDiskSize, Live, Never),
        ChangeRule::grow_shrink(M::DataDiskSize, Live, Never),
    ]
}

#[cfg(test)]
mod tests {
    #[test]
    fn serves_its_class() {
        assert_eq!(super::CLASS.as_str(), "vsphere");
    }
}
