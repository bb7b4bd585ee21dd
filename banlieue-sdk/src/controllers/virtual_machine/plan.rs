//! What a VirtualMachine reconcile does, decided from values: the reconciler gathers
//! the [`Facts`] (caches, the scheduling decision), [`placement`] decides whether the
//! VM is built, waits, is reported unschedulable or has old machines removed first,
//! [`class_use`] whether it is built from its class as it is now or as it was, and
//! [`machine`] decides what becomes of the built infra machine. Writes happen in
//! between, in the reconciler: the bootstrap Secret it ensures feeds the build.

use std::time::Duration;

use kube::ResourceExt;

use crate::api::{ClassUpdatePolicy, Provider, VMClassSpec};
use crate::builder::{ClassRecord, machine_kind};
use crate::contract::KindTable;
use crate::controllers::infra::Existing;
use crate::scheduling::Target;

/// How soon a VM is looked at again while the machines' caches are not synced.
pub(crate) const UNSYNCED_RETRY: Duration = Duration::from_millis(500);
/// How soon a VM placed on a Provider the cache no longer shows is looked at again.
pub(crate) const VANISHED_PROVIDER_RETRY: Duration = Duration::from_secs(1);
/// How soon a Recreate move looks again once it asked the old machines to go.
pub(crate) const RECREATE_RECHECK: Duration = Duration::from_secs(2);

/// Everything [`placement`] decides on, read from the caches by the reconciler.
pub(crate) struct Facts<'a> {
    /// Whether the infra machines' caches have synced since the start.
    pub synced: bool,
    /// Paused (`cluster.x-k8s.io/paused`) or marked `delete-for-move`.
    pub held: bool,
    /// `Some(when to look again)` while the VM is too young to report missing inputs.
    pub settling: Option<Duration>,
    /// The VMClass's name, and whether the cache has it.
    pub class: (&'a str, bool),
    /// The VMImage's name, and whether the cache has it.
    pub image: (&'a str, bool),
    /// The VM's infra machines, as the caches show them.
    pub existing: &'a [Existing],
    /// The scheduler's answer; `None` when class or image is missing (not scheduled).
    pub decision: Option<Result<Target, (&'static str, String)>>,
    /// The namespace's Providers.
    pub providers: &'a [Provider],
    /// `spec.migration.strategy` is CopyDisk.
    pub copying: bool,
    /// The registered machine kinds (which kind a Provider builds).
    pub kinds: &'a KindTable,
}

/// What the reconciler does next, before building.
#[derive(Debug, PartialEq)]
pub(crate) enum Placement<'a> {
    /// Look again after this long, writing nothing.
    Requeue(Duration),
    /// Write nothing; a change to the VM brings it back.
    AwaitChange,
    /// The class or image is missing but the VM's machine exists: it is kept as it is,
    /// only `spec.powerState` is applied to it, and the VM says what is missing.
    PowerOnly {
        /// The machine (an index into [`Facts::existing`]).
        machine: usize,
        /// `ClassNotFound` or `ImageNotFound`.
        reason: &'static str,
        /// What is missing, and what still works.
        message: String,
    },
    /// `Scheduled=False` with this reason, and back off.
    Unschedulable {
        /// Condition reason.
        reason: &'static str,
        /// Condition message.
        message: String,
    },
    /// Recreate: delete `stale`'s machines that are not deleting yet, report the move,
    /// and look again after [`RECREATE_RECHECK`].
    Recreate {
        /// Where the VM goes.
        target: Target,
        /// The Provider it goes to.
        provider: &'a Provider,
        /// The machines that must go first (indexes into [`Facts::existing`]).
        stale: Vec<usize>,
        /// The `Migrating` condition's message.
        message: String,
    },
    /// Ensure the bootstrap Secret and build the machine for `target` on `provider`;
    /// `stale` machines (CopyDisk only) are moved from.
    Build {
        /// Where the VM goes.
        target: Target,
        /// The Provider it goes to.
        provider: &'a Provider,
        /// Machines elsewhere that a CopyDisk move copies from (indexes into
        /// [`Facts::existing`]); empty when the VM stays where it is.
        stale: Vec<usize>,
    },
}

/// Decides what a reconcile of a VM does before building its machine.
pub(crate) fn placement(facts: Facts<'_>) -> Placement<'_> {
    if !facts.synced {
        // Right after a start the machines' caches may not show a VM's machines yet:
        // a CopyDisk move in flight would look done, a machine absent (and be built
        // again without what the move put on it).
        return Placement::Requeue(UNSYNCED_RETRY);
    }
    if facts.held {
        // Paused (e.g. around a `clusterctl move`, which pauses Clusters but not
        // standalone VMs): nothing is scheduled, built or moved until the annotation
        // goes. `delete-for-move` too: `clusterctl move` sets it just before deleting,
        // by a patch that replaces every annotation (the pause included); rebuilding
        // the machine it already deleted here would make a second VM.
        return Placement::AwaitChange;
    }
    let running = facts.existing.iter().find(|e| !e.deleting);
    let decision = match (&facts.class, &facts.image, facts.decision) {
        ((_, true), (_, true), Some(decision)) => decision,
        ((class, class_found), (image, _), _) => {
            if let Some(again) = facts.settling {
                return Placement::Requeue(again);
            }
            let (reason, mut message) = if !class_found {
                ("ClassNotFound", format!("VMClass {class} not found"))
            } else {
                ("ImageNotFound", format!("VMImage {image} not found"))
            };
            let live: Vec<usize> = (facts.existing.iter().enumerate())
                .filter(|(_, e)| !e.deleting)
                .map(|(i, _)| i)
                .collect();
            if let [machine] = live[..] {
                // The VM runs on: it is neither rebuilt nor moved, only not updated, but
                // its power is still the user's to switch (a power-off must not wait
                // for a class to come back). Not during a move (two machines).
                let e = &facts.existing[machine];
                message.push_str(&format!(
                    "; its {} {} is kept as it is and only spec.powerState is applied to it \
                     until it exists again (recreate it, or point the VM at another one)",
                    e.kind.kind(),
                    e.name
                ));
                return Placement::PowerOnly {
                    machine,
                    reason,
                    message,
                };
            }
            if let Some(machine) = running {
                message.push_str(&format!(
                    "; its {} {} is kept as it is, and changes to the VM wait until it exists again",
                    machine.kind.kind(),
                    machine.name
                ));
            }
            return Placement::Unschedulable { reason, message };
        }
    };
    let target = match decision {
        Ok(target) => target,
        Err((reason, message)) => {
            if let Some(again) = facts.settling {
                return Placement::Requeue(again);
            }
            return Placement::Unschedulable { reason, message };
        }
    };
    let Some(provider) = facts
        .providers
        .iter()
        .find(|p| p.name_any() == target.provider)
    else {
        // The scheduler only places onto existing Providers; a vanished one shows up
        // next round.
        return Placement::Requeue(VANISHED_PROVIDER_RETRY);
    };
    // A machine elsewhere (another Provider or kind) must go before the new one comes.
    let wanted_kind = machine_kind(provider, facts.kinds).ok();
    let stale: Vec<usize> = facts
        .existing
        .iter()
        .enumerate()
        .filter(|(_, e)| {
            e.provider.as_deref() != Some(target.provider.as_str()) || Some(e.kind) != wanted_kind
        })
        .map(|(i, _)| i)
        .collect();
    if stale.is_empty() || facts.copying {
        return Placement::Build {
            target,
            provider,
            stale,
        };
    }
    let message = format!(
        "{} -> {} (Recreate: the old machine is deleted first, the new one is made from the image)",
        facts.existing[stale[0]]
            .provider
            .clone()
            .unwrap_or_default(),
        target.provider
    );
    Placement::Recreate {
        target,
        provider,
        stale,
        message,
    }
}

/// What becomes of the machine built for a VM that stays where it is placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Machine {
    /// It is what the cache holds already: nothing to apply.
    Unchanged,
    /// Apply it; `first` when the VM had no machine (a `Scheduled` Event goes out).
    Apply {
        /// The VM had no machine before.
        first: bool,
    },
}

/// Decides whether the machine built for a VM is applied (`matches`: the current
/// machine, when there is one, already is what was built).
pub(crate) fn machine(current: Option<&Existing>, matches: impl Fn(&Existing) -> bool) -> Machine {
    match current {
        Some(existing) if matches(existing) => Machine::Unchanged,
        Some(_) => Machine::Apply { first: false },
        None => Machine::Apply { first: true },
    }
}

/// What a VM's machine is built from: its class as it is now, or as the machine
/// records it was ([`ClassRecord`]).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum ClassUse {
    /// The class as it is now; the machine records it. A first build, a VM pointed at
    /// another class, a class unchanged since the machine was built, a class whose
    /// `updatePolicy` is `Apply`, or a machine that records no class (built by an older
    /// banlieue, which always followed the class: it runs on the class as it is).
    Current,
    /// The class as the machine records it: the class was edited since, and its
    /// `updatePolicy` is `Keep`. `changed` names each field that differs.
    Kept {
        /// What the machine was built from (and goes on being built from).
        record: ClassRecord,
        /// Each differing field, `cpus 2 → 4`.
        changed: Vec<String>,
    },
}

impl ClassUse {
    /// The class spec to build the machine from.
    pub(crate) fn spec<'a>(&'a self, now: &'a ClassRecord) -> &'a VMClassSpec {
        match self {
            Self::Current => &now.spec,
            Self::Kept { record, .. } => &record.spec,
        }
    }

    /// The record the built machine carries.
    pub(crate) fn record<'a>(&'a self, now: &'a ClassRecord) -> &'a ClassRecord {
        match self {
            Self::Current => now,
            Self::Kept { record, .. } => record,
        }
    }

    /// What the VM says about it (`ClassUpToDate`): `(true, message)` on the class as
    /// it is, `(false, message)` kept on the class as it was, naming what differs and
    /// what to do.
    pub(crate) fn report(&self, now: &ClassRecord) -> (bool, String) {
        let generation = |g: Option<i64>| g.map(|g| g.to_string()).unwrap_or_else(|| "?".into());
        match self {
            Self::Current => (
                true,
                format!(
                    "built from VMClass {} as it is (generation {})",
                    now.name,
                    generation(now.generation)
                ),
            ),
            Self::Kept { record, changed } => (
                false,
                format!(
                    "VMClass {} changed since this VM's machine was built (generation {} → {}: {}); \
                     the VM keeps what it was built with, as the class's updatePolicy is Keep: \
                     set updatePolicy: Apply on the class to apply the edit to its VMs, or point \
                     the VM at another class",
                    now.name,
                    generation(record.generation),
                    generation(now.generation),
                    changed.join(", ")
                ),
            ),
        }
    }
}

/// Decides what a VM's machine is built from, given its class as it is now (`now`,
/// the class `spec.classRef` names) and what the machine it has records (`recorded`;
/// `None` with no machine, or one that records no class).
pub(crate) fn class_use(now: &ClassRecord, recorded: Option<&ClassRecord>) -> ClassUse {
    let Some(recorded) = recorded.filter(|r| r.name == now.name) else {
        // No machine yet, an old one, or the VM pointed at another class: built from the
        // class as it is (a change of classRef resizes, by the usual rules).
        return ClassUse::Current;
    };
    let changed = recorded.changed_fields(&now.spec);
    if changed.is_empty() || now.spec.update_policy == ClassUpdatePolicy::Apply {
        return ClassUse::Current;
    }
    ClassUse::Kept {
        record: recorded.clone(),
        changed,
    }
}

/// When a VM whose bootstrap data is not there yet is looked at again: a Secret that
/// does not exist yet soon, a Secret that is wrong once the watches see a change (or
/// at the sync period).
pub(crate) fn bootstrap_retry(reason: &str, sync_period: Duration) -> Duration {
    if reason == crate::controllers::bootstrap::NOT_FOUND {
        Duration::from_secs(10)
    } else {
        sync_period
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
