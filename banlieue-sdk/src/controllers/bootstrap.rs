//! A VirtualMachine's bootstrap data, materialised as a Secret in Cluster API's
//! shape (`value`, `format`, `network-config`) that the infra machine references.
//!
//! The copy `<vm>-bootstrap` is banlieue's only while this VM owns it (its
//! controller ownerReference carries the VM's UID): a Secret of that name that is
//! someone else's is never written over nor deleted; the VM reports
//! [`CONFLICT`] instead. Otherwise whoever may create a VirtualMachine named `x`
//! could have the operator overwrite, then delete, the Secret `x-bootstrap`.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::context::Context;
use super::infra;
use crate::api::VirtualMachine;
use crate::api::common::BootstrapFormat;
use crate::builder;

const NAME: &str = "virtualmachine";

/// Kubernetes' limit on a Secret's data: the sum of its values' sizes.
const MAX_SECRET_DATA: usize = 1024 * 1024;

/// Why the bootstrap Secret cannot be written: a reason and what to fix.
pub(crate) type Unwritable = (&'static str, String);

/// Materialises the VM's bootstrap data as a Secret in CAPI's shape (`value`,
/// `format`, `network-config`), owned by the VM. `Ok(Err(..))` when a source Secret or
/// key is missing, or the data cannot fit in one Secret.
pub(crate) async fn ensure_secret(
    vm: &VirtualMachine,
    ctx: &Context,
) -> Result<Result<Option<String>, Unwritable>, kube::Error> {
    let Some(bootstrap) = &vm.spec.bootstrap else {
        return Ok(Ok(None));
    };
    let namespace = vm.namespace().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &namespace);
    let mut data: BTreeMap<String, ByteString> = BTreeMap::new();
    for (selector, default_key, target_key) in [
        (bootstrap.user_data.as_ref(), "value", "value"),
        (
            bootstrap.network_config.as_ref(),
            "network-config",
            "network-config",
        ),
    ] {
        let Some(selector) = selector else { continue };
        let Some(secret) = secrets.get_opt(&selector.name).await? else {
            return Ok(Err((
                NOT_FOUND,
                format!("bootstrap Secret {} not found", selector.name),
            )));
        };
        let key = selector.key_or(default_key);
        let Some(value) = secret.data.as_ref().and_then(|d| d.get(key)) else {
            return Ok(Err((
                NOT_FOUND,
                format!("bootstrap Secret {} has no key {key}", selector.name),
            )));
        };
        data.insert(target_key.into(), value.clone());
    }
    let format = match bootstrap.format {
        BootstrapFormat::CloudConfig => "cloud-config",
        BootstrapFormat::Ignition => "ignition",
    };
    let size: usize = data.values().map(|v| v.0.len()).sum();
    if size > MAX_SECRET_DATA {
        return Ok(Err(("BootstrapDataTooLarge", too_large(size))));
    }
    // `format` is a courtesy for CAPI-shaped readers: the infra machine's
    // `spec.bootstrap.format` says it too, so data that fills the Secret goes without.
    if size + format.len() <= MAX_SECRET_DATA {
        data.insert("format".into(), ByteString(format.as_bytes().to_vec()));
    }
    let name = builder::bootstrap_secret_name(&vm.name_any());
    let existing = secrets.get_opt(&name).await?;
    let uid = vm.uid().unwrap_or_default();
    if let Some(existing) = &existing
        && !owned_by(existing, &uid)
    {
        return Ok(Err((CONFLICT, conflict(&name, existing))));
    }
    if existing.as_ref().and_then(|s| s.data.as_ref()) != Some(&data) {
        let mut secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace),
                owner_references: Some(vec![owner(vm)]),
                labels: Some(BTreeMap::from([(
                    builder::VIRTUAL_MACHINE_LABEL.to_owned(),
                    builder::label_value(&vm.name_any()),
                )])),
                ..Default::default()
            },
            data: Some(data),
            type_: Some("cluster.x-k8s.io/secret".into()),
            ..Default::default()
        };
        match existing {
            // Absent: a create, which fails rather than overwrite a Secret someone
            // made since the read (the next reconcile then finds it and says whose).
            None => {
                secrets.create(&PostParams::default(), &secret).await?;
            }
            // Ours: an apply conditional on the version whose owner was checked.
            Some(existing) => {
                secret.metadata.resource_version = existing.metadata.resource_version;
                let mut patch = serde_json::to_value(&secret).unwrap_or_default();
                patch["apiVersion"] = json!("v1");
                patch["kind"] = json!("Secret");
                secrets
                    .patch(
                        &name,
                        &PatchParams::apply(infra::FIELD_MANAGER).force(),
                        &Patch::Apply(&patch),
                    )
                    .await?;
            }
        }
        ctx.metrics.wrote(NAME);
    }
    Ok(Ok(Some(name)))
}

/// Deletes the VM's bootstrap copy if it is this VM's (see the module documentation),
/// on the condition that it is still the object whose owner was checked. Returns
/// whether it deleted anything.
pub(crate) async fn delete_secret(vm: &VirtualMachine, ctx: &Context) -> Result<bool, kube::Error> {
    let namespace = vm.namespace().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &namespace);
    let name = builder::bootstrap_secret_name(&vm.name_any());
    let Some(existing) = secrets.get_opt(&name).await? else {
        return Ok(false);
    };
    if !owned_by(&existing, &vm.uid().unwrap_or_default()) {
        return Ok(false);
    }
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: existing.metadata.uid.clone(),
            resource_version: existing.metadata.resource_version.clone(),
        }),
        ..DeleteParams::background()
    };
    match secrets.delete(&name, &params).await {
        Ok(_) => Ok(true),
        // Gone meanwhile (the garbage collector, through our ownerReference), or
        // replaced by someone else's: neither is ours to delete.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// The `Ready` reason while a Secret named as the bootstrap copy is someone else's.
pub(crate) const CONFLICT: &str = "BootstrapSecretConflict";

/// Whether `secret`'s controller ownerReference is the VM with this UID.
fn owned_by(secret: &Secret, uid: &str) -> bool {
    !uid.is_empty()
        && secret
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|r| r.controller == Some(true) && r.uid == uid)
}

fn conflict(name: &str, existing: &Secret) -> String {
    let owner = existing
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
        .or_else(|| existing.metadata.owner_references.iter().flatten().next());
    let whose = match owner {
        Some(r) => format!("it belongs to {} {} (UID {})", r.kind, r.name, r.uid),
        None => "it has no owner".to_owned(),
    };
    format!(
        "the Secret {name} this VirtualMachine's bootstrap data is copied to already exists and is not this VirtualMachine's ({whose}): banlieue neither overwrites nor deletes it. Rename or delete that Secret, or give this VirtualMachine another name"
    )
}

/// The `Ready` reason while bootstrap data is missing.
pub(crate) const NOT_FOUND: &str = "BootstrapDataNotFound";

fn too_large(size: usize) -> String {
    format!(
        "the bootstrap data is {size} bytes (user data and network config together), over the {MAX_SECRET_DATA} bytes one Secret can hold: make it smaller (e.g. gzip the cloud-config's large files, or fetch them at boot)"
    )
}

fn owner(vm: &VirtualMachine) -> OwnerReference {
    vm.controller_owner_ref(&()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret_owned_by(refs: Vec<OwnerReference>) -> Secret {
        Secret {
            metadata: ObjectMeta {
                owner_references: Some(refs),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn reference(kind: &str, name: &str, uid: &str, controller: bool) -> OwnerReference {
        OwnerReference {
            api_version: "v1".into(),
            kind: kind.into(),
            name: name.into(),
            uid: uid.into(),
            controller: Some(controller),
            ..Default::default()
        }
    }

    #[test]
    fn only_a_copy_this_vm_controls_is_its_own() {
        let ours = reference("VirtualMachine", "x", "uid-x", true);
        assert!(owned_by(&secret_owned_by(vec![ours.clone()]), "uid-x"));
        // Same name, another VM (a deleted and re-created `x`): not ours.
        assert!(!owned_by(&secret_owned_by(vec![ours.clone()]), "uid-y"));
        // Owned but not controlled by us: someone else's.
        assert!(!owned_by(
            &secret_owned_by(vec![reference("VirtualMachine", "x", "uid-x", false)]),
            "uid-x"
        ));
        assert!(!owned_by(&Secret::default(), "uid-x"));
        assert!(!owned_by(&secret_owned_by(vec![ours]), ""));
    }

    #[test]
    fn the_conflict_names_the_secret_and_its_owner_and_what_to_do() {
        let foreign = secret_owned_by(vec![reference("Deployment", "db", "uid-d", true)]);
        let message = conflict("x-bootstrap", &foreign);
        assert!(message.contains("x-bootstrap"), "{message}");
        assert!(message.contains("Deployment db (UID uid-d)"), "{message}");
        assert!(
            message.contains("neither overwrites nor deletes"),
            "{message}"
        );
        let message = conflict("x-bootstrap", &Secret::default());
        assert!(message.contains("it has no owner"), "{message}");
    }

    #[test]
    fn the_size_message_gives_both_figures_and_a_way_out() {
        let message = too_large(MAX_SECRET_DATA + 1);
        assert!(message.contains("1048577 bytes"), "{message}");
        assert!(
            message.contains("1048576 bytes one Secret can hold"),
            "{message}"
        );
        assert!(message.contains("make it smaller"), "{message}");
    }
}
