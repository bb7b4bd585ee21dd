//! vfat seeds: a 4 MiB FAT12 image (written by `fatfs`) labelled in its boot sector
//! and, as mkfs.vfat does, by a volume-label entry in the root directory (blkid
//! reads the latter first).

use std::io::{Cursor, Read, Seek, SeekFrom, Write};

use crate::{FileList, SeedError};

/// The image's size: FAT12, room for bootstrap data of a few MiB.
pub const IMAGE_BYTES: usize = 4 * 1024 * 1024;

/// A fixed volume serial keeps images reproducible.
const VOLUME_ID: u32 = 0xb4a1_1e0e;

fn io(e: std::io::Error) -> SeedError {
    SeedError::Io(e.to_string())
}

/// A FAT12 image labelled `label` (at most 11 ASCII characters) whose root
/// directory holds `files` (name, contents).
pub fn image(label: &str, files: &[(&str, &[u8])]) -> Result<Vec<u8>, SeedError> {
    if label.is_empty() || label.len() > 11 || !label.is_ascii() {
        return Err(SeedError::InvalidName(format!(
            "volume label {label:?} must be 1-11 ASCII characters"
        )));
    }
    let mut padded = [b' '; 11];
    padded[..label.len()].copy_from_slice(label.as_bytes());
    let mut disk = Cursor::new(vec![0u8; IMAGE_BYTES]);
    fatfs::format_volume(
        &mut disk,
        fatfs::FormatVolumeOptions::new()
            .volume_label(padded)
            .volume_id(VOLUME_ID),
    )
    .map_err(io)?;
    write_root_label(disk.get_mut(), &padded);
    disk.seek(SeekFrom::Start(0)).map_err(io)?;
    {
        let fs = fatfs::FileSystem::new(&mut disk, fatfs::FsOptions::new()).map_err(io)?;
        for (name, content) in files {
            let mut file = fs.root_dir().create_file(name).map_err(io)?;
            file.truncate().map_err(io)?;
            // A fresh image fails a write only when it is full.
            file.write_all(content).map_err(|e| {
                SeedError::TooLarge(format!(
                    "{name} ({} bytes) does not fit a {IMAGE_BYTES}-byte image: {e}",
                    content.len()
                ))
            })?;
            file.flush().map_err(io)?;
        }
        fs.unmount().map_err(io)?;
    }
    Ok(disk.into_inner())
}

/// Writes the volume-label entry as the first root directory entry of a freshly
/// formatted FAT12/16 image (fatfs only sets the boot sector's label).
fn write_root_label(image: &mut [u8], label: &[u8; 11]) {
    let u16_at = |o: usize| u16::from_le_bytes([image[o], image[o + 1]]) as usize;
    let bytes_per_sector = u16_at(11);
    let reserved = u16_at(14);
    let fats = image[16] as usize;
    let sectors_per_fat = u16_at(22);
    let root = (reserved + fats * sectors_per_fat) * bytes_per_sector;
    image[root..root + 11].copy_from_slice(label);
    image[root + 11] = 0x08; // ATTR_VOLUME_ID
}

/// Reads a vfat seed back: its root-directory label and files (sorted by name), for
/// tests and diagnostics.
pub fn read(image: &[u8]) -> Result<(String, FileList), SeedError> {
    let malformed = |e: std::io::Error| SeedError::Malformed(e.to_string());
    let fs = fatfs::FileSystem::new(Cursor::new(image.to_vec()), fatfs::FsOptions::new())
        .map_err(malformed)?;
    let label = fs
        .read_volume_label_from_root_dir()
        .map_err(malformed)?
        .unwrap_or_default();
    let mut files = Vec::new();
    for entry in fs.root_dir().iter() {
        let entry = entry.map_err(malformed)?;
        if entry.is_file() {
            let mut data = Vec::new();
            entry.to_file().read_to_end(&mut data).map_err(malformed)?;
            files.push((entry.file_name(), data));
        }
    }
    files.sort();
    Ok((label, files))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_is_reproducible() {
        let files: [(&str, &[u8]); 2] = [
            ("meta-data", b"instance-id: x\n"),
            ("user-data", b"#cloud-config\n"),
        ];
        let img = image("cidata", &files).unwrap();
        assert_eq!(img.len(), IMAGE_BYTES);
        let (label, read) = read(&img).unwrap();
        assert_eq!(label.trim_end(), "cidata");
        assert_eq!(
            read,
            vec![
                ("meta-data".to_string(), b"instance-id: x\n".to_vec()),
                ("user-data".to_string(), b"#cloud-config\n".to_vec())
            ]
        );
        assert_eq!(img, image("cidata", &files).unwrap());
    }

    #[test]
    fn too_much_data_is_too_large_and_labels_are_checked() {
        let big = vec![b'x'; IMAGE_BYTES];
        assert!(matches!(
            image("cidata", &[("user-data", &big)]),
            Err(SeedError::TooLarge(_))
        ));
        assert!(matches!(
            image("a-long-label", &[]),
            Err(SeedError::InvalidName(_))
        ));
    }
}
