//! One generic reconciler for every InfraCluster kind: it publishes the failure
//! domains of the Providers the cluster spans (several vCenters, Proxmox clusters or
//! hosts in one cluster), marks the cluster provisioned, and labels those Providers
//! and their credential Secrets so `clusterctl move` carries them along.
//!
//! InfraClusters own no backend resource, so they carry no finalizer.

use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Config as ControllerConfig};
use kube::runtime::reflector::ObjectRef;
use serde_json::json;

use super::context::{Context, key_of};
use super::{capi, status_write, watch};
use crate::api::Provider;
use crate::build::machine_kind;
use crate::capi::failure_domains::{ProviderDomains, Selection, aggregate};
use crate::capi::metadata::{self, MOVE_LABEL};
use crate::capi::objects::Cluster as CapiCluster;
use crate::conditions;
use crate::contract::InfraClusterRead;
use crate::controllers::object::Namespaced;
use crate::scheduling::matches;
use crate::status::cluster::{ClusterOutcome, compute};
use kube::ResourceExt;

/// Field manager of InfraCluster status.
const FIELD_MANAGER: &str = "banlieue-cluster";

/// The bounds every InfraCluster kind meets.
pub(crate) trait InfraCluster: Namespaced + InfraClusterRead {}

impl<K: Namespaced + InfraClusterRead> InfraCluster for K {}

pub(crate) async fn run<K: InfraCluster>(
    ctx: Arc<Context>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let api = watch::namespaced::<K>(&ctx.client, &ctx.settings);
    let controller = watch::controller(api, watch::filtered(&ctx.settings))
        .with_config(ControllerConfig::default().concurrency(ctx.settings.concurrency.provider));
    let clusters = controller.store();
    let controller = controller.watches(
        watch::namespaced::<Provider>(&ctx.client, &ctx.settings),
        watch::unfiltered(),
        move |provider| {
            let namespace = provider.namespace();
            clusters
                .state()
                .into_iter()
                .filter(|c| c.namespace() == namespace)
                .map(|c| ObjectRef::from_obj(c.as_ref()))
                .collect::<Vec<_>>()
        },
    );
    let controller = if ctx.capi_installed {
        controller.watches(
            watch::namespaced::<CapiCluster>(&ctx.client, &ctx.settings),
            watch::filtered(&ctx.settings),
            |cluster| {
                let reference = cluster.spec.infrastructure_ref.as_ref()?;
                (reference.api_group == crate::api::INFRA_GROUP && reference.kind == K::kind(&()))
                    .then(|| {
                        ObjectRef::new(&reference.name)
                            .within(&cluster.namespace().unwrap_or_default())
                    })
            },
        )
    } else {
        controller
    };
    controller
        .graceful_shutdown_on(shutdown)
        .run(reconcile::<K>, error_policy::<K>, ctx)
        .for_each(|_| futures::future::ready(()))
        .await;
}

fn name<K: InfraCluster>() -> String {
    K::kind(&()).to_lowercase()
}

async fn reconcile<K: InfraCluster>(
    cluster: Arc<K>,
    ctx: Arc<Context>,
) -> Result<Action, kube::Error> {
    let started = Instant::now();
    let controller = name::<K>();
    // An unlisted Provider cache would read as "ProviderNotFound".
    ctx.stores_synced.wait().await;
    let _worker = ctx.metrics.worker(&controller);
    let result = apply(cluster.as_ref(), &ctx).await;
    let outcome = if result.is_ok() { "success" } else { "error" };
    ctx.metrics
        .reconciled(&controller, outcome, started.elapsed());
    result
}

/// The Providers an InfraCluster spans, and the `providerRefs` that name none.
fn providers<K: InfraCluster>(cluster: &K, ctx: &Context) -> (Vec<Arc<Provider>>, Vec<String>) {
    let namespace = cluster.namespace().unwrap_or_default();
    if !cluster.provider_refs().is_empty() {
        let mut found = vec![];
        let mut missing = vec![];
        for reference in cluster.provider_refs() {
            match ctx
                .stores
                .providers
                .get(&ObjectRef::new(&reference.name).within(&namespace))
            {
                Some(p) => found.push(p),
                None => missing.push(reference.name.clone()),
            }
        }
        return (found, missing);
    }
    let mut found: Vec<_> = ctx
        .stores
        .providers
        .state()
        .into_iter()
        .filter(|p| p.namespace().as_deref() == Some(namespace.as_str()))
        .filter(|p| match cluster.provider_selector() {
            Some(selector) => matches(selector, p.labels()),
            None => machine_kind(p, &ctx.kinds).is_ok_and(|kind| kind == K::MACHINE_KIND),
        })
        .collect();
    found.sort_by_key(|p| p.name_any());
    (found, vec![])
}

async fn apply<K: InfraCluster>(cluster: &K, ctx: &Context) -> Result<Action, kube::Error> {
    let meta = cluster.meta();
    if metadata::externally_managed(meta) {
        return Ok(Action::await_change());
    }
    let namespace = cluster.namespace().unwrap_or_default();
    let owner = match metadata::cluster_name(meta) {
        Some(name) if ctx.capi_installed => capi::cluster(ctx, &namespace, name).await?,
        _ => None,
    };
    if let Some(message) = metadata::paused(meta, owner.as_ref()) {
        write_status(cluster, ctx, ClusterOutcome::Paused { message }).await?;
        return Ok(Action::await_change());
    }
    let (providers, missing) = providers(cluster, ctx);
    if metadata::is_capi_managed(meta) {
        for provider in &providers {
            label_for_move(ctx, provider).await?;
        }
    }
    let inputs: Vec<_> = providers
        .iter()
        .map(|p| ProviderDomains {
            provider: p.metadata.name.as_deref().unwrap_or_default(),
            domains: p
                .status
                .as_ref()
                .map(|s| s.failure_domains.as_slice())
                .unwrap_or_default(),
        })
        .collect();
    let (failure_domains, left_out) = aggregate(
        &inputs,
        Selection {
            publish: cluster.failure_domain_selector(),
            control_plane: cluster.control_plane_failure_domain_selector(),
        },
    );
    let ready_providers = providers
        .iter()
        .filter(|p| {
            p.status
                .as_ref()
                .is_some_and(|s| conditions::is_true(&s.conditions, conditions::types::READY))
        })
        .count();
    write_status(
        cluster,
        ctx,
        ClusterOutcome::Aggregated {
            failure_domains: &failure_domains,
            providers: providers.len(),
            ready_providers,
            missing: &missing,
            left_out,
        },
    )
    .await?;
    Ok(Action::requeue(ctx.settings.sync_period))
}

/// Labels a Provider and its credentials Secret `clusterctl.cluster.x-k8s.io/move`:
/// no Cluster owns them, and without the label `clusterctl move` leaves them behind
/// and the moved cluster's machines cannot reach their backend.
async fn label_for_move(ctx: &Context, provider: &Provider) -> Result<(), kube::Error> {
    if provider.labels().contains_key(MOVE_LABEL) {
        return Ok(());
    }
    let namespace = provider.namespace().unwrap_or_default();
    let patch = Patch::Merge(json!({"metadata": {"labels": {MOVE_LABEL: ""}}}));
    if let Some(secret) = &provider.spec.connection.credentials_ref {
        match Api::<Secret>::namespaced(ctx.client.clone(), &namespace)
            .patch(&secret.name, &PatchParams::default(), &patch)
            .await
        {
            Ok(_) => {}
            // A missing Secret is the Provider's condition to report, not ours.
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => return Err(error),
        }
    }
    Api::<Provider>::namespaced(ctx.client.clone(), &namespace)
        .patch(&provider.name_any(), &PatchParams::default(), &patch)
        .await?;
    Ok(())
}

async fn write_status<K: InfraCluster>(
    cluster: &K,
    ctx: &Context,
    outcome: ClusterOutcome<'_>,
) -> Result<(), kube::Error> {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let known = status_write::known(&ctx.written.clusters, cluster, cluster.cluster_status());
    let status = compute(known.as_ref(), cluster.meta().generation, outcome, &now);
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default());
    let written = &ctx.written.clusters;
    let metric = name::<K>();
    status_write::write(
        ctx,
        &api,
        cluster,
        Some(written),
        (FIELD_MANAGER, &metric),
        known.as_ref(),
        status,
    )
    .await?;
    Ok(())
}

fn error_policy<K: InfraCluster>(
    cluster: Arc<K>,
    error: &kube::Error,
    ctx: Arc<Context>,
) -> Action {
    if super::expected::kube_race(error) {
        tracing::debug!(cluster = %key_of(cluster.as_ref()), kind = %K::kind(&()), %error, "reconcile raced a stale cache; retrying");
        return Action::requeue(super::expected::RETRY_RACE);
    }
    tracing::warn!(cluster = %key_of(cluster.as_ref()), kind = %K::kind(&()), %error, "reconcile failed");
    Action::requeue(ctx.backoff(&key_of(cluster.as_ref())))
}
