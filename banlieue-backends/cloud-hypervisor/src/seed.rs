//! The NoCloud seed: `meta-data`, `user-data` and `network-config` on a small FAT
//! image labelled `CIDATA`, attached read-only as the second disk. cloud-init finds it
//! by its label; no ISO tooling is needed on the host.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::Path;

use banlieue_sdk::api::common::{BootstrapFormat, IpamMode};
use banlieue_sdk::api::infra::cloud_hypervisor::CloudHypervisorNetworkInterface;
use banlieue_sdk::backend::{BackendError, BootstrapData, MachineIdentity};
use serde_json::{Value, json};

/// Seed image size: FAT12 comfortably holds bootstrap data of a few hundred KiB.
const IMAGE_BYTES: u64 = 4 << 20;

/// The seed's files for one machine.
pub fn files(
    identity: &MachineIdentity,
    bootstrap: Option<&BootstrapData>,
    interfaces: &[CloudHypervisorNetworkInterface],
    macs: &[String],
) -> Result<BTreeMap<String, Vec<u8>>, BackendError> {
    let mut files = BTreeMap::new();
    files.insert(
        "meta-data".to_owned(),
        format!(
            "instance-id: {}\nlocal-hostname: {}\n",
            identity.uid, identity.name
        )
        .into_bytes(),
    );
    let user_data = match bootstrap {
        Some(b) if b.format == BootstrapFormat::Ignition => {
            return Err(BackendError::terminal(
                "UnsupportedBootstrapFormat",
                "Cloud Hypervisor machines take cloud-config bootstrap data (NoCloud); Ignition has no channel here",
            ));
        }
        Some(b) => b.user_data.expose().as_bytes().to_vec(),
        None => b"#cloud-config\n{}\n".to_vec(),
    };
    files.insert("user-data".to_owned(), user_data);
    let network = match bootstrap.and_then(|b| b.network_config.as_ref()) {
        Some(given) => given.expose().as_bytes().to_vec(),
        None => network_config(interfaces, macs).to_string().into_bytes(),
    };
    files.insert("network-config".to_owned(), network);
    Ok(files)
}

/// cloud-init network config v2 (JSON is YAML) from the interfaces' IPAM, matched by MAC.
pub fn network_config(interfaces: &[CloudHypervisorNetworkInterface], macs: &[String]) -> Value {
    let mut ethernets = serde_json::Map::new();
    for (i, (nic, mac)) in interfaces.iter().zip(macs).enumerate() {
        let name = format!("eth{i}");
        let mut eth = json!({"match": {"macaddress": mac.to_ascii_lowercase()}, "set-name": name});
        if let Some(mtu) = nic.mtu {
            eth["mtu"] = json!(mtu);
        }
        match nic.ipam.mode {
            IpamMode::Static => {
                eth["addresses"] = json!(nic.ipam.addresses);
                if let Some(gw) = &nic.ipam.gateway {
                    eth["routes"] = json!([{"to": "default", "via": gw}]);
                }
                if !nic.ipam.nameservers.is_empty() {
                    eth["nameservers"] = json!({"addresses": nic.ipam.nameservers});
                }
            }
            // Pool addresses are not claimed by this backend yet: DHCP stands in.
            IpamMode::Dhcp | IpamMode::Pool => {
                eth["dhcp4"] = json!(true);
                eth["dhcp6"] = json!(false);
            }
        }
        ethernets.insert(name, eth);
    }
    json!({"version": 2, "ethernets": ethernets})
}

fn fat_error(path: &Path, e: std::io::Error) -> BackendError {
    BackendError::transient("SeedWriteFailed", format!("{}: {e}", path.display()))
}

/// Writes a FAT image labelled `CIDATA` holding `files` at `path`.
pub fn write_image(path: &Path, files: &BTreeMap<String, Vec<u8>>) -> Result<(), BackendError> {
    let err = |e| fat_error(path, e);
    let mut image = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(err)?;
    image.set_len(IMAGE_BYTES).map_err(err)?;
    fatfs::format_volume(
        &mut image,
        fatfs::FormatVolumeOptions::new()
            .volume_label(*b"CIDATA     ")
            .fat_type(fatfs::FatType::Fat12),
    )
    .map_err(err)?;
    let fs = fatfs::FileSystem::new(&mut image, fatfs::FsOptions::new()).map_err(err)?;
    for (name, content) in files {
        let mut file = fs.root_dir().create_file(name).map_err(err)?;
        file.truncate().map_err(err)?;
        file.write_all(content).map_err(err)?;
        file.flush().map_err(err)?;
    }
    fs.unmount().map_err(err)?;
    Ok(())
}

/// Reads a seed image back: its label and files (for tests and diagnostics).
pub fn read_image(path: &Path) -> std::io::Result<(String, BTreeMap<String, Vec<u8>>)> {
    let mut image = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)?;
    let fs = fatfs::FileSystem::new(&mut image, fatfs::FsOptions::new())?;
    let label = fs.volume_label().trim().to_owned();
    let mut files = BTreeMap::new();
    for entry in fs.root_dir().iter() {
        let entry = entry?;
        if entry.is_file() {
            let mut content = Vec::new();
            entry.to_file().read_to_end(&mut content)?;
            files.insert(entry.file_name(), content);
        }
    }
    Ok((label, files))
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_sdk::api::common::Ipam;

    #[test]
    fn writes_a_cidata_image_cloud_init_can_read() {
        let dir = tempfile::tempdir().unwrap();
        let identity = MachineIdentity {
            uid: "u-1".into(),
            namespace: "ns".into(),
            name: "web-1".into(),
        };
        let bootstrap = BootstrapData {
            format: BootstrapFormat::CloudConfig,
            user_data: "#cloud-config\nruncmd: [echo hi]\n".into(),
            network_config: None,
        };
        let nics = vec![CloudHypervisorNetworkInterface {
            ipam: Ipam {
                mode: IpamMode::Static,
                addresses: vec!["10.0.0.5/24".into()],
                gateway: Some("10.0.0.1".into()),
                ..Default::default()
            },
            ..Default::default()
        }];
        let files = files(
            &identity,
            Some(&bootstrap),
            &nics,
            &["52:54:00:AA:BB:CC".into()],
        )
        .unwrap();
        let path = dir.path().join("seed.img");
        write_image(&path, &files).unwrap();
        let (label, read) = read_image(&path).unwrap();
        assert_eq!(label, "CIDATA");
        assert_eq!(read, files);
        assert_eq!(
            read["meta-data"],
            b"instance-id: u-1\nlocal-hostname: web-1\n"
        );
        let net: Value = serde_json::from_slice(&read["network-config"]).unwrap();
        assert_eq!(net["ethernets"]["eth0"]["addresses"][0], "10.0.0.5/24");
        assert_eq!(
            net["ethernets"]["eth0"]["match"]["macaddress"],
            "52:54:00:aa:bb:cc"
        );
        let ignition = BootstrapData {
            format: BootstrapFormat::Ignition,
            ..bootstrap
        };
        assert_eq!(
            super::files(&identity, Some(&ignition), &[], &[])
                .unwrap_err()
                .reason,
            "UnsupportedBootstrapFormat"
        );
    }
}
