//! Cloud Hypervisor: `CloudHypervisorMachine`, `CloudHypervisorMachineTemplate`,
//! `CloudHypervisorCluster`, `CloudHypervisorClusterTemplate`.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use super::kinds::{infra_kinds, infra_machine};
use super::machine::MachineDisk;
use crate::api::common::Ipam;
use crate::api::vm_image::CloudHypervisorImageSource;

infra_machine! {
    kind: "CloudHypervisorMachine", short: "bchm",
    doc: "A CloudHypervisorMachine is one Cloud Hypervisor VMM process on a host, booted from a kernel or firmware with its own copy of the image disk. It is the Cluster API InfraMachine for Cloud Hypervisor and the backend object banlieue creates for VirtualMachines scheduled onto a cloud-hypervisor Provider.",
    provider_ref_doc: "The cloud-hypervisor Provider (same namespace). For CAPI machines it may be left empty: banlieue then finds it from the failure domain CAPI assigned.",
    provider_id_scheme: "cloud-hypervisor://",
    provider_id_doc: "`cloud-hypervisor://<uuid>`, set by banlieue once the VMM runs.",
    bootstrap_doc: "Bootstrap data when no CAPI Machine owns this object; delivered as a NoCloud seed.",
    /// Desired state of a CloudHypervisorMachine.
    #[x_kube(validation = Rule::new("!has(self.maxCPUs) || self.maxCPUs >= self.cpus")
        .message("maxCPUs must be at least cpus"))]
    #[x_kube(validation = Rule::new("!has(self.maxMemoryMiB) || self.maxMemoryMiB >= self.memoryMiB")
        .message("maxMemoryMiB must be at least memoryMiB"))]
    // CH refuses a topology whose product is not `max_vcpus` (maxCPUs), whatever
    // `boot_vcpus` is: only the maximum must divide.
    // (Values named by the backend's CpuTopologyMismatch: see VMClass.)
    #[x_kube(validation = Rule::new("!has(self.coresPerSocket) || (has(self.maxCPUs) ? self.maxCPUs : self.cpus) % self.coresPerSocket == 0")
        .message("maxCPUs (else cpus) must be a multiple of coresPerSocket: the CPU topology of the VM (packages × coresPerSocket) holds exactly the most vCPUs it can have; make maxCPUs a multiple of coresPerSocket, or change coresPerSocket"))]
    // Data disk files live in the machine's own directory, on the host's one storage
    // (`local` in the inventory): any other target would be accepted and ignored.
    #[x_kube(validation = Rule::new("!has(self.additionalDisks) || self.additionalDisks.all(d, !has(d.storage) || d.storage == 'local')")
        .message("additionalDisks[].storage: Cloud Hypervisor keeps data disks in the machine's directory on the host's one storage, local; leave storage unset or set it to local"))]
    pub struct CloudHypervisorMachineSpec {
        /// Kernel or firmware, and the disk image to copy.
        pub image: CloudHypervisorImageSource,
        /// Boot vCPUs.
        #[schemars(range(min = 1, max = 254))]
        pub cpus: u32,
        /// Maximum vCPUs for hot-plug. Default: `cpus`.
        #[serde(default, rename = "maxCPUs", skip_serializing_if = "Option::is_none")]
        #[schemars(range(min = 1, max = 254))]
        pub max_cpus: Option<u32>,
        /// Cores per virtual socket: the VM is created with `cpus.topology`
        /// `{threads_per_core: 1, cores_per_die: coresPerSocket, dies_per_package: 1,
        /// packages: P}`, where `P` is its most vCPUs (`maxCPUs`, else `cpus`) divided by
        /// it, which must therefore be a multiple of it. A change waits for the next
        /// power cycle (CH cannot change a VM's topology). Default: 1, one socket
        /// (package) per vCPU.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(range(min = 1, max = 128))]
        pub cores_per_socket: Option<u32>,
        /// Memory in MiB.
        #[serde(rename = "memoryMiB")]
        #[schemars(range(min = 128, max = 25165824))]
        pub memory_mib: u64,
        /// The most memory the machine can grow to while it runs, in MiB: the VMM is
        /// created with `maxMemoryMiB − memoryMiB` of hot-plug room
        /// (`memory.hotplug_size`), and `memoryMiB` raised within it is added live
        /// (`vm.resize`), in steps of 128 MiB. Default: `memoryMiB` (no room: a raise
        /// waits for the next boot).
        #[serde(default, rename = "maxMemoryMiB", skip_serializing_if = "Option::is_none")]
        #[schemars(range(min = 128, max = 25165824))]
        pub max_memory_mib: Option<u64>,
        /// Back guest memory with huge pages.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        pub hugepages: bool,
        /// OS disk size in GiB; grown from the image's if larger.
        #[serde(rename = "diskGiB", default, skip_serializing_if = "Option::is_none")]
        #[schemars(range(min = 1, max = 65536))]
        #[x_kube(validation = Rule::new(crate::api::common::DISK_GROWS).message(crate::api::common::OS_DISK_GROWS_MSG))]
        pub disk_gib: Option<u32>,
        /// Additional disks: raw files in the machine's directory (`storage` may only be
        /// `local`, the host's one storage). `provisioning`: `thin` makes a sparse file,
        /// `thick` allocates it (`fallocate`), `eagerZeroed` writes zeros over it — when
        /// made and when grown while off; a disk grown while running has its new range
        /// allocated (`fallocate`) for both, since writing zeros under a running guest
        /// would race its writes.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
        #[schemars(length(max = 16))]
        pub additional_disks: Vec<MachineDisk>,
        /// Network interfaces (tap devices), in order.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        #[x_kube(merge_strategy = ListMerge::Atomic)]
        #[x_kube(validation = Rule::new(crate::api::common::MACS_UNIQUE).message(crate::api::common::MACS_UNIQUE_MSG))]
        #[schemars(length(max = 8))]
        pub network: Vec<CloudHypervisorNetworkInterface>,
    }
}

/// One Cloud Hypervisor network interface: a tap device, optionally enslaved to a bridge.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct CloudHypervisorNetworkInterface {
    /// Host bridge the tap joins, e.g. `br0`. Empty: an unbridged tap.
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
    /// MTU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 576, max = 65520))]
    pub mtu: Option<u32>,
    /// Address assignment, written into the NoCloud network config.
    #[serde(default)]
    pub ipam: Ipam,
}

infra_kinds! {
    machine_spec: CloudHypervisorMachineSpec,
    machine_template: CloudHypervisorMachineTemplateSpec / CloudHypervisorMachineTemplateResource,
        "CloudHypervisorMachineTemplate", "cloudhypervisormachinetemplates", "bchmt",
        "A CloudHypervisorMachineTemplate is the Cluster API InfraMachineTemplate for Cloud Hypervisor: MachineDeployments, MachineSets and control planes stamp CloudHypervisorMachines out of spec.template. Its status publishes capacity and node info so the cluster autoscaler can scale from zero.",
    cluster: CloudHypervisorClusterSpec, "CloudHypervisorCluster", "cloudhypervisorclusters", "bchc",
        "A CloudHypervisorCluster is the Cluster API InfraCluster for Cloud Hypervisor: it publishes each Cloud Hypervisor host Provider as a failure domain and carries the control plane endpoint.",
    cluster_template: CloudHypervisorClusterTemplateSpec / CloudHypervisorClusterTemplateResource,
        "CloudHypervisorClusterTemplate", "cloudhypervisorclustertemplates", "bchct",
        "A CloudHypervisorClusterTemplate is the Cluster API InfraClusterTemplate for Cloud Hypervisor, used by ClusterClass to stamp out CloudHypervisorClusters.",
}
