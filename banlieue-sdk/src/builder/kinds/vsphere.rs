use crate::api::infra::vsphere::{VSphereMachine, VSphereMachineSpec, VSphereNetworkDevice};
use crate::builder::{BuildError, Input, Parts, sim_name};
use crate::contract::MachineKind;

impl MachineKind for VSphereMachine {
    fn build(parts: &Parts<'_>) -> Result<Self, BuildError> {
        let input = parts.input;
        let targets = &parts.targets;
        Ok(VSphereMachine {
            metadata: parts.metadata.clone(),
            spec: VSphereMachineSpec {
                provider_ref: parts.provider_ref.clone(),
                provider_id: None,
                template: template(input)?,
                clone_mode: Default::default(),
                datacenter: parts.location("datacenter"),
                cluster: parts.location("cluster"),
                resource_pool: parts.location("resourcePool"),
                folder: parts.location("folder"),
                datastore: targets.os_storage.get("datastore").cloned(),
                storage_policy_name: targets.os_storage.get("storagePolicy").cloned(),
                num_cpus: input.class.cpus,
                max_cpus: input.class.max_cpus,
                num_cores_per_socket: input.class.cores_per_socket,
                memory_mib: input.class.memory_mib,
                max_memory_mib: input.class.max_memory_mib,
                disk_gib: parts.disk_gib,
                disk_provisioning: input.class.disk.provisioning,
                firmware: Some(input.class.firmware),
                additional_disks: targets.data_disks.clone(),
                network: targets
                    .networks
                    .iter()
                    .map(|n| VSphereNetworkDevice {
                        network_name: n
                            .one_of(&["distributedPortGroup", "portGroup", "network"])
                            .unwrap_or_default(),
                        mac_address: n.mac_address.clone(),
                        mtu: n.mtu,
                        ipam: n.ipam.clone(),
                    })
                    .collect(),
                power_state: parts.power_state,
                change_policy: parts.change_policy,
                bootstrap: parts.bootstrap.clone(),
            },
            status: None,
        })
    }
}

fn template(input: &Input<'_>) -> Result<String, BuildError> {
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
