//! The failure domains an InfraCluster publishes, aggregated from several Providers
//! (several vCenters, Proxmox clusters or hosts), and the way back from a name CAPI
//! chose to the Provider and backend failure domain it stands for.
//!
//! Names are `<provider>/<failure domain>`: unique across Providers, and stable when
//! a Provider is added to the cluster later (a Machine's `spec.failureDomain` must
//! keep resolving). Kubernetes names cannot contain `/`, so splitting is unambiguous.
//! The attributes carry the Provider, the backend's name, the failure domain's labels
//! and its location.

use std::collections::BTreeMap;

use crate::api::common::LabelSelector;
use crate::api::infra::FailureDomain;
use crate::api::provider::DiscoveredFailureDomain;
use crate::scheduling::matches as selector_matches;

/// Attribute naming the Provider of a failure domain.
pub const PROVIDER_ATTRIBUTE: &str = "banlieue.io/provider";
/// Attribute naming the failure domain as the Provider knows it.
pub const FAILURE_DOMAIN_ATTRIBUTE: &str = "banlieue.io/failure-domain";
/// CAPI's limit on `status.failureDomains`.
pub const MAX_FAILURE_DOMAINS: usize = 100;

/// One Provider's discovered failure domains.
#[derive(Clone, Copy, Debug)]
pub struct ProviderDomains<'a> {
    /// The Provider's name.
    pub provider: &'a str,
    /// What its status lists.
    pub domains: &'a [DiscoveredFailureDomain],
}

/// Which failure domains to publish and which may host control planes.
#[derive(Clone, Copy, Debug, Default)]
pub struct Selection<'a> {
    /// `spec.failureDomainSelector` (all when `None`).
    pub publish: Option<&'a LabelSelector>,
    /// `spec.controlPlaneFailureDomainSelector` (all when `None`).
    pub control_plane: Option<&'a LabelSelector>,
}

/// The name CAPI sees for a Provider's failure domain.
pub fn qualified_name(provider: &str, domain: &str) -> String {
    format!("{provider}/{domain}")
}

/// A CAPI failure-domain name split back into Provider and backend failure domain.
pub fn split_name(name: &str) -> Option<(&str, &str)> {
    name.split_once('/')
        .filter(|(p, d)| !p.is_empty() && !d.is_empty())
}

/// The labels selectors see: the failure domain's own, plus its Provider's name.
fn selectable(provider: &str, domain: &DiscoveredFailureDomain) -> BTreeMap<String, String> {
    let mut labels = domain.labels.clone();
    labels.insert(PROVIDER_ATTRIBUTE.into(), provider.into());
    labels
}

/// The sorted list to publish, at most [`MAX_FAILURE_DOMAINS`] long; the second value
/// is how many were left out by that limit.
pub fn aggregate(
    providers: &[ProviderDomains<'_>],
    selection: Selection<'_>,
) -> (Vec<FailureDomain>, usize) {
    let mut all: Vec<FailureDomain> = providers
        .iter()
        .flat_map(|p| p.domains.iter().map(move |d| (p.provider, d)))
        .filter_map(|(provider, domain)| {
            let labels = selectable(provider, domain);
            if selection
                .publish
                .is_some_and(|s| !selector_matches(s, &labels))
            {
                return None;
            }
            let control_plane = selection
                .control_plane
                .is_none_or(|s| selector_matches(s, &labels));
            let mut attributes = domain.location.clone();
            attributes.extend(labels);
            attributes.insert(FAILURE_DOMAIN_ATTRIBUTE.into(), domain.name.clone());
            Some(FailureDomain {
                name: qualified_name(provider, &domain.name),
                control_plane: Some(control_plane),
                attributes,
            })
        })
        .collect();
    all.sort_by(|a, b| a.name.cmp(&b.name));
    all.dedup_by(|a, b| a.name == b.name);
    let left_out = all.len().saturating_sub(MAX_FAILURE_DOMAINS);
    all.truncate(MAX_FAILURE_DOMAINS);
    (all, left_out)
}

/// Where a CAPI Machine goes: the Provider and the backend failure domain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// The Provider's name.
    pub provider: String,
    /// The backend failure domain (`None`: the backend's default).
    pub failure_domain: Option<String>,
    /// What to report in `status.failureDomain` (CAPI's name).
    pub reported: Option<String>,
}

/// Why a CAPI machine cannot be placed yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unplaced {
    /// CamelCase reason.
    pub reason: &'static str,
    /// What to fix.
    pub message: String,
}

/// Places a CAPI-owned machine: from `Machine.spec.failureDomain` (a name this
/// cluster published) and the machine's own `spec.providerRef`, with the cluster's
/// Providers as the fallback when there is exactly one.
pub fn place(
    machine_failure_domain: Option<&str>,
    provider_ref: Option<&str>,
    cluster_providers: &[String],
) -> Result<Placement, Unplaced> {
    match (machine_failure_domain, provider_ref) {
        (Some(name), provider_ref) => {
            let Some((provider, domain)) = split_name(name) else {
                return Err(Unplaced {
                    reason: "UnknownFailureDomain",
                    message: format!(
                        "Machine.spec.failureDomain {name} is not one this cluster publishes (they look like <provider>/<failure domain>)"
                    ),
                });
            };
            if let Some(reference) = provider_ref
                && reference != provider
            {
                return Err(Unplaced {
                    reason: "FailureDomainMismatch",
                    message: format!(
                        "Machine.spec.failureDomain {name} belongs to Provider {provider}, but spec.providerRef names {reference}"
                    ),
                });
            }
            Ok(Placement {
                provider: provider.into(),
                failure_domain: Some(domain.into()),
                reported: Some(name.into()),
            })
        }
        (None, Some(reference)) => Ok(Placement {
            provider: reference.into(),
            failure_domain: None,
            reported: None,
        }),
        (None, None) => match cluster_providers {
            [only] => Ok(Placement {
                provider: only.clone(),
                failure_domain: None,
                reported: None,
            }),
            [] => Err(Unplaced {
                reason: "NoProvider",
                message: "no spec.providerRef, no Machine.spec.failureDomain, and the cluster's InfraCluster names no Provider".into(),
            }),
            many => Err(Unplaced {
                reason: "NoFailureDomain",
                message: format!(
                    "the cluster spans {} Providers: set Machine.spec.failureDomain (or spec.providerRef) to choose",
                    many.len()
                ),
            }),
        },
    }
}

/// A failure domain for a machine CAPI did not place (a MachineDeployment has one
/// failure domain at most, usually none): the candidate with the fewest machines of
/// the same group already in it, ties broken by name, so replicas spread evenly.
pub fn spread<'c>(candidates: &'c [String], taken: &[&str]) -> Option<&'c str> {
    candidates
        .iter()
        .min_by_key(|c| {
            (
                taken.iter().filter(|t| **t == c.as_str()).count(),
                c.as_str(),
            )
        })
        .map(String::as_str)
}

#[cfg(test)]
mod tests;
