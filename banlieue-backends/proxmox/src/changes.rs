//! Changes of a VM that exists: its change table ([`change_table`]), what it runs
//! with and what its next start uses, read back from PVE ([`read_pending`],
//! [`read_back`]), and the config writes that apply the fields the controller hands
//! over ([`config_form`], [`grow_forms`]).
//!
//! PVE writes a hardware change of a running VM to its *pending* config
//! (`GET …/pending`) unless the key is hot-pluggable there, and applies the pending
//! config when the VM next starts: that is [`ChangeMode::NextBoot`]. A disk grows on a
//! running VM with `PUT …/resize` (QEMU's `block_resize`): [`ChangeMode::Live`].
//! The backend never restarts a VM on its own: the controller reports
//! `RestartRequired` until a power cycle.

use banlieue_sdk::api::common::Firmware;
use banlieue_sdk::api::infra::proxmox::ProxmoxMachineSpec;
use banlieue_sdk::api::resources::{
    ChangeMode, ChangeRule, DiskSize, MachineField, MachineResources,
};
use banlieue_sdk::backend::BackendError;
use serde_json::{Map, Value};

use crate::client::Form;
use crate::config::{disk_resizes, parse_size, property, push_new_disks};

/// The Proxmox backend's change table (published in
/// [`crate::capabilities`]); a field not listed is [`ChangeMode::Never`].
///
/// - `cpus`, `coresPerSocket`: **NextBoot** both ways. `sockets`/`cores` are never
///   hot-plugged by PVE (only `vcpus` is, with `hotplug` including `cpu`, up to
///   sockets × cores); banlieue sets no `hotplug`/`vcpus` headroom yet, and fakepve
///   (the test target) does not emulate CPU hotplug, so a Live row could not be
///   tested. A running VM keeps its CPUs until a power cycle.
/// - `memoryMiB`: **NextBoot** both ways. PVE hot-plugs memory only with `hotplug`
///   including `memory` and NUMA enabled, which banlieue does not set (and fakepve
///   does not emulate): out of scope for now.
/// - `osDiskSize`, `dataDiskSize`: grow **Live** (`PUT …/resize`, the guest sees the
///   new size at once); a shrink is Never (PVE cannot shrink a disk; admission
///   refuses it before).
/// - `dataDisks`: an added disk is **NextBoot**: the config write allocates it and
///   fakepve keeps it pending on a running VM (a real PVE with `hotplug` including
///   `disk`, its default, plugs it at once; the read-back then shows it running and
///   nothing waits). Removing a disk is Never: the backend does not detach or destroy
///   a disk that holds data.
/// - `networks`, `firmware`: not listed, so Never (NICs are not added or removed
///   after the first configuration; firmware changes would need a new EFI vars disk
///   and a boot that may not come up).
pub fn change_table() -> Vec<ChangeRule> {
    use ChangeMode::*;
    use MachineField as F;
    vec![
        ChangeRule::both(F::Cpus, NextBoot),
        ChangeRule::both(F::CoresPerSocket, NextBoot),
        ChangeRule::both(F::MemoryMib, NextBoot),
        ChangeRule::grow_shrink(F::OsDiskSize, Live, Never),
        ChangeRule::grow_shrink(F::DataDiskSize, Live, Never),
        ChangeRule::grow_shrink(F::DataDisks, NextBoot, Never),
    ]
}

/// A VM's config as PVE reports it with its pending changes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PendingConfig {
    /// The config the next start will use (pending values over current ones,
    /// pending deletions removed).
    pub effective: Value,
    /// The config the VM has now (what `GET …/config` would say).
    pub current: Value,
    /// Keys with a change waiting for a restart, sorted.
    pub waiting: Vec<String>,
}

/// Reads `GET …/pending`'s list (`{key, value, pending, delete}`): one request gives
/// both the config the VM runs with and the one its next start uses.
pub fn read_pending(data: &Value) -> PendingConfig {
    let mut effective = Map::new();
    let mut current = Map::new();
    let mut waiting = Vec::new();
    for item in data.as_array().into_iter().flatten() {
        let Some(key) = item.get("key").and_then(Value::as_str) else {
            continue;
        };
        if let Some(v) = item.get("value") {
            current.insert(key.to_string(), v.clone());
        }
        let deleted = item.get("delete").and_then(as_u64).unwrap_or(0) > 0;
        if deleted || item.get("pending").is_some() {
            waiting.push(key.to_string());
        }
        if deleted {
            continue;
        }
        if let Some(v) = item.get("pending").or_else(|| item.get("value")) {
            effective.insert(key.to_string(), v.clone());
        }
    }
    waiting.sort();
    PendingConfig {
        effective: Value::Object(effective),
        current: Value::Object(current),
        waiting,
    }
}

fn as_u64(v: &Value) -> Option<u64> {
    v.as_u64()
        .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// PVE's defaults for keys a config leaves out: one socket, one core, 512 MiB.
const DEFAULT_SOCKETS: u64 = 1;
const DEFAULT_CORES: u64 = 1;
const DEFAULT_MEMORY_MIB: u64 = 512;

/// `memory` in MiB: `2048`, `"2048"`, or PVE 8's property string `current=2048`.
pub fn memory_mib(config: &Value) -> u64 {
    match config.get("memory") {
        None => DEFAULT_MEMORY_MIB,
        Some(v) => as_u64(v)
            .or_else(|| {
                let text = v.as_str()?;
                property(text, "current")?.parse().ok()
            })
            .unwrap_or(DEFAULT_MEMORY_MIB),
    }
}

fn count(config: &Value, key: &str, default: u64) -> u64 {
    config.get(key).and_then(as_u64).unwrap_or(default)
}

/// A drive's size in GiB (rounded down): its `size=`, else the GiB of PVE's
/// new-volume syntax (`local-lvm:5`, a disk written but not allocated yet).
pub fn drive_gib(drive: &str) -> Option<u32> {
    let bytes = match property(drive, "size").and_then(parse_size) {
        Some(bytes) => bytes,
        None => {
            let volume = drive.split(',').next()?;
            let (_, gib) = volume.rsplit_once(':')?;
            let gib: f64 = gib.parse().ok()?;
            (gib * f64::from(1u32 << 30)) as u64
        }
    };
    u32::try_from(bytes >> 30).ok()
}

/// The disks after the boot disk: `scsi1`, `scsi2`, ... (not CD-ROMs), by index.
fn data_drives(config: &Value) -> Vec<(u32, String)> {
    let mut out: Vec<(u32, String)> = config
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(key, value)| {
            let index: u32 = key.strip_prefix("scsi")?.parse().ok()?;
            let drive = value.as_str()?;
            (index >= 1 && property(drive, "media") != Some("cdrom"))
                .then(|| (index, drive.to_string()))
        })
        .collect();
    out.sort();
    out
}

/// What a VM config says the VM has.
///
/// The CPUs are `vcpus` when set (the vCPUs online at start), else sockets × cores;
/// the boot disk is `scsi0`; the additional disks are `scsi1`, `scsi2`, ... in the
/// order of the spec's `additionalDisks` (that is how the backend adds them), so
/// `disk_names` (the spec's names, in order) names them; a disk beyond the list keeps
/// its PVE key as its name (and shows as a disk to remove, which is refused). The
/// firmware is OVMF (`efi`, or `efi-secure` when `efidisk0` has the keys enrolled)
/// or SeaBIOS (PVE's default).
pub fn resources(config: &Value, disk_names: &[String]) -> MachineResources {
    let sockets = count(config, "sockets", DEFAULT_SOCKETS);
    let cores = count(config, "cores", DEFAULT_CORES);
    let cpus = config
        .get("vcpus")
        .and_then(as_u64)
        .filter(|n| *n > 0)
        .unwrap_or(sockets * cores);
    let mut data_disks: Vec<DiskSize> = data_drives(config)
        .into_iter()
        .map(|(index, drive)| DiskSize {
            name: disk_names
                .get(index as usize - 1)
                .cloned()
                .unwrap_or_else(|| format!("scsi{index}")),
            size_gib: drive_gib(&drive).unwrap_or(0),
        })
        .collect();
    data_disks.sort();
    let networks = config
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(key, _)| {
            key.strip_prefix("net")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .count();
    let firmware = match config.get("bios").and_then(Value::as_str) {
        Some("ovmf") => {
            let enrolled = config
                .get("efidisk0")
                .and_then(Value::as_str)
                .and_then(|d| property(d, "pre-enrolled-keys"))
                == Some("1");
            if enrolled {
                Firmware::EfiSecure
            } else {
                Firmware::Efi
            }
        }
        _ => Firmware::Bios,
    };
    MachineResources {
        cpus: u32::try_from(cpus).unwrap_or(u32::MAX),
        cores_per_socket: u32::try_from(cores).ok(),
        memory_mib: memory_mib(config),
        os_disk_gib: config
            .get("scsi0")
            .and_then(Value::as_str)
            .and_then(drive_gib),
        data_disks,
        networks: u32::try_from(networks).unwrap_or(u32::MAX),
        firmware: Some(firmware),
        max_cpus: None,
        max_memory_mib: None,
    }
}

/// What the VM runs with (its current config), and what its next start uses when
/// that differs (a change already written to the pending config).
pub fn read_back(
    read: &PendingConfig,
    disk_names: &[String],
) -> (MachineResources, Option<MachineResources>) {
    let running = resources(&read.current, disk_names);
    let next = resources(&read.effective, disk_names);
    let next_boot = (next != running).then_some(next);
    (running, next_boot)
}

/// The handed fields this backend does not apply (not in [`change_table`]), as the
/// terminal error that names them; the controller never hands them over.
pub fn unsupported(fields: &[MachineField]) -> Option<BackendError> {
    let table = change_table();
    let refused: Vec<&str> = fields
        .iter()
        .filter(|f| !table.iter().any(|r| r.field == **f))
        .map(|f| f.as_str())
        .collect();
    (!refused.is_empty()).then(|| {
        BackendError::terminal(
            "ChangeUnsupported",
            format!(
                "the proxmox backend cannot change {} of a VM that exists",
                refused.join(", ")
            ),
        )
    })
}

/// The keys of `config` that differ from the spec for `fields`.
fn wanted(spec: &ProxmoxMachineSpec, config: &Value, fields: &[MachineField]) -> Form {
    let mut form = Form::new();
    let has = |f: MachineField| fields.contains(&f);
    if has(MachineField::Cpus) || has(MachineField::CoresPerSocket) {
        if count(config, "sockets", DEFAULT_SOCKETS) != u64::from(spec.sockets) {
            form.push("sockets", spec.sockets);
        }
        if count(config, "cores", DEFAULT_CORES) != u64::from(spec.cores) {
            form.push("cores", spec.cores);
        }
        // `vcpus` would keep fewer CPUs online than sockets × cores.
        if config.get("vcpus").is_some() {
            form.push("delete", "vcpus");
        }
    }
    if has(MachineField::MemoryMib) && memory_mib(config) != spec.memory_mib {
        form.push("memory", spec.memory_mib);
    }
    if has(MachineField::DataDisks) {
        push_new_disks(spec, config, &mut form);
    }
    form
}

/// The `PUT …/config` that applies `fields` (CPUs, memory, added disks), empty when
/// nothing is to be written.
///
/// On a running VM (`running`) it is compared with the config the next start uses,
/// so a change already pending is not written again. On a stopped VM it is compared
/// with the current config (a stopped VM still has the pending changes written while
/// it ran, until it starts), and a value already pending is written as it is, so PVE
/// applies it at once and a pending disk keeps the volume it was given.
pub fn config_form(
    spec: &ProxmoxMachineSpec,
    read: &PendingConfig,
    fields: &[MachineField],
    running: bool,
) -> Form {
    let next = wanted(spec, &read.effective, fields);
    if running {
        return next;
    }
    let mut form = Form::new();
    for (key, value) in wanted(spec, &read.current, fields).pairs() {
        match read.effective.get(key) {
            Some(pending) if key != "delete" && next.get(key).is_none() => {
                form.push(key, text(pending))
            }
            _ => form.push(key, value),
        }
    }
    form
}

/// The `PUT …/resize` of each disk `fields` grow (the boot disk for `osDiskSize`,
/// the additional disks for `dataDiskSize`), given the current config.
pub fn grow_forms(
    spec: &ProxmoxMachineSpec,
    current: &Value,
    fields: &[MachineField],
) -> Vec<Form> {
    disk_resizes(
        spec,
        current,
        fields.contains(&MachineField::OsDiskSize),
        fields.contains(&MachineField::DataDiskSize),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use MachineField as F;
    use banlieue_sdk::changes::{assess, differences};
    use serde_json::json;

    fn spec(extra: Value) -> ProxmoxMachineSpec {
        let mut base = json!({"templateID": 9000, "cores": 2, "sockets": 1, "memoryMiB": 2048});
        for (k, v) in extra.as_object().unwrap() {
            base[k] = v.clone();
        }
        serde_json::from_value(base).unwrap()
    }

    fn names(spec: &ProxmoxMachineSpec) -> Vec<String> {
        spec.additional_disks
            .iter()
            .map(|d| d.name.clone())
            .collect()
    }

    #[test]
    fn pending_values_win_and_are_listed() {
        let data = json!([
            {"key": "cores", "value": 1, "pending": "2"},
            {"key": "memory", "value": "2048"},
            {"key": "scsi0", "value": "local-lvm:vm-101-disk-0,size=4G"},
            {"key": "scsi1", "pending": "local-lvm:vm-101-disk-1,size=5G"},
            {"key": "ide3", "value": "none,media=cdrom", "delete": 1}
        ]);
        let read = read_pending(&data);
        assert_eq!(read.waiting, ["cores", "ide3", "scsi1"]);
        assert_eq!(read.effective["cores"], "2");
        assert!(read.effective.get("ide3").is_none());
        // What the VM runs on now: values only, deletions not yet done.
        assert_eq!(read.current["cores"], 1);
        assert_eq!(read.current["ide3"], "none,media=cdrom");
        assert!(read.current.get("scsi1").is_none());
        let spec = spec(json!({"additionalDisks": [{"name": "d", "sizeGiB": 5}]}));
        let (running, next) = read_back(&read, &names(&spec));
        assert_eq!((running.cpus, running.memory_mib), (1, 2048));
        assert_eq!(running.os_disk_gib, Some(4));
        assert!(running.data_disks.is_empty());
        let next = next.expect("the next start differs");
        assert_eq!(next.cpus, 2);
        assert_eq!(
            next.data_disks,
            [DiskSize {
                name: "d".into(),
                size_gib: 5
            }]
        );
        // Written already: nothing to write again while it runs.
        let all = [F::Cpus, F::CoresPerSocket, F::MemoryMib, F::DataDisks];
        assert!(config_form(&spec, &read, &all, true).is_empty());
    }

    #[test]
    fn resources_read_every_field_pve_has() {
        let config = json!({
            "sockets": 2, "cores": "2", "memory": "current=4096",
            "scsi0": "local-lvm:vm-1-disk-0,iothread=1,size=20G",
            "scsi1": "local-lvm:vm-1-disk-1,size=10240M",
            "scsi2": "fast:3",
            "scsi3": "local-lvm:vm-1-disk-3,size=1G",
            "ide2": "local:iso/seed.iso,media=cdrom",
            "scsi5": "none,media=cdrom",
            "net0": "virtio=BC:24:11:00:00:01,bridge=vmbr0", "net1": "e1000=BC:24:11:00:00:02,bridge=vmbr1",
            "netx": "not a nic",
            "bios": "ovmf", "efidisk0": "local-lvm:vm-1-disk-9,efitype=4m,pre-enrolled-keys=1,size=528K"
        });
        let r = resources(&config, &["data".into(), "logs".into()]);
        assert_eq!(r.cpus, 4);
        assert_eq!(r.cores_per_socket, Some(2));
        assert_eq!(r.memory_mib, 4096);
        assert_eq!(r.os_disk_gib, Some(20));
        let disks: Vec<_> = r
            .data_disks
            .iter()
            .map(|d| (d.name.as_str(), d.size_gib))
            .collect();
        // Named by position; one beyond the spec's list keeps its key.
        assert_eq!(disks, [("data", 10), ("logs", 3), ("scsi3", 1)]);
        assert_eq!(r.networks, 2);
        assert_eq!(r.firmware, Some(Firmware::EfiSecure));
        // PVE's defaults for what a config leaves out; vcpus are the CPUs online.
        let bare = resources(&json!({"vcpus": 1, "sockets": 2}), &[]);
        assert_eq!((bare.cpus, bare.memory_mib), (1, 512));
        assert_eq!(bare.firmware, Some(Firmware::Bios));
        assert_eq!(bare.os_disk_gib, None);
        let ovmf = resources(&json!({"bios": "ovmf"}), &[]);
        assert_eq!(ovmf.firmware, Some(Firmware::Efi));
    }

    #[test]
    fn a_spec_read_back_from_its_own_config_has_no_difference() {
        let spec = spec(
            json!({"sockets": 2, "cores": 2, "memoryMiB": 4096, "diskGiB": 20,
            "firmware": "bios", "network": [{"bridge": "vmbr0"}],
            "additionalDisks": [{"name": "data", "sizeGiB": 10}]}),
        );
        let config = json!({"sockets": 2, "cores": 2, "memory": "4096",
            "scsi0": "local-lvm:vm-1-disk-0,size=20G", "scsi1": "local-lvm:vm-1-disk-1,size=10G",
            "net0": "virtio=BC:24:11:00:00:01,bridge=vmbr0"});
        let desired = banlieue_sdk::backend::MachineSpec::Proxmox(spec.clone()).resources();
        let running = resources(&config, &names(&spec));
        assert!(
            differences(&desired, &running).is_empty(),
            "{desired:?} {running:?}"
        );
    }

    #[test]
    fn cpus_memory_and_new_disks_are_written_for_the_fields_handed_over() {
        let read = read_pending(&json!([
            {"key": "cores", "value": 2}, {"key": "sockets", "value": 1},
            {"key": "memory", "value": "1024"}, {"key": "vcpus", "value": 1},
            {"key": "scsi0", "value": "local-lvm:vm-101-disk-0,size=4G"}
        ]));
        let spec = spec(json!({"cores": 4, "memoryMiB": 4096,
            "additionalDisks": [{"name": "data", "sizeGiB": 10}]}));
        let all = [F::Cpus, F::MemoryMib, F::DataDisks];
        assert_eq!(
            config_form(&spec, &read, &all, true).encode(),
            "cores=4&delete=vcpus&memory=4096&scsi1=local-lvm%3A10"
        );
        // Only what is handed over.
        assert_eq!(
            config_form(&spec, &read, &[F::MemoryMib], true).encode(),
            "memory=4096"
        );
        assert!(config_form(&spec, &read, &[F::OsDiskSize], true).is_empty());
        // PVE omits defaults: 512 MiB, one socket, one core.
        let defaults = super::tests::spec(json!({"cores": 1, "memoryMiB": 512}));
        let empty = read_pending(&json!([]));
        assert!(config_form(&defaults, &empty, &all, true).is_empty());
    }

    #[test]
    fn a_stopped_vm_takes_what_is_pending_as_it_is() {
        // Written while it ran; it stopped since, and has not started again.
        let read = read_pending(&json!([
            {"key": "cores", "value": 2, "pending": "4"},
            {"key": "memory", "value": "1024", "pending": "4096"},
            {"key": "scsi0", "value": "local-lvm:vm-101-disk-0,size=4G"},
            {"key": "scsi1", "pending": "local-lvm:vm-101-disk-1,size=10G"}
        ]));
        let spec = spec(json!({"cores": 4, "memoryMiB": 8192,
            "additionalDisks": [{"name": "data", "sizeGiB": 10}]}));
        let all = [F::Cpus, F::MemoryMib, F::DataDisks];
        assert!(
            config_form(&spec, &read, &all, true).encode() == "memory=8192",
            "running: only what is not pending yet"
        );
        let form = config_form(&spec, &read, &all, false);
        assert_eq!(form.get("cores"), Some("4"));
        assert_eq!(
            form.get("memory"),
            Some("8192"),
            "the spec's, not the pending one"
        );
        assert_eq!(
            form.get("scsi1"),
            Some("local-lvm:vm-101-disk-1,size=10G"),
            "the pending disk keeps its volume"
        );
    }

    #[test]
    fn disks_grow_by_field() {
        let current = json!({"scsi0": "local-lvm:vm-1-disk-0,size=4G",
                             "scsi1": "local-lvm:vm-1-disk-1,size=5G"});
        let spec = spec(json!({"diskGiB": 8, "additionalDisks": [{"name": "data", "sizeGiB": 6}]}));
        let encoded = |fields: &[MachineField]| -> Vec<String> {
            grow_forms(&spec, &current, fields)
                .iter()
                .map(Form::encode)
                .collect()
        };
        assert_eq!(
            encoded(&[F::OsDiskSize, F::DataDiskSize]),
            ["disk=scsi0&size=8G", "disk=scsi1&size=6G"]
        );
        assert_eq!(encoded(&[F::DataDiskSize]), ["disk=scsi1&size=6G"]);
        assert!(encoded(&[F::Cpus]).is_empty());
    }

    #[test]
    fn the_table_says_nextboot_for_cpu_and_memory_live_for_disk_growth() {
        let on = Some(banlieue_sdk::api::common::PowerState::PoweredOn);
        let running = resources(
            &json!({"cores": 2, "memory": "1024", "scsi0": "local-lvm:vm-1-disk-0,size=8G",
                    "net0": "virtio=BC:24:11:00:00:01,bridge=vmbr0"}),
            &[],
        );
        let mut want = running.clone();
        want.cpus = 4;
        want.cores_per_socket = Some(4);
        want.memory_mib = 2048;
        want.os_disk_gib = Some(12);
        let a = assess(&want, &running, None, &change_table(), on);
        assert_eq!(
            a.apply,
            [F::Cpus, F::CoresPerSocket, F::MemoryMib, F::OsDiskSize]
        );
        let waits: Vec<_> = a.pending.iter().map(|p| (p.field, p.waits_for)).collect();
        use ChangeMode::NextBoot;
        assert_eq!(
            waits,
            [
                (F::Cpus, NextBoot),
                (F::CoresPerSocket, NextBoot),
                (F::MemoryMib, NextBoot)
            ]
        );
        want.firmware = Some(Firmware::Efi);
        want.networks = 2;
        let refused: Vec<_> = assess(&want, &running, None, &change_table(), on)
            .refused()
            .map(|p| p.field)
            .collect();
        assert_eq!(refused, [F::Networks, F::Firmware]);
        let error = unsupported(&[F::Cpus, F::Firmware]).unwrap();
        assert!(!error.is_transient());
        assert!(error.message.contains("firmware"), "{error}");
        assert!(unsupported(&[F::Cpus, F::DataDisks]).is_none());
    }
}
