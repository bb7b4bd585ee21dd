//! A placed VM is **bound** to its Provider: it stays there until its *own spec* asks
//! for another placement.
//!
//! What the placement was decided from is recorded with it
//! ([`PlacementBasis`]: the VM's `spec.placement`, `classRef` and `imageRef` then).
//! Comparing that with the spec now tells "the VM's owner asked for something else"
//! (a move may follow) from "somebody edited another object" (a Provider's labels or
//! settings, a failure domain's labels): the latter never moves the VM, under the
//! default `Recreate` migration a move would make a new machine from the image and
//! lose the old one's disk. It is reported instead ([`Drift`]).
//!
//! Which spec change can release the VM, and what it is checked against:
//! - `providerRef` / `providerSelector` changed: the Provider must match them;
//! - `failureDomainSelector` changed: the failure domain (its labels now) must match it;
//! - `classRef` or `imageRef` changed: the Provider must be able to serve the new class
//!   and image (a source for its class, the image found there, hosts of its
//!   architecture, the firmware, formats, storage classes and features the class asks);
//! - anything else (anti-affinity, power state, networks, disks) never moves a VM.

use std::collections::BTreeMap;

use crate::api::Provider;
use crate::api::provider::DiscoveredFailureDomain;
use crate::api::virtual_machine::{PlacementBasis, ScheduledPlacement};
use crate::backend::capabilities;
use crate::conditions;

use super::{
    Input, architecture_fits, domains_of, matches, namespace, offers, provider_matches, wants,
};

/// `PlacementDrifted` reason: the Provider is being deleted.
pub const PROVIDER_DELETING: &str = "ProviderDeleting";
/// `PlacementDrifted` reason: the Provider's labels no longer match the VM's placement.
pub const PROVIDER_LABELS_CHANGED: &str = "ProviderLabelsChanged";
/// `PlacementDrifted` reason: the failure domain no longer matches (its labels
/// changed) or is no longer reported.
pub const FAILURE_DOMAIN_CHANGED: &str = "FailureDomainChanged";
/// `PlacementDrifted` reason: the Provider no longer offers something the VM uses.
pub const CAPABILITIES_CHANGED: &str = "CapabilitiesChanged";

/// What the current placement was decided from, as the VM's status tells.
#[derive(Clone, Copy, Debug, Default)]
pub enum Basis<'a> {
    /// Recorded with the placement (`status.placement.basis`).
    Recorded(&'a PlacementBasis),
    /// None recorded: placed by an operator that did not record it, read back from the
    /// infra machine, or a VM never placed. Bound as if the spec had not changed: an
    /// upgrade moves nothing.
    #[default]
    Unrecorded,
    /// A move the VM's own spec asked for was refused or undone, and the VM is where it
    /// was, not where its spec asks: everything is checked against the spec again.
    MovePending,
}

/// A change elsewhere that makes a bound VM's placement no longer match; shown on the
/// VM (`PlacementDrifted=True`), and nothing moves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Drift {
    /// CamelCase reason: the first of [`PROVIDER_DELETING`], [`PROVIDER_LABELS_CHANGED`],
    /// [`FAILURE_DOMAIN_CHANGED`], [`CAPABILITIES_CHANGED`] that applies.
    pub reason: &'static str,
    /// Every change found, and what to do.
    pub message: String,
}

/// Which parts of the VM's own spec changed since its placement was decided.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Changed {
    provider: bool,
    domain: bool,
    class_or_image: bool,
}

impl Changed {
    fn of(input: &Input<'_>) -> Self {
        let spec = &input.vm.spec;
        match input.basis {
            Basis::Unrecorded => Self::default(),
            Basis::MovePending => Self {
                provider: true,
                domain: true,
                class_or_image: true,
            },
            Basis::Recorded(basis) => Self {
                provider: basis.placement.provider_ref != spec.placement.provider_ref
                    || basis.placement.provider_selector != spec.placement.provider_selector,
                domain: basis.placement.failure_domain_selector
                    != spec.placement.failure_domain_selector,
                class_or_image: basis.class_ref != spec.class_ref.name
                    || basis.image_ref != spec.image_ref.name,
            },
        }
    }
}

/// What becomes of a placed VM.
#[derive(Debug)]
pub(super) enum Bound<'p> {
    /// It stays on `provider`; `drift` says what no longer matches, if anything.
    Stay {
        provider: &'p Provider,
        drift: Option<Drift>,
    },
    /// Its own spec asks for what its Provider cannot give: schedule it anew.
    Release,
    /// It stays, and cannot be served where it is (its Provider is gone, or whether
    /// the Provider has its new image is not known yet).
    Stuck {
        reason: &'static str,
        message: String,
    },
}

/// Decides whether the VM placed at `current` stays bound there.
pub(super) fn bound<'p>(input: &Input<'p>, current: &ScheduledPlacement) -> Bound<'p> {
    let changed = Changed::of(input);
    let Some(provider) = input
        .providers
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some(current.provider.as_str()))
    else {
        if changed.provider {
            return Bound::Release;
        }
        return Bound::Stuck {
            reason: "ProviderNotFound",
            message: format!(
                "Provider {} (where this VM is placed) does not exist in namespace {}: the VM is \
                 bound to it and is not moved by itself. Recreate the Provider, or change \
                 spec.placement to place the VM on another one (a new machine is made there)",
                current.provider,
                namespace(input.vm)
            ),
        };
    };
    let mut drifts: Vec<(&'static str, String)> = Vec::new();
    if provider.metadata.deletion_timestamp.is_some() {
        drifts.push((
            PROVIDER_DELETING,
            format!(
                "Provider {} is being deleted and waits for its machines to go; this VM stays \
                 on it until the VM is deleted or its spec.placement moves it",
                current.provider
            ),
        ));
    }
    if !provider_matches(input.vm, provider) || current.provider_class != Some(provider.spec.class)
    {
        if changed.provider {
            return Bound::Release;
        }
        drifts.push((PROVIDER_LABELS_CHANGED, provider_mismatch(input, current)));
    }
    let live = live_domain(provider, current.failure_domain.as_deref());
    if let Some(why) = domain_mismatch(input, current, provider, live.as_ref()) {
        if changed.domain {
            return Bound::Release;
        }
        drifts.push((FAILURE_DOMAIN_CHANGED, why));
    }
    let ready = provider
        .status
        .as_ref()
        .is_some_and(|s| conditions::is_true(&s.conditions, conditions::types::READY));
    if changed.class_or_image {
        match serves(input, provider, live.as_ref()) {
            Serves::Yes => {}
            Serves::No(_) => return Bound::Release,
            Serves::Unknown(message) => {
                return Bound::Stuck {
                    reason: "ImageNotYetChecked",
                    message,
                };
            }
        }
    } else if ready {
        // Only a Ready Provider's inventory is current: one that is down says nothing
        // about what it offers, and an outage is not a change to report.
        if let Serves::No(missing) = serves(input, provider, live.as_ref()) {
            drifts.push((
                CAPABILITIES_CHANGED,
                format!(
                    "Provider {} no longer offers what this VM uses: {}",
                    current.provider,
                    missing.join("; ")
                ),
            ));
        }
    }
    let drift = (!drifts.is_empty()).then(|| Drift {
        reason: drifts[0].0,
        message: format!(
            "{}. Nothing is moved: the VM stays bound to Provider {} until its own spec \
             (placement, classRef, imageRef) asks for another placement",
            drifts
                .into_iter()
                .map(|(_, why)| why)
                .collect::<Vec<_>>()
                .join("; "),
            current.provider
        ),
    });
    Bound::Stay { provider, drift }
}

fn provider_mismatch(input: &Input<'_>, current: &ScheduledPlacement) -> String {
    let placement = &input.vm.spec.placement;
    match &placement.provider_ref {
        // Only a VM placed before its basis was recorded gets here: its providerRef
        // changed, or it would not be bound to another Provider.
        Some(r) => format!(
            "spec.placement.providerRef names {}, but the VM was placed on Provider {} before \
             this operator recorded what placements are decided from; change spec.placement \
             again to move it",
            r.name, current.provider
        ),
        None => format!(
            "Provider {} no longer matches spec.placement.providerSelector (its labels \
             changed since the VM was placed)",
            current.provider
        ),
    }
}

/// The failure domain `name` as `provider` reports it now, with its topology.
fn live_domain(
    provider: &Provider,
    name: Option<&str>,
) -> Option<(Option<DiscoveredFailureDomain>, BTreeMap<String, String>)> {
    domains_of(provider)
        .into_iter()
        .find(|(domain, _)| domain.map(|d| d.name.as_str()) == name)
        .map(|(domain, topology)| (domain.cloned(), topology))
}

fn domain_mismatch(
    input: &Input<'_>,
    current: &ScheduledPlacement,
    provider: &Provider,
    live: Option<&(Option<DiscoveredFailureDomain>, BTreeMap<String, String>)>,
) -> Option<String> {
    let fd = current.failure_domain.as_deref().unwrap_or("-");
    let Some((_, topology)) = live else {
        // A Provider that is down may report no domains: no news about them then.
        let ready = provider
            .status
            .as_ref()
            .is_some_and(|s| conditions::is_true(&s.conditions, conditions::types::READY));
        return ready.then(|| {
            format!(
                "Provider {} no longer reports failure domain {fd}",
                current.provider
            )
        });
    };
    let selector = input.vm.spec.placement.failure_domain_selector.as_ref()?;
    (!matches(selector, topology)).then(|| {
        format!(
            "failure domain {fd} of Provider {} no longer matches \
             spec.placement.failureDomainSelector (its labels changed since the VM was placed)",
            current.provider
        )
    })
}

enum Serves {
    Yes,
    /// What is missing.
    No(Vec<String>),
    /// Not known yet (why, for the condition).
    Unknown(String),
}

/// Whether `provider` (in the failure domain `live`) can serve the VM's class and image:
/// a source for its class, the image found there, every capability asked published,
/// every storage and network class and feature offered.
fn serves(
    input: &Input<'_>,
    provider: &Provider,
    live: Option<&(Option<DiscoveredFailureDomain>, BTreeMap<String, String>)>,
) -> Serves {
    let name = provider.metadata.name.as_deref().unwrap_or_default();
    let image = input.image.metadata.name.as_deref().unwrap_or_default();
    let mut missing = Vec::new();
    if !input.image.spec.sources.has(provider.spec.class) {
        missing.push(format!(
            "VMImage {image} has no {} source",
            provider.spec.class
        ));
    } else {
        let row = input
            .image
            .status
            .iter()
            .flat_map(|s| &s.providers)
            .find(|row| {
                Some(row.name.as_str()) == provider.metadata.name.as_deref()
                    && Some(row.namespace.as_str()) == provider.metadata.namespace.as_deref()
            });
        match row {
            Some(row) if !row.available => {
                missing.push(format!("VMImage {image} is not available there"))
            }
            Some(_) => {}
            None if Changed::of(input).class_or_image => {
                return Serves::Unknown(format!(
                    "VMImage {image} has not been checked on Provider {name} yet: whether the \
                     VM can stay there is decided once it has; the machine stays as it is"
                ));
            }
            None => {}
        }
    }
    missing
        .extend(capabilities::published(provider.status.as_ref()).missing(&wants(input, provider)));
    // A failure domain no longer reported is a drift of its own; what it offered is
    // not known any more.
    if let Some((domain, _)) = live {
        // Hosts of another architecture are reported (a VM placed by an operator that
        // did not check, or an image whose architecture was edited), and release a
        // VM whose new image cannot run there. An architecture not reported keeps a
        // machine that exists where it is without a word (Providers checked before
        // upgrading report none until their next check); it releases a VM whose class
        // or image changed, which the scheduler then places only where it is known.
        let domain = domain.as_ref();
        let unreported = domain.and_then(|d| d.architecture).is_none();
        if !unreported || Changed::of(input).class_or_image {
            missing.extend(architecture_fits(input, provider, domain).err());
        }
        missing.extend(offers(input, provider, domain).err());
    }
    if missing.is_empty() {
        Serves::Yes
    } else {
        Serves::No(missing)
    }
}
