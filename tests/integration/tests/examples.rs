//! Every manifest in `examples/manifests` is accepted by server-side apply, and
//! together they cover every kind.

use std::collections::BTreeSet;

use banlieue_integration_tests::{apply, examples_dir, gvk_of, load_manifests};

#[tokio::test]
async fn every_example_is_accepted_by_server_side_apply() {
    let ns = banlieue_testenv::namespace("examples").await;
    let documents = load_manifests(&examples_dir());
    assert!(
        !documents.is_empty(),
        "no examples found in {}",
        examples_dir().display()
    );

    let mut kinds = BTreeSet::new();
    let mut banlieue_objects = 0;
    for (file, document) in &documents {
        let gvk = gvk_of(document);
        let name = document["metadata"]["name"].as_str().unwrap_or("?");
        let applied = apply(&ns.client, &ns.name, document)
            .await
            .unwrap_or_else(|e| {
                panic!("{}: {} {name} rejected: {e}", file.display(), gvk.kind);
            });
        // Applying the same manifest again changes nothing: the schema's defaults are stable.
        let again = apply(&ns.client, &ns.name, document)
            .await
            .expect("second apply");
        assert_eq!(
            applied.metadata.resource_version, again.metadata.resource_version,
            "{} {name}: re-applying the same manifest wrote a new version",
            gvk.kind
        );
        if gvk.group.ends_with("banlieue.io") {
            banlieue_objects += 1;
            kinds.insert(gvk.kind.clone());
        }
    }

    let all: BTreeSet<String> = banlieue_sdk::crds::all()
        .into_iter()
        .map(|c| c.spec.names.kind)
        .collect();
    let missing: Vec<_> = all.difference(&kinds).collect();
    assert!(missing.is_empty(), "kinds without an example: {missing:?}");
    eprintln!(
        "examples: {} documents applied ({banlieue_objects} banlieue objects covering {} kinds)",
        documents.len(),
        kinds.len()
    );
}

#[tokio::test]
async fn defaults_are_filled_in_by_the_apiserver() {
    let ns = banlieue_testenv::namespace("defaults").await;
    let vm = serde_json::json!({
        "apiVersion": "banlieue.io/v1alpha1",
        "kind": "VirtualMachine",
        "metadata": {"name": "defaults"},
        "spec": {"classRef": {"name": "small"}, "imageRef": {"name": "ubuntu-2404"},
                 "networks": [{"name": "eth0", "networkClass": "frontend"}]}
    });
    let applied = apply(&ns.client, &ns.name, &vm).await.expect("apply");
    let spec = &applied.data["spec"];
    assert_eq!(spec["powerState"], "PoweredOn");
    assert_eq!(spec["migration"]["strategy"], "Recreate");
    assert_eq!(spec["migration"]["stopSourceFirst"], true);
    assert_eq!(spec["networks"][0]["ipam"]["mode"], "dhcp");

    // The typed API reads what the server stored.
    let typed: banlieue_sdk::api::VirtualMachine =
        serde_json::from_value(serde_json::to_value(&applied).expect("json"))
            .expect("typed VirtualMachine");
    assert_eq!(
        typed.spec.power_state,
        banlieue_sdk::api::common::PowerState::PoweredOn
    );
}
