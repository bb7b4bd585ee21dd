//! Every CRD installs on a real apiserver, becomes established, is structural, and
//! carries what CAPI and kubectl rely on.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;

const CAPI_CONTRACT_LABEL: &str = "cluster.x-k8s.io/v1beta2";
/// Short names KubeVirt owns; ours must not shadow them.
const KUBEVIRT_SHORT_NAMES: &[&str] = &[
    "vm",
    "vms",
    "vmi",
    "vmis",
    "vmim",
    "vmipreset",
    "vmirs",
    "vmsnapshot",
];

#[tokio::test]
async fn every_crd_is_established_structural_and_labelled() {
    let ns = banlieue_testenv::namespace("crds").await;
    let api: Api<CustomResourceDefinition> = Api::all(ns.client.clone());
    let expected = banlieue_sdk::crds::all();
    assert_eq!(
        expected.len(),
        20,
        "4 banlieue.io kinds + 16 infrastructure kinds"
    );

    for crd in &expected {
        let name = crd.metadata.name.as_deref().expect("CRD name");
        let live = api
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let conditions = live.status.and_then(|s| s.conditions).unwrap_or_default();
        let status_of = |t: &str| {
            conditions
                .iter()
                .find(|c| c.type_ == t)
                .map(|c| c.status.as_str())
        };
        assert_eq!(
            status_of("Established"),
            Some("True"),
            "{name} not established: {conditions:?}"
        );
        assert_eq!(
            status_of("NamesAccepted"),
            Some("True"),
            "{name} names not accepted"
        );
        assert_ne!(
            status_of("NonStructuralSchema"),
            Some("True"),
            "{name} has a non-structural schema"
        );

        // CAPI computes the CRD name as flect.Pluralize(lower(kind)) + "." + group.
        let kind = &live.spec.names.kind;
        assert_eq!(
            name,
            format!("{}.{}", capi_plural(kind), live.spec.group),
            "CRD name CAPI cannot find"
        );

        let labels = live.metadata.labels.unwrap_or_default();
        let categories = live.spec.names.categories.unwrap_or_default();
        assert!(
            categories.contains(&"banlieue".to_string()),
            "{name} not in category banlieue"
        );
        if live.spec.group == banlieue_sdk::api::INFRA_GROUP {
            assert_eq!(
                labels.get(CAPI_CONTRACT_LABEL).map(String::as_str),
                Some("v1alpha1"),
                "{name}"
            );
            assert!(
                categories.contains(&"cluster-api".to_string()),
                "{name} not in category cluster-api"
            );
        } else {
            assert!(
                !labels.contains_key(CAPI_CONTRACT_LABEL),
                "{name} is not a CAPI kind"
            );
        }

        let short_names = live.spec.names.short_names.unwrap_or_default();
        assert!(!short_names.is_empty(), "{name} has no short name");
        for short in &short_names {
            assert!(
                !KUBEVIRT_SHORT_NAMES.contains(&short.as_str()),
                "{name}: {short} clashes with KubeVirt"
            );
        }

        let version = &live.spec.versions[0];
        let schema = version
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .expect("schema");
        let description = schema.description.as_deref().unwrap_or_default();
        assert!(
            description.len() > 40 && !description.contains("Auto-generated"),
            "{name}: root description is not useful for kubectl explain: {description:?}"
        );
        assert!(
            version
                .additional_printer_columns
                .as_ref()
                .is_some_and(|c| !c.is_empty()),
            "{name} has no printer columns"
        );
        let has_status = schema
            .properties
            .as_ref()
            .is_some_and(|p| p.contains_key("status"));
        let status_subresource = version
            .subresources
            .as_ref()
            .and_then(|s| s.status.as_ref())
            .is_some();
        assert_eq!(
            has_status, status_subresource,
            "{name}: status field and status subresource disagree"
        );
    }
}

/// `kubectl explain` reads the published OpenAPI v3 document: our descriptions must be in it.
#[tokio::test]
async fn kubectl_explain_sees_the_descriptions() {
    let ns = banlieue_testenv::namespace("explain").await;
    for group in [banlieue_sdk::api::GROUP, banlieue_sdk::api::INFRA_GROUP] {
        let document = published_openapi_v3(&ns.client, group).await;
        let schemas = document["components"]["schemas"]
            .as_object()
            .expect("schemas");
        for crd in banlieue_sdk::crds::all()
            .iter()
            .filter(|c| c.spec.group == group)
        {
            let kind = &crd.spec.names.kind;
            let (_, schema) = schemas
                .iter()
                .find(|(key, _)| key.ends_with(&format!(".v1alpha1.{kind}")))
                .unwrap_or_else(|| panic!("{kind} missing from /openapi/v3"));
            let text = schema["description"].as_str().unwrap_or_default();
            assert!(
                text.starts_with(&format!("A {kind} ")) || text.starts_with(&format!("A {kind}")),
                "{kind}: {text:?}"
            );
            let spec = &schema["properties"]["spec"];
            assert!(
                spec.get("properties").is_some() || spec.get("allOf").is_some(),
                "{kind}: no spec schema"
            );
        }
    }
}

/// The apiserver publishes a group's OpenAPI v3 document asynchronously, some time after
/// its CRDs became Established (404 until then, and a partial document while the
/// aggregator catches up), so wait until every kind of the group is in it.
async fn published_openapi_v3(client: &kube::Client, group: &str) -> serde_json::Value {
    let path = format!("/openapi/v3/apis/{group}/v1alpha1");
    let kinds: Vec<String> = banlieue_sdk::crds::all()
        .iter()
        .filter(|c| c.spec.group == group)
        .map(|c| format!(".v1alpha1.{}", c.spec.names.kind))
        .collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let last = match client.request::<serde_json::Value>(http_get(&path)).await {
            Ok(document) => {
                let complete =
                    document["components"]["schemas"]
                        .as_object()
                        .is_some_and(|schemas| {
                            kinds
                                .iter()
                                .all(|kind| schemas.keys().any(|key| key.ends_with(kind.as_str())))
                        });
                if complete {
                    return document;
                }
                "document without all kinds yet".to_owned()
            }
            Err(error) => error.to_string(),
        };
        assert!(
            std::time::Instant::now() < deadline,
            "{path} not published with all kinds within 60 s: {last}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

fn http_get(path: &str) -> http::Request<Vec<u8>> {
    http::Request::get(path).body(Vec::new()).expect("request")
}

/// The subset of flect's English pluralisation our kinds need.
fn capi_plural(kind: &str) -> String {
    let lower = kind.to_lowercase();
    if lower.ends_with("ss")
        || lower.ends_with('x')
        || lower.ends_with("sh")
        || lower.ends_with("ch")
    {
        format!("{lower}es")
    } else {
        format!("{lower}s")
    }
}
