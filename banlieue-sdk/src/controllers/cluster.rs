//! One generic reconciler for every InfraCluster kind: it publishes the failure
//! domains of the Providers the cluster spans (several vCenters, Proxmox clusters or
//! hosts in one cluster), marks the cluster provisioned, and labels those Providers
//! and their credential Secrets so `clusterctl move` carries them along.
//!
//! InfraClusters own no backend resource, so they carry no finalizer.

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ApiResource};
use kube::runtime::controller::Config as ControllerConfig;
use kube::runtime::reflector::ObjectRef;

use super::context::Context;
use super::kernel::{self, Edit, Next, Plan, Reconciler, StatusChange};
use super::written::Written;
use super::{capi, status_write, watch};
use crate::api::Provider;
use crate::api::infra::ClusterStatus;
use crate::builder::machine_kind;
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
    let clusters = Clusters::<K> {
        name: K::kind(&()).to_lowercase(),
        kind: PhantomData,
    };
    kernel::drive(clusters, controller, ctx, shutdown).await;
}

/// The InfraCluster controller of kind `K`.
struct Clusters<K> {
    /// `K`'s kind, lower case: the controller's name in metrics and logs.
    name: String,
    kind: PhantomData<fn() -> K>,
}

/// What an InfraCluster's reconcile decides from.
#[derive(Debug, Clone)]
struct Facts {
    /// Its Cluster API Cluster, when it names one and Cluster API is installed.
    owner: Option<CapiCluster>,
    /// The Providers it spans.
    providers: Vec<Arc<Provider>>,
    /// Its `providerRefs` that name no Provider.
    missing: Vec<String>,
    /// Its status as this process knows it last.
    known: Option<ClusterStatus>,
    now: Time,
}

impl<K: InfraCluster> Reconciler for Clusters<K> {
    type Object = K;
    type Facts = Facts;
    type Status = ClusterStatus;

    const FIELD_MANAGER: &'static str = FIELD_MANAGER;

    fn name(&self) -> &str {
        &self.name
    }

    fn ledger(ctx: &Context) -> Option<&Written<ClusterStatus>> {
        Some(&ctx.written.clusters)
    }

    fn api(ctx: &Context, cluster: &K) -> Api<K> {
        Api::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default())
    }

    async fn observe(&self, cluster: &Arc<K>, ctx: &Arc<Context>) -> kube::Result<Facts> {
        // An unlisted Provider cache would read as "ProviderNotFound".
        ctx.stores_synced.wait().await;
        let meta = cluster.meta();
        let namespace = cluster.namespace().unwrap_or_default();
        // A cluster someone else manages is not read further: it is not ours.
        let owner = match metadata::cluster_name(meta) {
            Some(name) if ctx.capi_installed && !metadata::externally_managed(meta) => {
                capi::cluster(ctx, &namespace, name).await?
            }
            _ => None,
        };
        let (providers, missing) = providers(cluster.as_ref(), ctx);
        Ok(Facts {
            owner,
            providers,
            missing,
            known: status_write::known(
                &ctx.written.clusters,
                cluster.as_ref(),
                cluster.cluster_status(),
            ),
            now: Time(k8s_openapi::jiff::Timestamp::now()),
        })
    }

    fn plan(&self, cluster: &K, facts: &Facts) -> Plan<ClusterStatus> {
        plan(cluster, facts)
    }
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

fn plan<K: InfraCluster>(cluster: &K, facts: &Facts) -> Plan<ClusterStatus> {
    let meta = cluster.meta();
    if metadata::externally_managed(meta) {
        return Plan::status(StatusChange::Unchanged, Next::AwaitChange);
    }
    let status = |outcome| StatusChange::Merge {
        known: facts.known.clone(),
        next: compute(facts.known.as_ref(), meta.generation, outcome, &facts.now),
    };
    if let Some(message) = metadata::paused(meta, facts.owner.as_ref()) {
        return Plan::status(
            status(ClusterOutcome::Paused { message }),
            Next::AwaitChange,
        );
    }
    let edits = if metadata::is_capi_managed(meta) {
        facts
            .providers
            .iter()
            .flat_map(|p| label_for_move(p))
            .collect()
    } else {
        Vec::new()
    };
    let inputs: Vec<_> = facts
        .providers
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
    let ready_providers = facts
        .providers
        .iter()
        .filter(|p| {
            p.status
                .as_ref()
                .is_some_and(|s| conditions::is_true(&s.conditions, conditions::types::READY))
        })
        .count();
    Plan {
        edits,
        events: Vec::new(),
        release: false,
        status: status(ClusterOutcome::Aggregated {
            failure_domains: &failure_domains,
            providers: facts.providers.len(),
            ready_providers,
            missing: &facts.missing,
            left_out,
        }),
        next: Next::SyncPeriod,
    }
}

/// Labels a Provider and its credentials Secret `clusterctl.cluster.x-k8s.io/move`
/// (the Secret first; a missing one is the Provider's condition to report, not
/// ours): no Cluster owns them, and without the label `clusterctl move` leaves them
/// behind and the moved cluster's machines cannot reach their backend.
fn label_for_move(provider: &Provider) -> Vec<Edit> {
    if provider.labels().contains_key(MOVE_LABEL) {
        return Vec::new();
    }
    let namespace = provider.namespace().unwrap_or_default();
    let labels = BTreeMap::from([(MOVE_LABEL.to_owned(), String::new())]);
    let secret = provider
        .spec
        .connection
        .credentials_ref
        .as_ref()
        .map(|secret| Edit::Label {
            resource: ApiResource::erase::<Secret>(&()),
            namespace: namespace.clone(),
            name: secret.name.clone(),
            labels: labels.clone(),
            missing_ok: true,
        });
    secret
        .into_iter()
        .chain([Edit::Label {
            resource: ApiResource::erase::<Provider>(&()),
            namespace,
            name: provider.name_any(),
            labels,
            missing_ok: false,
        }])
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::api::infra::vsphere::VSphereCluster;
    use crate::capi::metadata::{CLUSTER_NAME_LABEL, MANAGED_BY_ANNOTATION, PAUSED_ANNOTATION};
    use crate::conditions::types;

    fn cluster(labels: serde_json::Value, annotations: serde_json::Value) -> VSphereCluster {
        serde_json::from_value(json!({
            "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "VSphereCluster",
            "metadata": {"name": "c1", "namespace": "ns", "generation": 2,
                         "labels": labels, "annotations": annotations},
            "spec": {"providerRefs": [{"name": "vc-a"}, {"name": "vc-b"}]}
        }))
        .expect("a VSphereCluster")
    }

    fn capi_managed() -> VSphereCluster {
        cluster(json!({CLUSTER_NAME_LABEL: "c1"}), json!({}))
    }

    fn provider(name: &str, ready: bool, labelled: bool, secret: Option<&str>) -> Arc<Provider> {
        let labels = if labelled {
            json!({MOVE_LABEL: ""})
        } else {
            json!({})
        };
        let mut connection = json!({"endpoint": "https://vc.example/sdk"});
        if let Some(secret) = secret {
            connection["credentialsRef"] = json!({"name": secret});
        }
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider",
                "metadata": {"name": name, "namespace": "ns", "labels": labels},
                "spec": {"class": "vsphere", "connection": connection},
                "status": {"conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"},
                    "reason": "R", "message": "", "lastTransitionTime": "2026-12-07T00:00:00Z"}]}
            }))
            .expect("a Provider"),
        )
    }

    fn facts(providers: Vec<Arc<Provider>>, owner: Option<CapiCluster>) -> Facts {
        Facts {
            owner,
            providers,
            missing: vec![],
            known: None,
            now: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        }
    }

    fn paused_owner() -> CapiCluster {
        serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": "c1", "namespace": "ns"}, "spec": {"paused": true}
        }))
        .expect("a Cluster")
    }

    fn written(plan: &Plan<ClusterStatus>) -> &ClusterStatus {
        match &plan.status {
            StatusChange::Merge { next, .. } => next,
            other => panic!("expected a status, got {other:?}"),
        }
    }

    fn ready(plan: &Plan<ClusterStatus>) -> (String, String) {
        let c = conditions::get(&written(plan).conditions, types::READY).expect("Ready");
        (c.status.clone(), c.reason.clone())
    }

    fn labelled(plan: &Plan<ClusterStatus>) -> Vec<(String, String, bool)> {
        plan.edits
            .iter()
            .map(|edit| match edit {
                Edit::Label {
                    resource,
                    name,
                    missing_ok,
                    ..
                } => (resource.kind.clone(), name.clone(), *missing_ok),
                other => panic!("an InfraCluster only labels: {other:?}"),
            })
            .collect()
    }

    #[test]
    fn an_infra_cluster_reconcile_plans_what_each_case_needs() {
        let a = || provider("vc-a", true, false, Some("vc-a-creds"));
        let b_labelled = || provider("vc-b", false, true, Some("vc-b-creds"));
        let externally = cluster(
            json!({CLUSTER_NAME_LABEL: "c1"}),
            json!({MANAGED_BY_ANNOTATION: "other"}),
        );
        let annotated = cluster(
            json!({CLUSTER_NAME_LABEL: "c1"}),
            json!({PAUSED_ANNOTATION: ""}),
        );
        let standalone = cluster(json!({}), json!({}));

        // Someone else manages it: nothing written, nothing labelled, only a change wakes it.
        let p = plan(&externally, &facts(vec![a()], None));
        assert_eq!(p, Plan::status(StatusChange::Unchanged, Next::AwaitChange));

        // Paused by its own annotation or by its Cluster: Paused, no labels.
        for (c, owner) in [(&annotated, None), (&capi_managed(), Some(paused_owner()))] {
            let p = plan(c, &facts(vec![a()], owner));
            assert_eq!(labelled(&p), vec![], "paused clusters label nothing");
            assert_eq!(p.next, Next::AwaitChange);
            let paused = conditions::get(&written(&p).conditions, types::PAUSED).expect("Paused");
            assert_eq!(paused.status, "True");
            assert_eq!(ready(&p).0, "Unknown");
        }

        // Cluster API's: unlabelled Providers and their Secrets are labelled for
        // `clusterctl move`, the Secret first (a missing one is not our failure).
        let p = plan(&capi_managed(), &facts(vec![a(), b_labelled()], None));
        assert_eq!(
            labelled(&p),
            vec![
                ("Secret".into(), "vc-a-creds".into(), true),
                ("Provider".into(), "vc-a".into(), false),
            ]
        );
        assert_eq!(p.next, Next::SyncPeriod);
        assert_eq!(written(&p).observed_generation, Some(2));
        assert!(
            conditions::get(&written(&p).conditions, types::PAUSED)
                .is_none_or(|c| c.status == "False")
        );
        // A Provider without a Secret: the Provider alone.
        let p = plan(
            &capi_managed(),
            &facts(vec![provider("vc-c", true, false, None)], None),
        );
        assert_eq!(
            labelled(&p),
            vec![("Provider".into(), "vc-c".into(), false)]
        );

        // Not Cluster API's: nothing to carry along.
        let p = plan(&standalone, &facts(vec![a()], None));
        assert_eq!(labelled(&p), vec![]);
        assert_eq!(p.next, Next::SyncPeriod);

        // Once written, the same facts plan the same status again.
        let first = plan(&standalone, &facts(vec![a()], None));
        let mut again = facts(vec![a()], None);
        again.known = Some(written(&first).clone());
        let second = plan(&standalone, &again);
        let StatusChange::Merge { known, next } = &second.status else {
            panic!("{second:?}");
        };
        assert_eq!(known.as_ref(), Some(next));
    }
}
