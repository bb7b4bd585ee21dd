//! The diagnostics server of a real `banlieue run` against a real apiserver: HTTPS,
//! the caller's ServiceAccount token reviewed by the apiserver (TokenReview, then a
//! SubjectAccessReview for `get /metrics`), and the metric names controller-runtime
//! users' dashboards read.

mod common;

use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

use common::{LEADER_FLAGS, start_with_diagnostics, wait_for_leaders};

async fn token(sa: &Api<ServiceAccount>, name: &str) -> String {
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: Vec::new(),
            expiration_seconds: Some(600),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    sa.create_token_request(name, &PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .unwrap()
        .token
}

/// The status and body of `GET url`, with `token` as bearer when given.
async fn scrape(client: &reqwest::Client, url: &str, token: Option<&str>) -> (u16, String) {
    let mut request = client.get(url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_answer_only_to_callers_the_apiserver_allows() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let ns = banlieue_testenv::namespace("diag").await;
    let sas: Api<ServiceAccount> = ns.api();
    for name in ["scraper", "stranger"] {
        let sa: ServiceAccount =
            serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        sas.create(&PostParams::default(), &sa).await.unwrap();
    }
    // What `banlieue bootstrap` installs as banlieue-metrics-reader, bound to one of them.
    let reader = format!("{}-metrics-reader", ns.name);
    let roles: Api<ClusterRole> = Api::all(ns.client.clone());
    let bindings: Api<ClusterRoleBinding> = Api::all(ns.client.clone());
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": reader},
        "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]}))
    .unwrap();
    roles.create(&PostParams::default(), &role).await.unwrap();
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": reader},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": reader},
        "subjects": [{"kind": "ServiceAccount", "name": "scraper", "namespace": ns.name}]}))
    .unwrap();
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    // Something to reconcile, so that the reconcile metrics have samples.
    banlieue_integration_tests::apply(
        &ns.client,
        &ns.name,
        &json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "sim"},
        "spec": {"class": "sim", "connection": {"endpoint": format!("sim://{}", ns.name)}}}),
    )
    .await
    .unwrap();
    let allowed = token(&sas, "scraper").await;
    let denied = token(&sas, "stranger").await;

    let logs = tempfile::tempdir().unwrap();
    let (replica, port) =
        start_with_diagnostics(&ns.name, &logs.path().join("operator.log"), LEADER_FLAGS);
    wait_for_leaders(&[&replica], &[true]).await;
    // The certificate is self-signed, made at start: scrapers skip verification and
    // prove who they are with the token, as Cluster API's ServiceMonitors do.
    let https = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let url = format!("https://127.0.0.1:{port}/metrics");
    let started = Instant::now();
    let body = loop {
        let (status, body) = scrape(&https, &url, Some(&allowed)).await;
        // The SubjectAccessReview sees the new binding once RBAC's cache has it.
        if status == 200 {
            break body;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the allowed ServiceAccount still gets {status}: {body}\noperator log:\n{}",
            std::fs::read_to_string(logs.path().join("operator.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let (status, text) = scrape(&https, &url, Some(&denied)).await;
    assert_eq!(status, 403, "a ServiceAccount without the role: {text}");
    let (status, text) = scrape(&https, &url, None).await;
    assert_eq!(status, 401, "no token: {text}");
    let (status, text) = scrape(&https, &url, Some("not-a-token")).await;
    assert_eq!(status, 401, "a token the apiserver does not know: {text}");
    // Not served in the clear.
    let plain = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let clear = plain
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .send()
        .await;
    assert!(
        clear.map(|r| r.status().as_u16() != 200).unwrap_or(true),
        "plain HTTP must not serve /metrics"
    );

    let wanted = [
        "controller_runtime_reconcile_total{",
        "controller_runtime_reconcile_errors_total{",
        "controller_runtime_reconcile_time_seconds_bucket{",
        "controller_runtime_active_workers{",
        "rest_client_requests_total{code=\"200\",method=\"GET\"",
        "rest_client_requests_total{code=\"201\",method=\"POST\"",
        "banlieue_backend_request_duration_seconds",
        "leader_election_master_status{name=\"banlieue-leader-election\"} 1",
    ];
    // Families show once they have a sample: the Provider's first reconciles give them.
    let mut body = body;
    let started = Instant::now();
    while let Some(missing) = wanted.iter().find(|name| !body.contains(**name)) {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{missing} is not in /metrics:\n{body}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        body = scrape(&https, &url, Some(&allowed)).await.1;
    }
    drop(replica);
    bindings
        .delete(&reader, &DeleteParams::default())
        .await
        .unwrap();
    roles
        .delete(&reader, &DeleteParams::default())
        .await
        .unwrap();
}
