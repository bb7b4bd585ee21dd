//! One simulated hypervisor: its machines, address pool, tasks and counters.
//!
//! A [`World`] is shared by every backend instance connected to the same endpoint.
//! Operations never block: starting one records when it completes, and every later
//! access first applies what has completed by then ("lazy time"). Deletions are also
//! kept in a min-heap so capacity counts are exact without scanning the machines.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use banlieue_sdk::api::common::{BootstrapFormat, PowerState};
use banlieue_sdk::api::infra::{MachineAddress, MachineAddressType};
use banlieue_sdk::backend::{BootstrapData, MachineIdentity, MachineObservation, Pending};
use tokio::time::Instant;

use crate::settings::fnv1a;

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

    fn scheme(self) -> &'static str {
        match self {
            Self::VSphere => "vsphere",
            Self::Proxmox => "proxmox",
            Self::Libvirt => "libvirt",
            Self::CloudHypervisor => "cloud-hypervisor",
        }
    }

    /// A handle shaped like the real backend's (moref, `node/vmid`, domain name, socket).
    fn backend_ref(self, serial: u64, domain: &str, identity: &MachineIdentity, uuid: &str) -> String {
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
enum Step {
    /// The machine comes into existence, powered off.
    Create,
    /// The machine reaches this power state.
    Power(PowerState),
}

/// An operation in flight or queued behind the one in flight.
#[derive(Clone, Debug)]
struct Op {
    step: Step,
    name: &'static str,
    task: String,
    done_at: Instant,
}

/// The name a power transition is reported under.
fn transition_name(from: PowerState, to: PowerState) -> &'static str {
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
    identity: MachineIdentity,
    serial: u64,
    kind: Kind,
    provider_id: String,
    backend_ref: String,
    failure_domain: String,
    address: Ipv4Addr,
    cpus: u32,
    memory_mib: u64,
    /// True once the `Create` step completed.
    created: bool,
    /// The power state now (meaningful once created).
    power: PowerState,
    /// The operation in flight first, then those queued behind it.
    ops: VecDeque<Op>,
    /// Task and completion time of a deletion in progress.
    deleting: Option<(String, Instant)>,
    bootstrap: Option<BootstrapData>,
}

impl Machine {
    /// Applies every operation that completed by `now`.
    fn advance(&mut self, now: Instant) {
        while self.ops.front().is_some_and(|op| op.done_at <= now) {
            let op = self.ops.pop_front().expect("checked above");
            match op.step {
                Step::Create => {
                    self.created = true;
                    self.power = PowerState::PoweredOff;
                }
                Step::Power(p) => self.power = p,
            }
        }
    }

    /// The power state the machine reaches once `ops` are done.
    fn final_power(&self) -> PowerState {
        match self.ops.back() {
            Some(Op { step: Step::Power(p), .. }) => *p,
            Some(Op { step: Step::Create, .. }) => PowerState::PoweredOff,
            None => self.power,
        }
    }

    fn observation(&self, now: Instant) -> MachineObservation {
        let pending = match (&self.deleting, self.ops.front()) {
            (Some((task, done_at)), _) => Some(pending("Deleting", task, *done_at, now)),
            (None, Some(op)) => Some(pending(op.name, &op.task, op.done_at, now)),
            (None, None) => None,
        };
        let on = self.created && self.power == PowerState::PoweredOn;
        MachineObservation {
            provider_id: self.created.then(|| self.provider_id.clone()),
            power_state: self.created.then_some(self.power),
            addresses: if on {
                vec![
                    MachineAddress {
                        type_: MachineAddressType::InternalIp,
                        address: self.address.to_string(),
                    },
                    MachineAddress {
                        type_: MachineAddressType::Hostname,
                        address: self.identity.name.clone(),
                    },
                ]
            } else {
                Vec::new()
            },
            failure_domain: Some(self.failure_domain.clone()),
            backend_ref: self.created.then(|| self.backend_ref.clone()),
            pending,
        }
    }

    fn info(&self) -> SimMachineInfo {
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
            cpus: self.cpus,
            memory_mib: self.memory_mib,
            bootstrap_format: self.bootstrap.as_ref().map(|b| b.format),
            bootstrap_network_config: self.bootstrap.as_ref().is_some_and(|b| b.network_config.is_some()),
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
    /// vCPUs of the spec it was created from.
    pub cpus: u32,
    /// Memory in MiB of the spec it was created from.
    pub memory_mib: u64,
    /// The format of the bootstrap data it received, if it received any.
    pub bootstrap_format: Option<BootstrapFormat>,
    /// Whether that bootstrap data came with a network config.
    pub bootstrap_network_config: bool,
}

/// Counters of one simulated hypervisor, for benchmarks (see [`crate::SimFactory::stats`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SimStats {
    /// `check()` calls.
    pub check: u64,
    /// `find_image()` calls.
    pub find_image: u64,
    /// `ensure()` calls.
    pub ensure: u64,
    /// `observe()` calls.
    pub observe: u64,
    /// `delete()` calls.
    pub delete: u64,
    /// Calls failed with an injected transient fault.
    pub transient_faults: u64,
    /// Calls failed with an injected terminal fault.
    pub terminal_faults: u64,
    /// Calls slowed down by an injected `slow` fault.
    pub slow_faults: u64,
    /// Machines whose creation started.
    pub machines_created: u64,
    /// Machines removed (deletion completed, or removed out of band).
    pub machines_deleted: u64,
    /// Machines that exist now (including those being created or deleted).
    pub machines: u64,
}

impl SimStats {
    /// Every backend call counted: `check + find_image + ensure + observe + delete`.
    pub fn calls(&self) -> u64 {
        self.check + self.find_image + self.ensure + self.observe + self.delete
    }
}

/// Which counter a call increments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Call {
    Check,
    FindImage,
    Ensure,
    Observe,
    Delete,
}

impl Call {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Check => "check",
            Self::FindImage => "find_image",
            Self::Ensure => "ensure",
            Self::Observe => "observe",
            Self::Delete => "delete",
        }
    }
}

/// Which fault counter an injected fault increments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FaultCounter {
    Transient,
    Terminal,
    Slow,
}

#[derive(Debug, Default)]
struct Counters {
    calls: [AtomicU64; 5],
    faults: [AtomicU64; 3],
}

/// Hands out `10.x.y.z` addresses (never `.0` or `.255`), each unique among the
/// machines that exist. Fresh addresses first; freed ones only once the fresh run out.
#[derive(Debug)]
struct AddressPool {
    next: u32,
    free: Vec<u32>,
}

impl Default for AddressPool {
    fn default() -> Self {
        Self { next: 1, free: Vec::new() }
    }
}

impl AddressPool {
    const SIZE: u32 = 1 << 24;

    fn allocate(&mut self) -> Option<Ipv4Addr> {
        while self.next < Self::SIZE {
            let n = self.next;
            self.next += 1;
            if !matches!(n & 0xff, 0 | 255) {
                return Some(Self::addr(n));
            }
        }
        self.free.pop().map(Self::addr)
    }

    fn release(&mut self, addr: Ipv4Addr) {
        self.free.push(u32::from(addr) & (Self::SIZE - 1));
    }

    fn addr(n: u32) -> Ipv4Addr {
        Ipv4Addr::from((10 << 24) | n)
    }
}

/// Why a machine could not be created.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum CreateError {
    Capacity(usize),
    AddressesExhausted,
    NoFailureDomain,
}

/// What `create` needs to know about the new machine.
pub(crate) struct NewMachine<'a> {
    pub identity: &'a MachineIdentity,
    pub kind: Kind,
    pub cpus: u32,
    pub memory_mib: u64,
    pub power: PowerState,
    /// Candidate failure domains: the least loaded is chosen, the first on ties.
    pub failure_domains: Vec<&'a str>,
    pub bootstrap: Option<BootstrapData>,
    pub capacity: Option<usize>,
    pub latency: Duration,
}

#[derive(Debug, Default)]
struct State {
    machines: HashMap<String, Machine>,
    /// Completion time, serial and uid of every deletion in progress.
    deletions: BinaryHeap<Reverse<(Instant, u64, String)>>,
    domain_load: HashMap<String, usize>,
    addresses: AddressPool,
    next_serial: u64,
    next_task: u64,
    removed: u64,
}

impl State {
    /// Removes the machines whose deletion completed by `now`.
    fn reap(&mut self, now: Instant) {
        while let Some(Reverse((done_at, serial, _))) = self.deletions.peek() {
            if *done_at > now {
                break;
            }
            let (serial, uid) = (*serial, self.deletions.pop().expect("peeked").0.2);
            if self.machines.get(&uid).is_some_and(|m| m.serial == serial && m.deleting.is_some()) {
                self.remove(&uid);
            }
        }
    }

    fn remove(&mut self, uid: &str) -> Option<Machine> {
        let machine = self.machines.remove(uid)?;
        self.removed += 1;
        self.addresses.release(machine.address);
        if let Some(load) = self.domain_load.get_mut(&machine.failure_domain) {
            *load = load.saturating_sub(1);
        }
        Some(machine)
    }

    fn task(&mut self) -> String {
        next_task(&mut self.next_task)
    }
}

fn next_task(counter: &mut u64) -> String {
    *counter += 1;
    format!("sim-task-{counter}")
}

/// One simulated hypervisor, shared by every backend connected to its endpoint.
#[derive(Debug)]
pub(crate) struct World {
    endpoint: String,
    id_seed: u64,
    state: Mutex<State>,
    counters: Counters,
}

impl World {
    pub(crate) fn new(endpoint: &str) -> Self {
        Self {
            endpoint: endpoint.to_string(),
            id_seed: fnv1a(endpoint.as_bytes()),
            state: Mutex::default(),
            counters: Counters::default(),
        }
    }

    pub(crate) fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Locks the state and applies completed deletions. Never held across `.await`.
    fn lock(&self, now: Instant) -> MutexGuard<'_, State> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.reap(now);
        state
    }

    pub(crate) fn count_call(&self, call: Call) {
        self.counters.calls[call as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_fault(&self, fault: FaultCounter) {
        self.counters.faults[fault as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// The machine carrying `uid`, brought up to date, as an observation.
    pub(crate) fn observe(&self, uid: &str, now: Instant) -> Option<MachineObservation> {
        let mut state = self.lock(now);
        let machine = state.machines.get_mut(uid)?;
        machine.advance(now);
        Some(machine.observation(now))
    }

    /// Reconciles an existing machine towards `power`; `None` when no machine has `uid`.
    /// A machine being deleted is left alone (its observation shows `Deleting`).
    pub(crate) fn reconcile(
        &self,
        uid: &str,
        power: PowerState,
        bootstrap: Option<&BootstrapData>,
        latency: Duration,
        now: Instant,
    ) -> Option<MachineObservation> {
        let mut state = self.lock(now);
        let State { machines, next_task: tasks, .. } = &mut *state;
        let machine = machines.get_mut(uid)?;
        machine.advance(now);
        if machine.deleting.is_none() {
            if !machine.created && machine.bootstrap.is_none() {
                machine.bootstrap = bootstrap.cloned();
            }
            if machine.final_power() != power {
                // Keep the operation in flight, drop what was queued behind it, and
                // queue the transition to the wanted state after it.
                let (from, start) = match machine.ops.front() {
                    Some(op) => {
                        machine.ops.truncate(1);
                        let from = match op.step {
                            Step::Create => PowerState::PoweredOff,
                            Step::Power(p) => p,
                        };
                        (from, op.done_at)
                    }
                    None => (machine.power, now),
                };
                if from != power {
                    machine.ops.push_back(Op {
                        step: Step::Power(power),
                        name: transition_name(from, power),
                        task: next_task(tasks),
                        done_at: start + latency,
                    });
                }
                machine.advance(now);
            }
        }
        Some(machine.observation(now))
    }

    /// Creates a machine, or returns `Ok(None)` when one with the same UID appeared
    /// since the caller looked (callers then reconcile it).
    pub(crate) fn create(&self, new: NewMachine<'_>, now: Instant) -> Result<Option<MachineObservation>, CreateError> {
        let mut state = self.lock(now);
        if state.machines.contains_key(&new.identity.uid) {
            return Ok(None);
        }
        if let Some(capacity) = new.capacity
            && state.machines.len() >= capacity
        {
            return Err(CreateError::Capacity(capacity));
        }
        let failure_domain = new
            .failure_domains
            .iter()
            .enumerate()
            .min_by_key(|(i, d)| (state.domain_load.get(**d).copied().unwrap_or(0), *i))
            .map(|(_, d)| d.to_string())
            .ok_or(CreateError::NoFailureDomain)?;
        let address = state.addresses.allocate().ok_or(CreateError::AddressesExhausted)?;
        state.next_serial += 1;
        let serial = state.next_serial;
        let uuid = machine_uuid(self.id_seed, serial);
        let create_task = state.task();
        let mut ops = VecDeque::from([Op {
            step: Step::Create,
            name: "Creating",
            task: create_task,
            done_at: now + new.latency,
        }]);
        if new.power != PowerState::PoweredOff {
            ops.push_back(Op {
                step: Step::Power(new.power),
                name: transition_name(PowerState::PoweredOff, new.power),
                task: state.task(),
                done_at: now + new.latency * 2,
            });
        }
        *state.domain_load.entry(failure_domain.clone()).or_default() += 1;
        let mut machine = Machine {
            identity: new.identity.clone(),
            serial,
            kind: new.kind,
            provider_id: format!("{}://{uuid}", new.kind.scheme()),
            backend_ref: new.kind.backend_ref(serial, &failure_domain, new.identity, &uuid),
            failure_domain,
            address,
            cpus: new.cpus,
            memory_mib: new.memory_mib,
            created: false,
            power: PowerState::PoweredOff,
            ops,
            deleting: None,
            bootstrap: new.bootstrap,
        };
        machine.advance(now);
        let observation = machine.observation(now);
        state.machines.insert(new.identity.uid.clone(), machine);
        Ok(Some(observation))
    }

    /// Starts (or continues) deleting the machine carrying `uid`. Returns the time
    /// left, or `None` once it is gone.
    pub(crate) fn delete(&self, uid: &str, latency: Duration, now: Instant) -> Option<Duration> {
        let mut state = self.lock(now);
        let State { machines, next_task: tasks, deletions, .. } = &mut *state;
        let machine = machines.get_mut(uid)?;
        let done_at = match &machine.deleting {
            Some((_, done_at)) => *done_at,
            None => {
                // Cancel whatever was in flight; deleting powers the machine off first.
                machine.advance(now);
                machine.ops.clear();
                let done_at = now + latency;
                machine.deleting = Some((next_task(tasks), done_at));
                deletions.push(Reverse((done_at, machine.serial, uid.to_string())));
                done_at
            }
        };
        if done_at <= now {
            state.reap(now);
            return None;
        }
        Some(done_at - now)
    }

    /// Every machine, sorted by namespace, name and UID.
    pub(crate) fn machines(&self, now: Instant) -> Vec<SimMachineInfo> {
        let mut state = self.lock(now);
        let mut list: Vec<SimMachineInfo> = state
            .machines
            .values_mut()
            .map(|m| {
                m.advance(now);
                m.info()
            })
            .collect();
        list.sort_by(|a, b| {
            (&a.identity.namespace, &a.identity.name, &a.identity.uid).cmp(&(
                &b.identity.namespace,
                &b.identity.name,
                &b.identity.uid,
            ))
        });
        list
    }

    pub(crate) fn machine(&self, uid: &str, now: Instant) -> Option<SimMachineInfo> {
        let mut state = self.lock(now);
        let machine = state.machines.get_mut(uid)?;
        machine.advance(now);
        Some(machine.info())
    }

    pub(crate) fn bootstrap(&self, uid: &str, now: Instant) -> Option<BootstrapData> {
        self.lock(now).machines.get(uid)?.bootstrap.clone()
    }

    /// Removes a machine at once, as if someone deleted it behind the operator's back.
    pub(crate) fn remove_out_of_band(&self, uid: &str, now: Instant) -> bool {
        self.lock(now).remove(uid).is_some()
    }

    /// Sets a created machine's power at once, as if someone pressed its power button;
    /// queued power operations are dropped. False when there is no such created machine.
    pub(crate) fn set_power_out_of_band(&self, uid: &str, power: PowerState, now: Instant) -> bool {
        let mut state = self.lock(now);
        let Some(machine) = state.machines.get_mut(uid) else {
            return false;
        };
        machine.advance(now);
        if !machine.created || machine.deleting.is_some() {
            return false;
        }
        machine.ops.clear();
        machine.power = power;
        true
    }

    pub(crate) fn stats(&self, now: Instant) -> SimStats {
        let state = self.lock(now);
        let c = &self.counters;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SimStats {
            check: load(&c.calls[Call::Check as usize]),
            find_image: load(&c.calls[Call::FindImage as usize]),
            ensure: load(&c.calls[Call::Ensure as usize]),
            observe: load(&c.calls[Call::Observe as usize]),
            delete: load(&c.calls[Call::Delete as usize]),
            transient_faults: load(&c.faults[FaultCounter::Transient as usize]),
            terminal_faults: load(&c.faults[FaultCounter::Terminal as usize]),
            slow_faults: load(&c.faults[FaultCounter::Slow as usize]),
            machines_created: state.next_serial,
            machines_deleted: state.removed,
            machines: state.machines.len() as u64,
        }
    }
}

/// SplitMix64's output function: a well-mixed 64-bit value from any input.
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A version-4-shaped UUID, deterministic in the world's endpoint and the serial.
fn machine_uuid(seed: u64, serial: u64) -> String {
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
    fn addresses_skip_network_and_broadcast_octets() {
        let mut pool = AddressPool::default();
        let first: Vec<Ipv4Addr> = (0..300).map(|_| pool.allocate().unwrap()).collect();
        assert_eq!(first[0], Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(first[253], Ipv4Addr::new(10, 0, 0, 254));
        assert_eq!(first[254], Ipv4Addr::new(10, 0, 1, 1));
        assert!(first.iter().all(|a| !matches!(a.octets()[3], 0 | 255)));
    }

    #[test]
    fn freed_addresses_are_reused_only_when_fresh_ones_run_out() {
        let mut pool = AddressPool::default();
        let a = pool.allocate().unwrap();
        pool.release(a);
        assert_ne!(pool.allocate().unwrap(), a);
        pool.next = AddressPool::SIZE;
        assert_eq!(pool.allocate(), Some(a));
        assert_eq!(pool.allocate(), None);
    }

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
