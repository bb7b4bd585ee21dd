//! Scheduling: a pure function from a VirtualMachine, its class and image, the
//! Providers of its namespace and its sibling VirtualMachines to a placement.
//!
//! Rules, in order:
//! 1. **Bound.** A VM that is placed stays on its Provider until its own spec asks for
//!    another placement (see the `binding` module): a change to another object (a Provider's
//!    labels or settings, a failure domain's labels, a Provider being deleted) that
//!    makes the placement no longer match moves nothing and is reported
//!    ([`Drift`]). A Provider being down is not a reason to move either (that would
//!    recreate machines on every outage). A power state the Provider cannot give
//!    (`Suspended` where it is not published) makes the VM unschedulable where it is
//!    (`CapabilitiesMissing`), never moves it.
//! 2. **Feasible.** Otherwise a candidate (Provider, failure domain) must: match the
//!    placement; be Ready and not paused; have a source in the image for its class
//!    (and not be listed as lacking it in the image's status); publish in
//!    `status.backendCapabilities` the VM's firmware, bootstrap format, power state
//!    and image source kind, and grow `Live` what its class asks headroom for (see
//!    [`wants`]); have hosts of the image's architecture in the failure domain (a
//!    failure domain whose backend reports no architecture fits no image, see
//!    [`ARCHITECTURE_MISMATCH`]); offer every storage and network class and feature
//!    the VM needs; satisfy `Required` anti-affinity against placed siblings. A
//!    bootstrap format the image does not declare fits nowhere.
//! 3. **Best.** Among feasible candidates: fewest `Preferred` anti-affinity conflicts,
//!    then fewest VMs already placed there (spread), then name order. Deterministic.

mod binding;
mod selector;

use std::collections::{BTreeMap, HashMap};

use crate::api::common::ProviderClass;
use crate::api::provider::DiscoveredFailureDomain;
use crate::api::virtual_machine::{AffinityMode, ScheduledPlacement};
use crate::api::{Provider, VMClassSpec, VMImage, VirtualMachine};
use crate::backend::Wants;
use crate::backend::capabilities;
use crate::conditions;

pub use binding::{
    Basis, CAPABILITIES_CHANGED, Drift, FAILURE_DOMAIN_CHANGED, PROVIDER_DELETING,
    PROVIDER_LABELS_CHANGED,
};
pub use selector::matches;

/// `Scheduled`'s reason when every matching Provider is usable but cannot do
/// something the VM asks (a firmware, a bootstrap format, a power state, an image
/// source kind); the message names, per Provider, what is missing.
pub const CAPABILITIES_MISSING: &str = "CapabilitiesMissing";

/// `Scheduled`'s reason when every failure domain the placement allows was refused
/// for its hosts' architecture: another architecture than the VMImage's
/// `spec.architecture`, or none reported by the backend (never assumed). The message
/// names the image's architecture and, per Provider and failure domain, what its
/// hosts have.
pub const ARCHITECTURE_MISMATCH: &str = "ArchitectureMismatch";

/// Topology key whose value is the Provider's name.
pub const PROVIDER_TOPOLOGY_KEY: &str = "banlieue.io/provider";
/// Topology key whose value is the failure domain's name.
pub const FAILURE_DOMAIN_TOPOLOGY_KEY: &str = "banlieue.io/failure-domain";

/// Everything a scheduling decision depends on.
#[derive(Clone, Copy, Debug)]
pub struct Input<'a> {
    /// The VM to place.
    pub vm: &'a VirtualMachine,
    /// Its class.
    pub class: &'a VMClassSpec,
    /// Its image; its status says on which Providers it was found, and only those
    /// are candidates.
    pub image: &'a VMImage,
    /// Providers in the VM's namespace.
    pub providers: &'a [Provider],
    /// Where the VM is placed now: its `status.placement`, or a decision not yet
    /// visible in the cache. `None` for a VM never placed.
    pub current: Option<&'a ScheduledPlacement>,
    /// What `current` was decided from: tells the VM's own spec changing (which may
    /// move it) from other objects changing (which never does).
    pub basis: Basis<'a>,
    /// Other VMs in the namespace (the VM itself may be among them; it is skipped).
    pub siblings: &'a [Sibling<'a>],
    /// Spread counts kept apart from `siblings`. When given, spread reads them and
    /// `siblings` serve anti-affinity alone, so a caller need gather siblings only
    /// for a VM with anti-affinity terms.
    pub loads: Option<&'a Loads>,
}

/// How many VMs are placed on each Provider and failure domain of a namespace: what
/// spread compares.
///
/// Counting the siblings for every placement is quadratic in the namespace's VMs (at
/// 10,000 VMs it was over half of the operator's CPU); these counts can be kept once
/// and brought up to date as placements are decided.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Loads(HashMap<String, HashMap<Option<String>, usize>>);

impl Loads {
    /// The counts of `siblings`, leaving out the VM named `except`.
    pub fn of(siblings: &[Sibling<'_>], except: &str) -> Self {
        let mut loads = Self::default();
        for placement in siblings
            .iter()
            .filter(|s| s.name != except)
            .filter_map(|s| s.placement)
        {
            loads.add(placement);
        }
        loads
    }

    /// Counts one more VM placed at `placement`.
    pub fn add(&mut self, placement: &ScheduledPlacement) {
        *self
            .0
            .entry(placement.provider.clone())
            .or_default()
            .entry(placement.failure_domain.clone())
            .or_default() += 1;
    }

    /// VMs placed on `provider`, in `failure_domain`.
    pub fn get(&self, provider: &str, failure_domain: Option<&str>) -> usize {
        self.0
            .get(provider)
            .and_then(|domains| domains.get(&failure_domain.map(str::to_owned)))
            .copied()
            .unwrap_or(0)
    }
}

/// What the scheduler needs to know about another VM of the namespace.
#[derive(Clone, Copy, Debug)]
pub struct Sibling<'a> {
    /// Its name.
    pub name: &'a str,
    /// Its labels (anti-affinity selects on them).
    pub labels: &'a BTreeMap<String, String>,
    /// Where it is placed, if anywhere.
    pub placement: Option<&'a ScheduledPlacement>,
}

impl<'a> Sibling<'a> {
    /// A sibling as its own status says.
    pub fn of(vm: &'a VirtualMachine) -> Self {
        static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();
        Self {
            name: vm.metadata.name.as_deref().unwrap_or_default(),
            labels: vm.metadata.labels.as_ref().unwrap_or(&NO_LABELS),
            placement: vm.status.as_ref().and_then(|s| s.placement.as_ref()),
        }
    }
}

/// The outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Stay where it is: bound to its Provider.
    Keep {
        /// What no longer matches because another object changed, if anything.
        drift: Option<Drift>,
    },
    /// Place (or move) it here.
    Place(Target),
    /// No candidate fits.
    Unschedulable {
        /// CamelCase reason for the `Scheduled` condition.
        reason: &'static str,
        /// What is missing, for humans.
        message: String,
    },
}

/// A chosen Provider and failure domain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// Provider name.
    pub provider: String,
    /// Provider class.
    pub class: ProviderClass,
    /// Failure domain, when the Provider has any.
    pub failure_domain: Option<String>,
    /// The failure domain's labels plus the two banlieue topology keys.
    pub topology: BTreeMap<String, String>,
}

impl Target {
    /// The status block recording this placement.
    pub fn to_status(
        &self,
        scheduled_at: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    ) -> ScheduledPlacement {
        ScheduledPlacement {
            provider: self.provider.clone(),
            provider_class: Some(self.class),
            failure_domain: self.failure_domain.clone(),
            topology: self.topology.clone(),
            scheduled_at,
            basis: None,
        }
    }
}

/// Decides where `input.vm` runs.
pub fn schedule(input: &Input<'_>) -> Decision {
    if let Some(current) = input.current {
        match binding::bound(input, current) {
            binding::Bound::Stay { provider, drift } => {
                // The power state is the one thing checked again on a machine that
                // exists. The VM stays where it is either way; a move is never the
                // answer to "this Provider cannot suspend".
                let missing = capabilities::published(provider.status.as_ref())
                    .missing(&wants(input, provider).running());
                if !missing.is_empty() {
                    return Decision::Unschedulable {
                        reason: CAPABILITIES_MISSING,
                        message: format!(
                            "{}: {} (the machine stays as it is)",
                            current.provider,
                            missing.join("; ")
                        ),
                    };
                }
                return Decision::Keep { drift };
            }
            binding::Bound::Stuck { reason, message } => {
                return Decision::Unschedulable { reason, message };
            }
            binding::Bound::Release => {}
        }
    }
    if let Some(refused) = image_refuses_bootstrap(input) {
        return refused;
    }

    let mut rejections: Vec<String> = Vec::new();
    let mut best: Option<(Score, Target)> = None;
    let placement = &input.vm.spec.placement;

    let matching: Vec<&Provider> = input
        .providers
        .iter()
        .filter(|p| provider_matches(input.vm, p))
        .collect();
    if matching.is_empty() {
        let message = match &placement.provider_ref {
            Some(r) => format!(
                "Provider {} does not exist in namespace {}",
                r.name,
                namespace(input.vm)
            ),
            None => "no Provider in the namespace matches placement.providerSelector".to_owned(),
        };
        return Decision::Unschedulable {
            reason: "ProviderNotFound",
            message,
        };
    }

    // One counting rule for spread, whether the caller kept the counts or not.
    let counted;
    let loads = match input.loads {
        Some(loads) => loads,
        None => {
            let my_name = input.vm.metadata.name.as_deref().unwrap_or_default();
            counted = Loads::of(input.siblings, my_name);
            &counted
        }
    };

    let mut incapable = 0;
    // Domains refused for their architecture, and for anything else but the
    // failureDomainSelector (a domain the placement excludes was never a candidate):
    // when the architecture is all that stood in the way, the reason says so.
    let mut wrong_architecture = 0;
    let mut refused_otherwise = 0;
    let providers = matching.len();
    for provider in matching {
        let name = provider.metadata.name.clone().unwrap_or_default();
        if let Err(why) = provider_usable(input, provider) {
            refused_otherwise += 1;
            rejections.push(format!("{name}: {why}"));
            continue;
        }
        let missing =
            capabilities::published(provider.status.as_ref()).missing(&wants(input, provider));
        if !missing.is_empty() {
            incapable += 1;
            refused_otherwise += 1;
            rejections.push(format!("{name}: {}", missing.join("; ")));
            continue;
        }
        for (domain, topology) in domains_of(provider) {
            let fd_name = domain.map(|d| d.name.clone());
            let label = format!("{name}/{}", fd_name.as_deref().unwrap_or("-"));
            if !in_selected_domain(input, domain) {
                rejections.push(format!("{label}: does not match failureDomainSelector"));
                continue;
            }
            if let Err(why) = architecture_fits(input, provider, domain) {
                wrong_architecture += 1;
                rejections.push(format!("{label}: {why}"));
                continue;
            }
            if let Err(why) = offers(input, provider, domain) {
                refused_otherwise += 1;
                rejections.push(format!("{label}: {why}"));
                continue;
            }
            let conflicts = anti_affinity_conflicts(input, &topology);
            if conflicts.required > 0 {
                refused_otherwise += 1;
                rejections.push(format!("{label}: violates required anti-affinity"));
                continue;
            }
            let score = Score {
                preferred_conflicts: conflicts.preferred,
                load: loads.get(&name, fd_name.as_deref()),
                provider: name.clone(),
                failure_domain: fd_name.clone(),
            };
            let target = Target {
                provider: name.clone(),
                class: provider.spec.class,
                failure_domain: fd_name,
                topology,
            };
            if best.as_ref().is_none_or(|(b, _)| score < *b) {
                best = Some((score, target));
            }
        }
    }

    match best {
        Some((_, target)) => Decision::Place(target),
        None => {
            rejections.sort();
            let reason = if wrong_architecture > 0 && refused_otherwise == 0 {
                ARCHITECTURE_MISMATCH
            } else if incapable == providers {
                CAPABILITIES_MISSING
            } else {
                "NoFeasibleProvider"
            };
            Decision::Unschedulable {
                reason,
                message: format!("no Provider fits: {}", rejections.join("; ")),
            }
        }
    }
}

/// The placement an existing infra machine records: on `provider`, in
/// `failure_domain` (its `banlieue.io/failure-domain` annotation), with the topology
/// that failure domain has now.
///
/// The VirtualMachine's status is written once its infra machine reports, so after a
/// restart the infra machine may be the only record of where a VM was placed; reading
/// it back keeps the VM where it is instead of scheduling it anew (which could move it).
/// `None` when the Provider does not exist any more.
pub fn placement_of_machine(
    providers: &[Provider],
    provider: &str,
    failure_domain: Option<&str>,
) -> Option<ScheduledPlacement> {
    let found = providers
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some(provider))?;
    let topology = domains_of(found)
        .into_iter()
        .find(|(domain, _)| domain.map(|d| d.name.as_str()) == failure_domain)
        .map(|(_, topology)| topology)
        .unwrap_or_default();
    Some(ScheduledPlacement {
        provider: provider.to_owned(),
        provider_class: Some(found.spec.class),
        failure_domain: failure_domain.map(str::to_owned),
        topology,
        scheduled_at: None,
        basis: None,
    })
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Score {
    preferred_conflicts: usize,
    load: usize,
    provider: String,
    failure_domain: Option<String>,
}

fn namespace(vm: &VirtualMachine) -> &str {
    vm.metadata.namespace.as_deref().unwrap_or_default()
}

fn provider_matches(vm: &VirtualMachine, provider: &Provider) -> bool {
    let placement = &vm.spec.placement;
    match (&placement.provider_ref, &placement.provider_selector) {
        (Some(r), _) => provider.metadata.name.as_deref() == Some(r.name.as_str()),
        (None, Some(selector)) => matches(
            selector,
            provider
                .metadata
                .labels
                .as_ref()
                .unwrap_or(&BTreeMap::new()),
        ),
        (None, None) => true,
    }
}

/// What `input.vm` asks of `provider`'s backend: its class's firmware and hot-add
/// headroom, its bootstrap format, its power state, and the kind of the image's source
/// for the Provider's class.
pub fn wants(input: &Input<'_>, provider: &Provider) -> Wants {
    Wants {
        firmware: Some(input.class.firmware),
        bootstrap: input.vm.spec.bootstrap.as_ref().map(|b| b.format),
        power_state: input.vm.spec.power_state,
        image_source: capabilities::image_source_kind(
            &input.image.spec.sources,
            provider.spec.class,
        ),
        grow_live: capabilities::grow_live(input.class.max_cpus, input.class.max_memory_mib),
    }
}

/// A VM whose bootstrap format its image does not declare fits nowhere: the guest
/// would boot with its bootstrap data ignored. An image declaring no format at all
/// (`bootstrapFormats: []`) is not checked.
fn image_refuses_bootstrap(input: &Input<'_>) -> Option<Decision> {
    let format = input.vm.spec.bootstrap.as_ref()?.format;
    let declared = &input.image.spec.bootstrap_formats;
    if declared.is_empty() || declared.contains(&format) {
        return None;
    }
    let names: Vec<&str> = declared
        .iter()
        .map(|f| capabilities::bootstrap_format_name(*f))
        .collect();
    Some(Decision::Unschedulable {
        reason: "BootstrapFormatUnsupported",
        message: format!(
            "VMImage {} declares bootstrapFormats [{}]: it cannot take {} bootstrap data",
            input.image.metadata.name.as_deref().unwrap_or_default(),
            names.join(", "),
            capabilities::bootstrap_format_name(format)
        ),
    })
}

fn provider_usable(input: &Input<'_>, provider: &Provider) -> Result<(), String> {
    if provider.spec.paused {
        return Err("paused".into());
    }
    if provider.metadata.deletion_timestamp.is_some() {
        return Err("being deleted".into());
    }
    let status = provider.status.as_ref();
    if !status.is_some_and(|s| conditions::is_true(&s.conditions, conditions::types::READY)) {
        // Its own Ready condition says why: the fix is on the Provider.
        let ready = status.and_then(|s| conditions::get(&s.conditions, conditions::types::READY));
        return Err(match ready {
            Some(c) if c.message.is_empty() => format!("not Ready ({})", c.reason),
            Some(c) => format!("not Ready ({}: {})", c.reason, c.message),
            None => "not Ready (not checked yet: the Provider has no Ready condition)".into(),
        });
    }
    if !input.image.spec.sources.has(provider.spec.class) {
        return Err(format!("image has no {} source", provider.spec.class));
    }
    // Only where the VMImage controller found the image: a VM placed where the image
    // turned out missing (or unusable, e.g. a Proxmox volume without a template) would
    // stay there failing, as placements are sticky. Not yet checked is a short wait,
    // ended by the image's status update.
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
        Some(row) if row.available => Ok(()),
        Some(_) => Err("image not available there".into()),
        None => Err("image not yet checked there".into()),
    }
}

/// The failure domains of a Provider with their topology; a Provider that reports
/// none is one implicit domain.
fn domains_of(
    provider: &Provider,
) -> Vec<(Option<&DiscoveredFailureDomain>, BTreeMap<String, String>)> {
    let name = provider.metadata.name.clone().unwrap_or_default();
    let domains: Vec<&DiscoveredFailureDomain> = provider
        .status
        .iter()
        .flat_map(|s| &s.failure_domains)
        .collect();
    let topology = |fd: Option<&DiscoveredFailureDomain>| {
        let mut t = fd.map(|d| d.labels.clone()).unwrap_or_default();
        t.insert(PROVIDER_TOPOLOGY_KEY.into(), name.clone());
        if let Some(d) = fd {
            t.insert(FAILURE_DOMAIN_TOPOLOGY_KEY.into(), d.name.clone());
        }
        t
    };
    if domains.is_empty() {
        vec![(None, topology(None))]
    } else {
        domains
            .into_iter()
            .map(|d| (Some(d), topology(Some(d))))
            .collect()
    }
}

/// Whether `domain` matches the VM's `failureDomainSelector` (every domain does when
/// it has none).
fn in_selected_domain(input: &Input<'_>, domain: Option<&DiscoveredFailureDomain>) -> bool {
    let Some(selector) = &input.vm.spec.placement.failure_domain_selector else {
        return true;
    };
    let empty = DiscoveredFailureDomain::default();
    let fd = domain.unwrap_or(&empty);
    let mut labels = fd.labels.clone();
    labels.insert(FAILURE_DOMAIN_TOPOLOGY_KEY.into(), fd.name.clone());
    matches(selector, &labels)
}

/// Why `input.image` cannot run in `domain` of `provider`, if it cannot: its hosts are
/// of another architecture, or the backend does not say which (an unknown
/// architecture is never taken for a match: the guest would not boot, or boot
/// emulated). A Provider that reports no failure domain reports no architecture.
fn architecture_fits(
    input: &Input<'_>,
    provider: &Provider,
    domain: Option<&DiscoveredFailureDomain>,
) -> Result<(), String> {
    let wanted = input.image.spec.architecture;
    let image = input.image.metadata.name.as_deref().unwrap_or_default();
    match domain.and_then(|d| d.architecture) {
        Some(has) if has == wanted => Ok(()),
        Some(has) => Err(format!("its hosts are {has}, VMImage {image} is {wanted}")),
        None => Err(format!(
            "Provider {} does not report its hosts' architecture (its backend sets none in \
             its inventory), so no VMImage is placed there; VMImage {image} is {wanted}",
            provider.metadata.name.as_deref().unwrap_or_default()
        )),
    }
}

/// Whether `provider` offers, in `domain`, every storage class, network class and
/// feature the VM and its class ask.
fn offers(
    input: &Input<'_>,
    provider: &Provider,
    domain: Option<&DiscoveredFailureDomain>,
) -> Result<(), String> {
    let declared_storage = |class: &str| {
        provider
            .spec
            .capabilities
            .storage_classes
            .iter()
            .any(|c| c.name == class)
    };
    let declared_network = |class: &str| {
        provider
            .spec
            .capabilities
            .network_classes
            .iter()
            .any(|c| c.name == class)
    };
    // A Provider without failure domains offers what it declares; one with failure
    // domains offers, per domain, what the backend found there.
    let offers_storage = |class: &str| match domain {
        Some(d) => d.storage_classes.iter().any(|c| c == class),
        None => declared_storage(class),
    };
    let offers_network = |class: &str| match domain {
        Some(d) => d.network_classes.iter().any(|c| c == class),
        None => declared_network(class),
    };
    let storage = input.class.disk.storage_class.iter().chain(
        input
            .vm
            .spec
            .disks
            .iter()
            .filter_map(|d| d.storage_class.as_ref()),
    );
    for class in storage {
        if !offers_storage(class) {
            return Err(format!("storage class {class} not offered"));
        }
    }
    for network in &input.vm.spec.networks {
        if !offers_network(&network.network_class) {
            return Err(format!(
                "network class {} not offered",
                network.network_class
            ));
        }
    }
    let features: Vec<&String> = match domain {
        Some(d) => d.features.iter().collect(),
        None => provider.spec.capabilities.features.iter().collect(),
    };
    for feature in &input.class.required_features {
        if !features.contains(&feature) {
            return Err(format!("feature {feature} not offered"));
        }
    }
    Ok(())
}

#[derive(Default)]
struct Conflicts {
    required: usize,
    preferred: usize,
}

fn anti_affinity_conflicts(input: &Input<'_>, topology: &BTreeMap<String, String>) -> Conflicts {
    let mut conflicts = Conflicts::default();
    let my_name = input.vm.metadata.name.as_deref().unwrap_or_default();
    for term in &input.vm.spec.placement.anti_affinity {
        let Some(value) = topology.get(&term.topology_key) else {
            continue;
        };
        let clashing = input
            .siblings
            .iter()
            .filter(|s| s.name != my_name && matches(&term.label_selector, s.labels))
            .filter_map(|s| s.placement)
            .filter(|p| p.topology.get(&term.topology_key) == Some(value))
            .count();
        match term.mode {
            AffinityMode::Required => conflicts.required += clashing,
            AffinityMode::Preferred => conflicts.preferred += clashing,
        }
    }
    conflicts
}

#[cfg(test)]
mod tests;
