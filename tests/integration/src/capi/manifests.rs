//! CAPI core's manifests as the rig installs them: CRDs with conversion webhooks on the
//! manager, the release's RBAC plus banlieue's aggregate role, webhook configurations
//! with URL client configs.

use std::path::{Path, PathBuf};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};
use serde_json::{Value, json};

use super::{FIELD_MANAGER, NAMESPACE, START_TIMEOUT, repo_root};

/// Every YAML document in `path`.
fn yaml_documents(path: &Path) -> Result<Vec<Value>, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
        .map_err(|e| format!("parsing {}: {e}", path.display()))?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

fn yaml_files(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("reading {}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    Ok(files)
}

/// CAPI's CRDs with `spec.conversion` pointed at the manager (the release's
/// `webhook_in_*.yaml` patches plus cert-manager's CA injection, done here).
pub fn crds_with_conversion(
    rig: &Path,
    webhook_base: &str,
    ca_bundle: &str,
) -> Result<Vec<Value>, String> {
    let mut crds = Vec::new();
    for file in yaml_files(&rig.join("crds"))? {
        for mut crd in yaml_documents(&file)? {
            crd["spec"]["conversion"] = json!({
                "strategy": "Webhook",
                "webhook": {
                    "conversionReviewVersions": ["v1"],
                    "clientConfig": {"url": format!("{webhook_base}/convert"), "caBundle": ca_bundle},
                },
            });
            let labels = &mut crd["metadata"]["labels"];
            if !labels.is_object() {
                *labels = json!({});
            }
            labels["cluster.x-k8s.io/provider"] = json!("cluster-api");
            crds.push(crd);
        }
    }
    Ok(crds)
}

pub(super) async fn install_crds(
    client: &kube::Client,
    rig: &Path,
    webhook_base: &str,
    ca_bundle: &str,
) -> Result<(), String> {
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let crds = crds_with_conversion(rig, webhook_base, ca_bundle)?;
    for crd in &crds {
        let name = crd["metadata"]["name"].as_str().unwrap_or_default();
        api.patch(name, &params, &Patch::Apply(crd))
            .await
            .map_err(|e| format!("capi rig: applying CRD {name}: {e}"))?;
    }
    for crd in &crds {
        let name = crd["metadata"]["name"].as_str().unwrap_or_default();
        let established = await_condition(api.clone(), name, conditions::is_crd_established());
        tokio::time::timeout(START_TIMEOUT, established)
            .await
            .map_err(|_| format!("capi rig: CRD {name} not established"))?
            .map_err(|e| format!("capi rig: CRD {name}: {e}"))?;
    }
    Ok(())
}

/// CAPI's RBAC as its release renders it (kustomize `namePrefix: capi-`, namespace
/// `capi-system`, the `manager_role_aggregation_patch`), plus banlieue's aggregate role.
pub fn rbac_objects(rig: &Path) -> Result<Vec<Value>, String> {
    let mut objects = vec![json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": NAMESPACE, "labels": {"cluster.x-k8s.io/provider": "cluster-api"}},
    })];
    for file in yaml_files(&rig.join("rbac"))? {
        for mut object in yaml_documents(&file)? {
            let kind = object["kind"].as_str().unwrap_or_default().to_owned();
            let name = object["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            object["metadata"]["name"] = json!(format!("capi-{name}"));
            if object["metadata"]["namespace"].is_string()
                || kind == "Role"
                || kind == "RoleBinding"
            {
                object["metadata"]["namespace"] = json!(NAMESPACE);
            }
            if let Some(role_ref) = object.get_mut("roleRef") {
                let target = role_ref["name"].as_str().unwrap_or_default().to_owned();
                // The release binds the manager to the aggregated role, not to its own.
                let target = if target == "manager-role" && kind == "ClusterRoleBinding" {
                    "aggregated-manager-role".to_owned()
                } else {
                    target
                };
                role_ref["name"] = json!(format!("capi-{target}"));
            }
            if let Some(Value::Array(subjects)) = object.get_mut("subjects") {
                for subject in subjects {
                    subject["name"] = json!(format!(
                        "capi-{}",
                        subject["name"].as_str().unwrap_or_default()
                    ));
                    subject["namespace"] = json!(NAMESPACE);
                }
            }
            let labels = &mut object["metadata"]["labels"];
            if !labels.is_object() {
                *labels = json!({});
            }
            labels["cluster.x-k8s.io/provider"] = json!("cluster-api");
            if kind == "ClusterRole" && name == "manager-role" {
                labels["cluster.x-k8s.io/aggregate-to-manager"] = json!("true");
            }
            objects.push(object);
        }
    }
    let ours = repo_root().join("deploy/capi/clusterrole-aggregate.yaml");
    objects.extend(yaml_documents(&ours)?);
    Ok(objects)
}

pub(super) async fn install_rbac(client: &kube::Client, rig: &Path) -> Result<(), String> {
    for object in rbac_objects(rig)? {
        crate::apply(client, NAMESPACE, &object)
            .await
            .map_err(|e| format!("capi rig: applying RBAC: {e}"))?;
    }
    Ok(())
}

/// CAPI's webhook configurations with each `clientConfig.service` replaced by a URL on
/// the manager and our CA (envtest's `ModifyWebhookDefinitions`), names prefixed
/// `capi-` as the release's kustomization does.
pub fn webhook_configurations(
    rig: &Path,
    webhook_base: &str,
    ca_bundle: &str,
) -> Result<Vec<Value>, String> {
    let mut configurations = Vec::new();
    for mut configuration in yaml_documents(&rig.join("webhook/manifests.yaml"))? {
        let name = configuration["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        configuration["metadata"]["name"] = json!(format!("capi-{name}"));
        configuration["metadata"]["labels"] = json!({"cluster.x-k8s.io/provider": "cluster-api"});
        if let Some(Value::Array(webhooks)) = configuration.get_mut("webhooks") {
            for webhook in webhooks {
                let path = webhook["clientConfig"]["service"]["path"]
                    .as_str()
                    .unwrap_or("/")
                    .to_owned();
                webhook["clientConfig"] =
                    json!({"url": format!("{webhook_base}{path}"), "caBundle": ca_bundle});
            }
        }
        configurations.push(configuration);
    }
    Ok(configurations)
}

pub(super) async fn install_webhooks(
    client: &kube::Client,
    rig: &Path,
    webhook_base: &str,
    ca_bundle: &str,
) -> Result<(), String> {
    for configuration in webhook_configurations(rig, webhook_base, ca_bundle)? {
        crate::apply(client, NAMESPACE, &configuration)
            .await
            .map_err(|e| format!("capi rig: applying webhook configuration: {e}"))?;
    }
    Ok(())
}
