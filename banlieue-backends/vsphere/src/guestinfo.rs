//! `extraConfig` keys: banlieue's own markers and the guest's bootstrap data through
//! `guestinfo.*`, as cloud-init's VMware datasource and Ignition (Afterburn) read them.

use std::collections::BTreeMap;

use banlieue_sdk::api::common::BootstrapFormat;
use banlieue_sdk::backend::{BootstrapData, MachineIdentity};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

/// The key carrying the infra object's UID (set at clone time).
pub const UID_KEY: &str = "banlieue.uid";
/// The keys recording the namespace, kind and name of the object the VM was made for
/// (set at clone time): how a restored object, whose UID is new, finds it. (vcsim
/// does not keep a clone's notes, which also say it; a real vCenter does.)
pub const NAMESPACE_KEY: &str = "banlieue.namespace";
/// See [`NAMESPACE_KEY`].
pub const KIND_KEY: &str = "banlieue.kind";
/// See [`NAMESPACE_KEY`].
pub const NAME_KEY: &str = "banlieue.name";
/// The key naming the failure domain the VM was placed in.
pub const FAILURE_DOMAIN_KEY: &str = "banlieue.failureDomain";
/// Set by the reconfigure that delivers the bootstrap data: the VM is ready to boot.
pub const CONFIGURED_KEY: &str = "banlieue.configured";
/// The names of the additional disks banlieue added, by location (`<controller
/// key>:<unit>`, a JSON object): vSphere keeps no name for a disk, and an export
/// hands each disk out under the name it was made for.
pub const DISK_NAMES_KEY: &str = "banlieue.disks";

/// The [`DISK_NAMES_KEY`] value for `(location, name)` pairs.
pub fn disk_names_value(names: &[(String, String)]) -> String {
    let map: BTreeMap<&str, &str> = names
        .iter()
        .map(|(l, n)| (l.as_str(), n.as_str()))
        .collect();
    serde_json::to_string(&map).unwrap_or_default()
}

/// Reads a [`DISK_NAMES_KEY`] value; anything unreadable names nothing.
pub fn parse_disk_names(value: &str) -> BTreeMap<String, String> {
    serde_json::from_str(value).unwrap_or_default()
}

/// The keys set when the VM is cloned: its UID, the namespace, kind and name it was
/// made for, and its failure domain.
pub fn clone_keys(identity: &MachineIdentity, failure_domain: &str) -> Vec<(String, String)> {
    vec![
        (UID_KEY.into(), identity.uid.clone()),
        (NAMESPACE_KEY.into(), identity.namespace.clone()),
        (KIND_KEY.into(), "VSphereMachine".into()),
        (NAME_KEY.into(), identity.name.clone()),
        (FAILURE_DOMAIN_KEY.into(), failure_domain.into()),
    ]
}

/// cloud-init's metadata: instance ID, hostname, and the network config when there
/// is one. The instance ID is [`MachineRequest::instance_id`](banlieue_sdk::backend::MachineRequest::instance_id):
/// the UID, so a re-created VM re-runs cloud-init, except on disks copied from another
/// machine, which keep that one's so the guest does not boot for the first time again.
/// The bootstrap data's network config wins over `generated` (from static IPAM).
pub fn metadata(
    instance_id: &str,
    hostname: &str,
    bootstrap: Option<&BootstrapData>,
    generated: Option<&str>,
) -> String {
    let mut meta = serde_json::json!({
        "instance-id": instance_id,
        "local-hostname": hostname,
    });
    let network = bootstrap
        .and_then(|b| b.network_config.as_ref())
        .map(|n| n.expose())
        .or(generated);
    if let Some(network) = network {
        meta["network"] = STANDARD.encode(network).into();
        meta["network.encoding"] = "base64".into();
    }
    meta.to_string()
}

/// The keys the configuring reconfigure sets: bootstrap data (base64, with its
/// `.encoding`), metadata (with `instance_id`, see [`metadata`]), and
/// [`CONFIGURED_KEY`].
pub fn bootstrap_keys(
    instance_id: &str,
    hostname: &str,
    bootstrap: Option<&BootstrapData>,
    network: Option<&str>,
) -> Vec<(String, String)> {
    let mut keys = Vec::new();
    let encoded = |k: &str, v: &str| {
        [
            (k.to_string(), STANDARD.encode(v)),
            (format!("{k}.encoding"), "base64".to_string()),
        ]
    };
    keys.extend(encoded(
        "guestinfo.metadata",
        &metadata(instance_id, hostname, bootstrap, network),
    ));
    match bootstrap {
        Some(b) if b.format == BootstrapFormat::Ignition => {
            keys.extend(encoded(
                "guestinfo.ignition.config.data",
                b.user_data.expose(),
            ));
        }
        Some(b) => keys.extend(encoded("guestinfo.userdata", b.user_data.expose())),
        None => {}
    }
    keys.push((CONFIGURED_KEY.into(), "true".into()));
    keys
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_sdk::backend::SecretValue;

    fn id() -> MachineIdentity {
        MachineIdentity {
            uid: "7f1c2a5e-0000-4000-8000-000000000001".into(),
            namespace: "ns".into(),
            name: "web-1".into(),
            provider_id: None,
        }
    }

    fn decode(keys: &[(String, String)], key: &str) -> String {
        let v = &keys.iter().find(|(k, _)| k == key).unwrap().1;
        String::from_utf8(STANDARD.decode(v).unwrap()).unwrap()
    }

    #[test]
    fn cloud_config_goes_to_userdata_with_metadata() {
        let b = BootstrapData {
            format: BootstrapFormat::CloudConfig,
            user_data: SecretValue::new("#cloud-config\nhostname: web-1\n"),
            network_config: Some(SecretValue::new("version: 2\n")),
        };
        let keys = bootstrap_keys(&id().uid, "web-1", Some(&b), None);
        assert_eq!(
            decode(&keys, "guestinfo.userdata"),
            "#cloud-config\nhostname: web-1\n"
        );
        let meta: serde_json::Value =
            serde_json::from_str(&decode(&keys, "guestinfo.metadata")).unwrap();
        assert_eq!(meta["local-hostname"], "web-1");
        assert_eq!(meta["instance-id"], id().uid);
        assert_eq!(meta["network.encoding"], "base64");
        assert!(keys.contains(&("guestinfo.userdata.encoding".into(), "base64".into())));
        assert!(keys.contains(&(CONFIGURED_KEY.into(), "true".into())));
    }

    #[test]
    fn ignition_goes_to_its_own_key() {
        let b = BootstrapData {
            format: BootstrapFormat::Ignition,
            user_data: SecretValue::new("{\"ignition\":{\"version\":\"3.4.0\"}}"),
            network_config: None,
        };
        let keys = bootstrap_keys(&id().uid, "web-1", Some(&b), None);
        assert!(decode(&keys, "guestinfo.ignition.config.data").contains("3.4.0"));
        assert!(!keys.iter().any(|(k, _)| k == "guestinfo.userdata"));
    }

    #[test]
    fn a_copied_machine_keeps_the_instance_id_it_is_given() {
        let keys = bootstrap_keys("old-id", "web-1", None, None);
        let meta: serde_json::Value =
            serde_json::from_str(&decode(&keys, "guestinfo.metadata")).unwrap();
        assert_eq!(meta["instance-id"], "old-id");
    }

    #[test]
    fn disk_names_round_trip() {
        let names = [("1000:1".to_string(), "data".to_string())];
        let parsed = parse_disk_names(&disk_names_value(&names));
        assert_eq!(parsed.get("1000:1").map(String::as_str), Some("data"));
        assert!(parse_disk_names("not json").is_empty());
    }
}
