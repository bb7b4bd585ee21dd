//! Building the infrastructure machine for a scheduled VirtualMachine: a pure
//! function from the VM, its class and image, the chosen Provider and placement to
//! a fully resolved `*Machine` object.

mod names;
mod targets;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::api::common::{LocalObjectReference, ProviderClass};
use crate::api::infra::{
    BootstrapDataRef, MachineDisk,
    cloud_hypervisor::{
        CloudHypervisorMachine, CloudHypervisorMachineSpec, CloudHypervisorNetworkInterface,
    },
    libvirt::{LibvirtMachine, LibvirtMachineSpec, LibvirtNetworkInterface},
    proxmox::{ProxmoxMachine, ProxmoxMachineSpec, ProxmoxNetworkDevice},
    vsphere::{VSphereMachine, VSphereMachineSpec, VSphereNetworkDevice},
};
use crate::api::vm_image::{CloudHypervisorImageSource, DiskFormat, LibvirtImageSource};
use crate::api::{Provider, VMClassSpec, VMImage, VirtualMachine};
use crate::contract::{InfraMachine, InfraMachineKind};
use crate::scheduling::Target;

use targets::{ResolvedNetwork, Targets};

pub use names::{MAX_LABEL_VALUE, bootstrap_secret_name, label_value, suffixed_name};

/// Label on infra machines naming the VirtualMachine they realise ([`label_value`] of
/// its name: a prefix and a hash past 63 characters).
pub const VIRTUAL_MACHINE_LABEL: &str = "banlieue.io/virtual-machine";
/// Label on infra machines naming the Provider they run on ([`label_value`] of its
/// name; `spec.providerRef` has the name itself).
pub const PROVIDER_LABEL: &str = "banlieue.io/provider";
/// Annotation on infra machines built for a VM: the failure domain to place it in
/// (CAPI-owned machines take it from their Machine instead).
pub const FAILURE_DOMAIN_ANNOTATION: &str = "banlieue.io/failure-domain";
/// Annotation on an infra machine made on disks copied from another (`CopyDisk`): the
/// cloud-init `instance-id` it keeps, the source's, so the guest's first boot does not
/// run again.
pub const INSTANCE_ID_ANNOTATION: &str = "banlieue.io/instance-id";
/// Annotation on an infra machine made on disks copied from another (`CopyDisk`): the
/// machine they came from (`<Kind>/<name> on <Provider>`). Its backend creates it on
/// the imported disks, never from the image.
pub const COPIED_FROM_ANNOTATION: &str = "banlieue.io/copied-from";
/// Annotation on an infra machine whose disks are still being copied in (`CopyDisk`):
/// its controller creates nothing until it goes. The value names the source machine.
pub const IMPORTING_DISKS_ANNOTATION: &str = "banlieue.io/importing-disks";
/// The Provider setting that picks which kind a `sim` Provider builds.
pub const SIM_MACHINE_KIND_SETTING: &str = "machineKind";

/// What the builder needs.
#[derive(Clone, Copy, Debug)]
pub struct Input<'a> {
    /// The VirtualMachine (with `metadata.uid`).
    pub vm: &'a VirtualMachine,
    /// Its class.
    pub class: &'a VMClassSpec,
    /// Its image.
    pub image: &'a VMImage,
    /// The Provider it was scheduled onto.
    pub provider: &'a Provider,
    /// The placement.
    pub target: &'a Target,
    /// The Secret holding the VM's bootstrap data in CAPI's shape (`value`,
    /// `format`, `network-config`), when it has any.
    pub bootstrap_secret: Option<&'a str>,
}

/// Why a machine cannot be built; surfaced on the VM's `Scheduled` condition.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct BuildError {
    /// CamelCase reason.
    pub reason: &'static str,
    /// What to fix.
    pub message: String,
}

impl BuildError {
    fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
        }
    }
}

/// The kind a Provider builds: its class's own, or for `sim` the `machineKind`
/// setting (default `LibvirtMachine`).
pub fn machine_kind(provider: &Provider) -> Result<InfraMachineKind, BuildError> {
    if let Some(kind) = InfraMachineKind::for_class(provider.spec.class) {
        return Ok(kind);
    }
    if provider.spec.class != ProviderClass::Sim {
        return Err(BuildError::new(
            "NoMachineKind",
            format!(
                "class {} has no infrastructure machine kind banlieue can build",
                provider.spec.class
            ),
        ));
    }
    match provider.spec.settings.get(SIM_MACHINE_KIND_SETTING) {
        None => Ok(InfraMachineKind::Libvirt),
        Some(name) => InfraMachineKind::from_kind(name).ok_or_else(|| {
            BuildError::new(
                "InvalidProviderSettings",
                format!("settings.machineKind {name} is not one of VSphereMachine, ProxmoxMachine, LibvirtMachine, CloudHypervisorMachine"),
            )
        }),
    }
}

/// Builds the infra machine for `input.vm`.
pub fn infra_machine(input: &Input<'_>) -> Result<InfraMachine, BuildError> {
    let kind = machine_kind(input.provider)?;
    let targets = Targets::resolve(input)?;
    let metadata = metadata(input)?;
    let name = metadata.name.clone().unwrap_or_default();
    let provider_ref = Some(LocalObjectReference::new(input.target.provider.clone()));
    let power_state = input.vm.spec.power_state;
    let bootstrap = input.bootstrap_secret.map(|secret| BootstrapDataRef {
        data_secret_name: secret.to_owned(),
        format: input
            .vm
            .spec
            .bootstrap
            .as_ref()
            .map(|b| b.format)
            .unwrap_or_default(),
    });
    let location = |key: &str| targets.location.get(key).cloned();
    let disk_gib = Some(input.class.disk.size_gib);
    let additional_disks: Vec<MachineDisk> = targets.data_disks.clone();

    Ok(match kind {
        InfraMachineKind::VSphere => {
            let template = vsphere_template(input, &name)?;
            InfraMachine::VSphere(VSphereMachine {
                metadata,
                spec: VSphereMachineSpec {
                    provider_ref,
                    provider_id: None,
                    template,
                    clone_mode: Default::default(),
                    datacenter: location("datacenter"),
                    cluster: location("cluster"),
                    resource_pool: location("resourcePool"),
                    folder: location("folder"),
                    datastore: targets.os_storage.get("datastore").cloned(),
                    storage_policy_name: targets.os_storage.get("storagePolicy").cloned(),
                    num_cpus: input.class.cpus,
                    num_cores_per_socket: input.class.cores_per_socket,
                    memory_mib: input.class.memory_mib,
                    disk_gib,
                    disk_provisioning: input.class.disk.provisioning,
                    firmware: Some(input.class.firmware),
                    additional_disks,
                    network: targets
                        .networks
                        .iter()
                        .map(|n| VSphereNetworkDevice {
                            network_name: n
                                .one_of(&["distributedPortGroup", "portGroup", "network"])
                                .unwrap_or_default(),
                            mac_address: n.mac_address.clone(),
                            ipam: n.ipam.clone(),
                        })
                        .collect(),
                    power_state,
                    bootstrap,
                },
                status: None,
            })
        }
        InfraMachineKind::Proxmox => {
            let template_id = input
                .image
                .spec
                .sources
                .proxmox
                .as_ref()
                .and_then(|s| s.template_id)
                .or_else(|| (input.provider.spec.class == ProviderClass::Sim).then_some(100))
                .ok_or_else(|| BuildError::new("ImageSourceUnsupported", "the image's proxmox source has no templateID (volume imports are not supported yet)"))?;
            // Admission refuses coresPerSocket 0, but an object stored before that rule
            // (or written with validation off) must not crash the operator.
            let (sockets, cores) = match input.class.cores_per_socket {
                Some(per) if per > 0 => (input.class.cpus / per, per),
                _ => (1, input.class.cpus),
            };
            InfraMachine::Proxmox(ProxmoxMachine {
                metadata,
                spec: ProxmoxMachineSpec {
                    provider_ref,
                    provider_id: None,
                    template_id,
                    source_node: None,
                    target_node: location("node"),
                    storage: targets.os_storage.get("storage").cloned(),
                    full_clone: true,
                    pool: None,
                    vm_id_range: None,
                    sockets,
                    cores,
                    memory_mib: input.class.memory_mib,
                    disk_gib,
                    firmware: Some(input.class.firmware),
                    additional_disks,
                    network: targets
                        .networks
                        .iter()
                        .map(|n| ProxmoxNetworkDevice {
                            bridge: n.one_of(&["bridge"]).unwrap_or_else(|| "vmbr0".into()),
                            vlan: n.target.get("vlan").and_then(|v| v.parse().ok()),
                            model: Default::default(),
                            mtu: n.mtu,
                            mac_address: n.mac_address.clone(),
                            ipam: n.ipam.clone(),
                        })
                        .collect(),
                    power_state,
                    bootstrap,
                },
                status: None,
            })
        }
        InfraMachineKind::Libvirt => InfraMachine::Libvirt(LibvirtMachine {
            metadata,
            spec: LibvirtMachineSpec {
                provider_ref,
                provider_id: None,
                image: libvirt_image(input),
                storage_pool: targets
                    .os_storage
                    .get("pool")
                    .cloned()
                    .unwrap_or_else(|| "default".into()),
                cpus: input.class.cpus,
                memory_mib: input.class.memory_mib,
                disk_gib,
                firmware: input.class.firmware,
                cpu_mode: Default::default(),
                additional_disks,
                network: targets
                    .networks
                    .iter()
                    .map(|n| {
                        let bridge = n.target.get("bridge").cloned();
                        LibvirtNetworkInterface {
                            network: if bridge.is_some() {
                                None
                            } else {
                                Some(n.one_of(&["network"]).unwrap_or_else(|| "default".into()))
                            },
                            bridge,
                            mac_address: n.mac_address.clone(),
                            ipam: n.ipam.clone(),
                        }
                    })
                    .collect(),
                power_state,
                bootstrap,
            },
            status: None,
        }),
        InfraMachineKind::CloudHypervisor => {
            InfraMachine::CloudHypervisor(CloudHypervisorMachine {
                metadata,
                spec: CloudHypervisorMachineSpec {
                    provider_ref,
                    provider_id: None,
                    image: cloud_hypervisor_image(input),
                    cpus: input.class.cpus,
                    max_cpus: None,
                    memory_mib: input.class.memory_mib,
                    hugepages: false,
                    disk_gib,
                    additional_disks,
                    network: targets
                        .networks
                        .iter()
                        .map(|n| CloudHypervisorNetworkInterface {
                            bridge: n.target.get("bridge").cloned(),
                            mac_address: n.mac_address.clone(),
                            mtu: n.mtu,
                            ipam: n.ipam.clone(),
                        })
                        .collect(),
                    power_state,
                    bootstrap,
                },
                status: None,
            })
        }
    })
}

fn metadata(input: &Input<'_>) -> Result<ObjectMeta, BuildError> {
    let vm = input.vm;
    let name = vm.metadata.name.clone().ok_or_else(|| {
        BuildError::new("InvalidVirtualMachine", "the VirtualMachine has no name")
    })?;
    let uid = vm.metadata.uid.clone().ok_or_else(|| {
        BuildError::new("InvalidVirtualMachine", "the VirtualMachine has no uid yet")
    })?;
    let mut labels: BTreeMap<String, String> = vm.metadata.labels.clone().unwrap_or_default();
    labels.insert(VIRTUAL_MACHINE_LABEL.into(), label_value(&name));
    labels.insert(PROVIDER_LABEL.into(), label_value(&input.target.provider));
    let annotations = input
        .target
        .failure_domain
        .as_ref()
        .map(|fd| BTreeMap::from([(FAILURE_DOMAIN_ANNOTATION.to_owned(), fd.clone())]));
    Ok(ObjectMeta {
        name: Some(name.clone()),
        namespace: vm.metadata.namespace.clone(),
        labels: Some(labels),
        annotations,
        owner_references: Some(vec![OwnerReference {
            api_version: "banlieue.io/v1alpha1".into(),
            kind: "VirtualMachine".into(),
            name,
            uid,
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]),
        ..Default::default()
    })
}

fn sim_name(input: &Input<'_>) -> String {
    input
        .image
        .spec
        .sources
        .sim
        .as_ref()
        .map(|s| s.name.clone())
        .unwrap_or_else(|| "image".into())
}

fn vsphere_template(input: &Input<'_>, _machine: &str) -> Result<String, BuildError> {
    match &input.image.spec.sources.vsphere {
        Some(source) => source
            .template
            .clone()
            .or_else(|| {
                source
                    .content_library_item
                    .as_ref()
                    .map(|i| format!("{}/{}", i.library, i.item))
            })
            .ok_or_else(|| {
                BuildError::new(
                    "ImageSourceUnsupported",
                    "the image's vsphere source names nothing",
                )
            }),
        None => Ok(sim_name(input)),
    }
}

fn libvirt_image(input: &Input<'_>) -> LibvirtImageSource {
    input
        .image
        .spec
        .sources
        .libvirt
        .clone()
        .unwrap_or_else(|| LibvirtImageSource {
            volume: None,
            path: Some(format!("/sim/images/{}", sim_name(input))),
            format: DiskFormat::Qcow2,
        })
}

fn cloud_hypervisor_image(input: &Input<'_>) -> CloudHypervisorImageSource {
    input
        .image
        .spec
        .sources
        .cloud_hypervisor
        .clone()
        .unwrap_or_else(|| CloudHypervisorImageSource {
            firmware: Some("/sim/firmware/CLOUDHV.fd".into()),
            disk: format!("/sim/images/{}", sim_name(input)),
            ..Default::default()
        })
}

impl ResolvedNetwork {
    fn one_of(&self, keys: &[&str]) -> Option<String> {
        keys.iter().find_map(|k| self.target.get(*k).cloned())
    }
}
