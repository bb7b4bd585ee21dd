//! qcow2 overlays written in Rust: an empty qcow2 v3 image whose backing file is the
//! VMImage's qcow2 disk, so a machine's disk is ready at once instead of after a copy,
//! and its virtual size can be larger than the image's (the guest grows its partition).
//!
//! The layout is what `qemu-img create -f qcow2 -b <base> -F qcow2` writes, with
//! 64 KiB clusters: cluster 0 the header (backing-format extension, backing file name),
//! cluster 1 the refcount table, cluster 2 its one refcount block, clusters 3.. the
//! (empty) L1 table. Every cluster is unallocated, so reads fall through to the base.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

const MAGIC: u32 = 0x5146_49fb;
const CLUSTER_BITS: u32 = 16;
const CLUSTER: u64 = 1 << CLUSTER_BITS;
const HEADER_LENGTH: u32 = 104;
const BACKING_FORMAT_EXT: u32 = 0xe279_2aca;

/// The virtual size of a qcow2 image (its header's `size`), or `None` if `path` is
/// not qcow2.
pub fn virtual_size(path: &Path) -> std::io::Result<Option<u64>> {
    let mut header = [0u8; 32];
    let mut file = std::fs::File::open(path)?;
    if file.read_exact(&mut header).is_err() {
        return Ok(None);
    }
    if u32::from_be_bytes(header[0..4].try_into().unwrap_or_default()) != MAGIC {
        return Ok(None);
    }
    Ok(Some(u64::from_be_bytes(
        header[24..32].try_into().unwrap_or_default(),
    )))
}

/// Writes at `path` an overlay of `base` (a qcow2 image, named by its absolute path)
/// with `size` bytes of virtual size (at least the base's).
pub fn create_overlay(path: &Path, base: &Path, size: u64) -> std::io::Result<()> {
    let base_name = base.to_string_lossy();
    let base_size = virtual_size(base)?.ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("{} is not a qcow2 image", base.display()),
        )
    })?;
    let size = size.max(base_size);
    // One L1 entry maps one L2 table: CLUSTER/8 clusters of CLUSTER bytes.
    let per_l1 = CLUSTER * (CLUSTER / 8);
    let l1_size = size.div_ceil(per_l1);
    let l1_clusters = (l1_size * 8).div_ceil(CLUSTER).max(1);
    let total_clusters = 3 + l1_clusters;
    // One refcount block (16-bit entries) covers CLUSTER/2 clusters: plenty here.
    if total_clusters > CLUSTER / 2 || l1_size > u64::from(u32::MAX) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("virtual size {size} is too large for an overlay"),
        ));
    }
    let format = b"qcow2";
    // Header, extensions (each padded to 8 bytes), end marker, then the name.
    let extensions_len = 8 + format.len().div_ceil(8) * 8 + 8;
    let backing_offset = HEADER_LENGTH as usize + extensions_len;
    if backing_offset + base_name.len() > CLUSTER as usize {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the base image path is too long",
        ));
    }
    let mut header = Vec::with_capacity(CLUSTER as usize);
    header.extend_from_slice(&MAGIC.to_be_bytes());
    header.extend_from_slice(&3u32.to_be_bytes()); // version
    header.extend_from_slice(&(backing_offset as u64).to_be_bytes());
    header.extend_from_slice(&(base_name.len() as u32).to_be_bytes());
    header.extend_from_slice(&CLUSTER_BITS.to_be_bytes());
    header.extend_from_slice(&size.to_be_bytes());
    header.extend_from_slice(&0u32.to_be_bytes()); // crypt_method
    header.extend_from_slice(&(l1_size as u32).to_be_bytes());
    header.extend_from_slice(&(3 * CLUSTER).to_be_bytes()); // l1_table_offset
    header.extend_from_slice(&CLUSTER.to_be_bytes()); // refcount_table_offset
    header.extend_from_slice(&1u32.to_be_bytes()); // refcount_table_clusters
    header.extend_from_slice(&0u32.to_be_bytes()); // nb_snapshots
    header.extend_from_slice(&0u64.to_be_bytes()); // snapshots_offset
    header.extend_from_slice(&0u64.to_be_bytes()); // incompatible_features
    header.extend_from_slice(&0u64.to_be_bytes()); // compatible_features
    header.extend_from_slice(&0u64.to_be_bytes()); // autoclear_features
    header.extend_from_slice(&4u32.to_be_bytes()); // refcount_order: 16-bit refcounts
    header.extend_from_slice(&HEADER_LENGTH.to_be_bytes());
    debug_assert_eq!(header.len(), HEADER_LENGTH as usize);
    header.extend_from_slice(&BACKING_FORMAT_EXT.to_be_bytes());
    header.extend_from_slice(&(format.len() as u32).to_be_bytes());
    header.extend_from_slice(format);
    header.resize(header.len().div_ceil(8) * 8, 0);
    header.extend_from_slice(&[0u8; 8]); // end of extensions
    debug_assert_eq!(header.len(), backing_offset);
    header.extend_from_slice(base_name.as_bytes());

    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    file.set_len(total_clusters * CLUSTER)?;
    file.write_all(&header)?;
    // Refcount table: its first block lives in cluster 2.
    file.seek(SeekFrom::Start(CLUSTER))?;
    file.write_all(&(2 * CLUSTER).to_be_bytes())?;
    // Refcount block: every metadata cluster is used once.
    file.seek(SeekFrom::Start(2 * CLUSTER))?;
    let refcounts: Vec<u8> = (0..total_clusters)
        .flat_map(|_| 1u16.to_be_bytes())
        .collect();
    file.write_all(&refcounts)?;
    // The L1 table stays zero: nothing allocated.
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// qemu-img and qemu-io (Debian's qemu-utils) judge the overlay; outside CI a
    /// machine without them skips, in CI it fails.
    fn qemu_img() -> bool {
        let found = Command::new("qemu-img").arg("--version").output().is_ok();
        if !found {
            assert!(
                !["CI", "BANLIEUE_REQUIRE_RIGS"]
                    .iter()
                    .any(|k| std::env::var(k).is_ok_and(|v| v == "true" || v == "1")),
                "qemu-img (qemu-utils) is required in CI"
            );
            eprintln!("SKIPPED: qemu-img not installed");
        }
        found
    }

    fn run(args: &[&str]) -> String {
        let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    #[test]
    fn qemu_reads_writes_and_checks_the_overlay() {
        if !qemu_img() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("base.qcow2");
        let overlay = dir.path().join("disk.qcow2");
        let base_s = base.to_str().unwrap();
        let overlay_s = overlay.to_str().unwrap();
        run(&["qemu-img", "create", "-q", "-f", "qcow2", base_s, "1G"]);
        run(&["qemu-io", "-c", "write -P 0xab 0 64k", base_s]);
        assert_eq!(virtual_size(&base).unwrap(), Some(1 << 30));
        create_overlay(&overlay, &base, 3 << 30).unwrap();

        let info: serde_json::Value =
            serde_json::from_str(&run(&["qemu-img", "info", "--output=json", overlay_s])).unwrap();
        assert_eq!(info["virtual-size"], 3u64 << 30);
        assert_eq!(info["backing-filename"], base_s);
        assert_eq!(info["backing-filename-format"], "qcow2");
        run(&["qemu-img", "check", overlay_s]);
        // Reads fall through to the base; writes allocate in the overlay only.
        run(&["qemu-io", "-c", "read -P 0xab 0 64k", overlay_s]);
        run(&["qemu-io", "-c", "write -P 0xcd 2g 128k", overlay_s]);
        run(&["qemu-img", "check", overlay_s]);
        run(&["qemu-io", "-c", "read -P 0xcd 2g 128k", overlay_s]);
        run(&["qemu-img", "check", base_s]);
        run(&["qemu-io", "-c", "read -P 0xab 0 64k", base_s]);

        // Never smaller than the base; not on a raw base.
        create_overlay(&overlay, &base, 1).unwrap();
        assert_eq!(virtual_size(&overlay).unwrap(), Some(1 << 30));
        let raw = dir.path().join("raw.img");
        std::fs::write(&raw, [0u8; 4096]).unwrap();
        assert!(create_overlay(&overlay, &raw, 1 << 30).is_err());
        assert_eq!(virtual_size(&raw).unwrap(), None);
    }
}
