//! `Lab`: a backend of the embedding operator's own, for Providers of class `lab`,
//! building [`LabMachine`]s. A real one would call an internal API; this one keeps
//! machines in memory and boots them instantly. It is written as a real backend must
//! be (and `tests/conformance.rs` runs banlieue's conformance suite on it): it finds
//! a machine again by its provider ID under a new UID and retags it, refuses to
//! create one under a provider ID that names nothing, records what each machine was
//! made for ([`Backend::made_for`]), resizes CPUs and memory live from its change
//! table, and answers an outage with a transient error.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use banlieue_sdk::api::common::PowerState;
use banlieue_sdk::api::infra::{MachineAddress, MachineAddressType};
use banlieue_sdk::api::resources::{ChangeMode, ChangeRule, MachineField, MachineResources};
use banlieue_sdk::async_trait;
use banlieue_sdk::backend::{
    Architecture, Backend, BackendCapabilities, BackendError, BackendFactory, Connection, Deletion,
    FailureDomainInventory, ImageLookup, ImageSourceSet, Inventory, MachineIdentity,
    MachineObservation, MachineRequest, MachineSpec, MadeFor,
};

use crate::machine::{LabMachine, LabMachineSpec};

/// One machine in the lab, keyed by its provider ID.
#[derive(Clone, Debug)]
struct LabVm {
    /// The UID of the object that owns it (retagged when another adopts it).
    uid: String,
    namespace: String,
    name: String,
    power: PowerState,
    cpus: u32,
    memory_mib: u64,
}

type Machines = Arc<Mutex<BTreeMap<String, LabVm>>>;

/// Creates [`Lab`] backends; machines are shared by every Provider it serves (one lab).
#[derive(Default)]
pub struct LabFactory {
    machines: Machines,
    down: Arc<AtomicBool>,
}

impl LabFactory {
    /// Makes the lab's API unreachable (`false`) or reachable again: what an outage of
    /// the internal API looks like to the backend (for the conformance suite's outage
    /// check).
    pub fn set_reachable(&self, reachable: bool) {
        self.down.store(!reachable, Ordering::SeqCst);
    }
}

impl BackendFactory for LabFactory {
    fn connect(&self, connection: &Connection) -> Result<Arc<dyn Backend>, BackendError> {
        if !connection.endpoint.starts_with("lab://") {
            return Err(BackendError::terminal(
                "InvalidEndpoint",
                "the lab serves lab:// endpoints only",
            ));
        }
        Ok(Arc::new(Lab {
            machines: self.machines.clone(),
            down: self.down.clone(),
        }))
    }
}

/// The backend itself.
pub struct Lab {
    machines: Machines,
    down: Arc<AtomicBool>,
}

/// The `LabMachine` spec a request carries, or a terminal error naming the kind it is.
fn lab_spec(request: &MachineRequest) -> Result<LabMachineSpec, BackendError> {
    use banlieue_sdk::contract::InfraMachineRead;
    match &request.spec {
        MachineSpec::Custom(spec) if spec.kind == LabMachine::KIND => spec.decode(),
        other => Err(BackendError::terminal(
            "UnsupportedMachineKind",
            format!("the lab serves LabMachines, not {}", other.kind()),
        )),
    }
}

/// The lab's change table: its machines take more or fewer CPUs and memory live.
fn change_table() -> Vec<ChangeRule> {
    vec![
        ChangeRule::both(MachineField::Cpus, ChangeMode::Live),
        ChangeRule::both(MachineField::MemoryMib, ChangeMode::Live),
    ]
}

impl Lab {
    /// An unreachable lab is a transient error: the controller retries with backoff.
    fn reachable(&self) -> Result<(), BackendError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(BackendError::transient(
                "LabUnreachable",
                "the lab's API does not answer",
            ));
        }
        Ok(())
    }

    /// The provider ID `identity` names: its `spec.providerID`, else the one a machine
    /// made for its UID has.
    fn key(identity: &MachineIdentity) -> Result<String, BackendError> {
        Ok(match identity.provider_id_for("lab")? {
            Some(id) => format!("lab://{id}"),
            None => format!("lab://{}", identity.uid),
        })
    }

    fn observation(provider_id: &str, vm: &LabVm) -> MachineObservation {
        MachineObservation {
            next_boot: None,
            resources: Some(MachineResources {
                cpus: vm.cpus,
                memory_mib: vm.memory_mib,
                ..Default::default()
            }),
            provider_id: Some(provider_id.to_owned()),
            power_state: Some(vm.power),
            addresses: vec![MachineAddress {
                type_: MachineAddressType::Hostname,
                address: vm.name.clone(),
            }],
            failure_domain: Some("lab".into()),
            backend_ref: Some(vm.name.clone()),
            pending: None,
        }
    }
}

#[async_trait]
impl Backend for Lab {
    async fn check(&self) -> Result<Inventory, BackendError> {
        self.reachable()?;
        Ok(Inventory {
            version: "lab 1.0".into(),
            failure_domains: vec![FailureDomainInventory {
                name: "lab".into(),
                // The lab's hosts, as a real backend would read them from its API: a
                // failure domain that reports no architecture gets no VM placed on it.
                architecture: Some(Architecture::Amd64),
                ..Default::default()
            }],
        })
    }

    async fn find_image(&self, sources: &ImageSourceSet) -> Result<ImageLookup, BackendError> {
        self.reachable()?;
        Ok(
            match sources
                .other
                .get(crate::CLASS)
                .and_then(|s| s.get("volume"))
            {
                Some(volume) => ImageLookup::Available {
                    resolved: format!("lab volume {volume}"),
                },
                None => ImageLookup::Missing {
                    message: "no sources.other.lab.volume".into(),
                },
            },
        )
    }

    async fn ensure(&self, request: &MachineRequest) -> Result<MachineObservation, BackendError> {
        self.reachable()?;
        let spec = lab_spec(request)?;
        if spec.volume.is_empty() {
            return Err(BackendError::terminal(
                "NoVolume",
                "the LabMachine names no volume",
            ));
        }
        let identity = &request.identity;
        let key = Self::key(identity)?;
        let mut machines = self.machines.lock().expect("lab");
        // A provider ID that names nothing: never a second machine under it.
        if identity.provider_id.is_some() && !machines.contains_key(&key) {
            return Err(BackendError::machine_missing(&key, "the lab"));
        }
        let vm = machines.entry(key.clone()).or_insert_with(|| LabVm {
            uid: identity.uid.clone(),
            namespace: identity.namespace.clone(),
            name: identity.name.clone(),
            power: PowerState::PoweredOff,
            cpus: request.spec.cpus(),
            memory_mib: request.spec.memory_mib(),
        });
        // Found by its provider ID for another object (a move, a restore): it owns it now.
        vm.uid.clone_from(&identity.uid);
        vm.namespace.clone_from(&identity.namespace);
        vm.name.clone_from(&identity.name);
        // The power state asked is the request's, not the decoded spec's: the
        // controller powers a machine off to apply a change without editing its object.
        vm.power = request.spec.power_state();
        Ok(Self::observation(&key, vm))
    }

    async fn observe(
        &self,
        identity: &MachineIdentity,
    ) -> Result<Option<MachineObservation>, BackendError> {
        self.reachable()?;
        let key = Self::key(identity)?;
        let machines = self.machines.lock().expect("lab");
        Ok(machines.get(&key).map(|vm| Self::observation(&key, vm)))
    }

    async fn delete(&self, identity: &MachineIdentity) -> Result<Deletion, BackendError> {
        self.reachable()?;
        let key = Self::key(identity)?;
        self.machines.lock().expect("lab").remove(&key);
        Ok(Deletion::Gone)
    }

    async fn made_for(
        &self,
        kind: &str,
        identity: &MachineIdentity,
    ) -> Result<Vec<MadeFor>, BackendError> {
        self.reachable()?;
        if kind != "LabMachine" {
            return Ok(Vec::new());
        }
        let machines = self.machines.lock().expect("lab");
        Ok(machines
            .iter()
            .filter(|(_, vm)| vm.namespace == identity.namespace && vm.name == identity.name)
            .map(|(key, vm)| MadeFor {
                provider_id: key.clone(),
                uid: Some(vm.uid.clone()),
                backend_ref: vm.name.clone(),
                deleting: false,
            })
            .collect())
    }

    async fn apply_changes(
        &self,
        request: &MachineRequest,
        fields: &[MachineField],
    ) -> Result<MachineObservation, BackendError> {
        self.reachable()?;
        let key = Self::key(&request.identity)?;
        let mut machines = self.machines.lock().expect("lab");
        let vm = machines
            .get_mut(&key)
            .ok_or_else(|| BackendError::machine_missing(&key, "the lab"))?;
        for field in fields {
            match field {
                MachineField::Cpus => vm.cpus = request.spec.cpus(),
                MachineField::MemoryMib => vm.memory_mib = request.spec.memory_mib(),
                other => {
                    return Err(BackendError::terminal(
                        "ChangeUnsupported",
                        format!("the lab does not change {}", other.as_str()),
                    ));
                }
            }
        }
        Ok(Self::observation(&key, vm))
    }

    fn capabilities(&self) -> BackendCapabilities {
        let mut capabilities = BackendCapabilities::conservative();
        capabilities.changes = change_table();
        capabilities
    }
}
