//! The Cluster API rig itself: the real CAPI core manager starts against the test
//! control plane with its webhooks on our certificates, under a ServiceAccount identity
//! scoped by CAPI's own role plus banlieue's aggregate role.

use std::time::{Duration, Instant};

use banlieue_integration_tests::capi::{self, Capi};
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};

fn cluster_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Cluster"),
        "clusters",
    )
}

/// Polls `check` on the object until it returns `Some`, or fails with the manager's log.
async fn eventually<T>(
    capi: &Capi,
    api: &Api<DynamicObject>,
    name: &str,
    what: &str,
    check: impl Fn(&Value) -> Option<T>,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = Value::Null;
    loop {
        if let Ok(object) = api.get(name).await {
            last = serde_json::to_value(&object).expect("JSON");
            if let Some(found) = check(&last) {
                return found;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{what} did not happen within 60s; object: {last:#}\nCAPI manager log:\n{}",
            capi.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn condition<'a>(object: &'a Value, kind: &str) -> Option<&'a Value> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

#[tokio::test]
async fn manager_serves_webhooks_and_reports_a_missing_infrastructure_kind() {
    let Some(capi) = Capi::start() else { return };
    eprintln!(
        "CAPI {} manager (pid {}) ready in {:.1?}",
        capi.version(),
        capi.pid(),
        capi.started_in()
    );
    assert!(capi.version().starts_with("v1.14."), "{}", capi.version());
    let ns = banlieue_testenv::namespace("capi-rig").await;
    let clusters: Api<DynamicObject> =
        Api::namespaced_with(ns.client.clone(), &ns.name, &cluster_resource());

    // CAPI's validating webhook answers: a Cluster whose infrastructureRef has no apiGroup
    // is rejected by CAPI (not by the schema: apiGroup is optional in the CRD).
    let bad: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Cluster",
        "metadata": {"name": "bad"},
        "spec": {"topology": {"classRef": {"name": "nope"}, "version": "not-a-version"}},
    }))
    .unwrap();
    let rejected = clusters
        .create(&PostParams::default(), &bad)
        .await
        .expect_err("CAPI's webhook rejects an invalid topology version");
    assert!(
        rejected.to_string().contains("version"),
        "rejected for the version: {rejected}"
    );

    // A Cluster referencing an infrastructure kind nobody serves is accepted by the
    // webhooks (defaulted by them) and CAPI reports it cannot find the kind.
    let cluster: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Cluster",
        "metadata": {"name": "orphan"},
        "spec": {
            "infrastructureRef": {
                "apiGroup": "infrastructure.banlieue.io",
                "kind": "NoSuchCluster",
                "name": "orphan",
            },
        },
    }))
    .unwrap();
    clusters
        .create(&PostParams::default(), &cluster)
        .await
        .expect("CAPI's webhooks accept the Cluster");
    let reported = eventually(
        capi,
        &clusters,
        "orphan",
        "CAPI reporting the missing infrastructure kind",
        |object| {
            let c = condition(object, "InfrastructureReady")?;
            (c["status"] == "False" || c["status"] == "Unknown").then(|| c.clone())
        },
    )
    .await;
    eprintln!("InfrastructureReady: {reported}");
    // CAPI's own finalizer shows its reconciler (not just its webhook) handled it.
    let finalized = eventually(
        capi,
        &clusters,
        "orphan",
        "CAPI adding its finalizer",
        |object| {
            object["metadata"]["finalizers"]
                .as_array()
                .filter(|f| f.iter().any(|f| f == "cluster.cluster.x-k8s.io"))
                .map(|_| ())
        },
    )
    .await;
    let () = finalized;
    // The reason is in the manager's log: the CRD it computed for the kind is missing.
    let deadline = Instant::now() + Duration::from_secs(30);
    while capi
        .log_grep("nosuchclusters.infrastructure.banlieue.io")
        .is_empty()
    {
        assert!(
            Instant::now() < deadline,
            "CAPI never logged the missing CRD; log:\n{}",
            capi.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test]
async fn manager_identity_is_scoped_by_the_aggregate_role() {
    let Some(capi) = Capi::start() else { return };
    let client = banlieue_testenv::client().await;
    let group = "infrastructure.banlieue.io";
    for resource in [
        "vspheremachines",
        "vspheremachinetemplates",
        "vsphereclusters",
        "libvirtmachines",
        "proxmoxmachines",
        "cloudhypervisormachines",
    ] {
        for verb in ["get", "list", "watch", "create", "patch", "delete"] {
            assert!(
                capi.can(&client, verb, group, resource, Some("default"))
                    .await,
                "CAPI may {verb} {resource}"
            );
        }
    }
    for resource in ["virtualmachines", "providers", "vmclasses", "vmimages"] {
        assert!(
            !capi
                .can(&client, "get", "banlieue.io", resource, Some("default"))
                .await,
            "CAPI may not read banlieue.io {resource}"
        );
    }
    // CAPI's own rules are in place (the aggregation ran).
    assert!(
        capi.can(&client, "list", "cluster.x-k8s.io", "machines", None)
            .await
    );

    // The impersonated identity really is what the manager uses: it can list our infra
    // kinds and cannot list VirtualMachines.
    let as_capi = capi.client_as_manager().await;
    let vsphere = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(group, "v1alpha1", "VSphereMachine"),
        "vspheremachines",
    );
    Api::<DynamicObject>::all_with(as_capi.clone(), &vsphere)
        .list(&Default::default())
        .await
        .expect("CAPI lists VSphereMachines");
    let vms = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("banlieue.io", "v1alpha1", "VirtualMachine"),
        "virtualmachines",
    );
    let denied = Api::<DynamicObject>::all_with(as_capi.clone(), &vms)
        .list(&Default::default())
        .await
        .expect_err("CAPI cannot list VirtualMachines");
    assert!(denied.to_string().contains("forbidden"), "{denied}");
    assert!(
        capi.kubeconfig().exists() && capi::SERVICE_ACCOUNT.contains("capi-manager"),
        "the manager runs as {}",
        capi::SERVICE_ACCOUNT
    );

    // Without banlieue's aggregate role CAPI cannot read our kinds: its own role does
    // not cover them. Put the role back afterwards (from the committed file).
    let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(client.clone());
    roles
        .delete("banlieue-capi-infrastructure", &Default::default())
        .await
        .expect("deleting the aggregate role");
    let vsphere_machines = Api::<DynamicObject>::all_with(as_capi.clone(), &vsphere);
    let deadline = Instant::now() + Duration::from_secs(20);
    while vsphere_machines.list(&Default::default()).await.is_ok() {
        assert!(
            Instant::now() < deadline,
            "CAPI still reads VSphereMachines without banlieue's aggregate role"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/capi/clusterrole-aggregate.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let documents: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    for role in documents.iter().filter(|d| !d.is_null()) {
        banlieue_integration_tests::apply(&client, "default", role)
            .await
            .expect("re-applying the aggregate role");
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while let Err(e) = vsphere_machines.list(&Default::default()).await {
        assert!(
            Instant::now() < deadline,
            "CAPI cannot read VSphereMachines with the aggregate role back: {e}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
