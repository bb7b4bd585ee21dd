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

/// A recorded failure-domain name (an infra machine's `status.failureDomain`, or the
/// one banlieue chose for it) read back as Provider and backend failure domain, when
/// its Provider part names a Provider (`is_provider`: one of the namespace's, or of the
/// cluster's `spec.providerRefs`).
///
/// `None` for a name that names no Provider: the backend's bare name (`DC0/DC0_C0`,
/// as releases before this one wrote for a machine placed before its cluster published
/// failure domains), or a Provider that is gone. Such a name is never read as a
/// Provider of its own; [`decide`] locates the machine's VM instead.
pub fn resolve_recorded(name: &str, is_provider: impl Fn(&str) -> bool) -> Option<(&str, &str)> {
    split_name(name).filter(|(provider, _)| is_provider(provider))
}

/// What is known of a CAPI machine's placement, for [`decide`].
#[derive(Clone, Copy, Debug, Default)]
pub struct Known<'a> {
    /// Its Machine's `spec.failureDomain` (a name its cluster published).
    pub machine_failure_domain: Option<&'a str>,
    /// Its own `spec.providerRef`.
    pub provider_ref: Option<&'a str>,
    /// Where it was recorded to be: its `status.failureDomain`, or the failure domain
    /// banlieue chose for it and has not seen in its status yet.
    pub recorded: Option<&'a str>,
    /// It has a VM already, somewhere (a provider ID: adopted after `clusterctl move` or
    /// a restore, both of which drop the status).
    pub has_vm: bool,
}

/// What the cluster of a CAPI machine offers, for [`decide`].
#[derive(Clone, Copy, Debug, Default)]
pub struct ClusterView<'a> {
    /// The Providers its InfraCluster spans (`spec.providerRefs` and the Providers of
    /// its published failure domains).
    pub providers: &'a [String],
    /// Whether it has published any failure domain yet (`status.failureDomains`:
    /// empty until the InfraCluster is first reconciled, and after every `clusterctl
    /// move`, which recreates it without status).
    pub published: bool,
}

/// How a CAPI machine is placed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Here.
    Placed(Placement),
    /// A new machine CAPI left unplaced: the emptiest published failure domain
    /// ([`spread`]).
    Choose,
    /// Its VM exists but nothing recorded says on which of these Providers: ask each
    /// backend ([`located`]). Never guessed from the emptiest failure domain.
    Locate(Vec<String>),
    /// Not yet.
    Wait(Unplaced),
}

/// Places a CAPI machine from what is known of it; `is_provider` as in
/// [`resolve_recorded`]. In order: its Machine's failure domain, its own
/// `spec.providerRef`, its recorded failure domain when that names a Provider; else,
/// for a machine whose VM exists, the cluster's only Provider or the Providers to look
/// for the VM on; else, for a new machine, a published failure domain, the cluster's
/// only Provider, or a wait until the cluster publishes its failure domains.
pub fn decide(
    known: Known<'_>,
    cluster: ClusterView<'_>,
    is_provider: impl Fn(&str) -> bool,
) -> Decision {
    let result = |r: Result<Placement, Unplaced>| match r {
        Ok(placement) => Decision::Placed(placement),
        Err(unplaced) => Decision::Wait(unplaced),
    };
    if known.machine_failure_domain.is_some() || known.provider_ref.is_some() {
        return result(place(
            known.machine_failure_domain,
            known.provider_ref,
            cluster.providers,
        ));
    }
    let recorded = known.recorded;
    if let Some((provider, domain)) = recorded.and_then(|r| resolve_recorded(r, &is_provider)) {
        return Decision::Placed(Placement {
            provider: provider.into(),
            failure_domain: Some(domain.into()),
            reported: Some(qualified_name(provider, domain)),
        });
    }
    // A recorded name that names no Provider says the machine reached a backend.
    let exists = known.has_vm || recorded.is_some();
    match cluster.providers {
        [] => result(place(None, None, cluster.providers)),
        [only] if exists || !cluster.published => Decision::Placed(Placement {
            provider: only.clone(),
            failure_domain: None,
            reported: None,
        }),
        many if exists => Decision::Locate(many.to_vec()),
        _ if cluster.published => Decision::Choose,
        many => Decision::Wait(Unplaced {
            reason: "WaitingForFailureDomains",
            message: format!(
                "the cluster spans {} Providers and its InfraCluster has not published status.failureDomains yet (set Machine.spec.failureDomain or spec.providerRef to choose now)",
                many.len()
            ),
        }),
    }
}

/// Where a machine's VM was found by [`Decision::Locate`]: each Provider that has it,
/// with the backend failure domain it reports, and the Providers that could not be
/// asked (unreachable).
pub fn located(
    found: &[(String, Option<String>)],
    unreachable: &[String],
) -> Result<Placement, Unplaced> {
    let mut found: Vec<&(String, Option<String>)> = found.iter().collect();
    found.sort();
    match (found.first(), unreachable) {
        // Several Providers reaching one vCenter all see it: any of them manages it,
        // the first by name, so every reconcile picks the same.
        (Some((provider, domain)), _) => Ok(Placement {
            provider: provider.clone(),
            failure_domain: domain.clone(),
            reported: domain.as_deref().map(|d| qualified_name(provider, d)),
        }),
        (None, []) => Err(Unplaced {
            reason: "BackendVMNotFound",
            message: "its VM is on none of the cluster's Providers (asked each by spec.providerID and UID): set spec.providerRef to the Provider that has it, or delete this object to let its owner replace it".into(),
        }),
        (None, unreachable) => Err(Unplaced {
            reason: "ProviderNotReady",
            message: format!(
                "looking for its VM on the cluster's Providers: {} could not be asked",
                unreachable.join(", ")
            ),
        }),
    }
}

/// The failure domain a CAPI machine reports in `status.failureDomain`: the name CAPI
/// or banlieue placed it by, else where its backend says it is, qualified by the
/// Provider it runs on. Never the backend's bare name, which would read back as a
/// Provider of its own.
pub fn reported(placement: &Placement, observed: Option<&str>) -> Option<String> {
    placement
        .reported
        .clone()
        .or_else(|| observed.map(|fd| qualified_name(&placement.provider, fd)))
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
