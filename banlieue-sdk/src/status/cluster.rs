//! InfraCluster status from the Providers it spans.
//!
//! `Ready` reasons: `Ready`; `NoProviders` (no Provider is selected at all);
//! `ProvidersNotReady` (none of the Providers is Ready);
//! `NoFailureDomains` (Ready Providers, but nothing to publish after the selectors);
//! `ProviderNotFound` (a `providerRefs` entry names no Provider; the others still
//! count); `Paused`. `provisioned` becomes true with the first published failure
//! domain and never goes back.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::infra::{ClusterStatus, FailureDomain, Initialization};
use crate::conditions::{self, Desired, Status, types};

/// The `Ready` reason of an InfraCluster that no Provider is selected for.
pub const NO_PROVIDERS: &str = "NoProviders";

/// What the InfraCluster controller learned in one reconcile.
#[derive(Clone, Copy, Debug)]
pub enum ClusterOutcome<'a> {
    /// The Providers were read.
    Aggregated {
        /// The failure domains to publish.
        failure_domains: &'a [FailureDomain],
        /// How many Providers were found.
        providers: usize,
        /// How many of them are Ready.
        ready_providers: usize,
        /// `providerRefs` entries that name no Provider.
        missing: &'a [String],
        /// Failure domains left out by CAPI's limit of 100.
        left_out: usize,
    },
    /// Reconciliation is paused.
    Paused {
        /// Why.
        message: &'a str,
    },
}

/// The status after one reconcile.
pub fn compute(
    previous: Option<&ClusterStatus>,
    generation: Option<i64>,
    outcome: ClusterOutcome<'_>,
    now: &Time,
) -> ClusterStatus {
    let mut status = previous.cloned().unwrap_or_default();
    status.observed_generation = generation;
    let set = |status: &mut ClusterStatus, d: Desired<'_>| {
        conditions::set(&mut status.conditions, d, generation, now)
    };
    match outcome {
        ClusterOutcome::Paused { message } => {
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
        ClusterOutcome::Aggregated {
            failure_domains,
            providers,
            ready_providers,
            missing,
            left_out,
        } => {
            set(
                &mut status,
                Desired::new(types::PAUSED, Status::False, "NotPaused"),
            );
            // A Provider that is down keeps its last published domains: machines
            // already placed there must keep resolving.
            if ready_providers > 0 || status.failure_domains.is_empty() {
                status.failure_domains = failure_domains.to_vec();
            }
            let provisioned = status
                .initialization
                .as_ref()
                .and_then(|i| i.provisioned)
                .unwrap_or(false)
                || !status.failure_domains.is_empty();
            status.initialization = provisioned.then_some(Initialization {
                provisioned: Some(true),
            });
            let (ready, reason, message) = if !missing.is_empty() {
                (
                    Status::False,
                    "ProviderNotFound",
                    format!("no Provider named {}", missing.join(", ")),
                )
            } else if providers == 0 {
                (
                    Status::False,
                    NO_PROVIDERS,
                    "no Provider is selected: none in this namespace matches \
                     spec.providerSelector (or, without a selector, builds this cluster's \
                     machine kind); create one, or fix the selector or spec.providerRefs"
                        .to_owned(),
                )
            } else if ready_providers == 0 {
                (
                    Status::False,
                    "ProvidersNotReady",
                    if providers == 1 {
                        "its only Provider is not Ready".to_owned()
                    } else {
                        format!("none of its {providers} Providers is Ready")
                    },
                )
            } else if failure_domains.is_empty() {
                (
                    Status::False,
                    "NoFailureDomains",
                    "the Providers publish no failure domain that the selectors accept".to_owned(),
                )
            } else if left_out > 0 {
                (
                    Status::True,
                    "Ready",
                    format!("{left_out} failure domain(s) left out: Cluster API takes at most 100"),
                )
            } else {
                (Status::True, "Ready", String::new())
            };
            set(
                &mut status,
                Desired::new(types::READY, ready, reason).message(&message),
            );
        }
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn now(s: i64) -> Time {
        Time(Timestamp::from_second(s).unwrap())
    }

    fn fd(name: &str) -> FailureDomain {
        FailureDomain {
            name: name.into(),
            control_plane: Some(true),
            ..Default::default()
        }
    }

    fn aggregated<'a>(
        fds: &'a [FailureDomain],
        ready: usize,
        missing: &'a [String],
    ) -> ClusterOutcome<'a> {
        ClusterOutcome::Aggregated {
            failure_domains: fds,
            providers: 2,
            ready_providers: ready,
            missing,
            left_out: 0,
        }
    }

    #[test]
    fn ready_with_domains_and_provisioned_for_good() {
        let fds = [fd("a/1"), fd("b/1")];
        let s = compute(None, Some(1), aggregated(&fds, 2, &[]), &now(1));
        assert_eq!(s.failure_domains, fds);
        assert_eq!(s.initialization.as_ref().unwrap().provisioned, Some(true));
        assert!(conditions::is_true(&s.conditions, "Ready"));
        assert!(!conditions::is_true(&s.conditions, "Paused"));
        // Providers go down: domains and provisioned stay, Ready goes False.
        let down = compute(Some(&s), Some(1), aggregated(&[], 0, &[]), &now(2));
        assert_eq!(down.failure_domains, fds);
        assert_eq!(down.initialization.unwrap().provisioned, Some(true));
        assert_eq!(
            conditions::get(&down.conditions, "Ready").unwrap().reason,
            "ProvidersNotReady"
        );
    }

    #[test]
    fn unchanged_input_unchanged_status() {
        let fds = [fd("a/1")];
        let first = compute(None, Some(1), aggregated(&fds, 1, &[]), &now(1));
        assert_eq!(
            compute(Some(&first), Some(1), aggregated(&fds, 1, &[]), &now(9)),
            first
        );
    }

    #[test]
    fn reasons() {
        let missing = ["vc3".to_string()];
        let s = compute(None, None, aggregated(&[fd("a/1")], 1, &missing), &now(1));
        let ready = conditions::get(&s.conditions, "Ready").unwrap();
        assert_eq!(
            (ready.reason.as_str(), ready.message.as_str()),
            ("ProviderNotFound", "no Provider named vc3")
        );
        let none = compute(
            None,
            None,
            ClusterOutcome::Aggregated {
                failure_domains: &[],
                providers: 0,
                ready_providers: 0,
                missing: &[],
                left_out: 0,
            },
            &now(1),
        );
        let ready = conditions::get(&none.conditions, "Ready").unwrap();
        assert_eq!(ready.reason, NO_PROVIDERS, "not `none of the 0 Providers`");
        assert!(
            ready.message.contains("no Provider is selected"),
            "{}",
            ready.message
        );
        let s = compute(None, None, aggregated(&[], 1, &[]), &now(1));
        assert_eq!(
            conditions::get(&s.conditions, "Ready").unwrap().reason,
            "NoFailureDomains"
        );
        assert!(s.initialization.is_none());
        let p = compute(
            Some(&s),
            None,
            ClusterOutcome::Paused {
                message: "the Cluster is paused",
            },
            &now(2),
        );
        assert!(conditions::is_true(&p.conditions, "Paused"));
    }
}
