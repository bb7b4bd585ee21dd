//! Addresses from Cluster API IPAM pools: which network devices of a machine take
//! their address from a pool, the `IPAddressClaim` banlieue makes for each (owned by
//! the machine, so it goes with it), and the spec the backend receives once every
//! claim is fulfilled — those devices turned into `static` with the allocated address.
//! Backends therefore only ever see `dhcp` or `static`.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::metadata::CLUSTER_NAME_LABEL;
use super::objects::{IPAddressClaim, IPAddressClaimSpec, PoolReference};
use crate::api::common::{Ipam, IpamMode, TypedLocalObjectReference};
use crate::backend::MachineSpec;

/// What a pool's provider allocated for one device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocation {
    /// The address, e.g. `10.0.0.5`.
    pub address: String,
    /// The prefix length.
    pub prefix: u8,
    /// The gateway, if any.
    pub gateway: Option<String>,
}

fn ipams(spec: &mut MachineSpec) -> Vec<&mut Ipam> {
    match spec {
        MachineSpec::VSphere(s) => s.network.iter_mut().map(|d| &mut d.ipam).collect(),
        MachineSpec::Proxmox(s) => s.network.iter_mut().map(|d| &mut d.ipam).collect(),
        MachineSpec::Libvirt(s) => s.network.iter_mut().map(|d| &mut d.ipam).collect(),
        MachineSpec::CloudHypervisor(s) => s.network.iter_mut().map(|d| &mut d.ipam).collect(),
        // A kind declared out of tree has no banlieue IPAM devices to resolve.
        MachineSpec::Custom(_) => Vec::new(),
    }
}

/// The static addresses of every device, without their prefix length, in device
/// order (what a hypervisor reports once the guest has configured them).
pub fn static_addresses(spec: &MachineSpec) -> Vec<String> {
    let mut spec = spec.clone();
    ipams(&mut spec)
        .into_iter()
        .filter(|ipam| ipam.mode == IpamMode::Static)
        .flat_map(|ipam| {
            ipam.addresses
                .iter()
                .map(|a| a.split('/').next().unwrap_or(a).to_owned())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The devices (by index) that take their address from a pool, and the pool.
pub fn pool_devices(spec: &MachineSpec) -> Vec<(usize, TypedLocalObjectReference)> {
    let mut spec = spec.clone();
    ipams(&mut spec)
        .into_iter()
        .enumerate()
        .filter(|(_, ipam)| ipam.mode == IpamMode::Pool)
        .filter_map(|(i, ipam)| Some((i, ipam.pool_ref.clone()?)))
        .collect()
}

/// The claim's name for device `index` of machine `machine` (shortened with a hash
/// when a long machine name would make it longer than a name may be).
pub fn claim_name(machine: &str, index: usize) -> String {
    crate::builder::suffixed_name(machine, &format!("-ip-{index}"))
}

/// The claim for device `index`, owned (as controller) by the machine `owner`, in the
/// machine's cluster if it has one.
pub fn build_claim(
    owner: &OwnerReference,
    namespace: &str,
    cluster: Option<&str>,
    index: usize,
    pool: &TypedLocalObjectReference,
) -> IPAddressClaim {
    let mut claim = IPAddressClaim::new(
        &claim_name(&owner.name, index),
        IPAddressClaimSpec {
            cluster_name: cluster.map(str::to_owned),
            pool_ref: PoolReference {
                api_group: pool.api_group.clone(),
                kind: pool.kind.clone(),
                name: pool.name.clone(),
            },
        },
    );
    claim.metadata = ObjectMeta {
        name: claim.metadata.name.take(),
        namespace: Some(namespace.to_owned()),
        labels: cluster.map(|c| BTreeMap::from([(CLUSTER_NAME_LABEL.to_owned(), c.to_owned())])),
        owner_references: Some(vec![owner.clone()]),
        ..Default::default()
    };
    claim
}

/// The spec the backend receives: every pool device becomes `static` with its
/// allocation. `None` while some pool device has no allocation yet.
pub fn resolve(
    spec: &MachineSpec,
    allocations: &BTreeMap<usize, Allocation>,
) -> Option<MachineSpec> {
    let mut resolved = spec.clone();
    for (i, ipam) in ipams(&mut resolved).into_iter().enumerate() {
        if ipam.mode != IpamMode::Pool {
            continue;
        }
        let allocation = allocations.get(&i)?;
        ipam.mode = IpamMode::Static;
        ipam.pool_ref = None;
        ipam.addresses = vec![format!("{}/{}", allocation.address, allocation.prefix)];
        if allocation.gateway.is_some() {
            ipam.gateway = allocation.gateway.clone();
        }
    }
    Some(resolved)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::infra::proxmox::{ProxmoxMachineSpec, ProxmoxNetworkDevice};

    fn pool(name: &str) -> TypedLocalObjectReference {
        TypedLocalObjectReference {
            api_group: "ipam.cluster.x-k8s.io".into(),
            kind: "InClusterIPPool".into(),
            name: name.into(),
        }
    }

    fn spec() -> MachineSpec {
        let device = |ipam: Ipam| ProxmoxNetworkDevice {
            bridge: "vmbr0".into(),
            ipam,
            ..Default::default()
        };
        let mut s: ProxmoxMachineSpec = serde_json::from_value(
            serde_json::json!({"templateID": 100, "sockets": 1, "cores": 2, "memoryMiB": 2048}),
        )
        .unwrap();
        s.network = vec![
            device(Ipam::default()),
            device(Ipam {
                mode: IpamMode::Pool,
                pool_ref: Some(pool("lan")),
                nameservers: vec!["10.0.0.53".into()],
                ..Default::default()
            }),
            device(Ipam {
                mode: IpamMode::Pool,
                pool_ref: Some(pool("storage")),
                ..Default::default()
            }),
        ];
        MachineSpec::Proxmox(s)
    }

    #[test]
    fn finds_pool_devices_by_index() {
        let devices = pool_devices(&spec());
        assert_eq!(devices, vec![(1, pool("lan")), (2, pool("storage"))]);
    }

    #[test]
    fn resolves_only_when_every_claim_is_fulfilled() {
        let one = BTreeMap::from([(
            1,
            Allocation {
                address: "10.0.0.5".into(),
                prefix: 24,
                gateway: Some("10.0.0.1".into()),
            },
        )]);
        assert!(resolve(&spec(), &one).is_none());
        let mut both = one.clone();
        both.insert(
            2,
            Allocation {
                address: "10.1.0.9".into(),
                prefix: 16,
                gateway: None,
            },
        );
        let MachineSpec::Proxmox(resolved) = resolve(&spec(), &both).unwrap() else {
            unreachable!()
        };
        assert_eq!(resolved.network[0].ipam, Ipam::default());
        let lan = &resolved.network[1].ipam;
        assert_eq!(
            (lan.mode, lan.addresses.as_slice(), lan.gateway.as_deref()),
            (
                IpamMode::Static,
                ["10.0.0.5/24".to_string()].as_slice(),
                Some("10.0.0.1")
            )
        );
        assert_eq!(lan.nameservers, ["10.0.0.53"]);
        assert!(lan.pool_ref.is_none());
        assert_eq!(resolved.network[2].ipam.addresses, ["10.1.0.9/16"]);
        let resolved = MachineSpec::Proxmox(resolved);
        assert!(pool_devices(&resolved).is_empty());
        assert_eq!(static_addresses(&resolved), ["10.0.0.5", "10.1.0.9"]);
    }

    #[test]
    fn claims_are_owned_and_labelled() {
        let owner = OwnerReference {
            api_version: "infrastructure.banlieue.io/v1alpha1".into(),
            kind: "ProxmoxMachine".into(),
            name: "m1".into(),
            uid: "u1".into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        };
        let claim = build_claim(&owner, "ns", Some("c1"), 1, &pool("lan"));
        assert_eq!(claim.metadata.name.as_deref(), Some("m1-ip-1"));
        assert_eq!(claim.metadata.owner_references.unwrap()[0].uid, "u1");
        assert_eq!(claim.metadata.labels.unwrap()[CLUSTER_NAME_LABEL], "c1");
        assert_eq!(claim.spec.pool_ref.kind, "InClusterIPPool");
        assert_eq!(claim.spec.cluster_name.as_deref(), Some("c1"));
    }
}
