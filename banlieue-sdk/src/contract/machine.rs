//! [`InfraMachineRead`]: what every infrastructure machine kind offers, so
//! controllers and status mirroring are written once for all of them.

use kube::Resource;
use serde::Serialize;

use crate::api::common::{LocalObjectReference, PowerState, ProviderClass};
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
}

/// The four infrastructure machine kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum InfraMachineKind {
    /// `VSphereMachine`.
    VSphere,
    /// `ProxmoxMachine`.
    Proxmox,
    /// `LibvirtMachine`.
    Libvirt,
    /// `CloudHypervisorMachine`.
    CloudHypervisor,
}

impl InfraMachineKind {
    /// Every kind.
    pub const ALL: [InfraMachineKind; 4] = [
        Self::VSphere,
        Self::Proxmox,
        Self::Libvirt,
        Self::CloudHypervisor,
    ];

    /// The kind's name, e.g. `VSphereMachine`.
    pub fn kind(self) -> &'static str {
        match self {
            Self::VSphere => "VSphereMachine",
            Self::Proxmox => "ProxmoxMachine",
            Self::Libvirt => "LibvirtMachine",
            Self::CloudHypervisor => "CloudHypervisorMachine",
        }
    }

    /// The kind's plural resource name.
    pub fn plural(self) -> &'static str {
        match self {
            Self::VSphere => "vspheremachines",
            Self::Proxmox => "proxmoxmachines",
            Self::Libvirt => "libvirtmachines",
            Self::CloudHypervisor => "cloudhypervisormachines",
        }
    }

    /// By name, e.g. from a Provider setting.
    pub fn from_kind(kind: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.kind() == kind)
    }

    /// The kind a real backend class builds. `sim` has none of its own: it serves
    /// whichever kind the Provider's `machineKind` setting names.
    pub fn for_class(class: ProviderClass) -> Option<Self> {
        match class {
            ProviderClass::Vsphere => Some(Self::VSphere),
            ProviderClass::Proxmox => Some(Self::Proxmox),
            ProviderClass::Libvirt => Some(Self::Libvirt),
            ProviderClass::CloudHypervisor => Some(Self::CloudHypervisor),
            // `sim`, and classes registered out of tree.
            _ => None,
        }
    }

    /// The providerID scheme of this kind, e.g. `vsphere://`.
    pub fn provider_id_scheme(self) -> &'static str {
        match self {
            Self::VSphere => "vsphere://",
            Self::Proxmox => "proxmox://",
            Self::Libvirt => "libvirt://",
            Self::CloudHypervisor => "cloud-hypervisor://",
        }
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

/// An infrastructure machine of any kind, as built for a VirtualMachine.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum InfraMachine {
    /// A `VSphereMachine`.
    VSphere(VSphereMachine),
    /// A `ProxmoxMachine`.
    Proxmox(ProxmoxMachine),
    /// A `LibvirtMachine`.
    Libvirt(LibvirtMachine),
    /// A `CloudHypervisorMachine`.
    CloudHypervisor(CloudHypervisorMachine),
}

impl InfraMachine {
    /// Which kind.
    pub fn kind(&self) -> InfraMachineKind {
        match self {
            Self::VSphere(_) => InfraMachineKind::VSphere,
            Self::Proxmox(_) => InfraMachineKind::Proxmox,
            Self::Libvirt(_) => InfraMachineKind::Libvirt,
            Self::CloudHypervisor(_) => InfraMachineKind::CloudHypervisor,
        }
    }

    /// Its metadata.
    pub fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        match self {
            Self::VSphere(m) => m.meta(),
            Self::Proxmox(m) => m.meta(),
            Self::Libvirt(m) => m.meta(),
            Self::CloudHypervisor(m) => m.meta(),
        }
    }

    /// Its metadata, to change.
    pub fn meta_mut(&mut self) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        match self {
            Self::VSphere(m) => m.meta_mut(),
            Self::Proxmox(m) => m.meta_mut(),
            Self::Libvirt(m) => m.meta_mut(),
            Self::CloudHypervisor(m) => m.meta_mut(),
        }
    }

    /// The spec as the backend would receive it.
    pub fn backend_spec(&self) -> MachineSpec {
        match self {
            Self::VSphere(m) => m.backend_spec(),
            Self::Proxmox(m) => m.backend_spec(),
            Self::Libvirt(m) => m.backend_spec(),
            Self::CloudHypervisor(m) => m.backend_spec(),
        }
    }
}
