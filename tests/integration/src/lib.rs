//! Helpers for banlieue's tests against a real kube-apiserver: loading manifests and
//! applying arbitrary objects with server-side apply.

pub mod admission_cases;
pub mod capi;
pub mod cert_stand_in;
pub mod chaos;
pub mod cloud_hypervisor;
pub mod crashable;
pub mod fakepve;
pub mod fixtures;
pub mod in_cluster;
pub mod libvirt;
pub mod messages;
pub mod node_rig;
pub mod operator;
pub mod vcsim;

use std::path::{Path, PathBuf};

use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{self, Scope};
use serde_json::Value;

/// The field manager these tests apply with.
pub const FIELD_MANAGER: &str = "banlieue-tests";

/// Whether `qemu-img` and `qemu-io` (Debian's qemu-utils) run here, for the suites
/// that judge real disk files. Missing under CI or `make`
/// ([`banlieue_testenv::rigs_required`]) panics; elsewhere the test skips, saying so.
pub fn qemu_utils() -> bool {
    for tool in ["qemu-img", "qemu-io"] {
        match std::process::Command::new(tool).arg("--version").output() {
            Ok(o) if o.status.success() => {}
            other if banlieue_testenv::rigs_required() => {
                panic!("{tool} (apt install qemu-utils) is required under CI and make: {other:?}")
            }
            other => {
                eprintln!("SKIPPED: {tool} unavailable: {other:?}");
                return false;
            }
        }
    }
    true
}

/// The repository's `examples/manifests` directory.
pub fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/manifests")
}

/// Every YAML document of every `*.yaml` file in `dir`, with the file it came from,
/// in file-name order.
pub fn load_manifests(dir: &Path) -> Vec<(PathBuf, Value)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    files.sort();
    let mut documents = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        let parsed: Vec<Value> = serde_saphyr::from_multiple(&text)
            .unwrap_or_else(|e| panic!("parsing {}: {e}", file.display()));
        documents.extend(
            parsed
                .into_iter()
                .filter(|v| !v.is_null())
                .map(|v| (file.clone(), v)),
        );
    }
    documents
}

/// `apiVersion` and `kind` of an object.
pub fn gvk_of(object: &Value) -> GroupVersionKind {
    let api_version = object["apiVersion"].as_str().expect("apiVersion");
    let kind = object["kind"].as_str().expect("kind");
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    GroupVersionKind::gvk(group, version, kind)
}

/// Where `object` lives: its resource, and its namespace when its kind is namespaced.
async fn locate<'a>(
    client: &kube::Client,
    namespace: &'a str,
    object: &Value,
) -> Result<(ApiResource, Option<&'a str>), kube::Error> {
    let (resource, capabilities) = discovery::pinned_kind(client, &gvk_of(object)).await?;
    let namespace = match capabilities.scope {
        Scope::Namespaced => Some(namespace),
        Scope::Cluster => None,
    };
    Ok((resource, namespace))
}

fn api_for(
    client: &kube::Client,
    resource: &ApiResource,
    namespace: Option<&str>,
) -> Api<DynamicObject> {
    match namespace {
        Some(namespace) => Api::namespaced_with(client.clone(), namespace, resource),
        None => Api::all_with(client.clone(), resource),
    }
}

fn name_of(object: &Value) -> &str {
    object["metadata"]["name"].as_str().expect("metadata.name")
}

/// Server-side applies `object` (namespaced kinds into `namespace`), as
/// [`FIELD_MANAGER`], forcing conflicts, with strict field validation (as kubectl does:
/// unknown fields are errors, not silently pruned).
pub async fn apply(
    client: &kube::Client,
    namespace: &str,
    object: &Value,
) -> Result<DynamicObject, kube::Error> {
    let (resource, namespace) = locate(client, namespace, object).await?;
    let api = api_for(client, &resource, namespace);
    api.patch(name_of(object), &strict_apply(), &Patch::Apply(object))
        .await
}

/// Server-side applies the `status` of `object` onto its status subresource.
pub async fn apply_status(
    client: &kube::Client,
    namespace: &str,
    object: &Value,
) -> Result<DynamicObject, kube::Error> {
    let (resource, namespace) = locate(client, namespace, object).await?;
    let api = api_for(client, &resource, namespace);
    api.patch_status(name_of(object), &strict_apply(), &Patch::Apply(object))
        .await
}

/// Creates `object` with a POST and strict field validation, as `kubectl create` does.
pub async fn post(
    client: &kube::Client,
    namespace: &str,
    object: &Value,
) -> Result<DynamicObject, kube::Error> {
    let (resource, namespace) = locate(client, namespace, object).await?;
    // kube's PostParams cannot ask for strict field validation, so build the request.
    let path = format!(
        "{}?fieldValidation=Strict&fieldManager={FIELD_MANAGER}",
        <DynamicObject as kube::Resource>::url_path(&resource, namespace)
    );
    let body = serde_json::to_vec(object).expect("JSON");
    let request = http::Request::post(path)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(body)
        .expect("request");
    client.request(request).await
}

fn strict_apply() -> PatchParams {
    let mut params = PatchParams::apply(FIELD_MANAGER).force();
    params.field_validation = Some(kube::api::ValidationDirective::Strict);
    params
}

/// Sets the value at a JSON pointer (creating objects on the way) and returns the object.
pub fn with(mut object: Value, pointer: &str, value: Value) -> Value {
    let (parent, key) = pointer.rsplit_once('/').expect("pointer has a '/'");
    let mut target = &mut object;
    for part in parent.split('/').filter(|p| !p.is_empty()) {
        target = match target {
            Value::Array(items) => &mut items[part.parse::<usize>().expect("array index")],
            other => {
                if other.get(part).is_none() {
                    other[part] = Value::Object(Default::default());
                }
                &mut other[part]
            }
        };
    }
    match target {
        Value::Array(items) => {
            let index = key.parse::<usize>().expect("array index");
            if index == items.len() {
                items.push(value);
            } else {
                items[index] = value;
            }
        }
        other => other[key] = value,
    }
    object
}

/// Removes the value at a JSON pointer and returns the object.
pub fn without(mut object: Value, pointer: &str) -> Value {
    let (parent, key) = pointer.rsplit_once('/').expect("pointer has a '/'");
    if let Some(Value::Object(map)) = object.pointer_mut(parent) {
        map.remove(key);
    }
    object
}
