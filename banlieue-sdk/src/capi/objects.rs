//! The fields of CAPI's `Machine` and `Cluster` (`cluster.x-k8s.io/v1beta2`) that
//! banlieue reads. Partial on purpose: everything else is ignored when reading, and
//! banlieue never writes these objects, so no field can be lost.

use kube::CustomResource;
use serde::{Deserialize, Serialize};

/// A contract-versioned reference (`apiGroup`, `kind`, `name`), as CAPI v1beta2 uses
/// for `infrastructureRef`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ContractVersionedObjectReference {
    /// API group, e.g. `infrastructure.banlieue.io`.
    #[serde(default)]
    pub api_group: String,
    /// Kind, e.g. `VSphereMachine`.
    #[serde(default)]
    pub kind: String,
    /// Name in the same namespace.
    #[serde(default)]
    pub name: String,
}

/// `Machine.spec`, the part banlieue reads.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "cluster.x-k8s.io",
    version = "v1beta2",
    kind = "Machine",
    namespaced,
    schema = "disabled",
    doc = "A Cluster API Machine (only the fields banlieue reads)."
)]
#[serde(rename_all = "camelCase")]
pub struct MachineSpec {
    /// The Cluster this Machine belongs to.
    #[serde(default)]
    pub cluster_name: String,
    /// Where the bootstrap data is.
    #[serde(default)]
    pub bootstrap: MachineBootstrap,
    /// The infrastructure machine.
    #[serde(default)]
    pub infrastructure_ref: ContractVersionedObjectReference,
    /// The failure domain CAPI placed this Machine in (from the Cluster's list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_domain: Option<String>,
}

/// `Machine.spec.bootstrap`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct MachineBootstrap {
    /// The Secret holding the bootstrap data (key `value`, optional `format`), once the
    /// bootstrap provider has written it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_secret_name: Option<String>,
}

/// `Cluster.spec`, the part banlieue reads.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "cluster.x-k8s.io",
    version = "v1beta2",
    kind = "Cluster",
    namespaced,
    schema = "disabled",
    doc = "A Cluster API Cluster (only the fields banlieue reads)."
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSpec {
    /// Whether reconciliation of this cluster's objects is paused (`clusterctl move`
    /// sets it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    /// The InfraCluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_ref: Option<ContractVersionedObjectReference>,
}

/// A reference to an IPAM pool (`apiGroup`, `kind`, `name`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PoolReference {
    /// The pool's API group, e.g. `ipam.cluster.x-k8s.io`.
    pub api_group: String,
    /// The pool's kind, e.g. `InClusterIPPool`.
    pub kind: String,
    /// The pool's name.
    pub name: String,
}

/// `IPAddressClaim.spec` (`ipam.cluster.x-k8s.io/v1beta2`): banlieue creates these, one
/// per network device that takes its address from a pool.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "ipam.cluster.x-k8s.io",
    version = "v1beta2",
    kind = "IPAddressClaim",
    namespaced,
    schema = "disabled",
    status = "IPAddressClaimStatus",
    doc = "A Cluster API IPAM claim for one address from a pool."
)]
#[serde(rename_all = "camelCase")]
pub struct IPAddressClaimSpec {
    /// The Cluster the claiming machine belongs to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_name: Option<String>,
    /// The pool to allocate from.
    pub pool_ref: PoolReference,
}

/// `IPAddressClaim.status`, the part banlieue reads.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct IPAddressClaimStatus {
    /// The IPAddress the pool's provider allocated, once it has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address_ref: Option<AddressReference>,
}

/// `IPAddressClaim.status.addressRef`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct AddressReference {
    /// The IPAddress's name.
    pub name: String,
}

/// `IPAddress.spec` (`ipam.cluster.x-k8s.io/v1beta2`): what a pool's provider
/// allocated for a claim.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "ipam.cluster.x-k8s.io",
    version = "v1beta2",
    kind = "IPAddress",
    namespaced,
    schema = "disabled",
    doc = "A Cluster API IPAM address allocated for a claim."
)]
#[serde(rename_all = "camelCase")]
pub struct IPAddressSpec {
    /// The address, e.g. `10.0.0.5`.
    pub address: String,
    /// The prefix length, e.g. `24`.
    pub prefix: u8,
    /// The gateway, if the pool has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_the_fields_it_needs_and_ignores_the_rest() {
        let machine: Machine = serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": "m", "namespace": "ns"},
            "spec": {"clusterName": "c", "version": "v1.34.0",
                     "bootstrap": {"dataSecretName": "m-bootstrap", "configRef": {"kind": "KubeadmConfig"}},
                     "infrastructureRef": {"apiGroup": "infrastructure.banlieue.io", "kind": "VSphereMachine", "name": "m"},
                     "failureDomain": "vc1/dc1-c1"},
            "status": {"phase": "Provisioning"}
        }))
        .unwrap();
        assert_eq!(
            machine.spec.bootstrap.data_secret_name.as_deref(),
            Some("m-bootstrap")
        );
        assert_eq!(machine.spec.infrastructure_ref.kind, "VSphereMachine");
        assert_eq!(machine.spec.failure_domain.as_deref(), Some("vc1/dc1-c1"));

        let cluster: Cluster = serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": "c"}, "spec": {"paused": true}
        }))
        .unwrap();
        assert_eq!(cluster.spec.paused, Some(true));
        assert!(cluster.spec.infrastructure_ref.is_none());
    }
}
