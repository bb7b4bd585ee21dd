//! One generic reconciler for every infrastructure machine kind: finalizer, Provider
//! lookup, pause, ensure/observe/delete through the backend, and the CAPI contract
//! fields (`spec.providerID`, `status.initialization.provisioned`, `status.addresses`,
//! `status.failureDomain`, conditions), written only when they change.
//!
//! Machines a Cluster API Machine owns go through [`capi::gate`] first: owner,
//! Cluster, bootstrap data, pause and failure-domain placement come from CAPI.
//!
//! A Provider is not deleted while machines are on it (its own finalizer waits), so a
//! machine whose Provider is gone had it removed by force, or named one that never
//! existed. A machine that never reached a backend then lets go at once; one that may
//! have a backend VM keeps its finalizer and says `DeleteFailed: ProviderGone` (the VM
//! would otherwise be forgotten, still running), until the Provider is recreated or the
//! machine is annotated `banlieue.io/orphan-backend: "true"` to leave the VM behind
//! (`super::orphan_backend`, which names it in an Event and the log).

use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::Controller;
use kube::runtime::controller::{Action, Config as ControllerConfig};
use kube::runtime::events::EventType;
use kube::runtime::finalizer;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::reflector::Store;
use serde_json::json;

mod capi;
mod changes;
mod create_cap;
mod ipam;
pub(crate) mod orphan;
mod plan;
mod restore;

use super::context::{Context, key_of};
use super::feed::Subscription;
use super::status_write;
use super::watch;
use super::{MACHINE_FINALIZER, ORPHAN_BACKEND_ANNOTATION};
use crate::api::Provider;
use crate::api::common::{BootstrapFormat, PowerState};
use crate::backend::{
    BackendError, BootstrapData, Deletion, MachineIdentity, MachineRequest, SecretValue,
};
use crate::builder::{
    COPIED_FROM_ANNOTATION, IMPORTING_DISKS_ANNOTATION, INSTANCE_ID_ANNOTATION, PlacementRecord,
};
use crate::capi::metadata::{CLUSTER_NAME_LABEL, deleted_for_move};
use crate::capi::objects::{Cluster as CapiCluster, Machine as CapiMachine};
use crate::contract::InfraMachineRead;
use crate::controllers::object::Namespaced;
use crate::status::machine::{Outcome, compute};
use kube::ResourceExt;

/// Field manager of infra machine status and `spec.providerID`.
pub(crate) const FIELD_MANAGER: &str = "banlieue-machine";

/// What a reconcile can fail with.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// Not a failure: deletion is under way; look again later (keeps the finalizer).
    #[error("backend deletion in progress")]
    DeletionInProgress(Duration),
    #[error("backend: {0}")]
    Backend(BackendError),
    /// Not a failure: deletion waits while the machine is paused (keeps the finalizer).
    #[error("paused: {0}")]
    Paused(&'static str),
    /// Deletion waits for its Provider to come back (keeps the finalizer; the status
    /// says so).
    #[error("its Provider is gone")]
    ProviderGone,
}

/// The bounds every infra machine kind meets.
pub(crate) trait Machine: Namespaced + InfraMachineRead {}

impl<K: Namespaced + InfraMachineRead> Machine for K {}

fn name<K: Machine>() -> String {
    K::kind(&()).to_lowercase()
}

/// Runs the controller of kind `K` on the shared watch's `feed` and `store`.
pub(crate) async fn run<K: Machine>(
    ctx: Arc<Context>,
    feed: Subscription<K>,
    store: Store<K>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    // Our own writes' events would wake a reconcile of what it just wrote (`echoes`).
    let echoes = ctx.clone();
    let changes = feed.into_stream_skipping(move |machine: &K| {
        let kind = K::kind(&());
        echoes
            .echoes
            .skip_own_write(&echoes.written.machines, &kind, machine.meta())
    });
    let controller = Controller::for_stream(changes, store)
        .trigger_backoff(watch::backoff())
        .with_config(ControllerConfig::default().concurrency(ctx.settings.concurrency.machine));
    let machines = controller.store();
    let triggers = ctx.capi.as_ref().and_then(|capi| capi.take_triggers());
    let controller = if let Some(triggers) = triggers {
        let by_cluster = machines.clone();
        let (capi_machines, capi_clusters) = triggers.into_streams();
        controller
            .watches_stream(capi_machines, |owner: CapiMachine| {
                let reference = &owner.spec.infrastructure_ref;
                (reference.api_group == crate::api::INFRA_GROUP
                    && reference.kind == K::kind(&())
                    && !reference.name.is_empty())
                .then(|| {
                    ObjectRef::new(&reference.name).within(&owner.namespace().unwrap_or_default())
                })
            })
            .watches_stream(capi_clusters, move |cluster: CapiCluster| {
                let namespace = cluster.namespace();
                let name = cluster.name_any();
                by_cluster
                    .state()
                    .into_iter()
                    .filter(|m| {
                        m.namespace() == namespace
                            && m.labels().get(CLUSTER_NAME_LABEL) == Some(&name)
                    })
                    .map(|m| ObjectRef::from_obj(m.as_ref()))
                    .collect::<Vec<_>>()
            })
    } else {
        controller
    };
    // A create slot given back for a queued machine wakes it.
    let woken = ctx
        .create_slots
        .wakes(&K::kind(&()))
        .map(|w| ObjectRef::new(&w.name).within(&w.namespace));
    controller
        .reconcile_on(woken)
        .watches(
            watch::namespaced::<Provider>(&ctx.client, &ctx.settings),
            watch::unfiltered(),
            move |provider| {
                let namespace = provider.namespace();
                let name = provider.name_any();
                machines
                    .state()
                    .into_iter()
                    .filter(|m| {
                        m.namespace() == namespace
                            && m.provider_ref().is_some_and(|r| r.name == name)
                    })
                    .map(|m| ObjectRef::from_obj(m.as_ref()))
                    .collect::<Vec<_>>()
            },
        )
        .graceful_shutdown_on(shutdown)
        .run(reconcile::<K>, error_policy::<K>, ctx)
        .for_each(|_| futures::future::ready(()))
        .await;
}

async fn reconcile<K: Machine>(
    machine: Arc<K>,
    ctx: Arc<Context>,
) -> Result<Action, finalizer::Error<Error>> {
    let started = Instant::now();
    let controller = name::<K>();
    // Decided on before the Provider cache has listed, every machine would be
    // "ProviderNotFound" for a moment after a new leader starts.
    ctx.stores_synced.wait().await;
    let _worker = ctx.metrics.worker(&controller);
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &machine.namespace().unwrap_or_default());
    let result = finalizer(&api, MACHINE_FINALIZER, machine, |event| async {
        match event {
            finalizer::Event::Apply(m) => apply(m.as_ref(), &ctx).await,
            finalizer::Event::Cleanup(m) => cleanup(m.as_ref(), &ctx).await,
        }
    })
    .await;
    let outcome = match &result {
        Ok(_) => "success",
        Err(finalizer::Error::CleanupFailed(
            Error::DeletionInProgress(_) | Error::Paused(_) | Error::ProviderGone,
        )) => "requeue_after",
        Err(_) => "error",
    };
    ctx.metrics
        .reconciled(&controller, outcome, started.elapsed());
    result
}

fn provider_of<K: Machine>(machine: &K, ctx: &Context) -> Option<Arc<Provider>> {
    provider_named(machine, ctx, &machine.provider_ref()?.name)
}

fn provider_named<K: Machine>(machine: &K, ctx: &Context, name: &str) -> Option<Arc<Provider>> {
    ctx.stores
        .providers
        .get(&ObjectRef::new(name).within(&machine.namespace().unwrap_or_default()))
}

/// The machine's identity for its backend: its UID, and its `spec.providerID` once set,
/// which is what survives `clusterctl move` and restores (the backend finds the VM by
/// it first and adopts it).
fn identity<K: Machine>(machine: &K) -> MachineIdentity {
    MachineIdentity {
        uid: machine.uid().unwrap_or_default(),
        namespace: machine.namespace().unwrap_or_default(),
        name: machine.name_any(),
        provider_id: machine
            .provider_id()
            .filter(|id| !id.is_empty())
            .map(str::to_owned),
    }
}

async fn apply<K: Machine>(machine: &K, ctx: &Context) -> Result<Action, Error> {
    let importing = machine.annotations().get(IMPORTING_DISKS_ANNOTATION);
    if let Some(stop) = plan::held(
        deleted_for_move(machine.meta()),
        importing.map(String::as_str),
    ) {
        return stopped(machine, ctx, stop).await;
    }
    if let Some(owner) = elder_claimant(machine, ctx) {
        let error = BackendError::terminal(
            PROVIDER_ID_IN_USE,
            format!(
                "spec.providerID {} is the providerID of {owner}, which was there first: one backend VM cannot belong to two machines, so this one neither adopts nor deletes it. Delete this object, or re-create it without spec.providerID to get a VM of its own",
                machine.provider_id().unwrap_or_default()
            ),
        );
        return provider_id_conflict(machine, ctx, &error).await;
    }
    let gate = capi::gate(machine, ctx).await?;
    let (placement, capi_bootstrap) = match gate {
        capi::Gate::Standalone => (None, None),
        capi::Gate::Capi {
            placement,
            bootstrap_secret,
            read,
        } => (Some(placement), Some((bootstrap_secret, read))),
        capi::Gate::Paused(message) => {
            return stopped(machine, ctx, plan::Stop::Paused(message)).await;
        }
        capi::Gate::Waiting {
            reason,
            message,
            retry,
        } => {
            let stop = plan::Stop::Waiting {
                reason,
                message,
                retry: plan::Retry::After(retry),
            };
            return stopped(machine, ctx, stop).await;
        }
    };
    let placed_on = placement.as_ref().map(|p| p.provider.as_str());
    let referenced = machine.provider_ref().map(|r| r.name.as_str());
    let found = match placed_on.or(referenced) {
        Some(name) => provider_named(machine, ctx, name),
        None => None,
    };
    let provider = match plan::provider(
        placed_on,
        referenced,
        found.as_deref(),
        reached_backend(machine),
    ) {
        Ok(provider) => provider,
        Err(stop) => return stopped(machine, ctx, stop).await,
    };
    let backend = match ctx.backends.for_provider(&ctx.client, provider).await {
        Ok(backend) => backend,
        Err(unreachable) => {
            let stop = plan::Stop::Waiting {
                reason: "ProviderNotReady",
                message: format!("{}: {}", unreachable.reason, unreachable.message),
                retry: plan::Retry::Backoff,
            };
            return stopped(machine, ctx, stop).await;
        }
    };
    // Only a peek: a machine queued behind the cap reads nothing; one that waits for
    // its bootstrap Secret or an address below takes no slot (it is taken right
    // before the backend), so waiting machines cannot block a Provider's creates.
    if let Err(stop) = create_cap::may_create(machine, ctx, provider, &backend) {
        return stopped(machine, ctx, stop).await;
    }
    // A machine with no provider ID and nothing recorded may be an object restored from
    // a backup (or a VM's machine rebuilt after one): its VM may exist under an older UID.
    let adopting = match restore_gate(machine, ctx, &backend).await {
        Ok(adopting) => adopting,
        Err(stop) => return stopped(machine, ctx, stop).await,
    };
    // Placement is behind us: the format decides nothing more here.
    let when = plan::bootstrap_read(machine.has_provider_id(), machine.is_ready(), || false);
    let bootstrap_ref = match (capi_bootstrap, machine.bootstrap()) {
        _ if when == plan::BootstrapRead::Never => None,
        (Some((secret, read)), _) => Some((secret, BootstrapFormat::CloudConfig, read)),
        (None, Some(reference)) => {
            Some((reference.data_secret_name.clone(), reference.format, None))
        }
        (None, None) => None,
    };
    let bootstrap = match bootstrap_ref {
        None => None,
        Some((secret, format, read)) => {
            let read = read_bootstrap(ctx, machine, &secret, format, read).await;
            match read.inspect_err(|_| create_cap::release_create(machine, ctx))? {
                Some(data) => Some(data),
                None => {
                    let stop = plan::Stop::Waiting {
                        reason: "BootstrapDataNotFound",
                        message: format!("bootstrap Secret {secret} not found"),
                        retry: plan::Retry::After(Duration::from_secs(10)),
                    };
                    return stopped(machine, ctx, stop).await;
                }
            }
        }
    };
    let addresses = ipam::ensure(machine, ctx, machine.backend_spec()).await;
    let spec = match addresses.inspect_err(|_| create_cap::release_create(machine, ctx))? {
        ipam::Addresses::Resolved(spec) => *spec,
        ipam::Addresses::Waiting { reason, message } => {
            let stop = plan::Stop::Waiting {
                reason,
                message,
                retry: plan::Retry::After(ipam::RECHECK),
            };
            return stopped(machine, ctx, stop).await;
        }
    };
    let mut identity = identity(machine);
    if let Some((provider_id, from)) = &adopting {
        identity.provider_id = Some(provider_id.clone());
        ctx.event(
            machine,
            EventType::Normal,
            "Adopted",
            "Ensure",
            format!("adopting the backend VM {from}, made for this object's namespace, kind and name before it was restored"),
        )
        .await;
    }
    let mut request = MachineRequest {
        identity,
        spec,
        failure_domain: match &placement {
            Some(p) => p.failure_domain.clone(),
            None => PlacementRecord::failure_domain(machine.meta()),
        },
        bootstrap,
        instance_id: machine.annotations().get(INSTANCE_ID_ANNOTATION).cloned(),
        disks_imported: machine.annotations().contains_key(COPIED_FROM_ANNOTATION),
    };
    let recorded = machine.machine_status();
    let change_failed = recorded.is_some_and(|s| {
        crate::conditions::get(&s.conditions, crate::conditions::types::UP_TO_DATE)
            .is_some_and(|c| c.reason == crate::status::machine::CHANGE_FAILED)
    });
    if let Some(changes) = plan::restart_to_apply(
        request.spec.change_policy(),
        request.spec.power_state(),
        recorded.and_then(|s| s.resources.as_ref()),
        change_failed,
    ) {
        // Powered off here, not in the object: once off, the changes are applied and
        // nothing waits, so the next reconcile powers it on as its spec asks.
        if recorded.and_then(|s| s.power_state) == Some(PowerState::PoweredOn) {
            ctx.event(
                machine,
                EventType::Normal,
                "RestartingToApplyChanges",
                "ApplyChanges",
                format!("changePolicy is Restart: powering the machine off to apply {changes}, then on again"),
            )
            .await;
        }
        request.spec.set_power_state(PowerState::PoweredOff);
    }
    let creating = match create_cap::admit_create(machine, ctx, provider, &backend) {
        Ok(creating) => creating,
        Err(stop) => return stopped(machine, ctx, stop).await,
    };
    let ensured = if request.disks_imported && backend.disk_transfer().is_none() {
        // Annotated as made on copied disks by hand, or the Provider changed class:
        // this backend cannot have them, and must not clone the image instead.
        Err(BackendError::terminal(
            "ImportedDisksUnsupported",
            format!(
                "annotated {COPIED_FROM_ANNOTATION}, but the {} backend cannot import disks",
                backend.class.as_str()
            ),
        ))
    } else {
        backend.ensure(&request).await
    };
    if creating {
        let done = match &ensured {
            // It exists: the clone (or create) is done, whatever boots after it.
            Ok(seen) => seen.provider_id.is_some(),
            Err(error) => !error.is_transient(),
        };
        if done {
            create_cap::release_create(machine, ctx);
        }
    }
    match ensured {
        Ok(mut observation) => {
            if let Some(mismatch) = provider_id_mismatch(machine, &observation) {
                return provider_id_conflict(machine, ctx, &mismatch).await;
            }
            let desired = request.spec.resources();
            let changed = changes::settle(&backend, &request, &mut observation, &desired).await;
            // The providerID patch bumps the generation: the status is computed from the
            // object it returns, or it would carry the old observedGeneration and need a
            // second write once the cache catches up.
            let recorded = async {
                let patched = match &observation.provider_id {
                    Some(id) if machine.provider_id() != Some(id.as_str()) => {
                        Some(set_provider_id(machine, ctx, id).await?)
                    }
                    _ => None,
                };
                let current = patched.as_ref().unwrap_or(machine);
                // A CAPI machine reports where it is by a name that reads back as its
                // Provider and failure domain (never the backend's bare name).
                let reported = placement.as_ref().and_then(|p| {
                    crate::capi::failure_domains::reported(p, observation.failure_domain.as_deref())
                });
                write_status(
                    current,
                    ctx,
                    Outcome::Observed(&observation),
                    reported.as_deref(),
                    changed.resources(&desired),
                )
                .await
            };
            match recorded.await {
                Err(error) if orphan::orphaned(machine, &error) => {
                    return orphan::delete_orphan(machine, ctx, &backend, &observation).await;
                }
                recorded => recorded?,
            }
            if let changes::Settled::Failed(error) = &changed
                && !error.is_transient()
            {
                ctx.event(
                    machine,
                    EventType::Warning,
                    &error.reason,
                    "ApplyChanges",
                    error.message.clone(),
                )
                .await;
            }
            let next = plan::after_ensure(Ok(&observation), machine.desired_power_state(), false);
            let retry = changed.retry(next.retry);
            if retry != plan::Retry::Backoff {
                ctx.succeeded(&key_of(machine));
            }
            Ok(action(machine, ctx, retry))
        }
        Err(error) => {
            let announced = machine.machine_status().is_some_and(|s| {
                crate::conditions::get(&s.conditions, crate::conditions::types::READY)
                    .is_some_and(|c| c.message == format!("{}: {}", error.reason, error.message))
            });
            write_status(machine, ctx, Outcome::Failed(&error), None, None).await?;
            let next = plan::after_ensure(Err(&error), machine.desired_power_state(), announced);
            if next.announce {
                ctx.event(
                    machine,
                    EventType::Warning,
                    &error.reason,
                    "Ensure",
                    error.message.clone(),
                )
                .await;
            }
            let retry = action(machine, ctx, next.retry);
            tracing::debug!(machine = %key_of(machine), reason = %error.reason, ?retry, "ensure failed");
            Ok(retry)
        }
    }
}

/// What a machine without a provider ID does about the backend VMs made for its
/// namespace, kind and name ([`restore::decide`]).
/// Whether a machine about to be created adopts a backend VM made for its namespace,
/// kind and name (`Some((provider ID, which VM))`), is created (`None`), or waits (the
/// [`plan::Stop`] to report). Only a machine with no provider ID that never reached a
/// backend and is not made on copied disks is looked for.
async fn restore_gate<K: Machine>(
    machine: &K,
    ctx: &Context,
    backend: &super::backends::Instrumented,
) -> Result<Option<(String, String)>, plan::Stop> {
    if machine.has_provider_id()
        || reached_backend(machine)
        || machine.annotations().contains_key(COPIED_FROM_ANNOTATION)
    {
        return Ok(None);
    }
    match restored(machine, ctx, backend).await {
        Ok(restore::Restore::Ensure) => Ok(None),
        Ok(restore::Restore::Adopt { provider_id, from }) => Ok(Some((provider_id, from))),
        Ok(restore::Restore::Wait(message)) => Err(plan::Stop::Waiting {
            reason: restore::RESTORE_PENDING,
            message,
            retry: plan::Retry::After(restore::RESTORE_RECHECK),
        }),
        Err(error) => Err(plan::Stop::Waiting {
            reason: "ProviderNotReady",
            message: format!(
                "looking for a backend VM made for this object before creating one: {}: {}",
                error.reason, error.message
            ),
            retry: plan::Retry::Backoff,
        }),
    }
}

async fn restored<K: Machine>(
    machine: &K,
    ctx: &Context,
    backend: &super::backends::Instrumented,
) -> Result<restore::Restore, BackendError> {
    let kind = K::kind(&());
    let identity = identity(machine);
    let found = backend.made_for(&kind, &identity).await?;
    let what = format!("{kind} {}/{}", identity.namespace, identity.name);
    let uid = identity.uid.as_str();
    Ok(restore::decide(uid, &what, &found, |made| {
        let by_id = ctx
            .stores
            .machines
            .iter()
            .flat_map(|k| k.claiming(&made.provider_id, uid))
            .map(|(_, _, who)| who)
            .min();
        by_id.or_else(|| {
            let recorded = made.uid.as_deref()?;
            ctx.stores
                .infra_machines()
                .iter()
                .any(|m| m.uid == recorded)
                .then(|| format!("the live machine with UID {recorded}"))
        })
    }))
}

/// What a plan's [`plan::Retry`] is for this machine.
fn action<K: Machine>(machine: &K, ctx: &Context, retry: plan::Retry) -> Action {
    match retry {
        plan::Retry::AwaitChange => Action::await_change(),
        plan::Retry::After(after) => Action::requeue(after),
        plan::Retry::Backoff => Action::requeue(ctx.backoff(&key_of(machine))),
        plan::Retry::SyncPeriod => Action::requeue(ctx.settings.sync_period),
    }
}

/// Writes what a reconcile that stops before the backend says, and when it looks again.
/// A create slot it holds (from an earlier reconcile whose create did not finish) is
/// given back: a machine that waits creates nothing meanwhile.
async fn stopped<K: Machine>(
    machine: &K,
    ctx: &Context,
    stop: plan::Stop,
) -> Result<Action, Error> {
    if !create_cap::is_queued(&stop) {
        create_cap::release_create(machine, ctx);
    }
    let retry = match &stop {
        plan::Stop::Quiet => return Ok(Action::await_change()),
        plan::Stop::Paused(message) => {
            write_status(machine, ctx, Outcome::Paused { message }, None, None).await?;
            plan::Retry::AwaitChange
        }
        plan::Stop::Waiting {
            reason,
            message,
            retry,
        } => {
            write_status(
                machine,
                ctx,
                Outcome::Waiting { reason, message },
                None,
                None,
            )
            .await?;
            *retry
        }
    };
    Ok(action(machine, ctx, retry))
}

async fn cleanup<K: Machine>(machine: &K, ctx: &Context) -> Result<Action, Error> {
    // Going: its create, if still running, no longer holds back the others.
    create_cap::release_create(machine, ctx);
    // Before the pause check: `clusterctl move` pauses the Cluster before it deletes.
    if deleted_for_move(machine.meta()) {
        // clusterctl move recreated this object elsewhere, where it adopts the VM by
        // its providerID: the VM lives on.
        let_go(machine, ctx);
        return Ok(Action::await_change());
    }
    // The escape hatch, asked for by a human (or passed on from its VirtualMachine or
    // Provider): before the pause, which it would otherwise wait out.
    if super::orphan_backend::requested(machine.meta()) {
        let provider = provider_name(machine).unwrap_or_default();
        super::orphan_backend::abandon_machine(machine, ctx, &provider).await;
        ipam::release(machine, ctx).await?;
        let_go(machine, ctx);
        return Ok(Action::await_change());
    }
    if let Some(why) = capi::paused(machine, ctx).await? {
        return Err(Error::Paused(why));
    }
    if let Some(owner) = elder_claimant(machine, ctx) {
        // Its spec.providerID names another machine's VM: deleting through it would
        // delete that machine's VM.
        ctx.event(
            machine,
            EventType::Normal,
            "BackendVMKept",
            "Delete",
            format!(
                "the backend VM {} belongs to {owner}, and is kept",
                machine.provider_id().unwrap_or_default()
            ),
        )
        .await;
        let_go(machine, ctx);
        return Ok(Action::await_change());
    }
    let provider = match deleting_provider(machine, ctx).await? {
        Deleting::On(provider) => provider,
        Deleting::Unknown(asked) => return provider_gone(machine, ctx, &asked).await,
        Deleting::Unreachable(error) => return delete_failed(machine, ctx, error).await,
    };
    let deleted = match ctx.backends.for_provider(&ctx.client, &provider).await {
        Ok(backend) => backend.delete(&identity(machine)).await,
        Err(u) => Err(BackendError::transient(u.reason, u.message)),
    };
    match deleted {
        Err(error) => delete_failed(machine, ctx, error).await,
        Ok(Deletion::Gone) => {
            ipam::release(machine, ctx).await?;
            let_go(machine, ctx);
            Ok(Action::await_change())
        }
        Ok(Deletion::InProgress { retry_after }) => Err(Error::DeletionInProgress(retry_after)),
    }
}

/// Where a machine's VM is deleted.
enum Deleting {
    /// Through this Provider.
    On(Arc<Provider>),
    /// No Provider that exists has it; these were asked.
    Unknown(Vec<String>),
    /// A Provider that may have it could not be asked.
    Unreachable(BackendError),
}

/// The Provider a machine's VM is deleted through: the one it names, else the one its
/// recorded failure domain names, else (a CAPI machine whose status was lost in a move,
/// or records the backend's bare failure-domain name, as releases before this one
/// could) the one of its cluster's Providers that has its VM.
async fn deleting_provider<K: Machine>(machine: &K, ctx: &Context) -> Result<Deleting, Error> {
    if let Some(provider) = provider_of(machine, ctx) {
        return Ok(Deleting::On(provider));
    }
    let recorded = machine
        .machine_status()
        .and_then(|s| s.failure_domain.as_deref());
    if let Some((name, _)) = recorded.and_then(|r| {
        crate::capi::failure_domains::resolve_recorded(r, |p| {
            provider_named(machine, ctx, p).is_some()
        })
    }) && let Some(provider) = provider_named(machine, ctx, name)
    {
        return Ok(Deleting::On(provider));
    }
    if machine.provider_ref().is_some() || !reached_backend(machine) {
        return Ok(Deleting::Unknown(vec![]));
    }
    let candidates = capi::deletion_candidates(machine, ctx).await?;
    Ok(match capi::locate(machine, ctx, &candidates).await {
        Ok(placement) => match provider_named(machine, ctx, &placement.provider) {
            Some(provider) => Deleting::On(provider),
            None => Deleting::Unknown(candidates),
        },
        Err(unplaced) if unplaced.reason == "ProviderNotReady" => {
            Deleting::Unreachable(BackendError::transient(unplaced.reason, unplaced.message))
        }
        Err(_) => Deleting::Unknown(candidates),
    })
}

/// Forgets what this process remembers about a machine whose finalizer goes (what it
/// wrote, where it was placed, its failure count), so per-machine memory does not grow
/// with every machine ever deleted.
fn let_go<K: Machine>(machine: &K, ctx: &Context) {
    let uid = machine.uid().unwrap_or_default();
    ctx.written.machines.forget(&uid);
    ctx.echoes.forget(&uid);
    crate::scrub::global().forget(&bootstrap_source(&uid));
    capi::forget_placement(ctx, &uid);
    ctx.succeeded(&key_of(machine));
}

/// The machine's Provider is gone (`asked`: the Providers that were asked for its VM
/// and do not have it). If the machine never reached a backend there is nothing to
/// delete; otherwise its VM may still run, and letting go would forget it.
async fn provider_gone<K: Machine>(
    machine: &K,
    ctx: &Context,
    asked: &[String],
) -> Result<Action, Error> {
    if !reached_backend(machine) {
        let_go(machine, ctx);
        return Ok(Action::await_change());
    }
    let recorded = machine
        .machine_status()
        .and_then(|s| s.failure_domain.clone());
    let message = match (machine.provider_ref(), recorded) {
        (Some(r), _) => gone_message(&r.name),
        (None, Some(recorded)) if asked.is_empty() => gone_message(
            crate::capi::failure_domains::split_name(&recorded)
                .map_or(recorded.as_str(), |(p, _)| p),
        ),
        (None, recorded) => format!(
            "no Provider is known to have this machine's VM (status.failureDomain {}; asked {}), so it cannot be deleted and may still be running. Recreate the Provider it was on (same class and endpoint), or set spec.providerRef to it, to finish the deletion, or annotate this machine (or its VirtualMachine) {ORPHAN_BACKEND_ANNOTATION}=true to let it go and leave the VM behind",
            recorded.as_deref().unwrap_or("not set"),
            if asked.is_empty() {
                "none".to_owned()
            } else {
                asked.join(", ")
            },
        ),
    };
    let error = BackendError::terminal(PROVIDER_GONE, message);
    let already = machine.machine_status().is_some_and(|s| {
        crate::conditions::get(&s.conditions, crate::conditions::types::READY)
            .is_some_and(|c| c.message.starts_with(PROVIDER_GONE))
    });
    write_status(machine, ctx, Outcome::DeleteFailed(&error), None, None).await?;
    if !already {
        ctx.event(
            machine,
            EventType::Warning,
            PROVIDER_GONE,
            "Delete",
            error.message.clone(),
        )
        .await;
    }
    Err(Error::ProviderGone)
}

/// The name of the Provider a machine runs on: the one it names, else the one its
/// status says it landed on (for the record of what an escape hatch abandons).
fn provider_name<K: Machine>(machine: &K) -> Option<String> {
    machine.provider_ref().map(|r| r.name.clone()).or_else(|| {
        let landed = machine.machine_status()?.failure_domain.as_deref()?;
        crate::capi::failure_domains::split_name(landed).map(|(p, _)| p.to_owned())
    })
}

/// The message of a machine whose Provider `named` is gone.
fn gone_message(named: &str) -> String {
    format!(
        "Provider {named} no longer exists, so the backend VM cannot be deleted and may still be running. Recreate Provider {named} (same class and endpoint) to finish the deletion, or annotate this machine (or its VirtualMachine) {ORPHAN_BACKEND_ANNOTATION}=true to let it go and leave the VM behind"
    )
}

/// Why a machine's deletion waits for its Provider.
const PROVIDER_GONE: &str = "ProviderGone";

/// Whether a backend may have made a VM for this machine: it has a providerID, or its
/// status says where it landed or that it was provisioned. A machine that only ever
/// waited (e.g. for a Provider that never existed) has none of these.
fn reached_backend<K: Machine>(machine: &K) -> bool {
    machine.has_provider_id()
        || machine.machine_status().is_some_and(|s| {
            s.failure_domain.is_some()
                || s.backend_ref.is_some()
                || !s.addresses.is_empty()
                || s.initialization
                    .as_ref()
                    .and_then(|i| i.provisioned)
                    .unwrap_or(false)
        })
}

/// The backend did not delete the VM: the machine's `Ready` condition says why (a
/// machine stuck deleting must explain itself), and the delete is retried with backoff,
/// even after a terminal error, since the finalizer must not go while the VM may exist.
async fn delete_failed<K: Machine>(
    machine: &K,
    ctx: &Context,
    mut error: BackendError,
) -> Result<Action, Error> {
    if !error.is_transient() {
        // Retried anyway, but it may never pass: say how to get out.
        error.message.push_str(&format!(
            ". To let this machine go and leave its backend VM behind, annotate it (or its VirtualMachine) {ORPHAN_BACKEND_ANNOTATION}=true"
        ));
    }
    write_status(machine, ctx, Outcome::DeleteFailed(&error), None, None).await?;
    if !error.is_transient() {
        ctx.event(
            machine,
            EventType::Warning,
            &error.reason,
            "Delete",
            error.message.clone(),
        )
        .await;
    }
    Err(Error::Backend(error))
}

/// The scrubber source of a machine's bootstrap secrets. Not a `namespace/name`, so no
/// Provider's source can collide with it.
fn bootstrap_source(uid: &str) -> String {
    format!("bootstrap:{uid}")
}

/// The bootstrap data in Secret `secret` (`read`, when the CAPI step read it already).
async fn read_bootstrap<K: Machine>(
    ctx: &Context,
    machine: &K,
    secret: &str,
    format: BootstrapFormat,
    read: Option<Box<Secret>>,
) -> Result<Option<BootstrapData>, Error> {
    let read = match read {
        Some(read) => Some(*read),
        None => capi::read_secret(ctx, &machine.namespace().unwrap_or_default(), secret).await?,
    };
    let Some(secret) = read else {
        return Ok(None);
    };
    let data = secret.data.unwrap_or_default();
    let text = |key: &str| {
        data.get(key)
            .and_then(|v| String::from_utf8(v.0.clone()).ok())
    };
    // The join tokens and keys in it are scrubbed from every message until the machine
    // goes: a backend that echoes a create request would otherwise publish them.
    let secrets = ["value", "network-config"]
        .into_iter()
        .filter_map(text)
        .flat_map(|t| crate::scrub::bootstrap_secrets(&t));
    crate::scrub::global().register(
        &bootstrap_source(&machine.uid().unwrap_or_default()),
        secrets,
    );
    let format = match text("format").as_deref() {
        Some("ignition") => BootstrapFormat::Ignition,
        Some("cloud-config") => BootstrapFormat::CloudConfig,
        _ => format,
    };
    Ok(text("value").map(|value| BootstrapData {
        format,
        user_data: SecretValue::new(value),
        network_config: text("network-config").map(SecretValue::new),
    }))
}

/// Reason of the terminal failure of a machine whose `spec.providerID` is an older
/// machine's.
const PROVIDER_ID_IN_USE: &str = "ProviderIDInUse";

/// Another live machine with the same `spec.providerID` that ranks first (provisioned,
/// then older), which owns the backend VM. Only asked of machines that could be
/// newcomers (not yet provisioned) or are being deleted: a scan of the caches, not paid
/// on every resync of a settled machine.
fn elder_claimant<K: Machine>(machine: &K, ctx: &Context) -> Option<String> {
    let id = machine.provider_id().filter(|id| !id.is_empty())?;
    let rank = super::machine_cache::claim_rank(machine);
    let provisioned = !rank.0;
    if provisioned && machine.meta().deletion_timestamp.is_none() {
        return None;
    }
    ctx.stores
        .elder_claimant(id, &machine.uid().unwrap_or_default(), &rank)
}

/// Reason of the terminal failure of a machine whose `spec.providerID` names another
/// machine than the one the backend keeps for it.
pub(crate) const PROVIDER_ID_MISMATCH: &str = "ProviderIDMismatch";

/// The terminal error of a machine whose `spec.providerID` (set by hand, or by a
/// restore) differs from the provider ID of the backend machine made for its UID.
/// `spec.providerID` is immutable once set: patching it would be refused (422) on
/// every reconcile. Nothing is patched and nothing is created (backends look a
/// machine up by UID, then by provider ID, and never create under a set one).
fn provider_id_mismatch<K: Machine>(
    machine: &K,
    observation: &crate::backend::MachineObservation,
) -> Option<BackendError> {
    let set = machine.provider_id().filter(|id| !id.is_empty())?;
    let found = observation.provider_id.as_deref()?;
    (set != found).then(|| {
        BackendError::terminal(
            PROVIDER_ID_MISMATCH,
            format!(
                "spec.providerID is {set}, but the backend machine made for this object \
                 (UID {uid}) is {found}; spec.providerID is immutable, so banlieue cannot \
                 correct it, and it adopts no other machine. Delete this object to let its \
                 owner replace it (the backend machine {found} goes with it), or re-create \
                 it with spec.providerID {found} (or none) to keep that machine",
                uid = machine.uid().unwrap_or_default(),
            ),
        )
    })
}

/// Records a [`provider_id_mismatch`]: `Ready` says it (`TerminalFailure`), a Warning
/// Event says it once, and the machine is only looked at again slowly.
async fn provider_id_conflict<K: Machine>(
    machine: &K,
    ctx: &Context,
    error: &BackendError,
) -> Result<Action, Error> {
    let previous = ctx.written.machines.latest(
        &machine.uid().unwrap_or_default(),
        machine.resource_version().as_deref(),
        machine.machine_status(),
    );
    let said = previous
        .as_ref()
        .and_then(|s| crate::conditions::get(&s.conditions, crate::conditions::types::READY))
        .is_some_and(|c| c.message == format!("{}: {}", error.reason, error.message));
    write_status(machine, ctx, Outcome::Failed(error), None, None).await?;
    if !said {
        ctx.event(
            machine,
            EventType::Warning,
            &error.reason,
            "Ensure",
            error.message.clone(),
        )
        .await;
    }
    Ok(Action::requeue(ctx.settings.sync_period))
}

/// Sets `spec.providerID` and returns the machine as the API server now has it.
async fn set_provider_id<K: Machine>(machine: &K, ctx: &Context, id: &str) -> Result<K, Error> {
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &machine.namespace().unwrap_or_default());
    // A merge patch: cheaper for the API server than an apply (see `status_patch`).
    let mut patched = api
        .patch(
            &machine.name_any(),
            &PatchParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..PatchParams::default()
            },
            &Patch::Merge(json!({"spec": {"providerID": id}})),
        )
        .await?;
    ctx.metrics.wrote(&name::<K>());
    if let (Some(uid), Some(version)) = (patched.uid(), patched.resource_version()) {
        ctx.echoes.expect(&uid, &version);
    }
    tracing::debug!(machine = %key_of(machine), provider_id = %id, "provisioned");
    patched.meta_mut().managed_fields = None;
    Ok(patched)
}

/// Writes the status `outcome` leads to, if it changed. `reported_failure_domain`
/// replaces the backend's name for where the machine landed (CAPI machines report
/// the name their cluster published).
async fn write_status<K: Machine>(
    machine: &K,
    ctx: &Context,
    outcome: Outcome<'_>,
    reported_failure_domain: Option<&str>,
    resources: Option<crate::status::machine::Resources<'_>>,
) -> Result<(), Error> {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let previous = status_write::known(&ctx.written.machines, machine, machine.machine_status());
    let mut status = compute(
        previous.as_ref(),
        machine.desired_power_state(),
        machine.meta().generation,
        outcome,
        &now,
    );
    if let Some(name) = reported_failure_domain {
        status.failure_domain = Some(name.to_owned());
    }
    if let Some(resources) = resources {
        crate::status::machine::record_resources(
            &mut status,
            resources,
            machine.meta().generation,
            &now,
        );
    }
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &machine.namespace().unwrap_or_default());
    let written = &ctx.written.machines;
    let manager = (FIELD_MANAGER, name::<K>());
    let version = status_write::write_versioned(
        ctx,
        &api,
        machine,
        Some(written),
        (manager.0, &manager.1),
        previous.as_ref(),
        status,
    )
    .await?;
    if let Some(version) = version {
        ctx.echoes
            .expect(&machine.uid().unwrap_or_default(), &version);
    }
    Ok(())
}

fn error_policy<K: Machine>(
    machine: Arc<K>,
    error: &finalizer::Error<Error>,
    ctx: Arc<Context>,
) -> Action {
    match error {
        finalizer::Error::CleanupFailed(Error::DeletionInProgress(after)) => {
            Action::requeue(*after)
        }
        finalizer::Error::CleanupFailed(Error::Paused(_)) => {
            Action::requeue(Duration::from_secs(30))
        }
        // A recreated Provider wakes the machine through the Provider watch.
        finalizer::Error::CleanupFailed(Error::ProviderGone) => {
            Action::requeue(ctx.settings.sync_period)
        }
        other
            if super::expected::race(other, |e| match e {
                Error::Kube(e) => Some(e),
                #[allow(unreachable_patterns)]
                _ => None,
            }) =>
        {
            tracing::debug!(machine = %key_of(machine.as_ref()), kind = %K::kind(&()), error = %other, "reconcile raced a stale cache; retrying");
            Action::requeue(super::expected::RETRY_RACE)
        }
        other => {
            tracing::warn!(machine = %key_of(machine.as_ref()), kind = %K::kind(&()), error = %other, "reconcile failed");
            Action::requeue(ctx.backoff(&key_of(machine.as_ref())))
        }
    }
}
