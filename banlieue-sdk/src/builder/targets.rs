//! Resolving class names (storage, network) to the Provider's backend targets, and
//! the failure domain's location.

use std::collections::BTreeMap;

use crate::api::common::Ipam;
use crate::api::infra::MachineDisk;
use crate::api::provider::ClassMapping;

use super::{BuildError, Input};

/// One network interface with its backend target.
#[derive(Clone, Debug)]
pub struct ResolvedNetwork {
    /// The network class's target on the Provider (e.g. `portGroup`, `bridge`).
    pub target: BTreeMap<String, String>,
    /// The interface's addressing.
    pub ipam: Ipam,
    /// A fixed MAC address, when the VM asks for one.
    pub mac_address: Option<String>,
    /// The MTU, when the VM asks for one.
    pub mtu: Option<u32>,
}

/// Every class a VM uses, resolved against one Provider.
#[derive(Clone, Debug)]
pub struct Targets {
    /// The OS disk's storage target.
    pub os_storage: BTreeMap<String, String>,
    /// The data disks, each on its storage target.
    pub data_disks: Vec<MachineDisk>,
    /// The network interfaces, each with its target.
    pub networks: Vec<ResolvedNetwork>,
    /// The failure domain's location (e.g. `datacenter`, `node`).
    pub location: BTreeMap<String, String>,
}

impl Targets {
    /// Resolves the VM's classes against its Provider.
    pub fn resolve(input: &Input<'_>) -> Result<Self, BuildError> {
        let capabilities = &input.provider.spec.capabilities;
        let storage = |class: &str| lookup(&capabilities.storage_classes, class, "storage");
        let network = |class: &str| lookup(&capabilities.network_classes, class, "network");

        let os_storage = match &input.class.disk.storage_class {
            Some(class) => storage(class)?,
            None => capabilities
                .storage_classes
                .first()
                .map(|c| c.target.clone())
                .unwrap_or_default(),
        };
        let data_disks = input
            .vm
            .spec
            .disks
            .iter()
            .map(|d| {
                let target = match &d.storage_class {
                    Some(class) => storage(class)?,
                    None => os_storage.clone(),
                };
                Ok(MachineDisk {
                    name: d.name.clone(),
                    size_gib: d.size_gib,
                    storage: first_value(&target, &["datastore", "storage", "pool", "directory"]),
                    provisioning: d.provisioning,
                })
            })
            .collect::<Result<_, BuildError>>()?;
        let networks = if input.vm.spec.networks.is_empty() {
            // No interface asked for: one DHCP interface on the Provider's first network class.
            capabilities
                .network_classes
                .first()
                .map(|c| ResolvedNetwork {
                    target: c.target.clone(),
                    ipam: Ipam::default(),
                    mac_address: None,
                    mtu: None,
                })
                .into_iter()
                .collect()
        } else {
            input
                .vm
                .spec
                .networks
                .iter()
                .map(|n| {
                    Ok(ResolvedNetwork {
                        target: network(&n.network_class)?,
                        ipam: n.ipam.clone(),
                        mac_address: n.mac_address.clone(),
                        mtu: n.mtu,
                    })
                })
                .collect::<Result<_, BuildError>>()?
        };
        let location = location(input);
        Ok(Self {
            os_storage,
            data_disks,
            networks,
            location,
        })
    }
}

fn lookup(
    mappings: &[ClassMapping],
    class: &str,
    what: &str,
) -> Result<BTreeMap<String, String>, BuildError> {
    mappings
        .iter()
        .find(|m| m.name == class)
        .map(|m| m.target.clone())
        .ok_or_else(|| {
            BuildError::new(
                "ClassNotOffered",
                format!("the Provider declares no {what} class {class}"),
            )
        })
}

fn first_value(target: &BTreeMap<String, String>, keys: &[&str]) -> Option<String> {
    keys.iter().find_map(|k| target.get(*k).cloned())
}

/// The chosen failure domain's location: declared in the Provider's spec, else as
/// discovered in its status.
fn location(input: &Input<'_>) -> BTreeMap<String, String> {
    let Some(fd) = input.target.failure_domain.as_deref() else {
        return BTreeMap::new();
    };
    let declared = input
        .provider
        .spec
        .failure_domains
        .iter()
        .find(|d| d.name == fd)
        .map(|d| &d.location);
    let discovered = input
        .provider
        .status
        .iter()
        .flat_map(|s| &s.failure_domains)
        .find(|d| d.name == fd)
        .map(|d| &d.location);
    declared
        .filter(|l| !l.is_empty())
        .or(discovered)
        .cloned()
        .unwrap_or_default()
}
