//! A machine created on imported disks (`CopyDisk`): `CreateVM_Task` with the
//! request's CPUs, memory, firmware and network devices, and the disks
//! [`DiskTransfer::import`](banlieue_sdk::backend::DiskTransfer::import) put on the
//! datastore, attached as they are. The template is never cloned: it is only read, when
//! it exists, for the virtual hardware the image expects (guest OS, firmware, hardware
//! version, SCSI controller and network device types). The configure and power steps
//! that follow are a clone's.

use banlieue_sdk::api::infra::vsphere::VSphereMachineSpec;
use banlieue_sdk::backend::{BackendError, MachineObservation, MachineRequest};
use tracing::info;

use super::clone::{Placement, annotation, firmware, hot_add, no_storage_policy, secure_boot};
use super::disks::{DESCRIPTOR_HEAD, ImportedDisk};
use super::{OpKind, VSphereBackend, vim};
use crate::client::methods::{self, ConfigSpec};
use crate::devices::{self, ExistingDisk, WantedNic};
use crate::{guestinfo, vmdk};

/// The guest OS a machine on imported disks declares when its template does not say.
const DEFAULT_GUEST_ID: &str = "otherLinux64Guest";

/// The virtual hardware of a machine created on imported disks.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Hardware {
    guest_id: String,
    firmware: Option<String>,
    version: Option<String>,
    controller: String,
    nic: String,
}

impl Default for Hardware {
    fn default() -> Self {
        Self {
            guest_id: DEFAULT_GUEST_ID.into(),
            firmware: None,
            version: None,
            controller: devices::DEFAULT_SCSI_CONTROLLER.into(),
            nic: devices::DEFAULT_NIC.into(),
        }
    }
}

impl VSphereBackend {
    pub(super) async fn start_create(
        &self,
        request: &MachineRequest,
        spec: &VSphereMachineSpec,
    ) -> Result<MachineObservation, BackendError> {
        let identity = &request.identity;
        no_storage_policy(spec)?;
        let place = self.placement(request, spec).await?;
        let layout = self.import_layout(request, spec, &place).await?;
        let disks = self.imported_disks(&place, &layout).await?;
        let hardware = self.template_hardware(spec).await?;
        let mut nics = Vec::new();
        for nic in &spec.network {
            nics.push(WantedNic {
                backing: self
                    .network_backing(Some(&place.failure_domain), &nic.network_name)
                    .await?,
                mac_address: nic.mac_address.clone(),
            });
        }
        let fd = place.failure_domain.clone();
        // The .vmx beside the boot disk: the VM's directory is the import's, and
        // deleting the VM deletes it all.
        let vmx = layout[0]
            .descriptor
            .sibling(&format!("{}.vmx", identity.name));
        let config = ConfigSpec {
            name: Some(identity.name.clone()),
            version: hardware.version,
            instance_uuid: Some(identity.uid.clone()),
            guest_id: Some(hardware.guest_id),
            annotation: Some(annotation(identity)),
            vm_path_name: Some(vmx.to_string()),
            num_cpus: Some(spec.num_cpus),
            num_cores_per_socket: spec.num_cores_per_socket,
            memory_mib: Some(spec.memory_mib),
            cpu_hot_add: Some(hot_add(spec).0),
            memory_hot_add: Some(hot_add(spec).1),
            device_change: devices::create_devices(
                &hardware.controller,
                &disks,
                &hardware.nic,
                &nics,
            )?,
            extra_config: guestinfo::clone_keys(identity, &fd),
            firmware: spec.firmware.map(firmware).or(hardware.firmware),
            efi_secure_boot: spec.firmware.and_then(secure_boot),
        };
        let task = self
            .start(
                &identity.uid,
                OpKind::Create,
                &methods::create_vm_task(&place.folder, &config, &place.pool),
            )
            .await?;
        info!(uid = %identity.uid, vmx = %vmx, disks = disks.len(), failure_domain = %fd, "vsphere: creating on imported disks");
        Ok(MachineObservation {
            failure_domain: Some(fd),
            pending: Some(self.pending(&identity.uid, OpKind::Create, Some(&task))),
            ..Default::default()
        })
    }

    /// The imported disks, checked on the datastore: each descriptor there and
    /// readable, its flat extent there and whole. Whatever is missing is one terminal
    /// `ImportedDiskMissing` naming it all; nothing is ever cloned in its place.
    async fn imported_disks(
        &self,
        place: &Placement,
        layout: &[ImportedDisk],
    ) -> Result<Vec<ExistingDisk>, BackendError> {
        let dc = &place.datacenter.path;
        let mut missing = Vec::new();
        let mut out = Vec::new();
        for disk in layout {
            let Some(head) = self
                .client
                .read_datastore_file_start(dc, &disk.descriptor, DESCRIPTOR_HEAD)
                .await
                .map_err(|e| e.into_backend())?
            else {
                missing.push(format!("disk {} ({})", disk.name, disk.descriptor));
                continue;
            };
            let descriptor = vmdk::parse(&String::from_utf8_lossy(&head)).map_err(|e| {
                BackendError::terminal(
                    "ImportedDiskUnreadable",
                    format!("disk {}: {}: {e}", disk.name, disk.descriptor),
                )
            })?;
            let capacity = descriptor.capacity();
            match self
                .client
                .datastore_file_size(dc, &disk.flat)
                .await
                .map_err(|e| e.into_backend())?
            {
                None => missing.push(format!("disk {} ({})", disk.name, disk.flat)),
                Some(have) if have < capacity => missing.push(format!(
                    "disk {} ({} holds {have} of {capacity} bytes: the upload did not finish)",
                    disk.name, disk.flat
                )),
                Some(_) => out.push(ExistingDisk {
                    file: disk.descriptor.clone(),
                    datastore: Some(disk.datastore_ref.clone()),
                    capacity_bytes: capacity,
                }),
            }
        }
        if !missing.is_empty() {
            return Err(BackendError::terminal(
                "ImportedDiskMissing",
                format!(
                    "the machine is to be created on imported disks, and {} is not on the datastore; the template is never cloned in their place",
                    missing.join(", ")
                ),
            ));
        }
        Ok(out)
    }

    /// The template's guest OS, firmware, hardware version and device types, when the
    /// template exists (the image was made for them); defaults otherwise.
    async fn template_hardware(&self, spec: &VSphereMachineSpec) -> Result<Hardware, BackendError> {
        let mut hardware = Hardware::default();
        let Some(template) = self.resolve_template(&spec.template).await? else {
            return Ok(hardware);
        };
        let Some(o) = self
            .client
            .properties(
                &template,
                &[
                    "config.guestId",
                    "config.firmware",
                    "config.version",
                    "config.hardware.device",
                ],
            )
            .await
            .map_err(vim)?
        else {
            return Ok(hardware);
        };
        let text = |path: &str| {
            o.text(path)
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(str::to_string)
        };
        if let Some(g) = text("config.guestId") {
            hardware.guest_id = g;
        }
        hardware.firmware = text("config.firmware");
        hardware.version = text("config.version");
        let template_devices = o
            .prop("config.hardware.device")
            .map(devices::devices)
            .unwrap_or_default();
        if let Some(c) = devices::scsi_controller_type(&template_devices) {
            hardware.controller = c;
        }
        if let Some(n) = devices::nic_type(&template_devices) {
            hardware.nic = n;
        }
        Ok(hardware)
    }
}
