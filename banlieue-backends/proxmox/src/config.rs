//! Building a VM's `qm` config from a `ProxmoxMachineSpec`: CPU, memory, firmware,
//! NICs, cloud-init keys, disks, and the tags and description that carry the infra
//! object's UID.

use banlieue_sdk::api::common::{Firmware, IpamMode};
use banlieue_sdk::api::infra::MachineDisk;
use banlieue_sdk::api::infra::proxmox::{ProxmoxMachineSpec, ProxmoxNicModel};
use banlieue_sdk::backend::{BootstrapData, MachineIdentity};
use serde_json::Value;

use crate::client::{Form, encode};

/// The tag every banlieue VM carries.
pub const MANAGED_TAG: &str = "banlieue";

/// The tag carrying the infra object's UID; it is set by the same config write as
/// the rest, so its presence means "configured".
pub fn uid_tag(uid: &str) -> String {
    format!("banlieue-{}", uid.to_ascii_lowercase())
}

/// The description line carrying the UID (set at clone time, before any tag).
pub fn uid_marker(uid: &str) -> String {
    format!("banlieue.io/uid: {uid}")
}

/// The description of a banlieue VM: [`made_for_marker`], then [`uid_marker`].
pub fn description(identity: &MachineIdentity) -> String {
    format!(
        "{} do not edit the next line.\n{}\n",
        made_for_marker(identity),
        uid_marker(&identity.uid)
    )
}

/// What a banlieue VM's description says about the object it was made for (its
/// namespace and name; the kind is `ProxmoxMachine`): how a restored object with a new
/// UID finds it. Unchanged since the first release, so older VMs are found too.
pub fn made_for_marker(identity: &MachineIdentity) -> String {
    format!(
        "Managed by banlieue ({}/{});",
        identity.namespace, identity.name
    )
}

/// The UID a description's [`uid_marker`] line records.
pub fn recorded_uid(description: &str) -> Option<String> {
    description.lines().find_map(|line| {
        line.trim()
            .strip_prefix(&uid_marker(""))
            .map(|uid| uid.trim().to_owned())
            .filter(|uid| !uid.is_empty())
    })
}

/// A valid PVE VM name (a DNS name, at most 63 characters) from the object's name.
pub fn vm_name(identity: &MachineIdentity) -> String {
    let mut name: String = identity
        .name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    while name.ends_with(['-', '.']) {
        name.pop();
    }
    if name.is_empty() || !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        name.insert(0, 'm');
    }
    name
}

/// Splits PVE's `tags` (`a;b c,d`) into a list.
pub fn split_tags(tags: &str) -> Vec<String> {
    tags.split([';', ',', ' '])
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .collect()
}

/// The tags and description that make a VM found by its provider ID (after
/// `clusterctl move` or a restore: a new UID) carry its new owner's UID: every other
/// UID tag is dropped, the rest of the tags kept.
pub fn adoption(identity: &MachineIdentity, current: &Value) -> Form {
    let mut tags: Vec<String> = current
        .get("tags")
        .and_then(Value::as_str)
        .map(split_tags)
        .unwrap_or_default()
        .into_iter()
        .filter(|t| !(t.starts_with("banlieue-") && is_uuid(&t["banlieue-".len()..])))
        .collect();
    for tag in [MANAGED_TAG.to_string(), uid_tag(&identity.uid)] {
        if !tags.contains(&tag) {
            tags.push(tag);
        }
    }
    Form::new()
        .set("tags", tags.join(";"))
        .set("description", description(identity))
}

/// True when the tags (as `/cluster/resources` shows them) carry the UID tag.
pub fn has_uid_tag(tags: Option<&str>, uid: &str) -> bool {
    let want = uid_tag(uid);
    tags.is_some_and(|t| split_tags(t).contains(&want))
}

/// A value of a PVE property string (`key=value,key=value`), by key.
pub fn property<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.split(',').find_map(|part| {
        let (k, v) = part.split_once('=')?;
        (k.trim() == key).then_some(v.trim())
    })
}

/// The SMBIOS UUID in a config's `smbios1`.
pub fn smbios_uuid(config: &Value) -> Option<String> {
    config
        .get("smbios1")
        .and_then(Value::as_str)
        .and_then(|s| property(s, "uuid"))
        .map(str::to_ascii_lowercase)
}

fn is_uuid(text: &str) -> bool {
    let groups: Vec<&str> = text.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.chars().all(|c| c.is_ascii_hexdigit()))
}

/// `smbios1` with its UUID set to the infra object's UID (a Kubernetes UID is a
/// UUID), keeping the template's other fields. So `proxmox://<uuid>` is stable and
/// known before the VM first boots. `None` when the UID is not a UUID.
pub fn smbios1(current: Option<&str>, uid: &str) -> Option<String> {
    if !is_uuid(uid) {
        return None;
    }
    let mut parts: Vec<String> = current
        .unwrap_or_default()
        .split(',')
        .filter(|p| !p.is_empty() && !p.starts_with("uuid="))
        .map(str::to_string)
        .collect();
    parts.insert(0, format!("uuid={}", uid.to_ascii_lowercase()));
    Some(parts.join(","))
}

/// `sshkeys` as PVE wants it: the newline-separated keys percent-encoded, inside a
/// form value that is itself encoded again on the wire.
pub fn sshkeys_value(keys: &[String]) -> String {
    encode(&keys.join("\n"))
}

/// The SSH keys of a cloud-config (`ssh_authorized_keys`, top level and of each
/// user), so PVE's own cloud-init drive installs them.
pub fn cloud_config_ssh_keys(bootstrap: &BootstrapData) -> Vec<String> {
    let text = bootstrap.user_data.expose();
    let Ok(doc) = serde_saphyr::from_str::<Value>(text) else {
        return Vec::new();
    };
    let mut keys = Vec::new();
    let mut take = |v: Option<&Value>| {
        for key in v.and_then(Value::as_array).into_iter().flatten() {
            if let Some(k) = key.as_str() {
                let k = k.trim().to_string();
                if !k.is_empty() && !keys.contains(&k) {
                    keys.push(k);
                }
            }
        }
    };
    take(doc.get("ssh_authorized_keys"));
    for user in doc
        .get("users")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        take(user.get("ssh_authorized_keys"));
    }
    keys
}

fn nic_model(model: ProxmoxNicModel) -> &'static str {
    match model {
        ProxmoxNicModel::Virtio => "virtio",
        ProxmoxNicModel::E1000 => "e1000",
        ProxmoxNicModel::Vmxnet3 => "vmxnet3",
        ProxmoxNicModel::Rtl8139 => "rtl8139",
    }
}

/// Where the NoCloud seed goes: the drive key and the volume ID.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeedDrive {
    /// `ide2`, `sata0`, ...
    pub key: String,
    /// `<storage>:iso/<name>.iso`.
    pub volid: String,
}

/// The config written once after the clone (`PUT …/config`), given the clone's
/// current config. The UID tag it sets marks the VM as configured. With a `seed`,
/// the bootstrap data travels on it and PVE's own cloud-init keys carry only the
/// addresses; without one, `sshkeys` are taken from the cloud-config.
pub fn machine_config(
    spec: &ProxmoxMachineSpec,
    identity: &MachineIdentity,
    bootstrap: Option<&BootstrapData>,
    seed: Option<&SeedDrive>,
    current: &Value,
) -> Form {
    let text = |key: &str| current.get(key).and_then(Value::as_str);
    let mut form = Form::new()
        .set("name", vm_name(identity))
        .set("sockets", spec.sockets)
        .set("cores", spec.cores)
        .set("memory", spec.memory_mib)
        .set("agent", "1")
        .set("description", description(identity));
    match spec.firmware {
        Some(Firmware::Bios) => form.push("bios", "seabios"),
        Some(Firmware::Efi | Firmware::EfiSecure) => form.push("bios", "ovmf"),
        None => {}
    }
    if let Some(efidisk) = secure_boot_efidisk(spec, current) {
        form.push("efidisk0", efidisk);
    }
    if let Some(smbios) = smbios1(text("smbios1"), &identity.uid) {
        form.push("smbios1", smbios);
    }
    let mut tags = text("tags").map(split_tags).unwrap_or_default();
    for tag in [MANAGED_TAG.to_string(), uid_tag(&identity.uid)] {
        if !tags.contains(&tag) {
            tags.push(tag);
        }
    }
    form.push("tags", tags.join(";"));

    let mut nameservers: Vec<String> = Vec::new();
    let macs = macs(spec, &identity.uid, current);
    for (i, (nic, mac)) in spec.network.iter().zip(&macs).enumerate() {
        let key = format!("net{i}");
        let model = nic_model(nic.model);
        let mut value = format!("{model}={mac}");
        value.push_str(&format!(",bridge={}", nic.bridge));
        if let Some(vlan) = nic.vlan {
            value.push_str(&format!(",tag={vlan}"));
        }
        if let Some(mtu) = nic.mtu {
            value.push_str(&format!(",mtu={mtu}"));
        }
        form.push(key, value);
        let ipconfig = match nic.ipam.mode {
            IpamMode::Dhcp => Some("ip=dhcp".to_string()),
            IpamMode::Static => {
                let mut parts = Vec::new();
                let v4 = nic.ipam.addresses.iter().find(|a| !a.contains(':'));
                let v6 = nic.ipam.addresses.iter().find(|a| a.contains(':'));
                let gw = nic.ipam.gateway.as_deref();
                if let Some(a) = v4 {
                    parts.push(format!("ip={a}"));
                    if let Some(gw) = gw.filter(|g| !g.contains(':')) {
                        parts.push(format!("gw={gw}"));
                    }
                }
                if let Some(a) = v6 {
                    parts.push(format!("ip6={a}"));
                    if let Some(gw) = gw.filter(|g| g.contains(':')) {
                        parts.push(format!("gw6={gw}"));
                    }
                }
                for ns in &nic.ipam.nameservers {
                    if !nameservers.contains(ns) {
                        nameservers.push(ns.clone());
                    }
                }
                (!parts.is_empty()).then(|| parts.join(","))
            }
            // Pool addresses are claimed by the operator; until then, nothing.
            IpamMode::Pool => None,
        };
        if let Some(ipconfig) = ipconfig {
            form.push(format!("ipconfig{i}"), ipconfig);
        }
    }
    if !nameservers.is_empty() {
        form.push("nameserver", nameservers.join(" "));
    }
    if let Some(seed) = seed {
        form.push(&seed.key, format!("{},media=cdrom", seed.volid));
    } else if let Some(bootstrap) = bootstrap {
        let keys = cloud_config_ssh_keys(bootstrap);
        if !keys.is_empty() {
            form.push("sshkeys", sshkeys_value(&keys));
        }
    }
    push_new_disks(spec, current, &mut form);
    form
}

/// Secure Boot on OVMF: an EFI vars disk with the distribution and Microsoft keys
/// enrolled (`efidisk0: <storage>:1,efitype=4m,pre-enrolled-keys=1`, allocated by PVE
/// on the spec's storage, else the boot disk's), for `efi-secure` when the VM has no
/// `efidisk0` yet. One it has is kept (it holds the guest's EFI variables).
pub fn secure_boot_efidisk(spec: &ProxmoxMachineSpec, current: &Value) -> Option<String> {
    if spec.firmware != Some(Firmware::EfiSecure) || current.get("efidisk0").is_some() {
        return None;
    }
    let storage = boot_storage(spec, current)?;
    Some(format!("{storage}:1,efitype=4m,pre-enrolled-keys=1"))
}

/// The storage of the boot disk (`scsi0`): the spec's, else the one `scsi0` is on in
/// `current` (the clone's config, or the template's before the clone: a clone's
/// disks stay on the template's storage unless the spec names one).
pub fn boot_storage(spec: &ProxmoxMachineSpec, current: &Value) -> Option<String> {
    spec.storage.clone().or_else(|| {
        current
            .get("scsi0")
            .and_then(Value::as_str)
            .and_then(|d| d.split(':').next())
            .map(str::to_string)
    })
}

/// An additional disk the VM lacks, which PVE allocates when the config is written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewDisk<'a> {
    /// Its index in `additionalDisks`.
    pub index: usize,
    /// Its drive key, `scsi<index+1>`.
    pub key: String,
    /// The disk the spec asks.
    pub disk: &'a MachineDisk,
    /// The storage it goes to: its own, else the spec's, else the boot disk's; `None`
    /// when none of these names one.
    pub storage: Option<String>,
}

/// The additional disks `current` has no drive for (all of them before the clone:
/// pass `Value::Null`), each with the storage it goes to.
pub fn new_disks<'a>(spec: &'a ProxmoxMachineSpec, current: &Value) -> Vec<NewDisk<'a>> {
    let boot = boot_storage(spec, current);
    spec.additional_disks
        .iter()
        .enumerate()
        .map(|(index, disk)| NewDisk {
            index,
            key: format!("scsi{}", index + 1),
            disk,
            storage: disk.storage.clone().or_else(|| boot.clone()),
        })
        .filter(|d| current.get(&d.key).is_none())
        .collect()
}

/// Adds `scsi<i+1>: <storage>:<GiB>` for each additional disk the VM lacks (PVE
/// allocates it), on the disk's storage, else the spec's, else the boot disk's. A
/// disk with no storage at all, or asking a provisioning its storage does not give,
/// is refused before this is written ([`crate::provisioning::check`]).
pub fn push_new_disks(spec: &ProxmoxMachineSpec, current: &Value, form: &mut Form) {
    for new in new_disks(spec, current) {
        if let Some(storage) = new.storage {
            form.push(new.key, format!("{storage}:{}", new.disk.size_gib));
        }
    }
}

/// A size in PVE's notation (`4G`, `512M`, `1T`, `10737418240`) in bytes.
pub fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let (number, unit) = match text.char_indices().last()? {
        (i, c) if c.is_ascii_alphabetic() => (&text[..i], c.to_ascii_uppercase()),
        _ => (text, 'B'),
    };
    let value: f64 = number.parse().ok()?;
    let factor: u64 = match unit {
        'B' => 1,
        'K' => 1 << 10,
        'M' => 1 << 20,
        'G' => 1 << 30,
        'T' => 1 << 40,
        _ => return None,
    };
    Some((value * factor as f64) as u64)
}

/// `PUT …/resize` for the first disk the spec wants larger than it is: the boot
/// disk (`scsi0`, `diskGiB`), then the additional disks (`scsi1`, ...). Disks never
/// shrink; a disk PVE has not allocated yet (no `size=`) is left alone.
pub fn disk_resize(spec: &ProxmoxMachineSpec, current: &Value) -> Option<Form> {
    disk_resizes(spec, current, true, true).into_iter().next()
}

/// Every `PUT …/resize` [`disk_resize`] would make one after the other, looking at the
/// boot disk only when `os`, at the additional disks only when `data`.
pub fn disk_resizes(spec: &ProxmoxMachineSpec, current: &Value, os: bool, data: bool) -> Vec<Form> {
    let boot = os.then_some(("scsi0".to_string(), spec.disk_gib));
    let additional = spec
        .additional_disks
        .iter()
        .enumerate()
        .filter(|_| data)
        .map(|(i, d)| (format!("scsi{}", i + 1), Some(d.size_gib)));
    let mut out = Vec::new();
    for (key, gib) in boot.into_iter().chain(additional) {
        let Some(gib) = gib else { continue };
        let Some(disk) = current.get(&key).and_then(Value::as_str) else {
            continue;
        };
        let Some(have) = property(disk, "size").and_then(parse_size) else {
            continue;
        };
        if u64::from(gib) << 30 > have {
            out.push(Form::new().set("disk", key).set("size", format!("{gib}G")));
        }
    }
    out
}

/// The MAC of a current `netN` value (`virtio=BC:24:11:..,bridge=..`).
pub fn current_mac(current: Option<&str>) -> Option<&str> {
    let first = current?.split(',').next()?;
    let (_, mac) = first.split_once('=')?;
    (mac.len() == 17).then_some(mac)
}

/// FNV-1a, for stable MACs.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The MAC of each NIC, upper case as PVE writes them: the spec's, else the one
/// the clone carries, else one derived from the UID in Proxmox's `BC:24:11` range
/// (so the network config can match it before PVE ever sees the NIC).
pub fn macs(spec: &ProxmoxMachineSpec, uid: &str, current: &Value) -> Vec<String> {
    spec.network
        .iter()
        .enumerate()
        .map(|(i, nic)| {
            let key = format!("net{i}");
            if let Some(mac) = nic
                .mac_address
                .as_deref()
                .or_else(|| current_mac(current.get(&key).and_then(Value::as_str)))
            {
                return mac.to_ascii_uppercase();
            }
            let h = fnv(format!("{uid}/{i}").as_bytes()).to_be_bytes();
            format!("BC:24:11:{:02X}:{:02X}:{:02X}", h[0], h[1], h[2])
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_sdk::api::common::BootstrapFormat;
    use banlieue_sdk::backend::SecretValue;
    use serde_json::json;

    const UID: &str = "5f0c8a52-3b7e-4c1d-9a8e-0123456789ab";

    fn identity() -> MachineIdentity {
        MachineIdentity {
            uid: UID.into(),
            namespace: "demo".into(),
            name: "Web_1".into(),
            provider_id: None,
        }
    }

    #[test]
    fn the_description_records_the_namespace_name_and_uid_found_on_restore() {
        let description = description(&identity());
        // Unchanged since the first release: older VMs are found by it.
        assert_eq!(
            description,
            format!(
                "Managed by banlieue (demo/Web_1); do not edit the next line.\nbanlieue.io/uid: {UID}\n"
            )
        );
        assert!(description.contains(&made_for_marker(&identity())));
        let other = MachineIdentity {
            name: "Web".into(),
            ..identity()
        };
        assert!(!description.contains(&made_for_marker(&other)));
        assert_eq!(recorded_uid(&description).as_deref(), Some(UID));
        assert_eq!(recorded_uid("edited by hand"), None);
    }

    fn spec(extra: Value) -> ProxmoxMachineSpec {
        let mut base = json!({"templateID": 9000, "cores": 2, "sockets": 1, "memoryMiB": 2048});
        for (k, v) in extra.as_object().unwrap() {
            base[k] = v.clone();
        }
        serde_json::from_value(base).unwrap()
    }

    fn golden_config() -> Value {
        let path = format!("{}/tests/golden/vm_config.json", env!("CARGO_MANIFEST_DIR"));
        crate::client::parse(200, "OK", &std::fs::read(path).unwrap()).unwrap()
    }

    #[test]
    fn builds_cpu_memory_nics_tags_and_smbios() {
        let spec = spec(json!({
            "firmware": "efi",
            "network": [
                {"bridge": "vmbr0"},
                {"bridge": "vmbr1", "vlan": 42, "model": "e1000", "mtu": 9000,
                 "macAddress": "bc:24:11:aa:bb:cc",
                 "ipam": {"mode": "static", "addresses": ["10.0.0.5/24", "fd00::5/64"],
                          "gateway": "10.0.0.1", "nameservers": ["10.0.0.2", "10.0.0.3"]}}
            ]
        }));
        let form = machine_config(&spec, &identity(), None, None, &golden_config());
        let get = |k: &str| form.get(k).map(str::to_string);
        assert_eq!(get("name").as_deref(), Some("web-1"));
        assert_eq!(get("cores").as_deref(), Some("2"));
        assert_eq!(get("sockets").as_deref(), Some("1"));
        assert_eq!(get("memory").as_deref(), Some("2048"));
        assert_eq!(get("agent").as_deref(), Some("1"));
        assert_eq!(get("bios").as_deref(), Some("ovmf"));
        // net0 keeps the MAC PVE gave the clone.
        assert_eq!(
            get("net0").as_deref(),
            Some("virtio=BC:24:11:0C:D5:C1,bridge=vmbr0")
        );
        assert_eq!(
            get("net1").as_deref(),
            Some("e1000=BC:24:11:AA:BB:CC,bridge=vmbr1,tag=42,mtu=9000")
        );
        assert_eq!(get("ipconfig0").as_deref(), Some("ip=dhcp"));
        assert_eq!(
            get("ipconfig1").as_deref(),
            Some("ip=10.0.0.5/24,gw=10.0.0.1,ip6=fd00::5/64")
        );
        assert_eq!(get("nameserver").as_deref(), Some("10.0.0.2 10.0.0.3"));
        assert_eq!(get("smbios1"), Some(format!("uuid={UID}")));
        assert_eq!(get("tags"), Some(format!("banlieue;banlieue-{UID}")));
        assert!(get("description").unwrap().contains(&uid_marker(UID)));
        assert!(get("sshkeys").is_none());
    }

    #[test]
    fn smbios_keeps_other_fields_and_needs_a_uuid() {
        assert_eq!(
            smbios1(Some("uuid=0000,manufacturer=QkVN,base64=1"), UID).unwrap(),
            format!("uuid={UID},manufacturer=QkVN,base64=1")
        );
        assert!(smbios1(None, "not-a-uuid").is_none());
        assert_eq!(
            smbios_uuid(&json!({"smbios1": "uuid=ABCD,x=1"})).as_deref(),
            Some("abcd")
        );
    }

    #[test]
    fn sshkeys_are_percent_encoded_then_form_encoded_again() {
        let bootstrap = BootstrapData {
            format: BootstrapFormat::CloudConfig,
            user_data: SecretValue::new(
                "#cloud-config\nssh_authorized_keys:\n  - ssh-ed25519 AAAAC3Nza+/x= me@host\nusers:\n  - name: capi\n    ssh_authorized_keys: [\"ssh-rsa AAAAB3 ops\"]\n",
            ),
            network_config: None,
        };
        let form = machine_config(
            &spec(json!({})),
            &identity(),
            Some(&bootstrap),
            None,
            &json!({}),
        );
        let value = form.get("sshkeys").unwrap();
        assert_eq!(
            value,
            "ssh-ed25519%20AAAAC3Nza%2B%2Fx%3D%20me%40host%0Assh-rsa%20AAAAB3%20ops"
        );
        // On the wire the value is encoded once more: `%` becomes `%25`.
        let wire = Form::new().set("sshkeys", value).encode();
        assert!(
            wire.starts_with("sshkeys=ssh-ed25519%2520AAAAC3Nza%252B%252Fx%253D"),
            "{wire}"
        );
    }

    #[test]
    fn a_seed_takes_its_slot_and_replaces_sshkeys() {
        let bootstrap = BootstrapData {
            format: BootstrapFormat::CloudConfig,
            user_data: SecretValue::new("#cloud-config\nssh_authorized_keys: [\"ssh-rsa K\"]\n"),
            network_config: None,
        };
        let seed = SeedDrive {
            key: "ide2".into(),
            volid: "local:iso/banlieue-x-seed.iso".into(),
        };
        let form = machine_config(
            &spec(json!({})),
            &identity(),
            Some(&bootstrap),
            Some(&seed),
            &golden_config(),
        );
        assert_eq!(
            form.get("ide2"),
            Some("local:iso/banlieue-x-seed.iso,media=cdrom")
        );
        assert!(form.get("sshkeys").is_none());
        assert!(!format!("{form:?}").contains("ssh-rsa"));
    }

    #[test]
    fn adoption_swaps_the_uid_tag_and_keeps_the_others() {
        let old = "0a1b2c3d-0000-4000-8000-00000000000a";
        let current = json!({"tags": format!("os;banlieue;banlieue-{old};prod"),
                             "description": description(&MachineIdentity::new(old, "ns", "m"))});
        let form = adoption(&identity(), &current);
        let get = |k: &str| form.get(k).map(str::to_string);
        assert_eq!(
            get("tags"),
            Some(format!(
                "os;banlieue;prod;banlieue-{}",
                UID.to_ascii_lowercase()
            ))
        );
        let description = get("description").unwrap();
        assert!(description.contains(&uid_marker(UID)), "{description}");
        assert!(!description.contains(old), "{description}");
    }

    #[test]
    fn template_tags_are_kept_and_uid_tag_found() {
        let form = machine_config(
            &spec(json!({})),
            &identity(),
            None,
            None,
            &json!({"tags": "os;prod"}),
        );
        assert_eq!(
            form.get("tags").unwrap(),
            format!("os;prod;banlieue;banlieue-{UID}")
        );
        assert!(has_uid_tag(Some(&format!("banlieue;banlieue-{UID}")), UID));
        assert!(!has_uid_tag(Some("banlieue"), UID));
        assert!(!has_uid_tag(None, UID));
    }

    #[test]
    fn additional_disks_and_resize() {
        let spec = spec(json!({"diskGiB": 20, "storage": "fast",
            "additionalDisks": [{"name": "data", "sizeGiB": 50}, {"name": "logs", "sizeGiB": 5, "storage": "slow"}]}));
        let form = machine_config(&spec, &identity(), None, None, &golden_config());
        assert_eq!(form.get("scsi1"), Some("fast:50"));
        assert_eq!(form.get("scsi2"), Some("slow:5"));
        let resize = disk_resize(&spec, &golden_config()).unwrap();
        assert_eq!(resize.encode(), "disk=scsi0&size=20G");
        let small = super::tests::spec(json!({"diskGiB": 4}));
        assert!(disk_resize(&small, &golden_config()).is_none());
        // Then the additional disks, once allocated.
        let grown = super::tests::spec(json!({"diskGiB": 4,
            "additionalDisks": [{"name": "data", "sizeGiB": 8}]}));
        let mut config = golden_config();
        assert!(
            disk_resize(&grown, &config).is_none(),
            "scsi1 not allocated yet"
        );
        config["scsi1"] = json!("fast:vm-100-disk-1,size=5G");
        assert_eq!(
            disk_resize(&grown, &config).unwrap().encode(),
            "disk=scsi1&size=8G"
        );
        assert_eq!(parse_size("512M"), Some(512 << 20));
        assert_eq!(parse_size("1.5G"), Some(3 << 29));
        assert_eq!(parse_size("1024"), Some(1024));
    }

    #[test]
    fn secure_boot_adds_an_enrolled_efidisk_once() {
        let current = golden_config();
        let secure = spec(json!({"firmware": "efi-secure"}));
        let form = machine_config(&secure, &identity(), None, None, &current);
        assert_eq!(form.get("bios"), Some("ovmf"));
        let efidisk = form.get("efidisk0").expect("an efidisk0").to_string();
        assert!(
            efidisk.ends_with(":1,efitype=4m,pre-enrolled-keys=1"),
            "{efidisk}"
        );
        let mut has = current.clone();
        has["efidisk0"] = json!("local-lvm:vm-101-disk-9,efitype=4m,size=528K");
        assert_eq!(secure_boot_efidisk(&secure, &has), None, "kept once there");
        let plain = spec(json!({"firmware": "efi"}));
        assert_eq!(secure_boot_efidisk(&plain, &current), None);
    }

    #[test]
    fn vm_names_are_dns_names() {
        let mut id = identity();
        assert_eq!(vm_name(&id), "web-1");
        id.name = "-x".repeat(40);
        let name = vm_name(&id);
        assert!(name.len() <= 64 && name.starts_with('m'), "{name}");
    }
}
