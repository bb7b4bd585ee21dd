//! Infrastructure machine status from what the backend said.
//!
//! `Ready` is always present. Its reasons: `Ready`; the backend's pending operation
//! (`Creating`, `PoweringOn`, ...); `PowerStateMismatch`; a waiting reason
//! (`ProviderNotFound`, `ProviderNotReady`, `BootstrapDataNotFound`, ...); a transient
//! backend reason (`Unreachable`, ...) while banlieue retries; and **`TerminalFailure`**
//! (message `<backend reason>: <backend message>`) when retrying cannot help until the
//! spec or the backend changes (among them `ProviderIDMismatch`: `spec.providerID`
//! names another machine than the backend's for this UID, which banlieue neither
//! patches, the field being immutable, nor adopts); **`DeleteFailed`** (same message) while the backend
//! refuses to delete the VM of a machine being deleted, which keeps its finalizer.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::common::PowerState;
use crate::api::infra::{Initialization, MachineStatus};
use crate::api::resources::{MachineResources, ResourcesStatus};
use crate::backend::{BackendError, MachineObservation};
use crate::changes::{Assessment, describe};
use crate::conditions::{self, Desired, Status, types};

pub use super::TERMINAL_FAILURE;

/// The `Ready` reason while the backend refuses to delete a deleted machine's VM.
pub const DELETE_FAILED: &str = "DeleteFailed";

/// What the machine controller learned in one reconcile.
#[derive(Clone, Copy, Debug)]
pub enum Outcome<'a> {
    /// The backend answered.
    Observed(&'a MachineObservation),
    /// The backend failed.
    Failed(&'a BackendError),
    /// The machine is being deleted and the backend failed to delete its VM (retried,
    /// transient or not: the finalizer holds until the VM is gone).
    DeleteFailed(&'a BackendError),
    /// Something the machine needs is not there yet.
    Waiting {
        /// CamelCase reason.
        reason: &'a str,
        /// What is missing.
        message: &'a str,
    },
    /// Reconciliation is paused (Provider, Cluster or annotation).
    Paused {
        /// Why.
        message: &'a str,
    },
}

/// The status after one reconcile.
pub fn compute(
    previous: Option<&MachineStatus>,
    desired_power: PowerState,
    generation: Option<i64>,
    outcome: Outcome<'_>,
    now: &Time,
) -> MachineStatus {
    let mut status = previous.cloned().unwrap_or_default();
    status.observed_generation = generation;
    let set = |status: &mut MachineStatus, d: Desired<'_>| {
        conditions::set(&mut status.conditions, d, generation, now)
    };
    if !matches!(outcome, Outcome::Paused { .. }) {
        set(
            &mut status,
            Desired::new(types::PAUSED, Status::False, "NotPaused"),
        );
    }
    match outcome {
        Outcome::Observed(observation) => {
            let provisioned = status
                .initialization
                .as_ref()
                .and_then(|i| i.provisioned)
                .unwrap_or(false)
                || observation.provider_id.is_some();
            status.initialization = Some(Initialization {
                provisioned: Some(provisioned),
            });
            status.addresses = observation.addresses.clone();
            status.failure_domain = observation
                .failure_domain
                .clone()
                .or(status.failure_domain.take());
            status.power_state = observation.power_state;
            status.backend_ref = observation
                .backend_ref
                .clone()
                .or(status.backend_ref.take());
            let (ready, reason, message) = if observation.settled_at(desired_power) {
                (Status::True, "Ready".to_owned(), String::new())
            } else if let Some(pending) = &observation.pending {
                (
                    Status::False,
                    pending.operation.clone(),
                    pending
                        .task
                        .clone()
                        .map(|t| format!("task {t}"))
                        .unwrap_or_default(),
                )
            } else {
                (
                    Status::False,
                    "PowerStateMismatch".to_owned(),
                    format!(
                        "want {}, {}",
                        desired_power.as_str(),
                        match observation.power_state {
                            Some(p) => format!("the backend reports {}", p.as_str()),
                            None => "the backend reports no power state".to_owned(),
                        }
                    ),
                )
            };
            set(
                &mut status,
                Desired::new(types::READY, ready, &reason).message(&message),
            );
        }
        Outcome::Failed(error) => {
            let (reason, message) = if error.is_transient() {
                (error.reason.clone(), error.message.clone())
            } else {
                (
                    TERMINAL_FAILURE.to_owned(),
                    format!("{}: {}", error.reason, error.message),
                )
            };
            set(
                &mut status,
                Desired::new(types::READY, Status::False, &reason).message(&message),
            );
        }
        Outcome::DeleteFailed(error) => {
            let message = format!("{}: {}", error.reason, error.message);
            set(
                &mut status,
                Desired::new(types::READY, Status::False, DELETE_FAILED).message(&message),
            );
        }
        Outcome::Waiting { reason, message } => {
            set(
                &mut status,
                Desired::new(types::READY, Status::False, reason).message(message),
            );
        }
        Outcome::Paused { message } => {
            set(
                &mut status,
                Desired::new(types::PAUSED, Status::True, "Paused").message(message),
            );
            if conditions::get(&status.conditions, types::READY).is_none() {
                set(
                    &mut status,
                    Desired::new(types::READY, Status::Unknown, "Paused"),
                );
            }
        }
    }
    status
}

/// What one reconcile learned about a made machine's resources.
#[derive(Clone, Copy, Debug)]
pub enum Resources<'a> {
    /// The backend read them back and the machine's changes were assessed.
    Assessed {
        /// What the spec asks.
        desired: &'a MachineResources,
        /// What runs.
        running: &'a MachineResources,
        /// The assessment (after any change was applied and read back).
        assessment: &'a Assessment,
    },
    /// A change the backend was asked to apply failed.
    ChangeFailed {
        /// What the spec asks.
        desired: &'a MachineResources,
        /// The backend's error.
        error: &'a BackendError,
    },
    /// The backend does not read the machine's resources back.
    NotReported,
}

/// Records `resources` in `status.resources` and the `UpToDate` and
/// `RestartRequired` conditions.
pub fn record_resources(
    status: &mut MachineStatus,
    resources: Resources<'_>,
    generation: Option<i64>,
    now: &Time,
) {
    let mut set = |d: Desired<'_>| conditions::set(&mut status.conditions, d, generation, now);
    match resources {
        Resources::Assessed {
            assessment,
            running,
            desired,
        } => {
            let (up, reason, message) = if assessment.up_to_date() {
                (Status::True, "UpToDate", String::new())
            } else if assessment.refused().next().is_some() {
                (Status::False, CHANGE_REFUSED, describe(&assessment.pending))
            } else if assessment.restart_required() {
                (
                    Status::False,
                    RESTART_REQUIRED,
                    describe(&assessment.pending),
                )
            } else {
                (
                    Status::False,
                    APPLYING,
                    "a change is being applied".to_owned(),
                )
            };
            set(Desired::new(types::UP_TO_DATE, up, reason).message(&message));
            if assessment.restart_required() {
                let waiting: Vec<_> = assessment
                    .pending
                    .iter()
                    .filter(|p| p.waits_for != crate::api::resources::ChangeMode::Never)
                    .cloned()
                    .collect();
                set(
                    Desired::new(types::RESTART_REQUIRED, Status::True, RESTART_REQUIRED)
                        .message(&describe(&waiting)),
                );
            } else {
                set(Desired::new(
                    types::RESTART_REQUIRED,
                    Status::False,
                    "NoRestartPending",
                ));
            }
            status.resources = Some(ResourcesStatus {
                running: Some(running.clone()),
                desired: Some(desired.clone()),
                pending: assessment.pending.clone(),
            });
        }
        Resources::ChangeFailed { desired, error } => {
            let message = format!("{}: {}", error.reason, error.message);
            set(Desired::new(types::UP_TO_DATE, Status::False, CHANGE_FAILED).message(&message));
            let resources = status.resources.get_or_insert_with(Default::default);
            resources.desired = Some(desired.clone());
        }
        Resources::NotReported => {
            set(
                Desired::new(types::UP_TO_DATE, Status::Unknown, "ResourcesNotReported")
                    .message("the backend does not read this machine's resources back: whether it runs with what its spec asks is not known"),
            );
        }
    }
}

/// `UpToDate` reason: a change waits for a power cycle.
pub const RESTART_REQUIRED: &str = "RestartRequired";
/// `UpToDate` reason: a change cannot be applied to this machine.
pub const CHANGE_REFUSED: &str = "ChangeRefused";
/// `UpToDate` reason: the backend failed to apply a change.
pub const CHANGE_FAILED: &str = "ChangeFailed";
/// `UpToDate` reason: a change was handed to the backend and is not read back yet.
pub const APPLYING: &str = "Applying";

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::api::infra::{MachineAddress, MachineAddressType};
    use crate::backend::Pending;
    use k8s_openapi::jiff::Timestamp;

    fn now(s: i64) -> Time {
        Time(Timestamp::from_second(s).unwrap())
    }

    fn running() -> MachineObservation {
        MachineObservation {
            provider_id: Some("libvirt://1".into()),
            power_state: Some(PowerState::PoweredOn),
            addresses: vec![MachineAddress {
                type_: MachineAddressType::InternalIp,
                address: "10.0.0.2".into(),
            }],
            failure_domain: Some("a".into()),
            backend_ref: Some("dom-1".into()),
            ..Default::default()
        }
    }

    /// The status after `outcome` at second `at`, for a powered-on machine of generation 1.
    fn on(previous: Option<&MachineStatus>, outcome: Outcome<'_>, at: i64) -> MachineStatus {
        compute(previous, PowerState::PoweredOn, Some(1), outcome, &now(at))
    }

    fn ready(status: &MachineStatus) -> (&str, &str) {
        let c = conditions::get(&status.conditions, "Ready").unwrap();
        (c.status.as_str(), c.reason.as_str())
    }

    #[test]
    fn pending_then_ready_then_stable() {
        let creating = MachineObservation {
            pending: Some(Pending {
                operation: "Creating".into(),
                task: Some("t1".into()),
                retry_after: Duration::from_secs(1),
            }),
            provider_id: None,
            power_state: None,
            ..Default::default()
        };
        let s1 = on(None, Outcome::Observed(&creating), 1);
        assert_eq!(ready(&s1), ("False", "Creating"));
        assert_eq!(s1.initialization.as_ref().unwrap().provisioned, Some(false));
        let s2 = on(Some(&s1), Outcome::Observed(&running()), 2);
        assert_eq!(ready(&s2), ("True", "Ready"));
        assert_eq!(s2.initialization.as_ref().unwrap().provisioned, Some(true));
        assert_eq!(s2.addresses.len(), 1);
        assert_eq!(on(Some(&s2), Outcome::Observed(&running()), 9), s2);
    }

    #[test]
    fn provisioned_never_flips_back_and_errors_are_classified() {
        let s = on(None, Outcome::Observed(&running()), 1);
        let transient = BackendError::transient("Unreachable", "connection reset");
        let s = on(Some(&s), Outcome::Failed(&transient), 2);
        assert_eq!(ready(&s), ("False", "Unreachable"));
        assert_eq!(s.initialization.as_ref().unwrap().provisioned, Some(true));
        let terminal = BackendError::terminal("TemplateNotFound", "no template ubuntu");
        let s = on(Some(&s), Outcome::Failed(&terminal), 3);
        assert_eq!(ready(&s), ("False", TERMINAL_FAILURE));
        assert!(
            conditions::get(&s.conditions, "Ready")
                .unwrap()
                .message
                .contains("TemplateNotFound: no template")
        );
    }

    #[test]
    fn a_refused_delete_says_why_whatever_its_class() {
        let s = on(None, Outcome::Observed(&running()), 1);
        for error in [
            BackendError::transient("Unreachable", "connection reset"),
            BackendError::terminal("PermissionDenied", "VM.Allocate on /vms/100"),
        ] {
            let d = on(Some(&s), Outcome::DeleteFailed(&error), 2);
            assert_eq!(ready(&d), ("False", DELETE_FAILED));
            let message = &conditions::get(&d.conditions, "Ready").unwrap().message;
            assert_eq!(*message, format!("{}: {}", error.reason, error.message));
            assert_eq!(d.addresses, s.addresses, "what was observed stays");
        }
    }

    #[test]
    fn power_mismatch_and_pause() {
        let s = compute(
            None,
            PowerState::PoweredOff,
            Some(1),
            Outcome::Observed(&running()),
            &now(1),
        );
        assert_eq!(ready(&s), ("False", "PowerStateMismatch"));
        assert_eq!(
            conditions::get(&s.conditions, "Ready").unwrap().message,
            "want PoweredOff, the backend reports PoweredOn"
        );
        let p = compute(
            Some(&s),
            PowerState::PoweredOff,
            Some(1),
            Outcome::Paused {
                message: "cluster paused",
            },
            &now(2),
        );
        assert!(conditions::is_true(&p.conditions, "Paused"));
        assert_eq!(
            ready(&p),
            ("False", "PowerStateMismatch"),
            "pausing keeps the last Ready"
        );
    }
}
