//! The Provider controller: connect through the backend, publish the inventory and
//! `Reachable`/`Ready`; re-check every sync period and whenever the credentials Secret
//! or CA bundle changes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Config as ControllerConfig};
use kube::runtime::events::EventType;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{ResourceExt, runtime::finalizer};
use serde_json::json;

use super::context::{Context, key_of};
use super::watch;
use crate::api::Provider;
use crate::conditions;
use crate::status::provider::{Unreachable, compute};

const NAME: &str = "provider";
/// Field manager of Provider status.
pub(crate) const FIELD_MANAGER: &str = "banlieue-provider";

#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    #[error("writing status: {0}")]
    Kube(#[from] kube::Error),
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
    controller
        .watches(
            watch::namespaced::<Secret>(&ctx.client, &ctx.settings),
            watch::unfiltered(),
            move |secret| {
                referencing(
                    &by_secret,
                    &secret.namespace().unwrap_or_default(),
                    &secret.name_any(),
                    true,
                )
            },
        )
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
            finalizer::Event::Cleanup(p) => {
                ctx.backends
                    .forget(&p.namespace().unwrap_or_default(), &p.name_any());
                Ok(Action::await_change())
            }
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

async fn apply(provider: &Provider, ctx: &Context) -> Result<Action, Error> {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let generation = provider.metadata.generation;
    let (status, requeue) = match ctx.backends.for_provider(&ctx.client, provider).await {
        Err(unreachable) => (
            compute(
                provider.status.as_ref(),
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
                    provider.status.as_ref(),
                    &provider.spec,
                    generation,
                    Ok(&inventory),
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
                        provider.status.as_ref(),
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
    if provider.status.as_ref() != Some(&status) {
        let was_ready = provider
            .status
            .as_ref()
            .is_some_and(|s| conditions::is_true(&s.conditions, conditions::types::READY));
        let api: Api<Provider> = Api::namespaced(
            ctx.client.clone(),
            &provider.namespace().unwrap_or_default(),
        );
        let patch =
            json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "status": status});
        api.patch_status(
            &provider.name_any(),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?;
        ctx.metrics.wrote(NAME);
        if was_ready != ready {
            let ready_condition = conditions::get(&status.conditions, conditions::types::READY);
            let (reason, note) = ready_condition
                .map(|c| (c.reason.clone(), c.message.clone()))
                .unwrap_or_default();
            let type_ = if ready {
                EventType::Normal
            } else {
                EventType::Warning
            };
            ctx.event(provider, type_, &reason, "Check", note).await;
        }
    }
    Ok(match requeue {
        Some(after) => Action::requeue(after),
        None => Action::requeue(recheck_period(ctx, ready)),
    })
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
    tracing::warn!(provider = %key_of(provider.as_ref()), %error, "reconcile failed");
    Action::requeue(ctx.backoff(&key_of(provider.as_ref())))
}
