//! The background copy of one VM's disks: export from the source backend into the
//! staging directory, convert with `qemu-img` to what the target imports, import.
//! It runs beside the reconciles (a copy takes minutes; a reconcile must not), which
//! poll it; a job lost with its process is started again from its first step (every
//! step overwrites what an interrupted one left).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::plan::Job;
use crate::backend::{BackendError, DiskFormat, MachineIdentity, MachineRequest, StagedDisk};
use crate::controllers::backends::Instrumented;

/// What a job needs: both backends, who to copy, what to create.
pub(crate) struct Input {
    pub source: Instrumented,
    pub target: Instrumented,
    pub source_identity: MachineIdentity,
    pub target_request: MachineRequest,
    /// This VM's directory under the staging root (removed when the job ends).
    pub dir: PathBuf,
}

/// The running and finished jobs, by VM UID.
#[derive(Default)]
pub(crate) struct Jobs {
    jobs: Mutex<HashMap<String, Arc<Progress>>>,
}

/// One job's progress, shared with its task.
#[derive(Default)]
struct Progress {
    phase: Mutex<&'static str>,
    done: AtomicU64,
    total: AtomicU64,
    outcome: Mutex<Option<Result<(), BackendError>>>,
}

impl Jobs {
    /// Where the job of `vm` is.
    pub fn state(&self, vm: &str) -> Job {
        let jobs = self.jobs.lock().expect("copy jobs");
        let Some(progress) = jobs.get(vm) else {
            return Job::NotRunning;
        };
        match &*progress.outcome.lock().expect("copy outcome") {
            None => Job::Running(progress.describe()),
            Some(Ok(())) => Job::Succeeded,
            Some(Err(e)) => Job::Failed(e.to_string()),
        }
    }

    /// Starts the job of `vm` unless one runs or has finished unread.
    pub fn start(&self, vm: &str, input: Input) {
        let mut jobs = self.jobs.lock().expect("copy jobs");
        if jobs.contains_key(vm) {
            return;
        }
        let progress = Arc::new(Progress::default());
        jobs.insert(vm.to_owned(), progress.clone());
        tokio::spawn(async move {
            let outcome = run(&input, &progress).await;
            if let Err(e) = tokio::fs::remove_dir_all(&input.dir).await
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(dir = %input.dir.display(), error = %e, "staging not cleaned up");
            }
            *progress.outcome.lock().expect("copy outcome") = Some(outcome);
        });
    }

    /// Forgets a finished job once its outcome is acted on.
    pub fn forget(&self, vm: &str) {
        self.jobs.lock().expect("copy jobs").remove(vm);
    }
}

impl Progress {
    fn set_phase(&self, phase: &'static str) {
        *self.phase.lock().expect("copy phase") = phase;
    }

    fn describe(&self) -> String {
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
pub(crate) fn bytes(n: u64) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    let n = n as f64;
    if n >= 1024.0 * MIB {
        format!("{:.1} GiB", n / (1024.0 * MIB))
    } else {
        format!("{:.0} MiB", n / MIB)
    }
}

async fn run(input: &Input, progress: &Progress) -> Result<(), BackendError> {
    let (Some(from), Some(to)) = (input.source.disk_transfer(), input.target.disk_transfer())
    else {
        return Err(BackendError::terminal(
            "CopyDiskUnsupported",
            "a backend of this move has no disk export or import",
        ));
    };
    progress.set_phase("Checking staging space");
    let total = from
        .export_size(&input.source_identity)
        .await?
        .ok_or_else(|| {
            BackendError::terminal(
                "SourceMachineMissing",
                format!(
                    "the source machine {} is not on its backend: nothing to copy",
                    input.source_identity.name
                ),
            )
        })?;
    let export = input.dir.join("export");
    let import = input.dir.join("import");
    fresh_dir(&export).await?;
    fresh_dir(&import).await?;
    // The export and its converted copy are on the same volume at the same time.
    let needed = total.saturating_mul(2);
    let free = free_bytes(&input.dir)?;
    if free < needed {
        return Err(BackendError::terminal(
            "StagingSpaceLow",
            format!(
                "copying needs up to {} in {} (the export and its conversion); {} is free",
                bytes(needed),
                input.dir.display(),
                bytes(free)
            ),
        ));
    }
    progress.total.store(total, Ordering::Relaxed);
    progress.set_phase("Exporting");
    let staged = watched(
        &export,
        progress,
        from.export(&input.source_identity, &export),
    )
    .await?;
    progress.set_phase("Converting");
    let wanted = to.import_format();
    let mut converted = Vec::with_capacity(staged.len());
    for disk in &staged {
        converted.push(convert(disk, wanted, &import).await?);
    }
    progress.set_phase("Importing");
    progress.done.store(total, Ordering::Relaxed);
    to.import(&input.target_request, &converted).await
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
/// into `dir`.
pub(crate) async fn convert(
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
                "qemu-img convert of disk {:?} from {} to {format}: {}",
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
        // One self-contained sparse file, what the vSphere import uploads.
        DiskFormat::Vmdk => &["-o", "subformat=monolithicSparse"],
        DiskFormat::Qcow2 | DiskFormat::Raw => &[],
    }
}

/// `qemu-img`, from `BANLIEUE_QEMU_IMG` when set, else from `PATH`.
fn qemu_img() -> PathBuf {
    std::env::var_os("BANLIEUE_QEMU_IMG")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("qemu-img"))
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
