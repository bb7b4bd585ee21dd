use crate::api::infra::cloud_hypervisor::{
    CloudHypervisorMachine, CloudHypervisorMachineSpec, CloudHypervisorNetworkInterface,
};
use crate::api::vm_image::CloudHypervisorImageSource;
use crate::builder::{BuildError, Input, Parts, sim_name};
use crate::contract::MachineKind;

impl MachineKind for CloudHypervisorMachine {
    fn build(parts: &Parts<'_>) -> Result<Self, BuildError> {
        let input = parts.input;
        let targets = &parts.targets;
        Ok(CloudHypervisorMachine {
            metadata: parts.metadata.clone(),
            spec: CloudHypervisorMachineSpec {
                provider_ref: parts.provider_ref.clone(),
                provider_id: None,
                image: image(input),
                cpus: input.class.cpus,
                max_cpus: input.class.max_cpus,
                cores_per_socket: input.class.cores_per_socket,
                memory_mib: input.class.memory_mib,
                max_memory_mib: input.class.max_memory_mib,
                hugepages: false,
                disk_gib: parts.disk_gib,
                additional_disks: targets.data_disks.clone(),
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
                power_state: parts.power_state,
                change_policy: parts.change_policy,
                bootstrap: parts.bootstrap.clone(),
            },
            status: None,
        })
    }
}

fn image(input: &Input<'_>) -> CloudHypervisorImageSource {
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
