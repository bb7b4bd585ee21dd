//! A VirtualMachine's bootstrap data, materialised as a Secret in Cluster API's
//! shape (`value`, `format`, `network-config`) that the infra machine references.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::context::Context;
use super::infra;
use crate::api::VirtualMachine;
use crate::api::common::BootstrapFormat;
use crate::build;

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
    let name = build::bootstrap_secret_name(&vm.name_any());
    let existing = secrets.get_opt(&name).await?;
    if existing.as_ref().and_then(|s| s.data.as_ref()) != Some(&data) {
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace),
                owner_references: Some(vec![owner(vm)]),
                labels: Some(BTreeMap::from([(
                    build::VIRTUAL_MACHINE_LABEL.to_owned(),
                    build::label_value(&vm.name_any()),
                )])),
                ..Default::default()
            },
            data: Some(data),
            type_: Some("cluster.x-k8s.io/secret".into()),
            ..Default::default()
        };
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
        ctx.metrics.wrote(NAME);
    }
    Ok(Ok(Some(name)))
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
