//! The kind table: every infrastructure machine kind is declared once, as a type that
//! implements [`MachineKind`] (its API type, how it is built from a VirtualMachine,
//! its contract accessors through [`InfraMachineRead`], its CRD through
//! [`kube::CustomResourceExt`]), and registered with the backend class that builds it
//! ([`crate::backend::BackendRegistry::register_kind`]). The controllers run for the
//! registered kinds only.

use std::collections::BTreeMap;
use std::fmt::Debug;

use k8s_openapi::NamespaceResourceScope;
use kube::{CustomResourceExt, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{InfraMachine, InfraMachineKind, InfraMachineRead};
use crate::api::common::ProviderClass;
use crate::builder::{BuildError, Parts};

/// An infrastructure machine kind, declared once: banlieue's four and any declared
/// out of tree (group `infrastructure.banlieue.io`, namespaced, with the shared
/// [`crate::api::infra::MachineStatus`]).
pub trait MachineKind:
    InfraMachineRead
    + Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + CustomResourceExt
    + Clone
    + Debug
    + Serialize
    + DeserializeOwned
    + Send
    + Sync
    + 'static
{
    /// This kind's machine for a scheduled VirtualMachine, from what the builder
    /// resolved (metadata, owner, Provider reference, targets, bootstrap reference).
    /// An error names what to fix; it becomes the VM's `Scheduled=False` reason.
    fn build(parts: &Parts<'_>) -> Result<Self, BuildError>;
}

/// One row of the kind table: the kind and what the runtime does with it.
#[derive(Clone)]
pub struct KindEntry {
    kind: InfraMachineKind,
    build: fn(&Parts<'_>) -> Result<InfraMachine, BuildError>,
    #[cfg(feature = "controllers")]
    pub(crate) runtime: crate::controllers::kinds::Runtime,
}

impl KindEntry {
    /// The entry of kind `K`.
    pub fn of<K: MachineKind>() -> Self {
        Self {
            kind: K::KIND,
            build: build_erased::<K>,
            #[cfg(feature = "controllers")]
            runtime: crate::controllers::kinds::Runtime::of::<K>(),
        }
    }

    /// The kind.
    pub fn kind(&self) -> InfraMachineKind {
        self.kind
    }

    /// Builds this kind's machine.
    pub fn build(&self, parts: &Parts<'_>) -> Result<InfraMachine, BuildError> {
        (self.build)(parts)
    }
}

impl Debug for KindEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.kind.kind())
    }
}

fn build_erased<K: MachineKind>(parts: &Parts<'_>) -> Result<InfraMachine, BuildError> {
    let machine = K::build(parts)?;
    InfraMachine::of(&machine).map_err(|e| {
        BuildError::new(
            "InvalidMachine",
            format!("the {} built does not serialize: {e}", K::KIND),
        )
    })
}

/// The machine kinds an operator serves, and the class whose Providers build each.
#[derive(Clone, Debug, Default)]
pub struct KindTable {
    entries: Vec<KindEntry>,
    by_class: BTreeMap<ProviderClass, InfraMachineKind>,
}

impl KindTable {
    /// Serves kind `K`, built by Providers of `class` (`None`: built only by `sim`
    /// Providers whose `machineKind` setting names it). Registering a kind again
    /// replaces nothing but adds the class.
    pub fn register<K: MachineKind>(&mut self, class: Option<ProviderClass>) -> &mut Self {
        if self.get(K::KIND.kind()).is_none() {
            self.entries.push(KindEntry::of::<K>());
        }
        if let Some(class) = class {
            self.by_class.insert(class, K::KIND);
        }
        self
    }

    /// The entry of the kind named `kind`.
    pub fn get(&self, kind: &str) -> Option<&KindEntry> {
        self.entries.iter().find(|e| e.kind.kind() == kind)
    }

    /// Every registered kind, in registration order.
    pub fn entries(&self) -> &[KindEntry] {
        &self.entries
    }

    /// Every registered kind.
    pub fn kinds(&self) -> impl Iterator<Item = InfraMachineKind> + '_ {
        self.entries.iter().map(|e| e.kind)
    }

    /// The kind Providers of `class` build, when one is registered for it.
    pub fn for_class(&self, class: ProviderClass) -> Option<InfraMachineKind> {
        self.by_class.get(&class).copied()
    }

    /// banlieue's four kinds, each built by its own class and by `sim`: the table of an
    /// operator with every built-in backend registered.
    pub fn built_in() -> Self {
        let mut table = Self::default();
        for class in ProviderClass::ALL {
            table.register_built_in(class);
        }
        table
    }

    /// Registers the kinds banlieue's own backend class `class` builds: its own, or
    /// for `sim` all four (a `sim` Provider's `machineKind` setting picks one).
    pub(crate) fn register_built_in(&mut self, class: ProviderClass) -> &mut Self {
        use crate::api::infra::{
            cloud_hypervisor as ch, libvirt as lv, proxmox as px, vsphere as vs,
        };
        match class {
            ProviderClass::Vsphere => self.register::<vs::VSphereMachine>(Some(class)),
            ProviderClass::Proxmox => self.register::<px::ProxmoxMachine>(Some(class)),
            ProviderClass::Libvirt => self.register::<lv::LibvirtMachine>(Some(class)),
            ProviderClass::CloudHypervisor => {
                self.register::<ch::CloudHypervisorMachine>(Some(class))
            }
            ProviderClass::Sim => self
                .register::<vs::VSphereMachine>(None)
                .register::<px::ProxmoxMachine>(None)
                .register::<lv::LibvirtMachine>(None)
                .register::<ch::CloudHypervisorMachine>(None),
            _ => self,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(table: &KindTable) -> Vec<&'static str> {
        table.kinds().map(InfraMachineKind::kind).collect()
    }

    #[test]
    fn a_built_in_class_registers_its_own_kind_and_sim_all_four() {
        let mut table = KindTable::default();
        table.register_built_in(ProviderClass::Vsphere);
        assert_eq!(names(&table), ["VSphereMachine"]);
        assert_eq!(
            table.for_class(ProviderClass::Vsphere),
            Some(InfraMachineKind::VSphere)
        );
        assert_eq!(table.for_class(ProviderClass::Proxmox), None);

        table.register_built_in(ProviderClass::Sim);
        assert_eq!(
            names(&table),
            [
                "VSphereMachine",
                "ProxmoxMachine",
                "LibvirtMachine",
                "CloudHypervisorMachine"
            ],
            "each kind once, in registration order"
        );
        assert_eq!(
            table.for_class(ProviderClass::Sim),
            None,
            "sim builds the kind its setting names"
        );
        assert_eq!(
            table.for_class(ProviderClass::Proxmox),
            None,
            "registered for sim is not registered for the proxmox class"
        );
    }

    #[test]
    fn a_class_of_its_own_registers_nothing_by_itself() {
        let mut table = KindTable::default();
        table.register_built_in(ProviderClass::new("lab").unwrap());
        assert!(names(&table).is_empty());
    }

    #[test]
    fn the_built_in_table_serves_every_built_in_class() {
        let table = KindTable::built_in();
        for (class, kind) in [
            (ProviderClass::Vsphere, InfraMachineKind::VSphere),
            (ProviderClass::Proxmox, InfraMachineKind::Proxmox),
            (ProviderClass::Libvirt, InfraMachineKind::Libvirt),
            (
                ProviderClass::CloudHypervisor,
                InfraMachineKind::CloudHypervisor,
            ),
        ] {
            assert_eq!(table.for_class(class), Some(kind), "{class}");
            assert!(table.get(kind.kind()).is_some());
        }
        assert!(table.get("LabMachine").is_none());
    }
}
