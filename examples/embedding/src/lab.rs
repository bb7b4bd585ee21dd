//! `Lab`: a backend of the embedding operator's own, for Providers of class `lab`,
//! building [`LabMachine`]s. A real one would call an internal API; this one keeps
//! machines in memory and boots them instantly.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use banlieue_sdk::api::common::PowerState;
use banlieue_sdk::api::infra::{MachineAddress, MachineAddressType};
use banlieue_sdk::async_trait;
use banlieue_sdk::backend::{
    Backend, BackendError, BackendFactory, Connection, Deletion, FailureDomainInventory,
    ImageLookup, ImageSourceSet, Inventory, MachineIdentity, MachineObservation, MachineRequest,
    MachineSpec,
};

use crate::machine::{LabMachine, LabMachineSpec};

/// Creates [`Lab`] backends; machines are shared by every Provider it serves.
#[derive(Default)]
pub struct LabFactory {
    machines: Arc<Mutex<HashMap<String, PowerState>>>,
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
        }))
    }
}

/// The backend itself.
pub struct Lab {
    machines: Arc<Mutex<HashMap<String, PowerState>>>,
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

impl Lab {
    fn observation(identity: &MachineIdentity, power: PowerState) -> MachineObservation {
        MachineObservation {
            next_boot: None,
            resources: None,
            provider_id: Some(format!("lab://{}", identity.uid)),
            power_state: Some(power),
            addresses: vec![MachineAddress {
                type_: MachineAddressType::Hostname,
                address: identity.name.clone(),
            }],
            failure_domain: Some("lab".into()),
            backend_ref: Some(identity.name.clone()),
            pending: None,
        }
    }
}

#[async_trait]
impl Backend for Lab {
    async fn check(&self) -> Result<Inventory, BackendError> {
        Ok(Inventory {
            version: "lab 1.0".into(),
            failure_domains: vec![FailureDomainInventory {
                name: "lab".into(),
                ..Default::default()
            }],
        })
    }

    async fn find_image(&self, sources: &ImageSourceSet) -> Result<ImageLookup, BackendError> {
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
        let spec = lab_spec(request)?;
        if spec.volume.is_empty() {
            return Err(BackendError::terminal(
                "NoVolume",
                "the LabMachine names no volume",
            ));
        }
        let power = spec.power_state;
        self.machines
            .lock()
            .expect("lab")
            .insert(request.identity.uid.clone(), power);
        Ok(Self::observation(&request.identity, power))
    }

    async fn observe(
        &self,
        identity: &MachineIdentity,
    ) -> Result<Option<MachineObservation>, BackendError> {
        let power = self
            .machines
            .lock()
            .expect("lab")
            .get(&identity.uid)
            .copied();
        Ok(power.map(|p| Self::observation(identity, p)))
    }

    async fn delete(&self, identity: &MachineIdentity) -> Result<Deletion, BackendError> {
        self.machines.lock().expect("lab").remove(&identity.uid);
        Ok(Deletion::Gone)
    }
}
