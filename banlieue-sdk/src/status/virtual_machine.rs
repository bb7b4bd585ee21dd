//! VirtualMachine status: scheduling, the infra machine's status mirrored back, power
//! state, migration, the class its machine is built from, and the `Ready` summary.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::common::{PowerState, TypedLocalObjectReference};
use crate::api::infra::MachineStatus;
use crate::api::virtual_machine::{
    BuiltFromClass, ScheduledPlacement, VirtualMachinePhase, VirtualMachineStatus,
};
use crate::conditions::{self, Desired, Status, types};

use super::TERMINAL_FAILURE;

/// The scheduling outcome to record.
#[derive(Clone, Copy, Debug)]
pub enum Scheduling<'a> {
    /// Placed here (new, kept, or the target of a move).
    Placed(&'a ScheduledPlacement),
    /// Cannot be placed, or its class/image/Provider is missing.
    Unschedulable {
        /// CamelCase reason (`ClassNotFound`, `ImageNotFound`, `NoFeasibleProvider`, ...).
        reason: &'a str,
        /// What to fix.
        message: &'a str,
    },
}

/// The infra machine as the VM controller sees it.
#[derive(Clone, Copy, Debug)]
pub struct Infra<'a> {
    /// Reference to it.
    pub reference: &'a TypedLocalObjectReference,
    /// Its `spec.providerID`.
    pub provider_id: Option<&'a str>,
    /// Its status.
    pub status: Option<&'a MachineStatus>,
}

/// A move in progress, or one refused before anything moved.
#[derive(Clone, Copy, Debug)]
pub struct Migration<'a> {
    /// CamelCase step, e.g. `RemovingOldMachine`, or why it was refused.
    pub reason: &'a str,
    /// Details (from where to where).
    pub message: &'a str,
    /// `false` when the move was refused before anything was touched: `Migrating` is
    /// `False` with the reason, and the VM goes on reporting the machine it has.
    pub moving: bool,
}

/// Whether a bound VM's placement still matches (see [`crate::scheduling::Drift`]).
#[derive(Clone, Copy, Debug, Default)]
pub enum PlacementDrift<'a> {
    /// Not looked at by this reconcile: `PlacementDrifted` stays as it is.
    #[default]
    NotChecked,
    /// It matches: `PlacementDrifted` turns `False` if it was `True`.
    Matches,
    /// Another object changed: `PlacementDrifted=True`.
    Drifted {
        /// CamelCase reason, e.g. `ProviderLabelsChanged`.
        reason: &'a str,
        /// What changed, and that nothing moves.
        message: &'a str,
    },
}

/// Whether the VM's machine is built from its VMClass as the class is now.
#[derive(Clone, Copy, Debug, Default)]
pub enum ClassTrack<'a> {
    /// Not looked at by this reconcile: `status.class` and `ClassUpToDate` stay as
    /// they are.
    #[default]
    NotChecked,
    /// Built from the class as it is: `ClassUpToDate=True`.
    Current {
        /// The class's name.
        name: &'a str,
        /// Its generation.
        generation: Option<i64>,
        /// For humans.
        message: &'a str,
    },
    /// Built from the class as it was (the class was edited since and keeps its VMs as
    /// they are): `ClassUpToDate=False`, reason [`CLASS_CHANGED`].
    Kept {
        /// The class's name.
        name: &'a str,
        /// Its generation when the machine was built from it.
        generation: Option<i64>,
        /// What changed, and what to do.
        message: &'a str,
    },
}

/// `ClassUpToDate`'s reason when the class was edited and the VM keeps what it was
/// built with.
pub const CLASS_CHANGED: &str = "ClassChanged";
/// `ClassUpToDate`'s reason when the VM's machine is built from its class as it is.
pub const CLASS_CURRENT: &str = "Current";

/// `PlacementDrifted`'s reason once the placement matches again.
pub const PLACEMENT_MATCHES: &str = "Matches";

/// Everything the VM's status depends on.
#[derive(Clone, Copy, Debug)]
pub struct Input<'a> {
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// The desired power state.
    pub desired_power: PowerState,
    /// Scheduling outcome.
    pub scheduling: Scheduling<'a>,
    /// The infra machine, once it exists.
    pub infra: Option<Infra<'a>>,
    /// A move in progress.
    pub migration: Option<Migration<'a>>,
    /// Why the infra machine cannot be made yet (reason, message), e.g. a missing
    /// bootstrap Secret.
    pub waiting: Option<(&'a str, &'a str)>,
    /// The VM is being deleted.
    pub deleting: bool,
    /// Whether its placement still matches.
    pub drift: PlacementDrift<'a>,
    /// Whether its machine is built from its class as the class is now.
    pub class: ClassTrack<'a>,
}

/// The status after one reconcile.
pub fn compute(
    previous: Option<&VirtualMachineStatus>,
    input: &Input<'_>,
    now: &Time,
) -> VirtualMachineStatus {
    let mut status = previous.cloned().unwrap_or_default();
    let generation = input.generation;
    status.observed_generation = generation;
    let set = |status: &mut VirtualMachineStatus, d: Desired<'_>| {
        conditions::set(&mut status.conditions, d, generation, now)
    };

    let scheduled = match input.scheduling {
        Scheduling::Placed(placement) => {
            match status.placement.as_mut() {
                Some(p) if same_place(p, placement) => {
                    // What it was decided from is recorded when given (a placement
                    // kept while a refused move is reported keeps its own).
                    if placement.basis.is_some() && p.basis != placement.basis {
                        p.basis = placement.basis.clone();
                    }
                }
                _ => {
                    status.placement = Some(ScheduledPlacement {
                        scheduled_at: placement.scheduled_at.clone().or_else(|| Some(now.clone())),
                        ..placement.clone()
                    });
                }
            }
            let message = format!(
                "on Provider {}{}",
                placement.provider,
                placement
                    .failure_domain
                    .as_deref()
                    .map(|fd| format!(", failure domain {fd}"))
                    .unwrap_or_default()
            );
            set(
                &mut status,
                Desired::new(types::SCHEDULED, Status::True, "Scheduled").message(&message),
            );
            true
        }
        Scheduling::Unschedulable { reason, message } => {
            set(
                &mut status,
                Desired::new(types::SCHEDULED, Status::False, reason).message(message),
            );
            false
        }
    };

    let moving = input.migration.is_some_and(|m| m.moving);
    match &input.migration {
        Some(m) => {
            set(
                &mut status,
                Desired::new(types::MIGRATING, Status::from_bool(m.moving), m.reason)
                    .message(m.message),
            );
        }
        None => {
            if let Some((reason, message)) = move_ended(&status, previous, input.scheduling) {
                set(
                    &mut status,
                    Desired::new(types::MIGRATING, Status::False, reason).message(&message),
                );
            }
        }
    }

    match input.drift {
        PlacementDrift::NotChecked => {}
        PlacementDrift::Drifted { reason, message } => {
            set(
                &mut status,
                Desired::new(types::PLACEMENT_DRIFTED, Status::True, reason).message(message),
            );
        }
        PlacementDrift::Matches => {
            if conditions::is_true(&status.conditions, types::PLACEMENT_DRIFTED) {
                let on = status
                    .placement
                    .as_ref()
                    .map(|p| p.provider.clone())
                    .unwrap_or_default();
                set(
                    &mut status,
                    Desired::new(types::PLACEMENT_DRIFTED, Status::False, PLACEMENT_MATCHES)
                        .message(&format!("the placement on Provider {on} matches again")),
                );
            }
        }
    }

    match input.class {
        ClassTrack::NotChecked => {}
        ClassTrack::Current {
            name,
            generation,
            message,
        } => {
            status.class = Some(BuiltFromClass {
                name: name.to_owned(),
                generation,
            });
            set(
                &mut status,
                Desired::new(types::CLASS_UP_TO_DATE, Status::True, CLASS_CURRENT).message(message),
            );
        }
        ClassTrack::Kept {
            name,
            generation,
            message,
        } => {
            status.class = Some(BuiltFromClass {
                name: name.to_owned(),
                generation,
            });
            set(
                &mut status,
                Desired::new(types::CLASS_UP_TO_DATE, Status::False, CLASS_CHANGED)
                    .message(message),
            );
        }
    }

    let infra_ready = mirror_infra(&mut status, input.infra, moving);
    // Whether the machine runs with what the class asks is the infra machine's to say:
    // mirrored as it says it.
    for type_ in [types::UP_TO_DATE, types::RESTART_REQUIRED] {
        let said = input
            .infra
            .and_then(|i| i.status)
            .and_then(|s| conditions::get(&s.conditions, type_));
        if let Some(c) = said {
            let s = match c.status.as_str() {
                "True" => Status::True,
                "False" => Status::False,
                _ => Status::Unknown,
            };
            set(
                &mut status,
                Desired::new(type_, s, &c.reason).message(&c.message),
            );
        }
    }
    match (infra_ready, input.waiting) {
        // The machine cannot be updated until what is missing comes back: say that,
        // not what the machine said before (it may be a cause fixed since, which the
        // machine learns only once it is updated).
        (Some((_, reason, message)), Some((waiting, why))) => {
            let message = if message.is_empty() {
                format!(
                    "{why}; the infrastructure machine is not updated until then (it reports {reason})"
                )
            } else {
                format!(
                    "{why}; the infrastructure machine is not updated until then (it reports {reason}: {message})"
                )
            };
            set(
                &mut status,
                Desired::new(types::INFRASTRUCTURE_READY, Status::False, waiting).message(&message),
            );
        }
        (Some((ready, reason, message)), None) => {
            set(
                &mut status,
                Desired::new(types::INFRASTRUCTURE_READY, ready, &reason).message(&message),
            );
        }
        (None, waiting) => {
            let (reason, message) = waiting.unwrap_or(("WaitingForInfrastructure", ""));
            set(
                &mut status,
                Desired::new(types::INFRASTRUCTURE_READY, Status::False, reason).message(message),
            );
        }
    }

    let power_ok = status.power_state == Some(input.desired_power);
    let power_message = format!(
        "want {}, {}",
        input.desired_power.as_str(),
        match status.power_state {
            Some(p) => format!("observed {}", p.as_str()),
            None => "no power state observed yet".to_owned(),
        }
    );
    set(
        &mut status,
        Desired::new(
            types::POWER_STATE,
            Status::from_bool(power_ok),
            if power_ok { "Matches" } else { "Converging" },
        )
        .message(if power_ok { "" } else { &power_message }),
    );

    let infra_true = conditions::is_true(&status.conditions, types::INFRASTRUCTURE_READY);
    let (ready, reason) = match () {
        _ if input.deleting => (false, "Deleting"),
        _ if !scheduled => (false, "NotScheduled"),
        _ if moving => (false, "Migrating"),
        _ if !infra_true => (false, "InfrastructureNotReady"),
        _ if !power_ok => (false, "PowerStateConverging"),
        _ => (true, "Ready"),
    };
    set(
        &mut status,
        Desired::new(types::READY, Status::from_bool(ready), reason),
    );
    status.phase = Some(phase(&status, input, scheduled));
    status
}

/// `Completed`: a move ended where it was going.
pub const MOVE_COMPLETED: &str = "Completed";
/// `Withdrawn`: a move in progress, or refused, is no longer asked for: the VM stays
/// (or is back) where it was.
pub const MOVE_WITHDRAWN: &str = "Withdrawn";

/// The `Migrating` condition a reconcile that moves nothing leaves: a move in progress
/// or refused ended (how, and where the VM is), else `None` (nothing to change).
fn move_ended(
    status: &VirtualMachineStatus,
    previous: Option<&VirtualMachineStatus>,
    scheduling: Scheduling<'_>,
) -> Option<(&'static str, String)> {
    let migrating = conditions::get(&status.conditions, types::MIGRATING)?;
    if migrating.status == "False"
        && (migrating.reason == MOVE_COMPLETED || migrating.reason == MOVE_WITHDRAWN)
    {
        return None;
    }
    let Scheduling::Placed(here) = scheduling else {
        return None;
    };
    let was_going = previous.and_then(|p| p.placement.as_ref());
    Some(if migrating.status == "True" {
        match was_going {
            Some(to) if to.provider != here.provider => (
                MOVE_WITHDRAWN,
                format!(
                    "the move to Provider {} was withdrawn (spec.placement no longer asks for it);                      the VM is on Provider {}",
                    to.provider, here.provider
                ),
            ),
            _ => (
                MOVE_COMPLETED,
                format!("moved: the VM is on Provider {}", here.provider),
            ),
        }
    } else {
        (
            MOVE_WITHDRAWN,
            format!(
                "the move refused before ({}) is no longer asked for; the VM stays on Provider {}",
                migrating.reason, here.provider
            ),
        )
    })
}

fn same_place(a: &ScheduledPlacement, b: &ScheduledPlacement) -> bool {
    a.provider == b.provider
        && a.failure_domain == b.failure_domain
        && a.provider_class == b.provider_class
}

/// Copies the infra machine's state; returns the `InfrastructureReady` condition.
fn mirror_infra(
    status: &mut VirtualMachineStatus,
    infra: Option<Infra<'_>>,
    migrating: bool,
) -> Option<(Status, String, String)> {
    let Some(infra) = infra else {
        if migrating {
            status.addresses.clear();
            status.power_state = None;
            status.provider_id = None;
            status.resources = None;
        }
        status.infrastructure_ref = None;
        return None;
    };
    status.infrastructure_ref = Some(infra.reference.clone());
    status.provider_id = infra.provider_id.map(str::to_owned);
    let machine = infra.status.cloned().unwrap_or_default();
    status.addresses = machine.addresses.clone();
    status.power_state = machine.power_state;
    status.resources = machine.resources.clone();
    let ready = conditions::get(&machine.conditions, types::READY);
    Some(match ready {
        Some(c) => {
            let s = match c.status.as_str() {
                "True" => Status::True,
                "False" => Status::False,
                _ => Status::Unknown,
            };
            (s, c.reason.clone(), c.message.clone())
        }
        None => (
            Status::False,
            "WaitingForInfrastructure".into(),
            String::new(),
        ),
    })
}

/// Whether the status `input` leads to is worth a write.
///
/// A VM without a status yet that is placed and whose infra machine has not reported
/// would only get a status saying where it was scheduled, which the `Scheduled` Event
/// already says. Its first write waits for the infra machine's first report: with a
/// fast backend that report is already Ready, so the VM's status is written once
/// instead of three or four times (the scale benchmark counted 4.45 writes per VM).
/// Anything else (not schedulable, waiting for a Secret, moving, a status to update)
/// is written at once.
pub fn worth_writing(previous: Option<&VirtualMachineStatus>, input: &Input<'_>) -> bool {
    let quiet_progress = matches!(input.scheduling, Scheduling::Placed(_))
        && input.migration.is_none()
        && input.waiting.is_none()
        && !input.deleting
        && input.infra.is_none_or(|infra| infra.status.is_none());
    previous.is_some() || !quiet_progress
}

fn phase(status: &VirtualMachineStatus, input: &Input<'_>, scheduled: bool) -> VirtualMachinePhase {
    let infra_reason =
        conditions::get(&status.conditions, types::INFRASTRUCTURE_READY).map(|c| c.reason.as_str());
    if input.deleting {
        VirtualMachinePhase::Deleting
    } else if input.migration.is_some_and(|m| m.moving) {
        VirtualMachinePhase::Migrating
    } else if !scheduled && status.infrastructure_ref.is_none() {
        // Not placed and nothing built. A VM whose machine exists but that cannot be
        // placed again (its class or image deleted, say) still runs where it is: its
        // phase follows the machine, `Scheduled` says why it cannot be changed.
        VirtualMachinePhase::Pending
    } else if infra_reason == Some(TERMINAL_FAILURE) {
        VirtualMachinePhase::Failed
    } else if status.provider_id.is_none() {
        VirtualMachinePhase::Provisioning
    } else {
        match status.power_state {
            Some(PowerState::PoweredOn) => VirtualMachinePhase::Running,
            Some(PowerState::PoweredOff | PowerState::Suspended) => VirtualMachinePhase::Stopped,
            None => VirtualMachinePhase::Provisioning,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::common::ProviderClass;
    use crate::api::infra::{Initialization, MachineAddress, MachineAddressType};
    use k8s_openapi::jiff::Timestamp;

    fn now(s: i64) -> Time {
        Time(Timestamp::from_second(s).unwrap())
    }

    fn placement() -> ScheduledPlacement {
        ScheduledPlacement {
            provider: "p".into(),
            provider_class: Some(ProviderClass::Sim),
            failure_domain: Some("a".into()),
            ..Default::default()
        }
    }

    fn reference() -> TypedLocalObjectReference {
        TypedLocalObjectReference {
            api_group: "infrastructure.banlieue.io".into(),
            kind: "LibvirtMachine".into(),
            name: "v".into(),
        }
    }

    fn machine_ready() -> MachineStatus {
        let mut s = MachineStatus {
            initialization: Some(Initialization {
                provisioned: Some(true),
            }),
            addresses: vec![MachineAddress {
                type_: MachineAddressType::InternalIp,
                address: "10.0.0.9".into(),
            }],
            power_state: Some(PowerState::PoweredOn),
            ..Default::default()
        };
        conditions::set(
            &mut s.conditions,
            Desired::new("Ready", Status::True, "Ready"),
            Some(1),
            &now(0),
        );
        s
    }

    #[test]
    fn ready_when_scheduled_infra_ready_and_power_matches() {
        let p = placement();
        let r = reference();
        let m = machine_ready();
        let input = Input {
            generation: Some(3),
            desired_power: PowerState::PoweredOn,
            scheduling: Scheduling::Placed(&p),
            infra: Some(Infra {
                reference: &r,
                provider_id: Some("libvirt://x"),
                status: Some(&m),
            }),
            migration: None,
            waiting: None,
            deleting: false,
            drift: PlacementDrift::NotChecked,
            class: ClassTrack::NotChecked,
        };
        let s1 = compute(None, &input, &now(5));
        assert!(
            conditions::is_true(&s1.conditions, "Ready"),
            "{:?}",
            s1.conditions
        );
        assert_eq!(s1.phase, Some(VirtualMachinePhase::Running));
        assert_eq!(s1.provider_id.as_deref(), Some("libvirt://x"));
        assert_eq!(s1.addresses[0].address, "10.0.0.9");
        assert_eq!(s1.placement.as_ref().unwrap().scheduled_at, Some(now(5)));
        assert_eq!(
            compute(Some(&s1), &input, &now(99)),
            s1,
            "no churn: scheduledAt and transition times stay"
        );
    }

    #[test]
    fn unschedulable_and_migrating_are_not_ready() {
        let input = Input {
            generation: Some(1),
            desired_power: PowerState::PoweredOn,
            scheduling: Scheduling::Unschedulable {
                reason: "ClassNotFound",
                message: "VMClass \"x\" not found",
            },
            infra: None,
            migration: None,
            waiting: None,
            deleting: false,
            drift: PlacementDrift::NotChecked,
            class: ClassTrack::NotChecked,
        };
        let s = compute(None, &input, &now(1));
        let scheduled = conditions::get(&s.conditions, "Scheduled").unwrap();
        assert_eq!(
            (scheduled.status.as_str(), scheduled.reason.as_str()),
            ("False", "ClassNotFound")
        );
        assert_eq!(s.phase, Some(VirtualMachinePhase::Pending));

        let p = placement();
        let moving = Input {
            scheduling: Scheduling::Placed(&p),
            migration: Some(Migration {
                reason: "RemovingOldMachine",
                message: "p0 -> p",
                moving: true,
            }),
            ..input
        };
        let s = compute(Some(&s), &moving, &now(2));
        assert!(conditions::is_true(&s.conditions, "Migrating"));
        assert_eq!(s.phase, Some(VirtualMachinePhase::Migrating));
        assert!(!conditions::is_true(&s.conditions, "Ready"));
        let done = compute(
            Some(&s),
            &Input {
                migration: None,
                ..moving
            },
            &now(3),
        );
        assert_eq!(
            conditions::get(&done.conditions, "Migrating")
                .unwrap()
                .status,
            "False"
        );
    }

    #[test]
    fn a_refused_move_says_why_and_the_vm_stays_ready_where_it_is() {
        let p = placement();
        let r = reference();
        let m = machine_ready();
        let refused = Input {
            generation: Some(2),
            desired_power: PowerState::PoweredOn,
            scheduling: Scheduling::Placed(&p),
            infra: Some(Infra {
                reference: &r,
                provider_id: Some("libvirt://x"),
                status: Some(&m),
            }),
            migration: Some(Migration {
                reason: "CopyDiskUnsupported",
                message: "p -> q: ...",
                moving: false,
            }),
            waiting: None,
            deleting: false,
            drift: PlacementDrift::NotChecked,
            class: ClassTrack::NotChecked,
        };
        let s = compute(None, &refused, &now(1));
        let migrating = conditions::get(&s.conditions, "Migrating").unwrap();
        assert_eq!(
            (migrating.status.as_str(), migrating.reason.as_str()),
            ("False", "CopyDiskUnsupported")
        );
        assert!(
            conditions::is_true(&s.conditions, "Ready"),
            "{:?}",
            s.conditions
        );
        assert_eq!(s.phase, Some(VirtualMachinePhase::Running));
        assert_eq!(
            s.provider_id.as_deref(),
            Some("libvirt://x"),
            "still the old machine"
        );
    }

    #[test]
    fn the_first_write_waits_for_the_infra_machines_first_report() {
        let p = placement();
        let r = reference();
        let m = machine_ready();
        let placed = Input {
            generation: Some(1),
            desired_power: PowerState::PoweredOn,
            scheduling: Scheduling::Placed(&p),
            infra: None,
            migration: None,
            waiting: None,
            deleting: false,
            drift: PlacementDrift::NotChecked,
            class: ClassTrack::NotChecked,
        };
        let built = Input {
            infra: Some(Infra {
                reference: &r,
                provider_id: Some("libvirt://x"),
                status: None,
            }),
            ..placed
        };
        let reported = Input {
            infra: Some(Infra {
                status: Some(&m),
                ..built.infra.unwrap()
            }),
            ..placed
        };
        let table: [(&str, Option<&VirtualMachineStatus>, Input<'_>, bool); 8] = [
            ("placed, no machine yet", None, placed, false),
            ("machine built, not reported", None, built, false),
            ("machine reported", None, reported, true),
            (
                "unschedulable",
                None,
                Input {
                    scheduling: Scheduling::Unschedulable {
                        reason: "ClassNotFound",
                        message: "m",
                    },
                    ..placed
                },
                true,
            ),
            (
                "waiting for a Secret",
                None,
                Input {
                    waiting: Some(("BootstrapDataNotFound", "m")),
                    ..placed
                },
                true,
            ),
            (
                "moving",
                None,
                Input {
                    migration: Some(Migration {
                        reason: "RemovingOldMachine",
                        message: "m",
                        moving: true,
                    }),
                    ..placed
                },
                true,
            ),
            (
                "deleting",
                None,
                Input {
                    deleting: true,
                    ..placed
                },
                true,
            ),
            (
                "a status to update",
                Some(&VirtualMachineStatus::default()),
                built,
                true,
            ),
        ];
        for (case, previous, input, want) in table {
            assert_eq!(worth_writing(previous, &input), want, "{case}");
        }
    }
    #[test]
    fn what_blocks_the_machine_is_shown_not_what_the_machine_said_before() {
        let p = placement();
        let r = reference();
        let mut m = machine_ready();
        conditions::set(
            &mut m.conditions,
            Desired::new("Ready", Status::False, TERMINAL_FAILURE)
                .message("TemplateNotFound: no template debian"),
            Some(1),
            &now(1),
        );
        let input = Input {
            generation: Some(2),
            desired_power: PowerState::PoweredOn,
            scheduling: Scheduling::Placed(&p),
            infra: Some(Infra {
                reference: &r,
                provider_id: Some("libvirt://x"),
                status: Some(&m),
            }),
            migration: None,
            waiting: Some(("BootstrapDataNotFound", "bootstrap Secret ud not found")),
            deleting: false,
            drift: PlacementDrift::NotChecked,
            class: ClassTrack::NotChecked,
        };
        let s = compute(None, &input, &now(2));
        let infra = conditions::get(&s.conditions, "InfrastructureReady").unwrap();
        assert_eq!(
            (infra.status.as_str(), infra.reason.as_str()),
            ("False", "BootstrapDataNotFound")
        );
        assert!(
            infra.message.starts_with("bootstrap Secret ud not found; "),
            "{}",
            infra.message
        );
        assert!(
            infra.message.contains("TemplateNotFound"),
            "what the machine says is kept as context: {}",
            infra.message
        );
        let fixed = compute(
            Some(&s),
            &Input {
                waiting: None,
                infra: Some(Infra {
                    status: Some(&machine_ready()),
                    ..input.infra.unwrap()
                }),
                ..input
            },
            &now(3),
        );
        let infra = conditions::get(&fixed.conditions, "InfrastructureReady").unwrap();
        assert_eq!(
            (infra.reason.as_str(), infra.message.as_str()),
            ("Ready", "")
        );
    }

    #[test]
    fn a_running_vm_whose_class_is_gone_stays_running() {
        let r = reference();
        let m = machine_ready();
        let input = Input {
            generation: Some(2),
            desired_power: PowerState::PoweredOn,
            scheduling: Scheduling::Unschedulable {
                reason: "ClassNotFound",
                message: "VMClass small not found",
            },
            infra: Some(Infra {
                reference: &r,
                provider_id: Some("libvirt://x"),
                status: Some(&m),
            }),
            migration: None,
            waiting: None,
            deleting: false,
            drift: PlacementDrift::NotChecked,
            class: ClassTrack::NotChecked,
        };
        let s = compute(None, &input, &now(1));
        assert_eq!(s.phase, Some(VirtualMachinePhase::Running));
        let scheduled = conditions::get(&s.conditions, "Scheduled").unwrap();
        assert_eq!(scheduled.reason, "ClassNotFound");
        assert!(!conditions::is_true(&s.conditions, "Ready"));
        let nothing_built = compute(
            None,
            &Input {
                infra: None,
                ..input
            },
            &now(1),
        );
        assert_eq!(nothing_built.phase, Some(VirtualMachinePhase::Pending));
    }

    #[test]
    fn a_move_ends_saying_how_and_where_the_vm_is() {
        let from = placement();
        let to = ScheduledPlacement {
            provider: "q".into(),
            ..placement()
        };
        let r = reference();
        let m = machine_ready();
        let base = Input {
            generation: Some(2),
            desired_power: PowerState::PoweredOn,
            scheduling: Scheduling::Placed(&to),
            infra: Some(Infra {
                reference: &r,
                provider_id: Some("libvirt://x"),
                status: Some(&m),
            }),
            migration: Some(Migration {
                reason: "RemovingOldMachine",
                message: "p -> q",
                moving: true,
            }),
            waiting: None,
            deleting: false,
            drift: PlacementDrift::NotChecked,
            class: ClassTrack::NotChecked,
        };
        let moving = compute(None, &base, &now(1));
        let ended = |s: &VirtualMachineStatus| {
            let c = conditions::get(&s.conditions, "Migrating").unwrap();
            (c.status.clone(), c.reason.clone(), c.message.clone())
        };
        let done = compute(
            Some(&moving),
            &Input {
                migration: None,
                ..base
            },
            &now(2),
        );
        assert_eq!(
            ended(&done),
            (
                "False".into(),
                "Completed".into(),
                "moved: the VM is on Provider q".into()
            )
        );
        assert_eq!(
            compute(
                Some(&done),
                &Input {
                    migration: None,
                    ..base
                },
                &now(3)
            ),
            done,
            "no churn"
        );
        // Put back while moving: back on p.
        let back = compute(
            Some(&moving),
            &Input {
                scheduling: Scheduling::Placed(&from),
                migration: None,
                ..base
            },
            &now(2),
        );
        assert_eq!(ended(&back).1, "Withdrawn");
        assert!(
            ended(&back).2.contains("move to Provider q was withdrawn"),
            "{:?}",
            ended(&back)
        );
        // Refused, then no longer asked for.
        let refused = compute(
            None,
            &Input {
                scheduling: Scheduling::Placed(&from),
                migration: Some(Migration {
                    reason: "CopyDiskUnsupported",
                    message: "p -> q: ...",
                    moving: false,
                }),
                ..base
            },
            &now(1),
        );
        let dropped = compute(
            Some(&refused),
            &Input {
                scheduling: Scheduling::Placed(&from),
                migration: None,
                ..base
            },
            &now(2),
        );
        assert_eq!(ended(&dropped).1, "Withdrawn");
        assert!(
            ended(&dropped).2.contains("CopyDiskUnsupported")
                && ended(&dropped).2.contains("stays on Provider p"),
            "{:?}",
            ended(&dropped)
        );
    }

    #[test]
    fn a_class_moved_on_is_shown_without_touching_ready() {
        let p = placement();
        let r = reference();
        let m = machine_ready();
        let base = Input {
            generation: Some(1),
            desired_power: PowerState::PoweredOn,
            scheduling: Scheduling::Placed(&p),
            infra: Some(Infra {
                reference: &r,
                provider_id: Some("libvirt://x"),
                status: Some(&m),
            }),
            migration: None,
            waiting: None,
            deleting: false,
            drift: PlacementDrift::Matches,
            class: ClassTrack::Current {
                name: "small",
                generation: Some(1),
                message: "built from VMClass small as it is (generation 1)",
            },
        };
        let current = compute(None, &base, &now(1));
        let c = conditions::get(&current.conditions, "ClassUpToDate").unwrap();
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", "Current"));
        let built = |s: &VirtualMachineStatus| s.class.clone().map(|c| (c.name, c.generation));
        assert_eq!(built(&current), Some(("small".into(), Some(1))));
        let kept = compute(
            Some(&current),
            &Input {
                class: ClassTrack::Kept {
                    name: "small",
                    generation: Some(1),
                    message: "VMClass small changed ... (generation 1 → 2: cpus 2 → 4)",
                },
                ..base
            },
            &now(2),
        );
        let c = conditions::get(&kept.conditions, "ClassUpToDate").unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "ClassChanged")
        );
        assert!(c.message.contains("cpus 2 → 4"), "{}", c.message);
        assert_eq!(
            built(&kept),
            Some(("small".into(), Some(1))),
            "the generation built from"
        );
        assert!(
            conditions::is_true(&kept.conditions, "Ready"),
            "it runs as it was made: Ready"
        );
        let unchecked = compute(
            Some(&kept),
            &Input {
                class: ClassTrack::NotChecked,
                ..base
            },
            &now(3),
        );
        assert_eq!(unchecked, kept, "a reconcile that did not look keeps it");
    }

    #[test]
    fn a_drift_is_shown_without_touching_ready_and_cleared_once_it_matches() {
        let p = placement();
        let r = reference();
        let m = machine_ready();
        let base = Input {
            generation: Some(1),
            desired_power: PowerState::PoweredOn,
            scheduling: Scheduling::Placed(&p),
            infra: Some(Infra {
                reference: &r,
                provider_id: Some("libvirt://x"),
                status: Some(&m),
            }),
            migration: None,
            waiting: None,
            deleting: false,
            drift: PlacementDrift::Matches,
            class: ClassTrack::NotChecked,
        };
        let clean = compute(None, &base, &now(1));
        assert!(
            conditions::get(&clean.conditions, "PlacementDrifted").is_none(),
            "absent until it happens"
        );
        let drifted = compute(
            Some(&clean),
            &Input {
                drift: PlacementDrift::Drifted {
                    reason: "ProviderLabelsChanged",
                    message: "Provider p no longer matches",
                },
                ..base
            },
            &now(2),
        );
        let c = conditions::get(&drifted.conditions, "PlacementDrifted").unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", "ProviderLabelsChanged")
        );
        assert!(conditions::is_true(&drifted.conditions, "Ready"));
        let unchecked = compute(
            Some(&drifted),
            &Input {
                drift: PlacementDrift::NotChecked,
                class: ClassTrack::NotChecked,
                ..base
            },
            &now(3),
        );
        assert_eq!(
            unchecked, drifted,
            "a reconcile that did not check keeps it"
        );
        let fixed = compute(Some(&drifted), &base, &now(4));
        let c = conditions::get(&fixed.conditions, "PlacementDrifted").unwrap();
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "Matches"));
    }

    #[test]
    fn the_basis_is_recorded_with_the_placement_and_kept_when_not_given() {
        let mut with_basis = placement();
        with_basis.basis = Some(crate::api::virtual_machine::PlacementBasis {
            class_ref: "small".into(),
            image_ref: "debian".into(),
            ..Default::default()
        });
        let input = Input {
            generation: Some(1),
            desired_power: PowerState::PoweredOn,
            scheduling: Scheduling::Placed(&with_basis),
            infra: None,
            migration: None,
            waiting: None,
            deleting: false,
            drift: PlacementDrift::NotChecked,
            class: ClassTrack::NotChecked,
        };
        let s = compute(Some(&VirtualMachineStatus::default()), &input, &now(1));
        assert_eq!(s.placement.as_ref().unwrap().basis, with_basis.basis);
        let without = placement();
        let kept = compute(
            Some(&s),
            &Input {
                scheduling: Scheduling::Placed(&without),
                ..input
            },
            &now(2),
        );
        assert_eq!(kept.placement.unwrap().basis, with_basis.basis);
    }

    #[test]
    fn power_messages_read_as_the_api_spells_them() {
        let p = placement();
        let input = Input {
            generation: Some(1),
            desired_power: PowerState::PoweredOff,
            scheduling: Scheduling::Placed(&p),
            infra: None,
            migration: None,
            waiting: None,
            deleting: false,
            drift: PlacementDrift::NotChecked,
            class: ClassTrack::NotChecked,
        };
        let s = compute(None, &input, &now(1));
        let power = conditions::get(&s.conditions, "PowerState").unwrap();
        assert_eq!(
            power.message,
            "want PoweredOff, no power state observed yet"
        );
        let r = reference();
        let m = machine_ready();
        let s = compute(
            None,
            &Input {
                infra: Some(Infra {
                    reference: &r,
                    provider_id: Some("libvirt://x"),
                    status: Some(&m),
                }),
                ..input
            },
            &now(1),
        );
        let power = conditions::get(&s.conditions, "PowerState").unwrap();
        assert_eq!(power.message, "want PoweredOff, observed PoweredOn");
    }
}
