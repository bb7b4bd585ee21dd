//! [`SimFactory`]: connects Providers to simulated hypervisors, and lets tests and
//! benchmarks look inside them.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use banlieue_sdk::api::common::PowerState;
use banlieue_sdk::backend::{Backend, BackendError, BackendFactory, BootstrapData, Connection};
use tokio::time::Instant;

use crate::backend::SimBackend;
use crate::machine::SimMachineInfo;
use crate::settings::SimSettings;
use crate::stats::{SimCall, SimStats};
use crate::world::World;

/// The [`BackendFactory`] of the `sim` Provider class.
///
/// It owns the simulated hypervisors ("worlds"), one per distinct
/// `Connection.endpoint`: every [`connect`](BackendFactory::connect) to the same
/// endpoint reaches the same machines, whatever the settings, so machines survive the
/// operator re-creating its backend when a Provider changes. Different endpoints are
/// independent. Clones of a factory share its worlds.
#[derive(Clone, Default)]
pub struct SimFactory {
    worlds: Arc<Mutex<HashMap<String, Arc<World>>>>,
}

impl fmt::Debug for SimFactory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimFactory")
            .field("endpoints", &self.endpoints())
            .finish()
    }
}

impl SimFactory {
    /// A factory with no simulated hypervisor yet; each is created on first connect.
    pub fn new() -> Self {
        Self::default()
    }

    /// Like [`BackendFactory::connect`], with the concrete type.
    pub fn connect_sim(&self, connection: &Connection) -> Result<Arc<SimBackend>, BackendError> {
        if connection.endpoint.is_empty() {
            return Err(BackendError::terminal(
                "InvalidEndpoint",
                "connection.endpoint is empty; name the simulated hypervisor, e.g. sim://lab-a",
            ));
        }
        let settings = SimSettings::parse(&connection.endpoint, &connection.settings)?;
        let world = self
            .lock()
            .entry(connection.endpoint.clone())
            .or_insert_with(|| Arc::new(World::new(&connection.endpoint)))
            .clone();
        Ok(Arc::new(SimBackend::new(world, settings)))
    }

    /// The endpoints of the simulated hypervisors connected so far, sorted.
    pub fn endpoints(&self) -> Vec<String> {
        let mut endpoints: Vec<String> = self.lock().keys().cloned().collect();
        endpoints.sort();
        endpoints
    }

    /// Every machine on `endpoint` (including those being created or deleted), sorted
    /// by namespace, name and UID. Empty for an endpoint never connected.
    pub fn machines(&self, endpoint: &str) -> Vec<SimMachineInfo> {
        self.world(endpoint)
            .map(|w| w.machines(Instant::now()))
            .unwrap_or_default()
    }

    /// The machine carrying `uid` on `endpoint`.
    pub fn machine(&self, endpoint: &str, uid: &str) -> Option<SimMachineInfo> {
        self.world(endpoint)?.machine(uid, Instant::now())
    }

    /// The bootstrap data the machine carrying `uid` received, for tests that check
    /// delivery. The values stay [`banlieue_sdk::backend::SecretValue`]s: redacted
    /// when printed, read with `expose()`.
    pub fn bootstrap_data(&self, endpoint: &str, uid: &str) -> Option<BootstrapData> {
        self.world(endpoint)?.bootstrap(uid, Instant::now())
    }

    /// Call and machine counters of `endpoint` (all zero for an endpoint never connected).
    pub fn stats(&self, endpoint: &str) -> SimStats {
        self.world(endpoint)
            .map(|w| w.stats(Instant::now()))
            .unwrap_or_default()
    }

    /// The calls recorded on `endpoint` by Providers that set `recordCalls: "true"`,
    /// in arrival order (empty for an endpoint never connected).
    pub fn calls(&self, endpoint: &str) -> Vec<SimCall> {
        self.world(endpoint).map(|w| w.calls()).unwrap_or_default()
    }

    /// Removes the machine carrying `uid` at once, as if an administrator deleted it
    /// behind the operator's back (for drift and chaos tests). False if there is none.
    pub fn remove_machine(&self, endpoint: &str, uid: &str) -> bool {
        self.world(endpoint)
            .is_some_and(|w| w.remove_out_of_band(uid, Instant::now()))
    }

    /// Sets the power state of a created machine at once, as if an administrator
    /// pressed its power button (for drift tests); power operations in flight are
    /// dropped. False if there is no such created machine, or it is being deleted.
    pub fn set_power_state(&self, endpoint: &str, uid: &str, power: PowerState) -> bool {
        self.world(endpoint)
            .is_some_and(|w| w.set_power_out_of_band(uid, power, Instant::now()))
    }

    fn world(&self, endpoint: &str) -> Option<Arc<World>> {
        self.lock().get(endpoint).cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<World>>> {
        self.worlds.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl BackendFactory for SimFactory {
    fn connect(&self, connection: &Connection) -> Result<Arc<dyn Backend>, BackendError> {
        Ok(self.connect_sim(connection)?)
    }
}
