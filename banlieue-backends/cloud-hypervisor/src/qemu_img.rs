//! `qemu-img convert`, the one copy tool a machine's disk files go through on export
//! and import ([`banlieue_kit::qemu_img`]), off the async workers: a convert reads and
//! writes a whole disk.

use std::path::Path;

use banlieue_sdk::backend::{BackendError, DiskFormat};

/// Writes `from` (read as `format`, with its backing chain) into `to` as one file of
/// `out_format` with no backing file, on a blocking thread. `qemu-img` not installed →
/// terminal `QemuImgNotFound`; a failure → transient `QemuImgFailed` with what it printed.
pub async fn convert(
    from: &Path,
    format: DiskFormat,
    to: &Path,
    out_format: DiskFormat,
) -> Result<(), BackendError> {
    let (from, to) = (from.to_owned(), to.to_owned());
    tokio::task::spawn_blocking(move || {
        banlieue_kit::qemu_img::convert(&from, format, &to, out_format)
    })
    .await
    .map_err(|e| {
        BackendError::transient("QemuImgFailed", format!("qemu-img did not finish: {e}"))
    })?
}
