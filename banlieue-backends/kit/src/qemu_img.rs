//! `qemu-img` on the operator's host, for what a hypervisor API does not do: rebasing
//! downloaded layers onto each other and flattening a backing chain into one file
//! (leaving the zeros of a raw disk as holes). Blocking: call it from a blocking thread.

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

use banlieue_sdk::backend::{BackendError, DiskFormat};

/// Runs `qemu-img` with `args`. Not installed → terminal `QemuImgNotFound`; a
/// failure → transient `QemuImgFailed` with what it printed (often a full disk).
pub fn run<I, S>(args: I) -> Result<(), BackendError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let args: Vec<_> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
    let shown = args
        .iter()
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ");
    let out = Command::new("qemu-img").args(&args).output().map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            BackendError::terminal(
                "QemuImgNotFound",
                "qemu-img (Debian's qemu-utils) is not installed where the operator runs",
            )
        } else {
            BackendError::transient("QemuImgFailed", format!("running qemu-img: {e}"))
        }
    })?;
    if out.status.success() {
        return Ok(());
    }
    Err(BackendError::transient(
        "QemuImgFailed",
        format!(
            "qemu-img {shown}: {} ({})",
            String::from_utf8_lossy(&out.stderr).trim(),
            out.status
        ),
    ))
}

/// Points `overlay` (read as `format`) at `backing` (read as `backing_format`) without
/// touching its data (`rebase -u`): for layers whose bytes are already right under a
/// new name. A relative `backing` is resolved next to `overlay`.
pub fn rebase_unsafe(
    overlay: &Path,
    format: DiskFormat,
    backing: &str,
    backing_format: DiskFormat,
) -> Result<(), BackendError> {
    let mut args: Vec<&OsStr> = ["rebase", "-u", "-f", format.as_str(), "-b", backing]
        .into_iter()
        .map(OsStr::new)
        .collect();
    args.extend([OsStr::new("-F"), OsStr::new(backing_format.as_str())]);
    args.push(overlay.as_os_str());
    run(args)
}

/// Writes `from` (read as `format`, with its backing chain) into `to` as one file of
/// `out_format` with no backing file.
pub fn convert(
    from: &Path,
    format: DiskFormat,
    to: &Path,
    out_format: DiskFormat,
) -> Result<(), BackendError> {
    let mut args: Vec<&OsStr> = ["convert", "-f", format.as_str(), "-O", out_format.as_str()]
        .into_iter()
        .map(OsStr::new)
        .collect();
    args.extend([from.as_os_str(), to.as_os_str()]);
    run(args)
}
