//! Making a machine's directory: the OS disk copied from the image (grown for raw
//! images), additional disks — or both linked from an import ([`crate::disks`]) —,
//! the NoCloud seed, the `VmConfig` and the record, all in `<uid>.partial`, renamed
//! into place at the end so a crash never leaves a half-made machine that looks
//! complete. And, after boot, taps joining bridges.

use std::path::Path;

use banlieue_sdk::api::common::{DiskProvisioning, PowerState};
use banlieue_sdk::api::infra::cloud_hypervisor::CloudHypervisorMachineSpec;
use banlieue_sdk::api::vm_image::DiskFormat;
use banlieue_sdk::backend::{BackendError, MachineRequest};
use tracing::info;

use crate::config::{self, OsDisk};
use crate::disks::import;
use crate::qcow2;
use crate::seed;
use crate::state::{self, Intent, Record, VmDir};

/// The host's one storage, as the inventory names it: the state directory.
pub(crate) const LOCAL_STORAGE: &str = "local";

fn io(what: &str, path: &Path, e: std::io::Error) -> BackendError {
    BackendError::transient("HostIOError", format!("{what} {}: {e}", path.display()))
}

/// Prepares the machine's directory and returns its record: its disks from the
/// image, or the imported ones when `request.disks_imported`.
pub async fn prepare(
    request: &MachineRequest,
    spec: &CloudHypervisorMachineSpec,
    dir: &VmDir,
    qcow2_overlay: bool,
) -> Result<Record, BackendError> {
    let identity = &request.identity;
    // Admission refuses any other storage; an object made before that rule is
    // refused here, before anything is written, rather than put elsewhere silently.
    if let Some(disk) = spec
        .additional_disks
        .iter()
        .find(|d| d.storage.as_deref().is_some_and(|s| s != LOCAL_STORAGE))
    {
        return Err(BackendError::terminal(
            "StorageUnsupported",
            format!(
                "additionalDisks {}: storage {:?}: Cloud Hypervisor keeps data disks in the machine's directory on the host's one storage, {LOCAL_STORAGE}",
                disk.name,
                disk.storage.as_deref().unwrap_or_default()
            ),
        ));
    }
    // A CPU topology CH would refuse at vm.create: refused before anything is written.
    config::cpus(spec)?;
    // Checked before anything is written: a missing disk leaves no trace.
    let imported = if request.disks_imported {
        Some(import::check(dir, spec)?)
    } else {
        image_disk(spec)?;
        None
    };
    let partial = dir.partial();
    if partial.exists() {
        // A crash mid-prepare: start over.
        tokio::fs::remove_dir_all(&partial)
            .await
            .map_err(|e| io("removing", &partial, e))?;
    }
    tokio::fs::create_dir_all(&partial)
        .await
        .map_err(|e| io("creating", &partial, e))?;
    // The seed holds bootstrap data (join tokens, keys): owner only.
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| io("restricting", &partial, e))?;
    }
    let os = match &imported {
        Some(files) => {
            import::link(files, &partial)?;
            grow_imported(spec, &partial)?;
            OsDisk::imported()
        }
        None => from_image(spec, &partial, qcow2_overlay).await?,
    };
    let macs: Vec<String> = spec
        .network
        .iter()
        .enumerate()
        .map(|(i, nic)| config::mac(&identity.uid, i, nic.mac_address.as_deref()))
        .collect();
    let files = seed::files(
        identity,
        request.instance_id(),
        request.bootstrap.as_ref(),
        &spec.network,
        &macs,
    )?;
    seed::write_image(&partial.join("seed.img"), &files)?;
    let vm_config = config::vm_config(&identity.uid, spec, dir.path(), &macs, os)?;
    let record = Record {
        uid: identity.uid.clone(),
        namespace: identity.namespace.clone(),
        name: identity.name.clone(),
        owner: None,
        pid: None,
        intent: if spec.power_state == PowerState::PoweredOff {
            Intent::Stop
        } else {
            Intent::Run
        },
        power_button_ms: None,
        exit: None,
        restarts: 0,
        config: vm_config,
        booted_memory: None,
        macs,
        interfaces: spec.network.clone(),
        disk_names: spec
            .additional_disks
            .iter()
            .map(|d| d.name.clone())
            .collect(),
    };
    state::save_in(&partial, &record)?;
    tokio::fs::rename(&partial, dir.path())
        .await
        .map_err(|e| io("renaming into place", dir.path(), e))?;
    // The machine's directory holds the disks now (the links); what is left over is
    // only space, and `delete` sweeps it.
    if imported.is_some()
        && let Err(e) = import::remove_dir(&dir.imported())
    {
        tracing::warn!(uid = %identity.uid, error = %e, "imported disks not cleaned up");
    }
    info!(uid = %identity.uid, dir = %dir.path().display(), "machine directory prepared");
    Ok(record)
}

/// The image's disk, which must be on the host.
fn image_disk(spec: &CloudHypervisorMachineSpec) -> Result<&Path, BackendError> {
    let source = Path::new(&spec.image.disk);
    if source.is_file() {
        Ok(source)
    } else {
        Err(BackendError::terminal(
            "ImageNotFound",
            format!("the image disk {} is not on the host", source.display()),
        ))
    }
}

/// The OS disk from the image (an overlay, or a copy grown to `diskGiB`) and empty
/// additional disks, in `partial`.
async fn from_image(
    spec: &CloudHypervisorMachineSpec,
    partial: &Path,
    qcow2_overlay: bool,
) -> Result<OsDisk, BackendError> {
    let source = image_disk(spec)?;
    let os = OsDisk::from_image(spec, qcow2_overlay);
    let os_disk = partial.join(config::os_disk_name(os.format));
    let want = spec.disk_gib.map_or(0, |gib| u64::from(gib) << 30);
    if os.overlay {
        // Instant, and sized to diskGiB; the image must stay unchanged while in use.
        qcow2::create_overlay(&os_disk, source, want).map_err(|e| {
            BackendError::terminal(
                "InvalidImage",
                format!("a qcow2 overlay on {}: {e}", source.display()),
            )
        })?;
    } else {
        tokio::fs::copy(source, &os_disk)
            .await
            .map_err(|e| io("copying the image to", &os_disk, e))?;
        if spec.image.format == DiskFormat::Raw && want > 0 {
            // The OS disk has no provisioning field: CH's copies are sparse (thin).
            grow(&os_disk, want, DiskProvisioning::Thin)?;
        }
    }
    for (i, disk) in spec.additional_disks.iter().enumerate() {
        let path = partial.join(config::data_disk_name(i));
        std::fs::File::create(&path).map_err(|e| io("creating", &path, e))?;
        grow(&path, u64::from(disk.size_gib) << 30, disk.provisioning)?;
    }
    Ok(os)
}

/// Imported disks grow to the sizes the spec asks for, as disks from the image do.
fn grow_imported(spec: &CloudHypervisorMachineSpec, partial: &Path) -> Result<(), BackendError> {
    let os = partial.join(config::os_disk_name(OsDisk::imported().format));
    grow(
        &os,
        spec.disk_gib.map_or(0, |gib| u64::from(gib) << 30),
        DiskProvisioning::Thin,
    )?;
    for (i, disk) in spec.additional_disks.iter().enumerate() {
        // What the import brought keeps its blocks; the part grown is provisioned
        // as the spec asks.
        grow(
            &partial.join(config::data_disk_name(i)),
            u64::from(disk.size_gib) << 30,
            disk.provisioning,
        )?;
    }
    Ok(())
}

/// Grows a raw disk to `bytes`, never shrinking it, and provisions the part grown:
/// `thin` leaves it a hole (sparse), `thick` allocates it (`fallocate`, which reads
/// as zeros), `eagerZeroed` writes zeros over it. Only for a disk no guest sees
/// (made, or grown while off): zeros written under a running guest would race its
/// writes — see [`allocate_grown`] for a disk grown live.
pub(crate) fn grow(
    path: &Path,
    bytes: u64,
    provisioning: DiskProvisioning,
) -> Result<(), BackendError> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| io("opening", path, e))?;
    let len = file.metadata().map_err(|e| io("reading", path, e))?.len();
    if bytes > len {
        file.set_len(bytes).map_err(|e| io("growing", path, e))?;
        provision(&file, len, bytes, provisioning).map_err(|e| io("provisioning", path, e))?;
    }
    Ok(())
}

/// Allocates `from..to` of a disk a running guest has just been shown larger
/// (`vm.resize-disk`), for `thick` and `eagerZeroed`. `fallocate` never changes
/// what the guest may already have written there, so it is safe live; writing
/// zeros is not, so a live-grown `eagerZeroed` range is allocated (reads as zeros)
/// but not zero-written — the same blocks, minus the first-write conversion cost.
pub(crate) fn allocate_grown(
    path: &Path,
    from: u64,
    to: u64,
    provisioning: DiskProvisioning,
) -> Result<(), BackendError> {
    if provisioning == DiskProvisioning::Thin || to <= from {
        return Ok(());
    }
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| io("opening", path, e))?;
    provision(&file, from, to, DiskProvisioning::Thick).map_err(|e| io("allocating", path, e))
}

/// Provisions `from..to` of `file` (already that long).
fn provision(
    file: &std::fs::File,
    from: u64,
    to: u64,
    provisioning: DiskProvisioning,
) -> std::io::Result<()> {
    match provisioning {
        DiskProvisioning::Thin => Ok(()),
        DiskProvisioning::Thick => {
            rustix::fs::fallocate(file, rustix::fs::FallocateFlags::empty(), from, to - from)
                .map_err(std::io::Error::from)
        }
        DiskProvisioning::EagerZeroed => {
            use std::os::unix::fs::FileExt;
            const CHUNK: u64 = 1 << 20;
            let zeros = vec![0u8; CHUNK as usize];
            let mut at = from;
            while at < to {
                let n = CHUNK.min(to - at);
                file.write_all_at(&zeros[..n as usize], at)?;
                at += n;
            }
            file.sync_data()
        }
    }
}

/// Puts each interface's tap into its bridge (`ip link set <tap> master <bridge> up`);
/// Cloud Hypervisor creates taps but does not bridge them.
pub async fn attach_bridges(
    uid: &str,
    spec: &CloudHypervisorMachineSpec,
) -> Result<(), BackendError> {
    for (i, nic) in spec.network.iter().enumerate() {
        let Some(bridge) = &nic.bridge else { continue };
        let tap = config::tap(uid, i);
        let out = tokio::process::Command::new("ip")
            .args(["link", "set", "dev", &tap, "master", bridge, "up"])
            .output()
            .await
            .map_err(|e| {
                BackendError::transient("BridgeAttachFailed", format!("running ip: {e}"))
            })?;
        if !out.status.success() {
            return Err(BackendError::transient(
                "BridgeAttachFailed",
                format!(
                    "ip link set dev {tap} master {bridge}: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            ));
        }
    }
    Ok(())
}
