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

/// Materialises the VM's bootstrap data as a Secret in CAPI's shape (`value`,
/// `format`, `network-config`), owned by the VM. `Ok(Err(message))` when a source
/// Secret or key is missing.
pub(crate) async fn ensure_secret(
    vm: &VirtualMachine,
    ctx: &Context,
) -> Result<Result<Option<String>, String>, kube::Error> {
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
            return Ok(Err(format!(
                "bootstrap Secret {:?} not found",
                selector.name
            )));
        };
        let key = selector.key_or(default_key);
        let Some(value) = secret.data.as_ref().and_then(|d| d.get(key)) else {
            return Ok(Err(format!(
                "bootstrap Secret {:?} has no key {key:?}",
                selector.name
            )));
        };
        data.insert(target_key.into(), value.clone());
    }
    let format = match bootstrap.format {
        BootstrapFormat::CloudConfig => "cloud-config",
        BootstrapFormat::Ignition => "ignition",
    };
    data.insert("format".into(), ByteString(format.as_bytes().to_vec()));
    let name = format!("{}-bootstrap", vm.name_any());
    let existing = secrets.get_opt(&name).await?;
    if existing.as_ref().and_then(|s| s.data.as_ref()) != Some(&data) {
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace),
                owner_references: Some(vec![owner(vm)]),
                labels: Some(BTreeMap::from([(
                    build::VIRTUAL_MACHINE_LABEL.to_owned(),
                    vm.name_any(),
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

fn owner(vm: &VirtualMachine) -> OwnerReference {
    vm.controller_owner_ref(&()).unwrap_or_default()
}
