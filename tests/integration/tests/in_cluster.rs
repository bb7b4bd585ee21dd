//! banlieue as users install it, on a real node: the image `make image` built, imported
//! into the rig's containerd, the committed install (`deploy/crds`, `deploy/operator`)
//! applied, the Pod Ready through its probes with the shipped security context, and a
//! VirtualMachine Ready through the operator in that Pod. Its log has no `forbidden`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use banlieue_integration_tests::in_cluster::{create_namespace, is_pod_ready, verbs_used, wait};
use banlieue_integration_tests::node_rig::{NodeRig, banlieue_image};
use banlieue_integration_tests::{apply, load_manifests};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, LogParams};
use serde_json::json;

const NAMESPACE: &str = "banlieue-system";
const DEPLOYMENT: &str = "banlieue-controller-manager";

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_runs_in_a_pod_from_its_image_and_makes_a_vm_ready() {
    let Some(archive) = banlieue_image() else {
        return;
    };
    let Some(rig) = NodeRig::start().await else {
        return;
    };
    eprintln!(
        "in-cluster: node Ready {:?} after start",
        rig.timings.node_ready
    );
    let imported = Instant::now();
    rig.import_image(&archive).expect("importing the image");
    eprintln!("in-cluster: image imported in {:?}", imported.elapsed());
    let client = rig.client().await;

    // What a GitOps user applies: the CRDs, then the operator's install.
    for dir in ["deploy/crds", "deploy/operator"] {
        for (file, object) in load_manifests(&repo_root().join(dir)) {
            apply(&client, NAMESPACE, &object)
                .await
                .unwrap_or_else(|e| {
                    panic!("applying {} from {}: {e}", object["kind"], file.display())
                });
        }
    }
    let applied = Instant::now();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let pod = wait(
        "the operator's Pod Ready",
        Duration::from_secs(180),
        async || {
            let list = pods
                .list(&ListParams::default().labels("control-plane=banlieue-controller-manager"))
                .await
                .ok()?;
            list.items.into_iter().find(is_pod_ready)
        },
    )
    .await;
    let ready_after = applied.elapsed();
    let available = deployments.get(DEPLOYMENT).await.unwrap();
    assert!(
        available
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c
                .iter()
                .any(|c| c.type_ == "Available" && c.status == "True")),
        "the Deployment is not Available: {:?}",
        available.status
    );
    // The shipped security context is what runs.
    let spec = pod.spec.as_ref().unwrap();
    let pod_context = spec.security_context.as_ref().unwrap();
    assert_eq!(pod_context.run_as_non_root, Some(true));
    assert_eq!(
        pod_context
            .seccomp_profile
            .as_ref()
            .map(|p| p.type_.as_str()),
        Some("RuntimeDefault")
    );
    let context = spec.containers[0].security_context.as_ref().unwrap();
    assert_eq!(context.run_as_user, Some(65532));
    assert_eq!(context.read_only_root_filesystem, Some(true));
    assert_eq!(context.allow_privilege_escalation, Some(false));
    assert_eq!(
        context.capabilities.as_ref().and_then(|c| c.drop.clone()),
        Some(vec!["ALL".to_owned()])
    );
    eprintln!("in-cluster: operator Pod Ready {ready_after:?} after apply");

    // A VirtualMachine on the simulated backend, through the operator in the Pod.
    let ns = "in-cluster";
    create_namespace(&client, ns).await;
    for object in [
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "sim"},
               "spec": {"class": "sim", "connection": {"endpoint": "sim://in-cluster"}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": "small"},
               "spec": {"cpus": 1, "memoryMiB": 256, "disk": {"sizeGiB": 1}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": "debian"},
               "spec": {"os": {"family": "linux", "distribution": "debian", "version": "12"}, "sources": {"sim": {"name": "debian-12"}}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": "web-1"},
               "spec": {"classRef": {"name": "small"}, "imageRef": {"name": "debian"}, "placement": {"providerRef": {"name": "sim"}}}}),
    ] {
        apply(&client, ns, &object).await.unwrap();
    }
    let created = Instant::now();
    let vms: Api<banlieue_sdk::api::VirtualMachine> = Api::namespaced(client.clone(), ns);
    wait(
        "VirtualMachine web-1 Ready",
        Duration::from_secs(120),
        async || {
            let vm = vms.get("web-1").await.ok()?;
            let ready = vm.status.as_ref().and_then(|s| {
                banlieue_sdk::conditions::get(&s.conditions, banlieue_sdk::conditions::types::READY)
            })?;
            (ready.status == "True").then_some(())
        },
    )
    .await;
    eprintln!(
        "in-cluster: VirtualMachine Ready {:?} after create",
        created.elapsed()
    );

    let name = pod.metadata.name.clone().unwrap();
    let log = pods
        .logs(
            &name,
            &LogParams {
                container: Some("manager".into()),
                ..LogParams::default()
            },
        )
        .await
        .expect("the operator's log through the apiserver and the kubelet");
    assert!(
        log.contains("starting the controllers"),
        "the log is not the operator's:\n{log}"
    );
    assert!(
        !log.to_lowercase().contains("forbidden"),
        "the operator was refused something:\n{log}"
    );
    // What the operator's ServiceAccount did, from the apiserver's audit log: nothing
    // refused, and which of its ClusterRole's grants the run used.
    let me = "system:serviceaccount:banlieue-system:banlieue-controller";
    let mine: Vec<_> = rig
        .audit_events()
        .into_iter()
        .filter(|e| e["user"]["username"] == me)
        .collect();
    assert!(!mine.is_empty(), "no audit event of {me}");
    let refused: Vec<_> = mine
        .iter()
        .filter(|e| e["responseStatus"]["code"] == 403)
        .map(|e| format!("{} {}", e["verb"], e["requestURI"]))
        .collect();
    assert!(
        refused.is_empty(),
        "the apiserver refused the operator: {refused:#?}"
    );
    // Secrets only through the verbs the ClusterRole documents (bins/banlieue's rbac.rs;
    // tests/secrets_rbac.rs checks the lists are metadata-only).
    let secret_verbs: Vec<String> = mine
        .iter()
        .filter(|e| e["objectRef"]["resource"] == "secrets")
        .map(|e| e["verb"].as_str().unwrap_or("").to_owned())
        .collect();
    let outside: Vec<&String> = secret_verbs
        .iter()
        .filter(|v| !["create", "delete", "get", "list", "patch", "watch"].contains(&v.as_str()))
        .collect();
    assert!(
        outside.is_empty(),
        "Secret requests outside the documented verbs: {outside:?}"
    );
    let used = verbs_used(&mine, me);
    eprintln!(
        "in-cluster: {} requests by {me}, none refused; verbs used:\n  {}",
        mine.len(),
        used.into_iter().collect::<Vec<_>>().join("\n  ")
    );
    let leftovers = rig.stop();
    assert!(
        leftovers.is_empty(),
        "the rig left things behind: {leftovers:?}"
    );
}
