//! banlieue's backend for Cloud Hypervisor: one supervised `cloud-hypervisor` VMM
//! process per machine, driven over its REST API on a unix socket, behind
//! banlieue-sdk's [`Backend`](banlieue_sdk::backend::Backend) trait.
//!
//! # Where the VMMs run
//!
//! On the operator's own host (ADR 0007): a Cloud Hypervisor Provider is one host,
//! and the operator running there (a systemd service; or a pod with `/dev/kvm` whose
//! `binary` wrapper starts VMMs outside the pod, so they outlive it) starts and
//! supervises the VMMs itself. No agent sits in between; a remote host agent is future
//! work.
//!
//! # Connection
//!
//! `Provider.spec.connection.endpoint` names the **state directory**:
//! `local:///var/lib/banlieue/ch` (or `unix:///…`, or a bare absolute path). No
//! credentials are used. Each machine gets `<state dir>/<uid>/` (see [`state`]) with
//! its `state.json` (pid, intent, config, MACs), API socket, disk copy, NoCloud seed
//! and logs, so a restarted operator finds every VMM again by the pid and socket
//! recorded there.
//!
//! # Machines
//!
//! 1. **Prepare** (once, in `<uid>.partial`, renamed into place): a qcow2 image gets a
//!    qcow2 overlay backed by it ([`qcow2`], written in Rust, sized to `diskGiB`, opened
//!    with `backing_files`), a raw image is copied and grown to `diskGiB`; create
//!    additional disks (sparse raw),
//!    write a NoCloud seed (FAT, label `CIDATA`: `meta-data` with the request's
//!    instance ID (the UID, or the one a machine made on copied disks keeps),
//!    `user-data` from the bootstrap data, `network-config` from it or
//!    from IPAM), and the `VmConfig` ([`config`]): payload (kernel + cmdline, or
//!    firmware), CPUs, memory, disks, tap interfaces with stable MACs, RNG, serial to
//!    `serial.log`, the UID as SMBIOS UUID and OEM string.
//! 2. **Start** `cloud-hypervisor --api-socket path=<dir>/api.sock` (setting
//!    `binary`), wait for `vmm.ping`, then `vm.create` and `vm.boot`; taps with a
//!    `bridge` join it with `ip link`.
//! 3. **Observe** with `vm.info` (`Running` → on, `Paused` → suspended, else off); no
//!    live VMM → off. Addresses: static IPAM addresses, DHCP leases for the MACs from
//!    the `dhcpLeases` file, and the name as `Hostname`.
//! 4. **Power off**: `vm.power-button`, then `vm.shutdown` after `shutdownTimeout`.
//!    The real VMM exits when its guest powers off; either way the machine is off.
//!    **Power on**: a new VMM (or `vm.boot` on a live one). **Suspend**: `vm.pause`.
//! 5. **Delete**: `vm.delete`, `vmm.shutdown`, SIGTERM then SIGKILL if the process
//!    lingers, then the directory is removed.
//!
//! **Changes** to a machine that exists ([`changes`]): `cpus` live both ways with
//! `vm.resize` up to `maxCPUs` (the VM's `max_vcpus`); `memoryMiB` raised live with
//! `vm.resize` within `maxMemoryMiB` (the VM's `memory.hotplug_size` room, 128 MiB
//! steps), lowered at the next boot; data disks grown live with `vm.resize-disk`;
//! interfaces added or removed at the end live with `vm.add-net` and
//! `vm.remove-device`. A change beyond `max_vcpus` or the memory room, or of
//! `coresPerSocket` (the VM's `cpus.topology`, always set: `coresPerSocket` cores per
//! package, default 1, as many packages as hold `max_vcpus`), which CH cannot change
//! while the VM exists, is written to the record's `VmConfig` and taken at the next
//! power-on, which makes the VM anew from it. What runs is read back from
//! `vm.info` and the disk files; every other field is fixed when the machine is made.
//!
//! **Disk transfer** ([`disks`], `migration.strategy: CopyDisk`): export copies a
//! stopped machine's disk files into the staging directory as flat sparse raw files
//! (`qemu-img convert`); import copies raw files into `<uid>.imported`, and
//! `ensure` with `disks_imported` prepares the machine on them (the OS disk is then
//! `disk.raw`) instead of the image.
//! Errors: a machine not off → transient `MachineRunning`; an imported disk missing
//! → terminal `ImportedDiskMissing`; staged disks that do not match the spec →
//! terminal `DiskNotInSpec`, `DiskNotStaged`, `DuplicateDisk` or
//! `UnsupportedDiskFormat`; an import for a machine that exists → terminal
//! `MachineExists`; `qemu-img` missing → terminal `QemuImgNotFound`, failing →
//! transient `QemuImgFailed`.
//!
//! **Supervision.** A VMM that is gone while banlieue wanted it running is reported
//! as the transient error `VMMExited` (so the machine's `Ready` condition says so) for
//! `restartDelay`, then started again and the VM created and booted anew (its disk
//! persists). A VMM gone while the machine should be off is simply off. A VMM that
//! lives but does not answer is reported (`VMMUnreachable`) and, after `hangTimeout`,
//! killed (`VMMHung`) and so handled the same way.
//!
//! **Errors.** No answer on the socket → transient `VMMUnreachable`; 400 → terminal
//! `InvalidVMConfig`; 404/405/409 → transient `VMStateConflict`; boot 500 → terminal
//! `BootFailed` (a missing kernel or disk); an image path outside `imageDirectories`, or
//! a device node, FIFO or directory → terminal `PathNotAllowed`; other 5xx → transient `VMMError`; binary
//! missing → terminal `BinaryNotFound`; a VMM that exits at once → terminal
//! `VMMStartFailed` with its log's last lines; a VMM silent for `hangTimeout` →
//! transient `VMMHung` (killed); image disk missing → terminal `ImageNotFound`; neither
//! or both of kernel and firmware, or a qcow2 image that is not one → terminal
//! `InvalidImage`; Ignition bootstrap data → terminal `UnsupportedBootstrapFormat`; a
//! socket path over 107 bytes → terminal `StateDirTooLong`; an endpoint that is not a
//! local directory → terminal `UnsupportedEndpoint`; host file errors → transient
//! `HostIOError`; `ip link` failing → transient `BridgeAttachFailed`.
//!
//! Machine directories are `0700`: the seed holds bootstrap secrets.
//!
//! # Inventory
//!
//! `check` reports `Cloud Hypervisor <vmm.ping version>` (from a running VMM, else a
//! short-lived probe VMM; cached for 10 minutes) and one failure domain, the host
//! (setting `hostName`, default the kernel's host name) with labels
//! `topology.kubernetes.io/zone`, `kubernetes.io/hostname`, `banlieue.io/host-cpus`,
//! `banlieue.io/host-memory-mib`, location `host`, and resources `bridge` (the host's
//! Linux bridges), `network` = `tap` (an unbridged tap is always possible) and
//! `storage` = `local`. Network classes target `{bridge: br0}` or `{network: tap}`.
//! Its architecture is the host's, the one the operator runs on (the VMMs are its
//! children, and Cloud Hypervisor runs guests of its host's architecture only):
//! `amd64` on x86_64, `arm64` on aarch64, none elsewhere
//! ([`inventory::architecture`]).
//!
//! # Settings
//!
//! | key | value | default | meaning |
//! |---|---|---|---|
//! | `binary` | path | `cloud-hypervisor` (from `PATH`) | the VMM executable |
//! | `shutdownTimeout` | duration | `60s` | power button → `vm.shutdown` |
//! | `restartDelay` | duration | `5s` | how long a dead VMM is reported before restarting |
//! | `startTimeout` | duration | `10s` | how long a new VMM may take to answer |
//! | `pollInterval` | duration | `1s` | how soon to look again while powering off |
//! | `apiTimeout` | duration | `10s` | how long one API call may take |
//! | `hangTimeout` | duration | `60s` | a live VMM silent this long is killed (then restarted as a crash) |
//! | `hostName` | text | the host's name | the failure domain's name |
//! | `dhcpLeases` | path | none | dnsmasq lease file for DHCP addresses |
//! | `qcow2Disks` | `overlay` or `copy` | `overlay` | how a qcow2 image becomes a machine's disk |
//! | `maxConcurrentCreates` | whole number, `0` for no cap | `8` | machines created at once; the rest wait with `CreateQueued` (read by the operator) |
//! | `imageDirectories` | comma list of absolute directories | `<state dir>/images` | where an image's `disk`, `kernel` and `firmware` may be: each must resolve (symlinks, `..`) to a regular file inside one, else the machine is refused (`PathNotAllowed`) before anything is made ([`paths`]) |
//!
//! Not yet supported: CAPI IPAM pool addresses, Ignition bootstrap data, a remote host agent.
#![warn(missing_docs)]

pub mod addresses;
mod backend;
pub mod changes;
pub mod client;
pub mod config;
pub mod disks;
pub mod inventory;
pub mod paths;
pub mod prepare;
pub mod qcow2;
pub mod qemu_img;
pub mod seed;
pub mod settings;
pub mod state;
pub mod supervisor;

use banlieue_sdk::api::common::ProviderClass;
use banlieue_sdk::backend::{BackendCapabilities, DiskTransferFormat, ImageSourceKind};

pub use backend::{ChBackend, ChFactory, inspect};

/// The `Provider.spec.class` this backend serves.
pub const CLASS: ProviderClass = ProviderClass::CloudHypervisor;

/// What the Cloud Hypervisor backend does for real (published in the Provider's
/// `status.backendCapabilities`; the book's capability matrix is generated from it):
/// it boots what the image names (a kernel directly, or a firmware such as
/// `CLOUDHV.fd`), so a class's `bios` or `efi` changes nothing and both are accepted,
/// but Secure Boot is not available; cloud-config on a NoCloud seed (no Ignition);
/// powered on, off and suspended (paused, tested); disks exported and imported raw;
/// the changes a running machine takes are [`changes::change_table`]'s.
pub fn capabilities() -> BackendCapabilities {
    use banlieue_sdk::api::common::{BootstrapFormat as B, Firmware as F, PowerState as P};
    BackendCapabilities {
        changes: changes::change_table(),
        firmware: vec![F::Bios, F::Efi],
        bootstrap_formats: vec![B::CloudConfig],
        power_states: vec![P::PoweredOn, P::PoweredOff, P::Suspended],
        image_sources: vec![ImageSourceKind::Kernel, ImageSourceKind::Firmware],
        disk_export: vec![DiskTransferFormat::Raw],
        disk_import: vec![DiskTransferFormat::Raw],
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn serves_its_class() {
        assert_eq!(super::CLASS.as_str(), "cloud-hypervisor");
    }
}
