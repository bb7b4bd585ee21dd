//! Changes to a machine that exists: the change table ([`change_table`]), what a
//! machine runs with read back from its VMM ([`resources`]), and the requests and
//! configuration edits that apply a change ([`resize_body`], [`stage`]).
//!
//! Two configurations matter. The VMM's, read with `vm.info`, is what runs; the
//! record's (`state.json`'s `config`) is what the next `vm.create` sends. A live
//! change goes to both (`vm.resize` updates the VMM's, [`stage`] the record's, so a
//! VMM started again keeps it); a change that waits for the next boot goes to the
//! record's only, and the machine reports it as its
//! [`next_boot`](banlieue_sdk::backend::MachineObservation::next_boot) configuration
//! until a power cycle makes a new VM from it (see `ChBackend::run`).

use std::path::Path;

use banlieue_sdk::api::infra::cloud_hypervisor::CloudHypervisorMachineSpec;
use banlieue_sdk::api::resources::{
    ChangeMode, ChangeRule, DiskSize, MachineField, MachineResources,
};
use banlieue_sdk::backend::BackendError;
use serde_json::{Value, json};

use crate::config;
use crate::state::Record;

/// ACPI memory hot-plug adds memory in blocks of this size (upstream
/// `docs/hotplug.md`: the amount added must be a multiple of 128 MiB).
pub const MEMORY_STEP: u64 = 128 << 20;

/// The Cloud Hypervisor change table: what a running machine takes, and how.
///
/// - `cpus`: **Live** both ways. `vm.resize {desired_vcpus}` adds vCPUs up to the
///   `max_vcpus` the VM was created with (`maxCPUs`) and removes them (ACPI eject,
///   upstream `docs/hotplug.md`). Beyond `max_vcpus`, which CH cannot change while
///   the VM exists, the machine reports its ceiling (`maxCPUs`) and the assessment
///   makes the change **NextBoot**: it is written to the configuration the next
///   `vm.create` sends (with `maxCPUs` from the spec), and the next power-on makes the
///   VM anew from it — a new VMM (the real one exits with its guest), or, when the
///   VMM stayed, the VM deleted and created again because its sizes differ. A reboot
///   from inside the guest is not enough: CH reboots with the configuration it holds.
/// - `memoryMiB`: grows **Live** with `vm.resize {desired_ram}` within the hot-plug
///   room the VM was created with (`memory.hotplug_size` = `maxMemoryMiB` −
///   `memoryMiB`), in steps of 128 MiB (a raise that is not a multiple is refused,
///   `MemoryStepUnaligned`, not written half); beyond the room it is **NextBoot** as
///   for CPUs. Shrinks are **NextBoot**: CH's default ACPI hot-plug cannot take
///   memory back from a running guest (upstream: a smaller size "will not be applied
///   until the VM is rebooted"), so it is written for the next boot only.
/// - `dataDiskSize`: grows **Live** with `vm.resize-disk {id, desired_size}` (the
///   document has it: CH grows the raw file and tells the guest); a machine that is
///   off has its file grown. Disks never shrink (admission refuses it; **Never**).
///
/// - `networks`: **Live** both ways. An interface added at the end is hot-plugged
///   with `vm.add-net` (its tap, MAC and MTU, id `net<n>`, joined to its bridge), one
///   removed from the end is unplugged with `vm.remove-device`. The guest configures
///   an added interface itself (the NoCloud seed is read at first boot only), so an
///   added interface whose `ipam.mode` is not `dhcp` is refused
///   (`NetworkIpamNotLive`) rather than added without its addresses.
///
/// - `coresPerSocket`: **NextBoot** both ways. The VM is created with a CPU topology
///   (`cpus.topology`: `coresPerSocket` cores per die, one die per package, as many
///   packages as hold `max_vcpus`), which CH fixes for the VM's life: no API call
///   changes it (`vm.resize` takes counts only). It is written to the configuration
///   the next `vm.create` sends, and the next power-on makes the VM anew from it, as
///   for CPUs beyond `max_vcpus`. A maximum the new cores do not divide is refused
///   (`CpuTopologyMismatch`) before anything is written.
///
/// Not listed, so **Never**: `osDiskSize`
/// (the OS disk may be a qcow2 overlay, which `vm.resize-disk` does not grow), data
/// disks added or removed (`vm.add-disk` exists, but banlieue does not drive it
/// yet), and `firmware` (CH boots what the image names; both `bios` and `efi` are accepted
/// and change nothing).
pub fn change_table() -> Vec<ChangeRule> {
    use ChangeMode::{Live, Never, NextBoot};
    use MachineField as F;
    vec![
        ChangeRule::both(F::Cpus, Live),
        ChangeRule::both(F::CoresPerSocket, NextBoot),
        ChangeRule::grow_shrink(F::MemoryMib, Live, NextBoot),
        ChangeRule::grow_shrink(F::DataDiskSize, Live, Never),
        ChangeRule::both(F::Networks, Live),
    ]
}

fn mib(bytes: u64) -> u64 {
    bytes >> 20
}

fn int(value: &Value) -> Option<u64> {
    value.as_u64()
}

/// The length of a file, `None` when it cannot be read.
fn len(path: &Path) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.len())
}

/// The OS disk's size in GiB as the host holds it: a raw file's length, a qcow2
/// file's virtual size.
fn os_disk_gib(dir: &Path, config: &Value) -> Option<u32> {
    let disk = config["disks"]
        .as_array()?
        .iter()
        .find(|d| d["id"] == "os")?;
    let path = Path::new(disk["path"].as_str()?);
    let path = if path.is_absolute() {
        path.to_owned()
    } else {
        dir.join(path)
    };
    let bytes = match disk["image_type"].as_str() {
        Some("Qcow2") => crate::qcow2::virtual_size(&path).ok().flatten()?,
        _ => len(&path)?,
    };
    u32::try_from(bytes >> 30).ok()
}

/// The additional disks by name (the record keeps which file is which), each with
/// its file's size on the host: what CH (or banlieue, while off) grew it to.
fn data_disks(dir: &Path, record: &Record) -> Vec<DiskSize> {
    let mut out: Vec<DiskSize> = record
        .disk_names
        .iter()
        .enumerate()
        .filter_map(|(i, name)| {
            let bytes = len(&dir.join(config::data_disk_name(i)))?;
            Some(DiskSize {
                name: name.clone(),
                size_gib: u32::try_from(bytes >> 30).ok()?,
            })
        })
        .collect();
    out.sort();
    out
}

/// What a machine runs with, from a VM configuration as CH holds it (`vm.info`'s
/// `config` while the VM runs; the record's, which the next boot is made from, while
/// it is off) and the disk files on the host.
///
/// CPUs are `cpus.boot_vcpus` (CH sets it on every `vm.resize`), the ceiling
/// `cpus.max_vcpus`, the cores per socket `cpus.topology`'s vCPUs per package
/// (threads × cores × dies; unknown for a VM made without a topology). Memory is `memory.size` (CH's ACPI resize sets it to what was
/// added) plus `hotplugged_size` (virtio-mem, unused by banlieue); the ceiling is the
/// size the VM was created with (`booted_memory`; the size itself when unknown) plus
/// `hotplug_size`, which CH never changes while the VM exists.
pub fn resources(
    dir: &Path,
    record: &Record,
    config: &Value,
    booted_memory: Option<u64>,
) -> MachineResources {
    let cpus = &config["cpus"];
    let memory = &config["memory"];
    let size = int(&memory["size"]).unwrap_or(0);
    let plugged = size + int(&memory["hotplugged_size"]).unwrap_or(0);
    let base = booted_memory.unwrap_or(size);
    let room = int(&memory["hotplug_size"]).unwrap_or(0);
    let count = |v: &Value| u32::try_from(v.as_array().map_or(0, Vec::len)).unwrap_or(u32::MAX);
    MachineResources {
        cpus: int(&cpus["boot_vcpus"])
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(0),
        cores_per_socket: per_package(&cpus["topology"]),
        memory_mib: mib(plugged),
        os_disk_gib: os_disk_gib(dir, config),
        data_disks: data_disks(dir, record),
        networks: count(&config["net"]),
        firmware: None,
        max_cpus: int(&cpus["max_vcpus"]).and_then(|n| u32::try_from(n).ok()),
        max_memory_mib: Some(mib(base + room).max(mib(plugged))),
    }
}

/// vCPUs per package of a `CpuTopology` (threads × cores × dies), `None` without one.
fn per_package(topology: &Value) -> Option<u32> {
    if topology.is_null() {
        return None;
    }
    let part = |k: &str| int(&topology[k]);
    let n = part("threads_per_core")? * part("cores_per_die")? * part("dies_per_package")?;
    u32::try_from(n).ok()
}

/// Whether two configurations boot different sizes (CPUs, their topology, or memory):
/// a VM held by a live VMM whose sizes differ from the record's is made anew before
/// it boots.
pub fn sizes_differ(vmm: &Value, record: &Value) -> bool {
    let pick = |c: &Value| {
        (
            int(&c["cpus"]["boot_vcpus"]),
            int(&c["cpus"]["max_vcpus"]),
            // As numbers: the VMM may format the object otherwise than banlieue wrote it.
            [
                "threads_per_core",
                "cores_per_die",
                "dies_per_package",
                "packages",
            ]
            .map(|k| int(&c["cpus"]["topology"][k])),
            int(&c["memory"]["size"]),
            int(&c["memory"]["hotplug_size"]).unwrap_or(0),
        )
    };
    pick(vmm) != pick(record)
}

/// Writes `field` of `spec` into the record, whose configuration the next boot is
/// made from (and whose MACs and interfaces report addresses). A CPU topology the
/// maximum does not fill is refused ([`config::cpus`]).
pub fn stage(
    record: &mut Record,
    spec: &CloudHypervisorMachineSpec,
    field: MachineField,
) -> Result<(), BackendError> {
    match field {
        MachineField::Cpus | MachineField::CoresPerSocket => {
            record.config["cpus"] = config::cpus(spec)?
        }
        MachineField::MemoryMib => record.config["memory"] = config::memory(spec),
        MachineField::Networks => {
            let macs = config::macs(&record.uid, spec);
            record.config["net"] = spec
                .network
                .iter()
                .zip(&macs)
                .enumerate()
                .map(|(i, (nic, mac))| config::net(&record.uid, i, nic, mac))
                .collect();
            record.macs = macs;
            record.interfaces = spec.network.clone();
        }
        _ => {}
    }
    Ok(())
}

/// The interfaces to unplug (`vm.remove-device` ids) and to hot-plug (`vm.add-net`
/// bodies) so that a VM whose `net` is `running` has `spec`'s: ids `net<n>` beyond
/// the spec's count go, the spec's missing ones come. An added interface that is not
/// DHCP is refused: its addresses would never reach the guest.
pub fn net_changes(
    uid: &str,
    spec: &CloudHypervisorMachineSpec,
    running: &Value,
) -> Result<(Vec<String>, Vec<Value>), BackendError> {
    let have: Vec<&str> = running
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| n["id"].as_str())
        .collect();
    let want: Vec<String> = (0..spec.network.len()).map(|i| format!("net{i}")).collect();
    let remove = have
        .iter()
        .filter(|id| !want.iter().any(|w| w == *id))
        .map(|id| (*id).to_owned())
        .collect();
    let macs = config::macs(uid, spec);
    let mut add = Vec::new();
    for (i, nic) in spec.network.iter().enumerate() {
        if have.contains(&want[i].as_str()) {
            continue;
        }
        if nic.ipam.mode != banlieue_sdk::api::common::IpamMode::Dhcp {
            return Err(BackendError::terminal(
                "NetworkIpamNotLive",
                format!(
                    "networks: interface {i} asks for {:?} addresses, which reach the guest only through its first boot's NoCloud seed; add it with ipam mode dhcp, or make a new machine",
                    nic.ipam.mode
                ),
            ));
        }
        add.push(config::net(uid, i, nic, &macs[i]));
    }
    Ok((remove, add))
}

/// The `vm.resize` body for the live part of `fields` on a running machine
/// (`running`, as read back): vCPUs within its `max_vcpus`, memory raised within its
/// hot-plug room. `None` when nothing is live. A raise that is not a multiple of 128
/// MiB is refused, naming the field.
pub fn resize_body(
    spec: &CloudHypervisorMachineSpec,
    fields: &[MachineField],
    running: &MachineResources,
) -> Result<Option<Value>, BackendError> {
    let mut body = serde_json::Map::new();
    if fields.contains(&MachineField::Cpus)
        && spec.cpus != running.cpus
        && running.max_cpus.is_some_and(|max| spec.cpus <= max)
    {
        body.insert("desired_vcpus".into(), json!(spec.cpus));
    }
    if fields.contains(&MachineField::MemoryMib)
        && spec.memory_mib > running.memory_mib
        && running
            .max_memory_mib
            .is_some_and(|max| spec.memory_mib <= max)
    {
        let added = (spec.memory_mib - running.memory_mib) << 20;
        if !added.is_multiple_of(MEMORY_STEP) {
            return Err(BackendError::terminal(
                "MemoryStepUnaligned",
                format!(
                    "memoryMiB {} → {}: Cloud Hypervisor adds memory to a running guest in steps of 128 MiB; ask for {} or {}",
                    running.memory_mib,
                    spec.memory_mib,
                    running.memory_mib + mib(added / MEMORY_STEP * MEMORY_STEP),
                    running.memory_mib + mib(added.div_ceil(MEMORY_STEP) * MEMORY_STEP),
                ),
            ));
        }
        body.insert("desired_ram".into(), json!(spec.memory_mib << 20));
    }
    Ok((!body.is_empty()).then_some(Value::Object(body)))
}

/// The `vm.resize-disk` bodies that grow the additional disks `spec` asks larger than
/// `running` has them (ids `data<n>` by the record's order of names).
pub fn resize_disk_bodies(
    spec: &CloudHypervisorMachineSpec,
    record: &Record,
    running: &MachineResources,
) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for want in &spec.additional_disks {
        let Some(index) = record.disk_names.iter().position(|n| *n == want.name) else {
            continue;
        };
        let have = running
            .data_disks
            .iter()
            .find(|d| d.name == want.name)
            .map_or(0, |d| d.size_gib);
        if want.size_gib > have {
            out.push((
                want.name.clone(),
                json!({"id": format!("data{index}"), "desired_size": u64::from(want.size_gib) << 30}),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(extra: Value) -> CloudHypervisorMachineSpec {
        let mut base = json!({
            "image": {"kernel": "/k", "disk": "/d.raw", "format": "raw"},
            "cpus": 2, "maxCPUs": 4, "memoryMiB": 1024, "maxMemoryMiB": 2048,
            "additionalDisks": [{"name": "data", "sizeGiB": 1}, {"name": "logs", "sizeGiB": 2}]
        });
        for (k, v) in extra.as_object().unwrap() {
            base[k] = v.clone();
        }
        serde_json::from_value(base).unwrap()
    }

    fn running(cpus: u32, memory: u64) -> MachineResources {
        MachineResources {
            cpus,
            memory_mib: memory,
            max_cpus: Some(4),
            max_memory_mib: Some(2048),
            data_disks: vec![
                DiskSize {
                    name: "data".into(),
                    size_gib: 1,
                },
                DiskSize {
                    name: "logs".into(),
                    size_gib: 2,
                },
            ],
            ..Default::default()
        }
    }

    #[test]
    fn resize_asks_only_for_what_is_live() {
        use MachineField as F;
        // (spec cpus, spec memory, fields, expected body)
        let cases: Vec<(u32, u64, Vec<F>, Option<Value>)> = vec![
            (4, 1024, vec![F::Cpus], Some(json!({"desired_vcpus": 4}))),
            (3, 1024, vec![F::Cpus], Some(json!({"desired_vcpus": 3}))),
            (1, 1024, vec![F::Cpus], Some(json!({"desired_vcpus": 1}))),
            // Beyond max_vcpus: written for the next boot, nothing sent live.
            (6, 1024, vec![F::Cpus], None),
            (
                4,
                1536,
                vec![F::Cpus, F::MemoryMib],
                Some(json!({"desired_vcpus": 4, "desired_ram": 1536u64 << 20})),
            ),
            (
                2,
                2048,
                vec![F::MemoryMib],
                Some(json!({"desired_ram": 2048u64 << 20})),
            ),
            // Beyond the hot-plug room, or smaller: the next boot's.
            (2, 4096, vec![F::MemoryMib], None),
            (2, 512, vec![F::MemoryMib], None),
            // A field not handed over is not sent.
            (
                4,
                1536,
                vec![F::MemoryMib],
                Some(json!({"desired_ram": 1536u64 << 20})),
            ),
        ];
        for (cpus, memory, fields, want) in cases {
            let s = spec(
                json!({"cpus": cpus, "memoryMiB": memory, "maxCPUs": 8, "maxMemoryMiB": 4096}),
            );
            let body = resize_body(&s, &fields, &running(2, 1024)).unwrap();
            assert_eq!(body, want, "{cpus} {memory} {fields:?}");
            if let Some(body) = &body {
                let errors = fake_cloud_hypervisor::Spec::bundled().check_request(
                    "PUT",
                    "/api/v1/vm.resize",
                    Some("application/json"),
                    body.to_string().as_bytes(),
                );
                assert_eq!(errors, Vec::<String>::new(), "{body}");
            }
        }
        let odd = spec(json!({"memoryMiB": 1100}));
        let e = resize_body(&odd, &[F::MemoryMib], &running(2, 1024)).unwrap_err();
        assert_eq!(e.reason, "MemoryStepUnaligned");
        assert!(!e.is_transient());
        assert!(
            e.message.contains("memoryMiB 1024 → 1100") && e.message.contains("1152"),
            "{}",
            e.message
        );
    }

    #[test]
    fn interfaces_are_plugged_and_unplugged_at_the_end() {
        let running = json!([{"id": "net0", "tap": "t0"}, {"id": "net1", "tap": "t1"}]);
        let three = spec(json!({"network": [{}, {}, {"mtu": 9000}]}));
        let (remove, add) = net_changes("u", &three, &running).unwrap();
        assert!(remove.is_empty());
        assert_eq!(add.len(), 1);
        assert_eq!(add[0]["id"], "net2");
        assert_eq!(add[0]["tap"], config::tap("u", 2));
        assert_eq!(add[0]["mac"], config::mac("u", 2, None));
        assert_eq!(add[0]["mtu"], 9000);
        let errors = fake_cloud_hypervisor::Spec::bundled().check_request(
            "PUT",
            "/api/v1/vm.add-net",
            Some("application/json"),
            add[0].to_string().as_bytes(),
        );
        assert_eq!(errors, Vec::<String>::new());
        let one = spec(json!({"network": [{}]}));
        assert_eq!(
            net_changes("u", &one, &running).unwrap(),
            (vec!["net1".to_owned()], vec![])
        );
        let stat = spec(
            json!({"network": [{}, {}, {"ipam": {"mode": "static", "addresses": ["10.0.0.5/24"]}}]}),
        );
        let e = net_changes("u", &stat, &running).unwrap_err();
        assert_eq!(e.reason, "NetworkIpamNotLive");
        assert!(
            e.message.starts_with("networks: interface 2"),
            "{}",
            e.message
        );
    }

    #[test]
    fn disks_grow_by_their_recorded_ids() {
        let record = Record {
            disk_names: vec!["data".into(), "logs".into()],
            ..Default::default()
        };
        let s = spec(json!({"additionalDisks": [
            {"name": "logs", "sizeGiB": 5}, {"name": "data", "sizeGiB": 1}, {"name": "new", "sizeGiB": 9}
        ]}));
        let bodies = resize_disk_bodies(&s, &record, &running(2, 1024));
        assert_eq!(
            bodies,
            vec![(
                "logs".to_owned(),
                json!({"id": "data1", "desired_size": 5u64 << 30})
            )]
        );
        let errors = fake_cloud_hypervisor::Spec::bundled().check_request(
            "PUT",
            "/api/v1/vm.resize-disk",
            Some("application/json"),
            bodies[0].1.to_string().as_bytes(),
        );
        assert_eq!(errors, Vec::<String>::new());
    }

    #[test]
    fn staging_writes_the_next_boots_sizes() {
        let s = spec(json!({"cpus": 6, "maxCPUs": 8, "memoryMiB": 1536, "maxMemoryMiB": 4096}));
        let mut record = Record {
            uid: "u".into(),
            config: json!({"cpus": {"boot_vcpus": 2, "max_vcpus": 4},
                           "memory": {"size": 1u64 << 30, "hotplug_size": 1u64 << 30}}),
            ..Default::default()
        };
        let before = record.config.clone();
        stage(&mut record, &s, MachineField::Cpus).unwrap();
        assert_eq!(
            record.config["cpus"],
            json!({"boot_vcpus": 6, "max_vcpus": 8, "topology": {"threads_per_core": 1,
                   "cores_per_die": 1, "dies_per_package": 1, "packages": 8}})
        );
        assert_eq!(
            record.config["memory"], before["memory"],
            "only the field named"
        );
        stage(&mut record, &s, MachineField::MemoryMib).unwrap();
        assert_eq!(
            record.config["memory"],
            json!({"size": 1536u64 << 20, "hotplug_size": 2560u64 << 20})
        );
        assert!(sizes_differ(&before, &record.config));
        assert!(!sizes_differ(&record.config, &record.config.clone()));
        let two = spec(json!({"network": [{"macAddress": "52:54:00:00:00:0a"}, {"mtu": 1400}]}));
        stage(&mut record, &two, MachineField::Networks).unwrap();
        assert_eq!(record.macs[0], "52:54:00:00:00:0a");
        assert_eq!(record.config["net"][1]["id"], "net1");
        assert_eq!(record.config["net"][1]["mtu"], 1400);
        assert_eq!(record.interfaces.len(), 2);

        // A new topology for the next boot: a size difference, so the VM is made anew.
        let staged = record.config.clone();
        let four = spec(json!({"cpus": 6, "maxCPUs": 8, "coresPerSocket": 4}));
        stage(&mut record, &four, MachineField::CoresPerSocket).unwrap();
        assert_eq!(
            record.config["cpus"]["topology"],
            json!({"threads_per_core": 1, "cores_per_die": 4, "dies_per_package": 1, "packages": 2})
        );
        assert!(sizes_differ(&staged, &record.config));
        // One the maximum does not fill: refused, nothing written.
        let before = record.config.clone();
        let three = spec(json!({"cpus": 6, "maxCPUs": 8, "coresPerSocket": 3}));
        let err = stage(&mut record, &three, MachineField::CoresPerSocket).unwrap_err();
        assert_eq!(err.reason, "CpuTopologyMismatch");
        assert_eq!(record.config, before);
    }

    #[test]
    fn resources_are_read_from_the_vm_configuration_and_the_files() {
        let dir = tempfile::tempdir().unwrap();
        let os = dir.path().join("disk.raw");
        std::fs::File::create(&os)
            .unwrap()
            .set_len(3 << 30)
            .unwrap();
        std::fs::File::create(dir.path().join("data-0.raw"))
            .unwrap()
            .set_len(2 << 30)
            .unwrap();
        let record = Record {
            disk_names: vec!["data".into()],
            ..Default::default()
        };
        // After a live resize: CH has set size to what was added; the room stays.
        let config = json!({
            "cpus": {"boot_vcpus": 3, "max_vcpus": 4},
            "memory": {"size": 1536u64 << 20, "hotplug_size": 1u64 << 30},
            "disks": [{"id": "os", "path": os, "image_type": "Raw"}],
            "net": [{"id": "net0"}, {"id": "net1"}]
        });
        let r = resources(dir.path(), &record, &config, Some(1 << 30));
        assert_eq!(r.cpus, 3);
        assert_eq!(r.max_cpus, Some(4));
        assert_eq!(r.memory_mib, 1536);
        assert_eq!(
            r.max_memory_mib,
            Some(2048),
            "created with 1024 + 1024 room"
        );
        assert_eq!(r.os_disk_gib, Some(3));
        assert_eq!(
            r.data_disks,
            [DiskSize {
                name: "data".into(),
                size_gib: 2
            }]
        );
        assert_eq!(r.networks, 2);
        assert_eq!(r.cores_per_socket, None, "made without a topology: unknown");
        let mut with = config.clone();
        with["cpus"]["topology"] = json!({"threads_per_core": 1, "cores_per_die": 2, "dies_per_package": 1, "packages": 2});
        assert_eq!(
            resources(dir.path(), &record, &with, None).cores_per_socket,
            Some(2)
        );
        // Without a hot-plug room the ceiling is the size.
        let fixed =
            json!({"cpus": {"boot_vcpus": 1, "max_vcpus": 1}, "memory": {"size": 512u64 << 20}});
        assert_eq!(
            resources(dir.path(), &record, &fixed, None).max_memory_mib,
            Some(512)
        );
    }

    #[test]
    fn the_table_lists_only_what_is_implemented() {
        use ChangeMode::*;
        let table = change_table();
        let mode = |f, grows| banlieue_sdk::changes::mode(&table, f, grows);
        assert_eq!(mode(MachineField::Cpus, true), Live);
        assert_eq!(mode(MachineField::Cpus, false), Live);
        assert_eq!(mode(MachineField::MemoryMib, true), Live);
        assert_eq!(mode(MachineField::MemoryMib, false), NextBoot);
        assert_eq!(mode(MachineField::DataDiskSize, true), Live);
        assert_eq!(mode(MachineField::Networks, true), Live);
        assert_eq!(mode(MachineField::Networks, false), Live);
        assert_eq!(mode(MachineField::CoresPerSocket, true), NextBoot);
        assert_eq!(mode(MachineField::CoresPerSocket, false), NextBoot);
        for never in [
            MachineField::OsDiskSize,
            MachineField::DataDisks,
            MachineField::Firmware,
        ] {
            assert_eq!(mode(never, true), Never, "{never:?}");
        }
    }
}
