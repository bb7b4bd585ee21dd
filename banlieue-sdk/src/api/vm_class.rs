//! `VMClass`: a named hardware shape, like a StorageClass for machines.

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{DiskProvisioning, Firmware};

/// A hardware shape VirtualMachines refer to by name.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[kube(
    group = "banlieue.io",
    version = "v1alpha1",
    kind = "VMClass",
    plural = "vmclasses",
    derive = "PartialEq",
    doc = "A VMClass is a named, cluster-wide hardware shape (CPUs, memory, firmware, OS disk, required features) that VirtualMachines refer to, so that the same manifest fits every backend.",
    shortname = "bvmclass",
    category = "banlieue",
    printcolumn(name = "CPUs", type_ = "integer", json_path = ".spec.cpus"),
    printcolumn(name = "MemoryMiB", type_ = "integer", json_path = ".spec.memoryMiB"),
    printcolumn(name = "Firmware", type_ = "string", json_path = ".spec.firmware"),
    printcolumn(name = "DiskGiB", type_ = "integer", json_path = ".spec.disk.sizeGiB"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.coresPerSocket) || self.cpus % self.coresPerSocket == 0")
    .message("cpus must be a multiple of coresPerSocket"))]
// Every backend's topology holds every CPU the VM can grow to (libvirt's sockets ×
// cores and Cloud Hypervisor's packages × cores must equal the maximum; vSphere keeps
// its CPU count a multiple of the cores per socket): refused here, before anything is
// made. The message cannot name the values: a messageExpression with `string()` of a
// number is refused by the apiserver (its estimated cost has no bound); the backends'
// own refusal, `CpuTopologyMismatch`, names them.
#[x_kube(validation = Rule::new("!has(self.coresPerSocket) || !has(self.maxCPUs) || self.maxCPUs % self.coresPerSocket == 0")
    .message("maxCPUs must be a multiple of coresPerSocket: the CPU topology (sockets × coresPerSocket) holds every CPU the VM can grow to; make maxCPUs a multiple of coresPerSocket, or change coresPerSocket"))]
#[x_kube(validation = Rule::new("!has(self.maxCPUs) || self.maxCPUs >= self.cpus")
    .message("maxCPUs is the most CPUs the VM can grow to while it runs: it must be at least cpus (raise maxCPUs, or lower cpus)"))]
#[x_kube(validation = Rule::new("!has(self.maxMemoryMiB) || self.maxMemoryMiB >= self.memoryMiB")
    .message("maxMemoryMiB is the most memory the VM can grow to while it runs: it must be at least memoryMiB (raise maxMemoryMiB, or lower memoryMiB)"))]
pub struct VMClassSpec {
    /// Number of virtual CPUs.
    #[schemars(range(min = 1, max = 768))]
    pub cpus: u32,
    /// Room to add CPUs while the VM runs (hot-add headroom, as KubeVirt's
    /// `maxSockets`): `cpus` can later be raised up to `maxCPUs` without a restart
    /// (libvirt `<vcpu current=…>`, Cloud Hypervisor `max_vcpus`, vSphere
    /// `cpuHotAddEnabled`); a raise beyond it waits for the next power cycle. At least
    /// `cpus`. Default: no room (a raise waits for a power cycle). A Provider that
    /// cannot add CPUs to a running machine (Proxmox today) is not a candidate for a
    /// class that asks it: the VM is `Scheduled=False` naming `maxCPUs`.
    #[serde(rename = "maxCPUs", default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 768))]
    pub max_cpus: Option<u32>,
    /// Cores per virtual socket; `cpus` (and `maxCPUs`, when set) must be a multiple of
    /// it. Default: one socket per CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 128))]
    pub cores_per_socket: Option<u32>,
    /// Memory in MiB (at least 128).
    #[serde(rename = "memoryMiB")]
    #[schemars(range(min = 128, max = 25165824))]
    pub memory_mib: u64,
    /// Room to add memory while the VM runs, in MiB (as KubeVirt's `maxGuest`):
    /// `memoryMiB` can later be raised up to it without a restart (libvirt
    /// `<maxMemory>`, Cloud Hypervisor `hotplug_size`, vSphere `memoryHotAddEnabled`);
    /// a raise beyond it waits for the next power cycle. At least `memoryMiB`.
    /// Default: no room. Refused where the Provider cannot add memory live, as
    /// `maxCPUs`.
    #[serde(
        rename = "maxMemoryMiB",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 128, max = 25165824))]
    pub max_memory_mib: Option<u64>,
    /// Boot firmware: `bios`, `efi` (default) or `efi-secure`.
    #[serde(default)]
    pub firmware: Firmware,
    /// The OS disk. It is cloned from the image and grown to this size if smaller.
    pub disk: OsDisk,
    /// Features a failure domain must offer, e.g. `gpu` or `nestedVirtualization`: a
    /// placement constraint, matched against the features a Provider declares (as a
    /// node selector matches node labels). banlieue configures nothing on the VM from
    /// them; what it does configure has fields of its own (`maxCPUs`, `firmware`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Set)]
    #[schemars(length(max = 32), inner(length(min = 1, max = 63)))]
    pub required_features: Vec<String>,
    /// What an edit of this class does to the VirtualMachines already made from it:
    /// `Keep` (default) — each keeps the hardware its machine was built with, and says
    /// the class has moved on (`ClassUpToDate=False`, reason `ClassChanged`, naming
    /// each field that differs); `Apply` — the edit flows to their machines, applied
    /// as each backend's change table says (live, at the next boot, while off, or
    /// refused). A VM pointed at another class (`spec.classRef`) always takes it.
    #[serde(default, skip_serializing_if = "ClassUpdatePolicy::is_keep")]
    pub update_policy: ClassUpdatePolicy,
}

/// What an edit of a VMClass does to the VirtualMachines already made from it.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum ClassUpdatePolicy {
    /// The VMs keep what their machines were built with; each says the class has moved
    /// on. The safe default: an edit resizes nothing.
    #[default]
    Keep,
    /// The edit is applied to the VMs' machines, as a change of their spec.
    Apply,
}

impl ClassUpdatePolicy {
    /// Whether it is the default, [`ClassUpdatePolicy::Keep`] (then it is not
    /// serialized).
    pub fn is_keep(&self) -> bool {
        *self == Self::Keep
    }
}

/// The OS disk of a VMClass.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct OsDisk {
    /// Size in GiB; a floor: the disk is never made smaller than the image.
    #[serde(rename = "sizeGiB")]
    #[schemars(range(min = 1, max = 65536))]
    pub size_gib: u32,
    /// `thin` (default), `thick` or `eagerZeroed`.
    #[serde(default)]
    pub provisioning: DiskProvisioning,
    /// The Provider storage class to place it on. Default: the failure domain's first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(super::common::DNS_LABEL)
        .message("storageClass must name a Provider storage class: a DNS label (lowercase letters, digits and '-'), e.g. fast"))]
    #[schemars(length(min = 1, max = 63))]
    pub storage_class: Option<String>,
}
