//! Proxmox VE: `ProxmoxMachine`, `ProxmoxMachineTemplate`, `ProxmoxCluster`,
//! `ProxmoxClusterTemplate`.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::kinds::{infra_kinds, infra_machine};
use super::machine::MachineDisk;
use crate::api::common::{Firmware, Ipam};

infra_machine! {
    kind: "ProxmoxMachine", short: "bpxm",
    doc: "A ProxmoxMachine is one QEMU virtual machine on a Proxmox VE cluster, cloned from a template. It is the Cluster API InfraMachine for Proxmox VE and the backend object banlieue creates for VirtualMachines scheduled onto a proxmox Provider.",
    provider_ref_doc: "The proxmox Provider (same namespace). For CAPI machines it may be left empty: banlieue then finds it from the failure domain CAPI assigned.",
    provider_id_scheme: "proxmox://",
    provider_id_doc: "`proxmox://<SMBIOS UUID>`, set by banlieue once the VM exists and offered to the guest as cloud-init instance metadata.",
    bootstrap_doc: "Bootstrap data when no CAPI Machine owns this object; delivered as a NoCloud seed.",
    /// Desired state of a ProxmoxMachine.
    #[x_kube(validation = Rule::new("!has(self.vmIDRange) || self.vmIDRange.end >= self.vmIDRange.start")
        .message("vmIDRange.end must not be below vmIDRange.start"))]
    pub struct ProxmoxMachineSpec {
        /// VMID of the template to clone.
        #[serde(rename = "templateID")]
        #[schemars(range(min = 100, max = 999999999))]
        pub template_id: u32,
        /// The node holding the template. Default: found by the template's VMID.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(length(min = 1, max = 63))]
        pub source_node: Option<String>,
        /// The node to run on. Default: from the failure domain.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(length(min = 1, max = 63))]
        pub target_node: Option<String>,
        /// Storage for the cloned disks (full clones only). Default: the template's.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(length(min = 1, max = 255))]
        pub storage: Option<String>,
        /// Full clone (default true); false makes a linked clone.
        #[serde(default = "full_clone")]
        pub full_clone: bool,
        /// Resource pool to add the VM to.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(length(min = 1, max = 255))]
        pub pool: Option<String>,
        /// VMIDs banlieue may allocate from. Default: the cluster's next free ID.
        #[serde(default, rename = "vmIDRange", skip_serializing_if = "Option::is_none")]
        pub vm_id_range: Option<VmIdRange>,
        /// Number of sockets.
        #[serde(default = "one")]
        #[schemars(range(min = 1, max = 4))]
        pub sockets: u32,
        /// Cores per socket.
        #[schemars(range(min = 1, max = 512))]
        pub cores: u32,
        /// Memory in MiB.
        #[serde(rename = "memoryMiB")]
        #[schemars(range(min = 128, max = 25165824))]
        pub memory_mib: u64,
        /// Boot disk (`scsi0`) size in GiB; grown from the template's if larger.
        #[serde(rename = "diskGiB", default, skip_serializing_if = "Option::is_none")]
        #[schemars(range(min = 1, max = 65536))]
        #[x_kube(validation = Rule::new(crate::api::common::DISK_GROWS).message(crate::api::common::OS_DISK_GROWS_MSG))]
        pub disk_gib: Option<u32>,
        /// Firmware; default: the template's.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub firmware: Option<Firmware>,
        /// Additional disks (`scsi1`, `scsi2`, ...), allocated by PVE on their storage
        /// (else `storage`, else the boot disk's). PVE has no per-disk provisioning: a
        /// storage gives one to every disk made there (`lvmthin`, `rbd`, sparse
        /// `zfspool`: thin; `lvm`, other `zfspool`: thick; `dir`, `nfs`, `cifs`,
        /// `btrfs`: by their `preallocation`, `off`/`metadata` thin, `falloc` thick,
        /// `full` eagerZeroed). A disk whose `provisioning` its storage does not give,
        /// or on a storage of another type, is refused before anything is made
        /// (`DiskProvisioningUnsupported`, naming the disk, the storage and its type).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
        #[schemars(length(max = 30))]
        pub additional_disks: Vec<MachineDisk>,
        /// Network devices (`net0`, `net1`, ...), in order.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        #[x_kube(merge_strategy = ListMerge::Atomic)]
        #[x_kube(validation = Rule::new(crate::api::common::MACS_UNIQUE).message(crate::api::common::MACS_UNIQUE_MSG))]
        #[schemars(length(max = 10))]
        pub network: Vec<ProxmoxNetworkDevice>,
    }
}

fn full_clone() -> bool {
    true
}

fn one() -> u32 {
    1
}

/// An inclusive range of Proxmox VMIDs.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct VmIdRange {
    /// First VMID.
    #[schemars(range(min = 100, max = 999999999))]
    pub start: u32,
    /// Last VMID.
    #[schemars(range(min = 100, max = 999999999))]
    pub end: u32,
}

/// One Proxmox network device.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxmoxNetworkDevice {
    /// Bridge, e.g. `vmbr0`.
    #[x_kube(validation = Rule::new("self.matches('^[a-zA-Z][a-zA-Z0-9_.-]*$')")
        .message("bridge must be an interface name such as vmbr0"))]
    #[schemars(length(min = 1, max = 15))]
    pub bridge: String,
    /// VLAN tag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 4094))]
    pub vlan: Option<u32>,
    /// NIC model: `virtio` (default), `e1000`, `vmxnet3`, `rtl8139`.
    #[serde(default)]
    pub model: ProxmoxNicModel,
    /// MTU; the bridge's when empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 576, max = 65520))]
    pub mtu: Option<u32>,
    /// Fixed MAC address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^([0-9a-fA-F]{2}:){5}[0-9a-fA-F]{2}$')")
        .message("macAddress must look like BC:24:11:12:34:56"))]
    #[x_kube(validation = Rule::new(crate::api::common::MAC_UNICAST).message(crate::api::common::MAC_UNICAST_MSG))]
    #[schemars(length(max = 17))]
    pub mac_address: Option<String>,
    /// Address assignment, written into the cloud-init network config.
    #[serde(default)]
    pub ipam: Ipam,
}

/// Proxmox NIC model.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ProxmoxNicModel {
    /// paravirtualised (default).
    #[default]
    Virtio,
    /// Intel e1000.
    E1000,
    /// VMware vmxnet3.
    Vmxnet3,
    /// Realtek 8139.
    Rtl8139,
}

infra_kinds! {
    machine_spec: ProxmoxMachineSpec,
    machine_template: ProxmoxMachineTemplateSpec / ProxmoxMachineTemplateResource,
        "ProxmoxMachineTemplate", "proxmoxmachinetemplates", "bpxmt",
        "A ProxmoxMachineTemplate is the Cluster API InfraMachineTemplate for Proxmox VE: MachineDeployments, MachineSets and control planes stamp ProxmoxMachines out of spec.template. Its status publishes capacity and node info so the cluster autoscaler can scale from zero.",
    cluster: ProxmoxClusterSpec, "ProxmoxCluster", "proxmoxclusters", "bpxc",
        "A ProxmoxCluster is the Cluster API InfraCluster for Proxmox VE: it publishes the nodes of one or several Proxmox clusters as failure domains and carries the control plane endpoint.",
    cluster_template: ProxmoxClusterTemplateSpec / ProxmoxClusterTemplateResource,
        "ProxmoxClusterTemplate", "proxmoxclustertemplates", "bpxct",
        "A ProxmoxClusterTemplate is the Cluster API InfraClusterTemplate for Proxmox VE, used by ClusterClass to stamp out ProxmoxClusters.",
}
