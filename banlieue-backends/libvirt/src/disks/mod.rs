//! [`DiskTransfer`] for libvirt (`migration.strategy: CopyDisk`): a shut-off domain's
//! volumes downloaded as flat qcow2 files ([`export`]), and staged qcow2 files
//! uploaded as a new machine's volumes ([`import`]), all through libvirt streams so a
//! remote libvirtd works the same as a local one.
//!
//! The OS disk is a qcow2 overlay on the image volume: its export downloads both,
//! rebases the overlay onto the downloaded image and converts the pair into one file
//! with `qemu-img` on the operator's host. Imported volumes have no backing file, and
//! `ensure` with [`MachineRequest::disks_imported`] defines the domain on them
//! ([`import::imported`]); a missing one is a terminal `ImportedDiskMissing`, never a
//! clone of the image.

pub mod chain;
pub mod export;
pub mod import;

use std::path::Path;

use banlieue_sdk::async_trait;
use banlieue_sdk::backend::{
    BackendError, DiskFormat, DiskTransfer, MachineIdentity, MachineRequest, StagedDisk,
};

use crate::backend::LibvirtBackend;
use crate::client::blocking;

pub use import::imported;

#[async_trait]
impl DiskTransfer for LibvirtBackend {
    fn import_format(&self) -> DiskFormat {
        DiskFormat::Qcow2
    }

    async fn export_size(&self, identity: &MachineIdentity) -> Result<Option<u64>, BackendError> {
        let identity = identity.clone();
        blocking(self.client(), move |c| export::export_size(c, &identity)).await
    }

    async fn export(
        &self,
        identity: &MachineIdentity,
        staging: &Path,
    ) -> Result<Vec<StagedDisk>, BackendError> {
        let identity = identity.clone();
        let staging = staging.to_owned();
        blocking(self.client(), move |c| {
            export::export(c, &identity, &staging)
        })
        .await
    }

    async fn import(
        &self,
        request: &MachineRequest,
        disks: &[StagedDisk],
    ) -> Result<(), BackendError> {
        let request = request.clone();
        let disks = disks.to_vec();
        blocking(self.client(), move |c| import::import(c, &request, &disks)).await
    }
}
