//! banlieue's backend for libvirt hosts (QEMU/KVM domains), through the C libvirt via
//! the [`virt`] crate (see docs/adr/0006-libvirt-binding.md), behind banlieue-sdk's
//! [`Backend`](banlieue_sdk::backend::Backend) trait.
//!
//! # Connection
//!
//! `Provider.spec.connection.endpoint` is a libvirt URI with the `qemu` driver:
//! `qemu:///system` (a local daemon; `?socket=/path` picks its socket),
//! `qemu+ssh://user@host/system` (the credentials Secret's `sshPrivateKey`, optional
//! `knownHosts`) or `qemu+tls://host/system` (`tls.crt` and `tls.key`, with the
//! Provider's CA bundle). Key material is written to a private temporary directory
//! the URI points at (see [`uri`]), never logged. One connection per Provider, opened
//! on first use and reopened when libvirt reports it dead.
//!
//! # Settings (`Provider.spec.settings`)
//!
//! | key | default | meaning |
//! |---|---|---|
//! | `domainType` | `auto` | `kvm`, `qemu` (TCG), or `auto`: `kvm` when the host's capabilities offer it (and, for a local daemon, `/dev/kvm` is not PVM), else `qemu` |
//! | `machine` | libvirt's | QEMU machine type (`pc`, `q35`) |
//! | `shutdownTimeout` | `60s` | how long an ACPI shutdown may take before the domain is destroyed |
//! | `pollInterval` | `2s` | how soon to look again while a domain boots or stops |
//! | `failureDomain` | the host's hostname | the failure domain's name |
//! | `bridges` | none | host bridges offered (comma list), published as resource `bridge` |
//! | `waitForAddress` | `true` | a running domain on a libvirt network is not settled until it has an address |
//! | `maxConcurrentCreates` | `8` | machines created at once (`0`: no cap); the rest wait with `CreateQueued` (read by the operator) |
//! | `imageDirectories` | the host's active `dir`/`fs`/`netfs` pools' directories | where on the host an image may be (comma list of absolute directories): the image must be a `file` volume there, not a machine's own `bnl-` volume, and (local daemon) resolve to a regular file there, else the machine is refused (`PathNotAllowed`) before any volume is made ([`paths`]) |
//!
//! # Inventory
//!
//! `check` reports the host as one failure domain (its active storage pools as
//! resource `pool`, its networks as `network`, `kvm` as a feature when domains are
//! KVM ones) and its architecture from the host capabilities (`host/cpu/arch`):
//! `amd64` on an `x86_64` host. The domains this backend defines are x86_64 ones, so
//! a host of another architecture (`aarch64` included) reports none, and no VM is
//! placed there ([`inventory::guest_architecture`]).
//!
//! # Machines
//!
//! The domain's UUID is the infra object's UID and its `<metadata>` carries the UID,
//! namespace and name ([`domain`]); its name is `<namespace>.<name>`. `ensure`:
//!
//! 1. finds the domain by UUID; if there is none, creates the volumes (idempotently,
//!    by name): the OS disk `bnl-<uid>-os.qcow2`, a qcow2 overlay whose backing file is
//!    the image volume; additional disks `bnl-<uid>-disk-<name>.qcow2`; the NoCloud
//!    seed `bnl-<uid>-seed.img` ([`seed`]: a vfat volume labelled `cidata`, written in
//!    Rust and uploaded over a libvirt stream), then defines the domain;
//! 2. reconciles power: start, resume, ACPI shutdown (destroy after
//!    `shutdownTimeout`), suspend (not declared in [`capabilities`] until a test
//!    exercises it, so the operator refuses `Suspended` before asking); each returns
//!    `Pending` instead of waiting;
//! 3. observes: power state, addresses from the DHCP leases of libvirt networks (else
//!    the guest agent), and the machine's name as `Hostname`.
//!
//! The seed's `instance-id` is the request's
//! [`instance_id`](banlieue_sdk::backend::MachineRequest::instance_id): the UID, or the
//! one a machine made on copied disks keeps.
//!
//! **Disk transfer** ([`disks`], `migration.strategy: CopyDisk`): export downloads a
//! shut-off domain's volumes over libvirt streams, the OS overlay flattened with its
//! image into one qcow2 file by `qemu-img` on the operator's host; import uploads
//! qcow2 files as the new machine's volumes (no backing file), and `ensure` with
//! `disks_imported` defines the domain on them, never on a clone of the image.
//! Errors: a machine not off → transient `MachineRunning`; an imported disk missing
//! → terminal `ImportedDiskMissing`; staged disks that do not match the spec →
//! terminal `DiskNotInSpec`, `DiskNotStaged`, `DuplicateDisk` or
//! `UnsupportedDiskFormat`; an import for a machine that exists → terminal
//! `MachineExists`; `qemu-img` missing → terminal `QemuImgNotFound`, failing →
//! transient `QemuImgFailed`.
//!
//! **Changes to a domain that exists** ([`changes`]): every observation reads back what
//! the domain runs with (the live XML: `<vcpu current>` and its maximum, the CPU
//! topology, `<memory>` and `<maxMemory>`, interfaces; the volumes' sizes; the firmware
//! of the persistent definition) and, when it differs, what its next boot uses (the
//! persistent XML). `spec.maxCPUs` and `spec.maxMemoryMiB` give room to grow live
//! (`<vcpu current='cpus'>maxCPUs</vcpu>`, `<maxMemory slots='16'>` with one NUMA
//! cell); `spec.coresPerSocket` defines `<cpu><topology>` over the most vCPUs (a
//! maximum it does not divide is refused, `CpuTopologyMismatch`, before anything is
//! made). vCPUs and memory grow live within it (vCPU hot-plug, a DIMM), beyond it or
//! when shrinking they are written for the next boot, as is a new topology; OS and
//! data disks grow live (`virDomainBlockResize`); interfaces added at the end are
//! hot-plugged; firmware, disks added or removed and interfaces removed never change
//! (see [`changes::change_table`]).
//!
//! `delete` destroys and undefines the domain (with NVRAM, snapshot and checkpoint
//! metadata), then deletes every volume named `bnl-<uid>-*` in every active pool, so
//! volumes a crashed create left behind go too. The image is never touched.
//!
//! **Errors** ([`error`]): authentication and access → terminal `Unauthorized`; bad
//! XML/arguments → terminal `InvalidSpec`; missing pool, network, volume or image →
//! terminal `*NotFound`; an image outside `imageDirectories`, a block volume or a
//! machine's own volume → terminal `PathNotAllowed`; a domain name held by another UUID → terminal
//! `DomainNameTaken`; connection loss → transient `Unreachable`; timeouts and busy
//! resources → transient `Busy`; anything libvirt does not classify → transient.
#![warn(missing_docs)]

pub mod backend;
pub mod changes;
pub mod client;
pub mod disks;
pub mod domain;
pub mod error;
pub mod inventory;
mod lookup;
pub mod machine;
pub mod paths;
mod read_back;
mod reconfigure;
pub use banlieue_kit::qemu_img;
pub mod seed;
pub mod settings;
pub mod transfer;
pub mod uri;
pub mod volumes;
pub mod xml;

use banlieue_sdk::api::common::ProviderClass;
use banlieue_sdk::backend::{BackendCapabilities, DiskTransferFormat, ImageSourceKind};

pub use backend::{LibvirtBackend, LibvirtFactory};

/// The `Provider.spec.class` this backend serves.
pub const CLASS: ProviderClass = ProviderClass::Libvirt;

/// What the libvirt backend does for real (published in the Provider's
/// `status.backendCapabilities`; the book's capability matrix is generated from it):
/// BIOS, EFI, and EFI with Secure Boot (`<loader secure='yes'/>` on q35 with SMM: libvirt
/// picks an OVMF Secure Boot firmware from the host's descriptors); cloud-config on a
/// NoCloud seed (no Ignition); powered on or off (suspend is not exercised by a test,
/// so it is refused); images from pool volumes or host paths; disks exported and
/// imported as qcow2; the change table of [`changes::change_table`].
pub fn capabilities() -> BackendCapabilities {
    use banlieue_sdk::api::common::{BootstrapFormat as B, Firmware as F, PowerState as P};
    BackendCapabilities {
        changes: changes::change_table(),
        firmware: vec![F::Bios, F::Efi, F::EfiSecure],
        bootstrap_formats: vec![B::CloudConfig],
        power_states: vec![P::PoweredOn, P::PoweredOff],
        image_sources: vec![ImageSourceKind::Volume, ImageSourceKind::Path],
        disk_export: vec![DiskTransferFormat::Qcow2],
        disk_import: vec![DiskTransferFormat::Qcow2],
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn serves_its_class() {
        assert_eq!(super::CLASS.as_str(), "libvirt");
    }
}
