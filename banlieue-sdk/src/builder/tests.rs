use std::collections::BTreeMap;

use super::*;
use crate::api::common::{Ipam, IpamMode, PowerState};
use crate::api::infra::{
    libvirt::LibvirtMachine, proxmox::ProxmoxMachine, vsphere::VSphereMachine,
};
use crate::api::provider::{
    Capabilities, ClassMapping, Connection, DeclaredFailureDomain, ProviderSpec,
};
use crate::api::virtual_machine::{DataDisk, NetworkInterface, VirtualMachineSpec};
use crate::api::vm_class::OsDisk;
use crate::api::vm_image::{
    ImageSources, OsFamily, OsInfo, ProxmoxImageSource, SimImageSource, VMImageSpec,
    VSphereImageSource,
};

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn provider(class: ProviderClass, settings: &[(&str, &str)]) -> Provider {
    Provider::new(
        "p",
        ProviderSpec {
            class,
            connection: Connection {
                endpoint: "https://x/sdk".into(),
                ..Default::default()
            },
            capabilities: Capabilities {
                storage_classes: vec![
                    ClassMapping {
                        name: "fast".into(),
                        target: map(&[
                            ("datastore", "nvme"),
                            ("storage", "local-lvm"),
                            ("pool", "ssd"),
                        ]),
                    },
                    ClassMapping {
                        name: "bulk".into(),
                        target: map(&[("datastore", "sata"), ("storage", "ceph"), ("pool", "hdd")]),
                    },
                ],
                network_classes: vec![ClassMapping {
                    name: "frontend".into(),
                    target: map(&[
                        ("portGroup", "pg-120"),
                        ("bridge", "vmbr0"),
                        ("vlan", "120"),
                    ]),
                }],
                features: vec![],
            },
            failure_domains: vec![DeclaredFailureDomain {
                name: "east-a".into(),
                labels: BTreeMap::new(),
                location: map(&[("datacenter", "dc1"), ("cluster", "c1"), ("node", "pve1")]),
            }],
            settings: settings
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            paused: false,
        },
    )
}

fn vm() -> VirtualMachine {
    let mut vm = VirtualMachine::new(
        "web-1",
        VirtualMachineSpec {
            change_policy: Default::default(),
            class_ref: LocalObjectReference::new("small"),
            image_ref: LocalObjectReference::new("ubuntu"),
            placement: Default::default(),
            power_state: PowerState::PoweredOff,
            bootstrap: None,
            networks: vec![NetworkInterface {
                name: "eth0".into(),
                network_class: "frontend".into(),
                ipam: Ipam {
                    mode: IpamMode::Static,
                    addresses: vec!["10.0.0.5/24".into()],
                    ..Default::default()
                },
                ..Default::default()
            }],
            disks: vec![DataDisk {
                name: "data".into(),
                size_gib: 50,
                storage_class: Some("bulk".into()),
                provisioning: Default::default(),
            }],
            migration: Default::default(),
        },
    );
    vm.metadata.namespace = Some("ns".into());
    vm.metadata.uid = Some("uid-1".into());
    vm.metadata.labels = Some(map(&[("app", "web")]));
    vm
}

fn image() -> VMImage {
    VMImage::new(
        "ubuntu",
        VMImageSpec {
            os: OsInfo {
                family: OsFamily::Linux,
                distribution: "ubuntu".into(),
                version: "24.04".into(),
            },
            architecture: Default::default(),
            bootstrap_formats: vec![],
            sources: ImageSources {
                vsphere: Some(VSphereImageSource {
                    template: Some("/dc1/vm/ubuntu".into()),
                    content_library_item: None,
                }),
                proxmox: Some(ProxmoxImageSource {
                    template_id: Some(9000),
                    volume: None,
                }),
                sim: Some(SimImageSource {
                    name: "ubuntu".into(),
                }),
                ..Default::default()
            },
        },
    )
}

fn class() -> VMClassSpec {
    VMClassSpec {
        cpus: 4,
        cores_per_socket: Some(2),
        memory_mib: 4096,
        firmware: Default::default(),
        disk: OsDisk {
            size_gib: 20,
            provisioning: Default::default(),
            storage_class: Some("fast".into()),
        },
        required_features: vec![],
        max_cpus: None,
        max_memory_mib: None,
        update_policy: Default::default(),
    }
}

fn build(provider: &Provider) -> Result<InfraMachine, BuildError> {
    build_with(provider, &class())
}

fn build_with(provider: &Provider, class: &VMClassSpec) -> Result<InfraMachine, BuildError> {
    let (vm, image) = (vm(), image());
    let target = Target {
        provider: "p".into(),
        class: provider.spec.class,
        failure_domain: Some("east-a".into()),
        topology: BTreeMap::new(),
    };
    infra_machine(
        &Input {
            vm: &vm,
            class,
            image: &image,
            provider,
            target: &target,
            bootstrap_secret: Some("web-1-bootstrap"),
        },
        &KindTable::built_in(),
    )
}

#[test]
fn vsphere_machine_is_fully_resolved_and_owned() {
    let m: VSphereMachine = build(&provider(ProviderClass::Vsphere, &[]))
        .unwrap()
        .typed()
        .expect("a VSphereMachine");
    let owner = &m.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
        ("VirtualMachine", "uid-1", Some(true))
    );
    let labels = m.metadata.labels.as_ref().unwrap();
    assert_eq!(
        labels.get(VIRTUAL_MACHINE_LABEL).map(String::as_str),
        Some("web-1")
    );
    assert_eq!(
        labels.get("app").map(String::as_str),
        Some("web"),
        "the VM's labels carry over"
    );
    assert_eq!(
        m.metadata
            .annotations
            .as_ref()
            .unwrap()
            .get(FAILURE_DOMAIN_ANNOTATION)
            .map(String::as_str),
        Some("east-a")
    );
    assert_eq!(m.spec.template, "/dc1/vm/ubuntu");
    assert_eq!(
        (m.spec.datacenter.as_deref(), m.spec.cluster.as_deref()),
        (Some("dc1"), Some("c1"))
    );
    assert_eq!(m.spec.datastore.as_deref(), Some("nvme"));
    assert_eq!(
        m.spec.additional_disks[0].storage.as_deref(),
        Some("sata"),
        "data disks keep their own class"
    );
    assert_eq!(m.spec.network[0].network_name, "pg-120");
    assert_eq!(m.spec.network[0].ipam.addresses, ["10.0.0.5/24"]);
    assert_eq!(
        (
            m.spec.num_cpus,
            m.spec.num_cores_per_socket,
            m.spec.memory_mib
        ),
        (4, Some(2), 4096)
    );
    assert_eq!(m.spec.power_state, PowerState::PoweredOff);
    assert_eq!(
        m.spec.bootstrap.as_ref().unwrap().data_secret_name,
        "web-1-bootstrap"
    );
    assert!(
        m.spec.provider_id.is_none(),
        "providerID is the machine controller's to set"
    );
}

#[test]
fn proxmox_machine_uses_node_bridge_and_vlan() {
    let m: ProxmoxMachine = build(&provider(ProviderClass::Proxmox, &[]))
        .unwrap()
        .typed()
        .expect("a ProxmoxMachine");
    assert_eq!(
        (m.spec.template_id, m.spec.target_node.as_deref()),
        (9000, Some("pve1"))
    );
    assert_eq!((m.spec.sockets, m.spec.cores), (2, 2));
    assert_eq!(m.spec.storage.as_deref(), Some("local-lvm"));
    assert_eq!(
        (m.spec.network[0].bridge.as_str(), m.spec.network[0].vlan),
        ("vmbr0", Some(120))
    );
}

#[test]
fn sim_provider_builds_the_kind_it_is_told() {
    let libvirt = build(&provider(ProviderClass::Sim, &[])).unwrap();
    assert_eq!(libvirt.kind(), InfraMachineKind::Libvirt, "default");
    let m: LibvirtMachine = libvirt.typed().expect("a LibvirtMachine");
    assert_eq!(m.spec.image.path.as_deref(), Some("/sim/images/ubuntu"));
    assert_eq!(m.spec.storage_pool, "ssd");
    let vsphere = build(&provider(
        ProviderClass::Sim,
        &[("machineKind", "VSphereMachine")],
    ))
    .unwrap();
    assert_eq!(vsphere.kind(), InfraMachineKind::VSphere);
    let err = build(&provider(ProviderClass::Sim, &[("machineKind", "Pod")])).unwrap_err();
    assert_eq!(err.reason, "InvalidProviderSettings");
}

#[test]
fn undeclared_classes_are_reported() {
    let mut p = provider(ProviderClass::Libvirt, &[]);
    p.spec.capabilities.network_classes.clear();
    let err = build(&p).unwrap_err();
    assert_eq!(err.reason, "ClassNotOffered");
    assert!(
        err.message.contains("network class frontend"),
        "{}",
        err.message
    );
}

#[test]
fn every_kind_serializes_with_its_api_version() {
    for (class, kind) in [
        (ProviderClass::Vsphere, "VSphereMachine"),
        (ProviderClass::Proxmox, "ProxmoxMachine"),
        (ProviderClass::Libvirt, "LibvirtMachine"),
        (ProviderClass::Sim, "LibvirtMachine"),
    ] {
        let json = serde_json::to_value(build(&provider(class, &[])).unwrap()).unwrap();
        assert_eq!(json["kind"], kind);
        assert_eq!(json["apiVersion"], "infrastructure.banlieue.io/v1alpha1");
    }
}

#[test]
fn a_provider_builds_only_kinds_this_operator_registered() {
    let mut only_vsphere = KindTable::default();
    only_vsphere.register_built_in(ProviderClass::Vsphere);
    assert_eq!(
        machine_kind(&provider(ProviderClass::Vsphere, &[]), &only_vsphere),
        Ok(InfraMachineKind::VSphere)
    );
    let err = machine_kind(&provider(ProviderClass::Proxmox, &[]), &only_vsphere).unwrap_err();
    assert_eq!(err.reason, "NoMachineKind");
    assert!(err.message.contains("proxmox"), "{}", err.message);
    let lab = ProviderClass::new("lab").unwrap();
    let err = machine_kind(&provider(lab, &[]), &KindTable::built_in()).unwrap_err();
    assert_eq!(
        err.reason, "NoMachineKind",
        "an unregistered class of its own"
    );
    // A sim Provider names one of the kinds registered, nothing else.
    let err = machine_kind(
        &provider(ProviderClass::Sim, &[("machineKind", "ProxmoxMachine")]),
        &only_vsphere,
    )
    .unwrap_err();
    assert_eq!(err.reason, "InvalidProviderSettings");
    assert!(err.message.contains("VSphereMachine"), "{}", err.message);
}

/// The class's cores per socket reach every kind: vSphere's `numCoresPerSocket`,
/// Proxmox's `cores` (its sockets follow), libvirt's and Cloud Hypervisor's
/// `coresPerSocket` (their topology); unset stays unset.
#[test]
fn cores_per_socket_reaches_every_kind() {
    let sim = |kind: &str| provider(ProviderClass::Sim, &[("machineKind", kind)]);
    let m: LibvirtMachine = build_with(&sim("LibvirtMachine"), &class())
        .unwrap()
        .typed()
        .unwrap();
    assert_eq!((m.spec.cpus, m.spec.cores_per_socket), (4, Some(2)));
    let m: crate::api::infra::cloud_hypervisor::CloudHypervisorMachine =
        build_with(&sim("CloudHypervisorMachine"), &class())
            .unwrap()
            .typed()
            .unwrap();
    assert_eq!((m.spec.cpus, m.spec.cores_per_socket), (4, Some(2)));
    let m: VSphereMachine = build_with(&provider(ProviderClass::Vsphere, &[]), &class())
        .unwrap()
        .typed()
        .unwrap();
    assert_eq!(m.spec.num_cores_per_socket, Some(2));
    let m: ProxmoxMachine = build_with(&provider(ProviderClass::Proxmox, &[]), &class())
        .unwrap()
        .typed()
        .unwrap();
    assert_eq!((m.spec.sockets, m.spec.cores), (2, 2));
    let unset = VMClassSpec {
        cores_per_socket: None,
        ..class()
    };
    let m: LibvirtMachine = build_with(&sim("LibvirtMachine"), &unset)
        .unwrap()
        .typed()
        .unwrap();
    assert_eq!(m.spec.cores_per_socket, None);
}

#[test]
fn hot_add_headroom_is_carried_where_the_kind_has_it_and_refused_where_not() {
    let class = VMClassSpec {
        max_cpus: Some(8),
        max_memory_mib: Some(8192),
        ..class()
    };
    let sim = |kind: &str| provider(ProviderClass::Sim, &[("machineKind", kind)]);
    let m: LibvirtMachine = build_with(&sim("LibvirtMachine"), &class)
        .unwrap()
        .typed()
        .unwrap();
    assert_eq!(
        (m.spec.max_cpus, m.spec.max_memory_mib),
        (Some(8), Some(8192))
    );
    let m: crate::api::infra::cloud_hypervisor::CloudHypervisorMachine =
        build_with(&sim("CloudHypervisorMachine"), &class)
            .unwrap()
            .typed()
            .unwrap();
    assert_eq!(
        (m.spec.max_cpus, m.spec.max_memory_mib),
        (Some(8), Some(8192))
    );
    let m: VSphereMachine = build_with(&provider(ProviderClass::Vsphere, &[]), &class)
        .unwrap()
        .typed()
        .unwrap();
    assert_eq!(
        (m.spec.max_cpus, m.spec.max_memory_mib),
        (Some(8), Some(8192))
    );
    // A ProxmoxMachine has no such field: refused, never built without it.
    for (max_cpus, max_memory_mib, named) in [
        (Some(8), None, "maxCPUs"),
        (None, Some(8192), "maxMemoryMiB"),
    ] {
        let class = VMClassSpec {
            max_cpus,
            max_memory_mib,
            ..class.clone()
        };
        let err = build_with(&provider(ProviderClass::Proxmox, &[]), &class).unwrap_err();
        assert_eq!(err.reason, "HotAddUnsupported");
        assert!(err.message.contains(named), "{}", err.message);
    }
    // None asked: every kind as before.
    let m: LibvirtMachine = build(&sim("LibvirtMachine")).unwrap().typed().unwrap();
    assert_eq!((m.spec.max_cpus, m.spec.max_memory_mib), (None, None));
}
