use crate::api::common::ProviderClass;
use crate::api::infra::proxmox::{ProxmoxMachine, ProxmoxMachineSpec, ProxmoxNetworkDevice};
use crate::builder::{BuildError, Parts};
use crate::contract::MachineKind;

impl MachineKind for ProxmoxMachine {
    fn build(parts: &Parts<'_>) -> Result<Self, BuildError> {
        let input = parts.input;
        let targets = &parts.targets;
        let template_id = input
            .image
            .spec
            .sources
            .proxmox
            .as_ref()
            .and_then(|s| s.template_id)
            .or_else(|| (input.provider.spec.class == ProviderClass::Sim).then_some(100))
            .ok_or_else(|| {
                BuildError::new(
                    "ImageSourceUnsupported",
                    "the image's proxmox source has no templateID (volume imports are not supported yet)",
                )
            })?;
        refuse_headroom(parts)?;
        // Admission refuses coresPerSocket 0, but an object stored before that rule
        // (or written with validation off) must not crash the operator.
        let (sockets, cores) = match input.class.cores_per_socket {
            Some(per) if per > 0 => (input.class.cpus / per, per),
            _ => (1, input.class.cpus),
        };
        Ok(ProxmoxMachine {
            metadata: parts.metadata.clone(),
            spec: ProxmoxMachineSpec {
                provider_ref: parts.provider_ref.clone(),
                provider_id: None,
                template_id,
                source_node: None,
                target_node: parts.location("node"),
                storage: targets.os_storage.get("storage").cloned(),
                full_clone: true,
                pool: None,
                vm_id_range: None,
                sockets,
                cores,
                memory_mib: input.class.memory_mib,
                disk_gib: parts.disk_gib,
                firmware: Some(input.class.firmware),
                additional_disks: targets.data_disks.clone(),
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
                power_state: parts.power_state,
                change_policy: parts.change_policy,
                bootstrap: parts.bootstrap.clone(),
            },
            status: None,
        })
    }
}

/// A ProxmoxMachine has no hot-add headroom: a class that asks for it is refused,
/// never built without it. (The scheduler refuses a Proxmox Provider for it already,
/// by its change table; this is the `sim` Provider building ProxmoxMachines.)
fn refuse_headroom(parts: &Parts<'_>) -> Result<(), BuildError> {
    let class = parts.input.class;
    let asked: Vec<&str> = [
        class.max_cpus.map(|_| "maxCPUs"),
        class.max_memory_mib.map(|_| "maxMemoryMiB"),
    ]
    .into_iter()
    .flatten()
    .collect();
    if asked.is_empty() {
        return Ok(());
    }
    Err(BuildError::new(
        "HotAddUnsupported",
        format!(
            "VMClass {} asks {} (room to grow while the VM runs), which a ProxmoxMachine \
             on Provider {} cannot honour: remove it from the class, or place the VM on a \
             Provider that adds CPUs and memory live",
            parts.input.vm.spec.class_ref.name,
            asked.join(" and "),
            parts
                .input
                .provider
                .metadata
                .name
                .as_deref()
                .unwrap_or_default(),
        ),
    ))
}
