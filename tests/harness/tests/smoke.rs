//! Smoke tests of the shared control plane: it starts, serves the pinned version, hands out
//! isolated namespaces and has banlieue's CRDs established.

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, PostParams};

/// The version `tests/testbin/versions.env` pins.
const KUBERNETES_VERSION: &str = "v1.36.3";

fn config_map(name: &str) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.to_owned());
    cm.data = Some([("key".to_owned(), name.to_owned())].into());
    cm
}

#[tokio::test]
async fn reports_pinned_version() {
    let client = banlieue_testenv::client().await;
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(version.git_version, KUBERNETES_VERSION);
    assert!(banlieue_testenv::server_url().starts_with("https://127.0.0.1:"));
    let kubeconfig = std::fs::read_to_string(banlieue_testenv::kubeconfig_path()).unwrap();
    assert!(kubeconfig.contains(banlieue_testenv::server_url()));
}

/// Creates a ConfigMap in a fresh namespace and checks it is the namespace's only one
/// besides `kube-root-ca.crt` (not published: kube-controller-manager is not running).
async fn config_map_in_own_namespace(prefix: &str) -> String {
    let ns = banlieue_testenv::namespace(prefix).await;
    let api = ns.api::<ConfigMap>();
    api.create(&PostParams::default(), &config_map("smoke"))
        .await
        .unwrap();
    let names: Vec<_> = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .into_iter()
        .filter_map(|cm| cm.metadata.name)
        .collect();
    assert_eq!(names, ["smoke"]);
    // The namespace's client defaults to it.
    let default_api: Api<ConfigMap> = Api::default_namespaced(ns.client.clone());
    assert_eq!(
        default_api.get("smoke").await.unwrap().data,
        config_map("smoke").data
    );
    ns.name.clone()
}

#[tokio::test]
async fn first_test_gets_its_own_namespace() {
    let name = config_map_in_own_namespace("first").await;
    assert!(name.starts_with("first-"), "{name}");
}

#[tokio::test]
async fn second_test_gets_its_own_namespace() {
    let name = config_map_in_own_namespace("second").await;
    assert!(name.starts_with("second-"), "{name}");
}

#[tokio::test]
async fn namespaces_are_distinct() {
    let (a, b) = tokio::join!(
        banlieue_testenv::namespace("same"),
        banlieue_testenv::namespace("same")
    );
    assert_ne!(a.name, b.name);
}

#[tokio::test]
async fn banlieue_crds_are_established() {
    let expected = banlieue_sdk::crds::all();
    let client = banlieue_testenv::client().await;
    let crds: Api<CustomResourceDefinition> = Api::all(client);
    let mut established = 0;
    for crd in &expected {
        let name = crd.metadata.name.as_deref().unwrap();
        let live = crds.get(name).await.unwrap();
        let is_established = live
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        assert!(is_established, "{name} is not Established");
        established += 1;
    }
    assert!(!expected.is_empty());
    assert_eq!(established, expected.len());
}

#[tokio::test]
async fn dropped_namespace_is_deleted() {
    use k8s_openapi::api::core::v1::Namespace;

    let ns = banlieue_testenv::namespace("dropped").await;
    let namespaces: Api<Namespace> = Api::all(ns.client.clone());
    let name = ns.name.clone();
    drop(ns);
    // Deletion is requested asynchronously; without kube-controller-manager the namespace
    // then stays Terminating.
    for _ in 0..100 {
        match namespaces.get_opt(&name).await.unwrap() {
            Some(live) if live.metadata.deletion_timestamp.is_none() => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            _ => return,
        }
    }
    panic!("namespace {name} was not deleted");
}
