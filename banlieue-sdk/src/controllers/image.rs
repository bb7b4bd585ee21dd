//! The VMImage controller: on which Providers each image is available.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::runtime::controller::{Action, Config as ControllerConfig};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::context::Context;
use super::status_write;
use super::watch;
use crate::api::vm_image::ImageAvailability;
use crate::api::{Provider, VMImage};
use crate::backend::ImageLookup;
use crate::conditions::{self, Desired, Status, types};

const NAME: &str = "vmimage";
const FIELD_MANAGER: &str = "banlieue-vmimage";

#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    #[error("writing status: {0}")]
    Kube(#[from] kube::Error),
}

pub(crate) async fn run(
    ctx: Arc<Context>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let controller =
        watch::controller(Api::<VMImage>::all(ctx.client.clone()), watch::unfiltered())
            .with_config(ControllerConfig::default().concurrency(ctx.settings.concurrency.image));
    let images = controller.store();
    controller
        .watches(
            watch::namespaced::<Provider>(&ctx.client, &ctx.settings),
            watch::unfiltered(),
            move |_| {
                images
                    .state()
                    .into_iter()
                    .map(|i| ObjectRef::from_obj(i.as_ref()))
                    .collect::<Vec<_>>()
            },
        )
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|_| futures::future::ready(()))
        .await;
}

/// The longest wait before looking again while a Provider is not Ready.
const PROVIDER_RECHECK: std::time::Duration = std::time::Duration::from_secs(3);

async fn reconcile(image: Arc<VMImage>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let _worker = ctx.metrics.worker(NAME);
    let mut rows = Vec::new();
    for provider in ctx.stores.providers.state() {
        if !image.spec.sources.has(provider.spec.class) {
            continue;
        }
        let ready = provider
            .status
            .as_ref()
            .is_some_and(|s| conditions::is_true(&s.conditions, types::READY));
        let (available, resolved, reason, message) = if !ready {
            (false, None, Some("ProviderNotReady".to_owned()), None)
        } else {
            match ctx.backends.for_provider(&ctx.client, &provider).await {
                Err(u) => (false, None, Some(u.reason), Some(u.message)),
                Ok(backend) => match backend.find_image(&image.spec.sources).await {
                    Ok(ImageLookup::Available { resolved }) => (true, Some(resolved), None, None),
                    Ok(ImageLookup::Missing { message }) => {
                        (false, None, Some("ImageNotFound".into()), Some(message))
                    }
                    Err(e) => (false, None, Some(e.reason), Some(e.message)),
                },
            }
        };
        rows.push(ImageAvailability {
            namespace: provider.namespace().unwrap_or_default(),
            name: provider.name_any(),
            available,
            resolved,
            reason,
            message,
        });
    }
    rows.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    // No row at all can mean that the Provider cache has not caught up with the
    // Provider watch that woke us (two watches): look again with backoff, not a whole
    // sync period later (the scale benchmark's VMImage waited for it).
    let no_provider_seen = rows.is_empty();
    let provider_not_ready = rows
        .iter()
        .any(|r| r.reason.as_deref() == Some("ProviderNotReady"));
    let api: Api<VMImage> = Api::all(ctx.client.clone());
    let previous = image.status.clone().unwrap_or_default();
    match &ctx.settings.namespace {
        // Watching one namespace: own only that namespace's rows (a field manager per
        // namespace, rows merged by key), and leave the conditions to a cluster-wide operator.
        Some(namespace) => {
            let mine: Vec<_> = previous
                .providers
                .iter()
                .filter(|r| &r.namespace == namespace)
                .cloned()
                .collect();
            if mine != rows {
                let manager = format!("{FIELD_MANAGER}-{namespace}");
                let status = json!({ "providers": rows });
                status_write::apply(&ctx, &api, image.as_ref(), (&manager, NAME), &status).await?;
            }
        }
        None => {
            let mut status = previous.clone();
            let generation = image.meta().generation;
            status.observed_generation = generation;
            let count = rows.iter().filter(|r| r.available).count();
            status.providers = rows;
            let now = Time(k8s_openapi::jiff::Timestamp::now());
            let message = format!("available on {count} Provider(s)");
            let reason = if count > 0 {
                "Available"
            } else {
                "NotAvailable"
            };
            let ready =
                Desired::new(types::READY, Status::from_bool(count > 0), reason).message(&message);
            conditions::set(&mut status.conditions, ready, generation, &now);
            if previous != status {
                status_write::apply(&ctx, &api, image.as_ref(), (FIELD_MANAGER, NAME), &status)
                    .await?;
            }
        }
    }
    ctx.metrics.reconciled(NAME, "success", started.elapsed());
    // A Provider that is not ready yet may be a moment ahead of our cache: look again
    // soon (with backoff) rather than a whole sync period later.
    let all_available = !no_provider_seen && status_rows_available(&image, &ctx);
    if all_available {
        ctx.succeeded(&image.name_any());
        Ok(Action::requeue(ctx.settings.sync_period))
    } else {
        // A Provider turning Ready wakes us through the Provider watch, which can be a
        // moment ahead of the Provider cache read above: while one is not Ready, look
        // again every few seconds at most (the scale benchmark waited minutes for a
        // grown backoff). A missing image on a Ready Provider backs off as usual, to
        // spare the backend.
        let mut again = ctx.backoff(&image.name_any()).min(ctx.settings.sync_period);
        if provider_not_ready {
            again = again.min(PROVIDER_RECHECK);
        }
        Ok(Action::requeue(again))
    }
}

/// Whether every Provider this image has a source for was found ready with the image.
fn status_rows_available(image: &VMImage, ctx: &Context) -> bool {
    ctx.stores
        .providers
        .state()
        .iter()
        .filter(|p| image.spec.sources.has(p.spec.class))
        .all(|p| {
            conditions::is_true(
                p.status
                    .as_ref()
                    .map(|s| s.conditions.as_slice())
                    .unwrap_or_default(),
                types::READY,
            )
        })
}

fn error_policy(image: Arc<VMImage>, error: &Error, ctx: Arc<Context>) -> Action {
    let Error::Kube(kube_error) = error;
    if super::expected::kube_race(kube_error) {
        tracing::debug!(image = %image.name_any(), %error, "reconcile raced a stale cache; retrying");
        ctx.metrics.reconciled(NAME, "error", Duration::ZERO);
        return Action::requeue(super::expected::RETRY_RACE);
    }
    tracing::warn!(image = %image.name_any(), %error, "reconcile failed");
    ctx.metrics.reconciled(NAME, "error", Duration::ZERO);
    Action::requeue(ctx.backoff(&image.name_any()))
}
