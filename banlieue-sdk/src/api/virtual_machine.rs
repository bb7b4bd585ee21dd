//! `VirtualMachine`: the one object a user writes, whatever the backend.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{
    BootstrapFormat, Condition, DISK_NAME_MSG, DNS_LABEL, DiskProvisioning, Ipam, LABEL_KEY,
    LabelSelector, LocalObjectReference, MAC_UNICAST, MAC_UNICAST_MSG, MACS_UNIQUE,
    MACS_UNIQUE_MSG, PowerState, ProviderClass, TypedLocalObjectReference,
};
use super::infra::MachineAddress;

/// Desired state of a VirtualMachine.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[kube(
    group = "banlieue.io",
    version = "v1alpha1",
    kind = "VirtualMachine",
    namespaced,
    status = "VirtualMachineStatus",
    derive = "PartialEq",
    doc = "A VirtualMachine is a backend-agnostic virtual machine. banlieue schedules it onto a Provider, creates the backend's infrastructure object (VSphereMachine, ProxmoxMachine, LibvirtMachine or CloudHypervisorMachine), realises it on the hypervisor and mirrors its status here. Changing the placement moves it to another backend while this object stays.",
    shortname = "bvm",
    category = "banlieue",
    printcolumn(name = "Class", type_ = "string", json_path = ".spec.classRef.name"),
    printcolumn(name = "Image", type_ = "string", json_path = ".spec.imageRef.name"),
    printcolumn(
        name = "Provider",
        type_ = "string",
        json_path = ".status.placement.provider"
    ),
    printcolumn(
        name = "FailureDomain",
        type_ = "string",
        json_path = ".status.placement.failureDomain",
        priority = 1
    ),
    printcolumn(name = "Power", type_ = "string", json_path = ".status.powerState"),
    printcolumn(
        name = "IP",
        type_ = "string",
        json_path = ".status.addresses[?(@.type=='InternalIP')].address",
        priority = 1
    ),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
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
pub struct VirtualMachineSpec {
    /// The VMClass (hardware shape).
    pub class_ref: LocalObjectReference,
    /// The VMImage to boot.
    pub image_ref: LocalObjectReference,
    /// Where the machine may run. Empty: any ready Provider that has the image.
    #[serde(default)]
    pub placement: Placement,
    /// `PoweredOn` (default), `PoweredOff`, or `Suspended` where the backend supports it.
    #[serde(default)]
    pub power_state: PowerState,
    /// What banlieue does with a change of the VM (a new class, a grown disk, another
    /// network) that its backend applies only at the next boot or while powered off:
    /// `Wait` (default: the VM runs on as it is and says so, `RestartRequired=True`,
    /// until its owner power-cycles it) or `Restart` (banlieue powers it off, applies the
    /// change and powers it on again). Changes the backend applies live never restart it.
    #[serde(
        default,
        skip_serializing_if = "super::resources::ChangePolicy::is_wait"
    )]
    pub change_policy: super::resources::ChangePolicy,
    /// Bootstrap data for the guest (cloud-init or Ignition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap: Option<Bootstrap>,
    /// Network interfaces, in order. Empty: one DHCP interface on the default network class.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    #[x_kube(validation = Rule::new(MACS_UNIQUE).message(MACS_UNIQUE_MSG))]
    #[schemars(length(max = 10))]
    pub networks: Vec<NetworkInterface>,
    /// Blank data disks besides the OS disk, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    #[schemars(length(max = 16))]
    pub disks: Vec<DataDisk>,
    /// What happens when the placement requires another Provider.
    #[serde(default)]
    pub migration: MigrationPolicy,
}

/// Placement of a VirtualMachine: an explicit Provider, or selectors.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!(has(self.providerRef) && has(self.providerSelector))")
    .message("placement: set either providerRef or providerSelector, not both"))]
pub struct Placement {
    /// An explicit Provider in the VirtualMachine's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_ref: Option<LocalObjectReference>,
    /// Selects Providers by their labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<super::common::LabelSelectorSchema>")]
    pub provider_selector: Option<LabelSelector>,
    /// Selects failure domains by their labels (from the Provider's status).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<super::common::LabelSelectorSchema>")]
    pub failure_domain_selector: Option<LabelSelector>,
    /// Keep away from other VirtualMachines that match a selector.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Atomic)]
    #[schemars(length(max = 8))]
    pub anti_affinity: Vec<AntiAffinityTerm>,
}

/// Spread over a topology: no two matching machines share a value of `topologyKey`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct AntiAffinityTerm {
    /// Selects the other VirtualMachines (same namespace) to keep away from.
    #[schemars(with = "super::common::LabelSelectorSchema")]
    pub label_selector: LabelSelector,
    /// A failure-domain label key, e.g. `topology.kubernetes.io/zone`, or
    /// `banlieue.io/provider` and `banlieue.io/failure-domain`.
    #[x_kube(validation = Rule::new(LABEL_KEY).message("topologyKey must be a label key: an optional DNS subdomain prefix and '/', then a name of at most 63 letters, digits, '-', '_' and '.' starting and ending with a letter or digit, e.g. topology.kubernetes.io/zone or banlieue.io/failure-domain"))]
    #[schemars(length(min = 1, max = 317))]
    pub topology_key: String,
    /// `Required` (default) refuses to schedule; `Preferred` only scores.
    #[serde(default)]
    pub mode: AffinityMode,
}

/// Hard or soft scheduling rule.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum AffinityMode {
    /// Must hold.
    #[default]
    Required,
    /// Best effort.
    Preferred,
}

/// Bootstrap data from Secrets in the VirtualMachine's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.userData) || has(self.networkConfig)")
    .message("bootstrap: set userData, networkConfig or both"))]
#[x_kube(validation = Rule::new("self.format != 'ignition' || !has(self.networkConfig)")
    .message("bootstrap.networkConfig is cloud-init only; Ignition carries its own network configuration"))]
pub struct Bootstrap {
    /// `cloud-config` (default) or `ignition`.
    #[serde(default)]
    pub format: BootstrapFormat,
    /// User data (default key `value`, as in CAPI bootstrap Secrets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data: Option<super::common::KeySelector>,
    /// cloud-init network config v2 (default key `network-config`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_config: Option<super::common::KeySelector>,
}

/// One network interface. An interface that exists keeps its settings: backends add
/// and remove interfaces (their change tables say when), but none re-plugs one onto
/// another network, re-addresses it or changes its MAC or MTU in place, so such an
/// edit is refused instead of being silently ignored.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self == oldSelf")
    .message("an existing network interface keeps its networkClass, ipam, macAddress and mtu (no backend changes them in place): to change them, remove the interface and add one with a new name"))]
pub struct NetworkInterface {
    /// Interface name, unique in the list, e.g. `eth0`.
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')")
        .message("networks[].name must be a DNS label"))]
    #[schemars(length(min = 1, max = 15))]
    pub name: String,
    /// A network class the Provider maps to a port group, bridge or network.
    #[x_kube(validation = Rule::new(DNS_LABEL)
        .message("networkClass must name a Provider network class: a DNS label (lowercase letters, digits and '-'), e.g. frontend"))]
    #[schemars(length(min = 1, max = 63))]
    pub network_class: String,
    /// How addresses are assigned (default DHCP).
    #[serde(default)]
    pub ipam: Ipam,
    /// A fixed MAC address; generated when empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^([0-9a-fA-F]{2}:){5}[0-9a-fA-F]{2}$')")
        .message("macAddress must look like 52:54:00:12:34:56"))]
    #[x_kube(validation = Rule::new(MAC_UNICAST).message(MAC_UNICAST_MSG))]
    #[schemars(length(max = 17))]
    pub mac_address: Option<String>,
    /// MTU; the network's default when empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 576, max = 9216))]
    pub mtu: Option<u32>,
}

/// A blank data disk. It only grows, and keeps its provisioning and storage class.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(super::common::VM_DISK_STAYS).message(super::common::VM_DISK_STAYS_MSG))]
pub struct DataDisk {
    /// Disk name, unique in the list: a DNS label, e.g. `data-1`.
    #[x_kube(validation = Rule::new(DNS_LABEL).message(DISK_NAME_MSG))]
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// Size in GiB.
    #[serde(rename = "sizeGiB")]
    #[schemars(range(min = 1, max = 65536))]
    #[x_kube(validation = Rule::new(super::common::DISK_GROWS).message(super::common::DISK_GROWS_MSG))]
    pub size_gib: u32,
    /// The Provider storage class to place it on. Default: the OS disk's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(DNS_LABEL)
        .message("storageClass must name a Provider storage class: a DNS label (lowercase letters, digits and '-'), e.g. fast"))]
    #[schemars(length(min = 1, max = 63))]
    pub storage_class: Option<String>,
    /// `thin` (default), `thick` or `eagerZeroed`.
    #[serde(default)]
    pub provisioning: DiskProvisioning,
}

/// How a VirtualMachine moves when its placement requires another Provider.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.stopSourceFirst")
    .message("migration.stopSourceFirst: false is not supported yet: the old machine is always stopped and removed before the new one starts"))]
pub struct MigrationPolicy {
    /// `Recreate` (default): the old machine is removed, then a new one is made from the
    /// image (the disk does not move). `CopyDisk`: keep the disks: the old machine is
    /// stopped, its disks exported, converted with `qemu-img` and imported on the
    /// target, the new machine made on them (keeping the cloud-init instance-id) and
    /// started, and the old one deleted once the new one is Ready. libvirt, Cloud
    /// Hypervisor and vSphere move disks; a move from or to a backend that cannot
    /// (Proxmox), or between two Providers of the same kind, is refused before
    /// anything is touched (`Migrating=False`, reason `CopyDiskUnsupported`) and the VM
    /// stays where it is; it never falls back to `Recreate`.
    #[serde(default)]
    pub strategy: MigrationStrategy,
    /// Stop the old machine before the new one starts, so two copies never run at
    /// once. Must be `true` (the default): starting the new one first is not supported.
    #[serde(default = "yes")]
    pub stop_source_first: bool,
}

fn yes() -> bool {
    true
}

impl Default for MigrationPolicy {
    fn default() -> Self {
        Self {
            strategy: MigrationStrategy::default(),
            stop_source_first: true,
        }
    }
}

/// Migration strategy.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum MigrationStrategy {
    /// Create the machine anew from the image on the target.
    #[default]
    Recreate,
    /// Keep the disks (stop, export, `qemu-img convert`, import, start, delete the
    /// source); refused before anything is touched where a backend cannot.
    CopyDisk,
}

/// Observed state of a VirtualMachine.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineStatus {
    /// Lifecycle summary for humans; conditions carry the detail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<VirtualMachinePhase>,
    /// Where the machine is scheduled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<ScheduledPlacement>,
    /// The infrastructure object realising this machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_ref: Option<TypedLocalObjectReference>,
    /// The power state observed on the backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_state: Option<PowerState>,
    /// Addresses reported by the backend.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Atomic)]
    pub addresses: Vec<MachineAddress>,
    /// The backend-unique machine ID, e.g. `vsphere://4203...`.
    #[serde(
        default,
        rename = "providerID",
        skip_serializing_if = "Option::is_none"
    )]
    pub provider_id: Option<String>,
    /// Its infra machine's `status.resources`: what the VM runs with, what its class
    /// asks, and each change still waiting with what it waits for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<super::resources::ResourcesStatus>,
    /// The VMClass its machine was built from, and that class's generation then. With
    /// the class's `updatePolicy: Keep` (the default), an edit of the class leaves it
    /// at the generation the machine was built from, and `ClassUpToDate=False` names
    /// what changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<BuiltFromClass>,
    /// `Scheduled`, `InfrastructureReady`, `PowerState`, `Migrating`, `UpToDate`,
    /// `RestartRequired`, `ClassUpToDate` and `Ready`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// The generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The VMClass a VirtualMachine's machine was built from (`status.class`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BuiltFromClass {
    /// The VMClass's name.
    pub name: String,
    /// Its `metadata.generation` when the machine was built from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
}

/// Where a VirtualMachine is scheduled.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScheduledPlacement {
    /// Provider name (same namespace).
    pub provider: String,
    /// The Provider's class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_class: Option<ProviderClass>,
    /// The failure domain inside the Provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_domain: Option<String>,
    /// The failure domain's labels at scheduling time (for anti-affinity).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub topology: BTreeMap<String, String>,
    /// When the placement was decided; unchanged while it holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduled_at: Option<Time>,
    /// What the placement was decided from: the VM's own `spec.placement`,
    /// `spec.classRef` and `spec.imageRef` at that time. A placed VM is **bound** to its
    /// Provider: only a change to these fields of its own spec can move it (a changed
    /// `providerRef`/`providerSelector` the Provider no longer matches, a changed
    /// `failureDomainSelector` its failure domain no longer matches, a class or image
    /// the Provider cannot serve). An edit to any other object (a Provider's labels or
    /// settings, a failure domain's labels) that makes the placement no longer match
    /// moves nothing; the VM reports it with `PlacementDrifted=True`. Absent on a VM
    /// placed by an older operator: it is bound as if its spec had not changed, and the
    /// basis is recorded at its next reconcile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basis: Option<PlacementBasis>,
}

/// The parts of a VirtualMachine's own spec a placement was decided from (see
/// [`ScheduledPlacement::basis`]).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlacementBasis {
    /// `spec.placement` when the placement was decided.
    #[serde(default)]
    pub placement: Placement,
    /// `spec.classRef.name` when the placement was decided.
    pub class_ref: String,
    /// `spec.imageRef.name` when the placement was decided.
    pub image_ref: String,
}

impl PlacementBasis {
    /// The basis `vm`'s spec gives now.
    pub fn of(vm: &VirtualMachineSpec) -> Self {
        Self {
            placement: vm.placement.clone(),
            class_ref: vm.class_ref.name.clone(),
            image_ref: vm.image_ref.name.clone(),
        }
    }
}

/// Lifecycle phase of a VirtualMachine.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum VirtualMachinePhase {
    /// Waiting to be scheduled.
    Pending,
    /// Scheduled; the backend machine is being created.
    Provisioning,
    /// Powered on.
    Running,
    /// Powered off or suspended.
    Stopped,
    /// Moving to another Provider.
    Migrating,
    /// Being deleted.
    Deleting,
    /// A terminal error; see conditions.
    Failed,
}
