//! The NoCloud seed: `meta-data`, `user-data` and `network-config` on a vfat volume
//! labelled `cidata`, written in memory by `banlieue-nocloud` (no shell-out, no
//! temporary files).
//!
//! cloud-init's NoCloud datasource accepts a vfat or iso9660 file system with that
//! label; a vfat disk needs no CD-ROM device in the domain.

use banlieue_nocloud::Interface;
use banlieue_sdk::api::common::BootstrapFormat;
use banlieue_sdk::api::infra::libvirt::LibvirtMachineSpec;
use banlieue_sdk::backend::{BackendError, BootstrapData, MachineIdentity};

pub use banlieue_nocloud::{LABEL, SeedFiles, yaml_quote};

use crate::domain::macs;

/// The seed volume's size: FAT12, room for a large cloud-config.
pub const SEED_BYTES: usize = banlieue_nocloud::fat::IMAGE_BYTES;

/// The seed's files for a machine. `instance_id` is
/// [`MachineRequest::instance_id`](banlieue_sdk::backend::MachineRequest::instance_id):
/// the UID, so a redefined domain with the same UID is the same instance to
/// cloud-init, or the one a machine made on copied disks carries over, so its guest
/// does not run its first boot again.
pub fn files(
    identity: &MachineIdentity,
    instance_id: &str,
    spec: &LibvirtMachineSpec,
    bootstrap: Option<&BootstrapData>,
) -> Result<SeedFiles, BackendError> {
    let user_data = match bootstrap {
        None => banlieue_nocloud::EMPTY_USER_DATA.to_string(),
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
        meta_data: banlieue_nocloud::meta_data(instance_id, &identity.name),
        user_data,
        network_config,
    })
}

/// A version 2 network config matching each interface by MAC: DHCP, or the static
/// addresses, gateway and name servers of its IPAM.
pub fn network_config(uid: &str, spec: &LibvirtMachineSpec) -> String {
    let interfaces: Vec<Interface> = spec
        .network
        .iter()
        .zip(macs(uid, spec))
        .map(|(nic, mac)| banlieue_kit::nocloud::interface(&mac, nic.mtu, &nic.ipam))
        .collect();
    banlieue_nocloud::network_config(&interfaces)
}

/// A vfat image holding the files, labelled [`LABEL`] (in the boot sector and as a
/// root-directory volume entry, as mkfs.vfat does; blkid reads the latter first).
pub fn vfat_image(files: &SeedFiles) -> Result<Vec<u8>, BackendError> {
    banlieue_nocloud::fat::image(LABEL, &files.entries())
        .map_err(|e| BackendError::terminal("SeedTooLarge", e.to_string()))
}

/// Reads the files back from a seed image (for tests and diagnostics).
pub fn read_image(image: &[u8]) -> Result<(String, Vec<(String, String)>), std::io::Error> {
    let (label, files) = banlieue_nocloud::fat::read(image).map_err(std::io::Error::other)?;
    Ok((
        label,
        files
            .into_iter()
            .map(|(n, d)| (n, String::from_utf8_lossy(&d).into_owned()))
            .collect(),
    ))
}
