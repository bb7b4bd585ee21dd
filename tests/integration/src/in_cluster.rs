//! What the tests on the real node (`node_rig`) check over and over: waiting for a
//! condition, a Pod being Ready, the operator's logs free of `forbidden`, and which
//! verbs an account used according to the apiserver's audit log.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, LogParams};
use serde_json::Value;

/// Polls `check` every half second until it gives a value; panics after `timeout`.
pub async fn wait<T>(
    what: &str,
    timeout: Duration,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> T {
    let started = Instant::now();
    loop {
        if let Some(done) = check().await {
            return done;
        }
        assert!(
            started.elapsed() < timeout,
            "{what}: not within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Creates (server-side applies) the namespace `name`.
pub async fn create_namespace(client: &kube::Client, name: &str) {
    crate::apply(
        client,
        name,
        &serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
    )
    .await
    .unwrap_or_else(|e| panic!("creating namespace {name}: {e}"));
}

/// Whether the Pod's `Ready` condition is true.
pub fn is_pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Reads the log of `container` in every Pod of `pods` and panics if one says
/// `forbidden` (any case): the apiserver refused the operator something.
pub async fn assert_logs_not_forbidden(pods: &Api<Pod>, container: &str) {
    for pod in pods.list(&ListParams::default()).await.unwrap() {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let log = pods
            .logs(
                &name,
                &LogParams {
                    container: Some(container.into()),
                    ..LogParams::default()
                },
            )
            .await
            .unwrap_or_else(|e| panic!("the log of {name}: {e}"));
        assert!(
            !log.to_lowercase().contains("forbidden"),
            "{name} was refused something:\n{log}"
        );
    }
}

/// `<verb> <group>/<resource>[/<subresource>]` of every audit event of `user`.
pub fn verbs_used(events: &[Value], user: &str) -> BTreeSet<String> {
    events
        .iter()
        .filter(|e| e["user"]["username"] == user)
        .map(|e| {
            let object = &e["objectRef"];
            let resource = match object["subresource"].as_str() {
                Some(sub) => format!("{}/{sub}", object["resource"].as_str().unwrap_or("")),
                None => object["resource"].as_str().unwrap_or("").to_owned(),
            };
            format!(
                "{} {}/{resource}",
                e["verb"].as_str().unwrap_or(""),
                object["apiGroup"].as_str().unwrap_or("")
            )
        })
        .collect()
}
