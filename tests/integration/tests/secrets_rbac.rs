//! What the operator does to Secrets, from the apiserver's own audit log, with exactly
//! the shipped RBAC (issue 37, finding 4).
//!
//! A control plane of its own with an audit policy (Secrets at `RequestResponse`, so a
//! list's answer shows whether it carried contents; everything else at `Metadata`);
//! the committed `deploy/operator` ClusterRole and binding; the controllers in-process,
//! cluster-wide as the shipped Deployment runs them, as the controller's
//! ServiceAccount (by impersonation: the apiserver authorizes every request as that
//! account). Through a VM lifecycle with bootstrap data and a credentials rotation:
//! - no request of the operator is refused (403);
//! - every Secret request is one of the verbs the ClusterRole documents;
//! - no list of Secrets returns contents (each answer is a `PartialObjectMetadataList`);
//! - every GET of a Secret names one that a Provider or VM names (or the VM's copy);
//! - a rotated credentials Secret is read again (the metadata watch noticed it) long
//!   before the sync period.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use banlieue_backend_sim::SimFactory;
use banlieue_integration_tests::{apply, load_manifests};
use banlieue_sdk::api::VirtualMachine;
use banlieue_sdk::api::common::ProviderClass;
use banlieue_sdk::backend::BackendRegistry;
use banlieue_sdk::conditions;
use banlieue_sdk::controllers::{self, Metrics, Readiness, Settings};
use banlieue_testenv::{ControlPlane, ControlPlaneConfig};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};

const ME: &str = "system:serviceaccount:banlieue-system:banlieue-controller";
const WAIT: Duration = Duration::from_secs(60);
/// The verbs the ClusterRole grants on Secrets, and the only ones the operator may use.
const SECRET_VERBS: [&str; 6] = ["create", "delete", "get", "list", "patch", "watch"];

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

const POLICY: &str = r#"apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: RequestResponse
  resources:
  - group: ""
    resources: ["secrets"]
- level: Metadata
"#;

fn events(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The operator's requests: made as the ServiceAccount, through impersonation.
fn mine(events: &[Value]) -> Vec<&Value> {
    events
        .iter()
        .filter(|e| e["impersonatedUser"]["username"] == ME || e["user"]["username"] == ME)
        .collect()
}

fn is_secret(e: &Value) -> bool {
    e["objectRef"]["resource"] == "secrets"
        && e["objectRef"]["apiGroup"]
            .as_str()
            .is_none_or(str::is_empty)
}

async fn wait_until<T>(what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    let started = Instant::now();
    loop {
        if let Some(t) = check().await {
            return t;
        }
        assert!(started.elapsed() < WAIT, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_uses_only_the_secret_verbs_it_documents_and_never_lists_contents() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("audit-policy.yaml");
    std::fs::write(&policy, POLICY).unwrap();
    let log = dir.path().join("audit.log");
    let cp = match ControlPlane::start(
        ControlPlaneConfig::from_env()
            .banlieue_api()
            .apiserver_arg(format!("--audit-policy-file={}", policy.display()))
            .apiserver_arg(format!("--audit-log-path={}", log.display()))
            .apiserver_arg("--audit-log-format=json"),
    ) {
        Ok(cp) => cp,
        Err(e) => {
            assert!(
                !banlieue_testenv::rigs_required(),
                "required under CI and make: {e}"
            );
            eprintln!("SKIPPED: no control plane: {e}");
            return;
        }
    };
    let admin = cp.client().await;

    // The shipped install's RBAC, as committed.
    for (file, object) in load_manifests(&repo_root().join("deploy/operator")) {
        if object["kind"] == "Deployment" {
            continue; // no kubelet here: the controllers run in this process
        }
        apply(&admin, "banlieue-system", &object)
            .await
            .unwrap_or_else(|e| panic!("applying {} from {}: {e}", object["kind"], file.display()));
    }
    let mut config = cp.kube_config();
    config.auth_info.impersonate = Some(ME.to_owned());
    config.auth_info.impersonate_groups = Some(vec![
        "system:serviceaccounts".to_owned(),
        "system:serviceaccounts:banlieue-system".to_owned(),
        "system:authenticated".to_owned(),
    ]);
    let operator = kube::Client::try_from(config).expect("an impersonating client");

    // What a user makes: credentials, a Provider naming them, a class, an image,
    // bootstrap data and a VM naming it.
    let ns = "apps";
    apply(
        &admin,
        "",
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
    )
    .await
    .unwrap();
    for object in [
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "sim-credentials"},
               "stringData": {"username": "ops", "password": "first-password"}}),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "unrelated"},
               "stringData": {"tls.key": "not the operator's business"}}),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "user-data"},
               "stringData": {"value": "#cloud-config\n"}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "sim"},
               "spec": {"class": "sim",
                        "connection": {"endpoint": "sim://rbac", "credentialsRef": {"name": "sim-credentials"}},
                        "capabilities": {
                            "storageClasses": [{"name": "fast", "target": {"pool": "default"}}],
                            "networkClasses": [{"name": "lan", "target": {"network": "default"}}]}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": "rbac-small"},
               "spec": {"cpus": 1, "memoryMiB": 512, "disk": {"sizeGiB": 5, "storageClass": "fast"}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": "rbac-debian"},
               "spec": {"os": {"family": "linux", "distribution": "debian", "version": "13"}, "sources": {"sim": {"name": "debian"}}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": "v"},
               "spec": {"classRef": {"name": "rbac-small"}, "imageRef": {"name": "rbac-debian"},
                        "networks": [{"name": "eth0", "networkClass": "lan"}],
                        "placement": {"providerRef": {"name": "sim"}},
                        "bootstrap": {"format": "cloud-config", "userData": {"name": "user-data"}}}}),
    ] {
        apply(&admin, ns, &object).await.expect("fixture");
    }

    // The controllers, cluster-wide as the shipped Deployment runs them, with a sync
    // period long enough that only the Secret watch can explain a prompt re-read.
    let mut registry = BackendRegistry::default();
    registry.register(ProviderClass::Sim, Arc::new(SimFactory::new()));
    let settings = Settings {
        sync_period: Duration::from_secs(600),
        ..Settings::default()
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(controllers::run(
        operator,
        registry,
        settings,
        Arc::new(Metrics::unregistered()),
        Readiness::default(),
        async move {
            let _ = stopped.await;
        },
    ));

    let vms: Api<VirtualMachine> = Api::namespaced(admin.clone(), ns);
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), ns);
    wait_until("the VM Ready", async || {
        let vm = vms.get("v").await.ok()?;
        let status = vm.status?;
        conditions::is_true(&status.conditions, conditions::types::READY).then_some(())
    })
    .await;
    assert!(
        secrets.get_opt("v-bootstrap").await.unwrap().is_some(),
        "the bootstrap copy was made"
    );

    // Rotate the credentials: the operator must read them again, prompted by the
    // metadata watch (the sync period is 10 minutes).
    let gets_of_credentials = |events: &[Value]| {
        mine(events)
            .into_iter()
            .filter(|e| {
                is_secret(e) && e["verb"] == "get" && e["objectRef"]["name"] == "sim-credentials"
            })
            .count()
    };
    let before = gets_of_credentials(&events(&log));
    assert!(before > 0, "the Provider read its credentials");
    let rotated = Instant::now();
    secrets
        .patch(
            "sim-credentials",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"password": "second-password"}})),
        )
        .await
        .unwrap();
    wait_until("the operator to read the rotated credentials", async || {
        (gets_of_credentials(&events(&log)) > before).then_some(())
    })
    .await;
    eprintln!(
        "secrets-rbac: rotated credentials read again after {:?}",
        rotated.elapsed()
    );

    vms.delete("v", &DeleteParams::default()).await.unwrap();
    wait_until("the VM gone", async || {
        vms.get_opt("v").await.unwrap().is_none().then_some(())
    })
    .await;
    wait_until("the copy deleted", async || {
        secrets
            .get_opt("v-bootstrap")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(10), running).await;
    // The audit backend writes in batches: let the last ones land.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let all = events(&log);
    let mine = mine(&all);
    assert!(!mine.is_empty(), "no audit event of {ME}");
    let mut by_verb: BTreeMap<String, usize> = BTreeMap::new();
    let mut secret_by_verb: BTreeMap<String, usize> = BTreeMap::new();
    let mut refused = Vec::new();
    let mut outside = Vec::new();
    let mut contents_listed = Vec::new();
    let mut read: BTreeSet<String> = BTreeSet::new();
    for e in &mine {
        let verb = e["verb"].as_str().unwrap_or("").to_owned();
        *by_verb.entry(verb.clone()).or_default() += 1;
        if e["responseStatus"]["code"] == 403 {
            refused.push(format!("{verb} {}", e["requestURI"]));
        }
        if !is_secret(e) {
            continue;
        }
        *secret_by_verb.entry(verb.clone()).or_default() += 1;
        if !SECRET_VERBS.contains(&verb.as_str()) {
            outside.push(format!("{verb} {}", e["requestURI"]));
        }
        let ok = e["responseStatus"]["code"]
            .as_i64()
            .is_some_and(|c| c < 300);
        if verb == "list" && ok && e["responseObject"]["kind"] != "PartialObjectMetadataList" {
            contents_listed.push(format!(
                "{} answered {}",
                e["requestURI"], e["responseObject"]["kind"]
            ));
        }
        if verb == "get" {
            read.insert(format!(
                "{}/{}",
                e["objectRef"]["namespace"].as_str().unwrap_or(""),
                e["objectRef"]["name"].as_str().unwrap_or("")
            ));
        }
    }
    eprintln!(
        "secrets-rbac: {} requests by {ME}, {} refused (403); by verb {by_verb:?}; on Secrets {secret_by_verb:?}; Secrets read: {read:?}",
        mine.len(),
        refused.len()
    );
    assert!(
        refused.is_empty(),
        "the apiserver refused the operator: {refused:#?}"
    );
    assert!(
        outside.is_empty(),
        "Secret requests outside {SECRET_VERBS:?}: {outside:#?}"
    );
    assert!(
        contents_listed.is_empty(),
        "the operator listed Secrets' contents: {contents_listed:#?}"
    );
    assert!(
        secret_by_verb.contains_key("list") && secret_by_verb.contains_key("watch"),
        "the metadata watch ran: {secret_by_verb:?}"
    );
    let named: BTreeSet<String> = ["sim-credentials", "user-data", "v-bootstrap"]
        .iter()
        .map(|n| format!("{ns}/{n}"))
        .collect();
    assert!(
        read.is_subset(&named),
        "the operator read Secrets nothing names: {:?}",
        read.difference(&named).collect::<Vec<_>>()
    );
}
