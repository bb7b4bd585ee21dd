//! libvirt: `LibvirtMachine`, `LibvirtMachineTemplate`, `LibvirtCluster`,
//! `LibvirtClusterTemplate`.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::kinds::{infra_kinds, infra_machine};
use super::machine::MachineDisk;
use crate::api::common::{Firmware, Ipam};
use crate::api::vm_image::LibvirtImageSource;

infra_machine! {
    kind: "LibvirtMachine", short: "blvm",
    doc: "A LibvirtMachine is one libvirt domain (QEMU/KVM) on a libvirt host, with its OS disk cloned from an image volume and a NoCloud seed for bootstrap. It is the Cluster API InfraMachine for libvirt and the backend object banlieue creates for VirtualMachines scheduled onto a libvirt Provider.",
    provider_ref_doc: "The libvirt Provider (same namespace). For CAPI machines it may be left empty: banlieue then finds it from the failure domain CAPI assigned.",
    provider_id_scheme: "libvirt://",
    provider_id_doc: "`libvirt://<domain UUID>`, set by banlieue once the domain exists.",
    bootstrap_doc: "Bootstrap data when no CAPI Machine owns this object; delivered as a NoCloud seed.",
    /// Desired state of a LibvirtMachine.
    #[x_kube(validation = Rule::new("!has(self.maxCPUs) || self.maxCPUs >= self.cpus")
        .message("maxCPUs must be at least cpus"))]
    #[x_kube(validation = Rule::new("!has(self.maxMemoryMiB) || self.maxMemoryMiB >= self.memoryMiB")
        .message("maxMemoryMiB must be at least memoryMiB"))]
    // libvirt refuses a topology whose sockets × cores × threads is not the domain's
    // most vCPUs (`<vcpu>`, maxCPUs), not its current count: only the maximum must divide.
    // (Values named by the backend's CpuTopologyMismatch: see VMClass.)
    #[x_kube(validation = Rule::new("!has(self.coresPerSocket) || (has(self.maxCPUs) ? self.maxCPUs : self.cpus) % self.coresPerSocket == 0")
        .message("maxCPUs (else cpus) must be a multiple of coresPerSocket: the CPU topology of the domain (sockets × coresPerSocket) holds exactly the most vCPUs it can have; make maxCPUs a multiple of coresPerSocket, or change coresPerSocket"))]
    pub struct LibvirtMachineSpec {
        /// The image the OS disk is cloned from.
        pub image: LibvirtImageSource,
        /// Storage pool for the machine's volumes (default `default`).
        #[serde(default = "default_pool")]
        #[schemars(length(min = 1, max = 255))]
        pub storage_pool: String,
        /// Number of virtual CPUs.
        #[schemars(range(min = 1, max = 1024))]
        pub cpus: u32,
        /// The most vCPUs the domain can have while it runs (`<vcpu current='cpus'>maxCPUs</vcpu>`):
        /// `cpus` can then grow up to it live (vCPU hot-plug); beyond it, at the next
        /// power cycle. Default: `cpus` (no room to grow live).
        #[serde(default, rename = "maxCPUs", skip_serializing_if = "Option::is_none")]
        #[schemars(range(min = 1, max = 1024))]
        pub max_cpus: Option<u32>,
        /// Cores per virtual socket: the domain is defined with
        /// `<cpu><topology sockets='S' dies='1' cores='coresPerSocket' threads='1'/></cpu>`,
        /// where `S` is its most vCPUs (`maxCPUs`, else `cpus`) divided by it, which must
        /// therefore be a multiple of it. vCPUs are still hot-plugged one at a time. A
        /// change waits for the next power cycle (the persistent definition is rewritten).
        /// Default: no topology, which libvirt starts as one socket per vCPU.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(range(min = 1, max = 128))]
        pub cores_per_socket: Option<u32>,
        /// Memory in MiB.
        #[serde(rename = "memoryMiB")]
        #[schemars(range(min = 128, max = 25165824))]
        pub memory_mib: u64,
        /// The most memory the domain can have while it runs: with it, the domain is
        /// defined with `<maxMemory>` and one NUMA cell, and `memoryMiB` grows up to it
        /// live (memory modules hot-plugged); beyond it, at the next power cycle.
        /// Default: none (memory changes at the next power cycle).
        #[serde(rename = "maxMemoryMiB", default, skip_serializing_if = "Option::is_none")]
        #[schemars(range(min = 128, max = 25165824))]
        pub max_memory_mib: Option<u64>,
        /// OS disk size in GiB; grown from the image's if larger.
        #[serde(rename = "diskGiB", default, skip_serializing_if = "Option::is_none")]
        #[schemars(range(min = 1, max = 65536))]
        #[x_kube(validation = Rule::new(crate::api::common::DISK_GROWS).message(crate::api::common::OS_DISK_GROWS_MSG))]
        pub disk_gib: Option<u32>,
        /// Firmware (default `efi`).
        #[serde(default)]
        pub firmware: Firmware,
        /// CPU model exposure: `host-passthrough` (default), `host-model`, or `emulated`
        /// (TCG, for hosts without KVM).
        #[serde(default)]
        pub cpu_mode: LibvirtCpuMode,
        /// Additional disks.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
        #[schemars(length(max = 16))]
        pub additional_disks: Vec<MachineDisk>,
        /// Network interfaces, in order.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        #[x_kube(merge_strategy = ListMerge::Atomic)]
        #[x_kube(validation = Rule::new(crate::api::common::MACS_UNIQUE).message(crate::api::common::MACS_UNIQUE_MSG))]
        #[schemars(length(max = 10))]
        pub network: Vec<LibvirtNetworkInterface>,
    }
}

fn default_pool() -> String {
    "default".into()
}

/// How the guest CPU is modelled.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum LibvirtCpuMode {
    /// The host CPU as is (KVM).
    #[default]
    HostPassthrough,
    /// A named model close to the host's (KVM, migratable).
    HostModel,
    /// Software emulation (TCG), for hosts without usable KVM.
    Emulated,
}

/// One libvirt network interface: a libvirt network or a host bridge (exactly one).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.network) != has(self.bridge)")
    .message("network interfaces need exactly one of network or bridge"))]
pub struct LibvirtNetworkInterface {
    /// A libvirt network, e.g. `default`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 255))]
    pub network: Option<String>,
    /// A host bridge, e.g. `br0`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 15))]
    pub bridge: Option<String>,
    /// Fixed MAC address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^([0-9a-fA-F]{2}:){5}[0-9a-fA-F]{2}$')")
        .message("macAddress must look like 52:54:00:12:34:56"))]
    #[x_kube(validation = Rule::new(crate::api::common::MAC_UNICAST).message(crate::api::common::MAC_UNICAST_MSG))]
    #[schemars(length(max = 17))]
    pub mac_address: Option<String>,
    /// MTU: set on the interface (`<mtu size>`, the host side of a virtio NIC) and in the
    /// guest's NoCloud network config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 576, max = 65520))]
    pub mtu: Option<u32>,
    /// Address assignment, written into the NoCloud network config.
    #[serde(default)]
    pub ipam: Ipam,
}

infra_kinds! {
    machine_spec: LibvirtMachineSpec,
    machine_template: LibvirtMachineTemplateSpec / LibvirtMachineTemplateResource,
        "LibvirtMachineTemplate", "libvirtmachinetemplates", "blvmt",
        "A LibvirtMachineTemplate is the Cluster API InfraMachineTemplate for libvirt: MachineDeployments, MachineSets and control planes stamp LibvirtMachines out of spec.template. Its status publishes capacity and node info so the cluster autoscaler can scale from zero.",
    cluster: LibvirtClusterSpec, "LibvirtCluster", "libvirtclusters", "blvc",
        "A LibvirtCluster is the Cluster API InfraCluster for libvirt: it publishes each libvirt host Provider as a failure domain and carries the control plane endpoint.",
    cluster_template: LibvirtClusterTemplateSpec / LibvirtClusterTemplateResource,
        "LibvirtClusterTemplate", "libvirtclustertemplates", "blvct",
        "A LibvirtClusterTemplate is the Cluster API InfraClusterTemplate for libvirt, used by ClusterClass to stamp out LibvirtClusters.",
}
