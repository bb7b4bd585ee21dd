//! Finding, comparing, applying and deleting a VM's infrastructure machine, whatever
//! its kind.

use kube::ResourceExt;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams};
use serde_json::Value;

use super::context::Context;
pub(crate) use super::machine_cache::Existing;
use crate::backend::MachineRequest;
use crate::contract::{InfraMachine, InfraMachineKind};

/// Field manager of the infra machines the VM controller builds.
pub(crate) const FIELD_MANAGER: &str = "banlieue-virtualmachine";

/// The infra machines (of any kind) named `name` in `namespace` owned by the VM `uid`.
pub(crate) fn find(ctx: &Context, namespace: &str, name: &str, uid: &str) -> Vec<Existing> {
    ctx.stores
        .machines
        .iter()
        .filter_map(|kind| kind.find(namespace, name, uid))
        .collect()
}

pub(crate) fn api(ctx: &Context, kind: InfraMachineKind, namespace: &str) -> Api<DynamicObject> {
    let resource = ApiResource {
        group: crate::api::INFRA_GROUP.into(),
        version: crate::api::VERSION.into(),
        api_version: format!("{}/{}", crate::api::INFRA_GROUP, crate::api::VERSION),
        kind: kind.kind().into(),
        plural: kind.plural().into(),
    };
    Api::namespaced_with(ctx.client.clone(), namespace, &resource)
}

/// What the backend of `machine` is asked to create when its disks were copied in:
/// its identity and spec as the cache holds them (the UID is the import's key).
pub(crate) fn copied_request(
    ctx: &Context,
    namespace: &str,
    machine: &Existing,
    instance_id: String,
) -> Option<MachineRequest> {
    let spec = ctx
        .stores
        .machines
        .iter()
        .find(|kind| kind.kind() == machine.kind)?
        .backend_spec(namespace, &machine.name)?;
    Some(MachineRequest {
        identity: machine.identity(namespace),
        spec,
        failure_domain: machine.failure_domain.clone(),
        bootstrap: None,
        instance_id: Some(instance_id),
        disks_imported: true,
    })
}

/// Merge-patches an infra machine (fields the VM controller changes outside a build:
/// a move's power-off, its failure record).
pub(crate) async fn patch(
    ctx: &Context,
    namespace: &str,
    machine: &Existing,
    patch: &Value,
) -> Result<(), kube::Error> {
    api(ctx, machine.kind, namespace)
        .patch(&machine.name, &PatchParams::default(), &Patch::Merge(patch))
        .await?;
    Ok(())
}

/// Server-side applies a built machine.
pub(crate) async fn apply(ctx: &Context, built: &InfraMachine) -> Result<(), kube::Error> {
    let meta = built.meta();
    let namespace = meta.namespace.clone().unwrap_or_default();
    let name = meta.name.clone().unwrap_or_default();
    api(ctx, built.kind(), &namespace)
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(built),
        )
        .await?;
    Ok(())
}

/// Deletes an infra machine (its own finalizer then removes the backend VM).
pub(crate) async fn delete(
    ctx: &Context,
    namespace: &str,
    existing: &Existing,
) -> Result<(), kube::Error> {
    match api(ctx, existing.kind, namespace)
        .delete(&existing.name, &DeleteParams::background())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(error) => Err(error),
    }
}

/// Whether an infra machine of this VM, of one of `kinds`, exists, asking the API
/// server (not the cache).
pub(crate) async fn exists_live(
    ctx: &Context,
    namespace: &str,
    name: &str,
    uid: &str,
    kinds: &[InfraMachineKind],
) -> Result<bool, kube::Error> {
    for &kind in kinds {
        if let Some(object) = api(ctx, kind, namespace).get_opt(name).await?
            && object.owner_references().iter().any(|o| o.uid == uid)
        {
            return Ok(true);
        }
    }
    Ok(false)
}
