//! The NoCloud seed: `meta-data`, `user-data` and `network-config` on a small FAT
//! image labelled `CIDATA`, attached read-only as the second disk. cloud-init finds it
//! by its label; no ISO tooling is needed on the host.

use std::collections::BTreeMap;
use std::path::Path;

use banlieue_sdk::api::common::{BootstrapFormat, IpamMode};
use banlieue_sdk::api::infra::cloud_hypervisor::CloudHypervisorNetworkInterface;
use banlieue_sdk::backend::{BackendError, BootstrapData, MachineIdentity};
use serde_json::{Value, json};

/// The seed's file-system label (NoCloud matches it in either case).
const LABEL: &str = "CIDATA";

/// The seed's files for one machine. `instance_id` is
/// [`MachineRequest::instance_id`](banlieue_sdk::backend::MachineRequest::instance_id):
/// the UID, or the one a machine made on copied disks carries over so its guest does
/// not run its first boot again.
pub fn files(
    identity: &MachineIdentity,
    instance_id: &str,
    bootstrap: Option<&BootstrapData>,
    interfaces: &[CloudHypervisorNetworkInterface],
    macs: &[String],
) -> Result<BTreeMap<String, Vec<u8>>, BackendError> {
    let mut files = BTreeMap::new();
    files.insert(
        "meta-data".to_owned(),
        // Plain scalars (UIDs and DNS names need no quoting), as the e2e tests read them.
        format!(
            "instance-id: {}\nlocal-hostname: {}\n",
            scalar(instance_id),
            identity.name
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
        None => banlieue_nocloud::EMPTY_USER_DATA.as_bytes().to_vec(),
    };
    files.insert("user-data".to_owned(), user_data);
    let network = match bootstrap.and_then(|b| b.network_config.as_ref()) {
        Some(given) => given.expose().as_bytes().to_vec(),
        None => network_config(interfaces, macs).to_string().into_bytes(),
    };
    files.insert("network-config".to_owned(), network);
    Ok(files)
}

/// `value` as a plain YAML scalar when it is a UID-like token, else quoted: a
/// carried-over instance ID comes from an annotation and must not add keys.
fn scalar(value: &str) -> String {
    let plain = !value.is_empty()
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'));
    if plain {
        value.to_owned()
    } else {
        banlieue_nocloud::yaml_quote(value)
    }
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

fn fat_error(path: &Path, e: impl std::fmt::Display) -> BackendError {
    BackendError::transient("SeedWriteFailed", format!("{}: {e}", path.display()))
}

/// Writes a FAT image labelled `CIDATA` holding `files` at `path` (built in memory
/// by `banlieue-nocloud`).
pub fn write_image(path: &Path, files: &BTreeMap<String, Vec<u8>>) -> Result<(), BackendError> {
    let entries: Vec<(&str, &[u8])> = files
        .iter()
        .map(|(name, data)| (name.as_str(), data.as_slice()))
        .collect();
    let image = banlieue_nocloud::fat::image(LABEL, &entries).map_err(|e| match e {
        banlieue_nocloud::SeedError::TooLarge(_) => {
            BackendError::terminal("SeedTooLarge", e.to_string())
        }
        other => fat_error(path, other),
    })?;
    std::fs::write(path, image).map_err(|e| fat_error(path, e))
}

/// Reads a seed image back: its label and files (for tests and diagnostics).
pub fn read_image(path: &Path) -> std::io::Result<(String, BTreeMap<String, Vec<u8>>)> {
    let image = std::fs::read(path)?;
    let (label, files) = banlieue_nocloud::fat::read(&image).map_err(std::io::Error::other)?;
    Ok((label.trim().to_owned(), files.into_iter().collect()))
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
            provider_id: None,
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
            "u-1",
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
        let odd = super::files(&identity, "a\nb: c", None, &[], &[]).unwrap();
        assert_eq!(
            odd["meta-data"],
            b"instance-id: \"a\\nb: c\"\nlocal-hostname: web-1\n"
        );
        let ignition = BootstrapData {
            format: BootstrapFormat::Ignition,
            ..bootstrap
        };
        assert_eq!(
            super::files(&identity, "u-1", Some(&ignition), &[], &[])
                .unwrap_err()
                .reason,
            "UnsupportedBootstrapFormat"
        );
    }
}
