//! The infra machine caches, across kinds: what a cached machine is reduced to for
//! each reader (the VM controller's [`Existing`], spreading's [`MachineSummary`], the
//! claims on a provider ID, the [`LeftBehind`] a Provider or machine would leave), and
//! the [`Slot`] through which each registered kind is reached once type-erased. Values
//! and cache reads only: no API calls, and nothing of the controllers' context.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;

use futures::future::{BoxFuture, Shared};
use kube::Client;
use kube::runtime::Controller;
use kube::runtime::reflector::Store;
use kube::{Resource, ResourceExt};
use serde_json::Value;
use tokio::sync::oneshot;

use super::ORPHAN_BACKEND_ANNOTATION;
use super::Settings;
use crate::api::common::{PowerState, TypedLocalObjectReference};
use crate::api::infra::MachineStatus;
use crate::api::virtual_machine::ScheduledPlacement;
use crate::api::{Provider, VirtualMachine};
use crate::backend::{MachineIdentity, MachineSpec};
use crate::builder::PlacementRecord;
use crate::contract::{InfraMachine, InfraMachineKind, InfraMachineRead};

/// The shutdown signal every controller shares.
pub(crate) type Shutdown = Shared<Pin<Box<dyn std::future::Future<Output = ()> + Send>>>;

/// One registered machine kind at run time: its cache and lookups, its watch, and
/// its controllers, which take the controllers' shared context `C` (generic here so
/// that the context can hold the slots without this module depending on it).
pub(crate) trait Slot<C>: Send + Sync {
    /// Which kind.
    fn kind(&self) -> InfraMachineKind;
    /// The cached machine `namespace/name`, when the VM `owner_uid` owns it.
    fn find(&self, namespace: &str, name: &str, owner_uid: &str) -> Option<Existing>;
    /// The cached machine's spec as its backend receives it.
    fn backend_spec(&self, namespace: &str, name: &str) -> Option<MachineSpec>;
    /// The cached machines other than `uid` that claim provider ID `id`, ranked.
    fn claiming(&self, id: &str, uid: &str) -> Vec<ClaimRank>;
    /// The cached machines (`Kind/name`) on Provider `provider` of `namespace`.
    fn on_provider(&self, namespace: &str, provider: &str) -> Vec<String>;
    /// The cached machines on Provider `provider` of `namespace`, as the backend VMs
    /// they would leave behind (see `orphan_backend`).
    fn left_on(&self, namespace: &str, provider: &str) -> Vec<LeftBehind>;
    /// Every cached machine, reduced for failure-domain spreading.
    fn summaries(&self) -> Vec<MachineSummary>;
    /// The kind's shared watch, which feeds the cache and the subscriptions, and the
    /// signal that it has listed once. `None` after the first call.
    fn feed(
        &self,
        client: &Client,
        settings: &Settings,
    ) -> Option<(BoxFuture<'static, ()>, oneshot::Receiver<()>)>;
    /// The kind's controllers. Empty after the first call.
    fn controllers(&self, ctx: Arc<C>, shutdown: Shutdown) -> Vec<BoxFuture<'static, ()>>;
    /// `controller`, also woken by this kind's machines (their owner is a VM).
    fn owned_by(&self, controller: Controller<VirtualMachine>) -> Controller<VirtualMachine>;
}

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

/// An infra machine of any kind, reduced to what failure-domain spreading needs.
pub(crate) struct MachineSummary {
    pub uid: String,
    pub namespace: Option<String>,
    pub labels: std::collections::BTreeMap<String, String>,
    pub failure_domain: Option<String>,
}

pub(crate) fn summaries<K>(store: &Store<K>) -> impl Iterator<Item = MachineSummary> + use<K>
where
    K: Resource<DynamicType = ()> + crate::contract::InfraMachineRead + Clone + 'static,
{
    store.state().into_iter().map(|m| MachineSummary {
        uid: m.uid().unwrap_or_default(),
        namespace: m.namespace(),
        labels: m.labels().clone(),
        failure_domain: m.machine_status().and_then(|s| s.failure_domain.clone()),
    })
}

/// The cached infra machines of `store` in `namespace` that run, or may run, on
/// Provider `provider`: named by `spec.providerRef`, or (CAPI machines) landed in one
/// of its failure domains.
pub(crate) fn machines_on_provider<'a, K>(
    store: &Store<K>,
    namespace: &'a str,
    provider: &'a str,
) -> impl Iterator<Item = Arc<K>> + use<'a, K>
where
    K: Resource<DynamicType = ()> + crate::contract::InfraMachineRead + Clone + 'static,
{
    store
        .state()
        .into_iter()
        .filter(move |m| m.namespace().as_deref() == Some(namespace))
        .filter(move |m| {
            m.provider_ref().is_some_and(|r| r.name == provider)
                || m.machine_status()
                    .and_then(|s| s.failure_domain.as_deref())
                    .and_then(crate::capi::failure_domains::split_name)
                    .is_some_and(|(p, _)| p == provider)
        })
}

/// [`machines_on_provider`], as `Kind/name`.
pub(crate) fn on_provider<K>(store: &Store<K>, namespace: &str, provider: &str) -> Vec<String>
where
    K: Resource<DynamicType = ()> + crate::contract::InfraMachineRead + Clone + 'static,
{
    machines_on_provider(store, namespace, provider)
        .map(|m| format!("{}/{}", K::kind(&()), m.name_any()))
        .collect()
}

/// How a machine claiming a provider ID ranks: a provisioned machine (the backend gave
/// it the ID) before one that was only given it, then the older, then by name.
pub(crate) type ClaimRank = (bool, Option<k8s_openapi::jiff::Timestamp>, String);

/// The rank of a machine's claim on its provider ID (see [`ClaimRank`]).
pub(crate) fn claim_rank<K>(machine: &K) -> ClaimRank
where
    K: Resource<DynamicType = ()> + crate::contract::InfraMachineRead,
{
    let provisioned = machine
        .machine_status()
        .and_then(|s| s.initialization.as_ref())
        .and_then(|i| i.provisioned)
        .unwrap_or(false);
    (
        !provisioned,
        machine.meta().creation_timestamp.as_ref().map(|t| t.0),
        format!(
            "{}/{}/{}",
            K::kind(&()),
            machine.namespace().unwrap_or_default(),
            machine.name_any()
        ),
    )
}

/// Whether `machine`, cached, claims provider ID `id` against the machine `uid`: it is
/// another machine, has that ID, and is not being deleted.
pub(crate) fn claims<K>(machine: &K, id: &str, uid: &str) -> bool
where
    K: Resource<DynamicType = ()> + crate::contract::InfraMachineRead,
{
    machine.provider_id() == Some(id)
        && machine.uid().as_deref() != Some(uid)
        && machine.meta().deletion_timestamp.is_none()
}

/// A backend VM left behind, as a human finds it again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LeftBehind {
    /// The infra machine's kind.
    pub kind: String,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its UID (the backend's key for the VM: libvirt domain UUID, the VM's
    /// `banlieue.io` tag or description on vSphere and Proxmox).
    pub uid: String,
    /// `spec.providerID`, when the backend reported one.
    pub provider_id: Option<String>,
    /// `status.backendRef`: moref, `node/vmid`, domain name, API socket.
    pub backend_ref: Option<String>,
    /// The Provider it ran on (empty when unknown).
    pub provider: String,
    /// Whether the machine is being deleted.
    pub deleting: bool,
}

impl LeftBehind {
    /// What `machine` leaves behind on Provider `provider`.
    pub fn of<K>(machine: &K, provider: &str) -> Self
    where
        K: InfraMachineRead + kube::Resource<DynamicType = ()>,
    {
        let status = machine.machine_status();
        Self {
            kind: K::kind(&()).into_owned(),
            namespace: machine.namespace().unwrap_or_default(),
            name: machine.name_any(),
            uid: machine.uid().unwrap_or_default(),
            provider_id: machine
                .provider_id()
                .filter(|id| !id.is_empty())
                .map(str::to_owned),
            backend_ref: status.and_then(|s| s.backend_ref.clone()),
            provider: provider.to_owned(),
            deleting: machine.meta().deletion_timestamp.is_some(),
        }
    }

    /// The machine, as an Event's `related` object.
    pub(crate) fn reference(&self) -> k8s_openapi::api::core::v1::ObjectReference {
        k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some(format!(
                "{}/{}",
                crate::api::INFRA_GROUP,
                crate::api::VERSION
            )),
            kind: Some(self.kind.clone()),
            namespace: Some(self.namespace.clone()),
            name: Some(self.name.clone()),
            uid: Some(self.uid.clone()),
            ..Default::default()
        }
    }

    /// One line naming the VM: what to search for on the hypervisor.
    pub fn describe(&self) -> String {
        format!(
            "providerID {}, backend {}, Provider {}, machine {}/{}/{} (UID {})",
            self.provider_id.as_deref().unwrap_or("(none recorded)"),
            self.backend_ref.as_deref().unwrap_or("(none recorded)"),
            if self.provider.is_empty() {
                "(unknown)"
            } else {
                &self.provider
            },
            self.kind,
            self.namespace,
            self.name,
            self.uid
        )
    }

    /// Logs it as left behind, by `by` (what asked).
    pub(crate) fn log(&self, by: &str) {
        tracing::warn!(
            provider_id = self.provider_id.as_deref().unwrap_or(""),
            backend_ref = self.backend_ref.as_deref().unwrap_or(""),
            provider = %self.provider,
            kind = %self.kind,
            namespace = %self.namespace,
            name = %self.name,
            uid = %self.uid,
            by,
            "backend VM abandoned ({ORPHAN_BACKEND_ANNOTATION}): it is not deleted and no longer managed; delete it on the hypervisor by hand if it should go"
        );
    }
}
