//! `Provider`: one registered backend instance (a vCenter, a Proxmox cluster, a
//! libvirt host, a Cloud Hypervisor host, or the simulator).

use std::collections::BTreeMap;

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{
    BootstrapFormat, CaBundleSource, Condition, Firmware, LocalObjectReference, PowerState,
    ProviderClass,
};
use super::vm_image::Architecture;

/// Desired state of a Provider.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[kube(
    group = "banlieue.io",
    version = "v1alpha1",
    kind = "Provider",
    namespaced,
    status = "ProviderStatus",
    derive = "PartialEq",
    doc = "A Provider registers one backend instance (a vCenter, a Proxmox VE cluster, a libvirt host, a Cloud Hypervisor host or the simulator) that VirtualMachines can be scheduled onto. banlieue connects to it, discovers its failure domains and re-checks it periodically.",
    shortname = "bprov",
    category = "banlieue",
    printcolumn(name = "Class", type_ = "string", json_path = ".spec.class"),
    printcolumn(
        name = "Endpoint",
        type_ = "string",
        json_path = ".spec.connection.endpoint",
        priority = 1
    ),
    printcolumn(name = "Version", type_ = "string", json_path = ".status.version"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='Ready')].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(
    "!(self.class in ['vsphere', 'proxmox']) || has(self.connection.credentialsRef)"
).message("connection.credentialsRef is required for class vsphere and proxmox"))]
pub struct ProviderSpec {
    /// Which backend this is: `vsphere`, `proxmox`, `libvirt`, `cloud-hypervisor`, `sim`,
    /// or the class (a DNS label) of a backend registered out of tree.
    /// Immutable: register a new Provider to change it.
    #[x_kube(validation = Rule::new("self == oldSelf")
        .message("spec.class is immutable: create a new Provider instead"))]
    pub class: ProviderClass,
    /// How to reach the backend.
    pub connection: Connection,
    /// What the administrator asserts this backend offers: named storage and network
    /// classes mapped to backend targets, and feature flags.
    #[serde(default, skip_serializing_if = "Capabilities::is_empty")]
    pub capabilities: Capabilities,
    /// Failure domains declared by the administrator. When empty, banlieue discovers
    /// them (vSphere clusters, Proxmox nodes, one per libvirt or Cloud Hypervisor host).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    #[schemars(length(max = 100))]
    pub failure_domains: Vec<DeclaredFailureDomain>,
    /// Backend-specific settings, documented per backend (e.g. the simulator's
    /// `latency`, `failureRate`, `capacity`, `machineKind`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub settings: BTreeMap<String, String>,
    /// Stop reconciling this Provider and everything scheduled on it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
}

/// Connection settings of a Provider.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!(has(self.caBundle) && self.insecureSkipTLSVerify)")
    .message("connection: caBundle and insecureSkipTLSVerify are mutually exclusive"))]
pub struct Connection {
    /// Backend URL, e.g. `https://vcenter.example.com/sdk`, `https://pve.example.com:8006`,
    /// `qemu+ssh://root@host/system`, `unix:///run/banlieue/ch.sock` or `sim://local`.
    #[x_kube(validation = Rule::new("self.matches('^[a-z][a-z0-9+.-]*://[^[:space:][:cntrl:]]*$')")
        .message("connection.endpoint must be a URL such as https://vcenter.example.com/sdk or qemu+ssh://host/system"))]
    #[x_kube(validation = Rule::new(r"!self.matches('[\\p{Z}\\p{C}]')")
        .message("connection.endpoint must not contain Unicode spaces or invisible characters (such as U+00A0, U+2028 or U+200B): retype the URL"))]
    #[schemars(length(min = 1, max = 2048))]
    pub endpoint: String,
    /// A Secret in the Provider's namespace with the credentials. vSphere: `username`,
    /// `password`. Proxmox: `tokenID` and `tokenSecret`, or `username` and `password`.
    /// libvirt: optional `sshPrivateKey`, or `tls.crt`/`tls.key` for `qemu+tls`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_ref: Option<LocalObjectReference>,
    /// CAs to trust for the backend's TLS certificate, in addition to none: without a
    /// bundle the system roots are used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<CaBundleSource>,
    /// Skip TLS verification. Off by default; for labs only.
    #[serde(default, rename = "insecureSkipTLSVerify")]
    pub insecure_skip_tls_verify: bool,
}

/// What a Provider offers, as asserted by its administrator.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Capabilities {
    /// Named storage classes, each mapped to a backend target (a datastore, a Proxmox
    /// storage, a libvirt pool, a directory).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    #[schemars(length(max = 64))]
    pub storage_classes: Vec<ClassMapping>,
    /// Named network classes, each mapped to a backend target (a port group, a bridge
    /// and VLAN, a libvirt network, a tap bridge).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    #[schemars(length(max = 64))]
    pub network_classes: Vec<ClassMapping>,
    /// Features this Provider's hosts offer, as the administrator declares them (e.g.
    /// `gpu`, `nestedVirtualization`): labels that `VMClass.requiredFeatures` is
    /// matched against when a VM is placed, as node labels are. banlieue configures
    /// nothing from them; a backend may publish more it detects itself.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Set)]
    #[schemars(length(max = 64), inner(length(min = 1, max = 63)))]
    pub features: Vec<String>,
}

impl Capabilities {
    /// True when nothing is declared.
    pub fn is_empty(&self) -> bool {
        self.storage_classes.is_empty()
            && self.network_classes.is_empty()
            && self.features.is_empty()
    }
}

/// A class name and the backend target it stands for.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
pub struct ClassMapping {
    /// The class name VMClasses and VirtualMachines use, e.g. `fast` or `frontend`.
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')")
        .message("class names must be DNS labels (lowercase letters, digits and '-')"))]
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// The backend target, by key: vSphere `datastore`, `datastoreCluster`,
    /// `storagePolicy`, `portGroup`; Proxmox `storage`, `bridge`, `vlan`; libvirt
    /// `pool`, `network`, `bridge`; Cloud Hypervisor `directory`, `bridge`.
    #[x_kube(validation = Rule::new("size(self) > 0").message("target must name at least one backend key"))]
    pub target: BTreeMap<String, String>,
}

/// A failure domain the administrator declares, with the labels selectors match.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
pub struct DeclaredFailureDomain {
    /// Name, unique within the Provider.
    #[schemars(length(min = 1, max = 256))]
    pub name: String,
    /// Labels matched by `failureDomainSelector`s and anti-affinity topology keys.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[x_kube(validation = Rule::new(super::common::LABEL_KEYS)
        .message(super::common::LABEL_KEYS_MSG))]
    #[schemars(with = "super::common::LabelMapSchema", extend("maxProperties" = 64))]
    pub labels: BTreeMap<String, String>,
    /// Backend location, by key: vSphere `datacenter`, `cluster`, `resourcePool`,
    /// `folder`; Proxmox `node`; libvirt and Cloud Hypervisor `host`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub location: BTreeMap<String, String>,
}

/// Observed state of a Provider.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderStatus {
    /// `Ready` (usable for scheduling) and `Reachable` (the last connection worked).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// The generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The backend's own version string, e.g. `VMware vCenter Server 8.0.3`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Failure domains found on the backend and what each offers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub failure_domains: Vec<DiscoveredFailureDomain>,
    /// What the backend can do, as it declares it, narrowed by the Provider's
    /// `capabilities.*` settings: the scheduler places a VirtualMachine (and a Cluster
    /// API machine) only where every firmware, bootstrap format, power state and image
    /// source it asks for is listed here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_capabilities: Option<BackendCapabilities>,
}

/// What a backend can do. Each list is what it does for real; what is not listed is
/// refused before anything is created (`Scheduled=False` naming it).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackendCapabilities {
    /// Boot firmware it can give a machine: `bios`, `efi`, `efi-secure`.
    #[serde(default)]
    #[x_kube(merge_strategy = ListMerge::Atomic)]
    #[schemars(length(max = 3))]
    pub firmware: Vec<Firmware>,
    /// Bootstrap formats it can deliver to a guest: `cloud-config`, `ignition`.
    #[serde(default)]
    #[x_kube(merge_strategy = ListMerge::Atomic)]
    #[schemars(length(max = 2))]
    pub bootstrap_formats: Vec<BootstrapFormat>,
    /// Power states it can put a machine in: `PoweredOn`, `PoweredOff`, `Suspended`.
    #[serde(default)]
    #[x_kube(merge_strategy = ListMerge::Atomic)]
    #[schemars(length(max = 3))]
    pub power_states: Vec<PowerState>,
    /// The kinds of image source (the fields of the VMImage's source for this class)
    /// it can boot: vSphere `template`, `contentLibraryItem`; Proxmox `templateID`,
    /// `volume`; libvirt `volume`, `path`; Cloud Hypervisor `kernel`, `firmware`; the
    /// simulator `name`.
    #[serde(default)]
    #[x_kube(merge_strategy = ListMerge::Atomic)]
    #[schemars(length(max = 8))]
    pub image_sources: Vec<ImageSourceKind>,
    /// Disk formats it exports a stopped machine's disks as (`CopyDisk`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Atomic)]
    #[schemars(length(max = 3))]
    pub disk_export: Vec<DiskTransferFormat>,
    /// Disk formats it imports as the disks of a new machine (`CopyDisk`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Atomic)]
    #[schemars(length(max = 3))]
    pub disk_import: Vec<DiskTransferFormat>,
    /// How each field of a machine that runs takes a change (the change table): `Live`,
    /// `NextBoot`, `PowerOff` or `Never`, for growing and for shrinking. A field not
    /// listed is `Never`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Atomic)]
    #[schemars(length(max = 16))]
    pub changes: Vec<super::resources::ChangeRule>,
}

/// A kind of image source: which field of a VMImage's per-class source names it.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
pub enum ImageSourceKind {
    /// vSphere `template`.
    #[serde(rename = "template")]
    Template,
    /// vSphere `contentLibraryItem`.
    #[serde(rename = "contentLibraryItem")]
    ContentLibraryItem,
    /// Proxmox `templateID`.
    #[serde(rename = "templateID")]
    TemplateId,
    /// Proxmox or libvirt `volume`.
    #[serde(rename = "volume")]
    Volume,
    /// libvirt `path`.
    #[serde(rename = "path")]
    Path,
    /// Cloud Hypervisor `kernel` (direct kernel boot).
    #[serde(rename = "kernel")]
    Kernel,
    /// Cloud Hypervisor `firmware`.
    #[serde(rename = "firmware")]
    Firmware,
    /// The simulator's `name`.
    #[serde(rename = "name")]
    Name,
}

impl ImageSourceKind {
    /// The field name, as a VMImage spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Template => "template",
            Self::ContentLibraryItem => "contentLibraryItem",
            Self::TemplateId => "templateID",
            Self::Volume => "volume",
            Self::Path => "path",
            Self::Kernel => "kernel",
            Self::Firmware => "firmware",
            Self::Name => "name",
        }
    }
}

/// A disk file format a backend exports or imports (`qemu-img`'s names).
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
pub enum DiskTransferFormat {
    /// A flat image.
    #[serde(rename = "raw")]
    Raw,
    /// QEMU copy-on-write v2.
    #[serde(rename = "qcow2")]
    Qcow2,
    /// VMware's format.
    #[serde(rename = "vmdk")]
    Vmdk,
}

/// A failure domain as discovered on the backend.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveredFailureDomain {
    /// Name, unique within the Provider.
    pub name: String,
    /// Labels matched by selectors and anti-affinity.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Storage classes whose targets exist in this failure domain.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub storage_classes: Vec<String>,
    /// Network classes whose targets exist in this failure domain.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub network_classes: Vec<String>,
    /// Features available in this failure domain.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Set)]
    pub features: Vec<String>,
    /// Backend location details (datacenter, cluster, node, host).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub location: BTreeMap<String, String>,
    /// CPU architecture of this failure domain's hosts (`amd64` or `arm64`), as its
    /// backend reads it from the hypervisor. Only VMs whose VMImage has this
    /// architecture are placed here; unset when the backend does not report it, and
    /// then no VM is placed here at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<Architecture>,
}
