//! Cold disk transfer between backends, for `migration.strategy: CopyDisk`: a backend
//! that can hand its stopped machine's disks out as files, and take files in as the
//! disks of a machine it is about to create, implements [`DiskTransfer`] and returns
//! it from [`Backend::disk_transfer`](super::Backend::disk_transfer).
//!
//! The controller drives the move (stop the source, export, convert with `qemu-img`,
//! import, create, start, delete the source); a backend only moves bytes. Like every
//! backend call, both methods take plain values and never touch Kubernetes.

use std::path::{Path, PathBuf};

use async_trait::async_trait;

use super::{BackendError, MachineIdentity, MachineRequest};

/// An on-disk image format, as `qemu-img` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DiskFormat {
    /// A flat image, byte for byte the guest's disk.
    Raw,
    /// QEMU copy-on-write v2 (libvirt, Proxmox directory storage).
    Qcow2,
    /// VMware's format (vSphere datastores).
    Vmdk,
}

impl DiskFormat {
    /// The name `qemu-img -f/-O` takes, also a good file extension.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Raw => "raw",
            Self::Qcow2 => "qcow2",
            Self::Vmdk => "vmdk",
        }
    }
}

impl std::fmt::Display for DiskFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One disk as a file in the staging directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StagedDisk {
    /// The disk's name on the machine: `os` for the boot disk, else the
    /// `additionalDisks[].name` it was made for.
    pub name: String,
    /// The file, inside the staging directory the controller handed over.
    pub path: PathBuf,
    /// Its format (what `qemu-img` reads it as).
    pub format: DiskFormat,
    /// Its size as the guest sees it, in bytes.
    pub virtual_bytes: u64,
}

/// The `os` disk's name in [`StagedDisk::name`].
pub const OS_DISK: &str = "os";

/// Export and import of a machine's disks as files.
#[async_trait]
pub trait DiskTransfer: Send + Sync {
    /// The format [`import`](Self::import) takes; the controller converts to it.
    fn import_format(&self) -> DiskFormat;

    /// Bytes the export of `identity`'s disks will need in the staging directory
    /// (an upper bound: what the free-space check compares with). `Ok(None)` when
    /// the machine does not exist.
    async fn export_size(&self, identity: &MachineIdentity) -> Result<Option<u64>, BackendError>;

    /// Writes every disk of the **stopped** machine `identity` into `staging` (an
    /// existing directory the controller owns), the boot disk first, each as one
    /// self-contained file (no backing file outside `staging`). Overwrites what a
    /// previous, interrupted export left. A running machine is a transient
    /// `MachineRunning` error, never a copy of a live disk.
    async fn export(
        &self,
        identity: &MachineIdentity,
        staging: &Path,
    ) -> Result<Vec<StagedDisk>, BackendError>;

    /// Takes `disks` (in [`import_format`](Self::import_format), boot disk first) as
    /// the disks of the machine `request` describes, which does not exist yet: the
    /// next [`ensure`](super::Backend::ensure) of that request creates it **on these
    /// disks** (no image clone, no empty disk). Idempotent: an interrupted import is
    /// overwritten. The staged files are the importer's to take (it may move them
    /// instead of copying); the controller removes the staging directory after. A disk that does not fit where the request puts it is a terminal
    /// error that names it.
    async fn import(
        &self,
        request: &MachineRequest,
        disks: &[StagedDisk],
    ) -> Result<(), BackendError>;
}
