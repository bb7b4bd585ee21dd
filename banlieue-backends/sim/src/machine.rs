//! One simulated machine: its identity, operations in flight, and how it is observed.

use std::collections::VecDeque;
use std::net::Ipv4Addr;
use std::time::Duration;

use banlieue_sdk::api::common::{BootstrapFormat, PowerState};
use banlieue_sdk::api::infra::{MachineAddress, MachineAddressType};
use banlieue_sdk::backend::{
    BootstrapData, MachineIdentity, MachineObservation, MachineResources, Pending,
};
use tokio::time::Instant;

/// The shortest `retry_after` a pending observation asks for.
pub const MIN_RETRY_AFTER: Duration = Duration::from_millis(50);

/// The infrastructure kind a simulated machine was created for; it decides the
/// scheme of the provider ID, since each infra CRD requires its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    VSphere,
    Proxmox,
    Libvirt,
    CloudHypervisor,
}

impl Kind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::VSphere => "VSphereMachine",
            Self::Proxmox => "ProxmoxMachine",
            Self::Libvirt => "LibvirtMachine",
            Self::CloudHypervisor => "CloudHypervisorMachine",
        }
    }

    pub(crate) fn scheme(self) -> &'static str {
        match self {
            Self::VSphere => "vsphere",
            Self::Proxmox => "proxmox",
            Self::Libvirt => "libvirt",
            Self::CloudHypervisor => "cloud-hypervisor",
        }
    }

    /// A handle shaped like the real backend's (moref, `node/vmid`, domain name, socket).
    pub(crate) fn backend_ref(
        self,
        serial: u64,
        domain: &str,
        identity: &MachineIdentity,
        uuid: &str,
    ) -> String {
        match self {
            Self::VSphere => format!("vm-{}", 1000 + serial),
            Self::Proxmox => format!("{domain}/{}", 100 + serial),
            Self::Libvirt => format!("{}_{}", identity.namespace, identity.name),
            Self::CloudHypervisor => format!("/run/banlieue/sim/{uuid}.sock"),
        }
    }
}

/// What an operation does when it completes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// The machine comes into existence, powered off.
    Create,
    /// The machine reaches this power state.
    Power(PowerState),
}

/// An operation in flight or queued behind the one in flight.
#[derive(Clone, Debug)]
pub(crate) struct Op {
    pub(crate) step: Step,
    pub(crate) name: &'static str,
    pub(crate) task: String,
    pub(crate) done_at: Instant,
}

/// The name a power transition is reported under.
pub(crate) fn transition_name(from: PowerState, to: PowerState) -> &'static str {
    match (from, to) {
        (PowerState::Suspended, PowerState::PoweredOn) => "Resuming",
        (_, PowerState::PoweredOn) => "PoweringOn",
        (_, PowerState::PoweredOff) => "PoweringOff",
        (_, PowerState::Suspended) => "Suspending",
    }
}

/// One simulated machine.
#[derive(Debug)]
pub(crate) struct Machine {
    pub(crate) identity: MachineIdentity,
    pub(crate) serial: u64,
    pub(crate) kind: Kind,
    pub(crate) provider_id: String,
    pub(crate) backend_ref: String,
    pub(crate) failure_domain: String,
    pub(crate) address: Ipv4Addr,
    pub(crate) static_addresses: Vec<String>,
    /// What the machine runs with.
    pub(crate) resources: MachineResources,
    /// A `NextBoot` change written and not yet taken: the next power-on takes it.
    pub(crate) next_boot: Option<MachineResources>,
    /// True once the `Create` step completed.
    pub(crate) created: bool,
    /// The power state now (meaningful once created).
    pub(crate) power: PowerState,
    /// The operation in flight first, then those queued behind it.
    pub(crate) ops: VecDeque<Op>,
    /// Task and completion time of a deletion in progress.
    pub(crate) deleting: Option<(String, Instant)>,
    pub(crate) bootstrap: Option<BootstrapData>,
}

impl Machine {
    /// Applies every operation that completed by `now`.
    pub(crate) fn advance(&mut self, now: Instant) {
        while self.ops.front().is_some_and(|op| op.done_at <= now) {
            let op = self.ops.pop_front().expect("checked above");
            match op.step {
                Step::Create => {
                    self.created = true;
                    self.power = PowerState::PoweredOff;
                }
                Step::Power(p) => {
                    if p == PowerState::PoweredOn
                        && self.power == PowerState::PoweredOff
                        && let Some(next) = self.next_boot.take()
                    {
                        self.resources = next;
                    }
                    self.power = p;
                }
            }
        }
    }

    /// The power state the machine reaches once `ops` are done.
    pub(crate) fn final_power(&self) -> PowerState {
        match self.ops.back() {
            Some(Op {
                step: Step::Power(p),
                ..
            }) => *p,
            Some(Op {
                step: Step::Create, ..
            }) => PowerState::PoweredOff,
            None => self.power,
        }
    }

    pub(crate) fn observation(&self, now: Instant) -> MachineObservation {
        let pending = match (&self.deleting, self.ops.front()) {
            (Some((task, done_at)), _) => Some(pending("Deleting", task, *done_at, now)),
            (None, Some(op)) => Some(pending(op.name, &op.task, op.done_at, now)),
            (None, None) => None,
        };
        let on = self.created && self.power == PowerState::PoweredOn;
        MachineObservation {
            next_boot: self.next_boot.clone(),
            resources: self.created.then(|| self.resources.clone()),
            provider_id: self.created.then(|| self.provider_id.clone()),
            power_state: self.created.then_some(self.power),
            addresses: if on {
                let internal = if self.static_addresses.is_empty() {
                    vec![self.address.to_string()]
                } else {
                    self.static_addresses.clone()
                };
                internal
                    .into_iter()
                    .map(|address| MachineAddress {
                        type_: MachineAddressType::InternalIp,
                        address,
                    })
                    .chain([MachineAddress {
                        type_: MachineAddressType::Hostname,
                        address: self.identity.name.clone(),
                    }])
                    .collect()
            } else {
                Vec::new()
            },
            failure_domain: Some(self.failure_domain.clone()),
            backend_ref: self.created.then(|| self.backend_ref.clone()),
            pending,
        }
    }

    pub(crate) fn info(&self) -> SimMachineInfo {
        SimMachineInfo {
            identity: self.identity.clone(),
            kind: self.kind.name(),
            provider_id: self.provider_id.clone(),
            backend_ref: self.backend_ref.clone(),
            created: self.created,
            power_state: self.created.then_some(self.power),
            pending: match (&self.deleting, self.ops.front()) {
                (Some(_), _) => Some("Deleting"),
                (None, Some(op)) => Some(op.name),
                (None, None) => None,
            },
            deleting: self.deleting.is_some(),
            failure_domain: self.failure_domain.clone(),
            address: self.address,
            cpus: self.resources.cpus,
            memory_mib: self.resources.memory_mib,
            resources: self.resources.clone(),
            next_boot: self.next_boot.clone(),
            bootstrap_format: self.bootstrap.as_ref().map(|b| b.format),
            bootstrap_network_config: self
                .bootstrap
                .as_ref()
                .is_some_and(|b| b.network_config.is_some()),
        }
    }
}

fn pending(operation: &str, task: &str, done_at: Instant, now: Instant) -> Pending {
    Pending {
        operation: operation.to_string(),
        task: Some(task.to_string()),
        retry_after: done_at.saturating_duration_since(now).max(MIN_RETRY_AFTER),
    }
}

/// A simulated machine as tests and benchmarks see it (see
/// [`crate::SimFactory::machines`]). Bootstrap data itself is never part of it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SimMachineInfo {
    /// The identity the machine was created for (`uid` is the key).
    pub identity: MachineIdentity,
    /// The infrastructure kind it was created for, e.g. `VSphereMachine`.
    pub kind: &'static str,
    /// Its provider ID, e.g. `vsphere://<uuid>`: assigned when creation starts, reported
    /// by observations once `created`.
    pub provider_id: String,
    /// Its backend handle (shaped like the real backend's: `vm-1042`, `sim-a/142`, ...).
    pub backend_ref: String,
    /// True once creation completed.
    pub created: bool,
    /// Power state, once created.
    pub power_state: Option<PowerState>,
    /// The operation in flight, e.g. `Creating`, `PoweringOn`, `Deleting`.
    pub pending: Option<&'static str>,
    /// True while a deletion is in progress.
    pub deleting: bool,
    /// The failure domain it was placed in.
    pub failure_domain: String,
    /// Its `InternalIP`, held for its whole life (reported only while powered on).
    pub address: Ipv4Addr,
    /// vCPUs it runs with (its spec's at creation, then as changes applied them).
    pub cpus: u32,
    /// Memory in MiB it runs with.
    pub memory_mib: u64,
    /// Everything it runs with.
    pub resources: MachineResources,
    /// A change written for its next boot, not taken yet.
    pub next_boot: Option<MachineResources>,
    /// The format of the bootstrap data it received, if it received any.
    pub bootstrap_format: Option<BootstrapFormat>,
    /// Whether that bootstrap data came with a network config.
    pub bootstrap_network_config: bool,
}

/// SplitMix64's output function: a well-mixed 64-bit value from any input.
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A version-4-shaped UUID, deterministic in the world's endpoint and the serial.
pub(crate) fn machine_uuid(seed: u64, serial: u64) -> String {
    let hi = mix64(seed ^ mix64(serial));
    let lo = mix64(hi ^ serial.rotate_left(32));
    let hi = (hi & !0xf000) | 0x4000; // version 4
    let lo = (lo & !(0b11 << 62)) | (0b10 << 62); // RFC 4122 variant
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xffff,
        hi & 0xffff,
        lo >> 48,
        lo & 0xffff_ffff_ffff
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_look_like_v4_and_differ() {
        let a = machine_uuid(1, 1);
        let b = machine_uuid(1, 2);
        let c = machine_uuid(2, 1);
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_eq!(a, machine_uuid(1, 1));
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
        assert!(matches!(&a[19..20], "8" | "9" | "a" | "b"), "{a}");
    }
}
