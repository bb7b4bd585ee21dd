//! Backend VMs whose machine vanished without its cleanup.
//!
//! The machine controller adds its finalizer before it asks a backend for a VM, so a
//! machine's deletion waits for its VM's. But the API server can lose that race: a
//! DELETE that read the object before the finalizer was added removes it anyway, even
//! after the finalizer patch (and later writes) answered 200.
//! `tests/integration/tests/deletion_safety.rs` deletes VMs the moment they are
//! finalized and saw it: about one machine in twenty vanished with the finalizer on,
//! and its VM outlived it. Two ways catch it, as the VM may be made before or after the
//! machine vanishes:
//!
//! - [`sweep`]: the shared watch's deletions. A deletion's last state is the last one
//!   stored: a machine deleted the normal way shows its `deletionTimestamp` there (and
//!   still our finalizer: removing the last finalizer deletes without storing again).
//!   One that shows our finalizer and no `deletionTimestamp` was removed at once,
//!   finalizer and all: it went without its cleanup, and its VM, if any, is deleted
//!   here. (`clusterctl move` marks what it deletes; those VMs live on elsewhere.)
//! - [`orphaned`]: the write that records a new VM (its providerID, its status) finds
//!   the machine gone, so the VM just made is deleted at once.
//!
//! Either way the VM is deleted by the identity it was made with: the machine's UID
//! never comes back.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use super::{Deleting, Error, Machine, deleting_provider, identity, let_go};
use crate::backend::{BackendError, Deletion, MachineIdentity, MachineObservation};
use crate::capi::metadata::deleted_for_move;
use crate::controllers::MACHINE_FINALIZER;
use crate::controllers::backends::Instrumented;
use crate::controllers::context::{Context, key_of};
use crate::controllers::feed::Subscription;

/// How long one orphan's deletion is retried before it is given up, loudly.
const PATIENCE: Duration = Duration::from_secs(300);

/// Whether `error`, from recording a new VM on a machine that had no providerID, means
/// the machine is gone and the VM just made for it has no owner.
pub(super) fn orphaned<K: Machine>(machine: &K, error: &Error) -> bool {
    let had_no_vm = !machine.has_provider_id();
    had_no_vm && matches!(error, Error::Kube(kube::Error::Api(status)) if status.code == 404)
}

/// Deletes the VM just made (seen as `observation`) for the vanished `machine`.
pub(super) async fn delete_orphan<K: Machine>(
    machine: &K,
    ctx: &Context,
    backend: &Instrumented,
    observation: &MachineObservation,
) -> Result<Action, Error> {
    let mut made_for = identity(machine);
    made_for.provider_id = observation.provider_id.clone();
    delete_until_gone(machine, ctx, backend, &made_for).await;
    Ok(Action::await_change())
}

/// Whether a deleted machine, in its last stored state, went without its cleanup.
fn vanished_uncleaned<K: Machine>(machine: &K) -> bool {
    machine.meta().deletion_timestamp.is_none()
        && machine.finalizers().iter().any(|f| f == MACHINE_FINALIZER)
        && !deleted_for_move(machine.meta())
}

/// Deletes the VMs of machines of kind `K` deleted with the finalizer still on, until
/// `shutdown`. Each deletion runs on its own task: the shared watch waits for no backend.
pub(crate) async fn sweep<K: Machine>(
    ctx: Arc<Context>,
    deleted: Subscription<K>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    deleted
        .into_stream()
        .take_until(shutdown)
        .for_each(|machine| {
            if let Ok(machine) = machine
                && vanished_uncleaned(&machine)
            {
                let ctx = ctx.clone();
                tokio::spawn(async move { delete_vanished(&machine, &ctx).await });
            }
            futures::future::ready(())
        })
        .await;
}

async fn delete_vanished<K: Machine>(machine: &K, ctx: &Context) {
    tracing::warn!(machine = %key_of(machine), uid = %machine.uid().unwrap_or_default(), "machine deleted without its cleanup (the API server removed it with the finalizer on); deleting its backend VM, if any");
    let provider = match deleting_provider(machine, ctx).await {
        Ok(Deleting::On(provider)) => provider,
        Ok(Deleting::Unreachable(error)) => {
            give_up(machine, ctx, &error).await;
            return;
        }
        Ok(Deleting::Unknown(_)) => {
            give_up(
                machine,
                ctx,
                &BackendError::terminal("ProviderNotFound", "its Provider is not known"),
            )
            .await;
            return;
        }
        Err(error) => {
            give_up(
                machine,
                ctx,
                &BackendError::transient("KubernetesAPI", error.to_string()),
            )
            .await;
            return;
        }
    };
    match ctx.backends.for_provider(&ctx.client, &provider).await {
        Ok(backend) => delete_until_gone(machine, ctx, &backend, &identity(machine)).await,
        Err(u) => give_up(machine, ctx, &BackendError::transient(u.reason, u.message)).await,
    }
}

/// Deletes the VM made for `made_for`, retrying until the backend says it is gone or
/// [`PATIENCE`] runs out (then [`give_up`]: there is no object left to retry from).
async fn delete_until_gone<K: Machine>(
    machine: &K,
    ctx: &Context,
    backend: &Instrumented,
    made_for: &MachineIdentity,
) {
    let started = tokio::time::Instant::now();
    let mut wait = Duration::from_millis(200);
    let last = loop {
        let error = match backend.delete(made_for).await {
            Ok(Deletion::Gone) => {
                tracing::info!(machine = %key_of(machine), uid = %made_for.uid, "the backend VM of a machine that vanished is gone");
                let_go(machine, ctx);
                return;
            }
            Ok(Deletion::InProgress { retry_after }) => {
                wait = retry_after;
                None
            }
            Err(error) if error.is_transient() => Some(error),
            Err(error) => break error,
        };
        if started.elapsed() + wait > PATIENCE {
            break error.unwrap_or_else(|| {
                BackendError::transient("DeletionTimedOut", "the backend was still deleting it")
            });
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_secs(10));
    };
    give_up(machine, ctx, &last).await;
}

/// Says, as an error log and a Warning Event on the vanished machine, that its VM may
/// be left on the backend.
async fn give_up<K: Machine>(machine: &K, ctx: &Context, why: &BackendError) {
    let message = format!(
        "the machine was deleted without its cleanup, and its backend VM (UID {}{}) could not be deleted: {}: {}. Check the backend and delete the VM there",
        machine.uid().unwrap_or_default(),
        machine
            .provider_id()
            .map(|id| format!(", providerID {id}"))
            .unwrap_or_default(),
        why.reason,
        why.message
    );
    tracing::error!(machine = %key_of(machine), "{message}");
    ctx.event(
        machine,
        EventType::Warning,
        "BackendVMLeft",
        "Delete",
        message,
    )
    .await;
    let_go(machine, ctx);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::infra::libvirt::LibvirtMachine;

    fn machine(finalizers: &[&str], annotations: &[(&str, &str)]) -> LibvirtMachine {
        machine_deleted(finalizers, annotations, false)
    }

    fn machine_deleted(
        finalizers: &[&str],
        annotations: &[(&str, &str)],
        terminating: bool,
    ) -> LibvirtMachine {
        let mut m: LibvirtMachine = serde_json::from_value(serde_json::json!({
            "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "LibvirtMachine",
            "metadata": {"name": "m", "namespace": "ns", "uid": "u"},
            "spec": {"image": {"path": "/images/debian.qcow2"}, "cpus": 1, "memoryMiB": 512}
        }))
        .expect("a LibvirtMachine");
        m.metadata.finalizers = Some(finalizers.iter().map(|f| f.to_string()).collect());
        m.metadata.deletion_timestamp =
            terminating.then_some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        m.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        m
    }

    #[test]
    fn only_a_machine_deleted_with_the_finalizer_on_went_without_its_cleanup() {
        assert!(vanished_uncleaned(&machine(&[MACHINE_FINALIZER], &[])));
        assert!(
            !vanished_uncleaned(&machine_deleted(&[MACHINE_FINALIZER], &[], true)),
            "deleted the normal way: terminating, then our cleanup removed the finalizer"
        );
        assert!(
            !vanished_uncleaned(&machine(&[], &[])),
            "deleted before it was ever finalized: it never reached a backend"
        );
        assert!(
            !vanished_uncleaned(&machine(&["someone.else/finalizer"], &[])),
            "another party's finalizer says nothing about ours"
        );
        assert!(
            !vanished_uncleaned(&machine(
                &[MACHINE_FINALIZER],
                &[("clusterctl.cluster.x-k8s.io/delete-for-move", "")]
            )),
            "clusterctl move: the VM lives on elsewhere"
        );
    }
}
