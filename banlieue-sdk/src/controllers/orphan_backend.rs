//! The escape hatch for what cannot be cleaned up: the annotation
//! [`ORPHAN_BACKEND_ANNOTATION`](super::ORPHAN_BACKEND_ANNOTATION) `: "true"`.
//!
//! - On an infra machine being deleted: its finalizer goes without the backend delete
//!   (a backend that refuses it: bad credentials, a locked VM; or its Provider gone).
//! - On a VirtualMachine being deleted: its infra machines get the annotation, and go
//!   the same way.
//! - On a Provider being deleted while machines are still on it: it lets go. The
//!   machines being deleted get the annotation (they would otherwise wait for the
//!   Provider forever); the others stay, their VMs running and no longer managed
//!   (`ProviderNotFound`) until the Provider is recreated.
//!
//! Whatever the object, every backend VM left behind is named, with what a human
//! needs to find it (providerID, backend handle, Provider, the machine's
//! kind/namespace/name/UID), in a Warning Event (`BackendVMAbandoned`) and a warning
//! log line. Nothing else forgets a VM: without the annotation a machine whose VM may
//! exist keeps its finalizer.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::EventType;
use serde_json::json;

use super::ORPHAN_BACKEND_ANNOTATION;
use super::context::Context;
pub(crate) use super::machine_cache::LeftBehind;
use crate::contract::InfraMachineRead;

/// Reason of the Events naming a backend VM left behind.
pub(crate) const ABANDONED: &str = "BackendVMAbandoned";

/// Field manager of the annotation when banlieue passes it on.
const FIELD_MANAGER: &str = "banlieue-orphan-backend";

/// Whether `annotations` ask to leave the backend behind (the value `"true"`).
pub(crate) fn requested_in(annotations: &BTreeMap<String, String>) -> bool {
    annotations
        .get(ORPHAN_BACKEND_ANNOTATION)
        .is_some_and(|v| v.trim() == "true")
}

/// Whether the object asks to leave its backend behind.
pub(crate) fn requested(meta: &ObjectMeta) -> bool {
    meta.annotations.as_ref().is_some_and(requested_in)
}

/// The note of the Event on a machine that lets go without its backend delete.
pub(crate) fn machine_note(left: &LeftBehind) -> String {
    format!(
        "{ORPHAN_BACKEND_ANNOTATION}: the backend VM is left behind, not deleted: {}. Delete it on the hypervisor by hand if it should go",
        left.describe()
    )
}

/// The note of the Event on a Provider that lets go, for one VM it leaves.
pub(crate) fn provider_note(provider: &str, left: &LeftBehind) -> String {
    let what = if left.deleting {
        "its machine goes without deleting it"
    } else {
        "its machine stays, unmanaged (ProviderNotFound) until the Provider is recreated"
    };
    format!(
        "{ORPHAN_BACKEND_ANNOTATION}: Provider {provider} lets go; the backend VM is left behind ({what}): {}",
        left.describe()
    )
}

/// A machine asked to go without its backend delete: the Event and log line naming
/// its VM. The caller then lets it go.
pub(crate) async fn abandon_machine<K>(machine: &K, ctx: &Context, provider: &str)
where
    K: InfraMachineRead + kube::Resource<DynamicType = ()>,
{
    let left = LeftBehind::of(machine, provider);
    left.log("machine");
    ctx.event(
        machine,
        EventType::Warning,
        ABANDONED,
        "Delete",
        machine_note(&left),
    )
    .await;
}

/// Passes the annotation to infra machine `kind`/`name`, unless it is gone.
pub(crate) async fn mark(
    ctx: &Context,
    kind: &str,
    namespace: &str,
    name: &str,
) -> Result<(), kube::Error> {
    let Some(kind) = ctx.kinds.get(kind).map(|entry| entry.kind()) else {
        return Ok(());
    };
    let api = super::infra::api(ctx, kind, namespace);
    let patch = json!({"metadata": {"annotations": {ORPHAN_BACKEND_ANNOTATION: "true"}}});
    match api
        .patch(
            name,
            &PatchParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..PatchParams::default()
            },
            &Patch::Merge(patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(error) => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn left(deleting: bool) -> LeftBehind {
        LeftBehind {
            kind: "LibvirtMachine".into(),
            namespace: "ns".into(),
            name: "web-1".into(),
            uid: "u-1".into(),
            provider_id: Some("libvirt://u-1".into()),
            backend_ref: Some("ns.web-1".into()),
            provider: "lab".into(),
            deleting,
        }
    }

    #[test]
    fn only_true_asks() {
        let with = |v: &str| BTreeMap::from([(ORPHAN_BACKEND_ANNOTATION.to_owned(), v.to_owned())]);
        assert!(requested_in(&with("true")));
        assert!(requested_in(&with(" true ")));
        for no in ["", "false", "yes", "True1"] {
            assert!(!requested_in(&with(no)), "{no:?}");
        }
        assert!(!requested_in(&BTreeMap::new()));
        assert!(!requested(&ObjectMeta::default()));
    }

    #[test]
    fn the_notes_name_everything_a_human_needs_to_find_the_vm() {
        let note = machine_note(&left(true));
        for part in [
            "providerID libvirt://u-1",
            "backend ns.web-1",
            "Provider lab",
            "LibvirtMachine/ns/web-1",
            "UID u-1",
            "not deleted",
        ] {
            assert!(note.contains(part), "{part:?} in {note}");
        }
        let mut unknown = left(false);
        unknown.provider_id = None;
        unknown.backend_ref = None;
        unknown.provider = String::new();
        let note = provider_note("lab", &unknown);
        assert!(note.contains("providerID (none recorded)"), "{note}");
        assert!(note.contains("Provider (unknown)"), "{note}");
        assert!(note.contains("until the Provider is recreated"), "{note}");
        assert!(provider_note("lab", &left(true)).contains("goes without deleting it"));
    }
}
