//! What a machine template offers the cluster autoscaler when it scales a node group
//! up from zero: `status.capacity` and `status.nodeInfo`, from the template's spec
//! alone (no machine exists to look at).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::api::infra::{MachineTemplateStatus, NodeArchitecture, NodeInfo};

/// The sizing a machine spec declares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sizing {
    /// Virtual CPUs.
    pub cpus: u32,
    /// Memory in MiB.
    pub memory_mib: u64,
}

/// `status.capacity` and `status.nodeInfo` for a template of this sizing (conditions
/// are carried over from `previous`). Every backend banlieue drives today runs
/// x86-64 Linux guests, which is what the node info says.
pub fn template_status(
    previous: Option<&MachineTemplateStatus>,
    sizing: Sizing,
) -> MachineTemplateStatus {
    let mut status = previous.cloned().unwrap_or_default();
    status.capacity = BTreeMap::from([
        ("cpu".to_string(), Quantity(sizing.cpus.to_string())),
        (
            "memory".to_string(),
            Quantity(format!("{}Mi", sizing.memory_mib)),
        ),
    ]);
    status.node_info = Some(NodeInfo {
        architecture: Some(NodeArchitecture::Amd64),
        operating_system: Some("linux".into()),
    });
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_in_kubernetes_quantities() {
        let s = template_status(
            None,
            Sizing {
                cpus: 4,
                memory_mib: 8192,
            },
        );
        assert_eq!(s.capacity["cpu"], Quantity("4".into()));
        assert_eq!(s.capacity["memory"], Quantity("8192Mi".into()));
        assert_eq!(
            s.node_info.unwrap().architecture,
            Some(NodeArchitecture::Amd64)
        );
    }

    #[test]
    fn same_spec_same_status() {
        let first = template_status(
            None,
            Sizing {
                cpus: 2,
                memory_mib: 2048,
            },
        );
        assert_eq!(
            template_status(
                Some(&first),
                Sizing {
                    cpus: 2,
                    memory_mib: 2048
                }
            ),
            first
        );
    }
}
