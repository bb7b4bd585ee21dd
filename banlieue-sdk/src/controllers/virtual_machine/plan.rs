//! What a VirtualMachine reconcile does, decided from values: the reconciler gathers
//! the [`Facts`] (caches, the scheduling decision), [`placement`] decides whether the
//! VM is built, waits, is reported unschedulable or has old machines removed first, and
//! [`machine`] decides what becomes of the built infra machine. Writes happen in
//! between, in the reconciler: the bootstrap Secret it ensures feeds the build.

use std::time::Duration;

use kube::ResourceExt;

use crate::api::Provider;
use crate::build::machine_kind;
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
