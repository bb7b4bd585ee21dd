//! One simulated hypervisor: its machines, address pool, tasks and counters.
//!
//! A [`World`] is shared by every backend instance connected to the same endpoint.
//! Operations never block: starting one records when it completes, and every later
//! access first applies what has completed by then ("lazy time"). Deletions are also
//! kept in a min-heap so capacity counts are exact without scanning the machines.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use banlieue_sdk::api::common::PowerState;
use banlieue_sdk::backend::{
    BootstrapData, ChangeMode, ChangeRule, MachineField, MachineIdentity, MachineObservation,
    MachineResources, MadeFor,
};
use banlieue_sdk::changes;
use tokio::time::Instant;

use crate::addresses::AddressPool;
use crate::machine::{Kind, Machine, Op, SimMachineInfo, Step, machine_uuid, transition_name};
use crate::settings::fnv1a;
use crate::stats::{Call, Counters, FaultCounter, SimCall, SimStats};

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
    pub resources: MachineResources,
    pub power: PowerState,
    /// Candidate failure domains: the least loaded is chosen, the first on ties.
    pub failure_domains: Vec<&'a str>,
    pub bootstrap: Option<BootstrapData>,
    /// Addresses the spec fixes (`ipam.mode: static`), reported instead of the pool's.
    pub static_addresses: Vec<String>,
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
    /// When each create in progress completes (its `Create` step), for the peak.
    creates: BinaryHeap<Reverse<Instant>>,
    /// The most creates in progress at once.
    creating_peak: usize,
}

impl State {
    /// Removes the machines whose deletion completed by `now`.
    fn reap(&mut self, now: Instant) {
        while let Some(Reverse((done_at, serial, _))) = self.deletions.peek() {
            if *done_at > now {
                break;
            }
            let (serial, uid) = (*serial, self.deletions.pop().expect("peeked").0.2);
            if self
                .machines
                .get(&uid)
                .is_some_and(|m| m.serial == serial && m.deleting.is_some())
            {
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
    /// Calls recorded for Providers with `recordCalls` (kept apart from `state` so
    /// recording never contends with machine operations).
    calls: Mutex<Vec<SimCall>>,
}

impl World {
    pub(crate) fn new(endpoint: &str) -> Self {
        Self {
            endpoint: endpoint.to_string(),
            id_seed: fnv1a(endpoint.as_bytes()),
            state: Mutex::default(),
            counters: Counters::default(),
            calls: Mutex::default(),
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

    pub(crate) fn record_call(&self, call: SimCall) {
        self.calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(call);
    }

    pub(crate) fn calls(&self) -> Vec<SimCall> {
        self.calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
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

    /// Re-keys the machine whose provider ID is `identity.provider_id` to `identity.uid`
    /// when no machine carries that UID: its object was moved or restored (a new UID,
    /// the same `spec.providerID`). True when a machine now carries the UID. A machine
    /// being deleted is not adopted.
    pub(crate) fn adopt(&self, identity: &MachineIdentity, now: Instant) -> bool {
        let mut state = self.lock(now);
        if state.machines.contains_key(&identity.uid) {
            return true;
        }
        let Some(provider_id) = &identity.provider_id else {
            return false;
        };
        let Some(old) = state
            .machines
            .iter()
            .find(|(_, m)| m.created && m.deleting.is_none() && &m.provider_id == provider_id)
            .map(|(uid, _)| uid.clone())
        else {
            return false;
        };
        let mut machine = state.machines.remove(&old).expect("found above");
        machine.identity = identity.clone();
        state.machines.insert(identity.uid.clone(), machine);
        true
    }

    /// The created machines made for `namespace`/`name` as a `kind`, whatever their UID
    /// (the simulator records each machine's identity and kind).
    pub(crate) fn made_for(
        &self,
        kind: &str,
        identity: &MachineIdentity,
        now: Instant,
    ) -> Vec<MadeFor> {
        let mut state = self.lock(now);
        let mut found: Vec<MadeFor> = state
            .machines
            .values_mut()
            .filter(|m| {
                m.kind.name() == kind
                    && m.identity.namespace == identity.namespace
                    && m.identity.name == identity.name
            })
            .filter_map(|m| {
                m.advance(now);
                m.created.then(|| MadeFor {
                    provider_id: m.provider_id.clone(),
                    uid: Some(m.identity.uid.clone()),
                    backend_ref: m.backend_ref.clone(),
                    deleting: m.deleting.is_some(),
                })
            })
            .collect();
        found.sort_by(|a, b| a.provider_id.cmp(&b.provider_id));
        found
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
        let State {
            machines,
            next_task: tasks,
            ..
        } = &mut *state;
        let machine = machines.get_mut(uid)?;
        machine.advance(now);
        if machine.deleting.is_none() {
            if !machine.created && machine.bootstrap.is_none() {
                machine.bootstrap = bootstrap.cloned();
            }
            if machine.final_power() != power {
                // Keep the operation in flight, drop what was queued behind it, and
                // queue the transition to the wanted state after it.
                machine.ops.truncate(1);
                let (from, start) = match machine.ops.front() {
                    Some(Op {
                        step: Step::Create,
                        done_at,
                        ..
                    }) => (PowerState::PoweredOff, *done_at),
                    Some(Op {
                        step: Step::Power(p),
                        done_at,
                        ..
                    }) => (*p, *done_at),
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
    pub(crate) fn create(
        &self,
        new: NewMachine<'_>,
        now: Instant,
    ) -> Result<Option<MachineObservation>, CreateError> {
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
        let address = state
            .addresses
            .allocate()
            .ok_or(CreateError::AddressesExhausted)?;
        state.next_serial += 1;
        let serial = state.next_serial;
        let uuid = machine_uuid(self.id_seed, serial);
        while state
            .creates
            .peek()
            .is_some_and(|Reverse(done)| *done <= now)
        {
            state.creates.pop();
        }
        state.creates.push(Reverse(now + new.latency));
        state.creating_peak = state.creating_peak.max(state.creates.len());
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
            backend_ref: new
                .kind
                .backend_ref(serial, &failure_domain, new.identity, &uuid),
            failure_domain,
            address,
            static_addresses: new.static_addresses,
            resources: new.resources,
            next_boot: None,
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
        let State {
            machines,
            next_task: tasks,
            deletions,
            ..
        } = &mut *state;
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
        if power == PowerState::PoweredOn
            && machine.power == PowerState::PoweredOff
            && let Some(next) = machine.next_boot.take()
        {
            machine.resources = next;
        }
        machine.power = power;
        true
    }

    /// Applies `fields` of `desired` to the machine carrying `uid` as `table` says for
    /// its power state now: to what it runs with (`Live`, or any change while it is
    /// powered off) or to its next boot (`NextBoot`). `None`: no such machine;
    /// `Some(Err(field))`: the table does not let that field change now.
    pub(crate) fn apply_changes(
        &self,
        uid: &str,
        desired: &MachineResources,
        fields: &[MachineField],
        table: &[ChangeRule],
        now: Instant,
    ) -> Option<Result<MachineObservation, (MachineField, ChangeMode)>> {
        let mut state = self.lock(now);
        let machine = state.machines.get_mut(uid)?;
        machine.advance(now);
        if !machine.created || machine.deleting.is_some() {
            return None;
        }
        let off = machine.power == PowerState::PoweredOff;
        for &field in fields {
            let Some(difference) = changes::differences(desired, &machine.resources)
                .into_iter()
                .find(|d| d.field == field)
            else {
                // What runs is what is asked: only a next boot written for something
                // else is put back (idempotent otherwise).
                if let Some(next) = machine.next_boot.as_mut() {
                    changes::apply_field(next, desired, field);
                }
                continue;
            };
            // The controller's rule, hot-add ceiling included: a growth beyond the
            // machine's maxCPUs waits for its next boot here too.
            match changes::mode_for(table, &difference, desired, &machine.resources) {
                ChangeMode::Never => return Some(Err((field, ChangeMode::Never))),
                _ if off => {
                    changes::apply_field(&mut machine.resources, desired, field);
                    if let Some(next) = machine.next_boot.as_mut() {
                        changes::apply_field(next, desired, field);
                    }
                }
                ChangeMode::Live => changes::apply_field(&mut machine.resources, desired, field),
                ChangeMode::NextBoot => {
                    let next = machine
                        .next_boot
                        .get_or_insert_with(|| machine.resources.clone());
                    changes::apply_field(next, desired, field);
                }
                ChangeMode::PowerOff => return Some(Err((field, ChangeMode::PowerOff))),
            }
        }
        if machine.next_boot.as_ref() == Some(&machine.resources) {
            machine.next_boot = None;
        }
        Some(Ok(machine.observation(now)))
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
            apply_changes: load(&c.calls[Call::ApplyChanges as usize]),
            transient_faults: load(&c.faults[FaultCounter::Transient as usize]),
            terminal_faults: load(&c.faults[FaultCounter::Terminal as usize]),
            slow_faults: load(&c.faults[FaultCounter::Slow as usize]),
            machines_created: state.next_serial,
            machines_deleted: state.removed,
            machines: state.machines.len() as u64,
            creating_peak: state.creating_peak as u64,
        }
    }
}
