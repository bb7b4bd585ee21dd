//! `qemu-img convert`, the one copy tool a machine's disk files go through on export
//! and import: it reads a qcow2 overlay through its backing file, and leaves the
//! zeros of a raw disk as holes instead of writing them.

use std::path::Path;

use banlieue_sdk::backend::{BackendError, DiskFormat};

/// Writes `from` (read as `format`, with its backing chain) into `to` as one file of
/// `out_format` with no backing file. `qemu-img` not installed → terminal
/// `QemuImgNotFound`; a failure → transient `QemuImgFailed` with what it printed.
pub async fn convert(
    from: &Path,
    format: DiskFormat,
    to: &Path,
    out_format: DiskFormat,
) -> Result<(), BackendError> {
    let out = tokio::process::Command::new("qemu-img")
        .args(["convert", "-f", format.as_str(), "-O", out_format.as_str()])
        .arg(from)
        .arg(to)
        .output()
        .await
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                BackendError::terminal(
                    "QemuImgNotFound",
                    "qemu-img (Debian's qemu-utils) is not installed on the host",
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
            "qemu-img convert {} -> {}: {} ({})",
            from.display(),
            to.display(),
            String::from_utf8_lossy(&out.stderr).trim(),
            out.status
        ),
    ))
}
