//! Finding, comparing, applying and deleting a VM's infrastructure machine, whatever
//! its kind.

use std::collections::BTreeMap;
use std::sync::Arc;

use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::Value;

use super::context::Context;
use crate::api::Provider;
use crate::api::common::PowerState;
use crate::api::common::TypedLocalObjectReference;
use crate::api::infra::MachineStatus;
use crate::api::virtual_machine::ScheduledPlacement;
use crate::backend::{MachineIdentity, MachineRequest};
use crate::build::PlacementRecord;
use crate::contract::{InfraMachine, InfraMachineKind, InfraMachineRead};

/// Field manager of the infra machines the VM controller builds.
pub(crate) const FIELD_MANAGER: &str = "banlieue-virtualmachine";

/// An existing infra machine, reduced to what the VM controller needs.
#[derive(Clone, Debug)]
pub(crate) struct Existing {
    pub kind: InfraMachineKind,
    pub name: String,
    /// Where it was placed, as it records it ([`PlacementRecord`]).
    pub provider: Option<String>,
    /// The failure domain of its [`PlacementRecord`].
    pub failure_domain: Option<String>,
    pub deleting: bool,
    pub provider_id: Option<String>,
    pub status: Option<MachineStatus>,
    pub uid: String,
    pub desired_power: PowerState,
    pub annotations: BTreeMap<String, String>,
    /// `spec` without `providerID` (which the machine controller owns), plus the labels
    /// and annotations, for comparing with what the builder wants.
    comparable: Value,
}

impl Existing {
    pub fn reference(&self) -> TypedLocalObjectReference {
        TypedLocalObjectReference {
            api_group: crate::api::INFRA_GROUP.into(),
            kind: self.kind.kind().into(),
            name: self.name.clone(),
        }
    }

    /// The placement this machine records (see [`crate::scheduling::placement_of_machine`]).
    pub fn placement(&self, providers: &[Provider]) -> Option<ScheduledPlacement> {
        crate::scheduling::placement_of_machine(
            providers,
            self.provider.as_deref()?,
            self.failure_domain.as_deref(),
        )
    }

    /// Its identity for its backend.
    pub fn identity(&self, namespace: &str) -> MachineIdentity {
        MachineIdentity {
            uid: self.uid.clone(),
            namespace: namespace.to_owned(),
            name: self.name.clone(),
            provider_id: self.provider_id.clone().filter(|id| !id.is_empty()),
        }
    }

    /// True when `built` would change nothing we own.
    pub fn matches(&self, built: &InfraMachine) -> bool {
        comparable(&serde_json::to_value(built).unwrap_or_default()) == self.comparable
    }
}

#[cfg(test)]
impl Existing {
    /// A machine of `kind` named `name` on `provider`, for the plans' tests.
    pub fn sample(
        kind: InfraMachineKind,
        name: &str,
        provider: Option<&str>,
        deleting: bool,
    ) -> Self {
        Existing {
            kind,
            name: name.to_owned(),
            provider: provider.map(str::to_owned),
            failure_domain: None,
            deleting,
            provider_id: None,
            status: None,
            uid: format!("uid-{name}"),
            desired_power: PowerState::default(),
            annotations: BTreeMap::new(),
            comparable: Value::Null,
        }
    }
}

fn comparable(object: &Value) -> Value {
    let mut spec = object.get("spec").cloned().unwrap_or_default();
    if let Some(map) = spec.as_object_mut() {
        map.remove("providerID");
    }
    let meta = &object["metadata"];
    serde_json::json!({"spec": spec, "labels": meta["labels"], "annotations": meta["annotations"]})
}

pub(crate) fn existing<K>(object: Arc<K>, owner_uid: &str) -> Option<Existing>
where
    K: Resource<DynamicType = ()> + InfraMachineRead + serde::Serialize,
{
    let owned = object.owner_references().iter().any(|o| o.uid == owner_uid);
    if !owned {
        return None;
    }
    let value = serde_json::to_value(object.as_ref()).ok()?;
    let comparable = comparable(&value);
    let record = PlacementRecord::read(object.provider_ref(), object.meta());
    let (provider, failure_domain) = match record {
        Some(r) => (Some(r.provider), r.failure_domain),
        None => (None, None),
    };
    Some(Existing {
        kind: K::KIND,
        name: object.name_any(),
        provider,
        failure_domain,
        deleting: object.meta().deletion_timestamp.is_some(),
        provider_id: object.provider_id().map(str::to_owned),
        status: object.machine_status().cloned(),
        uid: object.uid().unwrap_or_default(),
        desired_power: object.desired_power_state(),
        annotations: object.annotations().clone(),
        comparable,
    })
}

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
