use crate::api::infra::libvirt::{LibvirtMachine, LibvirtMachineSpec, LibvirtNetworkInterface};
use crate::api::vm_image::{DiskFormat, LibvirtImageSource};
use crate::builder::{BuildError, Input, Parts, sim_name};
use crate::contract::MachineKind;

impl MachineKind for LibvirtMachine {
    fn build(parts: &Parts<'_>) -> Result<Self, BuildError> {
        let input = parts.input;
        let targets = &parts.targets;
        Ok(LibvirtMachine {
            metadata: parts.metadata.clone(),
            spec: LibvirtMachineSpec {
                provider_ref: parts.provider_ref.clone(),
                provider_id: None,
                image: image(input),
                storage_pool: targets
                    .os_storage
                    .get("pool")
                    .cloned()
                    .unwrap_or_else(|| "default".into()),
                cpus: input.class.cpus,
                max_cpus: input.class.max_cpus,
                cores_per_socket: input.class.cores_per_socket,
                max_memory_mib: input.class.max_memory_mib,
                memory_mib: input.class.memory_mib,
                disk_gib: parts.disk_gib,
                firmware: input.class.firmware,
                cpu_mode: Default::default(),
                additional_disks: targets.data_disks.clone(),
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
                            mtu: n.mtu,
                            ipam: n.ipam.clone(),
                        }
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

fn image(input: &Input<'_>) -> LibvirtImageSource {
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
