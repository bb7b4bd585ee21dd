//! Reading Cluster API objects at reconcile time: whether CAPI is installed, a Cluster
//! (for the InfraCluster controller, which reconciles rarely), and the Providers an
//! InfraCluster spans.
//!
//! These are live reads. The infrastructure machine controllers, which reconcile once
//! per machine and more, read Machines and Clusters from `capi_cache` instead.

use std::collections::BTreeSet;

use kube::api::{Api, ApiResource, DynamicObject};
use kube::{Client, discovery};

use super::context::Context;
use crate::capi::failure_domains::PROVIDER_ATTRIBUTE;
use crate::capi::objects::Cluster;
use crate::capi::{GROUP, VERSION};

/// True when the API server serves `cluster.x-k8s.io/v1beta2` Machines and Clusters.
pub(crate) async fn installed(client: &Client) -> bool {
    match discovery::group(client, GROUP).await {
        Ok(group) => {
            group
                .versioned_resources(VERSION)
                .iter()
                .filter(|(r, _)| r.kind == "Machine" || r.kind == "Cluster")
                .count()
                == 2
        }
        Err(_) => false,
    }
}

/// The CAPI Cluster `name` in `namespace`, if it exists.
pub(crate) async fn cluster(
    ctx: &Context,
    namespace: &str,
    name: &str,
) -> Result<Option<Cluster>, kube::Error> {
    Api::<Cluster>::namespaced(ctx.client.clone(), namespace)
        .get_opt(name)
        .await
}

/// What a Cluster's InfraCluster spans.
#[derive(Debug, Default)]
pub(crate) struct ClusterDomains {
    /// Its `spec.providerRefs` and the Providers of the failure domains it published.
    pub providers: Vec<String>,
    /// The failure domains it published, and whether each may host control planes.
    pub failure_domains: Vec<(String, bool)>,
}

/// Reads the Cluster's InfraCluster.
pub(crate) async fn cluster_domains(
    ctx: &Context,
    namespace: &str,
    cluster: &Cluster,
) -> Result<ClusterDomains, kube::Error> {
    let Some(reference) = &cluster.spec.infrastructure_ref else {
        return Ok(ClusterDomains::default());
    };
    if reference.api_group != crate::api::INFRA_GROUP || reference.name.is_empty() {
        return Ok(ClusterDomains::default());
    }
    let resource = ApiResource {
        group: crate::api::INFRA_GROUP.into(),
        version: crate::api::VERSION.into(),
        api_version: format!("{}/{}", crate::api::INFRA_GROUP, crate::api::VERSION),
        kind: reference.kind.clone(),
        plural: format!("{}s", reference.kind.to_lowercase()),
    };
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), namespace, &resource);
    let Some(infra) = api.get_opt(&reference.name).await? else {
        return Ok(ClusterDomains::default());
    };
    let mut providers = BTreeSet::new();
    let mut failure_domains = vec![];
    for r in infra.data["spec"]["providerRefs"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if let Some(name) = r["name"].as_str() {
            providers.insert(name.to_owned());
        }
    }
    for fd in infra.data["status"]["failureDomains"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if let Some(name) = fd["attributes"][PROVIDER_ATTRIBUTE].as_str() {
            providers.insert(name.to_owned());
        }
        if let Some(name) = fd["name"].as_str() {
            failure_domains.push((
                name.to_owned(),
                fd["controlPlane"].as_bool().unwrap_or(true),
            ));
        }
    }
    Ok(ClusterDomains {
        providers: providers.into_iter().collect(),
        failure_domains,
    })
}
