//! Import: staged qcow2 files uploaded over libvirt streams as the volumes a new
//! machine's `ensure` would otherwise have made from the image, and that `ensure`
//! (with `disks_imported`) defines the domain on instead. Blocking; called through
//! [`crate::client::blocking`].

use std::collections::BTreeSet;

use banlieue_sdk::api::infra::libvirt::LibvirtMachineSpec;
use banlieue_sdk::backend::{BackendError, DiskFormat, MachineRequest, OS_DISK, StagedDisk};
use virt::connect::Connect;

use crate::client::Client;
use crate::domain::{VolumeRef, data_volume_name, os_volume_name};
use crate::lookup::{check_uid, find, spec_of};
use crate::{transfer, volumes};

/// Where the create path puts a machine's disks, by disk name: the OS disk, then
/// each additional disk in spec order.
pub fn targets(uid: &str, spec: &LibvirtMachineSpec) -> Vec<(String, VolumeRef)> {
    let os = VolumeRef {
        pool: spec.storage_pool.clone(),
        name: os_volume_name(uid),
    };
    let data = spec.additional_disks.iter().map(|d| {
        let pool = d
            .storage
            .clone()
            .unwrap_or_else(|| spec.storage_pool.clone());
        let at = VolumeRef {
            pool,
            name: data_volume_name(uid, &d.name),
        };
        (d.name.clone(), at)
    });
    std::iter::once((OS_DISK.to_string(), os))
        .chain(data)
        .collect()
}

/// Pairs each staged disk with its volume. Terminal errors name the disk: a wrong
/// format, a disk the spec has no place for, one given twice, one the spec needs
/// and that was not staged.
pub fn plan<'a>(
    targets: &[(String, VolumeRef)],
    disks: &'a [StagedDisk],
) -> Result<Vec<(&'a StagedDisk, VolumeRef)>, BackendError> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for disk in disks {
        if disk.format != DiskFormat::Qcow2 {
            return Err(BackendError::terminal(
                "UnsupportedDiskFormat",
                format!(
                    "disk {} is {}; libvirt imports qcow2",
                    disk.name, disk.format
                ),
            ));
        }
        if !seen.insert(disk.name.as_str()) {
            return Err(BackendError::terminal(
                "DuplicateDisk",
                format!("disk {} is staged twice", disk.name),
            ));
        }
        let Some((_, at)) = targets.iter().find(|(name, _)| *name == disk.name) else {
            return Err(BackendError::terminal(
                "DiskNotInSpec",
                format!(
                    "disk {} has no place on the machine: its spec has no such additional disk",
                    disk.name
                ),
            ));
        };
        out.push((disk, at.clone()));
    }
    if let Some((name, _)) = targets.iter().find(|(n, _)| !seen.contains(n.as_str())) {
        return Err(BackendError::terminal(
            "DiskNotStaged",
            format!("the machine's disk {name} is not among the disks to import"),
        ));
    }
    Ok(out)
}

/// Uploads `disks` as the volumes of the machine `request` describes, replacing what
/// an interrupted import left. A machine that already has a domain is never touched.
pub fn import(
    client: &Client,
    request: &MachineRequest,
    disks: &[StagedDisk],
) -> Result<(), BackendError> {
    let spec = spec_of(request)?;
    let uid = &request.identity.uid;
    check_uid(uid)?;
    let conn = client.conn()?;
    if find(&conn, uid)?.is_some() {
        return Err(BackendError::terminal(
            "MachineExists",
            format!("a domain with UUID {uid} exists: disks are only imported for a new machine"),
        ));
    }
    for (disk, at) in plan(&targets(uid, spec), disks)? {
        put(&conn, disk, &at)?;
    }
    Ok(())
}

fn put(conn: &Connect, disk: &StagedDisk, at: &VolumeRef) -> Result<(), BackendError> {
    let io = |doing: &str, e: std::io::Error| {
        BackendError::transient(
            "StagingIOError",
            format!("{doing} {}: {e}", disk.path.display()),
        )
    };
    let file = std::fs::File::open(&disk.path).map_err(|e| io("opening", e))?;
    let len = file.metadata().map_err(|e| io("reading", e))?.len();
    let pool = volumes::pool(conn, &at.pool)?;
    let vol = volumes::recreate_qcow2(&pool, &at.name, disk.virtual_bytes)?;
    let what = format!("disk {} to volume {}", disk.name, at.name);
    transfer::upload(conn, &vol, &what, file, len)?;
    tracing::info!(disk = %disk.name, volume = %at.name, pool = %at.pool, "imported disk");
    Ok(())
}

/// The imported volumes `ensure` defines the domain on: the OS disk and the
/// additional disks. One that is not there is a terminal `ImportedDiskMissing`
/// naming it; nothing is made from the image instead.
pub fn imported(
    conn: &Connect,
    uid: &str,
    spec: &LibvirtMachineSpec,
) -> Result<(VolumeRef, Vec<VolumeRef>), BackendError> {
    let mut found = Vec::new();
    for (name, at) in targets(uid, spec) {
        let pool = volumes::pool(conn, &at.pool)?;
        // A volume uploaded through another connection may not be listed yet.
        let _ = pool.refresh(0);
        if volumes::lookup(&pool, &at.name)?.is_none() {
            return Err(BackendError::terminal(
                "ImportedDiskMissing",
                format!(
                    "the imported disk {name} (volume {} in pool {}) is not there; it is never made from the image instead",
                    at.name, at.pool
                ),
            ));
        }
        found.push(at);
    }
    let os = found.remove(0);
    Ok((os, found))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn staged(name: &str, format: DiskFormat) -> StagedDisk {
        StagedDisk {
            name: name.into(),
            path: PathBuf::from(format!("/s/{name}.qcow2")),
            format,
            virtual_bytes: 1 << 30,
        }
    }

    fn spec() -> LibvirtMachineSpec {
        serde_json::from_value(serde_json::json!({
            "image": {"volume": {"pool": "images", "name": "g.qcow2"}},
            "storagePool": "vms", "cpus": 1, "memoryMiB": 128,
            "additionalDisks": [{"name": "data", "sizeGiB": 1, "storage": "fast"}]
        }))
        .unwrap()
    }

    #[test]
    fn targets_are_the_create_paths_volumes() {
        let t = targets("u", &spec());
        assert_eq!(t[0].0, "os");
        assert_eq!(
            (t[0].1.pool.as_str(), t[0].1.name.as_str()),
            ("vms", "bnl-u-os.qcow2")
        );
        assert_eq!(t[1].0, "data");
        assert_eq!(
            (t[1].1.pool.as_str(), t[1].1.name.as_str()),
            ("fast", "bnl-u-disk-data.qcow2")
        );
    }

    #[test]
    fn every_disk_has_exactly_one_place() {
        let t = targets("u", &spec());
        let ok = [
            staged("os", DiskFormat::Qcow2),
            staged("data", DiskFormat::Qcow2),
        ];
        assert_eq!(plan(&t, &ok).unwrap().len(), 2);
        let reason = |disks: &[StagedDisk]| {
            let e = plan(&t, disks).unwrap_err();
            assert!(!e.is_transient(), "{e}");
            e.reason
        };
        assert_eq!(reason(&[staged("os", DiskFormat::Qcow2)]), "DiskNotStaged");
        assert_eq!(
            reason(&[
                staged("os", DiskFormat::Raw),
                staged("data", DiskFormat::Qcow2)
            ]),
            "UnsupportedDiskFormat"
        );
        assert_eq!(
            reason(&[
                staged("os", DiskFormat::Qcow2),
                staged("data", DiskFormat::Qcow2),
                staged("logs", DiskFormat::Qcow2)
            ]),
            "DiskNotInSpec"
        );
        assert_eq!(
            reason(&[
                staged("os", DiskFormat::Qcow2),
                staged("os", DiskFormat::Qcow2)
            ]),
            "DuplicateDisk"
        );
    }
}
