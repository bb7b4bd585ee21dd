//! [`InfraMachineRead`]: what every infrastructure machine kind offers, so
//! controllers and status mirroring are written once for all of them.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::Serialize;

use crate::api::common::{LocalObjectReference, PowerState};
use crate::api::infra::{
    BootstrapDataRef, MachineStatus, cloud_hypervisor::CloudHypervisorMachine,
    libvirt::LibvirtMachine, proxmox::ProxmoxMachine, vsphere::VSphereMachine,
};
use crate::backend::MachineSpec;

/// Uniform read access to an infrastructure machine of any kind.
pub trait InfraMachineRead {
    /// Which kind this is.
    const KIND: InfraMachineKind;
    /// `spec.providerRef`.
    fn provider_ref(&self) -> Option<&LocalObjectReference>;
    /// `spec.providerID`, once set.
    fn provider_id(&self) -> Option<&str>;
    /// The desired power state.
    fn desired_power_state(&self) -> PowerState;
    /// `spec.bootstrap`, for machines no CAPI Machine owns.
    fn bootstrap(&self) -> Option<&BootstrapDataRef>;
    /// `status`, if written.
    fn machine_status(&self) -> Option<&MachineStatus>;
    /// The spec as the backend receives it.
    fn backend_spec(&self) -> MachineSpec;

    /// Whether `spec.providerID` is set and not empty: a backend VM was made for this
    /// machine (an empty string, as some tools write, names none).
    fn has_provider_id(&self) -> bool {
        self.provider_id().is_some_and(|id| !id.is_empty())
    }

    /// Whether `status` carries the `Ready` condition with status `True`.
    fn is_ready(&self) -> bool {
        self.machine_status().is_some_and(|status| {
            crate::conditions::is_true(&status.conditions, crate::conditions::types::READY)
        })
    }
}

/// An infrastructure machine kind: its name, plural and providerID scheme. Open like
/// [`crate::api::common::ProviderClass`]: banlieue's four are constants, a kind declared out of tree makes
/// its own with [`InfraMachineKind::new`] (see [`crate::contract::MachineKind`]). Which
/// class builds which kind is the [`crate::contract::KindTable`]'s.
///
/// A small `Copy` value; kinds compare, hash and order by name.
#[derive(Clone, Copy, Debug)]
pub struct InfraMachineKind {
    kind: &'static str,
    plural: &'static str,
    scheme: &'static str,
}

#[allow(non_upper_case_globals)] // named like the enum variants they replace
impl InfraMachineKind {
    /// `VSphereMachine`.
    pub const VSphere: Self = Self::new("VSphereMachine", "vspheremachines", "vsphere://");
    /// `ProxmoxMachine`.
    pub const Proxmox: Self = Self::new("ProxmoxMachine", "proxmoxmachines", "proxmox://");
    /// `LibvirtMachine`.
    pub const Libvirt: Self = Self::new("LibvirtMachine", "libvirtmachines", "libvirt://");
    /// `CloudHypervisorMachine`.
    pub const CloudHypervisor: Self = Self::new(
        "CloudHypervisorMachine",
        "cloudhypervisormachines",
        "cloud-hypervisor://",
    );
}

impl InfraMachineKind {
    /// banlieue's own kinds, in a stable order.
    pub const BUILT_IN: [InfraMachineKind; 4] = [
        Self::VSphere,
        Self::Proxmox,
        Self::Libvirt,
        Self::CloudHypervisor,
    ];

    /// A kind of group `infrastructure.banlieue.io`: its `kind`, its plural resource
    /// name and the scheme of its machines' providerIDs (e.g. `lab://`).
    pub const fn new(kind: &'static str, plural: &'static str, scheme: &'static str) -> Self {
        Self {
            kind,
            plural,
            scheme,
        }
    }

    /// The kind's name, e.g. `VSphereMachine`.
    pub fn kind(self) -> &'static str {
        self.kind
    }

    /// The kind's plural resource name.
    pub fn plural(self) -> &'static str {
        self.plural
    }

    /// One of banlieue's own kinds by name (kinds registered out of tree are found in
    /// the [`crate::backend::BackendRegistry`] that registered them).
    pub fn from_kind(kind: &str) -> Option<Self> {
        Self::BUILT_IN.into_iter().find(|k| k.kind == kind)
    }

    /// The providerID scheme of this kind, e.g. `vsphere://`.
    pub fn provider_id_scheme(self) -> &'static str {
        self.scheme
    }
}

impl PartialEq for InfraMachineKind {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind
    }
}

impl Eq for InfraMachineKind {}

impl std::hash::Hash for InfraMachineKind {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.kind.hash(state);
    }
}

impl PartialOrd for InfraMachineKind {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for InfraMachineKind {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.kind.cmp(other.kind)
    }
}

impl std::fmt::Display for InfraMachineKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.kind)
    }
}

macro_rules! infra_machine_read {
    ($ty:ty, $kind:expr, $variant:ident) => {
        impl InfraMachineRead for $ty {
            const KIND: InfraMachineKind = $kind;
            fn provider_ref(&self) -> Option<&LocalObjectReference> {
                self.spec.provider_ref.as_ref()
            }
            fn provider_id(&self) -> Option<&str> {
                self.spec.provider_id.as_deref()
            }
            fn desired_power_state(&self) -> PowerState {
                self.spec.power_state
            }
            fn bootstrap(&self) -> Option<&BootstrapDataRef> {
                self.spec.bootstrap.as_ref()
            }
            fn machine_status(&self) -> Option<&MachineStatus> {
                self.status.as_ref()
            }
            fn backend_spec(&self) -> MachineSpec {
                MachineSpec::$variant(self.spec.clone())
            }
        }
    };
}

infra_machine_read!(VSphereMachine, InfraMachineKind::VSphere, VSphere);
infra_machine_read!(ProxmoxMachine, InfraMachineKind::Proxmox, Proxmox);
infra_machine_read!(LibvirtMachine, InfraMachineKind::Libvirt, Libvirt);
infra_machine_read!(
    CloudHypervisorMachine,
    InfraMachineKind::CloudHypervisor,
    CloudHypervisor
);

/// An infrastructure machine of any kind, as built for a VirtualMachine: its kind, its
/// metadata and the rest of the object as JSON (what server-side apply sends).
#[derive(Clone, Debug, PartialEq)]
pub struct InfraMachine {
    kind: InfraMachineKind,
    metadata: ObjectMeta,
    /// The whole object but its metadata.
    body: serde_json::Value,
    /// The spec as the backend would receive it.
    spec: MachineSpec,
}

impl InfraMachine {
    /// `machine` as built, of kind `K`.
    pub fn of<K>(machine: &K) -> Result<Self, serde_json::Error>
    where
        K: InfraMachineRead + Resource + Serialize,
    {
        let mut body = serde_json::to_value(machine)?;
        if let Some(object) = body.as_object_mut() {
            object.remove("metadata");
        }
        Ok(Self {
            kind: K::KIND,
            metadata: machine.meta().clone(),
            body,
            spec: machine.backend_spec(),
        })
    }

    /// Which kind.
    pub fn kind(&self) -> InfraMachineKind {
        self.kind
    }

    /// Its metadata.
    pub fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    /// Its metadata, to change.
    pub fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }

    /// The spec as the backend would receive it.
    pub fn backend_spec(&self) -> MachineSpec {
        self.spec.clone()
    }

    /// The machine as its own type, when it is of kind `K`.
    pub fn typed<K>(&self) -> Option<K>
    where
        K: InfraMachineRead + serde::de::DeserializeOwned,
    {
        (self.kind == K::KIND)
            .then(|| serde_json::from_value(self.to_value()).ok())
            .flatten()
    }

    /// The whole object as JSON.
    pub fn to_value(&self) -> serde_json::Value {
        let mut value = self.body.clone();
        if let Some(object) = value.as_object_mut() {
            object.insert(
                "metadata".into(),
                serde_json::to_value(&self.metadata).unwrap_or_default(),
            );
        }
        value
    }
}

impl Serialize for InfraMachine {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.to_value().serialize(serializer)
    }
}
