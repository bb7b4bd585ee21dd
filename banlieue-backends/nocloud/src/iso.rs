//! A small ISO 9660 writer (and reader) for NoCloud seeds: one root directory of
//! regular files, a primary tree with ISO level 1 names and a Joliet tree with the
//! real names. Linux, cloud-init and libarchive read the Joliet tree, so
//! `network-config` keeps its name; the primary tree is there because ISO 9660
//! requires it.
//!
//! Layout, in 2048-byte sectors: 0–15 system area (zero), 16 primary volume
//! descriptor, 17 Joliet supplementary descriptor, 18 terminator, 19–22 the four
//! path tables (L and M, primary and Joliet), then the primary root directory, the
//! Joliet root directory, and the files' data, each from a sector of its own.
//! Timestamps are fixed, so the same files give the same bytes.

use crate::{FileList, SeedError};

/// A logical sector.
pub const SECTOR: usize = 2048;
/// Joliet names are at most 64 UCS-2 characters.
const JOLIET_MAX: usize = 64;
/// The first sector after the path tables.
const FIRST_DIR_LBA: u32 = 23;
/// 2000-01-01 00:00:00 UTC as a directory record date.
const RECORD_DATE: [u8; 7] = [100, 1, 1, 0, 0, 0, 0];
/// The same as a volume descriptor date (`YYYYMMDDhhmmsscc` + UTC offset).
const VOLUME_DATE: &[u8; 17] = b"2000010100000000\0";
/// "Not specified" as a volume descriptor date.
const NO_DATE: &[u8; 17] = b"0000000000000000\0";
/// Joliet's UCS-2 level 3 escape sequence.
const JOLIET_ESCAPE: &[u8; 3] = b"%/E";

fn both16(v: u16) -> [u8; 4] {
    let (l, b) = (v.to_le_bytes(), v.to_be_bytes());
    [l[0], l[1], b[0], b[1]]
}

fn both32(v: u32) -> [u8; 8] {
    let (l, b) = (v.to_le_bytes(), v.to_be_bytes());
    [l[0], l[1], l[2], l[3], b[0], b[1], b[2], b[3]]
}

fn sectors(bytes: usize) -> usize {
    bytes.div_ceil(SECTOR)
}

fn ucs2(text: &str) -> Vec<u8> {
    text.encode_utf16().flat_map(u16::to_be_bytes).collect()
}

/// A level 1 primary name (`META_DAT.;1`): upper case d-characters, 8.3.
fn primary_name(name: &str) -> String {
    let clean = |s: &str, n: usize| -> String {
        s.chars()
            .map(|c| match c.to_ascii_uppercase() {
                c @ ('A'..='Z' | '0'..='9') => c,
                _ => '_',
            })
            .take(n)
            .collect()
    };
    let (stem, ext) = name.rsplit_once('.').unwrap_or((name, ""));
    format!("{}.{};1", clean(stem, 8), clean(ext, 3))
}

/// One directory record (ECMA-119 9.1), padded to an even length.
fn record(identifier: &[u8], lba: u32, size: u32, directory: bool) -> Vec<u8> {
    let len = 33 + identifier.len();
    let mut r = Vec::with_capacity(len + 1);
    r.push((len + len % 2) as u8);
    r.push(0);
    r.extend_from_slice(&both32(lba));
    r.extend_from_slice(&both32(size));
    r.extend_from_slice(&RECORD_DATE);
    r.push(if directory { 0x02 } else { 0x00 });
    r.extend_from_slice(&[0, 0]);
    r.extend_from_slice(&both16(1));
    r.push(identifier.len() as u8);
    r.extend_from_slice(identifier);
    if len % 2 == 1 {
        r.push(0);
    }
    r
}

/// A directory's records, none crossing a sector boundary; whole sectors.
fn directory(lba: u32, parent: u32, size: u32, entries: &[(Vec<u8>, u32, u32)]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut push = |r: Vec<u8>| {
        let used = out.len() % SECTOR;
        if used + r.len() > SECTOR {
            out.resize(out.len() + SECTOR - used, 0);
        }
        out.extend_from_slice(&r);
    };
    push(record(&[0], lba, size, true));
    push(record(&[1], parent, size, true));
    for (id, at, len) in entries {
        push(record(id, *at, *len, false));
    }
    out.resize(sectors(out.len()) * SECTOR, 0);
    out
}

/// The directory's size in bytes (whole sectors) for these identifiers.
fn directory_size(identifiers: &[Vec<u8>]) -> usize {
    let fake: Vec<(Vec<u8>, u32, u32)> = identifiers.iter().map(|i| (i.clone(), 0, 0)).collect();
    directory(0, 0, 0, &fake).len()
}

/// The single-entry path table of a root at `lba`, little or big endian.
fn path_table(lba: u32, little: bool) -> [u8; 10] {
    let l = if little {
        lba.to_le_bytes()
    } else {
        lba.to_be_bytes()
    };
    let p = if little {
        1u16.to_le_bytes()
    } else {
        1u16.to_be_bytes()
    };
    [1, 0, l[0], l[1], l[2], l[3], p[0], p[1], 0, 0]
}

/// Text padded with `fill` to `len` bytes (cut if longer).
fn padded(text: &[u8], len: usize, fill: &[u8]) -> Vec<u8> {
    let mut out: Vec<u8> = text.iter().copied().take(len).collect();
    while out.len() < len {
        out.push(fill[out.len() % fill.len()]);
    }
    out
}

struct Descriptor<'a> {
    kind: u8,
    label: &'a str,
    root: Vec<u8>,
    root_lba: u32,
    path_lba: u32,
    total: u32,
    joliet: bool,
}

/// A primary (type 1) or Joliet supplementary (type 2) volume descriptor.
fn descriptor(d: &Descriptor<'_>) -> Vec<u8> {
    let text = |s: &str, len: usize| {
        if d.joliet {
            padded(&ucs2(s), len, &[0, b' '])
        } else {
            padded(s.as_bytes(), len, b" ")
        }
    };
    let mut v = vec![0u8; SECTOR];
    v[0] = d.kind;
    v[1..6].copy_from_slice(b"CD001");
    v[6] = 1;
    v[8..40].copy_from_slice(&text("", 32));
    v[40..72].copy_from_slice(&text(d.label, 32));
    v[80..88].copy_from_slice(&both32(d.total));
    if d.joliet {
        v[88..91].copy_from_slice(JOLIET_ESCAPE);
    }
    v[120..124].copy_from_slice(&both16(1));
    v[124..128].copy_from_slice(&both16(1));
    v[128..132].copy_from_slice(&both16(SECTOR as u16));
    v[132..140].copy_from_slice(&both32(10));
    v[140..144].copy_from_slice(&d.path_lba.to_le_bytes());
    v[148..152].copy_from_slice(&(d.path_lba + 1).to_be_bytes());
    v[156..190].copy_from_slice(&record(&[0], d.root_lba, d.root.len() as u32, true));
    v[190..318].copy_from_slice(&text("", 128));
    v[318..446].copy_from_slice(&text("", 128));
    v[446..574].copy_from_slice(&text("", 128));
    v[574..702].copy_from_slice(&text("BANLIEUE", 128));
    v[702..813].copy_from_slice(&padded(b"", 111, b" "));
    v[813..830].copy_from_slice(VOLUME_DATE);
    v[830..847].copy_from_slice(VOLUME_DATE);
    v[847..864].copy_from_slice(NO_DATE);
    v[864..881].copy_from_slice(NO_DATE);
    v[881] = 1;
    v
}

/// An ISO 9660 image labelled `label` whose root directory holds `files` (name,
/// contents). Names must be distinct, 1–64 characters, without `/`, and distinct in
/// their level 1 form too (`META_DAT.;1`); the label is at most 16 characters.
pub fn image(label: &str, files: &[(&str, &[u8])]) -> Result<Vec<u8>, SeedError> {
    if label.is_empty() || label.chars().count() > 16 || !label.is_ascii() {
        return Err(SeedError::InvalidName(format!(
            "volume label {label:?} must be 1-16 ASCII characters"
        )));
    }
    let mut primary: Vec<(Vec<u8>, usize)> = Vec::new();
    let mut joliet: Vec<(Vec<u8>, usize)> = Vec::new();
    for (i, (name, _)) in files.iter().enumerate() {
        let chars = name.encode_utf16().count();
        if chars == 0 || chars > JOLIET_MAX || name.contains(['/', '\0', ';']) {
            return Err(SeedError::InvalidName(format!(
                "{name:?} must be 1-{JOLIET_MAX} characters without '/', ';' or NUL"
            )));
        }
        let p = primary_name(name).into_bytes();
        if primary.iter().any(|(q, _)| *q == p) || joliet.iter().any(|(q, _)| *q == ucs2(name)) {
            return Err(SeedError::InvalidName(format!(
                "{name:?} clashes with another file's name"
            )));
        }
        primary.push((p, i));
        joliet.push((ucs2(name), i));
    }
    // ECMA-119 9.3: records sorted by identifier.
    primary.sort();
    joliet.sort();

    let ids = |list: &[(Vec<u8>, usize)]| list.iter().map(|(id, _)| id.clone()).collect::<Vec<_>>();
    let primary_size = directory_size(&ids(&primary));
    let joliet_size = directory_size(&ids(&joliet));
    let primary_lba = FIRST_DIR_LBA;
    let joliet_lba = primary_lba + (primary_size / SECTOR) as u32;
    let mut next = joliet_lba as usize + joliet_size / SECTOR;
    let mut extents = Vec::with_capacity(files.len());
    for (name, data) in files {
        let len = u32::try_from(data.len())
            .map_err(|_| SeedError::TooLarge(format!("{name} is {} bytes", data.len())))?;
        extents.push((next as u32, len));
        next += sectors(data.len());
    }
    let total = u32::try_from(next).map_err(|_| SeedError::TooLarge(format!("{next} sectors")))?;
    let entries = |list: &[(Vec<u8>, usize)]| {
        list.iter()
            .map(|(id, i)| (id.clone(), extents[*i].0, extents[*i].1))
            .collect::<Vec<_>>()
    };
    let primary_dir = directory(
        primary_lba,
        primary_lba,
        primary_size as u32,
        &entries(&primary),
    );
    let joliet_dir = directory(
        joliet_lba,
        joliet_lba,
        joliet_size as u32,
        &entries(&joliet),
    );

    let mut out = vec![0u8; next * SECTOR];
    let mut put = |lba: usize, bytes: &[u8]| {
        out[lba * SECTOR..lba * SECTOR + bytes.len()].copy_from_slice(bytes);
    };
    put(
        16,
        &descriptor(&Descriptor {
            kind: 1,
            label,
            root: primary_dir.clone(),
            root_lba: primary_lba,
            path_lba: 19,
            total,
            joliet: false,
        }),
    );
    put(
        17,
        &descriptor(&Descriptor {
            kind: 2,
            label,
            root: joliet_dir.clone(),
            root_lba: joliet_lba,
            path_lba: 21,
            total,
            joliet: true,
        }),
    );
    let mut terminator = vec![0u8; 7];
    terminator[0] = 255;
    terminator[1..6].copy_from_slice(b"CD001");
    terminator[6] = 1;
    put(18, &terminator);
    put(19, &path_table(primary_lba, true));
    put(20, &path_table(primary_lba, false));
    put(21, &path_table(joliet_lba, true));
    put(22, &path_table(joliet_lba, false));
    put(primary_lba as usize, &primary_dir);
    put(joliet_lba as usize, &joliet_dir);
    for ((_, data), (lba, _)) in files.iter().zip(&extents) {
        put(*lba as usize, data);
    }
    Ok(out)
}

/// What [`read`] finds in an image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Contents {
    /// The primary volume identifier, trailing spaces removed.
    pub label: String,
    /// The Joliet volume identifier, when there is a Joliet tree.
    pub joliet_label: Option<String>,
    /// The root directory's files (Joliet names when there is a Joliet tree,
    /// else primary names without `;1`), in directory order.
    pub files: FileList,
}

fn bad(what: &str) -> SeedError {
    SeedError::Malformed(what.to_string())
}

fn slice(image: &[u8], at: usize, len: usize) -> Result<&[u8], SeedError> {
    image
        .get(at..at.checked_add(len).ok_or_else(|| bad("offset overflow"))?)
        .ok_or_else(|| bad("a structure points past the image's end"))
}

fn le32(bytes: &[u8]) -> u32 {
    u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
}

/// Reads the root directory of an ISO 9660 image (the Joliet tree when present):
/// for tests and diagnostics.
pub fn read(image: &[u8]) -> Result<Contents, SeedError> {
    let mut primary = None;
    let mut joliet = None;
    for n in 16.. {
        let d = slice(image, n * SECTOR, SECTOR)?;
        if &d[1..6] != b"CD001" {
            return Err(bad("no CD001 volume descriptor"));
        }
        match d[0] {
            1 => primary = Some(d),
            2 if &d[88..90] == b"%/" && matches!(d[90], b'@' | b'C' | b'E') => joliet = Some(d),
            255 => break,
            _ => {}
        }
    }
    let primary = primary.ok_or_else(|| bad("no primary volume descriptor"))?;
    let text = |b: &[u8]| String::from_utf8_lossy(b).trim_end().to_string();
    let ucs = |b: &[u8]| {
        let units: Vec<u16> = b
            .chunks_exact(2)
            .map(|c| u16::from_be_bytes([c[0], c[1]]))
            .collect();
        String::from_utf16_lossy(&units)
    };
    let label = text(&primary[40..72]);
    let joliet_label = joliet.map(|j| ucs(&j[40..72]).trim_end().to_string());
    let root_of = joliet.unwrap_or(primary);
    let root = &root_of[156..190];
    let (lba, size) = (le32(&root[2..6]) as usize, le32(&root[10..14]) as usize);
    let dir = slice(image, lba * SECTOR, size)?;
    let mut files = Vec::new();
    let mut at = 0;
    while at < dir.len() {
        let len = dir[at] as usize;
        if len == 0 {
            // The rest of this sector is padding.
            at = (at / SECTOR + 1) * SECTOR;
            continue;
        }
        let r = slice(dir, at, len)?;
        if len < 34 {
            return Err(bad("a directory record is too short"));
        }
        let id = slice(r, 33, r[32] as usize)?;
        if r[25] & 0x02 == 0 {
            let name = if joliet.is_some() {
                ucs(id)
            } else {
                String::from_utf8_lossy(id).to_string()
            };
            let name = name.strip_suffix(";1").unwrap_or(&name).to_string();
            let data = slice(
                image,
                le32(&r[2..6]) as usize * SECTOR,
                le32(&r[10..14]) as usize,
            )?;
            files.push((name, data.to_vec()));
        }
        at += len;
    }
    Ok(Contents {
        label,
        joliet_label,
        files,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seed() -> Vec<(&'static str, Vec<u8>)> {
        vec![
            ("meta-data", b"instance-id: \"i-1\"\n".to_vec()),
            // Spans three sectors.
            ("user-data", {
                let mut v = b"#cloud-config\n".to_vec();
                v.extend(std::iter::repeat_n(b'x', 5000));
                v
            }),
            ("network-config", Vec::new()),
        ]
    }

    fn build(files: &[(&str, Vec<u8>)]) -> Result<Vec<u8>, SeedError> {
        let refs: Vec<(&str, &[u8])> = files.iter().map(|(n, d)| (*n, d.as_slice())).collect();
        image("cidata", &refs)
    }

    #[test]
    fn round_trips_names_contents_and_label() {
        let files = seed();
        let iso = build(&files).unwrap();
        assert_eq!(iso.len() % SECTOR, 0);
        // 23 fixed sectors, two directories, 1 + 3 + 0 data sectors.
        assert_eq!(iso.len() / SECTOR, 23 + 2 + 4);
        assert_eq!(&iso[16 * SECTOR + 1..16 * SECTOR + 6], b"CD001");
        let read = read(&iso).unwrap();
        assert_eq!(read.label, "cidata");
        assert_eq!(read.joliet_label.as_deref(), Some("cidata"));
        let mut want: Vec<(String, Vec<u8>)> = files
            .iter()
            .map(|(n, d)| (n.to_string(), d.clone()))
            .collect();
        want.sort_by_key(|(n, _)| ucs2(n));
        assert_eq!(read.files, want);
        // Volume space size in both byte orders.
        let total = (iso.len() / SECTOR) as u32;
        assert_eq!(&iso[16 * SECTOR + 80..16 * SECTOR + 88], &both32(total));
    }

    #[test]
    fn the_same_files_give_the_same_bytes() {
        assert_eq!(build(&seed()).unwrap(), build(&seed()).unwrap());
    }

    #[test]
    fn primary_names_are_level_one() {
        assert_eq!(primary_name("meta-data"), "META_DAT.;1");
        assert_eq!(primary_name("network-config"), "NETWORK_.;1");
        assert_eq!(primary_name("seed.iso"), "SEED.ISO;1");
    }

    #[test]
    fn large_directories_span_sectors_without_splitting_records() {
        let names: Vec<String> = (0..60)
            .map(|i| format!("f{i:02}-{}", "n".repeat(40)))
            .collect();
        let files: Vec<(&str, Vec<u8>)> = names
            .iter()
            .map(|n| (n.as_str(), n.as_bytes().to_vec()))
            .collect();
        let iso = build(&files).unwrap();
        let read = read(&iso).unwrap();
        assert_eq!(read.files.len(), 60);
        assert!(read.files.iter().all(|(n, d)| n.as_bytes() == d.as_slice()));
    }

    #[test]
    fn bad_names_and_labels_are_refused() {
        let e = |files: &[(&str, &[u8])], label: &str| image(label, files).unwrap_err();
        assert!(matches!(
            e(&[("a/b", b"")], "cidata"),
            SeedError::InvalidName(_)
        ));
        assert!(matches!(
            e(&[(&"x".repeat(65), b"")], "cidata"),
            SeedError::InvalidName(_)
        ));
        assert!(matches!(
            e(&[("meta-data", b""), ("meta_data", b"")], "cidata"),
            SeedError::InvalidName(_)
        ));
        assert!(matches!(
            e(&[], "a-label-longer-than-16"),
            SeedError::InvalidName(_)
        ));
        assert!(matches!(read(&[0u8; 100]), Err(SeedError::Malformed(_))));
        assert!(matches!(
            read(&vec![0u8; 40 * SECTOR]),
            Err(SeedError::Malformed(_))
        ));
    }

    /// blkid is how cloud-init finds the seed (`LABEL=cidata`, `TYPE=iso9660`).
    /// util-linux is part of every Debian system; under CI its absence fails.
    #[test]
    fn blkid_sees_an_iso9660_file_system_labelled_cidata() {
        let Ok(out) = std::process::Command::new("blkid").arg("-V").output() else {
            assert!(
                !["CI", "BANLIEUE_REQUIRE_RIGS"]
                    .iter()
                    .any(|k| std::env::var(k).is_ok_and(|v| v == "true" || v == "1")),
                "blkid is required in CI"
            );
            eprintln!("SKIPPED: no blkid");
            return;
        };
        assert!(out.status.success());
        let dir = std::env::temp_dir().join(format!("bnl-nocloud-iso-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("seed.iso");
        std::fs::write(&path, build(&seed()).unwrap()).unwrap();
        let out = std::process::Command::new("blkid")
            .args(["-p", "-o", "export"])
            .arg(&path)
            .output()
            .unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("TYPE=iso9660"), "{text}");
        assert!(text.contains("LABEL=cidata"), "{text}");
        assert!(text.contains("Joliet"), "{text}");
    }
}
