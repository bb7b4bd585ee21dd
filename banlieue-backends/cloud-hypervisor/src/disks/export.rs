//! Export: a stopped machine's disk files copied into the staging directory as flat,
//! sparse raw files (a qcow2 overlay read through the image it is backed by).

use std::path::{Path, PathBuf};

use banlieue_sdk::backend::{BackendError, DiskFormat, OS_DISK, StagedDisk};
use serde_json::Value;

use crate::qcow2;
use crate::qemu_img;
use crate::state::Record;

/// One of a machine's disk files, as its `VmConfig` names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskFile {
    /// [`StagedDisk::name`]: `os`, or the additional disk's name.
    pub name: String,
    /// The file.
    pub path: PathBuf,
    /// Its format.
    pub format: DiskFormat,
}

fn corrupt(record: &Record, what: &str) -> BackendError {
    BackendError::terminal(
        "CorruptState",
        format!("machine {}: its VmConfig {what}", record.uid),
    )
}

fn format_of(record: &Record, disk: &Value) -> Result<DiskFormat, BackendError> {
    match disk["image_type"].as_str() {
        Some("Qcow2") => Ok(DiskFormat::Qcow2),
        Some("Raw") | None => Ok(DiskFormat::Raw),
        Some(other) => Err(corrupt(record, &format!("has a disk of type {other}"))),
    }
}

/// The machine's disks, OS disk first, then additional disks in spec order; the
/// seed is not one.
pub fn disk_files(record: &Record) -> Result<Vec<DiskFile>, BackendError> {
    let disks = record.config["disks"]
        .as_array()
        .ok_or_else(|| corrupt(record, "has no disks"))?;
    let mut out = Vec::new();
    for disk in disks {
        let id = disk["id"].as_str().unwrap_or_default();
        let name = if id == "os" {
            OS_DISK.to_owned()
        } else if let Some(index) = id.strip_prefix("data") {
            data_name(record, index)?
        } else {
            continue;
        };
        let path = disk["path"]
            .as_str()
            .ok_or_else(|| corrupt(record, &format!("names no file for disk {id}")))?;
        out.push(DiskFile {
            name,
            path: PathBuf::from(path),
            format: format_of(record, disk)?,
        });
    }
    Ok(out)
}

fn data_name(record: &Record, index: &str) -> Result<String, BackendError> {
    let found = index
        .parse::<usize>()
        .ok()
        .and_then(|i| record.disk_names.get(i));
    found.cloned().ok_or_else(|| {
        BackendError::terminal(
            "DiskNamesUnknown",
            format!(
                "machine {} was created before banlieue recorded its additional disks' names: disk data{index} cannot be exported",
                record.uid
            ),
        )
    })
}

fn io(what: &str, path: &Path, e: std::io::Error) -> BackendError {
    BackendError::transient("HostIOError", format!("{what} {}: {e}", path.display()))
}

/// The size the guest sees of a disk file: what its raw copy will take at most.
pub fn virtual_size(file: &DiskFile) -> Result<u64, BackendError> {
    match file.format {
        DiskFormat::Qcow2 => qcow2::virtual_size(&file.path)
            .map_err(|e| io("reading", &file.path, e))?
            .ok_or_else(|| {
                BackendError::terminal(
                    "CorruptState",
                    format!("{} is not a qcow2 image", file.path.display()),
                )
            }),
        _ => Ok(std::fs::metadata(&file.path)
            .map_err(|e| io("reading", &file.path, e))?
            .len()),
    }
}

/// Copies one disk into `staging` as `<name>.raw`.
pub async fn stage(file: &DiskFile, staging: &Path) -> Result<StagedDisk, BackendError> {
    let path = staging.join(format!("{}.{}", file.name, DiskFormat::Raw));
    qemu_img::convert(&file.path, file.format, &path, DiskFormat::Raw).await?;
    let virtual_bytes = std::fs::metadata(&path)
        .map_err(|e| io("reading", &path, e))?
        .len();
    tracing::info!(disk = %file.name, path = %path.display(), "exported disk");
    Ok(StagedDisk {
        name: file.name.clone(),
        path,
        format: DiskFormat::Raw,
        virtual_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record(names: &[&str]) -> Record {
        Record {
            uid: "u".into(),
            config: json!({"disks": [
                {"id": "os", "path": "/s/u/disk.qcow2", "image_type": "Qcow2", "backing_files": true},
                {"id": "cidata", "path": "/s/u/seed.img", "readonly": true, "image_type": "Raw"},
                {"id": "data0", "path": "/s/u/data-0.raw", "image_type": "Raw"},
                {"id": "data1", "path": "/s/u/data-1.raw", "image_type": "Raw"},
            ]}),
            disk_names: names.iter().map(|n| (*n).to_owned()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn the_os_disk_then_named_additional_disks_never_the_seed() {
        let files = disk_files(&record(&["db", "logs"])).unwrap();
        let got: Vec<(&str, &str, DiskFormat)> = files
            .iter()
            .map(|f| (f.name.as_str(), f.path.to_str().unwrap(), f.format))
            .collect();
        assert_eq!(
            got,
            [
                ("os", "/s/u/disk.qcow2", DiskFormat::Qcow2),
                ("db", "/s/u/data-0.raw", DiskFormat::Raw),
                ("logs", "/s/u/data-1.raw", DiskFormat::Raw),
            ]
        );
        let err = disk_files(&record(&["db"])).unwrap_err();
        assert_eq!(err.reason, "DiskNamesUnknown");
        assert!(!err.is_transient());
    }
}
