//! Building the infrastructure machine for a scheduled VirtualMachine: a pure
//! function from the VM, its class and image, the chosen Provider and placement to
//! a fully resolved `*Machine` object.

mod class_record;
mod kinds;
mod names;
mod placement;
mod targets;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::api::common::{LocalObjectReference, PowerState, ProviderClass};
use crate::api::infra::BootstrapDataRef;
use crate::api::{Provider, VMClassSpec, VMImage, VirtualMachine};
use crate::contract::{InfraMachine, InfraMachineKind, KindTable};
use crate::scheduling::Target;

pub use class_record::{CLASS_ANNOTATION, ClassRecord};
pub use placement::PlacementRecord;
pub use targets::{ResolvedNetwork, Targets};

pub use names::{MAX_LABEL_VALUE, bootstrap_secret_name, label_value, suffixed_name};

/// Label on infra machines naming the VirtualMachine they realise ([`label_value`] of
/// its name: a prefix and a hash past 63 characters).
pub const VIRTUAL_MACHINE_LABEL: &str = "banlieue.io/virtual-machine";
/// Label on infra machines naming the Provider they run on ([`label_value`] of its
/// name; `spec.providerRef` has the name itself), for selectors: never read back
/// (see [`PlacementRecord`]).
pub const PROVIDER_LABEL: &str = "banlieue.io/provider";
/// Annotation on infra machines built for a VM: the failure domain to place it in
/// (CAPI-owned machines take it from their Machine instead); half of the
/// [`PlacementRecord`].
pub const FAILURE_DOMAIN_ANNOTATION: &str = "banlieue.io/failure-domain";
/// Annotation on an infra machine made on disks copied from another (`CopyDisk`): the
/// cloud-init `instance-id` it keeps, the source's, so the guest's first boot does not
/// run again.
pub const INSTANCE_ID_ANNOTATION: &str = "banlieue.io/instance-id";
/// Annotation on an infra machine made on disks copied from another (`CopyDisk`): the
/// machine they came from (`<Kind>/<name> on <Provider>`). Its backend creates it on
/// the imported disks, never from the image.
pub const COPIED_FROM_ANNOTATION: &str = "banlieue.io/copied-from";
/// Annotation on an infra machine whose disks are still being copied in (`CopyDisk`):
/// its controller creates nothing until it goes. The value names the source machine.
pub const IMPORTING_DISKS_ANNOTATION: &str = "banlieue.io/importing-disks";
/// The Provider setting that picks which kind a `sim` Provider builds.
pub const SIM_MACHINE_KIND_SETTING: &str = "machineKind";

/// What the builder needs.
#[derive(Clone, Copy, Debug)]
pub struct Input<'a> {
    /// The VirtualMachine (with `metadata.uid`).
    pub vm: &'a VirtualMachine,
    /// Its class.
    pub class: &'a VMClassSpec,
    /// Its image.
    pub image: &'a VMImage,
    /// The Provider it was scheduled onto.
    pub provider: &'a Provider,
    /// The placement.
    pub target: &'a Target,
    /// The Secret holding the VM's bootstrap data in CAPI's shape (`value`,
    /// `format`, `network-config`), when it has any.
    pub bootstrap_secret: Option<&'a str>,
}

/// Why a machine cannot be built; surfaced on the VM's `Scheduled` condition.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct BuildError {
    /// CamelCase reason.
    pub reason: &'static str,
    /// What to fix.
    pub message: String,
}

impl BuildError {
    /// An error with `reason` (CamelCase) and a message that says what to fix.
    pub fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
        }
    }
}

/// The kind a Provider builds: the one registered for its class, or for `sim` the
/// `machineKind` setting (default `LibvirtMachine`), one of banlieue's own kinds.
pub fn machine_kind(
    provider: &Provider,
    kinds: &KindTable,
) -> Result<InfraMachineKind, BuildError> {
    if let Some(kind) = kinds.for_class(provider.spec.class) {
        return Ok(kind);
    }
    if provider.spec.class != ProviderClass::Sim {
        return Err(BuildError::new(
            "NoMachineKind",
            format!(
                "class {} has no infrastructure machine kind registered in this operator",
                provider.spec.class
            ),
        ));
    }
    let name = provider
        .spec
        .settings
        .get(SIM_MACHINE_KIND_SETTING)
        .map(String::as_str)
        .unwrap_or(InfraMachineKind::Libvirt.kind());
    InfraMachineKind::from_kind(name)
        .filter(|kind| kinds.get(kind.kind()).is_some())
        .ok_or_else(|| {
            let served: Vec<&str> = kinds
                .kinds()
                .filter(|k| InfraMachineKind::from_kind(k.kind()).is_some())
                .map(InfraMachineKind::kind)
                .collect();
            BuildError::new(
                "InvalidProviderSettings",
                format!(
                    "settings.machineKind {name} is not one of {}",
                    served.join(", ")
                ),
            )
        })
}

/// What every machine kind is built from: the VM's inputs and what the builder
/// resolved for it (metadata with owner and labels, Provider reference, the class
/// names resolved to the Provider's targets, the bootstrap reference).
#[derive(Clone, Debug)]
pub struct Parts<'a> {
    /// The VM, its class, image, Provider and placement.
    pub input: &'a Input<'a>,
    /// The machine's metadata: the VM's name and namespace, its labels plus banlieue's,
    /// the failure domain annotation, the VM as controlling owner.
    pub metadata: ObjectMeta,
    /// `spec.providerRef`: the Provider it was placed on.
    pub provider_ref: Option<LocalObjectReference>,
    /// The VM's desired power state.
    pub power_state: PowerState,
    /// The VM's change policy.
    pub change_policy: crate::api::resources::ChangePolicy,
    /// The bootstrap data reference, when the VM has bootstrap data.
    pub bootstrap: Option<BootstrapDataRef>,
    /// The class's OS disk size.
    pub disk_gib: Option<u32>,
    /// Storage and network classes resolved to the Provider's targets, and the failure
    /// domain's location.
    pub targets: Targets,
}

impl Parts<'_> {
    /// The failure domain's location value `key` (e.g. `datacenter`, `node`).
    pub fn location(&self, key: &str) -> Option<String> {
        self.targets.location.get(key).cloned()
    }
}

/// Builds the infra machine for `input.vm`, of the kind its Provider builds.
pub fn infra_machine(input: &Input<'_>, kinds: &KindTable) -> Result<InfraMachine, BuildError> {
    let kind = machine_kind(input.provider, kinds)?;
    let entry = kinds
        .get(kind.kind())
        .ok_or_else(|| BuildError::new("NoMachineKind", format!("{kind} is not registered")))?;
    entry.build(&parts(input)?)
}

/// The parts every kind is built from.
pub fn parts<'a>(input: &'a Input<'a>) -> Result<Parts<'a>, BuildError> {
    let targets = Targets::resolve(input)?;
    let metadata = metadata(input)?;
    let bootstrap = input.bootstrap_secret.map(|secret| BootstrapDataRef {
        data_secret_name: secret.to_owned(),
        format: input
            .vm
            .spec
            .bootstrap
            .as_ref()
            .map(|b| b.format)
            .unwrap_or_default(),
    });
    Ok(Parts {
        input,
        metadata,
        provider_ref: Some(PlacementRecord::of(input.target).provider_ref()),
        power_state: input.vm.spec.power_state,
        change_policy: input.vm.spec.change_policy,
        bootstrap,
        disk_gib: Some(input.class.disk.size_gib),
        targets,
    })
}

fn metadata(input: &Input<'_>) -> Result<ObjectMeta, BuildError> {
    let vm = input.vm;
    let name = vm.metadata.name.clone().ok_or_else(|| {
        BuildError::new("InvalidVirtualMachine", "the VirtualMachine has no name")
    })?;
    let uid = vm.metadata.uid.clone().ok_or_else(|| {
        BuildError::new("InvalidVirtualMachine", "the VirtualMachine has no uid yet")
    })?;
    let mut labels: BTreeMap<String, String> = vm.metadata.labels.clone().unwrap_or_default();
    labels.insert(VIRTUAL_MACHINE_LABEL.into(), label_value(&name));
    let mut annotations = BTreeMap::new();
    PlacementRecord::of(input.target).write(&mut labels, &mut annotations);
    let annotations = (!annotations.is_empty()).then_some(annotations);
    Ok(ObjectMeta {
        name: Some(name.clone()),
        namespace: vm.metadata.namespace.clone(),
        labels: Some(labels),
        annotations,
        owner_references: Some(vec![OwnerReference {
            api_version: "banlieue.io/v1alpha1".into(),
            kind: "VirtualMachine".into(),
            name,
            uid,
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]),
        ..Default::default()
    })
}

/// The sim image source's name, which a `sim` Provider builds any kind from.
pub(crate) fn sim_name(input: &Input<'_>) -> String {
    input
        .image
        .spec
        .sources
        .sim
        .as_ref()
        .map(|s| s.name.clone())
        .unwrap_or_else(|| "image".into())
}

impl ResolvedNetwork {
    /// The first of `keys` the network class's target has.
    pub fn one_of(&self, keys: &[&str]) -> Option<String> {
        keys.iter().find_map(|k| self.target.get(*k).cloned())
    }
}
