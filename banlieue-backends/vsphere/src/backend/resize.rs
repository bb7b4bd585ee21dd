//! Change on a VM that exists (issue 38): what it runs with, read back from its
//! config ([`resources`]), and the one `ReconfigVM_Task` that applies the fields the
//! controller hands over ([`resize_spec`]). Both are pure functions over the VM as it
//! was read ([`Vm`]); the task itself is started by `apply_changes`.

use banlieue_sdk::api::common::{Firmware, PowerState};
use banlieue_sdk::api::resources::{DiskSize, MachineField, MachineResources};
use banlieue_sdk::backend::BackendError;

use super::vm::Vm;
use crate::client::methods::ConfigSpec;
use crate::{devices, guestinfo};

const GIB: u64 = 1024 * 1024 * 1024;

fn gib(bytes: u64) -> u32 {
    u32::try_from(bytes / GIB).unwrap_or(u32::MAX)
}

/// The names banlieue recorded for the disks it added, by location.
fn disk_names(vm: &Vm) -> std::collections::BTreeMap<String, String> {
    vm.extra
        .get(guestinfo::DISK_NAMES_KEY)
        .map(|v| guestinfo::parse_disk_names(v))
        .unwrap_or_default()
}

/// The machine's additional disks, by name: the names banlieue recorded for the disks
/// it added (by location), and, on a machine created on imported disks, each disk's
/// file name under `banlieue/` (what the import named it, as an export does); the OS
/// disk and a template's other disks are not among them.
fn data_disks(vm: &Vm) -> Vec<(String, devices::VirtualDisk)> {
    let disks = devices::virtual_disks(&vm.devices);
    let names = disk_names(vm);
    let os = devices::os_disk_index(&disks, &names);
    disks
        .into_iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != os)
        .filter_map(|(_, d)| {
            let name = names.get(&d.location).cloned().or_else(|| {
                let file = d.file.as_ref()?;
                file.path
                    .starts_with("banlieue/")
                    .then(|| file.file_name().strip_suffix(".vmdk"))
                    .flatten()
                    .map(str::to_string)
            })?;
            Some((name, d))
        })
        .collect()
}

/// The OS disk ([`devices::os_disk_index`]).
fn os_disk(vm: &Vm) -> Option<devices::VirtualDisk> {
    let mut disks = devices::virtual_disks(&vm.devices);
    let i = devices::os_disk_index(&disks, &disk_names(vm))?;
    Some(disks.swap_remove(i))
}

/// What `vm` runs with, read from its config: `numCPU`, `numCoresPerSocket`,
/// `memoryMB`, the OS disk's capacity ([`os_disk`]), the disks banlieue added by
/// the names it recorded for them ([`guestinfo::DISK_NAMES_KEY`]; a template's other
/// disks are not the machine's data disks), the number of network devices, and the
/// firmware (`efi` with Secure Boot on is `efi-secure`).
///
/// The hot-add ceilings are reported as vSphere has them: a VM without
/// `cpuHotAddEnabled` (or `memoryHotAddEnabled`) can have live no more than it has
/// now, so its ceiling is what it has; with hot-add, the ceiling is the host's and
/// none is reported.
pub(crate) fn resources(vm: &Vm) -> MachineResources {
    let mut data_disks: Vec<DiskSize> = data_disks(vm)
        .into_iter()
        .map(|(name, d)| DiskSize {
            name,
            size_gib: gib(d.capacity_bytes),
        })
        .collect();
    data_disks.sort();
    MachineResources {
        cpus: vm.cpus,
        cores_per_socket: vm.cores_per_socket,
        memory_mib: vm.memory_mib,
        os_disk_gib: os_disk(vm).map(|d| gib(d.capacity_bytes)),
        data_disks,
        networks: u32::try_from(devices::nic_count(&vm.devices)).unwrap_or(u32::MAX),
        firmware: match vm.firmware.as_deref() {
            Some("bios") => Some(Firmware::Bios),
            Some("efi") if vm.secure_boot => Some(Firmware::EfiSecure),
            Some("efi") => Some(Firmware::Efi),
            _ => None,
        },
        max_cpus: (!vm.cpu_hot_add).then_some(vm.cpus),
        max_memory_mib: (!vm.memory_hot_add).then_some(vm.memory_mib),
    }
}

/// The reconfigure that gives `vm` the `fields` of `desired`, or `None` when it has
/// them already (idempotent: a field read back as asked adds nothing).
///
/// More CPUs (memory) are added to a running VM only when it has CPU (memory) hot-add
/// and the spec's own ceiling (`maxCPUs`, `maxMemoryMiB`) allows them; fewer, cores per
/// socket, and more without hot-add are set only on a powered-off VM (the change table
/// and the ceiling [`resources`] reports make them `PowerOff`). A running VM asked
/// anyway is a transient `PowerOffRequired` naming the field, never a reconfigure
/// vSphere would refuse. A CPU or memory change made while the VM is off also sets its
/// hot-add flag as the spec asks now, when it differs (vSphere changes it only
/// then). Disks grow in any power state (vSphere extends a `VirtualDisk` live); a
/// smaller size is refused (admission refuses it before). Every other field is a
/// terminal `ChangeUnsupported` naming it: the table lists none of them.
pub(crate) fn resize_spec(
    vm: &Vm,
    desired: &MachineResources,
    fields: &[MachineField],
) -> Result<Option<ConfigSpec>, BackendError> {
    use MachineField as F;
    let have = resources(vm);
    let off = vm.power == PowerState::PoweredOff;
    let mut config = ConfigSpec::default();
    let needs_off = |field: MachineField, why: &str| {
        if off {
            Ok(())
        } else {
            Err(BackendError::transient(
                "PowerOffRequired",
                format!(
                    "{} changes only while the VM is powered off ({why} on {})",
                    field.as_str(),
                    vm.name
                ),
            ))
        }
    };
    // Whether a running VM takes `want` live: a raise, with hot-add, within the
    // spec's ceiling; else why not.
    let live = |hot_add: bool, want: u64, have: u64, max: Option<u64>| {
        if want < have {
            Err("no hot-remove")
        } else if !hot_add {
            Err("no hot-add")
        } else if max.is_some_and(|max| want > max) {
            Err("beyond the spec's maximum")
        } else {
            Ok(())
        }
    };
    for &field in fields {
        match field {
            F::Cpus if desired.cpus != have.cpus => {
                if let Err(why) = live(
                    vm.cpu_hot_add,
                    desired.cpus.into(),
                    have.cpus.into(),
                    desired.max_cpus.map(u64::from),
                ) {
                    needs_off(field, why)?;
                }
                config.num_cpus = Some(desired.cpus);
                if off && vm.cpu_hot_add != desired.max_cpus.is_some() {
                    config.cpu_hot_add = Some(desired.max_cpus.is_some());
                }
            }
            F::CoresPerSocket => {
                if let Some(want) = desired.cores_per_socket
                    && Some(want) != have.cores_per_socket
                {
                    needs_off(field, "a topology change")?;
                    config.num_cores_per_socket = Some(want);
                }
            }
            F::MemoryMib if desired.memory_mib != have.memory_mib => {
                if let Err(why) = live(
                    vm.memory_hot_add,
                    desired.memory_mib,
                    have.memory_mib,
                    desired.max_memory_mib,
                ) {
                    needs_off(field, why)?;
                }
                config.memory_mib = Some(desired.memory_mib);
                if off && vm.memory_hot_add != desired.max_memory_mib.is_some() {
                    config.memory_hot_add = Some(desired.max_memory_mib.is_some());
                }
            }
            F::Cpus | F::MemoryMib => {}
            F::OsDiskSize => {
                if let (Some(want), Some(os)) = (desired.os_disk_gib, os_disk(vm)) {
                    config.device_change.extend(devices::disk_grow_at(
                        &vm.devices,
                        &os.location,
                        want,
                    ));
                }
            }
            F::DataDiskSize => {
                let made = data_disks(vm);
                for want in &desired.data_disks {
                    let Some(location) = made
                        .iter()
                        .find(|(name, _)| *name == want.name)
                        .map(|(_, d)| &d.location)
                    else {
                        continue; // not made yet: a DataDisks change, not a size
                    };
                    if let Some(have) = have.data_disks.iter().find(|d| d.name == want.name)
                        && want.size_gib < have.size_gib
                    {
                        return Err(BackendError::terminal(
                            "DiskShrinkRefused",
                            format!(
                                "dataDiskSize: disk {} cannot shrink from {} to {} GiB",
                                want.name, have.size_gib, want.size_gib
                            ),
                        ));
                    }
                    config.device_change.extend(devices::disk_grow_at(
                        &vm.devices,
                        location,
                        want.size_gib,
                    ));
                }
            }
            F::DataDisks | F::Networks | F::Firmware => {
                return Err(BackendError::terminal(
                    "ChangeUnsupported",
                    format!(
                        "{} cannot change on a vSphere VM that exists (a new machine is needed)",
                        field.as_str()
                    ),
                ));
            }
        }
    }
    Ok((config != ConfigSpec::default()).then_some(config))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{Element, MoRef};

    fn disk(key: &str, unit: &str, kb: u64) -> Element {
        Element {
            name: "VirtualDevice".into(),
            xsi_type: Some("VirtualDisk".into()),
            children: vec![
                Element::leaf("key", key),
                Element::leaf("controllerKey", "1000"),
                Element::leaf("unitNumber", unit),
                Element::leaf("capacityInKB", kb.to_string()),
            ],
            ..Default::default()
        }
    }

    fn nic() -> Element {
        Element {
            name: "VirtualDevice".into(),
            xsi_type: Some("VirtualVmxnet3".into()),
            children: vec![
                Element::leaf("key", "4000"),
                Element::leaf("addressType", "generated"),
                Element::leaf("macAddress", "00:50:56:00:00:01"),
            ],
            ..Default::default()
        }
    }

    const KB_PER_GIB: u64 = 1024 * 1024;

    fn vm(power: PowerState) -> Vm {
        Vm {
            moref: MoRef::new("VirtualMachine", "vm-1"),
            name: "m".into(),
            bios_uuid: None,
            instance_uuid: None,
            extra: [(
                guestinfo::DISK_NAMES_KEY.to_string(),
                r#"{"1000:1":"data"}"#.to_string(),
            )]
            .into(),
            power,
            ips: vec![],
            tools_running: false,
            firmware: Some("efi".into()),
            secure_boot: true,
            cpus: 2,
            cores_per_socket: Some(1),
            memory_mib: 2048,
            cpu_hot_add: false,
            memory_hot_add: true,
            // In the order vSphere lists them after an edit of the OS disk: last.
            devices: vec![
                disk("2001", "1", 30 * KB_PER_GIB),
                // A disk of the template's that banlieue did not add: not a data disk.
                disk("2002", "2", KB_PER_GIB),
                nic(),
                disk("2000", "0", 16 * KB_PER_GIB),
            ],
        }
    }

    #[test]
    fn what_runs_is_read_from_the_config_and_the_disks_by_their_names() {
        let r = resources(&vm(PowerState::PoweredOn));
        assert_eq!(
            (r.cpus, r.cores_per_socket, r.memory_mib),
            (2, Some(1), 2048)
        );
        assert_eq!(r.os_disk_gib, Some(16));
        assert_eq!(
            r.data_disks,
            [DiskSize {
                name: "data".into(),
                size_gib: 30
            }]
        );
        assert_eq!(r.networks, 1);
        assert_eq!(r.firmware, Some(Firmware::EfiSecure));
        // No CPU hot-add: it can run no more CPUs than it has; memory hot-add: no
        // ceiling of its own.
        assert_eq!((r.max_cpus, r.max_memory_mib), (Some(2), None));
    }

    fn asked() -> MachineResources {
        resources(&vm(PowerState::PoweredOff))
    }

    #[test]
    fn cpus_cores_and_memory_change_only_while_off_in_one_reconfigure() {
        let mut want = asked();
        want.cpus = 4;
        want.cores_per_socket = Some(2);
        want.memory_mib = 4096;
        // No hot-add asked (what was read back as ceilings is not a spec's).
        (want.max_cpus, want.max_memory_mib) = (None, None);
        let fields = [
            MachineField::Cpus,
            MachineField::CoresPerSocket,
            MachineField::MemoryMib,
        ];
        let spec = resize_spec(&vm(PowerState::PoweredOff), &want, &fields)
            .unwrap()
            .unwrap();
        assert_eq!(
            (spec.num_cpus, spec.num_cores_per_socket, spec.memory_mib),
            (Some(4), Some(2), Some(4096))
        );
        assert!(spec.device_change.is_empty());
        for power in [PowerState::PoweredOn, PowerState::Suspended] {
            let mut no_hot_add = vm(power);
            no_hot_add.memory_hot_add = false;
            for field in fields {
                let e = resize_spec(&no_hot_add, &want, &[field]).unwrap_err();
                assert_eq!(e.reason, "PowerOffRequired");
                assert!(e.is_transient() && e.message.contains(field.as_str()));
            }
        }
        // The memory rode without hot-add asked: the flag vm() has is turned off with it.
        assert_eq!(
            resize_spec(&vm(PowerState::PoweredOff), &want, &fields)
                .unwrap()
                .unwrap()
                .memory_hot_add,
            Some(false)
        );
        // Already so: nothing to do, whatever the power state.
        assert_eq!(
            resize_spec(&vm(PowerState::PoweredOn), &asked(), &fields).unwrap(),
            None
        );
    }

    #[test]
    fn with_hot_add_cpus_and_memory_grow_live_within_the_spec_ceiling() {
        let mut hot = vm(PowerState::PoweredOn);
        (hot.cpu_hot_add, hot.memory_hot_add) = (true, true);
        let fields = [MachineField::Cpus, MachineField::MemoryMib];
        // (desired cpus, memory, maxCPUs, maxMemoryMiB, VM with hot-add, Ok(cpus, memory) or the refusal)
        type Case = (
            u32,
            u64,
            Option<u32>,
            Option<u64>,
            bool,
            Result<(Option<u32>, Option<u64>), &'static str>,
        );
        let cases: [Case; 6] = [
            (
                4,
                4096,
                Some(8),
                Some(8192),
                true,
                Ok((Some(4), Some(4096))),
            ),
            (4, 2048, None, None, true, Ok((Some(4), None))),
            (4, 4096, Some(8), Some(8192), false, Err("no hot-add")),
            (1, 2048, Some(8), None, true, Err("no hot-remove")),
            (2, 1024, None, Some(4096), true, Err("no hot-remove")),
            // Beyond the spec's own ceiling (admission refuses such a spec): refused.
            (
                16,
                2048,
                Some(8),
                None,
                true,
                Err("beyond the spec's maximum"),
            ),
        ];
        for (cpus, memory, max_cpus, max_memory_mib, hot_add, want) in cases {
            let mut machine = hot.clone();
            (machine.cpu_hot_add, machine.memory_hot_add) = (hot_add, hot_add);
            let mut desired = asked();
            (desired.cpus, desired.memory_mib) = (cpus, memory);
            (desired.max_cpus, desired.max_memory_mib) = (max_cpus, max_memory_mib);
            let got = resize_spec(&machine, &desired, &fields);
            match want {
                Ok(sizes) => {
                    let spec = got.unwrap().unwrap();
                    assert_eq!((spec.num_cpus, spec.memory_mib), sizes, "{cpus} {memory}");
                    assert_eq!(
                        (spec.cpu_hot_add, spec.memory_hot_add),
                        (None, None),
                        "never changed on a running VM"
                    );
                }
                Err(why) => {
                    let e = got.unwrap_err();
                    assert_eq!(e.reason, "PowerOffRequired", "{cpus} {memory}");
                    assert!(e.message.contains(why), "{cpus} {memory}: {}", e.message);
                }
            }
        }
        // While off: the size, and hot-add as the spec asks now.
        let mut cold = vm(PowerState::PoweredOff);
        cold.memory_hot_add = false;
        let mut desired = asked();
        (desired.cpus, desired.max_cpus) = (4, Some(8));
        (desired.memory_mib, desired.max_memory_mib) = (4096, Some(8192));
        let spec = resize_spec(&cold, &desired, &fields).unwrap().unwrap();
        assert_eq!(
            (
                spec.num_cpus,
                spec.cpu_hot_add,
                spec.memory_mib,
                spec.memory_hot_add
            ),
            (Some(4), Some(true), Some(4096), Some(true))
        );
    }

    #[test]
    fn disks_grow_live_by_name_and_never_shrink() {
        let mut want = asked();
        want.os_disk_gib = Some(20);
        want.data_disks[0].size_gib = 40;
        let spec = resize_spec(
            &vm(PowerState::PoweredOn),
            &want,
            &[MachineField::OsDiskSize, MachineField::DataDiskSize],
        )
        .unwrap()
        .unwrap();
        let grown: Vec<(&str, &str)> = spec
            .device_change
            .iter()
            .map(|c| {
                (
                    c.device.text_at(&["key"]).unwrap(),
                    c.device.text_at(&["capacityInKB"]).unwrap(),
                )
            })
            .collect();
        let (os, data) = ((20 * KB_PER_GIB).to_string(), (40 * KB_PER_GIB).to_string());
        assert_eq!(grown, [("2000", os.as_str()), ("2001", data.as_str())]);
        assert!(spec.device_change.iter().all(|c| c.operation == "edit"));
        want.data_disks[0].size_gib = 10;
        let e = resize_spec(
            &vm(PowerState::PoweredOn),
            &want,
            &[MachineField::DataDiskSize],
        )
        .unwrap_err();
        assert_eq!(e.reason, "DiskShrinkRefused");
        // The OS disk asked smaller is a floor: nothing.
        want.os_disk_gib = Some(8);
        assert_eq!(
            resize_spec(
                &vm(PowerState::PoweredOn),
                &want,
                &[MachineField::OsDiskSize]
            )
            .unwrap(),
            None
        );
    }

    #[test]
    fn fields_the_table_does_not_list_are_refused_by_name() {
        for field in [
            MachineField::DataDisks,
            MachineField::Networks,
            MachineField::Firmware,
        ] {
            let e = resize_spec(&vm(PowerState::PoweredOff), &asked(), &[field]).unwrap_err();
            assert_eq!(e.reason, "ChangeUnsupported");
            assert!(!e.is_transient() && e.message.starts_with(field.as_str()));
        }
    }
}
