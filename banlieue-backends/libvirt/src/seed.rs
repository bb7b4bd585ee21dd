//! The NoCloud seed: `meta-data`, `user-data` and `network-config` on a vfat volume
//! labelled `cidata`, written in memory (no shell-out, no temporary files).
//!
//! cloud-init's NoCloud datasource accepts a vfat or iso9660 file system with that
//! label; vfat is what a small, dependable Rust writer (`fatfs`) produces.

use std::io::{Cursor, Seek, SeekFrom, Write};

use banlieue_sdk::api::common::{BootstrapFormat, IpamMode};
use banlieue_sdk::api::infra::libvirt::LibvirtMachineSpec;
use banlieue_sdk::backend::{BackendError, BootstrapData, MachineIdentity};

use crate::domain::macs;

/// The seed's file-system label, as NoCloud looks for it.
pub const LABEL: &str = "cidata";
/// The seed volume's size: FAT12, room for a large cloud-config.
pub const SEED_BYTES: usize = 4 * 1024 * 1024;

/// The three NoCloud files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeedFiles {
    /// `meta-data` (YAML).
    pub meta_data: String,
    /// `user-data`: the bootstrap data verbatim, or an empty cloud-config.
    pub user_data: String,
    /// `network-config` (version 2): given, or made from the spec's interfaces.
    pub network_config: String,
}

/// A YAML double-quoted scalar.
pub fn yaml_quote(value: &str) -> String {
    let mut out = String::from("\"");
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The seed's files for a machine. `provider_id` becomes the instance ID, so a
/// redefined domain with the same UID is the same instance to cloud-init.
pub fn files(
    identity: &MachineIdentity,
    provider_id: &str,
    spec: &LibvirtMachineSpec,
    bootstrap: Option<&BootstrapData>,
) -> Result<SeedFiles, BackendError> {
    let meta_data = format!(
        "instance-id: {}\nlocal-hostname: {}\n",
        yaml_quote(provider_id),
        yaml_quote(&identity.name)
    );
    let user_data = match bootstrap {
        None => "#cloud-config\n{}\n".to_string(),
        Some(b) if b.format == BootstrapFormat::Ignition => {
            return Err(BackendError::terminal(
                "UnsupportedBootstrapFormat",
                "the libvirt backend delivers bootstrap data as a NoCloud seed (cloud-config); Ignition is not supported",
            ));
        }
        Some(b) => b.user_data.expose().to_string(),
    };
    let network_config = match bootstrap.and_then(|b| b.network_config.as_ref()) {
        Some(given) => given.expose().to_string(),
        None => network_config(&identity.uid, spec),
    };
    Ok(SeedFiles {
        meta_data,
        user_data,
        network_config,
    })
}

/// A version 2 network config matching each interface by MAC: DHCP, or the static
/// addresses, gateway and name servers of its IPAM.
pub fn network_config(uid: &str, spec: &LibvirtMachineSpec) -> String {
    let mut out = String::from("version: 2\nethernets:\n");
    for (i, (nic, mac)) in spec.network.iter().zip(macs(uid, spec)).enumerate() {
        out.push_str(&format!(
            "  eth{i}:\n    match:\n      macaddress: {}\n    set-name: eth{i}\n",
            yaml_quote(&mac)
        ));
        match nic.ipam.mode {
            IpamMode::Static => {
                out.push_str("    dhcp4: false\n    dhcp6: false\n    addresses:\n");
                for a in &nic.ipam.addresses {
                    out.push_str(&format!("      - {}\n", yaml_quote(a)));
                }
                if let Some(gw) = &nic.ipam.gateway {
                    out.push_str(&format!(
                        "    routes:\n      - to: default\n        via: {}\n",
                        yaml_quote(gw)
                    ));
                }
                if !nic.ipam.nameservers.is_empty() {
                    out.push_str("    nameservers:\n      addresses:\n");
                    for ns in &nic.ipam.nameservers {
                        out.push_str(&format!("        - {}\n", yaml_quote(ns)));
                    }
                }
            }
            // Pool-claimed addresses arrive as static ones once claimed; until then DHCP.
            IpamMode::Dhcp | IpamMode::Pool => out.push_str("    dhcp4: true\n"),
        }
    }
    if spec.network.is_empty() {
        out = String::from("version: 2\nethernets: {}\n");
    }
    out
}

fn io_err(e: std::io::Error) -> BackendError {
    BackendError::terminal("SeedTooLarge", format!("writing the NoCloud seed: {e}"))
}

/// A vfat image holding the files, labelled [`LABEL`] (in the boot sector and as a
/// root-directory volume entry, as mkfs.vfat does; blkid reads the latter first).
pub fn vfat_image(files: &SeedFiles) -> Result<Vec<u8>, BackendError> {
    let mut disk = Cursor::new(vec![0u8; SEED_BYTES]);
    let mut label = [b' '; 11];
    label[..LABEL.len()].copy_from_slice(LABEL.as_bytes());
    fatfs::format_volume(
        &mut disk,
        fatfs::FormatVolumeOptions::new()
            .volume_label(label)
            // A fixed serial keeps the image (and its golden test) reproducible.
            .volume_id(0xb4a1_1e0e),
    )
    .map_err(io_err)?;
    write_root_label(disk.get_mut(), &label);
    disk.seek(SeekFrom::Start(0)).map_err(io_err)?;
    {
        let fs = fatfs::FileSystem::new(&mut disk, fatfs::FsOptions::new()).map_err(io_err)?;
        for (name, content) in [
            ("meta-data", &files.meta_data),
            ("user-data", &files.user_data),
            ("network-config", &files.network_config),
        ] {
            let mut file = fs.root_dir().create_file(name).map_err(io_err)?;
            file.truncate().map_err(io_err)?;
            file.write_all(content.as_bytes()).map_err(io_err)?;
            file.flush().map_err(io_err)?;
        }
        fs.unmount().map_err(io_err)?;
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

/// Reads the files back from a seed image (for tests and diagnostics).
pub fn read_image(image: &[u8]) -> Result<(String, Vec<(String, String)>), std::io::Error> {
    use std::io::Read;
    let fs = fatfs::FileSystem::new(Cursor::new(image.to_vec()), fatfs::FsOptions::new())?;
    let label = fs.read_volume_label_from_root_dir()?.unwrap_or_default();
    let mut files = Vec::new();
    for entry in fs.root_dir().iter() {
        let entry = entry?;
        if entry.is_file() {
            let mut text = String::new();
            entry.to_file().read_to_string(&mut text)?;
            files.push((entry.file_name(), text));
        }
    }
    files.sort();
    Ok((label, files))
}
