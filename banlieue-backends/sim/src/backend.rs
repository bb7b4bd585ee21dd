//! [`SimBackend`]: the [`Backend`] implementation over a shared simulated hypervisor.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use banlieue_sdk::async_trait;
use banlieue_sdk::backend::{
    Backend, BackendError, Deletion, ImageLookup, ImageSourceSet, Inventory, MachineField,
    MachineIdentity, MachineObservation, MachineRequest, MachineSpec, MadeFor,
};
use tokio::time::Instant;
use tracing::debug;

use crate::machine::{Kind, MIN_RETRY_AFTER, mix64};
use crate::settings::{FaultKind, SimSettings};
use crate::stats::{Call, FaultCounter, SimCall};
use crate::world::{CreateError, NewMachine, World};

/// SplitMix64's increment (the golden ratio in 64 bits).
const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// How much longer a `slow` fault makes the operation it hits.
pub const SLOW_FACTOR: u32 = 10;

/// A backend connected to one simulated hypervisor (one endpoint) with one set of
/// settings. Made by [`crate::SimFactory`]; cheap, and safe to call from many tasks.
pub struct SimBackend {
    world: Arc<World>,
    settings: SimSettings,
    /// State of the fault-injection generator (SplitMix64), seeded from `settings.seed`.
    rng: AtomicU64,
}

impl fmt::Debug for SimBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimBackend")
            .field("endpoint", &self.world.endpoint())
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl SimBackend {
    pub(crate) fn new(world: Arc<World>, settings: SimSettings) -> Self {
        let rng = AtomicU64::new(settings.seed);
        Self {
            world,
            settings,
            rng,
        }
    }

    /// The settings this backend was connected with.
    pub fn settings(&self) -> &SimSettings {
        &self.settings
    }

    /// The endpoint of the simulated hypervisor it talks to.
    pub fn endpoint(&self) -> &str {
        self.world.endpoint()
    }

    fn next_u64(&self) -> u64 {
        mix64(
            self.rng
                .fetch_add(GOLDEN, Ordering::Relaxed)
                .wrapping_add(GOLDEN),
        )
    }

    /// Counts the call and draws its fault. Returns the latency operations started by
    /// this call take (ten times `latency` under a `slow` fault), or the injected error.
    fn inject(&self, call: Call, uid: Option<&str>) -> Result<Duration, BackendError> {
        let result = self.draw_fault(call);
        self.world.count_call(call);
        if self.settings.record_calls {
            self.world.record_call(SimCall {
                at: Instant::now(),
                call: call.setting_name(),
                uid: uid.map(str::to_owned),
                failed: result.is_err(),
            });
        }
        result
    }

    fn draw_fault(&self, call: Call) -> Result<Duration, BackendError> {
        let latency = self.settings.latency;
        let rate = self.settings.failure_rate;
        if rate <= 0.0 || !self.settings.failure_calls.contains(call.setting_name()) {
            return Ok(latency);
        }
        let draw = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        if draw >= rate {
            return Ok(latency);
        }
        let kinds = &self.settings.failure_kinds;
        let kind = kinds[(self.next_u64() % kinds.len() as u64) as usize];
        let endpoint = self.world.endpoint();
        debug!(endpoint, call = call.name(), fault = %kind, "sim: injecting fault");
        let message = || {
            format!(
                "injected {kind} fault in {} on {endpoint} (settings.failureRate {rate})",
                call.name()
            )
        };
        match kind {
            FaultKind::Transient => {
                self.world.count_fault(FaultCounter::Transient);
                Err(BackendError::transient("SimulatedFault", message()))
            }
            FaultKind::Terminal => {
                self.world.count_fault(FaultCounter::Terminal);
                Err(BackendError::terminal("SimulatedFault", message()))
            }
            FaultKind::Slow => {
                self.world.count_fault(FaultCounter::Slow);
                Ok(latency.saturating_mul(SLOW_FACTOR))
            }
        }
    }

    fn domain_names(&self) -> String {
        let names: Vec<&str> = self
            .settings
            .failure_domains
            .iter()
            .map(|d| d.name.as_str())
            .collect();
        names.join(", ")
    }
}

fn kind_of(spec: &MachineSpec) -> Result<Kind, BackendError> {
    match spec {
        MachineSpec::VSphere(_) => Ok(Kind::VSphere),
        MachineSpec::Proxmox(_) => Ok(Kind::Proxmox),
        MachineSpec::Libvirt(_) => Ok(Kind::Libvirt),
        MachineSpec::CloudHypervisor(_) => Ok(Kind::CloudHypervisor),
        other => Err(BackendError::terminal(
            "UnsupportedMachineKind",
            format!(
                "the simulator does not know the infrastructure kind {}",
                other.kind()
            ),
        )),
    }
}

fn invalid_identity(identity: &MachineIdentity) -> Option<BackendError> {
    identity
        .uid
        .is_empty()
        .then(|| BackendError::terminal("InvalidRequest", "the machine identity has an empty uid"))
}

#[async_trait]
impl Backend for SimBackend {
    /// [`crate::capabilities`]: what this backend does for real.
    fn capabilities(&self) -> banlieue_sdk::backend::BackendCapabilities {
        crate::capabilities()
    }

    async fn check(&self) -> Result<Inventory, BackendError> {
        self.inject(Call::Check, None)?;
        Ok(Inventory {
            version: self.settings.version.clone(),
            failure_domains: self
                .settings
                .failure_domains
                .iter()
                .map(|d| d.inventory())
                .collect(),
        })
    }

    async fn find_image(&self, sources: &ImageSourceSet) -> Result<ImageLookup, BackendError> {
        self.inject(Call::FindImage, None)?;
        Ok(match &sources.sim {
            Some(sim) => ImageLookup::Available {
                resolved: format!("sim:{}", sim.name),
            },
            None => ImageLookup::Missing {
                message: "the image names no simulator source (sources.sim.name); \
                          a sim Provider serves only images that do"
                    .to_string(),
            },
        })
    }

    async fn ensure(&self, request: &MachineRequest) -> Result<MachineObservation, BackendError> {
        let latency = self.inject(Call::Ensure, Some(&request.identity.uid))?;
        let identity = &request.identity;
        if let Some(e) = invalid_identity(identity) {
            return Err(e);
        }
        let kind = kind_of(&request.spec)?;
        let power = request.spec.power_state();
        let bootstrap = request.bootstrap.as_ref();
        let now = Instant::now();
        if let Some(observation) =
            self.world
                .reconcile(&identity.uid, power, bootstrap, latency, now)
        {
            return Ok(observation);
        }
        if let Some(provider_id) = &identity.provider_id {
            // A moved or restored object: adopt its machine, never make a second one.
            if !self.world.adopt(identity, now) {
                return Err(BackendError::machine_missing(provider_id, self.endpoint()));
            }
            return self
                .world
                .reconcile(&identity.uid, power, bootstrap, latency, now)
                .ok_or_else(|| {
                    BackendError::transient("Conflict", "the machine changed concurrently; retry")
                });
        }

        let failure_domains: Vec<&str> = match &request.failure_domain {
            Some(name) if self.settings.failure_domain(name).is_some() => vec![name.as_str()],
            Some(name) => {
                return Err(BackendError::terminal(
                    "UnknownFailureDomain",
                    format!(
                        "failure domain {name} does not exist on {}; it has {}",
                        self.endpoint(),
                        self.domain_names()
                    ),
                ));
            }
            None => self
                .settings
                .failure_domains
                .iter()
                .map(|d| d.name.as_str())
                .collect(),
        };
        let new = NewMachine {
            identity,
            kind,
            resources: request.spec.resources(),
            power,
            failure_domains,
            bootstrap: request.bootstrap.clone(),
            static_addresses: banlieue_sdk::capi::ipam::static_addresses(&request.spec),
            capacity: self.settings.capacity,
            latency,
        };
        match self.world.create(new, now) {
            Ok(Some(observation)) => {
                debug!(
                    endpoint = self.endpoint(),
                    uid = %identity.uid,
                    namespace = %identity.namespace,
                    name = %identity.name,
                    kind = kind.name(),
                    failure_domain = observation.failure_domain.as_deref().unwrap_or_default(),
                    "sim: creating machine"
                );
                Ok(observation)
            }
            // Another worker created it between our two looks: reconcile that one.
            Ok(None) => self
                .world
                .reconcile(&identity.uid, power, bootstrap, latency, now)
                .ok_or_else(|| {
                    BackendError::transient("Conflict", "the machine changed concurrently; retry")
                }),
            Err(CreateError::Capacity(capacity)) => Err(BackendError::terminal(
                "InsufficientCapacity",
                format!(
                    "{} already holds {capacity} machines, its capacity (settings.capacity)",
                    self.endpoint()
                ),
            )),
            Err(CreateError::AddressesExhausted) => Err(BackendError::terminal(
                "InsufficientCapacity",
                format!("{} has no free address left in 10.0.0.0/8", self.endpoint()),
            )),
            Err(CreateError::NoFailureDomain) => Err(BackendError::terminal(
                "UnknownFailureDomain",
                format!("{} has no failure domain", self.endpoint()),
            )),
        }
    }

    async fn made_for(
        &self,
        kind: &str,
        identity: &MachineIdentity,
    ) -> Result<Vec<MadeFor>, BackendError> {
        // Neither counted nor faulted: the call counts tests assert are those of the
        // calls that change or read one machine, and this one is a read of the world.
        Ok(self.world.made_for(kind, identity, Instant::now()))
    }

    async fn apply_changes(
        &self,
        request: &MachineRequest,
        fields: &[MachineField],
    ) -> Result<MachineObservation, BackendError> {
        self.inject(Call::ApplyChanges, Some(&request.identity.uid))?;
        let now = Instant::now();
        let desired = request.spec.resources();
        let table = self.capabilities().changes;
        match self
            .world
            .apply_changes(&request.identity.uid, &desired, fields, &table, now)
        {
            Some(Ok(observation)) => Ok(observation),
            Some(Err((field, mode))) => Err(BackendError::terminal(
                "ChangeNotApplicable",
                format!(
                    "{} cannot change now: the simulator's table says {} for it",
                    field.as_str(),
                    mode.as_str()
                ),
            )),
            None => Err(BackendError::machine_missing(
                request
                    .identity
                    .provider_id
                    .as_deref()
                    .unwrap_or(&request.identity.uid),
                self.endpoint(),
            )),
        }
    }

    async fn observe(
        &self,
        identity: &MachineIdentity,
    ) -> Result<Option<MachineObservation>, BackendError> {
        self.inject(Call::Observe, Some(&identity.uid))?;
        let now = Instant::now();
        self.world.adopt(identity, now);
        Ok(self.world.observe(&identity.uid, now))
    }

    async fn delete(&self, identity: &MachineIdentity) -> Result<Deletion, BackendError> {
        let latency = self.inject(Call::Delete, Some(&identity.uid))?;
        let now = Instant::now();
        self.world.adopt(identity, now);
        Ok(match self.world.delete(&identity.uid, latency, now) {
            None => Deletion::Gone,
            Some(left) => {
                debug!(endpoint = self.endpoint(), uid = %identity.uid, "sim: deleting machine");
                Deletion::InProgress {
                    retry_after: left.max(MIN_RETRY_AFTER),
                }
            }
        })
    }
}
