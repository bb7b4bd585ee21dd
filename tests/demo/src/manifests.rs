//! The demo's manifests (`examples/demo/*.yaml`): loading, and applying them with
//! server-side apply whatever their kind.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, anyhow};
use kube::api::{Api, DynamicObject, Patch, PatchParams, ValidationDirective};
use kube::core::GroupVersionKind;
use kube::discovery::{self, Scope};
use serde_json::Value;

/// The field manager the demo applies with.
pub const FIELD_MANAGER: &str = "banlieue-demo";

/// One YAML document and the file it came from.
#[derive(Clone, Debug)]
pub struct Manifest {
    /// The file.
    pub file: PathBuf,
    /// The object.
    pub object: Value,
}

impl Manifest {
    /// `kind`.
    pub fn kind(&self) -> &str {
        self.object["kind"].as_str().unwrap_or_default()
    }

    /// `metadata.name`.
    pub fn name(&self) -> &str {
        self.object["metadata"]["name"].as_str().unwrap_or_default()
    }

    /// `apiVersion` and `kind`.
    fn gvk(&self) -> anyhow::Result<GroupVersionKind> {
        let api_version = self.object["apiVersion"]
            .as_str()
            .ok_or_else(|| anyhow!("{}: a document has no apiVersion", self.file.display()))?;
        if self.kind().is_empty() || self.name().is_empty() {
            return Err(anyhow!(
                "{}: a document has no kind or metadata.name",
                self.file.display()
            ));
        }
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        Ok(GroupVersionKind::gvk(group, version, self.kind()))
    }
}

/// Every YAML document of every `*.yaml` file in `dir`, in file-name order.
///
/// # Errors
/// If the directory or a file cannot be read or parsed, or holds no document.
pub fn load(dir: &Path) -> anyhow::Result<Vec<Manifest>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .with_context(|| format!("reading {}", dir.display()))?;
    files.retain(|path| path.extension().is_some_and(|ext| ext == "yaml"));
    files.sort();
    let mut manifests = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        let documents: Vec<Value> = serde_saphyr::from_multiple(&text)
            .with_context(|| format!("parsing {}", file.display()))?;
        manifests.extend(
            documents
                .into_iter()
                .filter(|object| !object.is_null())
                .map(|object| Manifest {
                    file: file.clone(),
                    object,
                }),
        );
    }
    if manifests.is_empty() {
        return Err(anyhow!("no manifests in {}", dir.display()));
    }
    Ok(manifests)
}

/// Names of the VirtualMachines among `manifests`, in order.
pub fn virtual_machines(manifests: &[Manifest]) -> Vec<String> {
    manifests
        .iter()
        .filter(|m| m.kind() == "VirtualMachine")
        .map(|m| m.name().to_owned())
        .collect()
}

/// Server-side applies `manifest` as [`FIELD_MANAGER`], forcing conflicts, with strict
/// field validation (unknown fields are errors, as with kubectl). Namespaced kinds go to
/// their `metadata.namespace`, else to `namespace`; the kind's resource and scope come
/// from discovery.
///
/// # Errors
/// If the kind is unknown or the apiserver rejects the object.
pub async fn apply(
    client: &kube::Client,
    namespace: &str,
    manifest: &Manifest,
) -> anyhow::Result<()> {
    let what = format!("{} {}", manifest.kind(), manifest.name());
    let (resource, capabilities) = discovery::pinned_kind(client, &manifest.gvk()?)
        .await
        .with_context(|| format!("{}: looking up {what}", manifest.file.display()))?;
    let api: Api<DynamicObject> = match capabilities.scope {
        Scope::Namespaced => {
            let namespace = manifest.object["metadata"]["namespace"]
                .as_str()
                .unwrap_or(namespace);
            Api::namespaced_with(client.clone(), namespace, &resource)
        }
        Scope::Cluster => Api::all_with(client.clone(), &resource),
    };
    let mut params = PatchParams::apply(FIELD_MANAGER).force();
    params.field_validation = Some(ValidationDirective::Strict);
    api.patch(manifest.name(), &params, &Patch::Apply(&manifest.object))
        .await
        .with_context(|| format!("{}: applying {what}", manifest.file.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shipped manifests parse, name their objects, and hold a handful of VMs.
    #[test]
    fn the_demo_manifests_load() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/demo");
        let manifests = load(&dir).unwrap();
        for manifest in &manifests {
            manifest.gvk().unwrap();
        }
        let kinds: Vec<&str> = manifests.iter().map(Manifest::kind).collect();
        assert_eq!(
            &kinds[..3],
            ["Provider", "VMClass", "VMImage"],
            "the Provider, class and image come before the VMs"
        );
        let vms = virtual_machines(&manifests);
        assert!((4..=10).contains(&vms.len()), "{vms:?}");
    }
}
