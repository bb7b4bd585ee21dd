//! The Cluster API side of an infrastructure machine: before a CAPI-owned machine
//! is built, wait for its owner Machine, its Cluster and the bootstrap data, honour
//! pause, and place it in the failure domain CAPI chose.
//!
//! Every machine (CAPI-owned or not) also waits, with nothing created, while its
//! Provider does not publish everything it asks (`status.backendCapabilities`:
//! firmware, bootstrap format, power state, image source kind); the condition names
//! what is missing. A failure domain banlieue chooses is one whose Provider can.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;

use super::{Error, Machine};
use crate::api::common::BootstrapFormat;
use crate::backend::Wants;
use crate::backend::capabilities;
use crate::capi::failure_domains::{self, Placement};
use crate::capi::metadata;
use crate::controllers::capi;
use crate::controllers::context::Context;

/// How long to wait before looking again for something CAPI has not written yet
/// (the Machine and Cluster watches usually wake us sooner).
const RECHECK: Duration = Duration::from_secs(15);

/// What the CAPI step decided.
pub(super) enum Gate {
    /// Not a CAPI machine: build it from its own spec.
    Standalone,
    /// A CAPI machine ready to build.
    Capi {
        /// Where it goes.
        placement: Placement,
        /// The owner Machine's bootstrap data Secret.
        bootstrap_secret: String,
        /// That Secret, when this step read it already (before the machine exists,
        /// for its format), so it is read once per reconcile.
        read: Option<Box<Secret>>,
    },
    /// Paused (by the annotation or the Cluster).
    Paused(&'static str),
    /// Something CAPI has not provided yet.
    Waiting {
        reason: &'static str,
        message: String,
        retry: Duration,
    },
}

fn waiting(reason: &'static str, message: impl Into<String>) -> Gate {
    Gate::Waiting {
        reason,
        message: message.into(),
        retry: RECHECK,
    }
}

/// Whether reconciliation of a (possibly CAPI-owned) machine is paused, reading its
/// Cluster. Used on deletion too: a paused machine keeps its VM and finalizer.
pub(super) async fn paused<K: Machine>(
    machine: &K,
    ctx: &Context,
) -> Result<Option<&'static str>, Error> {
    let meta = machine.meta();
    let cluster = match metadata::cluster_name(meta) {
        Some(name) => cached_cluster(ctx, &machine.namespace().unwrap_or_default(), name),
        None => None,
    };
    Ok(metadata::paused(meta, cluster.as_deref()))
}

/// Labels CAPI puts on the machines of one MachineDeployment / MachineSet / control
/// plane: machines sharing one of them are spread together.
const GROUP_LABELS: [&str; 3] = [
    "cluster.x-k8s.io/deployment-name",
    "cluster.x-k8s.io/set-name",
    "cluster.x-k8s.io/control-plane-name",
];

/// Where a CAPI machine was recorded to be, if anywhere: its status's failure domain,
/// else the one banlieue chose for it and remembers until its status says so.
fn recorded<K: Machine>(machine: &K, ctx: &Context) -> Option<String> {
    let mut ledger = ctx.capi_placements.lock().expect("capi placements");
    let uid = machine.uid().unwrap_or_default();
    if let Some(landed) = machine
        .machine_status()
        .and_then(|s| s.failure_domain.clone())
    {
        // Its status says it now: the ledger has done its job.
        ledger.remove(&uid);
        return Some(landed);
    }
    ledger.get(&uid).cloned()
}

/// Forgets the failure domain remembered for the machine `uid` (it is going).
pub(super) fn forget_placement(ctx: &Context, uid: &str) {
    ctx.capi_placements
        .lock()
        .expect("capi placements")
        .remove(uid);
}

/// A failure domain for a new machine CAPI left unplaced: the emptiest among its
/// cluster's for its group (remembered until status says so).
fn choose<K: Machine>(
    machine: &K,
    ctx: &Context,
    domains: &capi::ClusterDomains,
    serves: impl Fn(&str) -> bool,
) -> Option<String> {
    let uid = machine.uid().unwrap_or_default();
    let mut ledger = ctx.capi_placements.lock().expect("capi placements");
    let control_plane = machine
        .labels()
        .contains_key("cluster.x-k8s.io/control-plane");
    let candidates: Vec<String> = domains
        .failure_domains
        .iter()
        .filter(|(_, cp)| *cp || !control_plane)
        .map(|(name, _)| name.clone())
        .collect();
    // Only failure domains whose Provider can serve the machine (when one can: else
    // the emptiest, whose Provider then says what it lacks).
    let capable: Vec<String> = candidates
        .iter()
        .filter(|name| failure_domains::split_name(name).is_some_and(|(p, _)| serves(p)))
        .cloned()
        .collect();
    let candidates = if capable.is_empty() {
        candidates
    } else {
        capable
    };
    let group = |labels: &std::collections::BTreeMap<String, String>| {
        GROUP_LABELS
            .iter()
            .find_map(|l| labels.get(*l).map(|v| (*l, v.clone())))
    };
    let own_group = group(machine.labels());
    let cluster = metadata::cluster_name(machine.meta()).map(str::to_owned);
    let namespace = machine.namespace();
    let mut taken: Vec<String> = vec![];
    for sibling in ctx.stores.infra_machines() {
        if sibling.uid == uid || sibling.namespace != namespace {
            continue;
        }
        if sibling.labels.get(metadata::CLUSTER_NAME_LABEL) != cluster.as_ref()
            || group(&sibling.labels) != own_group
        {
            continue;
        }
        if let Some(fd) = sibling
            .failure_domain
            .or_else(|| ledger.get(&sibling.uid).cloned())
        {
            taken.push(fd);
        }
    }
    let taken: Vec<&str> = taken.iter().map(String::as_str).collect();
    let chosen = failure_domains::spread(&candidates, &taken)?.to_owned();
    ledger.insert(uid, chosen.clone());
    Some(chosen)
}

/// The CAPI step of a reconcile.
pub(super) async fn gate<K: Machine>(machine: &K, ctx: &Context) -> Result<Gate, Error> {
    let meta = machine.meta();
    if !metadata::is_capi_managed(meta) {
        return Ok(match metadata::paused(meta, None) {
            Some(why) => Gate::Paused(why),
            None => standalone_incapable(machine, ctx).unwrap_or(Gate::Standalone),
        });
    }
    if !ctx.capi_installed {
        if let Some(why) = metadata::paused(meta, None) {
            return Ok(Gate::Paused(why));
        }
        return Ok(waiting(
            "ClusterAPINotInstalled",
            "this machine belongs to a Cluster API cluster, but cluster.x-k8s.io/v1beta2 was not served when banlieue started (restart banlieue after installing Cluster API)",
        ));
    }
    let namespace = machine.namespace().unwrap_or_default();
    let cluster = match metadata::cluster_name(meta) {
        Some(name) => cached_cluster(ctx, &namespace, name),
        None => None,
    };
    if let Some(why) = metadata::paused(meta, cluster.as_deref()) {
        return Ok(Gate::Paused(why));
    }
    let Some(owner) = metadata::capi_owner(meta, "Machine") else {
        return Ok(waiting(
            "WaitingForOwner",
            "waiting for a Cluster API Machine to own this object",
        ));
    };
    let Some(owner) = ctx
        .capi
        .as_ref()
        .and_then(|capi| capi.machine(&namespace, owner))
    else {
        return Ok(waiting(
            "WaitingForOwner",
            format!("the owner Machine {owner} does not exist (yet)"),
        ));
    };
    let Some(cluster) = cluster else {
        return Ok(waiting(
            "WaitingForCluster",
            format!(
                "the Cluster {} does not exist (yet)",
                owner.spec.cluster_name
            ),
        ));
    };
    let Some(bootstrap_secret) = owner.spec.bootstrap.data_secret_name.clone() else {
        return Ok(waiting(
            "WaitingForBootstrapData",
            format!(
                "waiting for Machine {} to have spec.bootstrap.dataSecretName",
                owner.name_any()
            ),
        ));
    };
    let recorded = recorded(machine, ctx);
    let provider_ref = machine.provider_ref().map(|r| r.name.as_str());
    let known = failure_domains::Known {
        machine_failure_domain: owner.spec.failure_domain.as_deref(),
        provider_ref,
        recorded: recorded.as_deref(),
        has_vm: machine.has_provider_id(),
    };
    // The InfraCluster is read only for a machine nothing has placed yet (or whose
    // record names no Provider).
    let placed = known.machine_failure_domain.is_some()
        || provider_ref.is_some()
        || recorded
            .as_deref()
            .and_then(|r| failure_domains::resolve_recorded(r, |p| is_provider(machine, ctx, p)))
            .is_some();
    let domains = if placed {
        capi::ClusterDomains::default()
    } else {
        capi::cluster_domains(ctx, &namespace, &cluster).await?
    };
    let when = super::plan::bootstrap_read(machine.has_provider_id(), machine.is_ready(), || {
        format_matters(ctx, &namespace)
    });
    let (format, read) = if when == super::plan::BootstrapRead::BeforePlacement {
        let secret = read_secret(ctx, &namespace, &bootstrap_secret).await?;
        (bootstrap_format(secret.as_ref()), secret.map(Box::new))
    } else {
        (BootstrapFormat::CloudConfig, None)
    };
    let decision = failure_domains::decide(
        known,
        failure_domains::ClusterView {
            providers: &domains.providers,
            published: !domains.failure_domains.is_empty(),
        },
        |p| domains.providers.iter().any(|c| c == p) || is_provider(machine, ctx, p),
    );
    let placed = match decision {
        failure_domains::Decision::Placed(placement) => Ok(placement),
        failure_domains::Decision::Wait(unplaced) => Err(unplaced),
        failure_domains::Decision::Choose => {
            let serves = |provider: &str| {
                missing(machine, ctx, provider, Some(format)).is_none_or(|m| m.is_empty())
            };
            match choose(machine, ctx, &domains, serves) {
                Some(chosen) => failure_domains::place(Some(&chosen), None, &domains.providers),
                None => Err(failure_domains::Unplaced {
                    reason: "NoFailureDomain",
                    message: "none of the failure domains the cluster publishes may host this machine (a control-plane machine needs one marked controlPlane)".into(),
                }),
            }
        }
        failure_domains::Decision::Locate(candidates) => locate(machine, ctx, &candidates).await,
    };
    match placed {
        Ok(placement) => match incapable(machine, ctx, &placement.provider, Some(format)) {
            Some(refused) => Ok(refused),
            None => Ok(Gate::Capi {
                placement,
                bootstrap_secret,
                read,
            }),
        },
        Err(unplaced) => Ok(waiting(unplaced.reason, unplaced.message)),
    }
}

/// Whether a Provider named `name` exists in the machine's namespace.
fn is_provider<K: Machine>(machine: &K, ctx: &Context, name: &str) -> bool {
    super::provider_named(machine, ctx, name).is_some()
}

/// Finds which of `candidates` (Provider names) has the machine's VM, asking each
/// backend by the machine's provider ID and UID: for a machine whose VM exists but
/// whose record of where was lost (`clusterctl move`, a restore) or never said which
/// Provider. The machine is placed where its VM is, never where a spread would put it.
pub(super) async fn locate<K: Machine>(
    machine: &K,
    ctx: &Context,
    candidates: &[String],
) -> Result<Placement, failure_domains::Unplaced> {
    let identity = super::identity(machine);
    let mut found = vec![];
    let mut unreachable = vec![];
    for name in candidates {
        let Some(provider) = super::provider_named(machine, ctx, name) else {
            continue;
        };
        let observed = match ctx.backends.for_provider(&ctx.client, &provider).await {
            Ok(backend) => backend.observe(&identity).await,
            Err(u) => Err(crate::backend::BackendError::transient(u.reason, u.message)),
        };
        match observed {
            Ok(Some(observation)) => found.push((name.clone(), observation.failure_domain)),
            Ok(None) => {}
            Err(error) => {
                tracing::debug!(provider = %name, reason = %error.reason, "locating a machine's VM");
                unreachable.push(name.clone());
            }
        }
    }
    failure_domains::located(&found, &unreachable)
}

/// Whether a bootstrap data format could change where a machine of `namespace` goes or
/// whether it waits: some Provider there (each a candidate) does not deliver every
/// format.
fn format_matters(ctx: &Context, namespace: &str) -> bool {
    ctx.stores.providers.state().iter().any(|provider| {
        provider.metadata.namespace.as_deref() == Some(namespace)
            && !capabilities::published(provider.status.as_ref()).delivers_every_bootstrap_format()
    })
}

/// `Waiting` reason of a machine whose Provider cannot do something it asks.
pub(super) const CAPABILITIES_MISSING: &str = crate::scheduling::CAPABILITIES_MISSING;

/// What `provider` (by name, in the machine's namespace) cannot do of what the machine
/// asks: its firmware, bootstrap format, power state and image source kind before it
/// exists, only its power state after. `None` when the Provider is not in the cache
/// (reported later, as `ProviderNotFound`).
fn missing<K: Machine>(
    machine: &K,
    ctx: &Context,
    provider: &str,
    bootstrap: Option<BootstrapFormat>,
) -> Option<Vec<String>> {
    let found = ctx.stores.providers.get(
        &kube::runtime::reflector::ObjectRef::new(provider)
            .within(&machine.namespace().unwrap_or_default()),
    )?;
    let mut wants = Wants::of_machine(&machine.backend_spec(), bootstrap);
    if found.spec.class == crate::api::common::ProviderClass::Sim {
        // The simulator plays any machine kind, whatever its image source says.
        wants.image_source = None;
    }
    let wants = if machine.has_provider_id() {
        wants.running()
    } else {
        wants
    };
    Some(capabilities::published(found.status.as_ref()).missing(&wants))
}

/// A `Waiting` gate naming what `provider` lacks, when it lacks anything: nothing is
/// created on a backend that would drop part of the machine.
fn incapable<K: Machine>(
    machine: &K,
    ctx: &Context,
    provider: &str,
    bootstrap: Option<BootstrapFormat>,
) -> Option<Gate> {
    let missing = missing(machine, ctx, provider, bootstrap)?;
    (!missing.is_empty()).then(|| {
        waiting(
            CAPABILITIES_MISSING,
            format!("{provider}: {}", missing.join("; ")),
        )
    })
}

/// The Cluster `name` in `namespace` from the cache (`None` when Cluster API was not
/// served at start-up, or the cache does not hold it).
fn cached_cluster(
    ctx: &Context,
    namespace: &str,
    name: &str,
) -> Option<std::sync::Arc<crate::capi::objects::Cluster>> {
    ctx.capi.as_ref()?.cluster(namespace, name)
}

/// The bootstrap data Secret `name`, if it exists: a live read, as Secrets are not
/// cached (only the few a machine names are ever read).
pub(super) async fn read_secret(
    ctx: &Context,
    namespace: &str,
    name: &str,
) -> Result<Option<Secret>, Error> {
    let secrets: kube::Api<Secret> = kube::Api::namespaced(ctx.client.clone(), namespace);
    Ok(secrets.get_opt(name).await?)
}

/// The format of a bootstrap data Secret (its `format` key; cloud-config without one,
/// or while the Secret is not there: that wait is reported later).
fn bootstrap_format(secret: Option<&Secret>) -> BootstrapFormat {
    let format = secret
        .and_then(|s| s.data.as_ref())
        .and_then(|d| d.get("format"));
    match format.map(|v| v.0.as_slice()) {
        Some(b"ignition") => BootstrapFormat::Ignition,
        _ => BootstrapFormat::CloudConfig,
    }
}

/// The capability check of a machine no Cluster API Machine owns, on its
/// `spec.providerRef`: `Some(Waiting)` when the Provider cannot serve it.
pub(super) fn standalone_incapable<K: Machine>(machine: &K, ctx: &Context) -> Option<Gate> {
    let provider = machine.provider_ref()?.name.clone();
    let format = machine.bootstrap().map(|b| b.format);
    incapable(machine, ctx, &provider, format)
}

/// The Providers a deleted machine's VM is looked for on when nothing recorded says
/// which has it: its cluster's that exist, else every Provider of its namespace.
pub(super) async fn deletion_candidates<K: Machine>(
    machine: &K,
    ctx: &Context,
) -> Result<Vec<String>, Error> {
    let namespace = machine.namespace().unwrap_or_default();
    let cluster = match metadata::cluster_name(machine.meta()) {
        Some(name) => cached_cluster(ctx, &namespace, name),
        None => None,
    };
    let of_cluster = match cluster {
        Some(cluster) => capi::cluster_domains(ctx, &namespace, &cluster)
            .await?
            .providers
            .into_iter()
            .filter(|p| is_provider(machine, ctx, p))
            .collect(),
        None => vec![],
    };
    if !of_cluster.is_empty() {
        return Ok(of_cluster);
    }
    let mut all: Vec<String> = ctx
        .stores
        .providers
        .state()
        .iter()
        .filter(|p| p.metadata.namespace.as_deref() == Some(namespace.as_str()))
        .map(|p| p.name_any())
        .collect();
    all.sort();
    Ok(all)
}
