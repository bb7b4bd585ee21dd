//! Condition helpers in the Kubernetes (and Cluster API v1beta2) style: one entry per
//! type, `lastTransitionTime` moves only when the status flips, `observedGeneration`
//! records which spec the condition describes.
//!
//! [`set`] is the one way banlieue writes a condition, and so the chokepoint for
//! their messages: every message passes through the [`crate::scrub::global`]
//! scrubber here, whatever produced it (a backend error already scrubbed where it was
//! returned, or a message built from a Secret's content, an endpoint's answer, or a
//! value nobody thought of as secret).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Condition types banlieue writes.
pub mod types {
    /// Overall health; always present.
    pub const READY: &str = "Ready";
    /// Provider: the last connection to the backend worked.
    pub const REACHABLE: &str = "Reachable";
    /// VirtualMachine: a Provider and failure domain were chosen.
    pub const SCHEDULED: &str = "Scheduled";
    /// VirtualMachine: the infra machine is Ready.
    pub const INFRASTRUCTURE_READY: &str = "InfrastructureReady";
    /// VirtualMachine: the observed power state matches the desired one.
    pub const POWER_STATE: &str = "PowerState";
    /// VirtualMachine: moving to another Provider.
    pub const MIGRATING: &str = "Migrating";
    /// VirtualMachine: another object changed so that its placement no longer matches;
    /// it stays bound where it is (abnormal-true; present once it has happened).
    pub const PLACEMENT_DRIFTED: &str = "PlacementDrifted";
    /// CAPI objects: reconciliation is paused.
    pub const PAUSED: &str = "Paused";
    /// Infra machine and VirtualMachine: the machine runs with what its spec asks
    /// (`False` names each change not applied yet and what it waits for; `Unknown` when
    /// the backend does not read its resources back).
    pub const UP_TO_DATE: &str = "UpToDate";
    /// Infra machine and VirtualMachine: a change waits for a power cycle (abnormal-true;
    /// present once the machine's resources are read back).
    pub const RESTART_REQUIRED: &str = "RestartRequired";
    /// VirtualMachine: its machine is built from its VMClass as the class is now
    /// (`False`, reason `ClassChanged`: the class was edited since and its
    /// `updatePolicy` is `Keep`; the message names each field that differs).
    pub const CLASS_UP_TO_DATE: &str = "ClassUpToDate";
}

/// `True`, `False` or `Unknown`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// The condition holds.
    True,
    /// It does not.
    False,
    /// Not known yet.
    Unknown,
}

impl Status {
    /// The wire value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::True => "True",
            Self::False => "False",
            Self::Unknown => "Unknown",
        }
    }

    /// `True` when `holds`, else `False`.
    pub fn from_bool(holds: bool) -> Self {
        if holds { Self::True } else { Self::False }
    }
}

/// A condition to set, before timestamps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired<'a> {
    /// Condition type.
    pub type_: &'a str,
    /// Its status.
    pub status: Status,
    /// CamelCase reason.
    pub reason: &'a str,
    /// Human-readable message.
    pub message: &'a str,
}

impl<'a> Desired<'a> {
    /// A condition of `type_` with `status` and `reason`, no message.
    pub fn new(type_: &'a str, status: Status, reason: &'a str) -> Self {
        Self {
            type_,
            status,
            reason,
            message: "",
        }
    }

    /// With a message.
    pub fn message(mut self, message: &'a str) -> Self {
        self.message = message;
        self
    }
}

/// Sets a condition in `conditions`, its message scrubbed of every registered secret
/// value, keeping `lastTransitionTime` unless the status flips. Returns true when
/// anything changed.
pub fn set(
    conditions: &mut Vec<Condition>,
    desired: Desired<'_>,
    generation: Option<i64>,
    now: &Time,
) -> bool {
    let next = |last_transition_time: Time| Condition {
        type_: desired.type_.to_owned(),
        status: desired.status.as_str().to_owned(),
        reason: desired.reason.to_owned(),
        message: crate::scrub::global().scrub(desired.message).into_owned(),
        observed_generation: generation,
        last_transition_time,
    };
    match conditions.iter_mut().find(|c| c.type_ == desired.type_) {
        Some(existing) => {
            let time = if existing.status == desired.status.as_str() {
                existing.last_transition_time.clone()
            } else {
                now.clone()
            };
            let updated = next(time);
            if *existing == updated {
                false
            } else {
                *existing = updated;
                true
            }
        }
        None => {
            conditions.push(next(now.clone()));
            conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
            true
        }
    }
}

/// Removes a condition; true when one was there.
pub fn remove(conditions: &mut Vec<Condition>, type_: &str) -> bool {
    let before = conditions.len();
    conditions.retain(|c| c.type_ != type_);
    before != conditions.len()
}

/// The condition of `type_`, if present.
pub fn get<'c>(conditions: &'c [Condition], type_: &str) -> Option<&'c Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// True when the condition of `type_` is present with status `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    get(conditions, type_).is_some_and(|c| c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(seconds: i64) -> Time {
        Time(Timestamp::from_second(seconds).unwrap())
    }

    #[test]
    fn transition_time_moves_only_when_status_flips() {
        let mut conditions = Vec::new();
        assert!(set(
            &mut conditions,
            Desired::new("Ready", Status::False, "Provisioning"),
            Some(1),
            &at(10)
        ));
        assert!(set(
            &mut conditions,
            Desired::new("Ready", Status::False, "WaitingForAddress"),
            Some(1),
            &at(20)
        ));
        assert_eq!(
            conditions[0].last_transition_time,
            at(10),
            "same status keeps the time"
        );
        assert!(set(
            &mut conditions,
            Desired::new("Ready", Status::True, "Ready"),
            Some(1),
            &at(30)
        ));
        assert_eq!(conditions[0].last_transition_time, at(30));
        assert!(
            !set(
                &mut conditions,
                Desired::new("Ready", Status::True, "Ready"),
                Some(1),
                &at(40)
            ),
            "no change, no write"
        );
        assert_eq!(conditions[0].last_transition_time, at(30));
    }

    #[test]
    fn conditions_are_kept_sorted_and_unique() {
        let mut conditions = Vec::new();
        for t in ["Scheduled", "Ready", "Migrating", "Ready"] {
            set(
                &mut conditions,
                Desired::new(t, Status::True, "X"),
                None,
                &at(1),
            );
        }
        let types: Vec<_> = conditions.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, ["Migrating", "Ready", "Scheduled"]);
        assert!(remove(&mut conditions, "Migrating"));
        assert!(!remove(&mut conditions, "Migrating"));
        assert!(is_true(&conditions, "Ready"));
    }

    #[test]
    fn every_message_is_scrubbed_where_it_is_set() {
        // A message no backend produced (so nothing upstream scrubbed it): built from
        // a value that is registered as secret.
        let secret = "conditions-chokepoint-9d1e";
        crate::scrub::global().register("test/conditions", [secret]);
        let mut conditions = Vec::new();
        let message = format!(
            "the endpoint answered {} and refused",
            secret.to_uppercase()
        );
        set(
            &mut conditions,
            Desired::new("Ready", Status::False, "X").message(&message),
            None,
            &at(1),
        );
        crate::scrub::global().forget("test/conditions");
        assert_eq!(
            conditions[0].message,
            "the endpoint answered [redacted] and refused"
        );
    }
}
