//! The Kubernetes client: kubeconfig discovery plus client-side rate limiting (an
//! adaptive token bucket with kube's retry policy around it, [`KubeApiLayer`]).

use crate::Error;
use std::path::PathBuf;

use http::HeaderValue;
use kube::client::ClientBuilder;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use prometheus_client::registry::Registry;

use crate::rate_limit::KubeApiLayer;
use crate::request_metrics::RequestMetricsLayer;

/// `--kube-api-qps`: the ceiling of the adaptive client rate, which halves on each round
/// of 429s from the apiserver (docs/adr/0016-kube-api-rate-limits.md).
pub const DEFAULT_KUBE_API_QPS: f64 = 500.0;

/// `--kube-api-burst`: the token bucket's size at the ceiling rate.
pub const DEFAULT_KUBE_API_BURST: u32 = 1000;

/// The `User-Agent` of the operator's requests: `banlieue/<version>`.
pub const USER_AGENT: &str = concat!("banlieue/", env!("CARGO_PKG_VERSION"));

/// How to reach the apiserver. The default infers the kubeconfig (in-cluster,
/// `$KUBECONFIG`, `~/.kube/config`) and uses `banlieue run`'s QPS and burst.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// `--kubeconfig`; `None` infers it as kube does (in-cluster service account,
    /// else `$KUBECONFIG`, else `~/.kube/config`).
    pub kubeconfig: Option<PathBuf>,
    /// `--kube-api-qps`: the ceiling of the adaptive rate.
    pub qps: f64,
    /// `--kube-api-burst`: the bucket's size at that ceiling.
    pub burst: u32,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            kubeconfig: None,
            qps: DEFAULT_KUBE_API_QPS,
            burst: DEFAULT_KUBE_API_BURST,
        }
    }
}

/// Builds the client, its request counts registered in `registry`. Logs the apiserver
/// URL, never the credentials.
pub async fn build(config: &ClientConfig, registry: &mut Registry) -> crate::Result<Client> {
    let mut kube_config = match &config.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .map_err(|e| Error::client(format!("reading kubeconfig {}", path.display()), e))?;
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|e| Error::client(format!("loading kubeconfig {}", path.display()), e))?
        }
        None => Config::infer().await.map_err(|e| {
            Error::client(
                "finding a kubeconfig (in-cluster, $KUBECONFIG or ~/.kube/config)",
                e,
            )
        })?,
    };
    // Writes that name no field manager (the finalizer patches of kube's `finalizer`
    // helper) are recorded under the User-Agent's product name; without one, as
    // `unknown` in managedFields and in audit logs.
    kube_config.headers.push((
        http::header::USER_AGENT,
        HeaderValue::from_static(USER_AGENT),
    ));
    // kube's retry (429/503/504, Retry-After) sits below any layer added here, where the
    // limiter would see neither the retries nor the 429s; KubeApiLayer puts the same
    // policy above the limiter instead.
    kube_config.default_retry = false;
    tracing::info!(apiserver = %kube_config.cluster_url, qps = config.qps, burst = config.burst, adaptive = true, "kubernetes client");
    let host = kube_config
        .cluster_url
        .authority()
        .map(|a| a.to_string())
        .unwrap_or_default();
    // Innermost: every request sent counts, each retry included.
    let client = ClientBuilder::try_from(kube_config)
        .map_err(|e| Error::client("building the kubernetes client", e))?
        .with_layer(&RequestMetricsLayer::new(registry, host))
        .with_layer(&KubeApiLayer::new(config.qps, config.burst))
        .build();
    Ok(client)
}
