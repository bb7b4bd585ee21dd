//! Types shared by both API groups: references, selectors, TLS trust, network and
//! disk shapes, and the small enums every kind speaks.

use std::collections::BTreeMap;

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};

/// The key a CA bundle is read from when a ConfigMap or Secret reference names none.
pub const DEFAULT_CA_BUNDLE_KEY: &str = "ca.crt";

/// A reference to an object of a known kind by name, in the referrer's namespace
/// (or cluster-wide for cluster-scoped kinds).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct LocalObjectReference {
    /// Name of the referenced object.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

impl LocalObjectReference {
    /// A reference to the object called `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Self { name: name.into() }
    }
}

/// A reference to an object of any kind in the referrer's namespace, CAPI-style
/// (`apiGroup`, `kind`, `name`; no version).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TypedLocalObjectReference {
    /// API group of the referenced kind, e.g. `ipam.cluster.x-k8s.io`.
    #[schemars(length(min = 1, max = 253))]
    pub api_group: String,
    /// Kind of the referenced object, e.g. `InClusterIPPool`.
    #[schemars(length(min = 1, max = 63))]
    pub kind: String,
    /// Name of the referenced object.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// One key of a ConfigMap or Secret in the referrer's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct KeySelector {
    /// Name of the ConfigMap or Secret.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key inside it; each use documents its default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub key: Option<String>,
}

impl KeySelector {
    /// The selected key, or `default` when none is named.
    pub fn key_or<'a>(&'a self, default: &'a str) -> &'a str {
        self.key.as_deref().unwrap_or(default)
    }
}

/// Where the PEM bundle of CAs that signed the backend's certificate comes from.
/// Exactly one source must be set.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(
    "[has(self.inline), has(self.configMapRef), has(self.secretRef)].filter(x, x).size() == 1"
).message("caBundle: set exactly one of inline, configMapRef or secretRef"))]
pub struct CaBundleSource {
    /// PEM-encoded CA certificates, inline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.contains('-----BEGIN CERTIFICATE-----')")
        .message("caBundle.inline must hold PEM certificates (-----BEGIN CERTIFICATE-----)"))]
    #[schemars(length(max = 1048576))]
    pub inline: Option<String>,
    /// A key of a ConfigMap in the same namespace (default key `ca.crt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_ref: Option<KeySelector>,
    /// A key of a Secret in the same namespace (default key `ca.crt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<KeySelector>,
}

/// The backend a Provider talks to.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
pub enum ProviderClass {
    /// VMware vCenter (vSphere Web Services API).
    #[serde(rename = "vsphere")]
    Vsphere,
    /// Proxmox VE (REST API).
    #[serde(rename = "proxmox")]
    Proxmox,
    /// libvirt (QEMU/KVM hosts).
    #[serde(rename = "libvirt")]
    Libvirt,
    /// Cloud Hypervisor hosts.
    #[serde(rename = "cloud-hypervisor")]
    CloudHypervisor,
    /// banlieue's in-process simulator, for demos, tests and benchmarks.
    #[serde(rename = "sim")]
    Sim,
}

impl ProviderClass {
    /// Every class, in a stable order.
    pub const ALL: [ProviderClass; 5] = [
        Self::Vsphere,
        Self::Proxmox,
        Self::Libvirt,
        Self::CloudHypervisor,
        Self::Sim,
    ];

    /// The wire name (`vsphere`, `cloud-hypervisor`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Vsphere => "vsphere",
            Self::Proxmox => "proxmox",
            Self::Libvirt => "libvirt",
            Self::CloudHypervisor => "cloud-hypervisor",
            Self::Sim => "sim",
        }
    }
}

impl std::fmt::Display for ProviderClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The power state of a machine. Values never read as YAML booleans.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum PowerState {
    /// Running.
    #[default]
    PoweredOn,
    /// Stopped; disks are kept.
    PoweredOff,
    /// Memory saved and execution paused, where the backend supports it.
    Suspended,
}

/// Boot firmware.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum Firmware {
    /// Legacy BIOS.
    #[serde(rename = "bios")]
    Bios,
    /// UEFI.
    #[default]
    #[serde(rename = "efi")]
    Efi,
    /// UEFI with Secure Boot.
    #[serde(rename = "efi-secure")]
    EfiSecure,
}

/// How a disk's blocks are allocated.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum DiskProvisioning {
    /// Allocated on write.
    #[default]
    Thin,
    /// Allocated up front.
    Thick,
    /// Allocated and zeroed up front (vSphere eager-zeroed thick).
    EagerZeroed,
}

/// The format of bootstrap data delivered to a guest (CAPI's `format` key).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum BootstrapFormat {
    /// cloud-init user-data.
    #[default]
    #[serde(rename = "cloud-config")]
    CloudConfig,
    /// Ignition JSON (Flatcar, Fedora CoreOS).
    #[serde(rename = "ignition")]
    Ignition,
}

/// How an interface gets its addresses.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum IpamMode {
    /// DHCP on the attached network.
    #[default]
    Dhcp,
    /// The addresses listed in `addresses`.
    Static,
    /// An address claimed from a CAPI IPAM pool (`IPAddressClaim`).
    Pool,
}

/// Address assignment for one network interface.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.mode != 'static' || (has(self.addresses) && size(self.addresses) > 0)")
    .message("ipam: mode static needs at least one entry in addresses"))]
#[x_kube(validation = Rule::new("self.mode == 'static' || !has(self.addresses) || size(self.addresses) == 0")
    .message("ipam: addresses are only allowed with mode static"))]
#[x_kube(validation = Rule::new("self.mode != 'pool' || has(self.poolRef)")
    .message("ipam: mode pool needs poolRef"))]
#[x_kube(validation = Rule::new("self.mode == 'pool' || !has(self.poolRef)")
    .message("ipam: poolRef is only allowed with mode pool"))]
pub struct Ipam {
    /// `dhcp` (default), `static` or `pool`.
    #[serde(default)]
    pub mode: IpamMode,
    /// Static addresses in CIDR notation, e.g. `10.0.0.5/24` or `fd00::5/64`.
    #[serde(default)]
    #[x_kube(merge_strategy = ListMerge::Set)]
    #[x_kube(validation = Rule::new("self.all(a, isCIDR(a))")
        .message("ipam.addresses must be CIDRs such as 10.0.0.5/24"))]
    #[schemars(length(max = 16), inner(length(max = 64)))]
    pub addresses: Vec<String>,
    /// Default gateway for static addresses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("isIP(self)").message("ipam.gateway must be an IP address"))]
    #[schemars(length(max = 45))]
    pub gateway: Option<String>,
    /// DNS servers for static addresses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Atomic)]
    #[x_kube(validation = Rule::new("self.all(a, isIP(a))")
        .message("ipam.nameservers must be IP addresses"))]
    #[schemars(length(max = 8), inner(length(max = 45)))]
    pub nameservers: Vec<String>,
    /// The IPAM pool to claim from (mode `pool`), e.g. an `InClusterIPPool`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_ref: Option<TypedLocalObjectReference>,
}

/// Labels and annotations of a template, copied onto the objects made from it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct ObjectMetaTemplate {
    /// Labels to set.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations to set.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}
