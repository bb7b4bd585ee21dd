//! vSphere: `VSphereMachine`, `VSphereMachineTemplate`, `VSphereCluster`,
//! `VSphereClusterTemplate`.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::kinds::{infra_kinds, infra_machine};
use super::machine::MachineDisk;
use crate::api::common::{DiskProvisioning, Firmware, Ipam};

infra_machine! {
    kind: "VSphereMachine", short: "bvsm",
    doc: "A VSphereMachine is one virtual machine on a vCenter, cloned from a template. It is the Cluster API InfraMachine for vSphere and the backend object banlieue creates for VirtualMachines scheduled onto a vsphere Provider.",
    provider_ref_doc: "The vsphere Provider (same namespace). For CAPI machines it may be left empty: banlieue then finds it from the failure domain CAPI assigned.",
    provider_id_scheme: "vsphere://",
    provider_id_doc: "`vsphere://<BIOS UUID>`, set by banlieue once the VM exists; matches the Node's providerID reported by the vSphere cloud provider.",
    bootstrap_doc: "Bootstrap data when no CAPI Machine owns this object; delivered through `guestinfo.userdata` or `guestinfo.ignition.config.data`.",
    /// Desired state of a VSphereMachine.
    #[x_kube(validation = Rule::new("!(has(self.datastore) && has(self.storagePolicyName))")
        .message("set either datastore or storagePolicyName, not both"))]
    #[x_kube(validation = Rule::new("!has(self.numCoresPerSocket) || self.numCPUs % self.numCoresPerSocket == 0")
        .message("numCPUs must be a multiple of numCoresPerSocket"))]
    #[x_kube(validation = Rule::new("!has(self.maxCPUs) || self.maxCPUs >= self.numCPUs")
        .message("maxCPUs must be at least numCPUs"))]
    #[x_kube(validation = Rule::new("!has(self.maxMemoryMiB) || self.maxMemoryMiB >= self.memoryMiB")
        .message("maxMemoryMiB must be at least memoryMiB"))]
    // A linked clone's disk is a delta on the template's snapshot: always sparse.
    #[x_kube(validation = Rule::new("!has(self.cloneMode) || self.cloneMode != 'LinkedClone' || !has(self.diskProvisioning) || self.diskProvisioning == 'thin'")
        .message("diskProvisioning: a LinkedClone's disk is a thin delta on the template's; use FullClone for thick or eagerZeroed"))]
    pub struct VSphereMachineSpec {
        /// Name or inventory path of the template to clone.
        #[schemars(length(min = 1, max = 1024))]
        pub template: String,
        /// `FullClone` (default) or `LinkedClone` (needs a snapshot on the template).
        #[serde(default)]
        pub clone_mode: CloneMode,
        /// Datacenter name or path. Default: from the failure domain.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(length(min = 1, max = 255))]
        pub datacenter: Option<String>,
        /// Compute cluster. Default: from the failure domain.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(length(min = 1, max = 255))]
        pub cluster: Option<String>,
        /// Resource pool path. Default: the cluster's root pool.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(length(min = 1, max = 1024))]
        pub resource_pool: Option<String>,
        /// VM folder path. Default: the datacenter's VM folder.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(length(min = 1, max = 1024))]
        pub folder: Option<String>,
        /// Datastore for the OS disk.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(length(min = 1, max = 255))]
        pub datastore: Option<String>,
        /// Storage policy (SPBM) for the OS disk, instead of a datastore.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(length(min = 1, max = 255))]
        pub storage_policy_name: Option<String>,
        /// Number of virtual CPUs.
        #[serde(rename = "numCPUs")]
        #[schemars(range(min = 1, max = 768))]
        pub num_cpus: u32,
        /// Room to add CPUs while the VM runs: set, the VM is made with CPU hot-add
        /// (`cpuHotAddEnabled`) and a raise of `numCPUs` (up to `maxCPUs`, which it
        /// cannot exceed) is added live, one `ReconfigVM_Task`, no restart. Without it
        /// (no hot-add, vSphere's default) a raise waits for a power-off. vSphere turns
        /// hot-add on or off only while the VM is off: it is set when the VM is made,
        /// and a later change of it with the next CPU change made while the VM is off.
        /// Default: no hot-add.
        #[serde(rename = "maxCPUs", default, skip_serializing_if = "Option::is_none")]
        #[schemars(range(min = 1, max = 768))]
        pub max_cpus: Option<u32>,
        /// Cores per socket.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(range(min = 1, max = 128))]
        pub num_cores_per_socket: Option<u32>,
        /// Memory in MiB.
        #[serde(rename = "memoryMiB")]
        #[schemars(range(min = 128, max = 25165824))]
        pub memory_mib: u64,
        /// Room to add memory while the VM runs, in MiB: set, the VM is made with
        /// memory hot-add (`memoryHotAddEnabled`) and a raise of `memoryMiB` (up to
        /// it) is added live. Without it a raise waits for a power-off. Set as
        /// `maxCPUs` is. Default: no hot-add.
        #[serde(rename = "maxMemoryMiB", default, skip_serializing_if = "Option::is_none")]
        #[schemars(range(min = 128, max = 25165824))]
        pub max_memory_mib: Option<u64>,
        /// OS disk size in GiB; grown from the template's if larger.
        #[serde(rename = "diskGiB", default, skip_serializing_if = "Option::is_none")]
        #[schemars(range(min = 1, max = 65536))]
        #[x_kube(validation = Rule::new(crate::api::common::DISK_GROWS).message(crate::api::common::OS_DISK_GROWS_MSG))]
        pub disk_gib: Option<u32>,
        /// How the clone's copy of the template's OS disk is provisioned (the clone's
        /// disk locator backing): `thin` (default), `thick` (lazily zeroed) or
        /// `eagerZeroed`. A `LinkedClone` takes only `thin`.
        #[serde(default)]
        pub disk_provisioning: DiskProvisioning,
        /// Firmware; default: the template's.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub firmware: Option<Firmware>,
        /// Additional disks.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
        #[schemars(length(max = 59))]
        pub additional_disks: Vec<MachineDisk>,
        /// Network devices, in order.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        #[x_kube(merge_strategy = ListMerge::Atomic)]
        #[x_kube(validation = Rule::new(crate::api::common::MACS_UNIQUE).message(crate::api::common::MACS_UNIQUE_MSG))]
        #[schemars(length(max = 10))]
        pub network: Vec<VSphereNetworkDevice>,
    }
}

/// vSphere clone mode.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum CloneMode {
    /// An independent copy of the template's disks.
    #[default]
    FullClone,
    /// A delta disk on the template's snapshot: fast, but tied to the template.
    LinkedClone,
}

/// One vSphere network device.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct VSphereNetworkDevice {
    /// Port group or distributed port group name or path.
    #[schemars(length(min = 1, max = 1024))]
    pub network_name: String,
    /// Fixed MAC address (must be in VMware's static range 00:50:56:00-3f:...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^([0-9a-fA-F]{2}:){5}[0-9a-fA-F]{2}$')")
        .message("macAddress must look like 00:50:56:12:34:56"))]
    #[x_kube(validation = Rule::new(crate::api::common::MAC_UNICAST).message(crate::api::common::MAC_UNICAST_MSG))]
    #[schemars(length(max = 17))]
    pub mac_address: Option<String>,
    /// MTU, set in the guest: a vSphere virtual NIC has none of its own (the port
    /// group's switch has), so it travels in the cloud-init network config banlieue
    /// writes to `guestinfo.metadata`, read by the guest at its first boot. The port
    /// group and the guest's driver must carry it (vmxnet3 takes at most 9000).
    /// Refused before the clone when the bootstrap data brings its own network config
    /// (passed to the guest as given: set the MTU there) or is Ignition (which reads no
    /// cloud-init network config). Default: the guest's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 576, max = 9216))]
    pub mtu: Option<u32>,
    /// Address assignment.
    #[serde(default)]
    pub ipam: Ipam,
}

infra_kinds! {
    machine_spec: VSphereMachineSpec,
    machine_template: VSphereMachineTemplateSpec / VSphereMachineTemplateResource,
        "VSphereMachineTemplate", "vspheremachinetemplates", "bvsmt",
        "A VSphereMachineTemplate is the Cluster API InfraMachineTemplate for vSphere: MachineDeployments, MachineSets and control planes stamp VSphereMachines out of spec.template. Its status publishes capacity and node info so the cluster autoscaler can scale from zero.",
    cluster: VSphereClusterSpec, "VSphereCluster", "vsphereclusters", "bvsc",
        "A VSphereCluster is the Cluster API InfraCluster for vSphere. Unlike a CAPV cluster it can span several vCenters: it aggregates the failure domains of every referenced vsphere Provider and carries the control plane endpoint.",
    cluster_template: VSphereClusterTemplateSpec / VSphereClusterTemplateResource,
        "VSphereClusterTemplate", "vsphereclustertemplates", "bvsct",
        "A VSphereClusterTemplate is the Cluster API InfraClusterTemplate for vSphere, used by ClusterClass to stamp out VSphereClusters.",
}
