//! banlieue's `/metrics` on a real cluster, scraped from Pods as Prometheus does: over
//! HTTPS to the operator Pod's IP, with the scraping Pod's ServiceAccount token. The
//! apiserver decides (TokenReview, then SubjectAccessReview for `get /metrics`): the
//! account bound to the installed `banlieue-metrics-reader` role gets 200, another
//! account 403, a Pod without a token 401.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use banlieue_integration_tests::in_cluster::create_namespace;
use banlieue_integration_tests::node_rig::{NodeRig, banlieue_image, pause_dir};
use banlieue_integration_tests::{apply, load_manifests};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, LogParams};
use serde_json::{Value, json};

const NAMESPACE: &str = "banlieue-system";
const TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// A probe Pod: one GET of `url`, as `account`, with its token unless `token` is false.
fn probe(name: &str, account: &str, url: &str, token: bool) -> Value {
    let mut args = vec![url.to_owned()];
    if token {
        args.push(TOKEN.to_owned());
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
           "spec": {"serviceAccountName": account, "automountServiceAccountToken": token,
                    "restartPolicy": "Never",
                    "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{"name": "probe", "image": "docker.io/local/probe:1",
                                    "imagePullPolicy": "IfNotPresent", "args": args,
                                    "securityContext": {"runAsUser": 65532, "readOnlyRootFilesystem": true,
                                                        "allowPrivilegeEscalation": false,
                                                        "capabilities": {"drop": ["ALL"]}}}]}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_answer_200_403_401_to_pods_as_the_apiserver_decides() {
    let Some(archive) = banlieue_image() else {
        return;
    };
    let Some(rig) = NodeRig::start().await else {
        return;
    };
    let probe_image = pause_dir().expect("the rig's images").join("probe.tar");
    rig.import_image(&archive)
        .expect("importing banlieue's image");
    rig.import_image(&probe_image)
        .expect("importing the probe image");
    let client = rig.client().await;
    for dir in ["deploy/crds", "deploy/operator"] {
        for (file, object) in load_manifests(&repo_root().join(dir)) {
            apply(&client, NAMESPACE, &object)
                .await
                .unwrap_or_else(|e| {
                    panic!("applying {} from {}: {e}", object["kind"], file.display())
                });
        }
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let started = Instant::now();
    let operator = loop {
        let list = pods
            .list(&ListParams::default().labels("control-plane=banlieue-controller-manager"))
            .await
            .unwrap();
        if let Some(pod) = list.items.into_iter().find(ready) {
            break pod;
        }
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "the operator's Pod is not Ready:\n{}",
            rig.logs()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let ip = operator
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .unwrap();
    let url = format!("https://{ip}:8443/metrics");

    let ns = "scrapers";
    create_namespace(&client, ns).await;
    for account in ["scraper", "stranger"] {
        apply(
            &client,
            ns,
            &json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account}}),
        )
        .await
        .unwrap();
    }
    apply(&client, ns, &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "scraper-reads-banlieue-metrics"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "banlieue-metrics-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "scraper", "namespace": ns}]}))
        .await
        .unwrap();
    // RBAC's authorizer sees the binding through its informer: give it a moment.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let cases = [
        ("allowed", "scraper", true, "status=200"),
        ("denied", "stranger", true, "status=403"),
        ("anonymous", "stranger", false, "status=401"),
    ];
    for (name, account, token, _) in cases {
        apply(&client, ns, &probe(name, account, &url, token))
            .await
            .unwrap();
    }
    let probes: Api<Pod> = Api::namespaced(client.clone(), ns);
    for (name, _, _, want) in cases {
        let started = Instant::now();
        loop {
            let phase = probes
                .get(name)
                .await
                .ok()
                .and_then(|p| p.status.and_then(|s| s.phase));
            if matches!(phase.as_deref(), Some("Succeeded" | "Failed")) {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(90),
                "probe {name} did not finish (phase {phase:?})"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let log = probes.logs(name, &LogParams::default()).await.unwrap();
        assert_eq!(log.trim(), want, "probe {name}");
        eprintln!("in-cluster diagnostics: {name}: {}", log.trim());
    }
    let leftovers = rig.stop();
    assert!(
        leftovers.is_empty(),
        "the rig left things behind: {leftovers:?}"
    );
}
