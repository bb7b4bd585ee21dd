//! The plain values that cross the `Backend` boundary: no Kubernetes client, no
//! object references left to resolve.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::api::common::{BootstrapFormat, PowerState, ProviderClass};
use crate::api::infra::{
    MachineAddress, cloud_hypervisor::CloudHypervisorMachineSpec, libvirt::LibvirtMachineSpec,
    proxmox::ProxmoxMachineSpec, vsphere::VSphereMachineSpec,
};
pub use crate::api::resources::{
    ChangeMode, ChangePolicy, ChangeRule, DiskSize, MachineField, MachineResources,
};
pub use crate::api::vm_image::Architecture;
use crate::api::vm_image::ImageSources;

use super::{BackendError, SecretValue};

/// Everything needed to talk to one Provider, resolved from its spec, Secret and CA
/// bundle. Two equal connections may share a backend session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Connection {
    /// The Provider's class.
    pub class: ProviderClass,
    /// `spec.connection.endpoint`, verbatim.
    pub endpoint: String,
    /// The credentials Secret's keys (values redacted in `Debug`).
    pub credentials: BTreeMap<String, SecretValue>,
    /// PEM CA bundle to trust, if any.
    pub ca_bundle: Option<String>,
    /// Skip TLS verification (labs only).
    pub insecure_skip_tls_verify: bool,
    /// `spec.settings`: backend-specific knobs, documented per backend.
    pub settings: BTreeMap<String, String>,
}

impl Connection {
    /// A credential by key, or a terminal `MissingCredential` error naming the key.
    pub fn credential(&self, key: &str) -> Result<&SecretValue, super::BackendError> {
        self.credentials.get(key).ok_or_else(|| {
            super::BackendError::terminal(
                "MissingCredential",
                format!("the credentials Secret has no key {key}"),
            )
        })
    }
}

/// What a backend found when it connected.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Inventory {
    /// The backend's version string, e.g. `VMware vCenter Server 8.0.3 build-24022515`.
    pub version: String,
    /// Failure domains and what each can reach.
    pub failure_domains: Vec<FailureDomainInventory>,
}

/// One failure domain as a backend sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FailureDomainInventory {
    /// Name, unique within the Provider.
    pub name: String,
    /// Labels the backend knows (e.g. `topology.kubernetes.io/zone`).
    pub labels: BTreeMap<String, String>,
    /// Where it is: vSphere `datacenter`/`cluster`, Proxmox `node`, `host`.
    pub location: BTreeMap<String, String>,
    /// Targets reachable from here, by the keys capability mappings use:
    /// e.g. `datastore -> {ds1, ds2}`, `portGroup -> {VM Network}`, `pool -> {default}`.
    pub resources: BTreeMap<String, BTreeSet<String>>,
    /// Features available here, e.g. `nestedVirtualization`.
    pub features: BTreeSet<String>,
    /// The CPU architecture of the guests this failure domain runs: its hosts'
    /// architecture, read from the hypervisor (libvirt's host capabilities, the ESXi
    /// hosts' product, the Proxmox node's kernel; [`Architecture::from_machine`] maps
    /// the usual spellings). A VM is placed here only when its VMImage's
    /// `spec.architecture` is this one.
    ///
    /// `None` (the default) when the backend does not know it, or when its hosts
    /// disagree or run an architecture whose guests it cannot make: no VM is placed
    /// here then, and the VM's `Scheduled` condition says the Provider does not report
    /// its architecture. An out-of-tree backend that leaves it unset has no VM placed
    /// on it: set it.
    pub architecture: Option<Architecture>,
}

/// Which machine a request is about. The UID is the key: backends tag the VM with it
/// so a crash between "created" and "status written" never creates a second VM.
///
/// The UID does not survive `clusterctl move` or a restore from backup: the object is
/// created anew. Its `spec.providerID` does, so once set it is the identity a backend
/// looks for **first** ([`MachineIdentity::provider_id`]); a machine found by it is
/// adopted (retagged with the new UID where the backend keeps one), and a machine
/// that cannot be found by it is never created again: the backend answers
/// [`BackendError::machine_missing`](super::BackendError::machine_missing).
///
/// A restored object may come back without `spec.providerID` (a VirtualMachine
/// restored alone gets a freshly built machine): its namespace, kind and name, which
/// backends record on the machines they make, find it then
/// ([`Backend::made_for`](super::Backend::made_for)).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MachineIdentity {
    /// The infra object's `metadata.uid`.
    pub uid: String,
    /// Its namespace.
    pub namespace: String,
    /// Its name (a good VM name on the backend, not an identity).
    pub name: String,
    /// The infra object's `spec.providerID`, once banlieue set it (or a move or a
    /// restore carried it over): e.g. `vsphere://<BIOS UUID>`.
    pub provider_id: Option<String>,
}

impl MachineIdentity {
    /// An identity with no provider ID yet (a machine not created so far).
    pub fn new(
        uid: impl Into<String>,
        namespace: impl Into<String>,
        name: impl Into<String>,
    ) -> Self {
        Self {
            uid: uid.into(),
            namespace: namespace.into(),
            name: name.into(),
            provider_id: None,
        }
    }

    /// The same identity, carrying `provider_id`.
    pub fn with_provider_id(mut self, provider_id: impl Into<String>) -> Self {
        self.provider_id = Some(provider_id.into());
        self
    }

    /// What follows `<scheme>://` in the provider ID, lowercased: `Ok(None)` when no
    /// provider ID is set, a terminal `InvalidProviderID` error when it is set with
    /// another scheme or nothing after it (a machine kind has one scheme).
    pub fn provider_id_for(&self, scheme: &str) -> Result<Option<String>, super::BackendError> {
        let Some(id) = &self.provider_id else {
            return Ok(None);
        };
        match id
            .strip_prefix(scheme)
            .and_then(|rest| rest.strip_prefix("://"))
        {
            Some(rest) if !rest.is_empty() => Ok(Some(rest.to_ascii_lowercase())),
            _ => Err(super::BackendError::terminal(
                "InvalidProviderID",
                format!("spec.providerID {id} is not of the form {scheme}://<id>"),
            )),
        }
    }
}

/// A backend machine banlieue made for an infra object's namespace, kind and name,
/// as [`Backend::made_for`](super::Backend::made_for) finds it: how an object restored
/// from a backup (new UID, no status, no `spec.providerID`) finds its VM again.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MadeFor {
    /// Its provider ID (`<scheme>://<id>`): what the restored object adopts it by.
    pub provider_id: String,
    /// The infra object UID recorded on it, when it records one.
    pub uid: Option<String>,
    /// The backend's own handle (moref, `node/vmid`, domain name, directory), for
    /// humans: conditions name it so the VM can be found by hand.
    pub backend_ref: String,
    /// Its deletion was started (a destroy task in flight, a lock): it is never
    /// adopted, and a new machine waits until it is gone.
    pub deleting: bool,
}

/// The backend-specific machine spec, as the infra object holds it.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum MachineSpec {
    /// A `VSphereMachine`'s spec.
    VSphere(VSphereMachineSpec),
    /// A `ProxmoxMachine`'s spec.
    Proxmox(ProxmoxMachineSpec),
    /// A `LibvirtMachine`'s spec.
    Libvirt(LibvirtMachineSpec),
    /// A `CloudHypervisorMachine`'s spec.
    CloudHypervisor(CloudHypervisorMachineSpec),
    /// The spec of a kind declared out of tree ([`crate::contract::MachineKind`]).
    Custom(CustomSpec),
}

/// The spec of a machine kind declared out of tree: what every machine has, and the
/// kind's own spec as JSON, which its backend reads with [`CustomSpec::decode`].
#[derive(Clone, Debug, PartialEq)]
pub struct CustomSpec {
    /// The kind.
    pub kind: crate::contract::InfraMachineKind,
    /// Virtual CPUs.
    pub cpus: u32,
    /// Memory in MiB.
    pub memory_mib: u64,
    /// The desired power state.
    pub power_state: PowerState,
    /// The kind's `spec`.
    pub spec: serde_json::Value,
}

impl CustomSpec {
    /// The kind's spec as its own type, or a terminal `InvalidMachineSpec`.
    pub fn decode<S: serde::de::DeserializeOwned>(&self) -> Result<S, BackendError> {
        serde_json::from_value(self.spec.clone()).map_err(|e| {
            BackendError::terminal(
                "InvalidMachineSpec",
                format!("the {} spec does not decode: {e}", self.kind),
            )
        })
    }
}

impl MachineSpec {
    /// Virtual CPUs.
    pub fn cpus(&self) -> u32 {
        match self {
            Self::VSphere(s) => s.num_cpus,
            Self::Proxmox(s) => s.sockets * s.cores,
            Self::Libvirt(s) => s.cpus,
            Self::CloudHypervisor(s) => s.cpus,
            Self::Custom(s) => s.cpus,
        }
    }

    /// Memory in MiB.
    pub fn memory_mib(&self) -> u64 {
        match self {
            Self::VSphere(s) => s.memory_mib,
            Self::Proxmox(s) => s.memory_mib,
            Self::Libvirt(s) => s.memory_mib,
            Self::CloudHypervisor(s) => s.memory_mib,
            Self::Custom(s) => s.memory_mib,
        }
    }

    /// The desired power state.
    pub fn power_state(&self) -> PowerState {
        match self {
            Self::VSphere(s) => s.power_state,
            Self::Proxmox(s) => s.power_state,
            Self::Libvirt(s) => s.power_state,
            Self::CloudHypervisor(s) => s.power_state,
            Self::Custom(s) => s.power_state,
        }
    }

    /// The sizes this spec asks for, to compare with what the machine runs with
    /// ([`MachineObservation::resources`]). A kind declared out of tree asks for its
    /// CPUs and memory only.
    pub fn resources(&self) -> MachineResources {
        fn sizes(disks: &[crate::api::infra::MachineDisk]) -> Vec<DiskSize> {
            let mut out: Vec<DiskSize> = disks
                .iter()
                .map(|d| DiskSize {
                    name: d.name.clone(),
                    size_gib: d.size_gib,
                })
                .collect();
            out.sort();
            out
        }
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        match self {
            Self::VSphere(s) => MachineResources {
                cpus: s.num_cpus,
                cores_per_socket: s.num_cores_per_socket,
                memory_mib: s.memory_mib,
                os_disk_gib: s.disk_gib,
                data_disks: sizes(&s.additional_disks),
                networks: count(s.network.len()),
                firmware: s.firmware,
                max_cpus: s.max_cpus,
                max_memory_mib: s.max_memory_mib,
            },
            Self::Proxmox(s) => MachineResources {
                cpus: s.sockets * s.cores,
                cores_per_socket: Some(s.cores),
                memory_mib: s.memory_mib,
                os_disk_gib: s.disk_gib,
                data_disks: sizes(&s.additional_disks),
                networks: count(s.network.len()),
                firmware: s.firmware,
                ..Default::default()
            },
            // Unset is a topology too on these two: one core per socket (libvirt's
            // default, and what the Cloud Hypervisor backend sets).
            Self::Libvirt(s) => MachineResources {
                cpus: s.cpus,
                cores_per_socket: Some(s.cores_per_socket.unwrap_or(1)),
                memory_mib: s.memory_mib,
                os_disk_gib: s.disk_gib,
                data_disks: sizes(&s.additional_disks),
                networks: count(s.network.len()),
                firmware: Some(s.firmware),
                max_cpus: s.max_cpus,
                max_memory_mib: s.max_memory_mib,
            },
            Self::CloudHypervisor(s) => MachineResources {
                cpus: s.cpus,
                cores_per_socket: Some(s.cores_per_socket.unwrap_or(1)),
                memory_mib: s.memory_mib,
                os_disk_gib: s.disk_gib,
                data_disks: sizes(&s.additional_disks),
                networks: count(s.network.len()),
                max_cpus: s.max_cpus,
                max_memory_mib: s.max_memory_mib,
                ..Default::default()
            },
            Self::Custom(s) => MachineResources {
                cpus: s.cpus,
                memory_mib: s.memory_mib,
                ..Default::default()
            },
        }
    }

    /// What is done with a change that waits for a power cycle (a kind declared out of
    /// tree: [`ChangePolicy::Wait`]).
    pub fn change_policy(&self) -> ChangePolicy {
        match self {
            Self::VSphere(s) => s.change_policy,
            Self::Proxmox(s) => s.change_policy,
            Self::Libvirt(s) => s.change_policy,
            Self::CloudHypervisor(s) => s.change_policy,
            Self::Custom(_) => ChangePolicy::Wait,
        }
    }

    /// Sets the power state asked: how the controller powers a machine off to apply
    /// a change (`changePolicy: Restart`) without editing its object.
    pub fn set_power_state(&mut self, power: PowerState) {
        match self {
            Self::VSphere(s) => s.power_state = power,
            Self::Proxmox(s) => s.power_state = power,
            Self::Libvirt(s) => s.power_state = power,
            Self::CloudHypervisor(s) => s.power_state = power,
            Self::Custom(s) => s.power_state = power,
        }
    }

    /// The infra kind this spec belongs to, e.g. `VSphereMachine`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::VSphere(_) => "VSphereMachine",
            Self::Proxmox(_) => "ProxmoxMachine",
            Self::Libvirt(_) => "LibvirtMachine",
            Self::CloudHypervisor(_) => "CloudHypervisorMachine",
            Self::Custom(s) => s.kind.kind(),
        }
    }
}

/// Bootstrap data to hand to the guest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BootstrapData {
    /// cloud-config or Ignition.
    pub format: BootstrapFormat,
    /// The user data (CAPI's `value`).
    pub user_data: SecretValue,
    /// cloud-init network config, when given.
    pub network_config: Option<SecretValue>,
}

/// "Make this machine exist and look like this." Idempotent.
#[derive(Clone, Debug, PartialEq)]
pub struct MachineRequest {
    /// Which machine.
    pub identity: MachineIdentity,
    /// Its spec (including the desired power state).
    pub spec: MachineSpec,
    /// The failure domain to place it in, when one was chosen.
    pub failure_domain: Option<String>,
    /// Bootstrap data, when there is any. Not read (so `None`) for a machine with a
    /// provider ID that is already `Ready`: a backend uses it only to create a machine
    /// or to configure one before its first boot.
    pub bootstrap: Option<BootstrapData>,
    /// The cloud-init `instance-id` to hand the guest, when it is not the UID: a
    /// machine whose disks were copied from another keeps that one's, so the guest
    /// does not run its first boot again. Use [`MachineRequest::instance_id`].
    pub instance_id: Option<String>,
    /// The machine's disks were put in place by
    /// [`DiskTransfer::import`](super::DiskTransfer::import) (`CopyDisk`): create it on
    /// them. Never clone the image instead: disks that are not there are a terminal
    /// error naming what is missing.
    pub disks_imported: bool,
}

impl MachineRequest {
    /// The cloud-init `instance-id`: the one carried over, else the UID.
    pub fn instance_id(&self) -> &str {
        self.instance_id.as_deref().unwrap_or(&self.identity.uid)
    }

    /// The spec as the kind this backend serves, or a terminal
    /// `UnsupportedMachineKind` naming both kinds.
    ///
    /// ```
    /// # use banlieue_sdk::api::infra::libvirt::LibvirtMachineSpec;
    /// # use banlieue_sdk::backend::MachineRequest;
    /// fn spec(request: &MachineRequest) -> Result<&LibvirtMachineSpec, banlieue_sdk::backend::BackendError> {
    ///     request.spec_as::<LibvirtMachineSpec>()
    /// }
    /// ```
    pub fn spec_as<S: KindSpec>(&self) -> Result<&S, BackendError> {
        S::of(&self.spec).ok_or_else(|| {
            BackendError::terminal(
                "UnsupportedMachineKind",
                format!("this backend serves {}s, not {}", S::KIND, self.spec.kind()),
            )
        })
    }
}

/// A machine kind's spec type, as [`MachineSpec`] carries it: what
/// [`MachineRequest::spec_as`] unwraps.
pub trait KindSpec: Sized {
    /// The infrastructure kind, e.g. `VSphereMachine`.
    const KIND: &'static str;
    /// The spec, when `spec` is of this kind.
    fn of(spec: &MachineSpec) -> Option<&Self>;
}

macro_rules! kind_spec {
    ($($variant:ident => $spec:ty, $kind:literal;)*) => {$(
        impl KindSpec for $spec {
            const KIND: &'static str = $kind;
            fn of(spec: &MachineSpec) -> Option<&Self> {
                match spec {
                    MachineSpec::$variant(spec) => Some(spec),
                    #[allow(unreachable_patterns)]
                    _ => None,
                }
            }
        }
    )*};
}

kind_spec! {
    VSphere => VSphereMachineSpec, "VSphereMachine";
    Proxmox => ProxmoxMachineSpec, "ProxmoxMachine";
    Libvirt => LibvirtMachineSpec, "LibvirtMachine";
    CloudHypervisor => CloudHypervisorMachineSpec, "CloudHypervisorMachine";
}

/// What a backend observed about a machine.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MachineObservation {
    /// Stable, backend-unique ID such as `vsphere://<BIOS UUID>`, once the VM exists.
    pub provider_id: Option<String>,
    /// The power state now.
    pub power_state: Option<PowerState>,
    /// Addresses the backend reports.
    pub addresses: Vec<MachineAddress>,
    /// The failure domain the machine is in.
    pub failure_domain: Option<String>,
    /// The backend's own handle (moref, `node/vmid`, domain name, socket).
    pub backend_ref: Option<String>,
    /// A long operation still in flight (clone, boot, power change). Controllers
    /// come back after `retry_after` instead of waiting.
    pub pending: Option<Pending>,
    /// The configuration the machine's next boot uses, when the backend reads one back
    /// that differs from what runs (a `NextBoot` change written and not yet taken):
    /// such a change is not written again. `None`: the same as what runs.
    pub next_boot: Option<MachineResources>,
    /// What the machine runs with, read back from the backend (not copied from the
    /// request): what the controller compares with the spec to decide which changes
    /// to apply ([`Backend::apply_changes`](super::Backend::apply_changes)) and which
    /// wait. `None`: the backend does not read it back, and the machine says its
    /// resources are not known (`UpToDate=Unknown`) rather than claim them.
    pub resources: Option<MachineResources>,
}

impl MachineObservation {
    /// True when the machine exists, nothing is in flight and its power state is `want`.
    pub fn settled_at(&self, want: PowerState) -> bool {
        self.provider_id.is_some() && self.pending.is_none() && self.power_state == Some(want)
    }
}

/// An operation the backend started and has not finished.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pending {
    /// What is happening, for humans: `Cloning`, `PoweringOn`, `WaitingForAddress`.
    pub operation: String,
    /// The backend's task handle, if it has one (a vSphere task, a Proxmox UPID).
    pub task: Option<String>,
    /// When to look again.
    pub retry_after: Duration,
}

/// Progress of a deletion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Deletion {
    /// The machine no longer exists on the backend.
    Gone,
    /// Deletion started; look again after the delay.
    InProgress {
        /// When to look again.
        retry_after: Duration,
    },
}

/// Whether an image is present on a Provider.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ImageLookup {
    /// Found, with the backend's own reference to it.
    Available {
        /// e.g. a template moref or a volume key.
        resolved: String,
    },
    /// Not there, and why.
    Missing {
        /// What was looked for and not found.
        message: String,
    },
}

/// The image sources of a VMImage, as handed to [`super::Backend::find_image`].
pub type ImageSourceSet = ImageSources;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_provider_id_is_read_for_the_kinds_scheme_only() {
        let id = |p: Option<&str>| {
            let i = MachineIdentity::new("u", "ns", "m");
            match p {
                Some(p) => i.with_provider_id(p),
                None => i,
            }
        };
        // (providerID, the kind's scheme, what follows `<scheme>://` or the error reason)
        type Case<'a> = (Option<&'a str>, &'a str, Result<Option<&'a str>, &'a str>);
        let cases: [Case<'_>; 6] = [
            (None, "libvirt", Ok(None)),
            (
                Some("libvirt://0B9E8A62-5D7C-4C51-9F0E-2A9F6C1D3E47"),
                "libvirt",
                Ok(Some("0b9e8a62-5d7c-4c51-9f0e-2a9f6c1d3e47")),
            ),
            (Some("vsphere://42"), "vsphere", Ok(Some("42"))),
            (Some("vsphere://42"), "proxmox", Err("InvalidProviderID")),
            (Some("libvirt://"), "libvirt", Err("InvalidProviderID")),
            (Some("libvirt:/x"), "libvirt", Err("InvalidProviderID")),
        ];
        for (provider_id, scheme, want) in cases {
            let got = id(provider_id).provider_id_for(scheme);
            match (got, want) {
                (Ok(got), Ok(want)) => {
                    assert_eq!(got.as_deref(), want, "{provider_id:?} for {scheme}")
                }
                (Err(e), Err(reason)) => {
                    assert_eq!(e.reason, reason);
                    assert!(!e.is_transient());
                }
                (got, want) => panic!("{provider_id:?} for {scheme}: {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn a_missing_machine_is_terminal_and_names_the_provider_id() {
        let e = super::super::BackendError::machine_missing("proxmox://abc", "https://pve:8006");
        assert_eq!(e.reason, super::super::BACKEND_VM_MISSING);
        assert!(!e.is_transient());
        assert!(e.message.contains("proxmox://abc") && e.message.contains("https://pve:8006"));
    }
}
