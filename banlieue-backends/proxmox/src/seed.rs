//! The NoCloud seed of a machine with bootstrap data: an ISO 9660 image labelled
//! `cidata` (built by `banlieue-nocloud`) with `meta-data` (instance-id = the infra
//! object's UID), the bootstrap `user-data` verbatim and a `network-config`
//! (given, or made from the NICs' IPAM and MACs). It is uploaded to a storage
//! with `iso` content on the VM's node as `banlieue-<uid>-seed.iso` and attached as
//! a CD-ROM in the slot of the template's cloud-init drive (else `ide2`), so PVE's
//! own cloud-init drive never competes with it.

use banlieue_nocloud::{Interface, SeedFiles};
use banlieue_sdk::api::common::BootstrapFormat;
use banlieue_sdk::api::infra::proxmox::ProxmoxMachineSpec;
use banlieue_sdk::backend::{BackendError, BootstrapData, MachineIdentity};
use serde_json::Value;

use crate::config::vm_name;

/// The seed's file name on the storage.
pub fn file_name(uid: &str) -> String {
    format!("banlieue-{}-seed.iso", uid.to_ascii_lowercase())
}

/// The seed's volume ID on `storage`.
pub fn volid(storage: &str, uid: &str) -> String {
    format!("{storage}:iso/{}", file_name(uid))
}

/// The seed's files, `instance-id` = `instance_id` (the UID, or the one a copied
/// machine keeps). Ignition cannot travel on a NoCloud seed: terminal.
pub fn files(
    identity: &MachineIdentity,
    instance_id: &str,
    spec: &ProxmoxMachineSpec,
    bootstrap: &BootstrapData,
    macs: &[String],
) -> Result<SeedFiles, BackendError> {
    if bootstrap.format == BootstrapFormat::Ignition {
        return Err(BackendError::terminal(
            "UnsupportedBootstrapFormat",
            "the proxmox backend delivers bootstrap data as a NoCloud seed (cloud-config); Ignition is not supported",
        ));
    }
    let network_config = match &bootstrap.network_config {
        Some(given) => given.expose().to_string(),
        None => {
            let interfaces: Vec<Interface> = spec
                .network
                .iter()
                .zip(macs)
                .map(|(nic, mac)| banlieue_kit::nocloud::interface(mac, nic.mtu, &nic.ipam))
                .collect();
            banlieue_nocloud::network_config(&interfaces)
        }
    };
    Ok(SeedFiles {
        meta_data: banlieue_nocloud::meta_data(instance_id, &vm_name(identity)),
        user_data: bootstrap.user_data.expose().to_string(),
        network_config,
    })
}

/// The ISO image of the files.
pub fn image(files: &SeedFiles) -> Result<Vec<u8>, BackendError> {
    banlieue_nocloud::iso::image(banlieue_nocloud::LABEL, &files.entries())
        .map_err(|e| BackendError::terminal("SeedTooLarge", e.to_string()))
}

/// Reads a seed image back (label and files), for tests and diagnostics.
pub fn read(image: &[u8]) -> Result<banlieue_nocloud::iso::Contents, banlieue_nocloud::SeedError> {
    banlieue_nocloud::iso::read(image)
}

/// Drive keys a CD-ROM may take, in order of preference after the cloud-init slot.
const SLOTS: [&str; 10] = [
    "ide2", "ide3", "ide0", "ide1", "sata0", "sata1", "sata2", "sata3", "sata4", "sata5",
];

/// The drive key for the seed: the one already holding it, else the template's
/// cloud-init drive (replaced), else the first free IDE/SATA slot.
pub fn slot(current: &Value, uid: &str) -> Option<String> {
    let name = file_name(uid);
    let drives =
        || {
            current.as_object().into_iter().flatten().filter(|(k, _)| {
                k.starts_with("ide") || k.starts_with("sata") || k.starts_with("scsi")
            })
        };
    let value = |v: &Value| v.as_str().unwrap_or_default().to_string();
    if let Some((k, _)) = drives().find(|(_, v)| value(v).contains(&name)) {
        return Some(k.clone());
    }
    if let Some((k, _)) = drives().find(|(_, v)| {
        let first = value(v).split(',').next().unwrap_or_default().to_string();
        first.ends_with("-cloudinit") || first.ends_with(":cloudinit")
    }) {
        return Some(k.clone());
    }
    SLOTS
        .iter()
        .find(|k| current.get(**k).is_none())
        .map(|k| k.to_string())
}

/// The storage and volume ID of the seed a config references, if any.
pub fn attached(current: &Value, uid: &str) -> Option<(String, String)> {
    let name = file_name(uid);
    current.as_object()?.values().find_map(|v| {
        let first = v.as_str()?.split(',').next()?;
        let (storage, volume) = first.split_once(':')?;
        (volume == format!("iso/{name}")).then(|| (storage.to_string(), first.to_string()))
    })
}

/// The storage and volume ID of whichever banlieue seed the config references: a VM
/// adopted after `clusterctl move` keeps the seed named after the UID it was created
/// with.
pub fn attached_any(current: &Value) -> Option<(String, String)> {
    current.as_object()?.values().find_map(|v| {
        let first = v.as_str()?.split(',').next()?;
        let (storage, volume) = first.split_once(':')?;
        let file = volume.strip_prefix("iso/")?;
        (file.starts_with("banlieue-") && file.ends_with("-seed.iso"))
            .then(|| (storage.to_string(), first.to_string()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::macs;
    use banlieue_sdk::backend::SecretValue;
    use serde_json::json;

    #[test]
    fn an_adopted_vms_seed_is_found_whatever_uid_named_it() {
        let config = json!({"ide2": "local:iso/banlieue-0a1b-seed.iso,media=cdrom",
                            "scsi0": "local-lvm:vm-100-disk-0,size=8G",
                            "ide0": "local:iso/debian.iso,media=cdrom"});
        assert_eq!(
            attached_any(&config),
            Some(("local".into(), "local:iso/banlieue-0a1b-seed.iso".into()))
        );
        assert_eq!(attached(&config, UID), None, "not the new owner's name");
        assert_eq!(attached_any(&json!({"ide0": "local:iso/debian.iso"})), None);
    }

    const UID: &str = "5F0C8A52-3b7e-4c1d-9a8e-0123456789ab";

    fn spec() -> ProxmoxMachineSpec {
        serde_json::from_value(json!({"templateID": 9000, "cores": 1, "memoryMiB": 512,
            "network": [{"bridge": "vmbr0"},
                        {"bridge": "vmbr1", "mtu": 9000, "ipam": {"mode": "static",
                         "addresses": ["10.0.0.5/24"], "gateway": "10.0.0.1"}}]}))
        .unwrap()
    }

    fn identity() -> MachineIdentity {
        MachineIdentity {
            uid: UID.into(),
            namespace: "ns".into(),
            name: "web-1".into(),
            provider_id: None,
        }
    }

    #[test]
    fn files_carry_the_uid_the_user_data_and_a_network_config_by_mac() {
        let current = json!({"net0": "virtio=BC:24:11:0C:D5:C1,bridge=vmbr0"});
        let macs = macs(&spec(), UID, &current);
        assert_eq!(macs[0], "BC:24:11:0C:D5:C1");
        assert!(
            macs[1].starts_with("BC:24:11:") && macs[1].len() == 17,
            "{macs:?}"
        );
        assert_eq!(macs, crate::config::macs(&spec(), UID, &current), "stable");
        let bootstrap = BootstrapData {
            format: BootstrapFormat::CloudConfig,
            user_data: SecretValue::new("#cloud-config\nruncmd: [kubeadm join]\n"),
            network_config: None,
        };
        let files = files(&identity(), UID, &spec(), &bootstrap, &macs).unwrap();
        assert_eq!(
            files.meta_data,
            format!("instance-id: \"{UID}\"\nlocal-hostname: \"web-1\"\n")
        );
        assert_eq!(files.user_data, "#cloud-config\nruncmd: [kubeadm join]\n");
        assert!(
            files
                .network_config
                .contains("macaddress: \"bc:24:11:0c:d5:c1\"")
        );
        assert!(files.network_config.contains("mtu: 9000\n"));
        assert!(files.network_config.contains("via: \"10.0.0.1\""));
        let iso = image(&files).unwrap();
        let read = banlieue_nocloud::iso::read(&iso).unwrap();
        assert_eq!(read.label, "cidata");
        assert_eq!(read.files.len(), 3);

        let ignition = BootstrapData {
            format: BootstrapFormat::Ignition,
            ..bootstrap
        };
        let error = super::files(&identity(), UID, &spec(), &ignition, &macs).unwrap_err();
        assert_eq!(error.reason, "UnsupportedBootstrapFormat");
        assert!(!error.message.contains("kubeadm"));
    }

    #[test]
    fn the_seed_takes_the_cloud_init_slot_or_a_free_one() {
        let cloudinit = json!({"ide2": "local-lvm:vm-101-cloudinit,media=cdrom", "scsi0": "x"});
        assert_eq!(slot(&cloudinit, UID).as_deref(), Some("ide2"));
        let ide0 =
            json!({"ide0": "local-lvm:vm-101-cloudinit,media=cdrom", "ide2": "none,media=cdrom"});
        assert_eq!(slot(&ide0, UID).as_deref(), Some("ide0"));
        let busy = json!({"ide2": "local:iso/debian.iso,media=cdrom"});
        assert_eq!(slot(&busy, UID).as_deref(), Some("ide3"));
        let mine = json!({"sata1": format!("local:iso/{},media=cdrom", file_name(UID))});
        assert_eq!(slot(&mine, UID).as_deref(), Some("sata1"));
        assert_eq!(
            attached(&mine, UID),
            Some(("local".into(), format!("local:iso/{}", file_name(UID))))
        );
        assert_eq!(attached(&busy, UID), None);
        assert_eq!(
            volid("local", UID),
            "local:iso/banlieue-5f0c8a52-3b7e-4c1d-9a8e-0123456789ab-seed.iso"
        );
    }
}
