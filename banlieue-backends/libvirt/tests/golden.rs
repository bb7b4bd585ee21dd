//! Golden tests: the domain XML and the NoCloud seed for fixed machines. Regenerate
//! with `BANLIEUE_UPDATE_GOLDEN=1 cargo test -p banlieue-backend-libvirt --test golden`
//! and review the diff.

use std::path::PathBuf;

use banlieue_backend_libvirt::domain::{
    DomainPlan, DomainType, VolumeRef, domain_xml, parse_defined,
};
use banlieue_backend_libvirt::seed;
use banlieue_sdk::api::common::{BootstrapFormat, Firmware, Ipam, IpamMode};
use banlieue_sdk::api::infra::MachineDisk;
use banlieue_sdk::api::infra::libvirt::{LibvirtMachineSpec, LibvirtNetworkInterface};
use banlieue_sdk::api::vm_image::{LibvirtImageSource, PoolVolume};
use banlieue_sdk::backend::{BootstrapData, MachineIdentity, SecretValue};

const UID: &str = "6f1c2b3a-4d5e-4f60-8a7b-9c0d1e2f3a4b";

fn golden(name: &str, actual: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("BANLIEUE_UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, actual).unwrap();
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (set BANLIEUE_UPDATE_GOLDEN=1 to create it)",
            path.display()
        )
    });
    assert_eq!(actual, want, "{} differs", path.display());
}

fn identity() -> MachineIdentity {
    MachineIdentity {
        uid: UID.into(),
        namespace: "team-a".into(),
        name: "web-1".into(),
        provider_id: None,
    }
}

fn spec() -> LibvirtMachineSpec {
    LibvirtMachineSpec {
        change_policy: Default::default(),
        provider_ref: None,
        provider_id: None,
        power_state: Default::default(),
        bootstrap: None,
        image: LibvirtImageSource {
            volume: Some(PoolVolume {
                pool: "images".into(),
                name: "debian-13.qcow2".into(),
            }),
            path: None,
            format: Default::default(),
        },
        storage_pool: "vms".into(),
        cpus: 2,
        max_cpus: None,
        cores_per_socket: None,
        max_memory_mib: None,
        memory_mib: 2048,
        disk_gib: Some(20),
        firmware: Firmware::Bios,
        cpu_mode: Default::default(),
        additional_disks: vec![MachineDisk {
            name: "data".into(),
            size_gib: 10,
            storage: None,
            provisioning: Default::default(),
        }],
        network: vec![
            LibvirtNetworkInterface {
                network: Some("default".into()),
                bridge: None,
                mac_address: None,
                mtu: None,
                ipam: Ipam::default(),
            },
            LibvirtNetworkInterface {
                network: None,
                bridge: Some("br0".into()),
                mac_address: Some("52:54:00:AA:BB:CC".into()),
                mtu: Some(9000),
                ipam: Ipam {
                    mode: IpamMode::Static,
                    addresses: vec!["10.0.0.5/24".into()],
                    gateway: Some("10.0.0.1".into()),
                    nameservers: vec!["10.0.0.2".into()],
                    pool_ref: None,
                },
            },
        ],
    }
}

fn plan<'a>(
    id: &'a MachineIdentity,
    spec: &'a LibvirtMachineSpec,
    t: DomainType,
) -> DomainPlan<'a> {
    DomainPlan {
        name: "team-a.web-1".into(),
        identity: id,
        spec,
        domain_type: t,
        machine: None,
        os_disk: VolumeRef {
            pool: "vms".into(),
            name: format!("bnl-{UID}-os.qcow2"),
        },
        data_disks: vec![VolumeRef {
            pool: "vms".into(),
            name: format!("bnl-{UID}-disk-data.qcow2"),
        }],
        seed: VolumeRef {
            pool: "vms".into(),
            name: format!("bnl-{UID}-seed.img"),
        },
    }
}

#[test]
fn domain_xml_kvm_and_tcg() {
    let id = identity();
    let spec = spec();
    let kvm = domain_xml(&plan(&id, &spec, DomainType::Kvm)).unwrap();
    golden("domain_kvm.xml", &kvm);
    let tcg = domain_xml(&plan(&id, &spec, DomainType::Qemu)).unwrap();
    golden("domain_tcg.xml", &tcg);
    // What banlieue reads back finds the UID, its volumes and the NICs.
    let back = parse_defined(&kvm).unwrap();
    assert_eq!(back.uid.as_deref(), Some(UID));
    assert_eq!(back.volumes.len(), 3);
    assert_eq!(back.interfaces[1], ("52:54:00:aa:bb:cc".to_string(), None));
    assert_eq!(back.interfaces[0].1.as_deref(), Some("default"));
}

#[test]
fn secure_boot_asks_for_q35_and_smm() {
    let id = identity();
    let mut spec = spec();
    spec.firmware = Firmware::EfiSecure;
    let xml = domain_xml(&plan(&id, &spec, DomainType::Kvm)).unwrap();
    assert!(xml.contains("<os firmware='efi'>"), "{xml}");
    assert!(xml.contains("machine='q35'"), "{xml}");
    assert!(xml.contains("<smm state='on'/>"), "{xml}");
}

#[test]
fn seed_files_and_image() {
    let id = identity();
    let spec = spec();
    let bootstrap = BootstrapData {
        format: BootstrapFormat::CloudConfig,
        user_data: SecretValue::new("#cloud-config\nruncmd:\n  - echo hi\n"),
        network_config: None,
    };
    let files = seed::files(&id, &format!("libvirt://{UID}"), &spec, Some(&bootstrap)).unwrap();
    golden("seed_meta-data.yaml", &files.meta_data);
    golden("seed_user-data.yaml", &files.user_data);
    golden("seed_network-config.yaml", &files.network_config);

    let image = seed::vfat_image(&files).unwrap();
    assert_eq!(image.len(), seed::SEED_BYTES);
    let (label, read) = seed::read_image(&image).unwrap();
    assert_eq!(label.trim_end(), "cidata");
    let names: Vec<&str> = read.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["meta-data", "network-config", "user-data"]);
    assert_eq!(read[0].1, files.meta_data);
    assert_eq!(read[2].1, files.user_data);
    // Same input, same bytes: no timestamps or random serials.
    assert_eq!(image, seed::vfat_image(&files).unwrap());

    // blkid (util-linux) is what cloud-init uses to find the seed; when it is there,
    // it must see a vfat file system labelled cidata.
    let dir = std::env::temp_dir().join(format!("bnl-seed-{}", std::process::id()));
    std::fs::write(&dir, &image).unwrap();
    if let Ok(out) = std::process::Command::new("blkid")
        .args(["-o", "export"])
        .arg(&dir)
        .output()
        && out.status.success()
    {
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("LABEL=cidata"), "{text}");
        assert!(text.contains("TYPE=vfat"), "{text}");
    }
    let _ = std::fs::remove_file(&dir);
}

#[test]
fn given_network_config_wins_and_ignition_is_refused() {
    let id = identity();
    let spec = spec();
    let given = BootstrapData {
        format: BootstrapFormat::CloudConfig,
        user_data: SecretValue::new("#cloud-config\n"),
        network_config: Some(SecretValue::new("version: 2\n")),
    };
    let files = seed::files(&id, "libvirt://x", &spec, Some(&given)).unwrap();
    assert_eq!(files.network_config, "version: 2\n");
    let ignition = BootstrapData {
        format: BootstrapFormat::Ignition,
        ..given
    };
    let err = seed::files(&id, "libvirt://x", &spec, Some(&ignition)).unwrap_err();
    assert_eq!(err.reason, "UnsupportedBootstrapFormat");
    assert!(!err.is_transient());
}

#[test]
fn hostile_names_stay_inside_their_attributes() {
    let id = MachineIdentity {
        uid: UID.into(),
        namespace: "ns".into(),
        name: "x'/><evil/>".into(),
        provider_id: None,
    };
    let mut spec = spec();
    spec.storage_pool = "p'><x/>".into();
    let mut p = plan(&id, &spec, DomainType::Qemu);
    p.name = "ns.x'/><evil/>".into();
    p.os_disk.pool = "p'><x/>".into();
    let xml = domain_xml(&p).unwrap();
    let doc = roxmltree::Document::parse(&xml).expect("parses");
    assert!(
        !doc.descendants()
            .any(|n| n.has_tag_name("evil") || n.has_tag_name("x"))
    );
    assert_eq!(
        doc.descendants()
            .find(|n| n.has_tag_name("name"))
            .and_then(|n| n.text()),
        Some("ns.x'/><evil/>")
    );
}

/// `maxCPUs` and `maxMemoryMiB` give the domain room to grow live: `<vcpu current>`,
/// `<maxMemory>` with slots and one NUMA cell holding every possible vCPU (inside the
/// KVM CPU mode, alone under TCG); what libvirt's parser reads back from it.
#[test]
fn headroom_for_hot_plug() {
    use banlieue_backend_libvirt::changes::parse_shape;
    let id = identity();
    let mut spec = spec();
    spec.max_cpus = Some(8);
    spec.max_memory_mib = Some(8192);
    let kvm = domain_xml(&plan(&id, &spec, DomainType::Kvm)).unwrap();
    golden("domain_kvm_headroom.xml", &kvm);
    let tcg = domain_xml(&plan(&id, &spec, DomainType::Qemu)).unwrap();
    assert!(
        tcg.contains("  <cpu>\n    <numa>\n      <cell id='0' cpus='0-7' memory='2097152' unit='KiB'/>\n    </numa>\n  </cpu>\n"),
        "{tcg}"
    );
    for xml in [&kvm, &tcg] {
        let shape = parse_shape(xml).unwrap();
        assert_eq!(
            (
                shape.vcpus,
                shape.max_vcpus,
                shape.memory_kib,
                shape.max_memory_kib,
                shape.numa
            ),
            (2, 8, 2 << 20, Some(8 << 20), true)
        );
    }
    // Without headroom nothing of it is written.
    let plain = domain_xml(&plan(&id, &self::spec(), DomainType::Qemu)).unwrap();
    assert!(
        !plain.contains("maxMemory")
            && !plain.contains("<numa>")
            && plain.contains("<vcpu>2</vcpu>")
    );
}

/// `coresPerSocket` defines the topology over every vCPU the domain can have
/// (sockets = `maxCPUs` ÷ cores), next to the NUMA cell of memory headroom under KVM,
/// alone in `<cpu>` under TCG; read back as banlieue's cores per socket. A maximum the
/// cores do not divide is refused by name, nothing written.
#[test]
fn cores_per_socket_is_a_topology_over_the_most_vcpus() {
    use banlieue_backend_libvirt::changes::{parse_shape, resources};
    let id = identity();
    let mut spec = spec();
    spec.max_cpus = Some(8);
    spec.max_memory_mib = Some(8192);
    spec.cores_per_socket = Some(2);
    let kvm = domain_xml(&plan(&id, &spec, DomainType::Kvm)).unwrap();
    golden("domain_kvm_topology.xml", &kvm);
    assert!(
        kvm.contains("  <vcpu current='2'>8</vcpu>\n")
            && kvm.contains("  <cpu mode='host-passthrough' check='none'>\n    <topology sockets='4' dies='1' cores='2' threads='1'/>\n    <numa>"),
        "{kvm}"
    );
    spec.max_memory_mib = None;
    let tcg = domain_xml(&plan(&id, &spec, DomainType::Qemu)).unwrap();
    assert!(
        tcg.contains(
            "  <cpu>\n    <topology sockets='4' dies='1' cores='2' threads='1'/>\n  </cpu>\n"
        ),
        "{tcg}"
    );
    for xml in [&kvm, &tcg] {
        let shape = parse_shape(xml).unwrap();
        let t = shape.topology.expect("a topology");
        assert_eq!((t.sockets, t.cores, t.per_socket()), (4, 2, 2));
        assert_eq!(resources(UID, &shape, |_| None).cores_per_socket, Some(2));
    }
    // Without coresPerSocket: no topology, which libvirt starts as one core per socket.
    let plain = domain_xml(&plan(&id, &self::spec(), DomainType::Qemu)).unwrap();
    assert!(!plain.contains("<topology"), "{plain}");
    let shape = parse_shape(&plain).unwrap();
    assert_eq!(shape.topology, None);
    assert_eq!(resources(UID, &shape, |_| None).cores_per_socket, Some(1));

    // 8 vCPUs at most do not split into sockets of 3 cores.
    spec.cores_per_socket = Some(3);
    let err = domain_xml(&plan(&id, &spec, DomainType::Kvm)).unwrap_err();
    assert_eq!(err.reason, "CpuTopologyMismatch");
    assert!(!err.is_transient());
    assert!(
        err.message.contains("8 vCPUs") && err.message.contains("coresPerSocket 3"),
        "{err}"
    );
    // Without maxCPUs the maximum is cpus.
    spec.max_cpus = None;
    spec.cpus = 6;
    let six = domain_xml(&plan(&id, &spec, DomainType::Qemu)).unwrap();
    assert!(
        six.contains("<topology sockets='2' dies='1' cores='3' threads='1'/>"),
        "{six}"
    );
}
