//! The reconcile kernel: every controller written on it is `observe → plan → execute`.
//!
//! - [`Reconciler::observe`] reads what the decision needs (caches, this process's
//!   ledgers, a backend where the controller's job is to ask one) into a `Facts` value.
//! - [`Reconciler::plan`] is pure: from the object and its facts to a [`Plan`], a plain
//!   value (the status to write, when to look again). Whole reconciles are unit-tested
//!   as `Facts → Plan` tables, without an API server.
//! - [`execute`] carries a plan out, the same way for every controller: the status write
//!   (a merge patch of what changed since the status this process knows, or a shared
//!   server-side apply), metrics, and the requeue, with per-object backoff. [`drive`]
//!   runs a controller on it with the one error policy.
//!
//! Requeue decisions are data ([`Next`]), and so is keeping a deleted object's
//! finalizer ([`Plan::release`]): an error here is a failed API call, nothing else.
//! A controller with a finalizer names it ([`Reconciler::FINALIZER`]); the kernel adds
//! it, and removes it when a plan for the deleted object says `release`, then lets the
//! controller forget the object ([`Reconciler::released`]).

mod next;

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::Resource;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::Controller;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use super::context::{Context, key_of};
use super::orphan_backend::{self, LeftBehind};
use super::status_write;
use super::written::Written;

pub(crate) use next::Next;

/// What one reconcile decided: a value the executor carries out, in its order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Plan<S> {
    /// Other objects to change first.
    pub edits: Vec<Edit>,
    /// The status to write.
    pub status: StatusChange<S>,
    /// Events to publish on the object, after the status.
    pub events: Vec<Note>,
    /// For an object being deleted: its finalizer may go (after everything above).
    pub release: bool,
    /// When to look at the object again.
    pub next: Next,
}

impl<S> Plan<S> {
    /// A plan that writes `status` and looks again as `next` says.
    pub(crate) fn status(status: StatusChange<S>, next: Next) -> Self {
        Plan {
            edits: Vec::new(),
            status,
            events: Vec::new(),
            release: false,
            next,
        }
    }

    /// A plan that lets a deleted object's finalizer go, and nothing else.
    pub(crate) fn release() -> Self {
        Plan {
            release: true,
            ..Plan::status(StatusChange::Unchanged, Next::AwaitChange)
        }
    }
}

/// An Event on the reconciled object.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Note {
    /// Normal or Warning.
    pub type_: EventType,
    /// Its reason (CamelCase).
    pub reason: String,
    /// What the controller was doing.
    pub action: &'static str,
    /// For people.
    pub note: String,
}

/// A change to another object than the one reconciled.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Edit {
    /// Adds `labels` to an object (a merge patch of its labels).
    Label {
        /// The object's kind.
        resource: ApiResource,
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// The labels to add.
        labels: BTreeMap<String, String>,
        /// A missing object is someone else's condition to report, not a failure.
        missing_ok: bool,
    },
    /// Leaves a backend VM behind (the orphan-backend escape hatch): passes the
    /// annotation to its infra machine if that is being deleted, logs a line naming
    /// the VM, and puts a Warning Event naming it on the reconciled object.
    Abandon {
        /// The VM left.
        left: LeftBehind,
        /// The Event's note.
        note: String,
    },
}

/// The status part of a [`Plan`].
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum StatusChange<S> {
    /// Write `next` when it differs from `known` (the status this process knows last:
    /// its own unseen write, else the cached one), as a merge patch of the difference.
    Merge {
        /// What the status is now, as far as this process knows.
        known: Option<S>,
        /// What it should be.
        next: S,
    },
    /// Server-side apply `status` (only the fields `manager` owns), forced: for a
    /// status several operators share, each owning its part.
    Shared {
        /// The field manager owning this part.
        manager: String,
        /// The part, as JSON.
        status: serde_json::Value,
    },
    /// Nothing to write.
    Unchanged,
}

/// One controller on the kernel.
pub(crate) trait Reconciler: Send + Sync + 'static {
    /// The kind reconciled.
    type Object: Resource<DynamicType = ()>
        + Clone
        + Serialize
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static;
    /// What `observe` gathers for `plan`.
    type Facts: Send;
    /// The kind's status.
    type Status: Serialize + Clone + PartialEq + Send + Sync + 'static;

    /// The finalizer the controller keeps on its objects, if any.
    const FINALIZER: Option<&'static str> = None;

    /// The controller's name in metrics and logs.
    fn name(&self) -> &str;

    /// Forgets what this process kept about `object`, once its finalizer is gone.
    fn released(&self, ctx: &Context, object: &Self::Object) {
        let _ = (ctx, object);
    }
    /// The field manager of its status writes.
    const FIELD_MANAGER: &'static str;

    /// Where this process remembers the statuses it wrote (read-your-writes), if the
    /// controller keeps them.
    fn ledger(ctx: &Context) -> Option<&Written<Self::Status>>;

    /// The API the object's status is written through.
    fn api(ctx: &Context, object: &Self::Object) -> Api<Self::Object>;

    /// Gathers what [`Reconciler::plan`] decides from: caches, this process's ledgers,
    /// and what the controller's job is to ask (a backend, an object not cached).
    fn observe(
        &self,
        object: &Arc<Self::Object>,
        ctx: &Arc<Context>,
    ) -> impl Future<Output = Result<Self::Facts, kube::Error>> + Send;

    /// Decides. Pure.
    fn plan(&self, object: &Self::Object, facts: &Self::Facts) -> Plan<Self::Status>;
}

/// Why a reconcile did not end in an action.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// An API call failed.
    #[error(transparent)]
    Kube(#[from] kube::Error),
    /// Not a failure: the deleted object keeps its finalizer (its plan did not release
    /// it), and is looked at again as this says. kube's finalizer helper removes the
    /// finalizer on any `Ok`, so keeping it travels as this value.
    #[error("keeps its finalizer")]
    Kept(Action),
    /// Adding or removing the finalizer failed, or a plan's effects did.
    #[error(transparent)]
    Finalizer(Box<finalizer::Error<Error>>),
}

/// Observes, plans and executes one reconcile of `object`; adds and removes its
/// finalizer when the controller keeps one.
pub(crate) async fn reconcile<R: Reconciler>(
    reconciler: &R,
    object: Arc<R::Object>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let started = Instant::now();
    let _worker = ctx.metrics.worker(reconciler.name());
    let Some(name) = R::FINALIZER else {
        return once(reconciler, &object, &ctx, started)
            .await
            .map(|(action, _)| action);
    };
    let api = R::api(&ctx, &object);
    let result = finalizer(&api, name, object.clone(), |event| async {
        match event {
            finalizer::Event::Apply(object) => once(reconciler, &object, &ctx, started)
                .await
                .map(|(action, _)| action),
            finalizer::Event::Cleanup(object) => {
                match once(reconciler, &object, &ctx, started).await? {
                    (action, true) => Ok(action),
                    (action, false) => Err(Error::Kept(action)),
                }
            }
        }
    })
    .await;
    match result {
        Ok(action) => {
            if object.meta().deletion_timestamp.is_some() {
                reconciler.released(&ctx, &object);
            }
            Ok(action)
        }
        Err(finalizer::Error::CleanupFailed(Error::Kept(action))) => Err(Error::Kept(action)),
        Err(error) => Err(Error::Finalizer(Box::new(error))),
    }
}

/// One observe → plan → execute; the action, and whether the plan released the
/// finalizer.
async fn once<R: Reconciler>(
    reconciler: &R,
    object: &Arc<R::Object>,
    ctx: &Arc<Context>,
    started: Instant,
) -> Result<(Action, bool), Error> {
    let facts = reconciler.observe(object, ctx).await?;
    let plan = reconciler.plan(object, &facts);
    let release = plan.release;
    let action = execute(reconciler, ctx, object, plan, started).await?;
    Ok((action, release))
}

/// Carries out `plan` for `object`.
pub(crate) async fn execute<R: Reconciler>(
    reconciler: &R,
    ctx: &Context,
    object: &R::Object,
    plan: Plan<R::Status>,
    started: Instant,
) -> Result<Action, kube::Error> {
    let name = reconciler.name();
    for edit in &plan.edits {
        carry_out(ctx, object, name, edit).await?;
    }
    let api = R::api(ctx, object);
    match plan.status {
        StatusChange::Merge { known, next } => {
            status_write::write(
                ctx,
                &api,
                object,
                R::ledger(ctx),
                (R::FIELD_MANAGER, name),
                known.as_ref(),
                next,
            )
            .await?;
        }
        StatusChange::Shared { manager, status } => {
            status_write::apply(ctx, &api, object, (&manager, name), &status).await?;
        }
        StatusChange::Unchanged => {}
    }
    for event in plan.events {
        ctx.event(object, event.type_, &event.reason, event.action, event.note)
            .await;
    }
    ctx.metrics.reconciled(name, "success", started.elapsed());
    let key = key_of(object);
    Ok(plan.next.action(
        ctx.settings.sync_period,
        || ctx.backoff(&key),
        || ctx.succeeded(&key),
    ))
}

async fn carry_out<K: Resource<DynamicType = ()>>(
    ctx: &Context,
    object: &K,
    controller: &str,
    edit: &Edit,
) -> Result<(), kube::Error> {
    match edit {
        Edit::Abandon { left, note } => {
            if left.deleting {
                orphan_backend::mark(ctx, &left.kind, &left.namespace, &left.name).await?;
            }
            left.log(controller);
            ctx.event_related(
                object,
                left.reference(),
                EventType::Warning,
                orphan_backend::ABANDONED,
                "Delete",
                note.clone(),
            )
            .await;
            Ok(())
        }
        Edit::Label {
            resource,
            namespace,
            name,
            labels,
            missing_ok,
        } => {
            let api: Api<DynamicObject> =
                Api::namespaced_with(ctx.client.clone(), namespace, resource);
            let patch = Patch::Merge(json!({"metadata": {"labels": labels}}));
            match api.patch(name, &PatchParams::default(), &patch).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(status)) if *missing_ok && status.code == 404 => Ok(()),
                Err(error) => Err(error),
            }
        }
    }
}

/// The one error policy: a kept finalizer is looked at again as its plan said; a
/// write that raced a stale cache is retried at once; any other failure with the
/// object's backoff.
pub(crate) fn error_policy<K: Resource<DynamicType = ()>>(
    name: &str,
    object: &K,
    error: &Error,
    ctx: &Context,
) -> Action {
    if let Error::Kept(action) = error {
        return action.clone();
    }
    let key = key_of(object);
    ctx.metrics.reconciled(name, "error", Duration::ZERO);
    let race = match error {
        Error::Kube(error) => super::expected::kube_race(error),
        Error::Finalizer(error) => super::expected::race(error, |e| match e {
            Error::Kube(e) => Some(e),
            _ => None,
        }),
        Error::Kept(_) => false,
    };
    if race {
        tracing::debug!(controller = name, object = %key, %error, "reconcile raced a stale cache; retrying");
        return Action::requeue(super::expected::RETRY_RACE);
    }
    tracing::warn!(controller = name, object = %key, %error, "reconcile failed");
    Action::requeue(ctx.backoff(&key))
}

/// Runs `controller` with `reconciler` until `shutdown`.
pub(crate) async fn drive<R: Reconciler>(
    reconciler: R,
    controller: Controller<R::Object>,
    ctx: Arc<Context>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let reconciler = Arc::new(reconciler);
    let policy = reconciler.clone();
    controller
        .graceful_shutdown_on(shutdown)
        .run(
            move |object, ctx| {
                let reconciler = reconciler.clone();
                async move { reconcile(reconciler.as_ref(), object, ctx).await }
            },
            move |object, error, ctx| error_policy(policy.name(), object.as_ref(), error, &ctx),
            ctx,
        )
        .for_each(|_| futures::future::ready(()))
        .await;
}
