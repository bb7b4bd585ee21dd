//! The `VmConfig` banlieue sends with `vm.create`, from a `CloudHypervisorMachine`'s
//! spec and the machine's directory. Only fields the OpenAPI document names are used
//! (the tests check every request against it).

use std::path::Path;

use banlieue_sdk::api::infra::cloud_hypervisor::{
    CloudHypervisorMachineSpec, CloudHypervisorNetworkInterface,
};
use banlieue_sdk::api::vm_image::DiskFormat;
use banlieue_sdk::backend::BackendError;
use serde_json::{Value, json};

/// FNV-1a: a stable hash for names derived from the UID (no crypto needed).
fn fnv(text: &str) -> u64 {
    text.bytes().fold(0xcbf29ce484222325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
    })
}

/// The MAC of interface `index`: the spec's, else a stable locally administered one
/// derived from the UID (QEMU/KVM's `52:54:00` prefix), so DHCP leases follow the
/// machine across VMM restarts.
pub fn mac(uid: &str, index: usize, given: Option<&str>) -> String {
    if let Some(mac) = given {
        return mac.to_ascii_lowercase();
    }
    let h = fnv(&format!("{uid}/{index}"));
    format!(
        "52:54:00:{:02x}:{:02x}:{:02x}",
        (h >> 16) as u8,
        (h >> 8) as u8,
        h as u8
    )
}

/// The tap device of interface `index`: `bl` + 8 hex digits of the UID's hash + the
/// index, within Linux's 15-character limit, so it can be found again (to join a bridge).
pub fn tap(uid: &str, index: usize) -> String {
    format!("bl{:08x}n{index}", fnv(uid) as u32)
}

/// The file name of the OS disk for an image format.
pub fn os_disk_name(format: DiskFormat) -> &'static str {
    match format {
        DiskFormat::Raw => "disk.raw",
        DiskFormat::Qcow2 => "disk.qcow2",
    }
}

/// The file name of the additional disk at `index` (raw, sparse).
pub fn data_disk_name(index: usize) -> String {
    format!("data-{index}.raw")
}

fn image_type(format: DiskFormat) -> &'static str {
    match format {
        DiskFormat::Raw => "Raw",
        DiskFormat::Qcow2 => "Qcow2",
    }
}

/// What the OS disk file is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OsDisk {
    /// Its format (and so its file name, [`os_disk_name`]).
    pub format: DiskFormat,
    /// A qcow2 overlay whose backing file is the image, which CH opens only when
    /// told to (`backing_files`).
    pub overlay: bool,
}

impl OsDisk {
    /// The OS disk made from `spec`'s image; `overlay` when the settings ask for a
    /// qcow2 overlay (only a qcow2 image gets one).
    pub fn from_image(spec: &CloudHypervisorMachineSpec, overlay: bool) -> Self {
        Self {
            format: spec.image.format,
            overlay: overlay && spec.image.format == DiskFormat::Qcow2,
        }
    }

    /// An imported OS disk: a flat raw file.
    pub fn imported() -> Self {
        Self {
            format: DiskFormat::Raw,
            overlay: false,
        }
    }
}

/// The `VmConfig` for `spec`, with the files in `dir` and the OS disk `os`.
pub fn vm_config(
    uid: &str,
    spec: &CloudHypervisorMachineSpec,
    dir: &Path,
    macs: &[String],
    os: OsDisk,
) -> Result<Value, BackendError> {
    let image = &spec.image;
    let payload = match (&image.kernel, &image.firmware) {
        (Some(kernel), None) => {
            let mut p = json!({"kernel": kernel});
            if let Some(cmdline) = &image.cmdline {
                p["cmdline"] = json!(cmdline);
            }
            p
        }
        (None, Some(firmware)) => json!({"firmware": firmware}),
        _ => {
            return Err(BackendError::terminal(
                "InvalidImage",
                "the image must name exactly one of kernel or firmware",
            ));
        }
    };
    let path = |name: &str| dir.join(name).to_string_lossy().into_owned();
    let mut os_disk = json!({"id": "os", "path": path(os_disk_name(os.format)), "image_type": image_type(os.format)});
    if os.overlay {
        os_disk["backing_files"] = json!(true);
    }
    let mut disks = vec![
        os_disk,
        json!({"id": "cidata", "path": path("seed.img"), "readonly": true, "image_type": "Raw"}),
    ];
    for (i, _) in spec.additional_disks.iter().enumerate() {
        disks.push(json!({"id": format!("data{i}"), "path": path(&data_disk_name(i)), "image_type": "Raw"}));
    }
    let net: Vec<Value> = spec
        .network
        .iter()
        .zip(macs)
        .enumerate()
        .map(|(i, (nic, mac))| net(uid, i, nic, mac))
        .collect();
    Ok(json!({
        "payload": payload,
        "cpus": cpus(spec)?,
        "memory": memory(spec),
        "disks": disks,
        "net": net,
        "rng": {"src": "/dev/urandom"},
        "serial": {"mode": "File", "file": path("serial.log")},
        "console": {"mode": "Off"},
        // The UID as the SMBIOS system UUID and an OEM string: the guest sees who it is.
        // `uuid` (deprecated for `system_uuid` in newer releases) is what v48 takes.
        "platform": {"uuid": uid, "oem_strings": [format!("banlieue.io/uid={uid}")]},
    }))
}

/// The `NetConfig` of interface `index`: id `net<index>`, its tap and MAC, its MTU.
pub fn net(uid: &str, index: usize, nic: &CloudHypervisorNetworkInterface, mac: &str) -> Value {
    let mut n = json!({"id": format!("net{index}"), "tap": tap(uid, index), "mac": mac});
    if let Some(mtu) = nic.mtu {
        n["mtu"] = json!(mtu);
    }
    n
}

/// The MAC of every interface of `spec`, in order ([`mac`]).
pub fn macs(uid: &str, spec: &CloudHypervisorMachineSpec) -> Vec<String> {
    spec.network
        .iter()
        .enumerate()
        .map(|(i, nic)| mac(uid, i, nic.mac_address.as_deref()))
        .collect()
}

/// The `cpus` section: `cpus` at boot, room to hot-add up to `maxCPUs` (default: none),
/// and the topology: `coresPerSocket` (default 1) cores per die, one die per package,
/// one thread per core, as many packages as hold `max_vcpus`. Always set: without one
/// CH leaves the guest's CPUID topology as it finds it, which nobody asked for and
/// banlieue could not read back. CH refuses (`CpuTopologyCount`) a topology whose
/// product is not `max_vcpus`, so a maximum that is not a multiple of the cores is
/// refused here, by name (admission refuses it too; this is the last guard).
pub fn cpus(spec: &CloudHypervisorMachineSpec) -> Result<Value, BackendError> {
    let max = spec.max_cpus.unwrap_or(spec.cpus).max(spec.cpus);
    let cores = spec.cores_per_socket.unwrap_or(1);
    if cores == 0 || !max.is_multiple_of(cores) {
        return Err(BackendError::terminal(
            "CpuTopologyMismatch",
            format!(
                "the VM can have {max} vCPUs (maxCPUs, else cpus), which is not a multiple of \
                 coresPerSocket {cores}: Cloud Hypervisor's CPU topology (packages × cores) \
                 must hold exactly the most vCPUs the VM can have; make maxCPUs a multiple \
                 of coresPerSocket, or change coresPerSocket"
            ),
        ));
    }
    Ok(json!({
        "boot_vcpus": spec.cpus,
        "max_vcpus": max,
        "topology": {
            "threads_per_core": 1,
            "cores_per_die": cores,
            "dies_per_package": 1,
            "packages": max / cores,
        },
    }))
}

/// The `memory` section: `memoryMiB` at boot and, when `maxMemoryMiB` is larger, that
/// much more as ACPI hot-plug room (`hotplug_size`, CH's default method).
pub fn memory(spec: &CloudHypervisorMachineSpec) -> Value {
    let mut memory = json!({"size": spec.memory_mib << 20});
    let room = spec
        .max_memory_mib
        .unwrap_or(spec.memory_mib)
        .saturating_sub(spec.memory_mib);
    if room > 0 {
        memory["hotplug_size"] = json!(room << 20);
    }
    if spec.hugepages {
        memory["hugepages"] = json!(true);
    }
    memory
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_stable_and_short() {
        let uid = "6c1f1b9e-8a54-4d55-9a0e-3f2d1c0b9a87";
        assert_eq!(mac(uid, 0, None), mac(uid, 0, None));
        assert_ne!(mac(uid, 0, None), mac(uid, 1, None));
        assert!(mac(uid, 0, None).starts_with("52:54:00:"));
        assert_eq!(mac(uid, 0, Some("52:54:00:AA:00:01")), "52:54:00:aa:00:01");
        assert!(tap(uid, 7).len() <= 15);
    }

    #[test]
    fn builds_a_config() {
        let spec: CloudHypervisorMachineSpec = serde_json::from_value(json!({
            "image": {"kernel": "/boot/vmlinux", "cmdline": "console=ttyS0 root=/dev/vda1",
                      "disk": "/images/debian.raw", "format": "raw"},
            "cpus": 2, "memoryMiB": 1024,
            "network": [{"mtu": 1400}]
        }))
        .unwrap();
        let c = vm_config(
            "u1",
            &spec,
            Path::new("/state/u1"),
            &["52:54:00:00:00:01".into()],
            OsDisk::from_image(&spec, true),
        )
        .unwrap();
        assert_eq!(c["payload"]["kernel"], "/boot/vmlinux");
        assert_eq!(c["cpus"]["max_vcpus"], 2);
        assert_eq!(
            c["cpus"]["topology"],
            json!({"threads_per_core": 1, "cores_per_die": 1, "dies_per_package": 1, "packages": 2}),
            "one core per package when coresPerSocket is unset"
        );
        assert_eq!(c["memory"]["size"], 1u64 << 30);
        assert!(c["memory"].get("hotplug_size").is_none(), "no room asked");
        assert_eq!(c["disks"][0]["path"], "/state/u1/disk.raw");
        assert_eq!(c["disks"][1]["readonly"], true);
        assert_eq!(c["net"][0]["mtu"], 1400);
        let mut no_payload = spec.clone();
        no_payload.image.kernel = None;
        assert_eq!(
            vm_config("u1", &no_payload, Path::new("/s"), &[], OsDisk::imported())
                .unwrap_err()
                .reason,
            "InvalidImage"
        );
    }

    #[test]
    fn the_topology_holds_the_most_vcpus_or_is_refused() {
        let spec = |cpus: u32, max: Option<u32>, cores: Option<u32>| {
            serde_json::from_value::<CloudHypervisorMachineSpec>(json!({
                "image": {"kernel": "/k", "disk": "/d.raw"},
                "cpus": cpus, "maxCPUs": max, "coresPerSocket": cores, "memoryMiB": 512,
            }))
            .unwrap()
        };
        // (cpus, maxCPUs, coresPerSocket) → (cores_per_die, packages)
        for (c, max, cores, want) in [
            (1, None, None, (1, 1)),
            (2, Some(8), Some(4), (4, 2)),
            (3, Some(4), Some(2), (2, 2)),
            (6, None, Some(3), (3, 2)),
            (4, Some(4), Some(4), (4, 1)),
        ] {
            let cpus = cpus(&spec(c, max, cores)).unwrap();
            let t = &cpus["topology"];
            let product = [
                "threads_per_core",
                "cores_per_die",
                "dies_per_package",
                "packages",
            ]
            .iter()
            .map(|k| t[*k].as_u64().unwrap())
            .product::<u64>();
            assert_eq!(product, cpus["max_vcpus"].as_u64().unwrap(), "{cpus}");
            assert_eq!(
                (t["cores_per_die"].clone(), t["packages"].clone()),
                (json!(want.0), json!(want.1))
            );
        }
        for (c, max, cores) in [(2, Some(3), Some(2)), (4, None, Some(3))] {
            let err = cpus(&spec(c, max, cores)).unwrap_err();
            assert_eq!(err.reason, "CpuTopologyMismatch");
            assert!(!err.is_transient());
            let most = max.unwrap_or(c);
            assert!(
                err.message.contains(&format!("{most} vCPUs"))
                    && err
                        .message
                        .contains(&format!("coresPerSocket {}", cores.unwrap())),
                "{err}"
            );
        }
    }

    #[test]
    fn the_config_matches_the_openapi_document() {
        let spec: CloudHypervisorMachineSpec = serde_json::from_value(json!({
            "image": {"firmware": "/usr/share/cloud-hypervisor/CLOUDHV.fd", "disk": "/i.qcow2"},
            "cpus": 2, "maxCPUs": 4, "coresPerSocket": 2, "memoryMiB": 2048, "maxMemoryMiB": 4096,
            "hugepages": true,
            "additionalDisks": [{"name": "data", "sizeGiB": 10}],
            "network": [{"mtu": 9000, "macAddress": "52:54:00:12:34:56"}, {}]
        }))
        .unwrap();
        let macs = vec!["52:54:00:12:34:56".into(), mac("u", 1, None)];
        let config = vm_config(
            "u",
            &spec,
            Path::new("/s/u"),
            &macs,
            OsDisk::from_image(&spec, true),
        )
        .unwrap();
        assert_eq!(config["disks"][0]["backing_files"], true);
        assert_eq!(
            config["cpus"],
            json!({"boot_vcpus": 2, "max_vcpus": 4, "topology": {"threads_per_core": 1,
                   "cores_per_die": 2, "dies_per_package": 1, "packages": 2}})
        );
        assert_eq!(config["memory"]["size"], 2048u64 << 20);
        assert_eq!(config["memory"]["hotplug_size"], 2048u64 << 20);
        let imported = vm_config("u", &spec, Path::new("/s/u"), &macs, OsDisk::imported()).unwrap();
        assert_eq!(imported["disks"][0]["path"], "/s/u/disk.raw");
        assert_eq!(imported["disks"][0]["image_type"], "Raw");
        assert!(imported["disks"][0].get("backing_files").is_none());
        let openapi = fake_cloud_hypervisor::Spec::bundled();
        let errors = openapi.check_request(
            "PUT",
            "/api/v1/vm.create",
            Some("application/json"),
            config.to_string().as_bytes(),
        );
        assert_eq!(errors, Vec::<String>::new(), "{config:#}");
    }
}
