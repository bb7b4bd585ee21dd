//! The Cluster API v1beta2 contract shapes shared by every infrastructure kind:
//! addresses, initialization, endpoints, failure domains, and the status blocks of
//! machines, machine templates and clusters.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::api::common::{BootstrapFormat, Condition, PowerState};

/// The label on every `infrastructure.banlieue.io` CRD that tells CAPI which of our
/// API versions speak contract v1beta2.
pub const CAPI_CONTRACT_LABEL: (&str, &str) = ("cluster.x-k8s.io/v1beta2", "v1alpha1");

/// Kind of a machine address (CAPI `MachineAddressType`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum MachineAddressType {
    /// The machine's hostname.
    Hostname,
    /// An address reachable from outside the cluster network.
    #[serde(rename = "ExternalIP")]
    ExternalIp,
    /// An address reachable inside the cluster network.
    #[serde(rename = "InternalIP")]
    InternalIp,
    /// An externally resolvable DNS name.
    #[serde(rename = "ExternalDNS")]
    ExternalDns,
    /// An internally resolvable DNS name.
    #[serde(rename = "InternalDNS")]
    InternalDns,
}

/// One address of a machine.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct MachineAddress {
    /// `Hostname`, `InternalIP`, `ExternalIP`, `InternalDNS` or `ExternalDNS`.
    #[serde(rename = "type")]
    pub type_: MachineAddressType,
    /// The address.
    #[schemars(length(min = 1, max = 256))]
    pub address: String,
}

/// CAPI's `initialization` block. `provisioned` never goes back to false.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[schemars(extend("minProperties" = 1))]
pub struct Initialization {
    /// True once the infrastructure exists and is usable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioned: Option<bool>,
}

/// The rule that keeps `status.initialization.provisioned` from flipping back.
const PROVISIONED_STAYS: &str = "!has(oldSelf.initialization) || !has(oldSelf.initialization.provisioned) || !oldSelf.initialization.provisioned || (has(self.initialization) && has(self.initialization.provisioned) && self.initialization.provisioned)";

/// A control plane endpoint (CAPI `APIEndpoint`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
pub struct ApiEndpoint {
    /// Hostname or IP address: no scheme, path or port (the port goes in `port`).
    #[x_kube(validation = Rule::new("isIP(self) || (!self.matches('^[0-9.]+$') && self.matches('^[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?([.][A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?)*$'))")
        .message("controlPlaneEndpoint.host must be a DNS name or an IP address without scheme, path, port or brackets, e.g. api.example.com, 10.0.0.10 or fd00::10 (the port goes in controlPlaneEndpoint.port)"))]
    #[x_kube(validation = Rule::new("!isIP(self) || !ip(self).isUnspecified()")
        .message("controlPlaneEndpoint.host must not be the unspecified address (0.0.0.0 or ::)"))]
    #[schemars(length(min = 1, max = 253))]
    pub host: String,
    /// Port, 1-65535.
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
}

/// A failure domain as CAPI reads it from an InfraCluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailureDomain {
    /// Name, unique in the list; CAPI copies it to `Machine.spec.failureDomain`.
    #[schemars(length(min = 1, max = 256))]
    pub name: String,
    /// Whether control-plane machines may be placed here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane: Option<bool>,
    /// Free-form attributes (banlieue sets `provider`, and backend location keys).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: BTreeMap<String, String>,
}

/// Bootstrap data for a machine that no CAPI Machine owns (one built from a
/// VirtualMachine). CAPI-owned machines read `Machine.spec.bootstrap.dataSecretName`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct BootstrapDataRef {
    /// A Secret in the same namespace with the data under `value` (and optionally
    /// `network-config`), as CAPI bootstrap providers write it.
    #[x_kube(validation = Rule::new(crate::api::common::DNS_SUBDOMAIN)
        .message("dataSecretName must be a Secret name: an RFC 1123 subdomain of lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"))]
    #[schemars(length(min = 1, max = 253))]
    pub data_secret_name: String,
    /// `cloud-config` (default) or `ignition`.
    #[serde(default)]
    pub format: BootstrapFormat,
}

/// Observed state of any infrastructure machine.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(PROVISIONED_STAYS)
    .message("status.initialization.provisioned cannot go back to false once true"))]
pub struct MachineStatus {
    /// CAPI: `provisioned` is true once the machine exists on the backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<Initialization>,
    /// Addresses of the machine.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Atomic)]
    #[schemars(length(max = 32))]
    pub addresses: Vec<MachineAddress>,
    /// The failure domain the machine actually landed in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub failure_domain: Option<String>,
    /// The power state observed on the backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_state: Option<PowerState>,
    /// The backend's own handle: vSphere moref, Proxmox `node/vmid`, libvirt domain
    /// name, Cloud Hypervisor API socket. Diagnostic only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_ref: Option<String>,
    /// What the machine runs with, what its spec asks, and each change still waiting
    /// (with what it waits for). Written once the backend reads the machine back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<crate::api::resources::ResourcesStatus>,
    /// `Ready` always; `Paused` while paused. A terminal failure is `Ready=False` with
    /// reason `TerminalFailure` (see the API reference); a delete the backend refused,
    /// `Ready=False` with reason `DeleteFailed`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// The generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// What a machine template offers, so the cluster autoscaler can scale from zero.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineTemplateStatus {
    /// Resources of one machine: `cpu`, `memory`, `ephemeral-storage`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub capacity: BTreeMap<String, Quantity>,
    /// Architecture and OS of the nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_info: Option<NodeInfo>,
    /// Conditions of the template.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Node properties for autoscaling from zero.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("minProperties" = 1))]
pub struct NodeInfo {
    /// `amd64`, `arm64`, `s390x` or `ppc64le`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<NodeArchitecture>,
    /// e.g. `linux`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub operating_system: Option<String>,
}

/// Node architecture (CAPI's enum).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum NodeArchitecture {
    /// x86-64.
    Amd64,
    /// AArch64.
    Arm64,
    /// IBM Z.
    S390x,
    /// POWER little-endian.
    Ppc64le,
}

/// Observed state of any infrastructure cluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(PROVISIONED_STAYS)
    .message("status.initialization.provisioned cannot go back to false once true"))]
pub struct ClusterStatus {
    /// CAPI: `provisioned` is true once failure domains are known and the endpoint is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initialization: Option<Initialization>,
    /// Failure domains aggregated from every referenced Provider.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    #[schemars(length(max = 100))]
    pub failure_domains: Vec<FailureDomain>,
    /// `Ready` always; `Paused` while paused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// The generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}
