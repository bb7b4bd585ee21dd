//! `banlieue bootstrap operator` against the test control plane: it installs every
//! object of `--dry-run`'s output, a second run changes nothing (no resourceVersion
//! moves), and `--namespace` moves the whole install.

use std::collections::BTreeMap;
use std::process::Command;

use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::GroupVersionKind;
use serde_json::Value;

fn banlieue(args: &[&str]) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_banlieue"))
        .args(args)
        .output()
        .expect("running banlieue");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "banlieue {args:?} failed: {stderr}\n{stdout}"
    );
    (stdout, stderr)
}

fn dry_run(extra: &[&str]) -> Vec<Value> {
    let mut args = vec!["bootstrap", "operator", "--dry-run"];
    args.extend_from_slice(extra);
    let (yaml, _) = banlieue(&args);
    let docs: Vec<Value> = serde_saphyr::from_multiple(&yaml).expect("YAML");
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

fn plural(kind: &str) -> &'static str {
    match kind {
        "Namespace" => "namespaces",
        "CustomResourceDefinition" => "customresourcedefinitions",
        "ValidatingAdmissionPolicy" => "validatingadmissionpolicies",
        "ValidatingAdmissionPolicyBinding" => "validatingadmissionpolicybindings",
        "ServiceAccount" => "serviceaccounts",
        "ClusterRole" => "clusterroles",
        "ClusterRoleBinding" => "clusterrolebindings",
        "Role" => "roles",
        "RoleBinding" => "rolebindings",
        "Deployment" => "deployments",
        other => panic!("unexpected kind {other}"),
    }
}

/// The live object for each component, keyed `kind/namespace/name`.
async fn live(client: &kube::Client, objects: &[Value]) -> BTreeMap<String, Value> {
    let mut found = BTreeMap::new();
    for object in objects {
        let kind = object["kind"].as_str().unwrap();
        let (group, version) = object["apiVersion"]
            .as_str()
            .unwrap()
            .rsplit_once('/')
            .unwrap_or(("", object["apiVersion"].as_str().unwrap()));
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(group, version, kind),
            plural(kind),
        );
        let name = object["metadata"]["name"].as_str().unwrap();
        let namespace = object["metadata"]["namespace"].as_str();
        let api: Api<DynamicObject> = match namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
            None => Api::all_with(client.clone(), &resource),
        };
        let got = api
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("{kind} {name} is not installed: {e}"));
        found.insert(
            format!("{kind}/{}/{name}", namespace.unwrap_or("")),
            serde_json::to_value(got).unwrap(),
        );
    }
    found
}

fn versions(objects: &BTreeMap<String, Value>) -> BTreeMap<String, String> {
    objects
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                v["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
            )
        })
        .collect()
}

/// banlieue's controllers running as the installed ServiceAccount (by impersonation)
/// bring a VirtualMachine to Ready: the controller ClusterRole is enough.
async fn controllers_run_under_the_installed_role() {
    use banlieue_integration_tests::operator::{Operator, wait_for};
    use banlieue_sdk::api::VirtualMachine;
    use serde_json::json;

    let ns = banlieue_testenv::namespace("bootstrap-rbac").await;
    let class = format!("{}-small", ns.name);
    let image = format!("{}-debian", ns.name);
    for object in [
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "sim"},
               "spec": {"class": "sim", "connection": {"endpoint": format!("sim://{}", ns.name)},
                        "capabilities": {"storageClasses": [{"name": "fast", "target": {"pool": "default"}}],
                                         "networkClasses": [{"name": "lan", "target": {"network": "default"}}]}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": class},
               "spec": {"cpus": 1, "memoryMiB": 512, "disk": {"sizeGiB": 5, "storageClass": "fast"}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": image},
               "spec": {"os": {"family": "linux", "distribution": "debian", "version": "13"},
                        "sources": {"sim": {"name": "debian"}}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": "web-1"},
               "spec": {"classRef": {"name": class}, "imageRef": {"name": image},
                        "networks": [{"name": "eth0", "networkClass": "lan"}]}}),
    ] {
        banlieue_integration_tests::apply(&ns.client, &ns.name, &object)
            .await
            .expect("fixture");
    }
    let mut config = banlieue_testenv::shared().kube_config();
    config.auth_info.impersonate =
        Some("system:serviceaccount:banlieue-system:banlieue-controller".to_owned());
    config.auth_info.impersonate_groups = Some(vec![
        "system:serviceaccounts".to_owned(),
        "system:serviceaccounts:banlieue-system".to_owned(),
        "system:authenticated".to_owned(),
    ]);
    let as_controller = kube::Client::try_from(config).expect("impersonating client");
    let _operator = Operator::start(as_controller, &ns.name);
    let vms: Api<VirtualMachine> = Api::namespaced(ns.client.clone(), &ns.name);
    wait_for(&vms, "web-1", std::time::Duration::from_secs(60), |vm| {
        vm.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_operator_installs_idempotently_and_follows_namespace() {
    let kubeconfig = banlieue_testenv::kubeconfig_path()
        .to_str()
        .unwrap()
        .to_owned();
    let client = banlieue_testenv::client().await;

    // First install: every object of the dry run is created or configured.
    let expected = dry_run(&[]);
    let (first, _) = banlieue(&["bootstrap", "operator", "--kubeconfig", &kubeconfig]);
    assert_eq!(
        first.lines().count(),
        expected.len(),
        "one line per object:\n{first}"
    );
    assert!(
        first.contains("namespace/banlieue-system created"),
        "{first}"
    );
    let installed = live(&client, &expected).await;
    for object in installed.values() {
        assert_eq!(
            object["metadata"]["labels"]["cluster.x-k8s.io/provider"], "infrastructure-banlieue",
            "{}",
            object["metadata"]["name"]
        );
        let managers = object["metadata"]["managedFields"].as_array().unwrap();
        assert!(
            managers
                .iter()
                .any(|m| m["manager"] == "banlieue-bootstrap" && m["operation"] == "Apply"),
            "applied server-side by banlieue-bootstrap: {}",
            object["metadata"]["name"]
        );
    }
    let deployment = &installed["Deployment/banlieue-system/banlieue-controller-manager"];
    assert_eq!(
        deployment["spec"]["template"]["spec"]["containers"][0]["name"],
        "manager"
    );
    let aggregate = &installed["ClusterRole//banlieue-capi-infrastructure"];
    assert_eq!(
        aggregate["metadata"]["labels"]["cluster.x-k8s.io/aggregate-to-manager"],
        "true"
    );

    // Second install: nothing changes.
    let (second, _) = banlieue(&["bootstrap", "operator", "--kubeconfig", &kubeconfig]);
    assert!(
        second.lines().all(|line| line.ends_with(" unchanged")),
        "a second run changes nothing:\n{second}"
    );
    assert_eq!(
        versions(&installed),
        versions(&live(&client, &expected).await),
        "no resourceVersion moved"
    );

    // The installed role is what the controllers need (before the install moves).
    controllers_run_under_the_installed_role().await;

    // Another namespace and image: the namespaced objects go there, and the
    // cluster-scoped binding follows the ServiceAccount.
    let other = dry_run(&[
        "--namespace",
        "other",
        "--image",
        "example.test/banlieue:dev",
    ]);
    banlieue(&[
        "bootstrap",
        "operator",
        "--kubeconfig",
        &kubeconfig,
        "--namespace",
        "other",
        "--image",
        "example.test/banlieue:dev",
    ]);
    let moved = live(&client, &other).await;
    let deployment = &moved["Deployment/other/banlieue-controller-manager"];
    assert_eq!(
        deployment["spec"]["template"]["spec"]["containers"][0]["image"],
        "example.test/banlieue:dev"
    );
    assert_eq!(
        moved["ClusterRoleBinding//banlieue-controller"]["subjects"][0]["namespace"],
        "other"
    );
    assert!(moved.contains_key("Namespace//other"));
    assert!(moved.contains_key("RoleBinding/other/banlieue-leader-election"));
}
