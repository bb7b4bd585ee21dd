//! The Provider controller: connect through the backend, publish the inventory and
//! `Reachable`/`Ready`; re-check every sync period and whenever the credentials Secret
//! or CA bundle changes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::WatchStreamExt;
use kube::runtime::controller::{Action, Config as ControllerConfig};
use kube::runtime::events::EventType;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{ResourceExt, runtime::finalizer};

use super::context::{Context, key_of};
use super::status_write;
use super::watch;
use crate::api::Provider;
use crate::api::provider::ProviderStatus;
use crate::conditions;
use crate::status::provider::{Unreachable, compute};

const NAME: &str = "provider";
/// Field manager of Provider status.
pub(crate) const FIELD_MANAGER: &str = "banlieue-provider";

#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    #[error("writing status: {0}")]
    Kube(#[from] kube::Error),
    /// Not a failure: deletion waits for the machines still on the Provider (keeps
    /// the finalizer).
    #[error("deletion waits for {0} machine(s)")]
    InUse(usize),
}

pub(crate) async fn run(
    ctx: Arc<Context>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let api = watch::namespaced::<Provider>(&ctx.client, &ctx.settings);
    let controller = watch::controller(api, watch::unfiltered())
        .with_config(ControllerConfig::default().concurrency(ctx.settings.concurrency.provider));
    let providers = controller.store();
    let by_secret = providers.clone();
    let by_config_map = providers.clone();
    // Secrets are watched for their metadata only (a change bumps resourceVersion):
    // the operator never lists or watches any Secret's content, and reads only the
    // Secrets a Provider names, one GET each when it reconciles that Provider.
    let secret_changes = kube::runtime::watcher(
        watch::namespaced::<PartialObjectMeta<Secret>>(&ctx.client, &ctx.settings),
        watch::unfiltered(),
    )
    .backoff(watch::backoff())
    .touched_objects()
    .filter_map(|secret| futures::future::ready(secret.ok()))
    .flat_map(move |secret| {
        futures::stream::iter(referencing(
            &by_secret,
            &secret.namespace().unwrap_or_default(),
            &secret.name_any(),
            true,
        ))
    });
    controller
        .reconcile_on(secret_changes)
        .watches(
            watch::namespaced::<ConfigMap>(&ctx.client, &ctx.settings),
            watch::unfiltered(),
            move |map| {
                referencing(
                    &by_config_map,
                    &map.namespace().unwrap_or_default(),
                    &map.name_any(),
                    false,
                )
            },
        )
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|_| futures::future::ready(()))
        .await;
}

/// Providers that read a Secret (credentials or CA) or a ConfigMap (CA) of this name.
fn referencing(
    store: &Store<Provider>,
    namespace: &str,
    name: &str,
    secret: bool,
) -> Vec<ObjectRef<Provider>> {
    store
        .state()
        .into_iter()
        .filter(|p| p.namespace().as_deref() == Some(namespace))
        .filter(|p| {
            let c = &p.spec.connection;
            let ca = c.ca_bundle.as_ref();
            if secret {
                c.credentials_ref.as_ref().is_some_and(|r| r.name == name)
                    || ca
                        .and_then(|b| b.secret_ref.as_ref())
                        .is_some_and(|r| r.name == name)
            } else {
                ca.and_then(|b| b.config_map_ref.as_ref())
                    .is_some_and(|r| r.name == name)
            }
        })
        .map(|p| ObjectRef::from_obj(p.as_ref()))
        .collect()
}

const FINALIZER: &str = "banlieue.io/provider";

async fn reconcile(
    provider: Arc<Provider>,
    ctx: Arc<Context>,
) -> Result<Action, finalizer::Error<Error>> {
    let started = Instant::now();
    let _worker = ctx.metrics.worker(NAME);
    let api: Api<Provider> = Api::namespaced(
        ctx.client.clone(),
        &provider.namespace().unwrap_or_default(),
    );
    let result = finalizer(&api, FINALIZER, provider, |event| async {
        match event {
            finalizer::Event::Apply(p) => apply(&p, &ctx).await,
            finalizer::Event::Cleanup(p) => cleanup(&p, &ctx).await,
        }
    })
    .await;
    ctx.metrics.reconciled(
        NAME,
        if result.is_ok() { "success" } else { "error" },
        started.elapsed(),
    );
    result
}

/// A Provider goes only once no machine is on it: each machine's backend VM is deleted
/// through it, and a Provider that went first would strand them. Until then `Ready`
/// says which machines hold it, and a Warning Event says so once.
async fn cleanup(provider: &Provider, ctx: &Context) -> Result<Action, Error> {
    let namespace = provider.namespace().unwrap_or_default();
    let name = provider.name_any();
    // Before the machine caches have listed, "no machines" means "not known yet".
    let synced = ctx.stores_synced.is_synced();
    let holders = ctx.stores.machines_on(&namespace, &name);
    if synced && !holders.is_empty() && super::orphan_backend::requested(&provider.metadata) {
        // The escape hatch: every VM left behind is named, then the Provider goes.
        super::orphan_backend::abandon_provider(provider, ctx).await?;
        ctx.backends.forget(&namespace, &name);
        return Ok(Action::await_change());
    }
    if !synced || !holders.is_empty() {
        let message = deletion_blocked(&holders, synced);
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let known = status_write::known(&ctx.written.providers, provider, provider.status.as_ref());
        let mut status = known.clone().unwrap_or_default();
        conditions::set(
            &mut status.conditions,
            conditions::Desired::new(
                conditions::types::READY,
                conditions::Status::False,
                DELETION_BLOCKED,
            )
            .message(&message),
            provider.metadata.generation,
            &now,
        );
        if known.as_ref() != Some(&status) {
            let first = known.as_ref().is_none_or(|s| {
                conditions::get(&s.conditions, conditions::types::READY)
                    .is_none_or(|c| c.reason != DELETION_BLOCKED)
            });
            write_status(provider, ctx, known.as_ref(), status).await?;
            if first && synced {
                ctx.event(
                    provider,
                    EventType::Warning,
                    DELETION_BLOCKED,
                    "Delete",
                    message,
                )
                .await;
            }
        }
        return Err(Error::InUse(holders.len()));
    }
    ctx.backends.forget(&namespace, &name);
    Ok(Action::await_change())
}

/// `Ready`'s reason while a Provider being deleted still has machines.
pub(crate) const DELETION_BLOCKED: &str = "DeletionBlocked";

/// How many machines to name in the message; the count covers the rest.
const NAMED_HOLDERS: usize = 5;

/// What a Provider being deleted waits for, for humans.
fn deletion_blocked(holders: &[String], synced: bool) -> String {
    if !synced {
        return "deletion waits until the operator has listed the machines that may use this Provider".into();
    }
    let mut named = holders
        .iter()
        .take(NAMED_HOLDERS)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if holders.len() > NAMED_HOLDERS {
        named.push_str(&format!(" and {} more", holders.len() - NAMED_HOLDERS));
    }
    format!(
        "deletion waits for {} machine(s) still on this Provider: {named}. Delete their VirtualMachines (or Cluster API Machines) first: their backend VMs are deleted through this Provider. To let it go now and leave their backend VMs behind, annotate it {}=true",
        holders.len(),
        super::ORPHAN_BACKEND_ANNOTATION
    )
}

/// Writes `status` over `known` (see [`status_write`]); whether it wrote.
async fn write_status(
    provider: &Provider,
    ctx: &Context,
    known: Option<&ProviderStatus>,
    status: ProviderStatus,
) -> Result<bool, Error> {
    let api: Api<Provider> = Api::namespaced(
        ctx.client.clone(),
        &provider.namespace().unwrap_or_default(),
    );
    let written = &ctx.written.providers;
    Ok(status_write::write(
        ctx,
        &api,
        provider,
        Some(written),
        (FIELD_MANAGER, NAME),
        known,
        status,
    )
    .await?)
}

async fn apply(provider: &Provider, ctx: &Context) -> Result<Action, Error> {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let generation = provider.metadata.generation;
    let known = status_write::known(&ctx.written.providers, provider, provider.status.as_ref());
    let (status, requeue) = match ctx.backends.refresh(&ctx.client, provider).await {
        Err(unreachable) => (
            compute(
                known.as_ref(),
                &provider.spec,
                generation,
                Err(&unreachable),
                &now,
            ),
            None,
        ),
        Ok(backend) => match backend.check().await {
            Ok(inventory) => (
                compute(
                    known.as_ref(),
                    &provider.spec,
                    generation,
                    Ok((&inventory, &backend.capabilities())),
                    &now,
                ),
                None,
            ),
            Err(error) => {
                let unreachable = Unreachable {
                    reason: error.reason.clone(),
                    message: error.message.clone(),
                };
                let retry = error.is_transient().then(|| ctx.backoff(&key_of(provider)));
                (
                    compute(
                        known.as_ref(),
                        &provider.spec,
                        generation,
                        Err(&unreachable),
                        &now,
                    ),
                    retry,
                )
            }
        },
    };
    let ready = conditions::is_true(&status.conditions, conditions::types::READY);
    if ready {
        ctx.succeeded(&key_of(provider));
    }
    let before = known
        .as_ref()
        .and_then(|s| conditions::get(&s.conditions, conditions::types::READY))
        .cloned();
    let after = conditions::get(&status.conditions, conditions::types::READY).cloned();
    if write_status(provider, ctx, known.as_ref(), status).await?
        && let (Some(type_), Some(c)) = (announcement(before.as_ref(), after.as_ref()), after)
    {
        ctx.event(provider, type_, &c.reason, "Check", c.message.clone())
            .await;
    }
    Ok(match requeue {
        Some(after) => Action::requeue(after),
        None => Action::requeue(recheck_period(ctx, ready)),
    })
}

/// The Event a change of `Ready` from `before` to `after` deserves: `Normal` when the
/// Provider becomes Ready, `Warning` when it stops being Ready, when its very first
/// check finds it unready, or when it stays unready for another reason. `None` for a
/// recheck that finds what the last one found (an unready Provider is not announced
/// again every 30 s).
fn announcement(before: Option<&Condition>, after: Option<&Condition>) -> Option<EventType> {
    let after = after?;
    let ready = after.status == "True";
    match before {
        None if ready => Some(EventType::Normal),
        None => Some(EventType::Warning),
        Some(b) if (b.status == "True") != ready => Some(if ready {
            EventType::Normal
        } else {
            EventType::Warning
        }),
        Some(b) if !ready && b.reason != after.reason => Some(EventType::Warning),
        Some(_) => None,
    }
}

/// Ready Providers are re-checked every sync period; unready ones sooner, so a fixed
/// backend is noticed quickly (but never in a hot loop).
fn recheck_period(ctx: &Context, ready: bool) -> Duration {
    if ready {
        ctx.settings.sync_period
    } else {
        ctx.settings.sync_period.min(Duration::from_secs(30))
    }
}

fn error_policy(
    provider: Arc<Provider>,
    error: &finalizer::Error<Error>,
    ctx: Arc<Context>,
) -> Action {
    if let finalizer::Error::CleanupFailed(Error::InUse(_)) = error {
        // The machines' deletions are not watched here: look again soon (a cache scan).
        return Action::requeue(Duration::from_secs(2));
    }
    let race = super::expected::race(error, |e| match e {
        Error::Kube(e) => Some(e),
        #[allow(unreachable_patterns)]
        _ => None,
    });
    if race {
        tracing::debug!(provider = %key_of(provider.as_ref()), %error, "reconcile raced a stale cache; retrying");
        return Action::requeue(super::expected::RETRY_RACE);
    }
    tracing::warn!(provider = %key_of(provider.as_ref()), %error, "reconcile failed");
    Action::requeue(ctx.backoff(&key_of(provider.as_ref())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blocked_deletion_names_the_machines_and_counts_the_rest() {
        let few: Vec<String> = vec!["LibvirtMachine/a".into(), "CloudHypervisorMachine/b".into()];
        let message = deletion_blocked(&few, true);
        assert!(message.starts_with("deletion waits for 2 machine(s) still on this Provider: LibvirtMachine/a, CloudHypervisorMachine/b."), "{message}");
        assert!(!message.contains("more"), "{message}");
        assert!(
            message.contains("annotate it banlieue.io/orphan-backend=true"),
            "the way out: {message}"
        );
        let many: Vec<String> = (0..8).map(|i| format!("VSphereMachine/m{i}")).collect();
        let message = deletion_blocked(&many, true);
        assert!(
            message.contains("VSphereMachine/m4 and 3 more."),
            "{message}"
        );
        assert!(!message.contains("m5"), "{message}");
    }

    #[test]
    fn before_the_caches_list_the_message_says_so() {
        assert!(deletion_blocked(&[], false).contains("has listed the machines"));
    }
}

#[cfg(test)]
mod announcement_tests {
    use super::*;

    fn ready(status: &str, reason: &str) -> Condition {
        Condition {
            type_: "Ready".into(),
            status: status.into(),
            reason: reason.into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        }
    }

    #[test]
    fn an_unready_provider_is_announced_once_per_cause() {
        let down = ready("False", "Unreachable");
        let denied = ready("False", "Unauthorized");
        let up = ready("True", "Ready");
        let table = [
            (
                None,
                Some(&down),
                Some(EventType::Warning),
                "unready from its first check",
            ),
            (Some(&down), Some(&down), None, "the same on every recheck"),
            (
                Some(&down),
                Some(&denied),
                Some(EventType::Warning),
                "another cause",
            ),
            (Some(&down), Some(&up), Some(EventType::Normal), "fixed"),
            (None, Some(&up), Some(EventType::Normal), "ready at once"),
            (Some(&up), Some(&up), None, "stays ready"),
            (
                Some(&up),
                Some(&down),
                Some(EventType::Warning),
                "goes down",
            ),
            (Some(&up), None, None, "no Ready condition"),
        ];
        for (before, after, want, case) in table {
            assert_eq!(announcement(before, after), want, "{case}");
        }
    }
}
