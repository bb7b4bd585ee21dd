//! Examples that cannot rot: every YAML file anywhere under `examples/` is accepted by
//! server-side apply on the real API server (strict field validation), re-applying it
//! changes nothing, and the manifests of `examples/manifests` together cover every kind.
//! (The Rust example, `examples/embedding`, runs its own smoke test.)

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

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

/// Every directory under `examples/` that holds YAML files, recursively.
fn yaml_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut has_yaml = false;
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            // Build output of the Rust example, if any, is not an example.
            if path.file_name().is_some_and(|n| n == "target") {
                continue;
            }
            yaml_dirs(&path, out);
        } else if path
            .extension()
            .is_some_and(|ext| ext == "yaml" || ext == "yml")
        {
            assert!(
                path.extension().is_some_and(|ext| ext == "yaml"),
                "{}: name example manifests *.yaml (the loader reads those)",
                path.display()
            );
            has_yaml = true;
        }
    }
    if has_yaml {
        out.push(dir.to_path_buf());
    }
}

#[tokio::test]
async fn every_yaml_file_under_examples_is_accepted_and_stable() {
    let root = examples_dir()
        .parent()
        .expect("examples/manifests has a parent")
        .to_path_buf();
    let mut dirs = Vec::new();
    yaml_dirs(&root, &mut dirs);
    assert!(
        dirs.iter().any(|d| d.ends_with("demo")),
        "examples/demo (what `make demo` applies) was not found under {}: {dirs:?}",
        root.display()
    );
    let mut applied = 0;
    for dir in dirs.iter().filter(|d| **d != examples_dir()) {
        // One namespace per directory: each is a self-contained set, as `make demo` applies it.
        let ns = banlieue_testenv::namespace("examples-dir").await;
        for (file, document) in load_manifests(dir) {
            let gvk = gvk_of(&document);
            let name = document["metadata"]["name"].as_str().unwrap_or("?");
            let first = apply(&ns.client, &ns.name, &document)
                .await
                .unwrap_or_else(|e| {
                    panic!("{}: {} {name} rejected: {e}", file.display(), gvk.kind)
                });
            let again = apply(&ns.client, &ns.name, &document)
                .await
                .unwrap_or_else(|e| {
                    panic!("{}: {} {name} re-apply: {e}", file.display(), gvk.kind)
                });
            assert_eq!(
                first.metadata.resource_version,
                again.metadata.resource_version,
                "{}: {} {name}: re-applying the same manifest wrote a new version",
                file.display(),
                gvk.kind
            );
            applied += 1;
        }
    }
    assert!(applied > 0, "no YAML outside examples/manifests: {dirs:?}");
    eprintln!(
        "examples: {applied} documents applied from {} other directories",
        dirs.len() - 1
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
