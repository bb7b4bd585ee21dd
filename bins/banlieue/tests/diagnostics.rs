//! The diagnostics server of a real `banlieue run` against a real apiserver: HTTPS,
//! the caller's ServiceAccount token reviewed by the apiserver (TokenReview, then a
//! SubjectAccessReview for `get /metrics`), and the metric names controller-runtime
//! users' dashboards read; CPU profiles at `/debug/pprof/profile` behind the same
//! checks, in the gzipped protobuf `go tool pprof` reads.

mod common;

use std::io::Read as _;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, DeleteParams, PostParams};
use pprof::protos::Message as _;
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

/// A ClusterRole allowing `get` on `urls`, bound to the ServiceAccount `subject` of the
/// namespace; its name is `name`.
async fn grant(client: &kube::Client, namespace: &str, name: &str, urls: &[&str], subject: &str) {
    let roles: Api<ClusterRole> = Api::all(client.clone());
    let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": name},
        "rules": [{"nonResourceURLs": urls, "verbs": ["get"]}]}))
    .unwrap();
    roles.create(&PostParams::default(), &role).await.unwrap();
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": subject, "namespace": namespace}]}))
    .unwrap();
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
}

async fn revoke(client: &kube::Client, name: &str) {
    let roles: Api<ClusterRole> = Api::all(client.clone());
    let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    bindings
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
    roles.delete(name, &DeleteParams::default()).await.unwrap();
}

/// The status, content type and body of `GET url` with `token` as bearer when given.
async fn fetch(client: &reqwest::Client, url: &str, token: Option<&str>) -> (u16, String, Vec<u8>) {
    let mut request = client.get(url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    (
        status,
        content_type,
        response.bytes().await.unwrap().to_vec(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_profiles_answer_only_to_callers_the_apiserver_allows() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let ns = banlieue_testenv::namespace("pprof").await;
    let sas: Api<ServiceAccount> = ns.api();
    for name in ["profiler", "scraper", "stranger"] {
        let sa: ServiceAccount =
            serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        sas.create(&PostParams::default(), &sa).await.unwrap();
    }
    // Profiles are for whom RBAC allows `get` on the path: a role for /debug/pprof/*
    // (here); what banlieue-metrics-reader allows (/metrics) is not enough.
    let profiler_role = format!("{}-profiler", ns.name);
    let reader_role = format!("{}-metrics-reader", ns.name);
    grant(
        &ns.client,
        &ns.name,
        &profiler_role,
        &["/debug/pprof/*"],
        "profiler",
    )
    .await;
    grant(&ns.client, &ns.name, &reader_role, &["/metrics"], "scraper").await;
    let allowed = token(&sas, "profiler").await;
    let scraper = token(&sas, "scraper").await;
    let denied = token(&sas, "stranger").await;

    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("operator.log");
    let (replica, port) = start_with_diagnostics(&ns.name, &log, LEADER_FLAGS);
    wait_for_leaders(&[&replica], &[true]).await;
    let https = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let url = format!("https://127.0.0.1:{port}/debug/pprof/profile");
    let one_second = format!("{url}?seconds=1");
    let started = Instant::now();
    let (content_type, body) = loop {
        let (status, content_type, body) = fetch(&https, &one_second, Some(&allowed)).await;
        // The SubjectAccessReview sees the new binding once RBAC's cache has it.
        if status == 200 {
            break (content_type, body);
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the allowed ServiceAccount still gets {status}: {}\noperator log:\n{}",
            String::from_utf8_lossy(&body),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert_eq!(content_type, "application/octet-stream");
    // Gzipped, as Go serves it: `go tool pprof` reads either, but tools that expect Go's
    // output (Parca, Pyroscope's scrapers) gunzip.
    assert_eq!(&body[..2], &[0x1f, 0x8b], "not gzip: {body:?}");
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(&body[..])
        .read_to_end(&mut raw)
        .unwrap();
    let profile = pprof::protos::Profile::decode(&raw[..]).expect("a perftools Profile");
    let string = |i: i64| profile.string_table[i as usize].as_str();
    let types: Vec<_> = profile
        .sample_type
        .iter()
        .map(|t| (string(t.ty), string(t.unit)))
        .collect();
    assert_eq!(
        types,
        [("samples", "count"), ("cpu", "nanoseconds")],
        "{profile:?}"
    );
    assert_eq!(profile.period, 10_000_000, "100 Hz");
    assert!(
        (900_000_000..5_000_000_000).contains(&profile.duration_nanos),
        "one second: {}",
        profile.duration_nanos
    );

    let (status, _, text) = fetch(&https, &one_second, Some(&denied)).await;
    assert_eq!(status, 403, "{}", String::from_utf8_lossy(&text));
    let (status, _, text) = fetch(&https, &one_second, Some(&scraper)).await;
    assert_eq!(
        status,
        403,
        "the metrics reader may not profile: {}",
        String::from_utf8_lossy(&text)
    );
    let (status, _, text) = fetch(&https, &one_second, None).await;
    assert_eq!(status, 401, "{}", String::from_utf8_lossy(&text));
    for bad in ["abc", "0", "61", "2.5"] {
        let (status, _, text) =
            fetch(&https, &format!("{url}?seconds={bad}"), Some(&allowed)).await;
        assert_eq!(
            status,
            400,
            "seconds={bad}: {}",
            String::from_utf8_lossy(&text)
        );
    }
    // Access is reviewed before the query is read: a stranger learns nothing from it.
    let (status, _, _) = fetch(&https, &format!("{url}?seconds=abc"), Some(&denied)).await;
    assert_eq!(status, 403);

    // One profile at a time: a second request while one is being taken is refused.
    let long = {
        let (https, url, allowed) = (https.clone(), format!("{url}?seconds=5"), allowed.clone());
        tokio::spawn(async move { fetch(&https, &url, Some(&allowed)).await })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (status, _, text) = fetch(&https, &one_second, Some(&allowed)).await;
    let text = String::from_utf8_lossy(&text);
    assert_eq!(status, 409, "{text}");
    assert!(text.contains("already being taken"), "{text}");
    let (status, _, _) = long.await.unwrap();
    assert_eq!(status, 200);
    // And once it is done, the next one is served.
    assert_eq!(fetch(&https, &one_second, Some(&allowed)).await.0, 200);

    drop(replica);
    revoke(&ns.client, &profiler_role).await;
    revoke(&ns.client, &reader_role).await;
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
