//! `migration.strategy: CopyDisk`: a VM that must change Provider keeps its disks.
//! The source is stopped, its disks exported, converted and imported under the
//! target machine's UID, the target created on them (keeping the cloud-init
//! instance-id) and started; the source is deleted only once the target is Ready.
//!
//! Every step is read back from the objects (see [`plan`]): the target machine's
//! `banlieue.io/importing-disks` annotation says a copy is due, and a restarted
//! operator starts it again. The copy itself runs in a [`job`] beside the reconciles.

pub(crate) mod job;
mod plan;

use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use serde_json::json;

use super::{Error, Outcome, write_status};
use crate::api::virtual_machine::ScheduledPlacement;
use crate::api::{Provider, VirtualMachine};
use crate::builder::{COPIED_FROM_ANNOTATION, IMPORTING_DISKS_ANNOTATION, INSTANCE_ID_ANNOTATION};
use crate::conditions;
use crate::contract::InfraMachine;
use crate::controllers::backends::Instrumented;
use crate::controllers::context::{Context, key_of};
use crate::controllers::infra::{self, Existing};
use crate::status::virtual_machine::{ClassTrack, Migration, PlacementDrift, Scheduling};
use plan::{Facts, Step, Transfer};

/// Annotation on a move's source machine: `<VM generation>:<why>` of the copy that
/// failed, so the VM stays where it is until its spec changes (no retry loop).
const COPY_FAILED_ANNOTATION: &str = "banlieue.io/copy-failed";

/// `Migrating` reason of a `CopyDisk` move refused before anything moved.
pub(crate) const COPY_DISK_UNSUPPORTED: &str = "CopyDiskUnsupported";
/// `Migrating` reason of a copy that failed and was undone.
const COPY_FAILED: &str = "CopyFailed";
/// `Migrating` reason of a move not started because a Provider of it is unreachable
/// (asked again with backoff).
pub(crate) const PROVIDER_UNREACHABLE: &str = "ProviderUnreachable";
/// `Migrating` reasons (with `False`) of a move the VM's spec asks for that left it
/// where it was for now: refused, undone, or waiting for a Provider to answer.
pub(crate) const STAYS_FOR_NOW: [&str; 3] =
    [COPY_DISK_UNSUPPORTED, COPY_FAILED, PROVIDER_UNREACHABLE];

/// How often a running move is looked at (progress in the condition).
const POLL: Duration = Duration::from_secs(2);

/// A `CopyDisk` move in flight or about to start.
pub(crate) struct Move<'a> {
    pub vm: &'a VirtualMachine,
    /// Every machine the VM owns that is not the target.
    pub stale: &'a [&'a Existing],
    /// The machine on the target Provider, if made yet.
    pub target: Option<&'a Existing>,
    /// What the target machine is built as.
    pub built: InfraMachine,
    pub provider: &'a Provider,
    pub placement: &'a ScheduledPlacement,
}

/// Takes the move one step further.
pub(crate) async fn advance(ctx: &Context, mv: Move<'_>) -> Result<Action, Error> {
    let vm = mv.vm;
    let namespace = vm.namespace().unwrap_or_default();
    let uid = vm.uid().unwrap_or_default();
    let source = mv.stale.iter().find(|e| !e.deleting).copied();
    let from = mv
        .stale
        .first()
        .and_then(|e| e.provider.clone())
        .unwrap_or_default();
    let to = mv.provider.name_any();
    let transfer = match (source, mv.target) {
        (Some(source), None) => transfer(ctx, source, &namespace, mv.provider, &mv.built).await,
        _ => Transfer::Possible,
    };
    let generation = vm.metadata.generation.unwrap_or_default();
    let facts = Facts {
        source: source.map(|s| plan::Source {
            desired: s.desired_power,
            observed: s.status.as_ref().and_then(|st| st.power_state),
            failed_at: failed_at(s),
        }),
        target: mv.target.filter(|t| !t.deleting).map(|t| plan::Target {
            importing: t.annotations.contains_key(IMPORTING_DISKS_ANNOTATION),
            ready: t
                .status
                .as_ref()
                .is_some_and(|s| conditions::is_true(&s.conditions, conditions::types::READY)),
        }),
        transfer,
        job: ctx.copies.state(&uid),
        generation,
    };
    if !facts.target.is_some_and(|t| t.importing) && ctx.copies.has(&uid) {
        // The importing target went (the placement was put back, or it was deleted):
        // its copy is pointless now and would leave disks behind.
        ctx.copies.cancel(&uid);
    }
    let step = plan::next(&facts);
    let route = format!("{from} -> {to}");
    let shown = mv
        .target
        .filter(|_| facts.target.is_some_and(|t| !t.importing));
    let mirrored = shown.or(source);
    let (reason, message, again): (&str, String, Duration) = match step {
        Step::Refuse(why) => return refuse(ctx, vm, (&from, &to), &why, source).await,
        Step::RetryUnreachable(why) => {
            return unreachable(ctx, vm, (&from, &to), &why, source).await;
        }
        Step::StayFailed => {
            let why = source
                .and_then(|s| s.annotations.get(COPY_FAILED_ANNOTATION))
                .and_then(|v| v.split_once(':'))
                .map(|(_, why)| why.to_owned())
                .unwrap_or_default();
            let message = format!(
                "{route}: the disk copy failed and was undone, the VM stays on {from}: {why}. \
                 Change the spec (e.g. put the placement back) to try again"
            );
            let here = source_placement(ctx, &namespace, source);
            let placement = here.as_ref().unwrap_or(mv.placement);
            write(ctx, vm, placement, COPY_FAILED, &message, false, source).await?;
            return Ok(Action::requeue(ctx.settings.sync_period));
        }
        Step::StopSource => {
            let source = source.expect("a live source");
            infra::patch(
                ctx,
                &namespace,
                source,
                &json!({"spec": {"powerState": "PoweredOff"}}),
            )
            .await?;
            event(
                ctx,
                vm,
                "StoppingSource",
                format!("{route}: stopping {} to copy its disks", source.name),
            )
            .await;
            (
                "StoppingSource",
                format!("{route}: stopping the source to copy its disks"),
                POLL,
            )
        }
        Step::WaitSourceStopped => (
            "StoppingSource",
            format!("{route}: waiting for the source to power off"),
            POLL,
        ),
        Step::CreateTarget => {
            let source = source.expect("a live source");
            let mut built = mv.built.clone();
            let annotations = built.meta_mut().annotations.get_or_insert_default();
            let origin = format!("{}/{} on {from}", source.kind.kind(), source.name);
            annotations.insert(IMPORTING_DISKS_ANNOTATION.into(), origin.clone());
            annotations.insert(COPIED_FROM_ANNOTATION.into(), origin);
            annotations.insert(INSTANCE_ID_ANNOTATION.into(), instance_id(source));
            ctx.unseen_machines.created(&uid, built.kind());
            infra::apply(ctx, &built).await?;
            event(
                ctx,
                vm,
                "CopyingDisks",
                format!("{route}: copying the disks of {}", source.name),
            )
            .await;
            (
                "CopyingDisks",
                format!("{route}: starting the copy"),
                Duration::from_secs(1),
            )
        }
        Step::StartCopy => {
            let (source, target) = (source.expect("a live source"), mv.target.expect("a target"));
            match start(ctx, vm, &namespace, source, target, mv.provider).await {
                Ok(()) => ("CopyingDisks", format!("{route}: starting the copy"), POLL),
                Err((reason, message)) => (
                    reason,
                    format!("{route}: {message}"),
                    ctx.backoff(&key_of(vm)),
                ),
            }
        }
        Step::Copying(progress) => ("CopyingDisks", format!("{route}: {progress}"), POLL),
        Step::FinishImport => {
            let target = mv.target.expect("a target");
            let mut built = mv.built.clone();
            let annotations = built.meta_mut().annotations.get_or_insert_default();
            for key in [COPIED_FROM_ANNOTATION, INSTANCE_ID_ANNOTATION] {
                if let Some(value) = target.annotations.get(key) {
                    annotations.insert(key.into(), value.clone());
                }
            }
            infra::apply(ctx, &built).await?;
            ctx.copies.forget(&uid);
            event(
                ctx,
                vm,
                "DisksCopied",
                format!("{route}: disks copied, starting {}", target.name),
            )
            .await;
            (
                "StartingTarget",
                format!("{route}: disks copied, starting the target"),
                POLL,
            )
        }
        Step::Fail(why) => {
            if let Some(target) = mv.target {
                infra::delete(ctx, &namespace, target).await?;
            }
            if let Some(source) = source {
                let power = serde_json::to_value(vm.spec.power_state).unwrap_or_default();
                infra::patch(ctx, &namespace, source, &json!({
                    "metadata": {"annotations": {COPY_FAILED_ANNOTATION: format!("{generation}:{why}")}},
                    "spec": {"powerState": power},
                }))
                .await?;
            }
            ctx.copies.forget(&uid);
            let message = format!(
                "{route}: the disk copy failed, the target was removed and the source is powered back as the VM asks: {why}"
            );
            ctx.event(
                vm,
                EventType::Warning,
                COPY_FAILED,
                "Migrate",
                message.clone(),
            )
            .await;
            let here = source_placement(ctx, &namespace, source);
            let placement = here.as_ref().unwrap_or(mv.placement);
            write(ctx, vm, placement, COPY_FAILED, &message, false, source).await?;
            return Ok(Action::requeue(POLL));
        }
        Step::WaitTarget => (
            "StartingTarget",
            format!("{route}: waiting for the target to be Ready"),
            POLL,
        ),
        Step::DeleteSource => {
            let source = source.expect("a live source");
            infra::delete(ctx, &namespace, source).await?;
            event(
                ctx,
                vm,
                "RemovingSource",
                format!(
                    "{route}: the target is Ready, deleting {} on {from}",
                    source.name
                ),
            )
            .await;
            (
                "RemovingSource",
                format!("{route}: the target is Ready, deleting the source"),
                POLL,
            )
        }
        Step::WaitSourceGone => (
            "RemovingSource",
            format!("{route}: waiting for the source to be deleted"),
            POLL,
        ),
    };
    write(ctx, vm, mv.placement, reason, &message, true, mirrored).await?;
    Ok(Action::requeue(again))
}

/// Whether both sides can move disks, asked before anything is touched.
async fn transfer(
    ctx: &Context,
    source: &Existing,
    namespace: &str,
    target: &Provider,
    built: &InfraMachine,
) -> Transfer {
    if source.kind == built.kind() {
        return Transfer::Refused(format!(
            "CopyDisk between two Providers of the same machine kind ({}) is not supported: \
             the copy would need a second {} under the VM's name",
            source.kind.kind(),
            source.kind.kind()
        ));
    }
    let Some(from) = source_provider(ctx, namespace, source) else {
        return Transfer::Refused("the source machine's Provider no longer exists".into());
    };
    // A cached backend connects lazily, so a Provider whose backend stopped answering
    // still resolves: its last check says so. Nothing is stopped on a side that may not
    // answer (the source would be asked to power off while it cannot be reached).
    for provider in [&from, target] {
        if let Some(down) = not_reachable(provider) {
            return Transfer::Unreachable(down);
        }
    }
    let backends = (
        ctx.backends.for_provider(&ctx.client, &from).await,
        ctx.backends.for_provider(&ctx.client, target).await,
    );
    match backends {
        (Ok(s), Ok(t)) => match (s.disk_transfer().is_some(), t.disk_transfer().is_some()) {
            (true, true) => Transfer::Possible,
            (false, _) => Transfer::Refused(cannot(&from, &s, "export")),
            (_, false) => Transfer::Refused(cannot(target, &t, "import")),
        },
        (Err(u), _) => Transfer::Unreachable(format!(
            "Provider {} ({}: {})",
            from.name_any(),
            u.reason,
            u.message
        )),
        (_, Err(u)) => Transfer::Unreachable(format!(
            "Provider {} ({}: {})",
            target.name_any(),
            u.reason,
            u.message
        )),
    }
}

/// Why `provider` is not reachable, when its last check says it is not
/// (`Reachable=False`).
fn not_reachable(provider: &Provider) -> Option<String> {
    let said = provider
        .status
        .as_ref()
        .and_then(|s| crate::conditions::get(&s.conditions, crate::conditions::types::REACHABLE))?;
    (said.status == "False").then(|| {
        format!(
            "Provider {} ({}: {})",
            provider.name_any(),
            said.reason,
            said.message
        )
    })
}

fn cannot(provider: &Provider, backend: &Instrumented, what: &str) -> String {
    format!(
        "Provider {} ({} backend) cannot {what} disks",
        provider.name_any(),
        backend.class.as_str()
    )
}

/// Where the source runs, for the status of a move that stays there.
fn source_placement(
    ctx: &Context,
    namespace: &str,
    source: Option<&Existing>,
) -> Option<ScheduledPlacement> {
    source?.placement(&super::providers_in(ctx, namespace))
}

fn source_provider(ctx: &Context, namespace: &str, source: &Existing) -> Option<Provider> {
    let name = source.provider.as_deref()?;
    ctx.stores
        .providers
        .get(&ObjectRef::new(name).within(namespace))
        .map(|p| p.as_ref().clone())
}

async fn start(
    ctx: &Context,
    vm: &VirtualMachine,
    namespace: &str,
    source: &Existing,
    target: &Existing,
    target_provider: &Provider,
) -> Result<(), (&'static str, String)> {
    let from = source_provider(ctx, namespace, source).ok_or((
        "ProviderNotFound",
        "the source Provider no longer exists".to_owned(),
    ))?;
    let reach = |u: crate::status::provider::Unreachable| {
        ("ProviderNotReady", format!("{}: {}", u.reason, u.message))
    };
    let source_backend = ctx
        .backends
        .for_provider(&ctx.client, &from)
        .await
        .map_err(reach)?;
    let target_backend = ctx
        .backends
        .for_provider(&ctx.client, target_provider)
        .await
        .map_err(reach)?;
    let instance = target
        .annotations
        .get(INSTANCE_ID_ANNOTATION)
        .cloned()
        .unwrap_or_else(|| instance_id(source));
    let request = infra::copied_request(ctx, namespace, target, instance).ok_or((
        "WaitingForCache",
        "the target machine is not in the cache yet".to_owned(),
    ))?;
    let uid = vm.uid().unwrap_or_default();
    ctx.copies.start(
        &uid,
        job::Input {
            source: source_backend,
            target: target_backend,
            source_identity: source.identity(namespace),
            target_request: request,
            dir: ctx.settings.staging_dir.join(&uid),
        },
    );
    Ok(())
}

/// The instance-id `machine` hands its guest: the one it kept, else its UID.
fn instance_id(machine: &Existing) -> String {
    machine
        .annotations
        .get(INSTANCE_ID_ANNOTATION)
        .cloned()
        .unwrap_or_else(|| machine.uid.clone())
}

fn failed_at(source: &Existing) -> Option<i64> {
    let value = source.annotations.get(COPY_FAILED_ANNOTATION)?;
    value.split_once(':')?.0.parse().ok()
}

async fn event(ctx: &Context, vm: &VirtualMachine, reason: &str, note: String) {
    let already = vm.status.as_ref().is_some_and(|s| {
        conditions::get(&s.conditions, "Migrating").is_some_and(|c| c.reason == reason)
    });
    if !already {
        ctx.event(vm, EventType::Normal, reason, "Migrate", note)
            .await;
    }
}

async fn write(
    ctx: &Context,
    vm: &VirtualMachine,
    placement: &ScheduledPlacement,
    reason: &str,
    message: &str,
    moving: bool,
    infra: Option<&Existing>,
) -> Result<(), Error> {
    let outcome = Outcome {
        scheduling: Scheduling::Placed(placement),
        migration: Some(Migration {
            reason,
            message,
            moving,
        }),
        waiting: None,
        drift: PlacementDrift::NotChecked,
        class: ClassTrack::NotChecked,
    };
    write_status(vm, ctx, &outcome, infra).await.map(drop)
}

/// A move refused before anything was touched: the VM stays where it is and says why.
async fn refuse(
    ctx: &Context,
    vm: &VirtualMachine,
    (from, to): (&str, &str),
    why: &str,
    source: Option<&Existing>,
) -> Result<Action, Error> {
    let message = format!(
        "{from} -> {to}: spec.migration.strategy is CopyDisk and {why}, so nothing was \
         moved and the VM stays on {from}. Set spec.migration.strategy to Recreate to \
         move it without its disk (a new machine from the image), or put the placement \
         back"
    );
    let current = vm.status.as_ref().and_then(|s| s.placement.clone());
    let outcome = Outcome {
        scheduling: match &current {
            Some(here) => Scheduling::Placed(here),
            None => Scheduling::Unschedulable {
                reason: COPY_DISK_UNSUPPORTED,
                message: &message,
            },
        },
        migration: Some(Migration {
            reason: COPY_DISK_UNSUPPORTED,
            message: &message,
            moving: false,
        }),
        waiting: None,
        drift: PlacementDrift::NotChecked,
        class: ClassTrack::NotChecked,
    };
    let refused_before = vm.status.as_ref().is_some_and(|s| {
        conditions::get(&s.conditions, "Migrating")
            .is_some_and(|c| c.reason == COPY_DISK_UNSUPPORTED)
    });
    if !refused_before {
        ctx.event(
            vm,
            EventType::Warning,
            COPY_DISK_UNSUPPORTED,
            "Migrate",
            message.clone(),
        )
        .await;
    }
    write_status(vm, ctx, &outcome, source).await?;
    Ok(Action::requeue(ctx.settings.sync_period))
}

/// A move not started because a Provider of it could not be reached to ask whether it
/// can move disks: the VM stays where it is, says so, and asks again with backoff (an
/// outage is not "unsupported").
async fn unreachable(
    ctx: &Context,
    vm: &VirtualMachine,
    (from, to): (&str, &str),
    why: &str,
    source: Option<&Existing>,
) -> Result<Action, Error> {
    let message = format!(
        "{from} -> {to}: cannot ask whether the disks can be copied: {why} is not reachable. \
         Nothing was touched and the VM stays on {from}; the move is tried again with backoff \
         (fix the Provider's connection, or put the placement back)"
    );
    let current = vm.status.as_ref().and_then(|s| s.placement.clone());
    let outcome = Outcome {
        scheduling: match &current {
            Some(here) => Scheduling::Placed(here),
            None => Scheduling::Unschedulable {
                reason: PROVIDER_UNREACHABLE,
                message: &message,
            },
        },
        migration: Some(Migration {
            reason: PROVIDER_UNREACHABLE,
            message: &message,
            moving: false,
        }),
        waiting: None,
        drift: PlacementDrift::NotChecked,
        class: ClassTrack::NotChecked,
    };
    let said_before = vm.status.as_ref().is_some_and(|s| {
        conditions::get(&s.conditions, "Migrating")
            .is_some_and(|c| c.reason == PROVIDER_UNREACHABLE)
    });
    if !said_before {
        ctx.event(
            vm,
            EventType::Warning,
            PROVIDER_UNREACHABLE,
            "Migrate",
            message.clone(),
        )
        .await;
    }
    write_status(vm, ctx, &outcome, source).await?;
    Ok(Action::requeue(ctx.backoff(&key_of(vm))))
}

/// Carries a copied machine's lineage (where its disks came from, the instance-id it
/// keeps) into every later build of it: dropping them would hand the guest a new
/// instance-id (a second first boot).
pub(crate) fn keep_lineage(built: &mut InfraMachine, current: Option<&Existing>) {
    let Some(current) = current.filter(|c| c.kind == built.kind()) else {
        return;
    };
    for key in [COPIED_FROM_ANNOTATION, INSTANCE_ID_ANNOTATION] {
        if let Some(value) = current.annotations.get(key) {
            built
                .meta_mut()
                .annotations
                .get_or_insert_default()
                .insert(key.into(), value.clone());
        }
    }
}
