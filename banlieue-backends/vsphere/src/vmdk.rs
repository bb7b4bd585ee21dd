//! VMDK descriptors, as far as moving disks needs them: reading the text descriptor
//! of a disk (its `createType` and extents), telling a hosted single-file sparse VMDK
//! apart (it starts with the `KDMV` magic), and writing the descriptor ESXi itself
//! writes for a flat disk (`createType="vmfs"`, one `VMFS` extent).
//!
//! Why a descriptor is written rather than uploaded as `qemu-img` made it: ESXi's
//! native flat layout is `vmfs`/`VMFS`; `qemu-img`'s `monolithicFlat`/`FLAT` is the
//! hosted (Workstation) spelling of the same bytes. Writing the native one leaves
//! nothing to ESXi's tolerance. vcsim writes that same layout for its own disks.

/// Bytes per sector: extent sizes are in sectors.
pub const SECTOR: u64 = 512;

/// The magic of a hosted sparse extent (`monolithicSparse`, `streamOptimized`).
pub const SPARSE_MAGIC: &[u8; 4] = b"KDMV";

/// True when `head` (a file's first bytes) is a hosted sparse VMDK (one self-contained
/// file, not a text descriptor).
pub fn is_sparse(head: &[u8]) -> bool {
    head.starts_with(SPARSE_MAGIC)
}

/// The virtual size, in bytes, a hosted sparse VMDK's header gives (`capacity`, in
/// sectors, at offset 12).
pub fn sparse_capacity(head: &[u8]) -> Option<u64> {
    let bytes: [u8; 8] = head.get(12..20)?.try_into().ok()?;
    u64::from_le_bytes(bytes).checked_mul(SECTOR)
}

/// One extent line: `RW 8192 VMFS "os-flat.vmdk" 0`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Extent {
    /// `RW`, `RDONLY` or `NOACCESS`.
    pub access: String,
    /// Its size in sectors.
    pub sectors: u64,
    /// `FLAT`, `VMFS`, `ZERO`, `SPARSE`, `VMFSSPARSE`, `SESPARSE`, `VMFSRDM`, ...
    pub kind: String,
    /// The extent's file, relative to the descriptor's directory (none for `ZERO`).
    pub file: Option<String>,
    /// Where the extent starts in its file, in sectors (flat extents only).
    pub offset: u64,
}

impl Extent {
    /// True for an extent whose file holds the guest's bytes as they are.
    pub fn is_flat(&self) -> bool {
        matches!(self.kind.as_str(), "FLAT" | "VMFS")
    }

    /// Its size in bytes.
    pub fn bytes(&self) -> u64 {
        self.sectors.saturating_mul(SECTOR)
    }
}

/// A parsed text descriptor.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Descriptor {
    /// `createType`, e.g. `vmfs`, `monolithicFlat`, `vmfsSparse`.
    pub create_type: String,
    /// `parentFileNameHint`: the parent of a delta disk.
    pub parent_file: Option<String>,
    /// The extents, in order.
    pub extents: Vec<Extent>,
}

impl Descriptor {
    /// The disk's size as the guest sees it, in bytes.
    pub fn capacity(&self) -> u64 {
        self.extents
            .iter()
            .fold(0u64, |sum, e| sum.saturating_add(e.bytes()))
    }

    /// True for a delta disk (a snapshot or linked clone): its bytes need its parent.
    /// Told by the parent's file name: `parentCID` is no help, as govmomi writes `0`
    /// where VMware writes `ffffffff` for "none".
    pub fn has_parent(&self) -> bool {
        self.parent_file.is_some()
    }
}

const ACCESS: [&str; 3] = ["RW", "RDONLY", "NOACCESS"];

fn extent(line: &str) -> Option<Result<Extent, String>> {
    let (access, rest) = line.split_once(char::is_whitespace)?;
    if !ACCESS.contains(&access) {
        return None;
    }
    let bad = || Err(format!("unreadable extent line {line}"));
    let mut rest = rest.trim_start();
    let Some((sectors, after)) = rest.split_once(char::is_whitespace) else {
        return Some(bad());
    };
    let Ok(sectors) = sectors.parse::<u64>() else {
        return Some(bad());
    };
    rest = after.trim_start();
    let (kind, after) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
    rest = after.trim_start();
    let mut file = None;
    if let Some(quoted) = rest.strip_prefix('"') {
        let Some((name, after)) = quoted.split_once('"') else {
            return Some(bad());
        };
        file = Some(name.to_string());
        rest = after.trim_start();
    }
    let offset = match rest.split_whitespace().next() {
        None => 0,
        Some(o) => match o.parse() {
            Ok(o) => o,
            Err(_) => return Some(bad()),
        },
    };
    Some(Ok(Extent {
        access: access.to_string(),
        sectors,
        kind: kind.to_ascii_uppercase(),
        file,
        offset,
    }))
}

/// Parses a text descriptor (NUL padding, as `qemu-img` leaves it, is ignored). Text
/// without a `createType` is not a descriptor.
pub fn parse(text: &str) -> Result<Descriptor, String> {
    let mut d = Descriptor::default();
    let mut typed = false;
    for line in text.lines() {
        let line = line.trim_matches(|c: char| c == '\0' || c.is_whitespace());
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(e) = extent(line) {
            d.extents.push(e?);
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let value = value.trim().trim_matches('"');
        match key.trim() {
            "createType" => {
                d.create_type = value.to_string();
                typed = true;
            }
            "parentFileNameHint" if !value.is_empty() => {
                d.parent_file = Some(value.to_string());
            }
            _ => {}
        }
    }
    if !typed {
        return Err("not a VMDK descriptor (no createType)".into());
    }
    Ok(d)
}

/// The descriptor ESXi writes for a flat disk of `bytes` (a whole number of
/// sectors) whose data is `flat_file` beside it, on a SCSI controller.
pub fn vmfs_descriptor(flat_file: &str, bytes: u64) -> String {
    let sectors = bytes / SECTOR;
    // ESXi's geometry for SCSI disks: 255 heads, 63 sectors per track.
    let cylinders = (sectors / (255 * 63)).clamp(1, 65535);
    format!(
        "# Disk DescriptorFile\n\
         version=1\n\
         encoding=\"UTF-8\"\n\
         CID=fffffffe\n\
         parentCID=ffffffff\n\
         createType=\"vmfs\"\n\
         \n\
         # Extent description\n\
         RW {sectors} VMFS \"{flat_file}\"\n\
         \n\
         # The Disk Data Base\n\
         #DDB\n\
         \n\
         ddb.adapterType = \"lsilogic\"\n\
         ddb.geometry.cylinders = \"{cylinders}\"\n\
         ddb.geometry.heads = \"255\"\n\
         ddb.geometry.sectors = \"63\"\n\
         ddb.virtualHWVersion = \"4\"\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `qemu-img convert -O vmdk -o subformat=monolithicFlat` writes (7.2),
    /// NUL padding included.
    const QEMU_FLAT: &str = "# Disk DescriptorFile\nversion=1\nCID=dbe3c3e1\nparentCID=ffffffff\ncreateType=\"monolithicFlat\"\n\n# Extent description\nRW 8192 FLAT \"os-flat.vmdk\" 0\n\n# The Disk Data Base\n#DDB\n\nddb.virtualHWVersion = \"4\"\nddb.adapterType = \"lsilogic\"\n\0\0\0\0";

    /// What vcsim (govmomi's vmdk package) writes for the disks it creates.
    const VCSIM: &str = "# Disk DescriptorFile\nversion=1\nencoding=\"UTF-8\"\nCID=0\nparentCID=0\ncreateType=\"vmfs\"\n\n\n# Extent description (10GB capacity)\nRW 20971520 VMFS \"disk1-flat.vmdk\"\n\n# The Disk Data Base\n#DDB\n";

    #[test]
    fn qemu_img_monolithic_flat_is_one_flat_extent() {
        let d = parse(QEMU_FLAT).unwrap();
        assert_eq!(d.create_type, "monolithicFlat");
        assert!(!d.has_parent());
        assert_eq!(
            d.extents,
            [Extent {
                access: "RW".into(),
                sectors: 8192,
                kind: "FLAT".into(),
                file: Some("os-flat.vmdk".into()),
                offset: 0,
            }]
        );
        assert!(d.extents[0].is_flat());
        assert_eq!(d.capacity(), 4 << 20);
    }

    #[test]
    fn vcsim_disks_are_vmfs_flat() {
        let d = parse(VCSIM).unwrap();
        assert_eq!(d.create_type, "vmfs");
        assert_eq!(d.extents.len(), 1);
        assert!(d.extents[0].is_flat());
        assert_eq!(d.capacity(), 10 << 30);
        // parentCID=0 is govmomi's "none".
        assert!(!d.has_parent());
    }

    #[test]
    fn delta_disks_and_zero_extents_are_recognised() {
        let d = parse(
            "createType=\"vmfsSparse\"\nparentCID=1234abcd\nparentFileNameHint=\"base.vmdk\"\nRW 100 VMFSSPARSE \"x-delta.vmdk\"\nRW 28 ZERO\n",
        )
        .unwrap();
        assert!(d.has_parent());
        assert_eq!(d.extents[0].kind, "VMFSSPARSE");
        assert!(!d.extents[0].is_flat());
        assert_eq!(d.extents[1].file, None);
        assert_eq!(d.capacity(), 128 * 512);
        assert!(parse("just text").is_err());
        assert!(parse("createType=\"vmfs\"\nRW many VMFS \"x\"").is_err());
    }

    #[test]
    fn the_written_descriptor_reads_back() {
        let d = parse(&vmfs_descriptor("os-flat.vmdk", 8 << 30)).unwrap();
        assert_eq!(d.create_type, "vmfs");
        assert_eq!(d.capacity(), 8 << 30);
        assert_eq!(d.extents[0].file.as_deref(), Some("os-flat.vmdk"));
        assert!(!d.has_parent());
    }

    #[test]
    fn sparse_headers_give_their_capacity() {
        let mut head = b"KDMV".to_vec();
        head.extend_from_slice(&[1, 0, 0, 0, 3, 0, 0, 0]);
        head.extend_from_slice(&8192u64.to_le_bytes());
        assert!(is_sparse(&head));
        assert_eq!(sparse_capacity(&head), Some(4 << 20));
        assert!(!is_sparse(b"# Disk DescriptorFile"));
        assert_eq!(sparse_capacity(b"KDMV"), None);
    }
}
