//! Import: staged raw files moved (or, across file systems, copied) into
//! `<uid>.importing`, renamed to
//! `<uid>.imported` once all are there; `prepare` then links them into the machine's
//! directory instead of copying the image ([`check`], [`link`]).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use banlieue_sdk::api::infra::cloud_hypervisor::CloudHypervisorMachineSpec;
use banlieue_sdk::backend::{BackendError, DiskFormat, OS_DISK, StagedDisk};

use crate::config::{OsDisk, data_disk_name, os_disk_name};
use crate::qemu_img;
use crate::state::VmDir;

fn io(what: &str, path: &Path, e: std::io::Error) -> BackendError {
    BackendError::transient("HostIOError", format!("{what} {}: {e}", path.display()))
}

/// The file each of a request's disks is in the machine's directory, by disk name:
/// the OS disk, then each additional disk in spec order.
pub fn targets(spec: &CloudHypervisorMachineSpec) -> Vec<(String, String)> {
    let os = (
        OS_DISK.to_owned(),
        os_disk_name(OsDisk::imported().format).to_owned(),
    );
    let data = spec
        .additional_disks
        .iter()
        .enumerate()
        .map(|(i, d)| (d.name.clone(), data_disk_name(i)));
    std::iter::once(os).chain(data).collect()
}

/// Pairs each staged disk with its file. Terminal errors name the disk: a wrong
/// format, a disk the spec has no place for, one given twice, one the spec needs
/// and that was not staged.
pub fn plan<'a>(
    targets: &[(String, String)],
    disks: &'a [StagedDisk],
) -> Result<Vec<(&'a StagedDisk, String)>, BackendError> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for disk in disks {
        if disk.format != DiskFormat::Raw {
            return Err(BackendError::terminal(
                "UnsupportedDiskFormat",
                format!(
                    "disk {} is {}; Cloud Hypervisor imports raw",
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
        let Some((_, file)) = targets.iter().find(|(name, _)| *name == disk.name) else {
            return Err(BackendError::terminal(
                "DiskNotInSpec",
                format!(
                    "disk {} has no place on the machine: its spec has no such additional disk",
                    disk.name
                ),
            ));
        };
        out.push((disk, file.clone()));
    }
    if let Some((name, _)) = targets.iter().find(|(n, _)| !seen.contains(n.as_str())) {
        return Err(BackendError::terminal(
            "DiskNotStaged",
            format!("the machine's disk {name} is not among the disks to import"),
        ));
    }
    Ok(out)
}

/// Copies `disks` into `dir`'s import directory, replacing what an interrupted
/// import left; the result only appears (renamed) once complete.
pub async fn write(
    dir: &VmDir,
    spec: &CloudHypervisorMachineSpec,
    disks: &[StagedDisk],
) -> Result<(), BackendError> {
    let plan = plan(&targets(spec), disks)?;
    let importing = dir.importing();
    remove_dir(&importing)?;
    std::fs::create_dir_all(&importing).map_err(|e| io("creating", &importing, e))?;
    // Disks hold whatever the guest wrote (keys, data): owner only, as the machine.
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&importing, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| io("restricting", &importing, e))?;
    }
    for (disk, file) in plan {
        let to = importing.join(&file);
        // The staged file is ours to take (see `DiskTransfer::import`): on the same
        // file system it is moved, not copied again (a full pass over the disk).
        match std::fs::rename(&disk.path, &to) {
            Ok(()) => {}
            // Across file systems (the staging volume is not the state directory's).
            Err(e) if e.kind() == std::io::ErrorKind::CrossesDevices => {
                qemu_img::convert(&disk.path, DiskFormat::Raw, &to, DiskFormat::Raw).await?;
            }
            Err(e) => return Err(io("moving the staged disk to", &to, e)),
        }
        tracing::info!(disk = %disk.name, file = %to.display(), "imported disk");
    }
    let imported = dir.imported();
    remove_dir(&imported)?;
    std::fs::rename(&importing, &imported).map_err(|e| io("renaming into place", &imported, e))
}

/// Removes a directory and what is in it; one already gone is fine.
pub fn remove_dir(path: &Path) -> Result<(), BackendError> {
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io("removing", path, e)),
        _ => Ok(()),
    }
}

/// The imported files `prepare` uses, by file name; one that is not there is a
/// terminal `ImportedDiskMissing` naming it (nothing is made from the image instead).
pub fn check(dir: &VmDir, spec: &CloudHypervisorMachineSpec) -> Result<Vec<PathBuf>, BackendError> {
    let imported = dir.imported();
    targets(spec)
        .into_iter()
        .map(|(name, file)| {
            let path = imported.join(&file);
            if path.is_file() {
                Ok(path)
            } else {
                Err(BackendError::terminal(
                    "ImportedDiskMissing",
                    format!(
                        "the imported disk {name} ({}) is not there; it is never made from the image instead",
                        path.display()
                    ),
                ))
            }
        })
        .collect()
}

/// Hard-links the imported files into `partial`: instant, and the imported copy
/// stays until the machine's directory is in place, so a crash mid-prepare loses
/// nothing.
pub fn link(files: &[PathBuf], partial: &Path) -> Result<(), BackendError> {
    for from in files {
        let Some(name) = from.file_name() else {
            continue;
        };
        let to = partial.join(name);
        std::fs::hard_link(from, &to).map_err(|e| io("linking the imported disk to", &to, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn staged(name: &str, format: DiskFormat) -> StagedDisk {
        StagedDisk {
            name: name.into(),
            path: PathBuf::from(format!("/s/{name}.raw")),
            format,
            virtual_bytes: 1 << 30,
        }
    }

    fn spec() -> CloudHypervisorMachineSpec {
        serde_json::from_value(serde_json::json!({
            "image": {"kernel": "/k", "disk": "/i.raw"},
            "cpus": 1, "memoryMiB": 128,
            "additionalDisks": [{"name": "db", "sizeGiB": 1}, {"name": "logs", "sizeGiB": 1}]
        }))
        .unwrap()
    }

    #[test]
    fn disks_go_where_the_vm_config_looks() {
        let t = targets(&spec());
        let pairs: Vec<(&str, &str)> = t.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        assert_eq!(
            pairs,
            [
                ("os", "disk.raw"),
                ("db", "data-0.raw"),
                ("logs", "data-1.raw")
            ]
        );
    }

    #[test]
    fn every_disk_has_exactly_one_place() {
        let t = targets(&spec());
        let all = [
            staged("os", DiskFormat::Raw),
            staged("logs", DiskFormat::Raw),
            staged("db", DiskFormat::Raw),
        ];
        let files: Vec<String> = plan(&t, &all)
            .unwrap()
            .into_iter()
            .map(|(_, f)| f)
            .collect();
        assert_eq!(files, ["disk.raw", "data-1.raw", "data-0.raw"]);
        let reason = |disks: &[StagedDisk]| {
            let e = plan(&t, disks).unwrap_err();
            assert!(!e.is_transient(), "{e}");
            e.reason
        };
        assert_eq!(reason(&all[..2]), "DiskNotStaged");
        assert_eq!(
            reason(&[staged("os", DiskFormat::Qcow2)]),
            "UnsupportedDiskFormat"
        );
        assert_eq!(reason(&[all[0].clone(), all[0].clone()]), "DuplicateDisk");
        assert_eq!(reason(&[staged("swap", DiskFormat::Raw)]), "DiskNotInSpec");
    }

    #[test]
    fn a_missing_import_is_terminal_and_named() {
        let root = tempfile::tempdir().unwrap();
        let dir = VmDir::new(root.path(), "u-1").unwrap();
        let err = check(&dir, &spec()).unwrap_err();
        assert_eq!(err.reason, "ImportedDiskMissing");
        assert!(
            !err.is_transient() && err.message.contains("disk os ("),
            "{err}"
        );
        std::fs::create_dir(dir.imported()).unwrap();
        for f in ["disk.raw", "data-0.raw", "data-1.raw"] {
            std::fs::write(dir.imported().join(f), b"x").unwrap();
        }
        let files = check(&dir, &spec()).unwrap();
        let partial = dir.partial();
        std::fs::create_dir(&partial).unwrap();
        link(&files, &partial).unwrap();
        assert_eq!(std::fs::read(partial.join("data-1.raw")).unwrap(), b"x");
    }
}
