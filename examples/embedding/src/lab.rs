//! `Lab`: a backend of the embedding operator's own. A real one would call an
//! internal API; this one keeps machines in memory and boots them instantly.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use banlieue_sdk::api::common::PowerState;
use banlieue_sdk::api::infra::{MachineAddress, MachineAddressType};
use banlieue_sdk::async_trait;
use banlieue_sdk::backend::{
    Backend, BackendError, BackendFactory, Connection, Deletion, FailureDomainInventory,
    ImageLookup, ImageSourceSet, Inventory, MachineIdentity, MachineObservation, MachineRequest,
};

/// Creates [`Lab`] backends; machines are shared by every Provider it serves.
#[derive(Default)]
pub struct LabFactory {
    machines: Arc<Mutex<HashMap<String, PowerState>>>,
}

impl BackendFactory for LabFactory {
    fn connect(&self, connection: &Connection) -> Result<Arc<dyn Backend>, BackendError> {
        if !connection.endpoint.starts_with("qemu") {
            return Err(BackendError::terminal(
                "InvalidEndpoint",
                "the lab serves qemu:// endpoints only",
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

impl Lab {
    fn observation(identity: &MachineIdentity, power: PowerState) -> MachineObservation {
        MachineObservation {
            provider_id: Some(format!("libvirt://{}", identity.uid)),
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
        Ok(match &sources.libvirt {
            Some(_) => ImageLookup::Available {
                resolved: "lab-image".into(),
            },
            None => ImageLookup::Missing {
                message: "no libvirt source".into(),
            },
        })
    }

    async fn ensure(&self, request: &MachineRequest) -> Result<MachineObservation, BackendError> {
        let power = request.spec.power_state();
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
