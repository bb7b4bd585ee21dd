//! The step after `ensure` for a machine that exists: its changes are assessed from
//! its backend's change table ([`crate::changes::assess`]), the ones that apply now are
//! handed to the backend, and the machine is read back and assessed again, so that
//! what the status reports applied is what the backend read back.

use crate::api::resources::MachineResources;
use crate::backend::{BackendError, MachineObservation, MachineRequest};
use crate::changes::{Assessment, assess};
use crate::controllers::backends::Instrumented;
use crate::status::machine::Resources;

use super::plan::Retry;

/// What the step found.
#[derive(Debug)]
pub(super) enum Settled {
    /// Nothing to say yet: the machine does not exist, or an operation is in flight.
    NotYet,
    /// The backend does not read the machine's resources back.
    NotReported,
    /// Assessed from what the backend read back (after any change it applied).
    Assessed {
        /// What runs.
        running: MachineResources,
        /// What differs, and what waits.
        assessment: Assessment,
    },
    /// Applying a change failed.
    Failed(BackendError),
}

impl Settled {
    /// What the status records.
    pub(super) fn resources<'a>(&'a self, desired: &'a MachineResources) -> Option<Resources<'a>> {
        match self {
            Self::NotYet => None,
            Self::NotReported => Some(Resources::NotReported),
            Self::Assessed {
                running,
                assessment,
            } => Some(Resources::Assessed {
                desired,
                running,
                assessment,
            }),
            Self::Failed(error) => Some(Resources::ChangeFailed { desired, error }),
        }
    }

    /// When to look again, given what `ensure`'s answer asked: a change the backend
    /// was handed and has not read back yet, or a transient failure, backs off (so a
    /// backend that never converges is not a hot loop); a terminal failure waits for
    /// a change of the spec (or the slow re-check).
    pub(super) fn retry(&self, after_ensure: Retry) -> Retry {
        match self {
            Self::Assessed { assessment, .. } if !assessment.apply.is_empty() => Retry::Backoff,
            Self::Failed(error) if error.is_transient() => error
                .retry_after
                .map(Retry::After)
                .unwrap_or(Retry::Backoff),
            _ => after_ensure,
        }
    }
}

/// Assesses a made machine's changes and hands the backend those that apply now;
/// `observation` becomes what the backend read back after them.
pub(super) async fn settle(
    backend: &Instrumented,
    request: &MachineRequest,
    observation: &mut MachineObservation,
    desired: &MachineResources,
) -> Settled {
    if observation.provider_id.is_none() || observation.pending.is_some() {
        return Settled::NotYet;
    }
    let Some(running) = observation.resources.clone() else {
        return Settled::NotReported;
    };
    let table = backend.capabilities().changes;
    let first = assess(
        desired,
        &running,
        observation.next_boot.as_ref(),
        &table,
        observation.power_state,
    );
    if first.apply.is_empty() {
        return Settled::Assessed {
            running,
            assessment: first,
        };
    }
    tracing::info!(
        machine = %request.identity.name,
        fields = ?first.apply,
        "applying changes to a machine that exists"
    );
    let after = match backend.apply_changes(request, &first.apply).await {
        Ok(after) => after,
        Err(error) => return Settled::Failed(error),
    };
    *observation = after;
    match (&observation.resources, &observation.pending) {
        (Some(running), None) => Settled::Assessed {
            assessment: assess(
                desired,
                running,
                observation.next_boot.as_ref(),
                &table,
                observation.power_state,
            ),
            running: running.clone(),
        },
        // In flight, or not read back: what was asked is still what differs.
        _ => Settled::Assessed {
            running,
            assessment: first,
        },
    }
}
