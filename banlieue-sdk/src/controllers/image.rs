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
    // With the Provider cache unlisted, the image would read as served nowhere.
    ctx.stores_synced.wait().await;
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
    let next = next_look(&rows);
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
    Ok(match next {
        NextLook::SyncPeriod => {
            ctx.succeeded(&image.name_any());
            Action::requeue(ctx.settings.sync_period)
        }
        NextLook::Backoff => {
            Action::requeue(ctx.backoff(&image.name_any()).min(ctx.settings.sync_period))
        }
        NextLook::Soon => Action::requeue(
            ctx.backoff(&image.name_any())
                .min(ctx.settings.sync_period)
                .min(PROVIDER_RECHECK),
        ),
    })
}

/// When a VMImage is looked at again, from the rows just computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NextLook {
    /// Found on every Provider with a source for it: only the periodic resync.
    SyncPeriod,
    /// Missing, or its lookup failed, on a Ready Provider: again with the image's
    /// backoff (1 s, 2 s, ... at most a sync period), sparing the backend. A
    /// transient lookup failure must not leave the image unavailable, and every VM
    /// using it unscheduled, for a whole sync period.
    Backoff,
    /// A Provider is not Ready, or none is in the cache yet: a Provider turning Ready
    /// wakes us through the Provider watch, which can be a moment ahead of the cache
    /// read here, so look again within a few seconds whatever the backoff has grown to.
    Soon,
}

fn next_look(rows: &[ImageAvailability]) -> NextLook {
    let provider_not_ready = rows
        .iter()
        .any(|r| r.reason.as_deref() == Some("ProviderNotReady"));
    if rows.is_empty() || provider_not_ready {
        NextLook::Soon
    } else if rows.iter().all(|r| r.available) {
        NextLook::SyncPeriod
    } else {
        NextLook::Backoff
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn row(available: bool, reason: Option<&str>) -> ImageAvailability {
        ImageAvailability {
            namespace: "ns".into(),
            name: "p".into(),
            available,
            resolved: available.then(|| "template-1".into()),
            reason: reason.map(str::to_owned),
            message: None,
        }
    }

    #[test]
    fn the_next_look_follows_what_the_rows_say() {
        let cases = [
            (vec![], NextLook::Soon),
            (vec![row(true, None)], NextLook::SyncPeriod),
            (vec![row(true, None), row(true, None)], NextLook::SyncPeriod),
            (
                vec![row(true, None), row(false, Some("ProviderNotReady"))],
                NextLook::Soon,
            ),
            (vec![row(false, Some("ImageNotFound"))], NextLook::Backoff),
            // A transient lookup failure on a Ready Provider (the fault suite's
            // random run waited a 30 s sync period for this one).
            (
                vec![row(true, None), row(false, Some("SimulatedFault"))],
                NextLook::Backoff,
            ),
            (
                vec![
                    row(false, Some("SimulatedFault")),
                    row(false, Some("ProviderNotReady")),
                ],
                NextLook::Soon,
            ),
        ];
        for (rows, want) in cases {
            assert_eq!(next_look(&rows), want, "{rows:?}");
        }
    }
}
