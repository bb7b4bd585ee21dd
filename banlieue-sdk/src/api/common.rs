//! Types shared by both API groups: references, selectors, TLS trust, network and
//! disk shapes, and the small enums every kind speaks.

use std::collections::BTreeMap;

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};

/// The key a CA bundle is read from when a ConfigMap or Secret reference names none.
pub const DEFAULT_CA_BUNDLE_KEY: &str = "ca.crt";

// Admission rules shared by the API types. The CRD schema has no format for Kubernetes
// names, label keys or label values, so CEL checks them, each with a message saying
// what a valid value looks like. Every checked string also has a maxLength so the
// apiserver's CEL cost estimate stays within budget.

/// CEL over the string `$v`: an RFC 1123 subdomain (length bounded by the schema).
macro_rules! dns_subdomain_cel {
    ($v:literal) => {
        concat!(
            $v,
            ".matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')"
        )
    };
}

/// CEL over the string `$v`: a label key (`[prefix/]name`, the prefix an RFC 1123
/// subdomain of at most 253 characters, the name at most 63 of `[A-Za-z0-9._-]`
/// starting and ending with an alphanumeric). Annotation keys have the same shape.
macro_rules! label_key_cel {
    ($v:literal) => {
        concat!(
            $v,
            ".matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$') && (!",
            $v,
            ".contains('/') || ",
            $v,
            ".matches('^[^/]{1,253}/'))"
        )
    };
}

/// CEL: `self` is an RFC 1123 subdomain, as Kubernetes object names are.
pub(crate) const DNS_SUBDOMAIN: &str = dns_subdomain_cel!("self");
/// The message for [`DNS_SUBDOMAIN`] on an object name.
pub(crate) const DNS_SUBDOMAIN_NAME_MSG: &str = "name must be a Kubernetes object name: an RFC 1123 subdomain of lowercase letters, digits, '-' and '.', starting and ending with a letter or digit, e.g. my-object or web.v2";
/// CEL: `self` is an RFC 1123 label (length bounded by the schema).
pub(crate) const DNS_LABEL: &str = "self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')";
/// CEL: `self` is a label key.
pub(crate) const LABEL_KEY: &str = label_key_cel!("self");
/// The message for [`LABEL_KEY`].
pub(crate) const LABEL_KEY_MSG: &str = "must be a label key: an optional DNS subdomain prefix and '/', then a name of at most 63 letters, digits, '-', '_' and '.' starting and ending with a letter or digit, e.g. topology.kubernetes.io/zone or rack";
/// CEL over a map: every key is a label key.
pub(crate) const LABEL_KEYS: &str = concat!("self.all(k, ", label_key_cel!("k"), ")");
/// The message for [`LABEL_KEYS`] on a label map.
pub(crate) const LABEL_KEYS_MSG: &str = "label keys must be an optional DNS subdomain prefix and '/', then a name of at most 63 letters, digits, '-', '_' and '.' starting and ending with a letter or digit, e.g. example.com/tier or tier";
/// The message for [`LABEL_KEYS`] on an annotation map.
pub(crate) const ANNOTATION_KEYS_MSG: &str = "annotation keys must be an optional DNS subdomain prefix and '/', then a name of at most 63 letters, digits, '-', '_' and '.' starting and ending with a letter or digit, e.g. example.com/owner";
/// CEL: `self` is a label value (length bounded by the schema).
pub(crate) const LABEL_VALUE: &str =
    "self.matches('^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$')";
/// The message for [`LABEL_VALUE`].
pub(crate) const LABEL_VALUE_MSG: &str = "label values must be empty or at most 63 letters, digits, '-', '_' and '.' starting and ending with a letter or digit, e.g. zone-a";
/// CEL on a MAC address: unicast (the first octet's lowest bit is 0) and not all zeros.
pub(crate) const MAC_UNICAST: &str =
    "self.matches('^[0-9a-fA-F][02468aceACE]:') && !self.matches('^(00:){5}00$')";
/// The message for [`MAC_UNICAST`].
pub(crate) const MAC_UNICAST_MSG: &str = "macAddress must be a unicast address other than 00:00:00:00:00:00: the first octet's lowest bit must be 0 (a second hex digit of 0, 2, 4, 6, 8, A, C or E, e.g. 52:54:00:12:34:56)";
/// CEL over a list of network interfaces: no MAC address appears twice (case-insensitively).
pub(crate) const MACS_UNIQUE: &str = "self.all(n, !has(n.macAddress) || self.filter(m, has(m.macAddress) && m.macAddress.lowerAscii() == n.macAddress.lowerAscii()).size() == 1)";
/// The message for [`MACS_UNIQUE`].
pub(crate) const MACS_UNIQUE_MSG: &str = "two network interfaces have the same macAddress: give each interface its own, or leave it empty to have one generated";
/// The message for a disk name that is not a DNS label.
pub(crate) const DISK_NAME_MSG: &str = "disk names must be DNS labels: lowercase letters, digits and '-', starting and ending with a letter or digit (no '/' or '.'), e.g. data-1";

/// A reference to an object of a known kind by name, in the referrer's namespace
/// (or cluster-wide for cluster-scoped kinds).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
pub struct LocalObjectReference {
    /// Name of the referenced object.
    #[x_kube(validation = Rule::new(DNS_SUBDOMAIN).message(DNS_SUBDOMAIN_NAME_MSG))]
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
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct TypedLocalObjectReference {
    /// API group of the referenced kind, e.g. `ipam.cluster.x-k8s.io`.
    #[x_kube(validation = Rule::new(DNS_SUBDOMAIN)
        .message("apiGroup must be an API group: a lowercase DNS subdomain such as ipam.cluster.x-k8s.io (no version, no '/')"))]
    #[schemars(length(min = 1, max = 253))]
    pub api_group: String,
    /// Kind of the referenced object, e.g. `InClusterIPPool`.
    #[x_kube(validation = Rule::new("self.matches('^[A-Z][A-Za-z0-9]*$')")
        .message("kind must be a kind in CamelCase, such as InClusterIPPool (not the plural resource name)"))]
    #[schemars(length(min = 1, max = 63))]
    pub kind: String,
    /// Name of the referenced object.
    #[x_kube(validation = Rule::new(DNS_SUBDOMAIN).message(DNS_SUBDOMAIN_NAME_MSG))]
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// One key of a ConfigMap or Secret in the referrer's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
pub struct KeySelector {
    /// Name of the ConfigMap or Secret.
    #[x_kube(validation = Rule::new(DNS_SUBDOMAIN).message(DNS_SUBDOMAIN_NAME_MSG))]
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key inside it; each use documents its default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^[-._a-zA-Z0-9]+$') && self != '.' && self != '..'")
        .message("key must be a ConfigMap or Secret key: letters, digits, '-', '_' and '.' only (not '.' or '..'), e.g. ca.crt"))]
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

pub use super::provider_class::{InvalidProviderClass, ProviderClass};

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

impl PowerState {
    /// The state as the API spells it (`PoweredOn`, `PoweredOff`, `Suspended`).
    pub fn as_str(self) -> &'static str {
        match self {
            PowerState::PoweredOn => "PoweredOn",
            PowerState::PoweredOff => "PoweredOff",
            PowerState::Suspended => "Suspended",
        }
    }
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

impl Firmware {
    /// The firmware as the API spells it (`bios`, `efi`, `efi-secure`).
    pub fn as_str(self) -> &'static str {
        match self {
            Firmware::Bios => "bios",
            Firmware::Efi => "efi",
            Firmware::EfiSecure => "efi-secure",
        }
    }
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
#[x_kube(validation = Rule::new("self.mode != 'dhcp' || (!has(self.gateway) && (!has(self.nameservers) || size(self.nameservers) == 0))")
    .message("ipam: gateway and nameservers are not used with mode dhcp (DHCP supplies them): remove them, or set mode static"))]
#[x_kube(validation = Rule::new("!has(self.gateway) || !isIP(self.gateway) || !has(self.addresses) || self.addresses.all(a, !isCIDR(a)) || self.addresses.exists(a, isCIDR(a) && cidr(a).ip().family() == ip(self.gateway).family())")
    .message("ipam.gateway must be of the same IP family as an address: an IPv4 gateway needs an IPv4 address, an IPv6 gateway an IPv6 one"))]
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
    #[x_kube(validation = Rule::new("!isIP(self) || !ip(self).isUnspecified()")
        .message("ipam.gateway must not be the unspecified address (0.0.0.0 or ::)"))]
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
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
pub struct ObjectMetaTemplate {
    /// Labels to set.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[x_kube(validation = Rule::new(LABEL_KEYS).message(LABEL_KEYS_MSG))]
    #[schemars(with = "LabelMapSchema", extend("maxProperties" = 64))]
    pub labels: BTreeMap<String, String>,
    /// Annotations to set.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[x_kube(validation = Rule::new(LABEL_KEYS).message(ANNOTATION_KEYS_MSG))]
    #[schemars(extend("maxProperties" = 128))]
    pub annotations: BTreeMap<String, String>,
}

/// A label map in the schema: label values are checked (keys are checked by a rule on
/// the map). The Rust fields stay `BTreeMap<String, String>`.
pub(crate) type LabelMapSchema = BTreeMap<String, LabelValueSchema>;

/// The schema of one label value: at most 63 characters of `[A-Za-z0-9._-]`, starting
/// and ending with an alphanumeric, or empty.
#[derive(Serialize)]
#[allow(dead_code)] // schema only
pub(crate) struct LabelValueSchema;

impl JsonSchema for LabelValueSchema {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> std::borrow::Cow<'static, str> {
        "LabelValue".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "maxLength": 63,
            "x-kubernetes-validations": [{"rule": LABEL_VALUE, "message": LABEL_VALUE_MSG}],
        })
    }
}

/// The schema of a label selector as admission checks it: operators are an enum,
/// `values` must match the operator, keys are label keys and values label values. The
/// Rust type stays k8s-openapi's [`LabelSelector`] (fields use `#[schemars(with)]`).
#[derive(Serialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)] // schema only
pub(crate) struct LabelSelectorSchema {
    /// A list of label selector requirements, ANDed.
    #[serde(default)]
    #[x_kube(merge_strategy = ListMerge::Atomic)]
    #[schemars(length(max = 32))]
    match_expressions: Vec<LabelSelectorRequirementSchema>,
    /// `{key: value}` pairs, each equivalent to a matchExpressions entry with operator
    /// `In` and that one value. ANDed with matchExpressions.
    #[serde(default)]
    #[x_kube(validation = Rule::new(LABEL_KEYS)
        .message("matchLabels keys must be label keys: an optional DNS subdomain prefix and '/', then a name of at most 63 letters, digits, '-', '_' and '.' starting and ending with a letter or digit"))]
    #[schemars(extend("maxProperties" = 64))]
    match_labels: LabelMapSchema,
}

/// One requirement of a label selector.
#[derive(Serialize, KubeSchema)]
#[allow(dead_code)] // schema only
#[x_kube(validation = Rule::new("!(self.operator in ['In', 'NotIn']) || (has(self.values) && size(self.values) > 0)")
    .message("matchExpressions: operator In and NotIn need at least one entry in values"))]
#[x_kube(validation = Rule::new("!(self.operator in ['Exists', 'DoesNotExist']) || !has(self.values) || size(self.values) == 0")
    .message("matchExpressions: operator Exists and DoesNotExist take no values: remove values"))]
struct LabelSelectorRequirementSchema {
    /// The label key the requirement applies to.
    #[x_kube(validation = Rule::new(LABEL_KEY).message(LABEL_KEY_MSG))]
    #[schemars(length(min = 1, max = 317))]
    key: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist`.
    operator: SelectorOperator,
    /// The values for `In` and `NotIn` (at least one); none for `Exists` and `DoesNotExist`.
    #[serde(default)]
    #[x_kube(merge_strategy = ListMerge::Atomic)]
    #[schemars(length(max = 64))]
    values: Vec<LabelValueSchema>,
}

/// A label selector operator.
#[derive(Serialize, JsonSchema)]
#[allow(dead_code)] // schema only
enum SelectorOperator {
    /// The label's value is one of `values`.
    In,
    /// The label is absent or its value is none of `values`.
    NotIn,
    /// The label is present.
    Exists,
    /// The label is absent.
    DoesNotExist,
}

/// A disk size only grows (a transition rule: a new object has no old size).
pub(crate) const DISK_GROWS: &str = "self >= oldSelf";
/// An existing data disk of a VirtualMachine keeps its provisioning and storage class
/// (a transition rule on a disk of a list keyed by name): no backend converts or moves
/// a disk in place, so a change would otherwise be silently ignored.
pub(crate) const VM_DISK_STAYS: &str = "(has(self.provisioning) ? self.provisioning : 'thin') == (has(oldSelf.provisioning) ? oldSelf.provisioning : 'thin') && (has(self.storageClass) ? self.storageClass : '') == (has(oldSelf.storageClass) ? oldSelf.storageClass : '')";
/// The message for [`VM_DISK_STAYS`].
pub(crate) const VM_DISK_STAYS_MSG: &str = "an existing disk keeps its provisioning and storageClass (no backend converts or moves a disk in place): to change them, remove the disk and add one with a new name";
/// [`VM_DISK_STAYS`] for an infrastructure machine's additional disk (`storage`).
pub(crate) const MACHINE_DISK_STAYS: &str = "(has(self.provisioning) ? self.provisioning : 'thin') == (has(oldSelf.provisioning) ? oldSelf.provisioning : 'thin') && (has(self.storage) ? self.storage : '') == (has(oldSelf.storage) ? oldSelf.storage : '')";
/// The message for [`MACHINE_DISK_STAYS`].
pub(crate) const MACHINE_DISK_STAYS_MSG: &str = "an existing disk keeps its provisioning and storage (no backend converts or moves a disk in place): to change them, remove the disk and add one with a new name";
/// The message for [`DISK_GROWS`] on a data disk.
pub(crate) const DISK_GROWS_MSG: &str = "sizeGiB cannot shrink: a disk only grows (shrinking loses data); to get a smaller disk, add a new one and copy what you need";
/// The message for [`DISK_GROWS`] on an OS disk.
pub(crate) const OS_DISK_GROWS_MSG: &str = "diskGiB cannot shrink: the OS disk only grows (shrinking loses data); make a new machine to get a smaller one";
