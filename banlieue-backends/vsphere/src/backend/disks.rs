//! [`DiskTransfer`] for vSphere: a stopped VM's disks out as files, files in as the
//! disks of a VM about to be created, through the datastore file interface
//! ([`crate::client::files`]), streamed.
//!
//! # Import: `monolithicFlat`, uploaded as ESXi's own flat layout
//!
//! [`import`](DiskTransfer::import) takes VMDKs made by
//! `qemu-img convert -O vmdk -o subformat=monolithicFlat` (see [`IMPORT_QEMU_IMG_OPTIONS`]):
//! a small text descriptor `<name>.vmdk` naming one flat extent `<name>-flat.vmdk`
//! beside it, byte for byte the guest's disk. ESXi attaches flat disks as they are,
//! which is why: `monolithicSparse` (qemu-img's default) and `streamOptimized` are
//! hosted formats ESXi cannot run from (the latter only through an OVF/NFC import,
//! which converts), and vcsim takes any file. The flat extent is streamed to
//! `[<datastore>] banlieue/<uid>/<name>-flat.vmdk` and a descriptor in ESXi's native
//! spelling (`createType="vmfs"`, a `VMFS` extent; [`vmdk::vmfs_descriptor`]) is
//! written beside it as `<name>.vmdk`, last, so a descriptor on the datastore means
//! its data is whole. Re-importing overwrites both.
//!
//! The OS disk goes to the machine's `datastore` (else the template's); each
//! additional disk to its `storage`, else the OS disk's. A flat file takes its whole
//! virtual size on the datastore.
//!
//! # Export: flat extents out as raw
//!
//! [`export`](DiskTransfer::export) reads each `VirtualDisk`'s descriptor
//! (`[ds] dir/name.vmdk`) and streams its flat extents (`FLAT`/`VMFS`; `ZERO` ones are
//! holes) into one raw file, `<staging>/<name>.raw`: the guest's bytes, which
//! `qemu-img` reads as `raw`. An extent shorter than its descriptor says (vcsim's disks
//! are empty files) reads as zeros, as it does on ESXi. A disk that is one
//! self-contained sparse file (`KDMV`) is staged as it is, as `vmdk`. Delta disks
//! (linked clones, snapshots), sparse or raw-device extents are a terminal
//! `DiskLayoutUnsupported` naming the disk: consolidate or clone first.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use banlieue_sdk::api::common::PowerState;
use banlieue_sdk::api::infra::vsphere::VSphereMachineSpec;
use banlieue_sdk::async_trait;
use banlieue_sdk::backend::{
    BackendError, DiskFormat, DiskTransfer, MachineIdentity, MachineRequest, OS_DISK, StagedDisk,
};
use tokio::io::AsyncSeekExt;
use tracing::{debug, info};

use super::clone::Placement;
use super::vm::Vm;
use super::{VSphereBackend, check_uid, is_uuid, spec_of, vim};
use crate::client::methods;
use crate::client::{DatastorePath, MoRef, TransferError};
use crate::devices::{self, VirtualDisk};
use crate::inventory::Datacenter;
use crate::{guestinfo, inventory, vmdk};

/// The `qemu-img convert` options that make what [`DiskTransfer::import`] takes
/// (after `-O vmdk`): one flat extent beside a text descriptor, on a SCSI adapter.
pub const IMPORT_QEMU_IMG_OPTIONS: &[&str] =
    &["-o", "subformat=monolithicFlat,adapter_type=lsilogic"];

/// How much of a descriptor file is read: descriptors are a few hundred bytes, and
/// anything longer is not one.
pub(super) const DESCRIPTOR_HEAD: usize = 64 * 1024;

/// The directory on a datastore that holds a machine's imported disks and then the
/// VM's own files.
pub(super) fn import_dir(uid: &str) -> String {
    format!("banlieue/{uid}")
}

/// Where one disk of a machine on imported disks lives.
#[derive(Clone, Debug)]
pub(super) struct ImportedDisk {
    /// `os` or the additional disk's name.
    pub(super) name: String,
    /// Its datastore.
    pub(super) datastore_ref: MoRef,
    /// `[ds] banlieue/<uid>/<name>.vmdk`.
    pub(super) descriptor: DatastorePath,
    /// `[ds] banlieue/<uid>/<name>-flat.vmdk`.
    pub(super) flat: DatastorePath,
}

/// A disk name that is safe as a datastore and a local file name.
fn valid_disk_name(name: &str) -> Result<(), BackendError> {
    let ok = !name.is_empty()
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(BackendError::terminal(
            "InvalidDiskName",
            format!(
                "disk name {name} cannot be a file name on the datastore (letters, digits, '-', '_' and '.' only)"
            ),
        ))
    }
}

/// `name` with anything but letters, digits, `-`, `_` and `.` replaced: a local file
/// name for a disk named by whoever made the VM.
fn file_stem(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn local(path: &Path, error: std::io::Error) -> BackendError {
    TransferError::Local {
        path: path.to_path_buf(),
        error,
    }
    .into_backend()
}

fn remote(error: TransferError) -> BackendError {
    error.into_backend()
}

fn unsupported(name: &str, file: &DatastorePath, why: impl std::fmt::Display) -> BackendError {
    BackendError::terminal(
        "DiskLayoutUnsupported",
        format!("disk {name} ({file}) cannot be exported: {why}"),
    )
}

/// A staged VMDK, checked: its flat extent and the size it describes.
#[derive(Clone, Debug)]
struct StagedFlat {
    flat: PathBuf,
    capacity: u64,
}

/// Reads and checks a staged disk: a text descriptor with one flat extent at offset 0
/// beside it, exactly as long as it says.
async fn staged_flat(disk: &StagedDisk) -> Result<StagedFlat, BackendError> {
    let convert = "convert it with `qemu-img convert -O vmdk -o subformat=monolithicFlat`";
    let unsupported = |why: String| {
        BackendError::terminal(
            "UnsupportedDiskFormat",
            format!(
                "disk {} ({}) {why}; vSphere imports a flat VMDK: {convert}",
                disk.name,
                disk.path.display()
            ),
        )
    };
    if disk.format != DiskFormat::Vmdk {
        return Err(unsupported(format!("is {}", disk.format)));
    }
    let head = {
        use tokio::io::AsyncReadExt;
        let mut f = tokio::fs::File::open(&disk.path)
            .await
            .map_err(|e| local(&disk.path, e))?;
        let mut head = Vec::new();
        (&mut f)
            .take(DESCRIPTOR_HEAD as u64)
            .read_to_end(&mut head)
            .await
            .map_err(|e| local(&disk.path, e))?;
        head
    };
    if vmdk::is_sparse(&head) {
        return Err(unsupported(
            "is a single-file sparse VMDK (monolithicSparse or streamOptimized), which ESXi cannot attach".into(),
        ));
    }
    let descriptor = vmdk::parse(&String::from_utf8_lossy(&head)).map_err(unsupported)?;
    let [extent] = descriptor.extents.as_slice() else {
        return Err(unsupported(format!(
            "has {} extents ({}), not one",
            descriptor.extents.len(),
            descriptor.create_type
        )));
    };
    let file = match &extent.file {
        Some(f) if extent.is_flat() && extent.offset == 0 && !descriptor.has_parent() => f,
        _ => {
            return Err(unsupported(format!(
                "is {} with a {} extent",
                descriptor.create_type, extent.kind
            )));
        }
    };
    if file.contains('/') || file == ".." {
        return Err(unsupported(format!(
            "names its extent {file} outside its directory"
        )));
    }
    let capacity = descriptor.capacity();
    if capacity % 1024 != 0 {
        return Err(BackendError::terminal(
            "DiskSizeUnsupported",
            format!(
                "disk {} is {capacity} bytes: vSphere disks are whole KiB",
                disk.name
            ),
        ));
    }
    let flat = disk
        .path
        .parent()
        .unwrap_or_else(|| Path::new("."))
        .join(file);
    let len = tokio::fs::metadata(&flat)
        .await
        .map_err(|e| local(&flat, e))?
        .len();
    if len != capacity {
        return Err(unsupported(format!(
            "describes {capacity} bytes and its extent {} holds {len}",
            flat.display()
        )));
    }
    if capacity != disk.virtual_bytes {
        debug!(disk = %disk.name, capacity, staged = disk.virtual_bytes, "vsphere: the descriptor's size differs from the staged one; the descriptor wins");
    }
    Ok(StagedFlat { flat, capacity })
}

impl VSphereBackend {
    /// Where each disk of `request` goes, the OS disk first: the OS disk on the
    /// machine's datastore (else the template's), each additional disk on its
    /// `storage`, else the OS disk's. Shared by the import and the create, so both
    /// agree on every file.
    pub(super) async fn import_layout(
        &self,
        request: &MachineRequest,
        spec: &VSphereMachineSpec,
        place: &Placement,
    ) -> Result<Vec<ImportedDisk>, BackendError> {
        let uid = &request.identity.uid;
        let (os_name, os_ref) = match &place.datastore {
            Some(ds) => ds.clone(),
            None => self.template_datastore(spec, place).await?,
        };
        let dir = import_dir(uid);
        let disk = |name: &str, (ds, ds_ref): (String, MoRef)| ImportedDisk {
            name: name.to_string(),
            datastore_ref: ds_ref,
            descriptor: DatastorePath::new(&ds, format!("{dir}/{name}.vmdk")),
            flat: DatastorePath::new(&ds, format!("{dir}/{name}-flat.vmdk")),
        };
        let mut out = vec![disk(OS_DISK, (os_name.clone(), os_ref.clone()))];
        for extra in &spec.additional_disks {
            valid_disk_name(&extra.name)?;
            if extra.name == OS_DISK {
                return Err(BackendError::terminal(
                    "InvalidDiskName",
                    format!(
                        "an additional disk cannot be named {OS_DISK:?}: that is the boot disk"
                    ),
                ));
            }
            let ds = match &extra.storage {
                Some(s) => {
                    self.datastore(&place.cluster, &place.datacenter.name, s)
                        .await?
                }
                None => (os_name.clone(), os_ref.clone()),
            };
            out.push(disk(&extra.name, ds));
        }
        Ok(out)
    }

    /// The template's first datastore: where a clone would have put the OS disk.
    async fn template_datastore(
        &self,
        spec: &VSphereMachineSpec,
        place: &Placement,
    ) -> Result<(String, MoRef), BackendError> {
        let none = || {
            BackendError::terminal(
                "NoDatastore",
                format!(
                    "the machine names no datastore and its template {} is not there to tell where disks go; set datastore",
                    spec.template
                ),
            )
        };
        let template = self
            .resolve_template(&spec.template)
            .await?
            .ok_or_else(none)?;
        let ds = self
            .client
            .properties(&template, &["datastore"])
            .await
            .map_err(vim)?
            .and_then(|o| o.morefs("datastore").into_iter().next())
            .ok_or_else(none)?;
        if let Some((name, _)) = place.cluster.datastores.iter().find(|(_, r)| **r == ds) {
            return Ok((name.clone(), ds));
        }
        let name = self
            .client
            .properties(&ds, &["name"])
            .await
            .map_err(vim)?
            .and_then(|o| o.text("name").map(str::to_string))
            .ok_or_else(none)?;
        Ok((name, ds))
    }

    /// `MakeDirectory` (with parents) for `dir`; one that exists is fine.
    async fn make_directory(
        &self,
        dc: &Datacenter,
        dir: &DatastorePath,
    ) -> Result<(), BackendError> {
        let fm = self
            .client
            .content()
            .await
            .map_err(vim)?
            .file_manager
            .clone()
            .ok_or_else(|| {
                BackendError::terminal(
                    "NoFileManager",
                    "the vCenter's service content has no file manager",
                )
            })?;
        match self
            .client
            .call(&methods::make_directory(
                &fm,
                &dir.to_string(),
                &dc.moref,
                true,
            ))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.fault_kind() == Some("FileAlreadyExists") => Ok(()),
            Err(e) => Err(vim(e)),
        }
    }

    /// Every datastore has room for the disks going there (less what a previous,
    /// interrupted import left, which is overwritten), else a terminal `DatastoreFull`
    /// naming them.
    async fn check_room(
        &self,
        dc: &Datacenter,
        plan: &[(&ImportedDisk, StagedFlat)],
    ) -> Result<(), BackendError> {
        let mut needed: BTreeMap<&MoRef, (u64, Vec<&str>, &str)> = BTreeMap::new();
        for (target, staged) in plan {
            let there = self
                .client
                .datastore_file_size(&dc.path, &target.flat)
                .await
                .map_err(remote)?
                .unwrap_or_default();
            let entry = needed.entry(&target.datastore_ref).or_insert((
                0,
                Vec::new(),
                &target.flat.datastore,
            ));
            entry.0 += staged.capacity.saturating_sub(there);
            entry.1.push(&target.name);
        }
        for (ds, (bytes, names, ds_name)) in needed {
            let free: Option<u64> = self
                .client
                .properties(ds, &["summary.freeSpace"])
                .await
                .map_err(vim)?
                .and_then(|o| o.text("summary.freeSpace")?.trim().parse().ok());
            if let Some(free) = free
                && free < bytes
            {
                return Err(BackendError::terminal(
                    "DatastoreFull",
                    format!(
                        "disk(s) {} need {bytes} bytes on datastore {ds_name} and {free} are free",
                        names.join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The inventory path of the datacenter holding `vm`'s disks on `datastore`.
    async fn datacenter_path(
        &self,
        vm: &Vm,
        datastore: Option<&MoRef>,
    ) -> Result<String, BackendError> {
        let topology = self.topology(false).await?;
        if let Some(dc) = datastore.and_then(|ds| topology.datacenter_of_datastore(ds)) {
            return Ok(dc.path.clone());
        }
        let home = vm
            .extra
            .get(guestinfo::FAILURE_DOMAIN_KEY)
            .and_then(|fd| inventory::parse_failure_domain(fd))
            .and_then(|(dc, _)| topology.datacenters.get(dc));
        if let Some(dc) = home {
            return Ok(dc.path.clone());
        }
        match topology.datacenters.values().collect::<Vec<_>>().as_slice() {
            [only] => Ok(only.path.clone()),
            _ => Err(BackendError::terminal(
                "DatacenterNotFound",
                format!("no datacenter found for the disks of VM {}", vm.name),
            )),
        }
    }

    /// The VM's disks, the boot disk first, each with the name it is exported under:
    /// `os`; the name banlieue recorded for an additional disk; a disk imported by
    /// banlieue keeps its file's name; any other is `disk<n>`.
    async fn named_disks(&self, vm: &Vm) -> Result<Vec<(String, VirtualDisk)>, BackendError> {
        let o = self
            .client
            .properties(&vm.moref, &["config.hardware.device", "config.bootOptions"])
            .await
            .map_err(vim)?;
        let mut disks = o
            .as_ref()
            .and_then(|o| o.prop("config.hardware.device"))
            .map(|d| devices::virtual_disks(&devices::devices(d)))
            .unwrap_or_default();
        let boot_key = o
            .as_ref()
            .and_then(|o| o.prop("config.bootOptions"))
            .and_then(|b| {
                b.children_named("bootOrder")
                    .find(|e| {
                        e.xsi_type.as_deref() == Some("VirtualMachineBootOptionsBootableDiskDevice")
                    })
                    .and_then(|e| e.text_at(&["deviceKey"]))
                    .map(|k| k.trim().to_string())
            });
        let recorded = vm
            .extra
            .get(guestinfo::DISK_NAMES_KEY)
            .map(|v| guestinfo::parse_disk_names(v))
            .unwrap_or_default();
        // The boot order's disk, else the OS disk by its place (the device order
        // changes once a disk has grown).
        let boot = boot_key
            .and_then(|k| disks.iter().position(|d| d.key == k))
            .or_else(|| devices::os_disk_index(&disks, &recorded));
        if let Some(i) = boot {
            let boot = disks.remove(i);
            disks.insert(0, boot);
        }
        let mut taken = BTreeSet::new();
        let mut out = Vec::new();
        for (i, disk) in disks.into_iter().enumerate() {
            let imported = disk.file.as_ref().and_then(|f| {
                f.path
                    .starts_with("banlieue/")
                    .then(|| f.file_name().strip_suffix(".vmdk"))
                    .flatten()
                    .map(str::to_string)
            });
            let name = if i == 0 {
                OS_DISK.to_string()
            } else {
                recorded
                    .get(&disk.location)
                    .cloned()
                    .or(imported)
                    .filter(|n| !taken.contains(n))
                    .unwrap_or_else(|| format!("disk{i}"))
            };
            taken.insert(name.clone());
            out.push((name, disk));
        }
        Ok(out)
    }

    /// Stages one disk into `staging`.
    async fn stage(
        &self,
        dc: &str,
        name: &str,
        disk: &VirtualDisk,
        staging: &Path,
    ) -> Result<StagedDisk, BackendError> {
        let Some(file) = &disk.file else {
            return Err(BackendError::terminal(
                "DiskLayoutUnsupported",
                format!("disk {name} ({}) has no file to export", disk.backing_type),
            ));
        };
        if disk.backing_type != "VirtualDiskFlatVer2BackingInfo" {
            return Err(unsupported(
                name,
                file,
                format!("it is backed by {}", disk.backing_type),
            ));
        }
        if disk.has_parent {
            return Err(unsupported(
                name,
                file,
                "it is a delta disk on a parent (a linked clone or a snapshot); consolidate or full-clone it first",
            ));
        }
        let head = self
            .client
            .read_datastore_file_start(dc, file, DESCRIPTOR_HEAD)
            .await
            .map_err(remote)?
            .ok_or_else(|| {
                BackendError::terminal(
                    "DiskFileMissing",
                    format!("disk {name}: {file} is not on the datastore"),
                )
            })?;
        let stem = file_stem(name);
        if vmdk::is_sparse(&head) {
            // One self-contained sparse file: qemu-img reads it as it is.
            let path = staging.join(format!("{stem}.vmdk"));
            let mut out = create(&path).await?;
            let got = self
                .client
                .download_datastore_file(dc, file, &mut out, &path, u64::MAX)
                .await
                .map_err(remote)?
                .unwrap_or_default();
            out.set_len(got).await.map_err(|e| local(&path, e))?;
            return Ok(StagedDisk {
                name: name.to_string(),
                path,
                format: DiskFormat::Vmdk,
                virtual_bytes: vmdk::sparse_capacity(&head).unwrap_or(disk.capacity_bytes),
            });
        }
        let descriptor = vmdk::parse(&String::from_utf8_lossy(&head)).map_err(|e| {
            unsupported(
                name,
                file,
                format!("neither a descriptor nor a sparse VMDK ({e})"),
            )
        })?;
        if descriptor.has_parent() {
            return Err(unsupported(
                name,
                file,
                "it is a delta disk on a parent; consolidate or full-clone it first",
            ));
        }
        for e in &descriptor.extents {
            if !(e.is_flat() || e.kind == "ZERO") || e.offset != 0 {
                return Err(unsupported(
                    name,
                    file,
                    format!(
                        "{} with a {} extent{} (only flat extents are exported)",
                        descriptor.create_type,
                        e.kind,
                        if e.offset != 0 { " at an offset" } else { "" }
                    ),
                ));
            }
        }
        let path = staging.join(format!("{stem}.raw"));
        let mut out = create(&path).await?;
        let mut at: u64 = 0;
        for e in &descriptor.extents {
            if let (true, Some(extent)) = (e.is_flat(), &e.file) {
                let remote_file = file.sibling(extent);
                out.seek(std::io::SeekFrom::Start(at))
                    .await
                    .map_err(|e| local(&path, e))?;
                let got = self
                    .client
                    .download_datastore_file(dc, &remote_file, &mut out, &path, e.bytes())
                    .await
                    .map_err(remote)?
                    .ok_or_else(|| {
                        BackendError::terminal(
                            "DiskFileMissing",
                            format!("disk {name}: extent {remote_file} is not on the datastore"),
                        )
                    })?;
                if got < e.bytes() {
                    debug!(disk = name, extent = %remote_file, got, size = e.bytes(), "vsphere: extent shorter than described; the rest reads as zeros");
                }
            }
            at += e.bytes();
        }
        // Holes for skipped zeros and short extents: the file is the disk's size.
        out.set_len(at).await.map_err(|e| local(&path, e))?;
        out.sync_all().await.map_err(|e| local(&path, e))?;
        Ok(StagedDisk {
            name: name.to_string(),
            path,
            format: DiskFormat::Raw,
            virtual_bytes: at,
        })
    }
}

/// Creates (or truncates: a previous export's leftovers are overwritten) a staging file.
async fn create(path: &Path) -> Result<tokio::fs::File, BackendError> {
    tokio::fs::File::create(path)
        .await
        .map_err(|e| local(path, e))
}

#[async_trait]
impl DiskTransfer for VSphereBackend {
    /// VMDK, as `qemu-img convert -O vmdk -o subformat=monolithicFlat,adapter_type=lsilogic`
    /// writes it ([`IMPORT_QEMU_IMG_OPTIONS`]): a descriptor and one flat extent beside
    /// it. Other VMDK subformats are a terminal `UnsupportedDiskFormat`.
    fn import_format(&self) -> DiskFormat {
        DiskFormat::Vmdk
    }

    /// The sum of the VM's virtual disks' capacities (raw files of those sizes, sparse
    /// where the disk is).
    async fn export_size(&self, identity: &MachineIdentity) -> Result<Option<u64>, BackendError> {
        if !is_uuid(&identity.uid) {
            return Ok(None);
        }
        let Some(vm) = self.find(identity).await? else {
            return Ok(None);
        };
        let devices = self
            .client
            .properties(&vm.moref, &["config.hardware.device"])
            .await
            .map_err(vim)?
            .and_then(|o| o.prop("config.hardware.device").map(devices::devices))
            .unwrap_or_default();
        Ok(Some(
            devices::virtual_disks(&devices)
                .iter()
                .fold(0u64, |sum, d| sum.saturating_add(d.capacity_bytes)),
        ))
    }

    async fn export(
        &self,
        identity: &MachineIdentity,
        staging: &Path,
    ) -> Result<Vec<StagedDisk>, BackendError> {
        let vm = match is_uuid(&identity.uid) {
            true => self.find(identity).await?,
            false => None,
        }
        .ok_or_else(|| {
            BackendError::terminal(
                "MachineNotFound",
                format!(
                    "no VM of {}/{} on {} to export",
                    identity.namespace,
                    identity.name,
                    self.client.endpoint()
                ),
            )
        })?;
        if vm.power != PowerState::PoweredOff {
            return Err(BackendError::transient(
                "MachineRunning",
                format!(
                    "VM {} is {:?}: its disks are exported once it is powered off",
                    vm.name, vm.power
                ),
            ));
        }
        let disks = self.named_disks(&vm).await?;
        if disks.is_empty() {
            return Err(BackendError::terminal(
                "NoDisks",
                format!("VM {} has no virtual disk to export", vm.name),
            ));
        }
        let mut staged = Vec::with_capacity(disks.len());
        for (name, disk) in &disks {
            let dc = self.datacenter_path(&vm, disk.datastore.as_ref()).await?;
            let s = self.stage(&dc, name, disk, staging).await?;
            info!(uid = %identity.uid, vm = %vm.moref, disk = %name, file = ?disk.file, bytes = s.virtual_bytes, format = %s.format, "vsphere: disk exported");
            staged.push(s);
        }
        Ok(staged)
    }

    async fn import(
        &self,
        request: &MachineRequest,
        disks: &[StagedDisk],
    ) -> Result<(), BackendError> {
        let spec = spec_of(request)?;
        check_uid(&request.identity)?;
        let place = self.placement(request, spec).await?;
        let layout = self.import_layout(request, spec, &place).await?;
        let mut plan = Vec::with_capacity(disks.len());
        for disk in disks {
            let target = layout.iter().find(|l| l.name == disk.name).ok_or_else(|| {
                BackendError::terminal(
                    "UnknownDisk",
                    format!(
                        "disk {} is neither {OS_DISK:?} nor one of the machine's additionalDisks ({})",
                        disk.name,
                        layout[1..].iter().map(|l| l.name.as_str()).collect::<Vec<_>>().join(", ")
                    ),
                )
            })?;
            if plan
                .iter()
                .any(|(t, _): &(&ImportedDisk, StagedFlat)| t.name == disk.name)
            {
                return Err(BackendError::terminal(
                    "UnknownDisk",
                    format!("disk {} is staged twice", disk.name),
                ));
            }
            plan.push((target, staged_flat(disk).await?));
        }
        let missing: Vec<&str> = layout
            .iter()
            .filter(|l| !disks.iter().any(|d| d.name == l.name))
            .map(|l| l.name.as_str())
            .collect();
        if !missing.is_empty() {
            return Err(BackendError::terminal(
                "ImportedDiskMissing",
                format!(
                    "the machine has disk(s) {} that the copy did not bring",
                    missing.join(", ")
                ),
            ));
        }
        let dc = &place.datacenter;
        self.check_room(dc, &plan).await?;
        let dirs: BTreeSet<String> = plan
            .iter()
            .map(|(t, _)| t.descriptor.datastore.clone())
            .collect();
        for ds in dirs {
            self.make_directory(
                dc,
                &DatastorePath::new(ds, import_dir(&request.identity.uid)),
            )
            .await?;
        }
        for (target, staged) in &plan {
            let sent = self
                .client
                .upload_datastore_file(&dc.path, &target.flat, &staged.flat)
                .await
                .map_err(remote)?;
            // The descriptor last: on the datastore, it says the extent is whole.
            let descriptor = vmdk::vmfs_descriptor(target.flat.file_name(), staged.capacity);
            self.client
                .upload_datastore_bytes(&dc.path, &target.descriptor, descriptor.as_bytes())
                .await
                .map_err(remote)?;
            info!(uid = %request.identity.uid, disk = %target.name, file = %target.descriptor, bytes = sent, "vsphere: disk imported");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_names_must_be_file_names() {
        assert!(valid_disk_name("data-1.x").is_ok());
        for bad in ["", ".hidden", "a/b", "a b", "é"] {
            assert_eq!(valid_disk_name(bad).unwrap_err().reason, "InvalidDiskName");
        }
        assert_eq!(file_stem("a/b c"), "a_b_c");
    }

    async fn staged(dir: &Path, descriptor: &str, flat_len: u64) -> StagedDisk {
        let path = dir.join("os.vmdk");
        tokio::fs::write(&path, descriptor).await.unwrap();
        let flat = std::fs::File::create(dir.join("os-flat.vmdk")).unwrap();
        flat.set_len(flat_len).unwrap();
        StagedDisk {
            name: OS_DISK.into(),
            path,
            format: DiskFormat::Vmdk,
            virtual_bytes: 4 << 20,
        }
    }

    #[tokio::test]
    async fn a_monolithic_flat_vmdk_is_taken_and_others_are_refused_naming_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let flat = "# Disk DescriptorFile\ncreateType=\"monolithicFlat\"\nRW 8192 FLAT \"os-flat.vmdk\" 0\n";
        let ok = staged_flat(&staged(dir.path(), flat, 4 << 20).await)
            .await
            .unwrap();
        assert_eq!(ok.capacity, 4 << 20);
        assert_eq!(ok.flat, dir.path().join("os-flat.vmdk"));

        let short = staged_flat(&staged(dir.path(), flat, 1 << 20).await)
            .await
            .unwrap_err();
        assert_eq!(short.reason, "UnsupportedDiskFormat");

        let mut sparse = staged(dir.path(), "", 0).await;
        tokio::fs::write(&sparse.path, b"KDMV\x01\0\0\0")
            .await
            .unwrap();
        let e = staged_flat(&sparse).await.unwrap_err();
        assert_eq!(e.reason, "UnsupportedDiskFormat");
        assert!(!e.is_transient());
        assert!(e.message.contains("subformat=monolithicFlat"), "{e}");

        sparse.format = DiskFormat::Qcow2;
        assert_eq!(
            staged_flat(&sparse).await.unwrap_err().reason,
            "UnsupportedDiskFormat"
        );

        let two = "createType=\"twoGbMaxExtentFlat\"\nRW 4096 FLAT \"os-f001.vmdk\" 0\nRW 4096 FLAT \"os-f002.vmdk\" 0\n";
        let e = staged_flat(&staged(dir.path(), two, 4 << 20).await)
            .await
            .unwrap_err();
        assert!(e.message.contains("2 extents"), "{e}");
    }

    #[test]
    fn the_import_options_are_the_documented_ones() {
        assert_eq!(
            IMPORT_QEMU_IMG_OPTIONS.join(" "),
            "-o subformat=monolithicFlat,adapter_type=lsilogic"
        );
    }
}
