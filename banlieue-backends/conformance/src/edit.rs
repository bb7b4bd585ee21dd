//! How the suite edits a machine's spec so that one field of the change table differs:
//! pure functions over the in-tree kinds' specs, which a [`crate::Target`] may replace
//! (a kind declared out of tree, a lab whose networks cannot be duplicated).

use banlieue_sdk::api::common::{Firmware, Ipam};
use banlieue_sdk::api::infra::MachineDisk;
use banlieue_sdk::api::resources::{MachineField, MachineResources};
use banlieue_sdk::backend::MachineSpec;

/// The name of the data disk the suite adds (then grows, then removes).
pub const DATA_DISK: &str = "conformance-data";

/// Memory is changed by this much: a multiple of 128 MiB, which every backend's
/// memory granularity divides (Cloud Hypervisor hot-plugs in 128 MiB blocks).
pub const MEMORY_STEP_MIB: u64 = 512;

/// Edits `spec` so that `field` grows (a larger value, an added item) or shrinks,
/// given what the machine runs with (`running`, as read back). `Err` says why this
/// spec cannot express that change (a kind without a CPU topology, nothing to remove).
///
/// Disks only grow (admission refuses a smaller size), so `OsDiskSize` and
/// `DataDiskSize` have no shrink; `DataDisks` shrinks by removing the disk the suite
/// added.
pub fn edit(
    spec: &mut MachineSpec,
    running: &MachineResources,
    field: MachineField,
    grow: bool,
) -> Result<(), String> {
    use MachineField as F;
    match field {
        F::Cpus => cpus(spec, grow),
        F::CoresPerSocket => cores_per_socket(spec, grow),
        F::MemoryMib => memory(spec, grow),
        F::OsDiskSize => os_disk(spec, running, grow),
        F::DataDiskSize => data_disk_size(spec, grow),
        F::DataDisks => data_disks(spec, grow),
        F::Networks => networks(spec, grow),
        F::Firmware => firmware(spec),
    }
}

fn step(value: u32, by: u32, grow: bool, what: &str) -> Result<u32, String> {
    if grow {
        return Ok(value + by);
    }
    match value.checked_sub(by) {
        Some(v) if v >= 1 => Ok(v),
        _ => Err(format!("{what} is {value}: it cannot lose {by}")),
    }
}

fn cpus(spec: &mut MachineSpec, grow: bool) -> Result<(), String> {
    match spec {
        // vSphere wants numCPUs a multiple of the cores per socket: one socket more.
        MachineSpec::VSphere(s) => {
            let by = s.num_cores_per_socket.unwrap_or(1);
            s.num_cpus = step(s.num_cpus, by, grow, "numCPUs")?;
        }
        // Proxmox's CPUs are sockets × cores: one socket more.
        MachineSpec::Proxmox(s) => s.sockets = step(s.sockets, 1, grow, "sockets")?,
        MachineSpec::Libvirt(s) => s.cpus = step(s.cpus, 1, grow, "cpus")?,
        MachineSpec::CloudHypervisor(s) => s.cpus = step(s.cpus, 1, grow, "cpus")?,
        MachineSpec::Custom(s) => s.cpus = step(s.cpus, 1, grow, "cpus")?,
        other => return Err(format!("no CPU edit for a {}", other.kind())),
    }
    Ok(())
}

/// The next divisor of `of` above (or below) `now`: a topology that still holds
/// `what` (`numCPUs`, or the most vCPUs) with the CPU count unchanged.
fn next_divisor(of: u32, now: u32, grow: bool, what: &str) -> Result<u32, String> {
    let divisors = (1..=of).filter(|d| of.is_multiple_of(*d));
    let next = if grow {
        divisors.filter(|d| *d > now).min()
    } else {
        divisors.filter(|d| *d < now).max()
    };
    next.ok_or_else(|| {
        format!(
            "{what} {of} has no divisor {} than {now} cores per socket",
            if grow { "larger" } else { "smaller" }
        )
    })
}

fn cores_per_socket(spec: &mut MachineSpec, grow: bool) -> Result<(), String> {
    match spec {
        // The next divisor of numCPUs up (or down): the CPU count stays.
        MachineSpec::VSphere(s) => {
            let now = s.num_cores_per_socket.unwrap_or(1);
            s.num_cores_per_socket = Some(next_divisor(s.num_cpus, now, grow, "numCPUs")?);
        }
        // Proxmox's cores per socket (the CPU count follows).
        MachineSpec::Proxmox(s) => s.cores = step(s.cores, 1, grow, "cores")?,
        // libvirt's and Cloud Hypervisor's topology holds the most vCPUs (maxCPUs, else
        // cpus): the next divisor of that (unset is one core per socket).
        MachineSpec::Libvirt(s) => {
            let max = s.max_cpus.unwrap_or(s.cpus).max(s.cpus);
            let now = s.cores_per_socket.unwrap_or(1);
            s.cores_per_socket = Some(next_divisor(max, now, grow, "maxCPUs")?);
        }
        MachineSpec::CloudHypervisor(s) => {
            let max = s.max_cpus.unwrap_or(s.cpus).max(s.cpus);
            let now = s.cores_per_socket.unwrap_or(1);
            s.cores_per_socket = Some(next_divisor(max, now, grow, "maxCPUs")?);
        }
        other => {
            return Err(format!(
                "a {} has no CPU topology to edit (it lists coresPerSocket in its table: \
                 give the target an edit for it)",
                other.kind()
            ));
        }
    }
    Ok(())
}

fn memory(spec: &mut MachineSpec, grow: bool) -> Result<(), String> {
    let memory = match spec {
        MachineSpec::VSphere(s) => &mut s.memory_mib,
        MachineSpec::Proxmox(s) => &mut s.memory_mib,
        MachineSpec::Libvirt(s) => &mut s.memory_mib,
        MachineSpec::CloudHypervisor(s) => &mut s.memory_mib,
        MachineSpec::Custom(s) => &mut s.memory_mib,
        other => return Err(format!("no memory edit for a {}", other.kind())),
    };
    if grow {
        *memory += MEMORY_STEP_MIB;
    } else if *memory > MEMORY_STEP_MIB {
        *memory -= MEMORY_STEP_MIB;
    } else {
        return Err(format!(
            "memoryMiB is {memory}: it cannot lose {MEMORY_STEP_MIB}"
        ));
    }
    Ok(())
}

fn os_disk(spec: &mut MachineSpec, running: &MachineResources, grow: bool) -> Result<(), String> {
    if !grow {
        return Err("a disk never shrinks (admission refuses it)".to_owned());
    }
    let disk = match spec {
        MachineSpec::VSphere(s) => &mut s.disk_gib,
        MachineSpec::Proxmox(s) => &mut s.disk_gib,
        MachineSpec::Libvirt(s) => &mut s.disk_gib,
        MachineSpec::CloudHypervisor(s) => &mut s.disk_gib,
        other => return Err(format!("no OS disk edit for a {}", other.kind())),
    };
    // The size asked is a floor: grow from what runs, when that is larger.
    let now = match (*disk, running.os_disk_gib) {
        (Some(asked), Some(runs)) => asked.max(runs),
        (Some(asked), None) => asked,
        (None, Some(runs)) => runs,
        (None, None) => {
            return Err(
                "neither the spec nor the machine's resources give the OS disk's size".into(),
            );
        }
    };
    *disk = Some(now + 1);
    Ok(())
}

fn disks(spec: &mut MachineSpec) -> Result<&mut Vec<MachineDisk>, String> {
    match spec {
        MachineSpec::VSphere(s) => Ok(&mut s.additional_disks),
        MachineSpec::Proxmox(s) => Ok(&mut s.additional_disks),
        MachineSpec::Libvirt(s) => Ok(&mut s.additional_disks),
        MachineSpec::CloudHypervisor(s) => Ok(&mut s.additional_disks),
        other => Err(format!("no data disk edit for a {}", other.kind())),
    }
}

fn data_disk_size(spec: &mut MachineSpec, grow: bool) -> Result<(), String> {
    if !grow {
        return Err("a disk never shrinks (admission refuses it)".to_owned());
    }
    let disk = disks(spec)?
        .last_mut()
        .ok_or("the machine has no data disk to grow (give it one, or list dataDisks)")?;
    disk.size_gib += 1;
    Ok(())
}

fn data_disks(spec: &mut MachineSpec, grow: bool) -> Result<(), String> {
    let list = disks(spec)?;
    if grow {
        // Where the target's own disks are (the same storage), so that it is valid there.
        let storage = list.last().and_then(|d| d.storage.clone());
        let name = (1..)
            .map(|n| match n {
                1 => DATA_DISK.to_owned(),
                n => format!("{DATA_DISK}-{n}"),
            })
            .find(|n| !list.iter().any(|d| &d.name == n))
            .unwrap_or_else(|| DATA_DISK.to_owned());
        list.push(MachineDisk {
            name,
            size_gib: 1,
            storage,
            ..Default::default()
        });
        return Ok(());
    }
    let at = list
        .iter()
        .rposition(|d| d.name.starts_with(DATA_DISK))
        .ok_or("no data disk the suite added to remove")?;
    list.remove(at);
    Ok(())
}

fn networks(spec: &mut MachineSpec, grow: bool) -> Result<(), String> {
    // A copy of the last device, on the same network, with a MAC and addresses of its
    // own (DHCP): two devices with one MAC or one static address are not a machine.
    macro_rules! edit {
        ($list:expr) => {{
            let list = &mut $list;
            if grow {
                let mut added = list
                    .last()
                    .cloned()
                    .ok_or("the machine has no network device to copy")?;
                added.mac_address = None;
                added.ipam = Ipam::default();
                list.push(added);
            } else if list.len() > 1 {
                list.pop();
            } else {
                return Err(format!(
                    "the machine has {} network device(s): none to remove",
                    list.len()
                ));
            }
        }};
    }
    match spec {
        MachineSpec::VSphere(s) => edit!(s.network),
        MachineSpec::Proxmox(s) => edit!(s.network),
        MachineSpec::Libvirt(s) => edit!(s.network),
        MachineSpec::CloudHypervisor(s) => edit!(s.network),
        other => return Err(format!("no network edit for a {}", other.kind())),
    }
    Ok(())
}

fn firmware(spec: &mut MachineSpec) -> Result<(), String> {
    let flip = |f: Firmware| match f {
        Firmware::Bios => Firmware::Efi,
        _ => Firmware::Bios,
    };
    match spec {
        MachineSpec::VSphere(s) => s.firmware = Some(flip(s.firmware.unwrap_or_default())),
        MachineSpec::Proxmox(s) => s.firmware = Some(flip(s.firmware.unwrap_or_default())),
        MachineSpec::Libvirt(s) => s.firmware = flip(s.firmware),
        other => return Err(format!("no firmware edit for a {}", other.kind())),
    }
    Ok(())
}

/// A provider ID like `existing` that names no machine: its last hexadecimal digit
/// changed. A target whose IDs could collide that way (a Proxmox VMID next to
/// another) gives its own with [`crate::Target::missing_provider_id`].
pub fn missing_provider_id(existing: &str) -> String {
    let mut chars: Vec<char> = existing.chars().collect();
    if let Some(at) = chars.iter().rposition(|c| c.is_ascii_hexdigit()) {
        chars[at] = match chars[at] {
            '9' => '0',
            'f' => 'a',
            'F' => 'A',
            c => char::from(c as u8 + 1),
        };
        chars.into_iter().collect()
    } else {
        format!("{existing}-missing")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vsphere(cpus: u32, cores: Option<u32>) -> MachineSpec {
        MachineSpec::VSphere(
            serde_json::from_value(json!({
                "template": "t", "numCPUs": cpus, "numCoresPerSocket": cores, "memoryMiB": 1024,
                "network": [{"networkName": "VM Network", "macAddress": "00:50:56:3f:00:11"}],
            }))
            .unwrap(),
        )
    }

    fn libvirt() -> MachineSpec {
        MachineSpec::Libvirt(
            serde_json::from_value(json!({
                "image": {"path": "/i.qcow2"}, "cpus": 1, "memoryMiB": 512,
                "network": [{"network": "default"}],
            }))
            .unwrap(),
        )
    }

    fn cloud_hypervisor(cpus: u32, max: u32, cores: Option<u32>) -> MachineSpec {
        MachineSpec::CloudHypervisor(
            serde_json::from_value(json!({
                "image": {"kernel": "/k", "disk": "/d.raw"}, "cpus": cpus, "maxCPUs": max,
                "coresPerSocket": cores, "memoryMiB": 512,
            }))
            .unwrap(),
        )
    }

    fn edited(
        mut spec: MachineSpec,
        field: MachineField,
        grow: bool,
    ) -> Result<MachineSpec, String> {
        let running = spec.resources();
        edit(&mut spec, &running, field, grow).map(|()| spec)
    }

    #[test]
    fn each_edit_makes_exactly_its_field_differ() {
        use MachineField as F;
        // (spec, field, grow, the fields that then differ)
        let cases: Vec<(MachineSpec, F, bool, Vec<F>)> = vec![
            (vsphere(2, None), F::Cpus, true, vec![F::Cpus]),
            (vsphere(4, Some(2)), F::Cpus, false, vec![F::Cpus]),
            (
                vsphere(4, Some(1)),
                F::CoresPerSocket,
                true,
                vec![F::CoresPerSocket],
            ),
            (vsphere(2, None), F::MemoryMib, true, vec![F::MemoryMib]),
            (vsphere(2, None), F::Networks, true, vec![F::Networks]),
            (libvirt(), F::Cpus, true, vec![F::Cpus]),
            (
                cloud_hypervisor(1, 4, None),
                F::CoresPerSocket,
                true,
                vec![F::CoresPerSocket],
            ),
            (
                cloud_hypervisor(1, 4, Some(4)),
                F::CoresPerSocket,
                false,
                vec![F::CoresPerSocket],
            ),
            (libvirt(), F::DataDisks, true, vec![F::DataDisks]),
            (libvirt(), F::Firmware, true, vec![F::Firmware]),
        ];
        for (spec, field, grow, differ) in cases {
            let after = edited(spec.clone(), field, grow).unwrap();
            let found: Vec<F> =
                banlieue_sdk::changes::differences(&after.resources(), &spec.resources())
                    .into_iter()
                    .map(|d| d.field)
                    .collect();
            assert_eq!(found, differ, "{field:?} grow={grow} on {}", spec.kind());
        }
    }

    #[test]
    fn an_added_network_device_has_no_mac_of_its_own() {
        let MachineSpec::VSphere(s) =
            edited(vsphere(2, None), MachineField::Networks, true).unwrap()
        else {
            unreachable!()
        };
        assert_eq!(s.network.len(), 2);
        assert_eq!(
            s.network[0].mac_address.as_deref(),
            Some("00:50:56:3f:00:11")
        );
        assert_eq!(s.network[1].mac_address, None);
    }

    #[test]
    fn what_cannot_be_expressed_says_why() {
        use MachineField as F;
        for (spec, field, grow) in [
            (vsphere(1, None), F::Cpus, false),
            (vsphere(3, Some(3)), F::CoresPerSocket, true),
            (vsphere(2, None), F::OsDiskSize, false),
            (vsphere(2, None), F::DataDiskSize, true),
            (vsphere(2, None), F::Networks, false),
            // One vCPU at most: no topology but one core per socket.
            (libvirt(), F::CoresPerSocket, true),
            (libvirt(), F::CoresPerSocket, false),
            (cloud_hypervisor(1, 3, Some(3)), F::CoresPerSocket, true),
            (libvirt(), F::DataDisks, false),
        ] {
            let why = edited(spec, field, grow).unwrap_err();
            assert!(!why.is_empty());
        }
    }

    /// The cores per socket of libvirt and Cloud Hypervisor step through the divisors
    /// of the most vCPUs (maxCPUs), whatever cpus is.
    #[test]
    fn cores_per_socket_divide_the_most_vcpus() {
        let cores = |spec: &MachineSpec| spec.resources().cores_per_socket;
        let spec = cloud_hypervisor(1, 4, None);
        let two = edited(spec, MachineField::CoresPerSocket, true).unwrap();
        assert_eq!(cores(&two), Some(2));
        let four = edited(two, MachineField::CoresPerSocket, true).unwrap();
        assert_eq!(cores(&four), Some(4));
        let MachineSpec::Libvirt(mut s) = libvirt() else {
            unreachable!()
        };
        s.cpus = 2;
        s.max_cpus = Some(6);
        s.cores_per_socket = Some(3);
        let down = edited(MachineSpec::Libvirt(s), MachineField::CoresPerSocket, false).unwrap();
        assert_eq!(cores(&down), Some(2));
    }

    #[test]
    fn a_data_disk_is_added_grown_and_removed() {
        let spec = edited(libvirt(), MachineField::DataDisks, true).unwrap();
        let spec = edited(spec, MachineField::DataDiskSize, true).unwrap();
        assert_eq!(
            spec.resources().data_disks,
            vec![banlieue_sdk::api::resources::DiskSize {
                name: DATA_DISK.into(),
                size_gib: 2
            }]
        );
        let spec = edited(spec, MachineField::DataDisks, false).unwrap();
        assert!(spec.resources().data_disks.is_empty());
    }

    #[test]
    fn a_missing_provider_id_differs_in_its_last_digit() {
        assert_eq!(
            missing_provider_id("vsphere://4201-abcf"),
            "vsphere://4201-abca"
        );
        assert_eq!(
            missing_provider_id("proxmox://pve/109"),
            "proxmox://pve/100"
        );
        assert_eq!(missing_provider_id("sim://x"), "sim://x-missing");
        assert_ne!(missing_provider_id("libvirt://0b9e"), "libvirt://0b9e");
    }
}
