//! [`DiskTransfer`] for Cloud Hypervisor (`migration.strategy: CopyDisk`). The disks
//! are host files in the machine's directory, so export and import are copies with
//! `qemu-img convert` (sparse, and flattening a qcow2 overlay through its image).
//!
//! The import format is **raw**: additional disks are raw files already, a raw
//! image's OS disk is one too, and Cloud Hypervisor opens a raw OS disk without
//! backing files, so an imported machine depends on nothing but its own directory.
//! An imported OS disk is `disk.raw` whatever the image's format.
//!
//! `ensure` with [`MachineRequest::disks_imported`] prepares the machine from
//! `<uid>.imported` ([`import::check`], [`import::link`]); a missing file is a
//! terminal `ImportedDiskMissing`, never a copy of the image.

pub mod export;
pub mod import;

use std::path::Path;

use banlieue_sdk::api::common::PowerState;
use banlieue_sdk::async_trait;
use banlieue_sdk::backend::{
    BackendError, DiskFormat, DiskTransfer, MachineIdentity, MachineRequest, StagedDisk,
};

use crate::backend::{ChBackend, lock, power_of, spec_of};
use crate::state::{Record, VmDir};
use crate::supervisor;

impl ChBackend {
    /// A machine whose VMM runs its VM (or answers nothing) is not copied: its disks
    /// may change under the copy.
    async fn stopped(&self, dir: &VmDir, record: &Record) -> Result<(), BackendError> {
        let alive = record
            .pid
            .is_some_and(|p| supervisor::alive(p, &dir.socket()));
        if !alive {
            return Ok(());
        }
        let info = self
            .client(dir)
            .info()
            .await
            .map_err(|e| e.into_backend("vm.info"))?;
        match power_of(info.as_ref().map(|i| i.state.as_str())) {
            PowerState::PoweredOff => Ok(()),
            power => Err(BackendError::transient(
                "MachineRunning",
                format!(
                    "machine {} is {power:?}: its disks are only exported once it is off",
                    record.uid
                ),
            )),
        }
    }
}

fn not_found(identity: &MachineIdentity) -> BackendError {
    BackendError::terminal(
        "MachineNotFound",
        format!(
            "no machine directory for {}/{} (uid {})",
            identity.namespace, identity.name, identity.uid
        ),
    )
}

#[async_trait]
impl DiskTransfer for ChBackend {
    fn import_format(&self) -> DiskFormat {
        DiskFormat::Raw
    }

    async fn export_size(&self, identity: &MachineIdentity) -> Result<Option<u64>, BackendError> {
        let dir = self.dir_of(identity)?;
        let Some(record) = dir.load()? else {
            return Ok(None);
        };
        let mut total = 0;
        for file in export::disk_files(&record)? {
            total += export::virtual_size(&file)?;
        }
        Ok(Some(total))
    }

    async fn export(
        &self,
        identity: &MachineIdentity,
        staging: &Path,
    ) -> Result<Vec<StagedDisk>, BackendError> {
        let dir = self.dir_of(identity)?;
        // Held through the copy: no ensure starts the VMM meanwhile.
        let _guard = lock(dir.path()).await;
        let record = dir.load()?.ok_or_else(|| not_found(identity))?;
        self.stopped(&dir, &record).await?;
        let mut staged = Vec::new();
        for file in export::disk_files(&record)? {
            staged.push(export::stage(&file, staging).await?);
        }
        Ok(staged)
    }

    async fn import(
        &self,
        request: &MachineRequest,
        disks: &[StagedDisk],
    ) -> Result<(), BackendError> {
        let spec = spec_of(request)?;
        let dir = self.dir_of(&request.identity)?;
        let _guard = lock(dir.path()).await;
        if dir.load()?.is_some() {
            return Err(BackendError::terminal(
                "MachineExists",
                format!(
                    "machine {} exists: disks are only imported for a new machine",
                    request.identity.uid
                ),
            ));
        }
        import::write(&dir, spec, disks).await
    }
}
