//! Export: every disk of a shut-off domain downloaded over libvirt streams into the
//! staging directory, each as one flat qcow2 file (the OS overlay merged with the
//! image it is backed by). Blocking; called through [`crate::client::blocking`].

use std::path::{Path, PathBuf};

use banlieue_sdk::api::common::PowerState;
use banlieue_sdk::backend::{BackendError, DiskFormat, MachineIdentity, OS_DISK, StagedDisk};
use virt::connect::Connect;
use virt::domain::Domain;
use virt::storage_vol::StorageVol;

use super::chain::{self, Layer};
use crate::client::Client;
use crate::domain::{VolumeRef, os_volume_name, parse_defined, volume_prefix};
use crate::error::classify;
use crate::lookup::{check_uid, find, keyed, power_state, state};
use crate::{qemu_img, transfer, volumes};

/// The disks a domain's volumes are, by the names [`StagedDisk::name`] uses: the OS
/// disk first, then additional disks in the domain's order. The seed and volumes
/// banlieue did not name for `uid` are not the machine's disks.
pub fn disk_names(uid: &str, volumes: &[VolumeRef]) -> Vec<(String, VolumeRef)> {
    let os = os_volume_name(uid);
    let data_prefix = format!("{}disk-", volume_prefix(uid));
    let mut out: Vec<(String, VolumeRef)> = volumes
        .iter()
        .filter(|v| v.name == os)
        .map(|v| (OS_DISK.to_string(), v.clone()))
        .take(1)
        .collect();
    for v in volumes {
        if let Some(name) = v
            .name
            .strip_prefix(&data_prefix)
            .and_then(|n| n.strip_suffix(".qcow2"))
        {
            out.push((name.to_string(), v.clone()));
        }
    }
    out
}

/// The domain of `identity` (keyed as `ensure` keys it), or `None`.
fn domain(
    conn: &Connect,
    identity: &MachineIdentity,
) -> Result<Option<(Domain, String)>, BackendError> {
    let id = keyed(identity)?;
    if check_uid(&id.uid).is_err() {
        return Ok(None);
    }
    Ok(find(conn, &id.uid)?.map(|d| (d, id.uid)))
}

fn machine_disks(
    conn: &Connect,
    dom: &Domain,
    uid: &str,
) -> Result<Vec<(String, StorageVol)>, BackendError> {
    let xml = dom
        .xml_desc(0)
        .map_err(|e| classify("reading the domain's XML", &e))?;
    let defined = parse_defined(&xml).map_err(|e| BackendError::transient("LibvirtError", e))?;
    let mut out = Vec::new();
    for (name, at) in disk_names(uid, &defined.volumes) {
        let pool = volumes::pool(conn, &at.pool)?;
        let vol = volumes::lookup(&pool, &at.name)?.ok_or_else(|| {
            BackendError::terminal(
                "VolumeNotFound",
                format!(
                    "disk {name}: volume {} of pool {} is gone",
                    at.name, at.pool
                ),
            )
        })?;
        out.push((name, vol));
    }
    Ok(out)
}

fn stopped(dom: &Domain) -> Result<(), BackendError> {
    let now = state(dom)?;
    if power_state(now) == Some(PowerState::PoweredOff) {
        return Ok(());
    }
    Err(BackendError::transient(
        "MachineRunning",
        format!("the domain is {now}: its disks are only exported once it is shut off"),
    ))
}

fn capacity(vol: &StorageVol, what: &str) -> Result<u64, BackendError> {
    Ok(vol
        .info()
        .map_err(|e| classify(&format!("reading {what}'s size"), &e))?
        .capacity)
}

/// The bytes a download of `vol` writes: its file's length, not its allocation.
fn physical(vol: &StorageVol, what: &str) -> Result<u64, BackendError> {
    Ok(vol
        .info_flags(virt::sys::VIR_STORAGE_VOL_GET_PHYSICAL)
        .map_err(|e| classify(&format!("reading {what}'s file size"), &e))?
        .allocation)
}

/// A flat qcow2 file of `capacity` virtual bytes is at most this large: its data plus
/// L2 tables (8 bytes per 64 KiB cluster), refcounts and headers.
fn qcow2_bound(capacity: u64) -> u64 {
    capacity + capacity / 4096 + (4 << 20)
}

fn needs_flatten(layers: &[Layer]) -> bool {
    layers.len() > 1 || layers[0].format != DiskFormat::Qcow2
}

/// Bytes the export will write at most: a disk downloaded as it is takes its file's
/// length; one that is flattened takes every layer downloaded, plus the flat result.
pub fn export_size(
    client: &Client,
    identity: &MachineIdentity,
) -> Result<Option<u64>, BackendError> {
    let conn = client.conn()?;
    let Some((dom, uid)) = domain(&conn, identity)? else {
        return Ok(None);
    };
    let mut total = 0u64;
    for (name, vol) in machine_disks(&conn, &dom, &uid)? {
        let what = format!("disk {name}");
        let cap = capacity(&vol, &what)?;
        let layers = chain::chain(&conn, vol, &what)?;
        total += if needs_flatten(&layers) {
            let mut sum = qcow2_bound(cap);
            for layer in &layers {
                sum += physical(&layer.vol, &what)?;
            }
            sum
        } else {
            physical(&layers[0].vol, &what)?
        };
    }
    Ok(Some(total))
}

/// Downloads every disk of the shut-off machine into `staging`, OS disk first.
pub fn export(
    client: &Client,
    identity: &MachineIdentity,
    staging: &Path,
) -> Result<Vec<StagedDisk>, BackendError> {
    let conn = client.conn()?;
    let (dom, uid) = domain(&conn, identity)?.ok_or_else(|| {
        BackendError::terminal(
            "MachineNotFound",
            format!(
                "no domain is machine {}/{} (uid {})",
                identity.namespace, identity.name, identity.uid
            ),
        )
    })?;
    stopped(&dom)?;
    let mut staged = Vec::new();
    for (name, vol) in machine_disks(&conn, &dom, &uid)? {
        staged.push(stage(&conn, &name, vol, staging)?);
    }
    // Started while it was copied: the files may be torn.
    stopped(&dom)?;
    Ok(staged)
}

fn stage(
    conn: &Connect,
    name: &str,
    vol: StorageVol,
    staging: &Path,
) -> Result<StagedDisk, BackendError> {
    let what = format!("disk {name}");
    let virtual_bytes = capacity(&vol, &what)?;
    let path = staging.join(format!("{name}.{}", DiskFormat::Qcow2));
    let layers = chain::chain(conn, vol, &what)?;
    if needs_flatten(&layers) {
        flatten(conn, name, &layers, staging, &path)?;
    } else {
        download(conn, &layers[0].vol, &what, &path)?;
    }
    tracing::info!(disk = name, path = %path.display(), "exported libvirt volume");
    Ok(StagedDisk {
        name: name.to_string(),
        path,
        format: DiskFormat::Qcow2,
        virtual_bytes,
    })
}

fn download(conn: &Connect, vol: &StorageVol, what: &str, path: &Path) -> Result<(), BackendError> {
    let io = |doing: &str, e: std::io::Error| {
        BackendError::transient("StagingIOError", format!("{doing} {}: {e}", path.display()))
    };
    let mut file = std::fs::File::create(path).map_err(|e| io("creating", e))?;
    transfer::download(conn, vol, what, &mut file)?;
    // The source is deleted once the copy is imported: the bytes must be on disk.
    file.sync_all().map_err(|e| io("syncing", e))
}

/// Downloads each layer, points each at the downloaded one below it (`rebase -u`:
/// the bytes are already right, only the name changes), and converts the top into
/// one flat file at `out`. The layers are removed whatever happens.
fn flatten(
    conn: &Connect,
    name: &str,
    layers: &[Layer],
    staging: &Path,
    out: &Path,
) -> Result<(), BackendError> {
    let files: Vec<String> = layers
        .iter()
        .enumerate()
        .map(|(i, l)| format!("{name}.layer{i}.{}", l.format))
        .collect();
    let paths: Vec<PathBuf> = files.iter().map(|f| staging.join(f)).collect();
    let result = (|| {
        for (i, layer) in layers.iter().enumerate() {
            let what = format!("layer {i} of disk {name}");
            download(conn, &layer.vol, &what, &paths[i])?;
        }
        for i in 0..layers.len() - 1 {
            // Relative names resolve next to the overlay: the staging directory.
            let below = layers[i + 1].format;
            qemu_img::rebase_unsafe(&paths[i], layers[i].format, &files[i + 1], below)?;
        }
        qemu_img::convert(&paths[0], layers[0].format, out, DiskFormat::Qcow2)
    })();
    for path in &paths {
        let _ = std::fs::remove_file(path);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::data_volume_name;

    const UID: &str = "0b9e8a62-5d7c-4c51-9f0e-2a9f6c1d3e47";

    fn vol(name: &str) -> VolumeRef {
        VolumeRef {
            pool: "p".into(),
            name: name.into(),
        }
    }

    #[test]
    fn names_os_first_then_additional_disks_never_the_seed() {
        let volumes = [
            vol(&data_volume_name(UID, "logs")),
            vol(&os_volume_name(UID)),
            vol(&format!("bnl-{UID}-seed.img")),
            vol(&data_volume_name(UID, "db")),
            vol("guest.qcow2"),
            vol(&data_volume_name(
                "11111111-5d7c-4c51-9f0e-2a9f6c1d3e47",
                "x",
            )),
        ];
        let names: Vec<String> = disk_names(UID, &volumes)
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(names, ["os", "logs", "db"]);
    }

    #[test]
    fn the_bound_covers_qcow2_metadata() {
        // 1 TiB of data: 128 MiB of L2 tables, 32 MiB of refcounts at most.
        let tib = 1u64 << 40;
        assert!(qcow2_bound(tib) >= tib + (160 << 20));
        assert!(qcow2_bound(0) > 0);
    }
}
