//! The VirtualMachine controller: resolve class and image, schedule, build and apply
//! the infra machine (from its class as it is, or as it was when the class keeps its
//! VMs as they are: see [`plan::class_use`]), mirror its status, move it when the
//! placement requires another Provider, and delete it explicitly before letting the VM
//! go.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::runtime::controller::{Action, Config as ControllerConfig};
use kube::runtime::events::EventType;
use kube::runtime::finalizer;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

pub(crate) mod copy_disk;
mod plan;

use super::bootstrap;
use super::context::{Context, key_of};
use super::infra::{self, Existing};
use super::kinds::Shutdown;
use super::status_write;
use super::{VIRTUAL_MACHINE_FINALIZER, watch};
use crate::api::virtual_machine::{MigrationStrategy, PlacementBasis, ScheduledPlacement};
use crate::api::{Provider, VMClass, VMImage, VirtualMachine};
use crate::builder::{self, ClassRecord, machine_kind};
use crate::conditions;
use crate::scheduling::{self, Basis, Decision, Drift, Sibling, Target};
use crate::status::machine::DELETE_FAILED;
use crate::status::virtual_machine::{
    ClassTrack, Infra, Input, Migration, PlacementDrift, Scheduling, compute, worth_writing,
};
use plan::Placement;

const NAME: &str = "virtualmachine";

/// How soon a VM waiting on its infra machine is looked at again without any event.
const WAITING_RECHECK: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// Not a failure: the infra machine is still being deleted (keeps the finalizer).
    #[error("waiting for the infrastructure machine to be deleted")]
    WaitingForInfra,
}

pub(crate) async fn run(ctx: Arc<Context>, shutdown: Shutdown) {
    let client = &ctx.client;
    let settings = &ctx.settings;
    // Our own status writes' events would wake a reconcile of what it just wrote
    // (`echoes`; every wait here is timed or on another object's change).
    let echoes = ctx.clone();
    let controller = watch::controller_skipping(
        watch::namespaced::<VirtualMachine>(client, settings),
        watch::filtered(settings),
        move |vm: &VirtualMachine| {
            if vm.status.as_ref().is_some_and(|s| s.placement.is_some()) {
                // The cache shows the placement: the ledger need not hold it until the
                // next reconcile (which an echo skips; at peak it held every VM's).
                let uid = vm.meta().uid.as_deref().unwrap_or_default();
                echoes
                    .placements
                    .lock()
                    .expect("placement ledger")
                    .forget(uid);
            }
            let written = &echoes.written.virtual_machines;
            echoes
                .echoes
                .skip_own_write(written, "VirtualMachine", vm.meta())
        },
    )
    .with_config(ControllerConfig::default().concurrency(settings.concurrency.virtual_machine));
    let _ = ctx.vms.set(controller.store());
    let (by_class, by_image, by_provider) =
        (controller.store(), controller.store(), controller.store());
    // Woken by the infra machines it owns, of every registered kind, as the shared
    // watches feed them (see `feed`).
    let controller = ctx
        .stores
        .machines
        .iter()
        .fold(controller, |controller, kind| kind.owned_by(controller));
    controller
        .watches(
            Api::<VMClass>::all(client.clone()),
            watch::unfiltered(),
            move |class| {
                let name = class.name_any();
                refs(&by_class, |vm| vm.spec.class_ref.name == name)
            },
        )
        .watches(
            Api::<VMImage>::all(client.clone()),
            watch::unfiltered(),
            move |image| {
                let name = image.name_any();
                refs(&by_image, |vm| vm.spec.image_ref.name == name)
            },
        )
        .watches(
            watch::namespaced::<Provider>(client, settings),
            watch::unfiltered(),
            move |provider| {
                let (namespace, name) = (provider.namespace(), provider.name_any());
                // Only VMs that could care: unplaced ones, and those placed on this Provider.
                refs(&by_provider, |vm| {
                    vm.namespace() == namespace
                        && match vm.status.as_ref().and_then(|s| s.placement.as_ref()) {
                            None => true,
                            Some(p) => p.provider == name,
                        }
                })
            },
        )
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|_| futures::future::ready(()))
        .await;
}

fn refs(
    store: &kube::runtime::reflector::Store<VirtualMachine>,
    wanted: impl Fn(&VirtualMachine) -> bool,
) -> Vec<ObjectRef<VirtualMachine>> {
    store
        .state()
        .into_iter()
        .filter(|vm| wanted(vm))
        .map(|vm| ObjectRef::from_obj(vm.as_ref()))
        .collect()
}

async fn reconcile(
    vm: Arc<VirtualMachine>,
    ctx: Arc<Context>,
) -> Result<Action, finalizer::Error<Error>> {
    let started = Instant::now();
    let _worker = ctx.metrics.worker(NAME);
    let api: Api<VirtualMachine> =
        Api::namespaced(ctx.client.clone(), &vm.namespace().unwrap_or_default());
    let result = finalizer(&api, VIRTUAL_MACHINE_FINALIZER, vm, |event| async {
        match event {
            finalizer::Event::Apply(vm) => apply(&vm, &ctx).await,
            finalizer::Event::Cleanup(vm) => cleanup(&vm, &ctx).await,
        }
    })
    .await;
    let outcome = match &result {
        Ok(_) => "success",
        Err(finalizer::Error::CleanupFailed(Error::WaitingForInfra)) => "requeue_after",
        Err(_) => "error",
    };
    ctx.metrics.reconciled(NAME, outcome, started.elapsed());
    result
}

/// What this reconcile decided, for the status.
struct Outcome<'a> {
    scheduling: Scheduling<'a>,
    migration: Option<Migration<'a>>,
    waiting: Option<(&'a str, &'a str)>,
    drift: PlacementDrift<'a>,
    class: ClassTrack<'a>,
}

async fn apply(vm: &VirtualMachine, ctx: &Context) -> Result<Action, Error> {
    // Dereference: everything the plan decides on, from the caches.
    let namespace = vm.namespace().unwrap_or_default();
    let uid = vm.uid().unwrap_or_default();
    let synced = ctx.stores_synced.is_synced();
    let existing = if synced {
        infra::find(ctx, &namespace, &vm.name_any(), &uid)
    } else {
        Vec::new()
    };
    ctx.unseen_machines
        .seen(&uid, existing.iter().map(|e| e.kind));
    let class = ctx
        .stores
        .classes
        .get(&ObjectRef::new(&vm.spec.class_ref.name));
    let image = ctx
        .stores
        .images
        .get(&ObjectRef::new(&vm.spec.image_ref.name));
    let providers = providers_in(ctx, &namespace);
    let held = crate::capi::metadata::paused(vm.meta(), None).is_some()
        || crate::capi::metadata::deleted_for_move(vm.meta());
    let mut drift = None;
    let decision = match (&class, &image) {
        (Some(class), Some(image)) if synced && !held => {
            let recorded = existing
                .iter()
                .find(|e| !e.deleting)
                .and_then(|e| e.placement(&providers));
            let (decision, drifted) = decide(
                ctx,
                vm,
                &class.spec,
                image.as_ref(),
                &providers,
                recorded.as_ref(),
            );
            drift = drifted;
            Some(decision)
        }
        _ => None,
    };
    let planned = plan::placement(plan::Facts {
        synced,
        held,
        settling: settling(vm),
        class: (&vm.spec.class_ref.name, class.is_some()),
        image: (&vm.spec.image_ref.name, image.is_some()),
        existing: &existing,
        decision,
        providers: &providers,
        copying: vm.spec.migration.strategy == MigrationStrategy::CopyDisk,
        kinds: &ctx.kinds,
    });
    let (target, provider, stale) = match planned {
        Placement::Requeue(after) => return Ok(Action::requeue(after)),
        Placement::AwaitChange => return Ok(Action::await_change()),
        Placement::Unschedulable { reason, message } => {
            return unschedulable(vm, ctx, reason, &message, existing.first()).await;
        }
        Placement::PowerOnly {
            machine,
            reason,
            message,
        } => {
            return power_only(vm, ctx, &existing[machine], &providers, (reason, &message)).await;
        }
        Placement::Recreate {
            target,
            stale,
            message,
            ..
        } => return recreate(vm, ctx, &target, &existing, &stale, &message).await,
        Placement::Build {
            target,
            provider,
            stale,
        } => (target, provider, stale),
    };
    let (Some(class), Some(image)) = (class, image) else {
        unreachable!("the plan builds only with a class and an image");
    };
    // Recorded with the placement: what it was decided from (see `scheduling::binding`).
    let mut placement = target.to_status(None);
    placement.basis = Some(PlacementBasis::of(&vm.spec));
    let drift = match &drift {
        Some(d) => PlacementDrift::Drifted {
            reason: d.reason,
            message: &d.message,
        },
        None => PlacementDrift::Matches,
    };

    let ensured = match bootstrap::ensure_secret(vm, ctx).await {
        Err(error) => match super::expected::rejected(&error) {
            Some(why) => Err((
                "BootstrapSecretRejected",
                format!("the API server refused the bootstrap Secret banlieue writes: {why}"),
            )),
            None => return Err(error.into()),
        },
        Ok(ensured) => ensured,
    };
    let bootstrap_secret = match ensured {
        Ok(secret) => secret,
        Err((reason, message)) => {
            let outcome = Outcome {
                scheduling: Scheduling::Placed(&placement),
                migration: None,
                waiting: Some((reason, &message)),
                drift,
                class: ClassTrack::NotChecked,
            };
            write_status(vm, ctx, &outcome, existing.first()).await?;
            return Ok(Action::requeue(plan::bootstrap_retry(
                reason,
                ctx.settings.sync_period,
            )));
        }
    };
    // The class as it is now, or as the machine was built from it (a class edited
    // since, whose updatePolicy keeps its VMs as they are).
    let class_now = ClassRecord::of(&class);
    let recorded = existing.iter().find(|e| !e.deleting).and_then(|e| {
        match ClassRecord::read(&e.annotations)? {
            Ok(record) => Some(record),
            Err(why) => {
                // Only a hand edit makes it unreadable: then it is treated as absent
                // (the machine takes the class as it is) and said in the log.
                tracing::warn!(vm = %key_of(vm), machine = %e.name, %why, "class record ignored");
                None
            }
        }
    });
    let class_use = plan::class_use(&class_now, recorded.as_ref());
    let built = builder::infra_machine(
        &builder::Input {
            vm,
            class: class_use.spec(&class_now),
            image: image.as_ref(),
            provider,
            target: &target,
            bootstrap_secret: bootstrap_secret.as_deref(),
        },
        &ctx.kinds,
    );
    let mut built = match built {
        Ok(built) => built,
        Err(error) => {
            let outcome = Outcome {
                scheduling: Scheduling::Unschedulable {
                    reason: error.reason,
                    message: &error.message,
                },
                migration: None,
                waiting: None,
                drift: PlacementDrift::NotChecked,
                class: ClassTrack::NotChecked,
            };
            write_status(vm, ctx, &outcome, existing.first()).await?;
            return Ok(Action::await_change());
        }
    };
    let class_record = class_use.record(&class_now);
    class_record.write(built.meta_mut());
    if !stale.is_empty() {
        // CopyDisk (a Recreate deleted the stale machines instead).
        let stale: Vec<&Existing> = stale.iter().map(|&i| &existing[i]).collect();
        let target = existing
            .iter()
            .find(|e| !stale.iter().any(|s| std::ptr::eq(*s, *e)));
        return copy_disk::advance(
            ctx,
            copy_disk::Move {
                vm,
                stale: &stale,
                target,
                built,
                provider,
                placement: &placement,
            },
        )
        .await;
    }
    let current_infra = existing.first();
    copy_disk::keep_lineage(&mut built, current_infra);
    if let plan::Machine::Apply { first } = plan::machine(current_infra, |e| e.matches(&built)) {
        if first {
            // Before the request: a create that times out may still have happened.
            ctx.unseen_machines.created(&uid, built.kind());
        }
        if let Err(error) = infra::apply(ctx, &built).await {
            let Some(why) = super::expected::rejected(&error) else {
                return Err(error.into());
            };
            let message = format!(
                "the API server refused the {} banlieue builds for this VM: {why}",
                built.kind().kind()
            );
            let outcome = Outcome {
                scheduling: Scheduling::Placed(&placement),
                migration: None,
                waiting: Some(("InfraMachineRejected", &message)),
                drift,
                class: ClassTrack::NotChecked,
            };
            write_status(vm, ctx, &outcome, current_infra).await?;
            return Ok(Action::requeue(ctx.settings.sync_period));
        }
        ctx.metrics.wrote(NAME);
        if first && ctx.unseen_machines.announce(&uid, built.kind()) {
            let fd = target
                .failure_domain
                .as_deref()
                .map(|fd| format!(" ({fd})"))
                .unwrap_or_default();
            ctx.event(
                vm,
                EventType::Normal,
                "Scheduled",
                "Schedule",
                format!(
                    "on Provider {}{fd} as {}",
                    target.provider,
                    built.kind().kind()
                ),
            )
            .await;
        }
    }
    let (on_class, message) = class_use.report(&class_now);
    let (name, generation) = (class_record.name.as_str(), class_record.generation);
    let outcome = Outcome {
        scheduling: Scheduling::Placed(&placement),
        migration: None,
        waiting: None,
        drift,
        class: if on_class {
            ClassTrack::Current {
                name,
                generation,
                message: &message,
            }
        } else {
            ClassTrack::Kept {
                name,
                generation,
                message: &message,
            }
        },
    };
    if write_status(vm, ctx, &outcome, current_infra).await? {
        ctx.succeeded(&key_of(vm));
        Ok(Action::requeue(ctx.settings.sync_period))
    } else {
        // The infra machine's changes bring us back, and only once the cache this
        // reconcile reads has them (one shared watch, see `feed`); this is a safety net.
        // A short requeue here re-applied machines the cache did not show yet.
        Ok(Action::requeue(WAITING_RECHECK))
    }
}

/// A Recreate move: asks the machines on the old placement to go (their finalizers
/// remove the backend VMs) and reports the move; the new machine is built once they
/// are gone.
async fn recreate(
    vm: &VirtualMachine,
    ctx: &Context,
    target: &Target,
    existing: &[Existing],
    stale: &[usize],
    message: &str,
) -> Result<Action, Error> {
    let namespace = vm.namespace().unwrap_or_default();
    for old in stale.iter().map(|&i| &existing[i]) {
        if !old.deleting {
            infra::delete(ctx, &namespace, old).await?;
            ctx.metrics.wrote(NAME);
            let from = old.provider.clone().unwrap_or_default();
            ctx.event(
                vm,
                EventType::Normal,
                "Migrating",
                "Migrate",
                format!(
                    "removing {} on {from}, moving to {}",
                    old.kind.kind(),
                    target.provider
                ),
            )
            .await;
        }
    }
    let placement = target.to_status(None);
    let outcome = Outcome {
        scheduling: Scheduling::Placed(&placement),
        migration: Some(Migration {
            reason: "RemovingOldMachine",
            message,
            moving: true,
        }),
        waiting: None,
        drift: PlacementDrift::NotChecked,
        class: ClassTrack::NotChecked,
    };
    write_status(vm, ctx, &outcome, None).await?;
    Ok(Action::requeue(plan::RECREATE_RECHECK))
}

/// A VM whose class or image is missing keeps its machine as it is, but its power is
/// still applied: `spec.powerState` is patched onto the machine (the one field that
/// needs neither). The VM stays `Scheduled` where it is and says what is missing.
async fn power_only(
    vm: &VirtualMachine,
    ctx: &Context,
    machine: &Existing,
    providers: &[Provider],
    (reason, message): (&str, &str),
) -> Result<Action, Error> {
    let here = vm
        .status
        .as_ref()
        .and_then(|s| s.placement.clone())
        .or_else(|| machine.placement(providers));
    let Some(here) = here else {
        return unschedulable(vm, ctx, reason, message, Some(machine)).await;
    };
    if machine.desired_power != vm.spec.power_state {
        let power = serde_json::to_value(vm.spec.power_state).unwrap_or_default();
        infra::patch(
            ctx,
            &vm.namespace().unwrap_or_default(),
            machine,
            &serde_json::json!({"spec": {"powerState": power}}),
        )
        .await?;
        ctx.metrics.wrote(NAME);
    }
    let outcome = Outcome {
        scheduling: Scheduling::Placed(&here),
        migration: None,
        waiting: Some((reason, message)),
        drift: PlacementDrift::NotChecked,
        class: ClassTrack::NotChecked,
    };
    write_status(vm, ctx, &outcome, Some(machine)).await?;
    Ok(Action::requeue(ctx.settings.sync_period))
}

/// The Providers of `namespace`, as the cache holds them.
pub(crate) fn providers_in(ctx: &Context, namespace: &str) -> Vec<Provider> {
    ctx.stores
        .providers
        .state()
        .iter()
        .filter(|p| p.namespace().as_deref() == Some(namespace))
        .map(|p| p.as_ref().clone())
        .collect()
}

/// Reports that `vm` cannot be placed (`Scheduled=False`, `reason`) and backs off.
async fn unschedulable(
    vm: &VirtualMachine,
    ctx: &Context,
    reason: &str,
    message: &str,
    infra: Option<&Existing>,
) -> Result<Action, Error> {
    let outcome = Outcome {
        scheduling: Scheduling::Unschedulable { reason, message },
        migration: None,
        waiting: None,
        drift: PlacementDrift::NotChecked,
        class: ClassTrack::NotChecked,
    };
    write_status(vm, ctx, &outcome, infra).await?;
    Ok(Action::requeue(ctx.backoff(&key_of(vm))))
}

/// How long a VM may be too young to report that it cannot be placed.
///
/// A VM applied together with its class, image or Provider can reach this controller
/// before the caches it reads have them (each kind has its own watch, and a freshly
/// started apiserver answers the first watch of a kind with `429`, retried after a
/// second): the scale benchmark saw 39 of 100 VMs report `ImageNotFound` (a Warning
/// Event and three extra status writes each) for an image that existed.
const SETTLING: Duration = Duration::from_secs(5);

/// `Some(when to look again)` while `vm` is younger than [`SETTLING`].
fn settling(vm: &VirtualMachine) -> Option<Duration> {
    settling_at(
        vm.meta().creation_timestamp.as_ref(),
        k8s_openapi::jiff::Timestamp::now(),
    )
}

fn settling_at(created: Option<&Time>, now: k8s_openapi::jiff::Timestamp) -> Option<Duration> {
    let created = created?.0;
    let age = Duration::try_from(now.duration_since(created)).ok()?;
    (age < SETTLING).then_some(Duration::from_secs(1))
}

/// Schedules `vm`. Decisions are taken one at a time and remembered in the
/// placement ledger until the cache shows them, so VMs applied together see each
/// other's placements (spread and anti-affinity hold) and a VM whose status write is
/// not yet visible is not placed twice.
///
/// `recorded` is where the VM's infra machine says it was placed: the VM's status is
/// first written when that machine reports, so after a restart it can be the only
/// record.
fn decide(
    ctx: &Context,
    vm: &VirtualMachine,
    class: &crate::api::VMClassSpec,
    image: &VMImage,
    providers: &[Provider],
    recorded: Option<&ScheduledPlacement>,
) -> (Result<Target, (&'static str, String)>, Option<Drift>) {
    let uid = vm.uid().unwrap_or_default();
    let namespace = vm.metadata.namespace.as_deref().unwrap_or_default();
    let mut book = ctx.placements.lock().expect("placement ledger");
    let in_status = vm.status.as_ref().and_then(|s| s.placement.as_ref());
    if in_status.is_some() {
        // The cache shows the decision now; the ledger need not hold it any more.
        book.forget(&uid);
    }
    let current = in_status
        .or_else(|| book.decided(&uid))
        .or(recorded)
        .cloned();
    let basis = if move_pending(vm) {
        Basis::MovePending
    } else {
        match current.as_ref().and_then(|c| c.basis.as_ref()) {
            Some(basis) => Basis::Recorded(basis),
            None => Basis::Unrecorded,
        }
    };
    let mut input = scheduling::Input {
        vm,
        class,
        image,
        providers,
        current: current.as_ref(),
        basis,
        siblings: &[],
        loads: None,
    };
    // Siblings and spread counts matter only for a VM that must be (re)placed; the
    // counts are kept, and siblings are gathered only for anti-affinity (a scan of
    // the namespace's VMs).
    let decision = match scheduling::schedule(&input) {
        keep @ Decision::Keep { .. } => keep,
        _ => {
            let cached = || ctx.vms.get().map(|s| s.state()).unwrap_or_default();
            let loads = book.loads(namespace, cached).clone();
            let everyone = if vm.spec.placement.anti_affinity.is_empty() {
                Vec::new()
            } else {
                cached()
            };
            let siblings: Vec<Sibling<'_>> = everyone
                .iter()
                .filter(|v| v.metadata.namespace == vm.metadata.namespace)
                .map(|v| Sibling {
                    placement: book.placed(v),
                    ..Sibling::of(v)
                })
                .collect();
            input.siblings = &siblings;
            input.loads = Some(&loads);
            scheduling::schedule(&input)
        }
    };
    match decision {
        Decision::Keep { drift } => (
            current.as_ref().map(target_of).ok_or((
                "NoFeasibleProvider",
                "no current placement to keep".to_owned(),
            )),
            drift,
        ),
        Decision::Place(target) => {
            let mut decided = target.to_status(None);
            decided.basis = Some(PlacementBasis::of(&vm.spec));
            book.decide(namespace, uid, decided);
            (Ok(target), None)
        }
        Decision::Unschedulable { reason, message } => (Err((reason, message)), None),
    }
}

/// Whether a move `vm`'s own spec asked for was refused or undone, leaving it where it
/// was (its `Migrating` condition says so): its placement is then checked against the
/// spec again on each reconcile, as the move is still asked for.
fn move_pending(vm: &VirtualMachine) -> bool {
    vm.status
        .as_ref()
        .and_then(|s| conditions::get(&s.conditions, conditions::types::MIGRATING))
        .is_some_and(|c| {
            c.status == "False" && copy_disk::STAYS_FOR_NOW.contains(&c.reason.as_str())
        })
}

fn target_of(placement: &ScheduledPlacement) -> Target {
    Target {
        provider: placement.provider.clone(),
        class: placement
            .provider_class
            .unwrap_or(crate::api::common::ProviderClass::Sim),
        failure_domain: placement.failure_domain.clone(),
        topology: placement.topology.clone(),
    }
}

async fn cleanup(vm: &VirtualMachine, ctx: &Context) -> Result<Action, Error> {
    let namespace = vm.namespace().unwrap_or_default();
    let uid = vm.uid().unwrap_or_default();
    // A disk copy in flight would import into a machine about to be deleted.
    ctx.copies.cancel(&uid);
    let placed = ctx
        .placements
        .lock()
        .expect("placement ledger")
        .forget(&uid);
    if crate::capi::metadata::deleted_for_move(vm.meta()) {
        // `clusterctl move` recreated the VM, its machine and its bootstrap Secret on
        // another cluster, whose machine adopts the backend VM by providerID: touch
        // nothing here, only let go.
        let_go(vm, ctx);
        return Ok(Action::await_change());
    }
    let synced = ctx.stores_synced.is_synced();
    let existing = if synced {
        infra::find(ctx, &namespace, &vm.name_any(), &uid)
    } else {
        Vec::new()
    };
    let remaining = !existing.is_empty();
    ctx.unseen_machines
        .seen(&uid, existing.iter().map(|e| e.kind));
    let orphan = super::orphan_backend::requested(vm.meta());
    for e in &existing {
        if orphan && !super::orphan_backend::requested_in(&e.annotations) {
            // The escape hatch goes to the machine, which names its VM and lets go.
            super::orphan_backend::mark(ctx, e.kind.kind(), &namespace, &e.name).await?;
        }
        if !e.deleting {
            infra::delete(ctx, &namespace, e).await?;
            ctx.metrics.wrote(NAME);
        } else if delete_failed(e) {
            report_deleting(vm, ctx, e).await?;
        }
    }
    if remaining {
        return Err(Error::WaitingForInfra);
    }
    // The finalizer must not go while a machine exists. The cache may not show one we
    // made moments ago (or anything, before it listed): then ask the API server, about
    // the kinds this VM can have made. Otherwise the cache's "none" is the answer.
    if ctx.unseen_machines.may_hide(&uid, synced) {
        let kinds = possible_kinds(vm, placed.as_ref(), ctx);
        if infra::exists_live(ctx, &namespace, &vm.name_any(), &uid, &kinds).await? {
            return Err(Error::WaitingForInfra);
        }
    }
    let_go(vm, ctx);
    // Only the copy this VM owns: a Secret of that name that is someone else's stays.
    if vm.spec.bootstrap.is_some() && bootstrap::delete_secret(vm, ctx).await? {
        ctx.metrics.wrote(NAME);
    }
    Ok(Action::await_change())
}

/// Forgets what this process remembers about a VM whose finalizer goes: per-VM memory
/// must not grow with every VM ever deleted (a deletion that waited for its machine
/// left its failure count behind).
fn let_go(vm: &VirtualMachine, ctx: &Context) {
    let uid = vm.uid().unwrap_or_default();
    ctx.unseen_machines.forget(&uid);
    ctx.written.virtual_machines.forget(&uid);
    ctx.echoes.forget(&uid);
    ctx.succeeded(&key_of(vm));
}

/// Whether the backend refused to delete `machine`'s VM (its `Ready` says why).
fn delete_failed(machine: &Existing) -> bool {
    machine
        .status
        .as_ref()
        .and_then(|s| conditions::get(&s.conditions, conditions::types::READY))
        .is_some_and(|c| c.reason == DELETE_FAILED)
}

/// Mirrors a refused delete into the VM's status (`InfrastructureReady`, phase
/// `Deleting`), so that a VM stuck deleting says why. Only then: a delete that goes
/// through costs no VM status write.
async fn report_deleting(
    vm: &VirtualMachine,
    ctx: &Context,
    machine: &Existing,
) -> Result<(), Error> {
    let Some(placement) = vm.status.as_ref().and_then(|s| s.placement.as_ref()) else {
        return Ok(());
    };
    let outcome = Outcome {
        scheduling: Scheduling::Placed(placement),
        migration: None,
        waiting: None,
        drift: PlacementDrift::NotChecked,
        class: ClassTrack::NotChecked,
    };
    write_status(vm, ctx, &outcome, Some(machine))
        .await
        .map(drop)
}

/// The infra machine kinds `vm` can have: the one its status references and the one
/// its placement's Provider builds; every kind when neither is known.
fn possible_kinds(
    vm: &VirtualMachine,
    ledger: Option<&ScheduledPlacement>,
    ctx: &Context,
) -> Vec<crate::contract::InfraMachineKind> {
    let status = vm.status.as_ref();
    let referenced = status
        .and_then(|s| s.infrastructure_ref.as_ref())
        .and_then(|r| {
            // A built-in kind this build does not serve still holds the VM back.
            (ctx.kinds.get(&r.kind).map(|entry| entry.kind()))
                .or_else(|| crate::contract::InfraMachineKind::from_kind(&r.kind))
        });
    let placed = status
        .and_then(|s| s.placement.as_ref())
        .or(ledger)
        .and_then(|p| {
            ctx.stores
                .providers
                .get(&ObjectRef::new(&p.provider).within(&vm.namespace().unwrap_or_default()))
        })
        .and_then(|provider| machine_kind(&provider, &ctx.kinds).ok());
    let mut kinds: Vec<_> = referenced.into_iter().chain(placed).collect();
    kinds.dedup();
    if kinds.is_empty() {
        kinds = ctx.kinds.kinds().collect();
    }
    kinds
}

async fn write_status(
    vm: &VirtualMachine,
    ctx: &Context,
    outcome: &Outcome<'_>,
    infra: Option<&Existing>,
) -> Result<bool, Error> {
    let reference = infra.map(Existing::reference);
    let input = Input {
        generation: vm.meta().generation,
        desired_power: vm.spec.power_state,
        scheduling: outcome.scheduling,
        infra: infra.zip(reference.as_ref()).map(|(e, r)| Infra {
            reference: r,
            provider_id: e.provider_id.as_deref(),
            status: e.status.as_ref(),
        }),
        migration: outcome.migration,
        waiting: outcome.waiting,
        deleting: vm.meta().deletion_timestamp.is_some(),
        drift: outcome.drift,
        class: outcome.class,
    };
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let previous = status_write::known(&ctx.written.virtual_machines, vm, vm.status.as_ref());
    let status = compute(previous.as_ref(), &input, &now);
    let ready = conditions::is_true(&status.conditions, conditions::types::READY);
    if !worth_writing(previous.as_ref(), &input) {
        return Ok(ready);
    }
    let api: Api<VirtualMachine> =
        Api::namespaced(ctx.client.clone(), &vm.namespace().unwrap_or_default());
    let written = &ctx.written.virtual_machines;
    let manager = (infra::FIELD_MANAGER, NAME);
    let version = status_write::write_versioned(
        ctx,
        &api,
        vm,
        Some(written),
        manager,
        previous.as_ref(),
        status,
    )
    .await?;
    let Some(version) = version else {
        return Ok(ready);
    };
    ctx.echoes.expect(&vm.uid().unwrap_or_default(), &version);
    if let Scheduling::Unschedulable { reason, message } = outcome.scheduling {
        let already = previous
            .as_ref()
            .and_then(|s| conditions::get(&s.conditions, conditions::types::SCHEDULED))
            .is_some_and(|c| c.reason == reason);
        if !already {
            ctx.event(
                vm,
                EventType::Warning,
                reason,
                "Schedule",
                message.to_owned(),
            )
            .await;
        }
    }
    if let PlacementDrift::Drifted { reason, message } = outcome.drift {
        // One Event per drift, not one per reconcile: only when the condition turns
        // True or names another cause.
        let already = previous
            .as_ref()
            .and_then(|s| conditions::get(&s.conditions, conditions::types::PLACEMENT_DRIFTED))
            .is_some_and(|c| c.status == "True" && c.reason == reason);
        if !already {
            ctx.event(
                vm,
                EventType::Warning,
                conditions::types::PLACEMENT_DRIFTED,
                "Schedule",
                format!("{reason}: {message}"),
            )
            .await;
        }
    }
    Ok(ready)
}

fn error_policy(
    vm: Arc<VirtualMachine>,
    error: &finalizer::Error<Error>,
    ctx: Arc<Context>,
) -> Action {
    match error {
        // The machine's deletion wakes us; this is a safety net.
        finalizer::Error::CleanupFailed(Error::WaitingForInfra) => Action::requeue(WAITING_RECHECK),
        other
            if super::expected::race(other, |e| match e {
                Error::Kube(e) => Some(e),
                Error::WaitingForInfra => None,
            }) =>
        {
            tracing::debug!(vm = %key_of(vm.as_ref()), error = %other, "reconcile raced a stale cache; retrying");
            Action::requeue(super::expected::RETRY_RACE)
        }
        other => {
            tracing::warn!(vm = %key_of(vm.as_ref()), error = %other, "reconcile failed");
            Action::requeue(ctx.backoff(&key_of(vm.as_ref())))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    #[test]
    fn only_young_vms_hold_back_their_report() {
        let created = Time(Timestamp::from_second(1_000).unwrap());
        let at = |s: i64| Timestamp::from_second(1_000 + s).unwrap();
        let young = Some(Duration::from_secs(1));
        assert_eq!(settling_at(Some(&created), at(0)), young);
        assert_eq!(settling_at(Some(&created), at(4)), young);
        assert_eq!(
            settling_at(Some(&created), at(5)),
            None,
            "reported from 5 s on"
        );
        assert_eq!(settling_at(Some(&created), at(3600)), None);
        assert_eq!(
            settling_at(Some(&created), at(-60)),
            None,
            "clock skew: report, never wait long"
        );
        assert_eq!(
            settling_at(None, at(0)),
            None,
            "no timestamp: report at once"
        );
    }
}
