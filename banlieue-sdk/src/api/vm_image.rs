//! `VMImage`: one OS image, with where to find it on each backend class.

use kube::{CustomResource, KubeSchema};
use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{BootstrapFormat, Condition, ProviderClass};

/// A backend-agnostic OS image.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[kube(
    group = "banlieue.io",
    version = "v1alpha1",
    kind = "VMImage",
    plural = "vmimages",
    status = "VMImageStatus",
    derive = "PartialEq",
    doc = "A VMImage is a backend-agnostic OS image: its OS and architecture, and one source per backend class (a vSphere template or content-library item, a Proxmox template or volume, a libvirt volume or path, Cloud Hypervisor kernel or firmware plus disk). Its status says on which Providers it is available.",
    shortname = "bvmimage",
    category = "banlieue",
    printcolumn(name = "OS", type_ = "string", json_path = ".spec.os.distribution"),
    printcolumn(name = "Version", type_ = "string", json_path = ".spec.os.version"),
    printcolumn(name = "Arch", type_ = "string", json_path = ".spec.architecture"),
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
pub struct VMImageSpec {
    /// The operating system inside the image.
    pub os: OsInfo,
    /// CPU architecture: `amd64` (default) or `arm64`.
    #[serde(default)]
    pub architecture: Architecture,
    /// Bootstrap formats the guest understands, in order of preference.
    #[serde(default = "default_bootstrap_formats")]
    /// At least one: an image that takes no bootstrap data at all would run a VM's
    /// user data nowhere, silently.
    #[x_kube(merge_strategy = ListMerge::Set)]
    #[schemars(length(min = 1, max = 2))]
    pub bootstrap_formats: Vec<BootstrapFormat>,
    /// Where the image lives on each backend class; at least one.
    pub sources: ImageSources,
}

/// A path on a hypervisor host as a CEL rule: absolute, no `..` segment (the path
/// named is the path used; the backend still resolves symlinks against its allowed
/// directories), and no control characters (a newline in a path lands in domain XML and
/// in logs as two lines).
const HOST_PATH: &str =
    "self.startsWith('/') && !self.matches('(^|/)[.][.](/|$)') && !self.matches('[[:cntrl:]]')";

fn default_bootstrap_formats() -> Vec<BootstrapFormat> {
    vec![BootstrapFormat::CloudConfig]
}

/// OS metadata of an image.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct OsInfo {
    /// `linux`, `windows` or `other`.
    pub family: OsFamily,
    /// Distribution, e.g. `ubuntu`, `flatcar`, `debian`.
    #[schemars(length(min = 1, max = 63))]
    pub distribution: String,
    /// Version, e.g. `24.04`.
    #[schemars(length(min = 1, max = 63))]
    pub version: String,
}

/// Operating system family.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum OsFamily {
    /// Linux.
    Linux,
    /// Windows.
    Windows,
    /// Anything else (BSDs, appliances).
    Other,
}

/// CPU architecture: of an image, or of a failure domain's hosts (only images of
/// theirs are placed there).
#[derive(
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum Architecture {
    /// x86-64.
    #[default]
    Amd64,
    /// AArch64.
    Arm64,
}

impl Architecture {
    /// Its name in the API and in messages: `amd64` or `arm64`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Amd64 => "amd64",
            Self::Arm64 => "arm64",
        }
    }

    /// The architecture a machine name denotes, as `uname -m`, libvirt's capabilities
    /// (`host/cpu/arch`), Rust's `std::env::consts::ARCH` or Go's `GOARCH` spell it:
    /// `x86_64`/`amd64` and `aarch64`/`arm64`. `None` for any other name (32-bit x86
    /// and ARM, `ppc64le`, `s390x`, `riscv64`, ...): an image is never placed on an
    /// architecture banlieue does not know.
    pub fn from_machine(name: &str) -> Option<Self> {
        match name.trim().to_ascii_lowercase().as_str() {
            "x86_64" | "amd64" | "x86-64" => Some(Self::Amd64),
            "aarch64" | "arm64" => Some(Self::Arm64),
            _ => None,
        }
    }
}

impl std::fmt::Display for Architecture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One source per backend class. Unset classes cannot run the image.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(
    "has(self.vsphere) || has(self.proxmox) || has(self.libvirt) || has(self.cloudHypervisor) || has(self.sim) || (has(self.other) && size(self.other) > 0)"
).message("sources must name the image for at least one backend class"))]
pub struct ImageSources {
    /// vSphere: a VM template or a content-library item.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vsphere: Option<VSphereImageSource>,
    /// Proxmox VE: a template VMID or a disk volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxmox: Option<ProxmoxImageSource>,
    /// libvirt: a storage-pool volume or a local path on the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub libvirt: Option<LibvirtImageSource>,
    /// Cloud Hypervisor: a kernel or firmware, and a disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloud_hypervisor: Option<CloudHypervisorImageSource>,
    /// The simulator: any name; it boots instantly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sim: Option<SimImageSource>,
    /// Backend classes registered out of tree, by class name: the settings its backend
    /// reads to find the image (e.g. `lab: {volume: debian-13.qcow2}`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 16))]
    pub other: BTreeMap<String, BTreeMap<String, String>>,
}

impl ImageSources {
    /// Whether this image names a source for `class`.
    pub fn has(&self, class: ProviderClass) -> bool {
        match class {
            ProviderClass::Vsphere => self.vsphere.is_some(),
            ProviderClass::Proxmox => self.proxmox.is_some(),
            ProviderClass::Libvirt => self.libvirt.is_some(),
            ProviderClass::CloudHypervisor => self.cloud_hypervisor.is_some(),
            ProviderClass::Sim => self.sim.is_some(),
            other => self.other.contains_key(other.as_str()),
        }
    }
}

/// The image on vSphere. Exactly one of `template` and `contentLibraryItem`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.template) != has(self.contentLibraryItem)")
    .message("sources.vsphere: set exactly one of template or contentLibraryItem"))]
#[x_kube(validation = Rule::new("!has(self.contentLibraryItem)")
    .message("sources.vsphere.contentLibraryItem is not supported yet: use sources.vsphere.template (a VM template's name or inventory path)"))]
pub struct VSphereImageSource {
    /// Inventory path or name of a VM template, e.g. `/dc1/vm/templates/ubuntu-2404`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub template: Option<String>,
    /// A content-library item. Not supported yet: admission refuses it; use `template`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_library_item: Option<ContentLibraryItem>,
}

/// A vSphere content-library item.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct ContentLibraryItem {
    /// Library name.
    #[schemars(length(min = 1, max = 255))]
    pub library: String,
    /// Item name.
    #[schemars(length(min = 1, max = 255))]
    pub item: String,
}

/// The image on Proxmox VE. Exactly one of `templateID` and `volume`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.templateID) != has(self.volume)")
    .message("sources.proxmox: set exactly one of templateID or volume"))]
pub struct ProxmoxImageSource {
    /// VMID of a template, e.g. `9000`.
    #[serde(
        default,
        rename = "templateID",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 100, max = 999999999))]
    pub template_id: Option<u32>,
    /// A disk volume, `<storage>:<path>`, e.g. `local:import/noble.qcow2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^[a-zA-Z0-9][-_.a-zA-Z0-9]*:.+$')")
        .message("sources.proxmox.volume must look like <storage>:<path>"))]
    #[schemars(length(min = 3, max = 1024))]
    pub volume: Option<String>,
}

/// The image on a libvirt host. Exactly one of `volume` and `path`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.volume) != has(self.path)")
    .message("sources.libvirt: set exactly one of volume or path"))]
pub struct LibvirtImageSource {
    /// A volume in a storage pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<PoolVolume>,
    /// An absolute path on the host (no URLs: banlieue downloads nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(HOST_PATH).message("sources.libvirt.path must be an absolute path on the host, without '..' segments or control characters (newlines, tabs)"))]
    #[schemars(length(min = 2, max = 4096))]
    pub path: Option<String>,
    /// Disk format of the image (default `qcow2`).
    #[serde(default)]
    pub format: DiskFormat,
}

/// A volume in a libvirt storage pool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct PoolVolume {
    /// Pool name.
    #[schemars(length(min = 1, max = 255))]
    pub pool: String,
    /// Volume name.
    #[schemars(length(min = 1, max = 255))]
    pub name: String,
}

/// Disk image format.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum DiskFormat {
    /// QEMU copy-on-write v2.
    #[default]
    Qcow2,
    /// Raw.
    Raw,
}

/// The image for Cloud Hypervisor: a direct kernel or a firmware (exactly one), and a disk.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.kernel) != has(self.firmware)")
    .message("sources.cloudHypervisor: set exactly one of kernel or firmware"))]
#[x_kube(validation = Rule::new("!has(self.cmdline) || has(self.kernel)")
    .message("sources.cloudHypervisor.cmdline needs kernel"))]
pub struct CloudHypervisorImageSource {
    /// Absolute host path of a kernel to boot directly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(HOST_PATH).message("kernel must be an absolute path on the host, without '..' segments or control characters (newlines, tabs)"))]
    #[schemars(length(min = 2, max = 4096))]
    pub kernel: Option<String>,
    /// Absolute host path of a firmware (e.g. rust-hypervisor-firmware, CLOUDHV.fd).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(HOST_PATH).message("firmware must be an absolute path on the host, without '..' segments or control characters (newlines, tabs)"))]
    #[schemars(length(min = 2, max = 4096))]
    pub firmware: Option<String>,
    /// Kernel command line (with `kernel`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub cmdline: Option<String>,
    /// Absolute host path of the OS disk image, copied per machine.
    #[x_kube(validation = Rule::new(HOST_PATH).message("disk must be an absolute path on the host, without '..' segments or control characters (newlines, tabs)"))]
    #[schemars(length(min = 2, max = 4096))]
    pub disk: String,
    /// Disk format of `disk` (default `qcow2`; `raw` is fastest).
    #[serde(default)]
    pub format: DiskFormat,
}

/// The image on the simulator.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct SimImageSource {
    /// Any name; reported back as the simulated template.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// Where an image is available.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct VMImageStatus {
    /// `Ready`: available on at least one Provider.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// The generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// One row per Provider whose class this image has a source for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["namespace".into(), "name".into()]))]
    pub providers: Vec<ImageAvailability>,
}

/// Availability of an image on one Provider.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageAvailability {
    /// Provider namespace.
    pub namespace: String,
    /// Provider name.
    pub name: String,
    /// Whether the image was found there.
    pub available: bool,
    /// The backend's own reference, e.g. a template moref or a volume key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved: Option<String>,
    /// Why it is unavailable, CamelCase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Details from the backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::Architecture;

    #[test]
    fn machine_names_map_to_the_two_architectures_and_nothing_else() {
        let table = [
            ("x86_64", Some(Architecture::Amd64)),
            ("amd64", Some(Architecture::Amd64)),
            ("X86_64\n", Some(Architecture::Amd64)),
            ("aarch64", Some(Architecture::Arm64)),
            ("arm64", Some(Architecture::Arm64)),
            ("i686", None),
            ("armv7l", None),
            ("ppc64le", None),
            ("s390x", None),
            ("riscv64", None),
            ("", None),
            ("fake", None),
        ];
        for (name, want) in table {
            assert_eq!(Architecture::from_machine(name), want, "{name:?}");
        }
        assert_eq!(Architecture::Arm64.to_string(), "arm64");
        assert_eq!(
            serde_json::to_value(Architecture::Amd64).unwrap(),
            Architecture::Amd64.as_str()
        );
    }
}
