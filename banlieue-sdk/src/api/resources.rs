//! What a machine has (CPUs, memory, disks, network devices) and how each of those
//! changes on a machine that already runs: the **change table** a backend declares
//! ([`ChangeRule`]), the sizes a machine runs with and is asked for
//! ([`MachineResources`]), and the changes that wait ([`PendingChange`]).
//!
//! A backend publishes its table in its Provider's `status.backendCapabilities.changes`;
//! an infra machine (and the VirtualMachine it realises) shows in
//! `status.resources` what it runs with, what it is asked for, and each change that
//! waits with what it waits for.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::Firmware;

/// A property of a machine that may be asked to change after the machine is made.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
pub enum MachineField {
    /// The number of virtual CPUs.
    #[serde(rename = "cpus")]
    Cpus,
    /// Cores per virtual socket (the CPU topology).
    #[serde(rename = "coresPerSocket")]
    CoresPerSocket,
    /// Memory.
    #[serde(rename = "memoryMiB")]
    MemoryMib,
    /// The OS disk's size (it only grows: the size asked is a floor).
    #[serde(rename = "osDiskSize")]
    OsDiskSize,
    /// The size of an additional disk that exists (it only grows).
    #[serde(rename = "dataDiskSize")]
    DataDiskSize,
    /// Additional disks added or removed.
    #[serde(rename = "dataDisks")]
    DataDisks,
    /// Network devices added or removed (at the end of the list).
    #[serde(rename = "networks")]
    Networks,
    /// Boot firmware.
    #[serde(rename = "firmware")]
    Firmware,
}

impl MachineField {
    /// Every field, in the order tables and messages list them.
    pub const ALL: [MachineField; 8] = [
        Self::Cpus,
        Self::CoresPerSocket,
        Self::MemoryMib,
        Self::OsDiskSize,
        Self::DataDiskSize,
        Self::DataDisks,
        Self::Networks,
        Self::Firmware,
    ];

    /// Its wire name (`cpus`, `memoryMiB`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cpus => "cpus",
            Self::CoresPerSocket => "coresPerSocket",
            Self::MemoryMib => "memoryMiB",
            Self::OsDiskSize => "osDiskSize",
            Self::DataDiskSize => "dataDiskSize",
            Self::DataDisks => "dataDisks",
            Self::Networks => "networks",
            Self::Firmware => "firmware",
        }
    }
}

/// How a change of a field reaches a machine that is powered on.
///
/// A machine that is powered off takes every change that is not [`ChangeMode::Never`]
/// at once (its next boot uses it).
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
pub enum ChangeMode {
    /// Applied to the running guest, no restart (hot-add, live resize). Where the
    /// machine reports a hot-add ceiling (`maxCPUs`, `maxMemoryMiB`), a change beyond
    /// it is its rule's [`ChangeRule::beyond_max`] instead ([`ChangeMode::NextBoot`]
    /// unless the rule says otherwise).
    Live,
    /// Written to the machine's configuration now, taken when the guest next powers
    /// on (a reboot from inside the guest is not enough on every backend: a power
    /// cycle is).
    NextBoot,
    /// Applied only while the machine is powered off: it waits for the next power-off.
    PowerOff,
    /// Fixed when the machine is made: changing it needs a new machine.
    Never,
}

impl ChangeMode {
    /// Its wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Live => "Live",
            Self::NextBoot => "NextBoot",
            Self::PowerOff => "PowerOff",
            Self::Never => "Never",
        }
    }
}

/// One row of a backend's change table: how a change of `field` reaches a machine
/// that runs. A field a backend does not list is [`ChangeMode::Never`] on it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChangeRule {
    /// The field.
    pub field: MachineField,
    /// How a larger value, or an added item, is applied.
    pub grow: ChangeMode,
    /// How a smaller value, or a removed item, is applied (disks never shrink:
    /// admission refuses it).
    pub shrink: ChangeMode,
    /// How a growth beyond the machine's hot-add ceiling is applied, when `grow` is
    /// `Live` and the machine reports one (`maxCPUs` for `cpus`, `maxMemoryMiB` for
    /// `memoryMiB`, in `status.resources.running`). Absent: `NextBoot` (the
    /// hypervisor keeps a configuration for the next boot, as libvirt and Cloud
    /// Hypervisor do); `PowerOff` where it has none (vSphere: a VM without hot-add
    /// takes more CPUs or memory only while powered off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beyond_max: Option<ChangeMode>,
}

impl ChangeRule {
    /// A rule with the same mode both ways.
    pub fn both(field: MachineField, mode: ChangeMode) -> Self {
        Self::grow_shrink(field, mode, mode)
    }

    /// A rule with one mode for growing and one for shrinking.
    pub fn grow_shrink(field: MachineField, grow: ChangeMode, shrink: ChangeMode) -> Self {
        Self {
            field,
            grow,
            shrink,
            beyond_max: None,
        }
    }

    /// The same rule, with `mode` for a growth beyond the machine's hot-add ceiling
    /// (see [`ChangeRule::beyond_max`]).
    pub fn with_beyond_max(self, mode: ChangeMode) -> Self {
        Self {
            beyond_max: Some(mode),
            ..self
        }
    }
}

/// What banlieue does with a change that waits for a power cycle (`NextBoot` or
/// `PowerOff` on the backend).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub enum ChangePolicy {
    /// The machine keeps running as it is and says what waits (`RestartRequired=True`)
    /// until its owner power-cycles it (`powerState: PoweredOff`, then `PoweredOn`).
    #[default]
    Wait,
    /// banlieue powers the machine off (the backend's graceful shutdown where it has
    /// one), applies every change that waited while it is off, and powers it on again.
    Restart,
}

impl ChangePolicy {
    /// Whether it is the default, [`ChangePolicy::Wait`] (then it is not serialized).
    pub fn is_wait(&self) -> bool {
        *self == Self::Wait
    }
}

/// One additional disk's size, by name.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiskSize {
    /// The disk's name (as in the spec's additional disks).
    pub name: String,
    /// Size in GiB.
    #[serde(rename = "sizeGiB")]
    pub size_gib: u32,
}

/// The sizes of a machine: what it runs with, as the backend reads it back, or what
/// its spec asks.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineResources {
    /// Virtual CPUs.
    pub cpus: u32,
    /// Cores per socket, where the backend has a topology.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cores_per_socket: Option<u32>,
    /// Memory in MiB.
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    /// The OS disk's size in GiB, where known (asked: a floor).
    #[serde(rename = "osDiskGiB", default, skip_serializing_if = "Option::is_none")]
    pub os_disk_gib: Option<u32>,
    /// Additional disks, by name, sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub data_disks: Vec<DiskSize>,
    /// The number of network devices.
    #[serde(default)]
    pub networks: u32,
    /// Boot firmware, where known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub firmware: Option<Firmware>,
    /// The most vCPUs this machine can have live (its hot-add ceiling), when it has one.
    #[serde(rename = "maxCPUs", default, skip_serializing_if = "Option::is_none")]
    pub max_cpus: Option<u32>,
    /// The most memory this machine can have live, when it has such a ceiling.
    #[serde(
        rename = "maxMemoryMiB",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub max_memory_mib: Option<u64>,
}

/// A difference between what a machine runs with and what it is asked for, which the
/// machine does not have yet.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PendingChange {
    /// The field.
    pub field: MachineField,
    /// What runs, for humans (`2`, `2048`, `data: 10`).
    pub running: String,
    /// What is asked, for humans.
    pub desired: String,
    /// What it waits for: `NextBoot` (a power cycle), `PowerOff`, or `Never` (it cannot
    /// be applied to this machine: a new machine is needed).
    pub waits_for: ChangeMode,
}

/// `status.resources` of an infra machine and a VirtualMachine.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourcesStatus {
    /// What the machine runs with, as the backend last read it back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<MachineResources>,
    /// What its spec asks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired: Option<MachineResources>,
    /// The changes not applied yet, each with what it waits for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending: Vec<PendingChange>,
}
