//! What a machine reconcile does, decided from values: whether it is held before the
//! backend is asked ([`held`]), which Provider serves it ([`provider`]), when its
//! bootstrap Secret is read ([`bootstrap_read`]), and what the backend's answer leads
//! to ([`after_ensure`]). The reconciler reads the caches, the CAPI objects and the
//! backend between these steps, and writes what they decide.

use std::time::Duration;

use kube::ResourceExt;

use crate::api::Provider;
use crate::api::common::PowerState;
use crate::api::resources::{ChangeMode, ChangePolicy, ResourcesStatus};
use crate::backend::{BackendError, MachineObservation};

/// How soon a machine whose VM is not yet as asked is looked at again.
pub(crate) const UNSETTLED_RECHECK: Duration = Duration::from_secs(5);

/// When the machine is looked at again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Retry {
    /// When something it watches changes.
    AwaitChange,
    /// After this long.
    After(Duration),
    /// After the machine's own backoff (growing with each failure).
    Backoff,
    /// At the sync period: a slow re-check for out-of-band fixes.
    SyncPeriod,
}

/// A reconcile that stops before the backend: what its status says and when it is
/// looked at again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    /// Write nothing; wait for a change.
    Quiet,
    /// `Ready=False` with this reason: something it needs is not there yet.
    Waiting {
        /// CamelCase reason.
        reason: &'static str,
        /// What is missing.
        message: String,
        /// When to look again.
        retry: Retry,
    },
    /// Paused; a change resumes it.
    Paused(&'static str),
}

/// Whether a machine waits before anything else is read: `clusterctl move` is about to
/// delete this copy (the copy on the target owns the VM now), or a CopyDisk move is
/// importing its disks (creating it now would clone the image instead).
pub(crate) fn held(deleted_for_move: bool, importing_from: Option<&str>) -> Option<Stop> {
    if deleted_for_move {
        return Some(Stop::Quiet);
    }
    importing_from.map(|source| Stop::Waiting {
        reason: "ImportingDisks",
        message: format!("its disks are being copied from {source}"),
        retry: Retry::AwaitChange,
    })
}

/// The Provider that serves a machine, or why there is none to build on.
///
/// `placed_on` is the Provider a CAPI placement chose, `referenced` the machine's
/// `spec.providerRef`, `found` what the cache holds under the name that applies.
/// `reached_backend`: the machine may have a backend VM already (it keeps being
/// reconciled on a Provider being deleted, which waits for it).
pub(crate) fn provider<'a>(
    placed_on: Option<&str>,
    referenced: Option<&str>,
    found: Option<&'a Provider>,
    reached_backend: bool,
) -> Result<&'a Provider, Stop> {
    let Some(provider) = found else {
        let message = match placed_on.or(referenced) {
            Some(name) => format!("Provider {name} not found"),
            None => "spec.providerRef is not set (a Cluster API machine gets its Provider from its failure domain once a Machine owns it)".to_owned(),
        };
        return Err(Stop::Waiting {
            reason: "ProviderNotFound",
            message,
            retry: Retry::Backoff,
        });
    };
    if provider.spec.paused {
        return Err(Stop::Paused("the Provider is paused"));
    }
    if provider.metadata.deletion_timestamp.is_some() && !reached_backend {
        return Err(Stop::Waiting {
            reason: "ProviderDeleting",
            message: format!(
                "Provider {} is being deleted: nothing new is created on it",
                provider.name_any()
            ),
            retry: Retry::AwaitChange,
        });
    }
    Ok(provider)
}

/// When one reconcile reads a machine's bootstrap data Secret (a live `GET`), if at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BootstrapRead {
    /// Not at all: the machine was made (provider ID set, `Ready` is `True`). Bootstrap
    /// data only goes into a create or the configuring step before the first boot, and
    /// `Backend::ensure` creates nothing for a machine with a provider ID. Reading it
    /// anyway cost a Secret `GET` on every reconcile, resyncs included.
    Never,
    /// Before placement, by the Cluster API gate: the data's format decides which
    /// Provider may take the machine, or whether it waits.
    BeforePlacement,
    /// Only by the step that calls the backend, so that a machine that stops before it
    /// (e.g. waiting for a create slot) reads nothing.
    BeforeEnsure,
}

/// The one rule for [`BootstrapRead`]. `format_decides`: whether the format could
/// change where the machine goes or whether it waits (some Provider it could go to does
/// not deliver every format); asked only of a machine with no provider ID, since one
/// that exists is only checked for its power state.
pub(crate) fn bootstrap_read(
    has_provider_id: bool,
    ready: bool,
    format_decides: impl FnOnce() -> bool,
) -> BootstrapRead {
    match (has_provider_id, ready) {
        (true, true) => BootstrapRead::Never,
        (true, false) => BootstrapRead::BeforeEnsure,
        (false, _) if format_decides() => BootstrapRead::BeforePlacement,
        (false, _) => BootstrapRead::BeforeEnsure,
    }
}

/// Whether a machine is powered off to apply its changes that wait for a power cycle
/// (`changePolicy: Restart`), and, if so, those changes for humans. Decided from what
/// its status recorded (`status.resources.pending`, the `UpToDate` reason): a machine
/// asked to run, with a change waiting for `NextBoot` or `PowerOff`, whose last attempt
/// to apply a change did not fail (a failing change must not keep it off). Once it is
/// off, the changes are applied, nothing waits any more, and it is powered on again.
pub(crate) fn restart_to_apply(
    policy: ChangePolicy,
    desired: PowerState,
    recorded: Option<&ResourcesStatus>,
    change_failed: bool,
) -> Option<String> {
    if policy != ChangePolicy::Restart || desired != PowerState::PoweredOn || change_failed {
        return None;
    }
    let waiting: Vec<_> = recorded?
        .pending
        .iter()
        .filter(|p| matches!(p.waits_for, ChangeMode::NextBoot | ChangeMode::PowerOff))
        .cloned()
        .collect();
    (!waiting.is_empty()).then(|| crate::changes::describe(&waiting))
}

/// What follows the backend's answer to `ensure`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Next {
    /// When to look again.
    pub retry: Retry,
    /// Whether a Warning Event announces the failure (once per cause: the slow
    /// re-check of a terminal failure must not repeat it).
    pub announce: bool,
}

/// Decides what follows `ensure`'s answer; `announced`: the machine's `Ready` already
/// carries this failure's message.
pub(crate) fn after_ensure(
    answer: Result<&MachineObservation, &BackendError>,
    want: PowerState,
    announced: bool,
) -> Next {
    let retry = match answer {
        Ok(observation) => match &observation.pending {
            Some(pending) => Retry::After(pending.retry_after),
            None if !observation.settled_at(want) => Retry::After(UNSETTLED_RECHECK),
            None => Retry::SyncPeriod,
        },
        Err(error) if error.is_transient() => error
            .retry_after
            .map(Retry::After)
            .unwrap_or(Retry::Backoff),
        // Terminal: wait for a change; a slow re-check notices out-of-band fixes.
        Err(_) => Retry::SyncPeriod,
    };
    let announce = matches!(answer, Err(error) if !error.is_transient() && !announced);
    Next { retry, announce }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
