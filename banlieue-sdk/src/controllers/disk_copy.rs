//! Copying a stopped machine's disks from one backend to another through a staging
//! directory: what `migration.strategy: CopyDisk` runs (ADR 0015), usable alone too
//! (a benchmark, a tool). No Kubernetes here: two [`DiskTransfer`]s and a directory.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::backend::{
    BackendError, DiskFormat, DiskTransfer, MachineIdentity, MachineRequest, StagedDisk,
};

/// Where a [`copy`] is: its phase and the bytes staged so far of the total.
#[derive(Debug, Default)]
pub struct Progress {
    phase: Mutex<&'static str>,
    done: AtomicU64,
    total: AtomicU64,
}

impl Progress {
    fn set_phase(&self, phase: &'static str) {
        *self.phase.lock().expect("copy phase") = phase;
    }

    /// `Exporting: 1.2 GiB of 2.0 GiB copied`, or the phase alone before sizes are known.
    pub fn describe(&self) -> String {
        let phase = *self.phase.lock().expect("copy phase");
        let (done, total) = (
            self.done.load(Ordering::Relaxed),
            self.total.load(Ordering::Relaxed),
        );
        if total == 0 {
            return if phase.is_empty() { "Starting" } else { phase }.to_owned();
        }
        format!("{phase}: {} of {} copied", bytes(done), bytes(total))
    }
}

/// `1.5 GiB`, `640 MiB`, for condition messages.
pub fn bytes(n: u64) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    let n = n as f64;
    if n >= 1024.0 * MIB {
        format!("{:.1} GiB", n / (1024.0 * MIB))
    } else {
        format!("{:.0} MiB", n / MIB)
    }
}

/// Copies the disks of the stopped machine `source` on `from` into the machine
/// `target` describes on `to`, through `dir` (created, emptied first; the caller
/// removes it): export, `qemu-img convert` to what `to` imports, import. Checks first
/// that `dir`'s volume has room for the export and its conversion. `progress` says
/// where it is, for a condition or a progress bar. Returns the disks as imported.
pub async fn copy(
    from: &dyn DiskTransfer,
    to: &dyn DiskTransfer,
    source: &MachineIdentity,
    target: &MachineRequest,
    dir: &Path,
    progress: &Progress,
) -> Result<Vec<StagedDisk>, BackendError> {
    progress.set_phase("Checking staging space");
    let total = from.export_size(source).await?.ok_or_else(|| {
        BackendError::terminal(
            "SourceMachineMissing",
            format!(
                "the source machine {} is not on its backend: nothing to copy",
                source.name
            ),
        )
    })?;
    let export = dir.join("export");
    let import = dir.join("import");
    fresh_dir(&export).await?;
    fresh_dir(&import).await?;
    // The export and its converted copy are on the same volume at the same time.
    let needed = total.saturating_mul(2);
    let free = free_bytes(dir)?;
    if free < needed {
        return Err(BackendError::terminal(
            "StagingSpaceLow",
            format!(
                "copying needs up to {} in {} (the export and its conversion); {} is free",
                bytes(needed),
                dir.display(),
                bytes(free)
            ),
        ));
    }
    progress.total.store(total, Ordering::Relaxed);
    progress.set_phase("Exporting");
    let staged = watched(&export, progress, from.export(source, &export)).await?;
    progress.set_phase("Converting");
    let wanted = to.import_format();
    let mut converted = Vec::with_capacity(staged.len());
    for disk in &staged {
        converted.push(convert(disk, wanted, &import).await?);
    }
    progress.set_phase("Importing");
    progress.done.store(total, Ordering::Relaxed);
    to.import(target, &converted).await?;
    Ok(converted)
}

/// Runs `work` while counting the bytes it writes under `dir` into the progress.
async fn watched<T>(
    dir: &Path,
    progress: &Progress,
    work: impl std::future::Future<Output = T>,
) -> T {
    let mut work = std::pin::pin!(work);
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            done = &mut work => return done,
            _ = tick.tick() => progress.done.store(size_of_dir(dir).await, Ordering::Relaxed),
        }
    }
}

async fn size_of_dir(dir: &Path) -> u64 {
    let mut sum = 0;
    if let Ok(mut entries) = tokio::fs::read_dir(dir).await {
        while let Ok(Some(entry)) = entries.next_entry().await {
            if let Ok(meta) = entry.metadata().await {
                sum += meta.len();
            }
        }
    }
    sum
}

async fn fresh_dir(dir: &Path) -> Result<(), BackendError> {
    match tokio::fs::remove_dir_all(dir).await {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(staging_error(dir, &e)),
    }
    tokio::fs::create_dir_all(dir)
        .await
        .map_err(|e| staging_error(dir, &e))
}

fn staging_error(dir: &Path, e: &std::io::Error) -> BackendError {
    BackendError::terminal(
        "StagingUnusable",
        format!("staging directory {}: {e}", dir.display()),
    )
}

fn free_bytes(dir: &Path) -> Result<u64, BackendError> {
    let stat = rustix::fs::statvfs(dir).map_err(|e| staging_error(dir, &e.into()))?;
    Ok(stat.f_bavail.saturating_mul(stat.f_frsize))
}

/// `disk` in `format`: itself when it already is, else a `qemu-img convert` of it
/// into `dir` (`qemu-img` from `PATH`).
pub async fn convert(
    disk: &StagedDisk,
    format: DiskFormat,
    dir: &Path,
) -> Result<StagedDisk, BackendError> {
    if disk.format == format {
        return Ok(disk.clone());
    }
    let path = dir.join(format!("{}.{format}", disk.name));
    let mut command = tokio::process::Command::new(qemu_img());
    command
        .arg("convert")
        .args(["-f", disk.format.as_str(), "-O", format.as_str()])
        .args(convert_options(format))
        .arg(&disk.path)
        .arg(&path);
    let output = command.output().await.map_err(|e| {
        BackendError::terminal(
            "QemuImgMissing",
            format!(
                "running {}: {e} (the image ships qemu-img; elsewhere install qemu-utils)",
                qemu_img().display()
            ),
        )
    })?;
    if !output.status.success() {
        return Err(BackendError::terminal(
            "ConversionFailed",
            format!(
                "qemu-img convert of disk {} from {} to {format}: {}",
                disk.name,
                disk.format,
                String::from_utf8_lossy(&output.stderr).trim()
            ),
        ));
    }
    Ok(StagedDisk {
        name: disk.name.clone(),
        path,
        format,
        virtual_bytes: disk.virtual_bytes,
    })
}

/// `qemu-img -O <format>` options: what each importer takes.
fn convert_options(format: DiskFormat) -> &'static [&'static str] {
    match format {
        // A descriptor and one flat extent (`<name>-flat.vmdk`): what ESXi attaches
        // as it is (sparse and stream-optimized VMDKs need an import); the vSphere
        // backend uploads the extent and writes its own descriptor.
        DiskFormat::Vmdk => &["-o", "subformat=monolithicFlat,adapter_type=lsilogic"],
        DiskFormat::Qcow2 | DiskFormat::Raw => &[],
    }
}

/// `qemu-img`, from `PATH` (the image puts it in `/usr/local/bin`; the backends run
/// it the same way).
fn qemu_img() -> PathBuf {
    PathBuf::from("qemu-img")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(bytes(0), "0 MiB");
        assert_eq!(bytes(640 * 1024 * 1024), "640 MiB");
        assert_eq!(bytes(3 * 1024 * 1024 * 1024 / 2), "1.5 GiB");
    }

    #[tokio::test]
    async fn a_disk_is_converted_only_when_the_target_needs_another_format() {
        let dir = tempfile::tempdir().unwrap();
        let raw = dir.path().join("os.raw");
        std::fs::write(&raw, vec![0xabu8; 1 << 20]).unwrap();
        let disk = StagedDisk {
            name: "os".into(),
            path: raw.clone(),
            format: DiskFormat::Raw,
            virtual_bytes: 1 << 20,
        };
        let same = convert(&disk, DiskFormat::Raw, dir.path()).await.unwrap();
        assert_eq!(same, disk, "no copy when the format already fits");
        // qemu-img is a real part of the product (the image ships it): a machine
        // without it fails here, loudly.
        let qcow2 = convert(&disk, DiskFormat::Qcow2, dir.path())
            .await
            .unwrap_or_else(|e| panic!("qemu-img must be installed (qemu-utils): {e}"));
        assert_eq!(qcow2.format, DiskFormat::Qcow2);
        let compared = std::process::Command::new(qemu_img())
            .args(["compare", "-f", "raw", "-F", "qcow2"])
            .arg(&raw)
            .arg(&qcow2.path)
            .status()
            .unwrap();
        assert!(compared.success(), "same content after conversion");
    }
}
