//! [`VSphereBackend`]: the [`Backend`] implementation, and [`VSphereFactory`].

mod clone;
mod configure;
mod create;
mod disks;
mod locate;
mod power;
mod resize;
mod vm;

pub use disks::IMPORT_QEMU_IMG_OPTIONS;
#[cfg(test)]
pub(crate) use resize::resources;
#[cfg(test)]
pub(crate) use vm::VM_PATHS;
pub(crate) use vm::Vm;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use banlieue_kit::tasks::{FailureBook, TaskBook, TaskKind};
use banlieue_sdk::api::common::PowerState;
use banlieue_sdk::api::infra::vsphere::VSphereMachineSpec;
use banlieue_sdk::api::infra::{MachineAddress, MachineAddressType};
use banlieue_sdk::api::resources::MachineField;
use banlieue_sdk::async_trait;
use banlieue_sdk::backend::{
    Backend, BackendError, BackendFactory, Connection, Deletion, DiskTransfer, ImageLookup,
    ImageSourceSet, Inventory, MachineIdentity, MachineObservation, MachineRequest, Pending,
};
use tracing::{debug, info};

use crate::client::methods;
use crate::client::{MoRef, VimClient, VimError};
use crate::guestinfo;
use crate::inventory::{self, Topology};
use crate::settings::VSphereSettings;

/// How long the topology read for placement is reused.
const TOPOLOGY_TTL: Duration = Duration::from_secs(60);

/// The [`BackendFactory`] of the `vsphere` Provider class: one [`VSphereBackend`]
/// (one SOAP client, one vCenter session) per connection.
#[derive(Clone, Debug, Default)]
pub struct VSphereFactory;

impl VSphereFactory {
    /// A factory.
    pub fn new() -> Self {
        Self
    }

    /// Like [`BackendFactory::connect`], with the concrete type.
    pub fn connect_vsphere(
        &self,
        connection: &Connection,
    ) -> Result<Arc<VSphereBackend>, BackendError> {
        Ok(Arc::new(VSphereBackend::new(connection)?))
    }
}

impl BackendFactory for VSphereFactory {
    fn connect(&self, connection: &Connection) -> Result<Arc<dyn Backend>, BackendError> {
        Ok(self.connect_vsphere(connection)?)
    }
}

/// What a task in flight is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OpKind {
    Clone,
    Create,
    Configure,
    Adopt,
    PowerOn,
    PowerOff,
    Suspend,
    Destroy,
    /// A change applied to a VM that exists (`apply_changes`).
    Resize,
}

impl TaskKind for OpKind {
    fn operation(self) -> &'static str {
        match self {
            Self::Clone => "Cloning",
            Self::Create => "Creating",
            Self::Configure => "Configuring",
            Self::Adopt => "Adopting",
            Self::PowerOn => "PoweringOn",
            Self::PowerOff => "PoweringOff",
            Self::Suspend => "Suspending",
            Self::Destroy => "Deleting",
            Self::Resize => "ApplyingChanges",
        }
    }

    fn failure_reason(self) -> &'static str {
        match self {
            Self::Clone => "CloneFailed",
            Self::Create => "CreateFailed",
            Self::Configure => "ReconfigureFailed",
            Self::Adopt => "AdoptFailed",
            Self::PowerOn => "PowerOnFailed",
            Self::PowerOff => "PowerOffFailed",
            Self::Suspend => "SuspendFailed",
            Self::Destroy => "DeleteFailed",
            Self::Resize => "ChangeFailed",
        }
    }
}

impl OpKind {
    fn method(self) -> &'static str {
        match self {
            Self::Clone => "CloneVM_Task",
            Self::Create => "CreateVM_Task",
            Self::Configure | Self::Adopt | Self::Resize => "ReconfigVM_Task",
            Self::PowerOn => "PowerOnVM_Task",
            Self::PowerOff => "PowerOffVM_Task",
            Self::Suspend => "SuspendVM_Task",
            Self::Destroy => "Destroy_Task",
        }
    }
}

/// What [`VSphereBackend::created`] found.
enum Created {
    /// The VM, just made.
    Now(Vm),
    /// Not there yet: what to report.
    Not(MachineObservation),
}

/// A backend connected to one vCenter. Made by [`VSphereFactory`]; safe to call from
/// many tasks. Every call shares the client's one session.
///
/// Tasks it started are remembered per UID in memory, so the next call polls them
/// instead of waiting; after a restart it still finds the VM by its instance UUID (the
/// infra object's UID), and a clone started before the restart shows up as vSphere's
/// `DuplicateName` until it is done.
pub struct VSphereBackend {
    client: VimClient,
    settings: VSphereSettings,
    tasks: TaskBook<OpKind, MoRef>,
    shutdowns: Mutex<HashMap<String, Instant>>,
    failed_clones: FailureBook,
    /// A change's reconfigure that failed, per UID, until `apply_changes` reports it:
    /// the machine runs on as it was (its `ensure` does not fail for it), and the
    /// change says why it is not applied (`UpToDate=False ChangeFailed`).
    failed_changes: Mutex<HashMap<String, BackendError>>,
    topology: tokio::sync::Mutex<Option<(Arc<Topology>, Instant)>>,
    sightings: locate::Sightings,
}

impl std::fmt::Debug for VSphereBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VSphereBackend")
            .field("client", &self.client)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

fn vim(error: VimError) -> BackendError {
    error.into_backend()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, as Kubernetes UIDs and vSphere instance
/// UUIDs are.
fn is_uuid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.chars().all(|c| c.is_ascii_hexdigit()))
}

fn spec_of(request: &MachineRequest) -> Result<&VSphereMachineSpec, BackendError> {
    request.spec_as::<VSphereMachineSpec>()
}

fn check_uid(identity: &MachineIdentity) -> Result<(), BackendError> {
    if is_uuid(&identity.uid) {
        Ok(())
    } else {
        Err(BackendError::terminal(
            "InvalidRequest",
            format!(
                "the machine's uid {} is not a UUID (it becomes the VM's instance UUID)",
                identity.uid
            ),
        ))
    }
}

impl VSphereBackend {
    /// A backend for the connection (no I/O yet).
    pub fn new(connection: &Connection) -> Result<Self, BackendError> {
        Ok(Self {
            settings: VSphereSettings::parse(&connection.settings)?,
            client: VimClient::new(connection)?,
            tasks: TaskBook::new(),
            shutdowns: Mutex::new(HashMap::new()),
            failed_clones: FailureBook::new(),
            failed_changes: Mutex::new(HashMap::new()),
            topology: tokio::sync::Mutex::new(None),
            sightings: locate::Sightings::default(),
        })
    }

    /// The SOAP client.
    pub fn client(&self) -> &VimClient {
        &self.client
    }

    /// The settings it was connected with.
    pub fn settings(&self) -> &VSphereSettings {
        &self.settings
    }

    fn pending(&self, uid: &str, kind: OpKind, task: Option<&MoRef>) -> Pending {
        banlieue_kit::tasks::pending(kind, task.map(|t| t.value.clone()), self.next_poll(uid))
    }

    /// How soon to look at `uid`'s task again ([`TaskBook::next_poll`]).
    fn next_poll(&self, uid: &str) -> Duration {
        self.tasks
            .next_poll(uid, self.settings.pacing.task_poll_interval)
    }

    async fn topology(&self, fresh: bool) -> Result<Arc<Topology>, BackendError> {
        let mut cached = self.topology.lock().await;
        if !fresh
            && let Some((t, at)) = cached.as_ref()
            && at.elapsed() < TOPOLOGY_TTL
        {
            return Ok(t.clone());
        }
        let t = Arc::new(inventory::read(&self.client).await.map_err(vim)?);
        *cached = Some((t.clone(), Instant::now()));
        Ok(t)
    }

    async fn start(&self, uid: &str, kind: OpKind, body: &str) -> Result<MoRef, BackendError> {
        let task = self.client.start_task(body).await.map_err(vim)?;
        debug!(uid, task = %task, operation = kind.operation(), "vsphere: task started");
        self.tasks.remember(uid, kind, task.clone());
        Ok(task)
    }

    /// For a machine whose VM was not found: its clone or create running (or failed),
    /// or just finished — then the new VM, to go on configuring in the same reconcile —
    /// or started now.
    async fn created(
        &self,
        request: &MachineRequest,
        spec: &VSphereMachineSpec,
        polled: locate::Polled,
    ) -> Result<Created, BackendError> {
        let uid = &request.identity.uid;
        match polled {
            Ok(Some((kind, task))) => {
                return Ok(Created::Not(MachineObservation {
                    pending: Some(self.pending(uid, kind, Some(&task))),
                    ..Default::default()
                }));
            }
            Ok(None) => {}
            Err(e) => {
                self.failed_clones.record(uid, &e);
                return Err(e);
            }
        }
        // A clone that just finished is visible now.
        if let Some(vm) = self.find(&request.identity).await? {
            return Ok(Created::Now(vm));
        }
        // A failed clone is reported for a while before the next attempt.
        if let Some(error) = self
            .failed_clones
            .still_failing(uid, self.settings.pacing.failed_clone_backoff)
        {
            return Err(error);
        }
        // Disks copied from another machine: created on them, never cloned.
        Ok(Created::Not(if request.disks_imported {
            self.start_create(request, spec).await?
        } else {
            self.start_clone(request, spec).await?
        }))
    }

    fn observation(&self, vm: &Vm, pending: Option<Pending>) -> MachineObservation {
        let mut addresses = if vm.power == PowerState::PoweredOn {
            vm.addresses()
        } else {
            Vec::new()
        };
        addresses.push(MachineAddress {
            type_: MachineAddressType::Hostname,
            address: vm.name.clone(),
        });
        MachineObservation {
            // No NextBoot rows: what the next boot uses is what the config says now.
            next_boot: None,
            resources: Some(resize::resources(vm)),
            provider_id: vm.bios_uuid.as_ref().map(|u| format!("vsphere://{u}")),
            power_state: Some(vm.power),
            addresses,
            failure_domain: vm.extra.get(guestinfo::FAILURE_DOMAIN_KEY).cloned(),
            backend_ref: Some(vm.moref.value.clone()),
            pending,
        }
    }
}

#[async_trait]
impl Backend for VSphereBackend {
    /// [`crate::capabilities`]: what this backend does for real.
    fn capabilities(&self) -> banlieue_sdk::backend::BackendCapabilities {
        crate::capabilities()
    }

    /// `maxConcurrentCreates` when the Provider does not set it: 10 (vCenter queues clones past its own limits and times out the rest; CAPV users see the same with its 10 workers).
    fn default_max_concurrent_creates(&self) -> Option<usize> {
        Some(10)
    }

    async fn check(&self) -> Result<Inventory, BackendError> {
        let content = self.client.content().await.map_err(vim)?.clone();
        let topology = self.topology(true).await?;
        Ok(topology.inventory(&content.full_name))
    }

    async fn find_image(&self, sources: &ImageSourceSet) -> Result<ImageLookup, BackendError> {
        let Some(source) = &sources.vsphere else {
            return Ok(ImageLookup::Missing {
                message: "the image names no vsphere source (sources.vsphere.template)".into(),
            });
        };
        let Some(template) = &source.template else {
            return Ok(ImageLookup::Missing {
                message:
                    "content-library items are not supported yet; use sources.vsphere.template"
                        .into(),
            });
        };
        Ok(match self.lookup_template(template).await? {
            Some(moref) => ImageLookup::Available {
                resolved: moref.value,
            },
            None => ImageLookup::Missing {
                message: format!("no template {template} on {}", self.client.endpoint()),
            },
        })
    }

    async fn ensure(&self, request: &MachineRequest) -> Result<MachineObservation, BackendError> {
        let spec = spec_of(request)?;
        let identity = &request.identity;
        check_uid(identity)?;
        let uid = &identity.uid;
        // A clone or create of ours still running: its task says when the VM exists.
        let (found, polled) = match self.tasks.get(uid) {
            Some((OpKind::Clone | OpKind::Create, _)) if identity.provider_id.is_none() => {
                (None, self.poll(uid).await)
            }
            _ => self.find_and_poll(identity).await?,
        };
        if let (None, Some(provider_id)) = (&found, &identity.provider_id) {
            return Err(BackendError::machine_missing(
                provider_id,
                self.client.endpoint(),
            ));
        }
        let (vm, polled) = match found {
            Some(vm) => (vm, polled),
            None => match self.created(request, spec, polled).await? {
                Created::Now(vm) => (vm, Ok(None)),
                Created::Not(observation) => return Ok(observation),
            },
        };
        let polled = match polled {
            // A change failed: the machine is still what it was; the change reports it.
            Err(e) if e.reason == OpKind::Resize.failure_reason() => {
                lock(&self.failed_changes).insert(uid.clone(), e);
                Ok(None)
            }
            other => other,
        };
        if let Some((kind, task)) = polled? {
            return Ok(self.observation(&vm, Some(self.pending(uid, kind, Some(&task)))));
        }
        if vm.instance_uuid.as_deref() != Some(uid.to_ascii_lowercase().as_str()) {
            // Found by its providerID under another UID (a moved or restored object):
            // adopt it, so the instance UUID names its owner again.
            let config = methods::ConfigSpec {
                instance_uuid: Some(uid.clone()),
                ..Default::default()
            };
            let task = self
                .start(
                    uid,
                    OpKind::Adopt,
                    &methods::reconfig_vm_task(&vm.moref, &config),
                )
                .await?;
            info!(uid = %uid, vm = %vm.moref, previous = ?vm.instance_uuid, "vsphere: adopting");
            return Ok(self.observation(&vm, Some(self.pending(uid, OpKind::Adopt, Some(&task)))));
        }
        let configured =
            vm.extra.get(guestinfo::CONFIGURED_KEY).map(String::as_str) == Some("true");
        // The clone's firmware and Secure Boot may not have taken (vcsim ignores them; so
        // may a vCenter for a template's locked settings): set them while the new
        // machine is still off, never on a running one — with the configuring
        // reconfigure when one step does it, else first on their own.
        let fix = (!configured && vm.power == PowerState::PoweredOff)
            .then(|| clone::firmware_fix(&vm, spec.firmware))
            .flatten();
        if let Some(fix) = &fix
            && !clone::fix_completes(&vm, fix, spec.firmware)
        {
            let task = self
                .start(
                    uid,
                    OpKind::Configure,
                    &methods::reconfig_vm_task(&vm.moref, fix),
                )
                .await?;
            info!(uid = %uid, vm = %vm.moref, firmware = ?fix.firmware, secure_boot = ?fix.efi_secure_boot, "vsphere: setting firmware");
            return Ok(
                self.observation(&vm, Some(self.pending(uid, OpKind::Configure, Some(&task))))
            );
        }
        if !configured {
            let mut config = self.configure_spec(&vm, spec, request).await?;
            if let Some(fix) = fix {
                config.firmware = fix.firmware;
                config.efi_secure_boot = fix.efi_secure_boot;
            }
            let task = self
                .start(
                    uid,
                    OpKind::Configure,
                    &methods::reconfig_vm_task(&vm.moref, &config),
                )
                .await?;
            info!(uid = %uid, vm = %vm.moref, firmware = ?config.firmware, "vsphere: configuring guestinfo");
            return Ok(
                self.observation(&vm, Some(self.pending(uid, OpKind::Configure, Some(&task))))
            );
        }
        let want = spec.power_state;
        let action = match (want, vm.power) {
            (PowerState::PoweredOn, PowerState::PoweredOff | PowerState::Suspended)
            | (PowerState::Suspended, PowerState::PoweredOff) => {
                Some((OpKind::PowerOn, "PowerOnVM_Task"))
            }
            (PowerState::Suspended, PowerState::PoweredOn) => {
                Some((OpKind::Suspend, "SuspendVM_Task"))
            }
            (PowerState::PoweredOff, PowerState::PoweredOn | PowerState::Suspended) => {
                let pending = self.power_off(uid, &vm).await?;
                return Ok(self.observation(&vm, Some(pending)));
            }
            _ => None,
        };
        if let Some((kind, method)) = action {
            let task = self
                .start(uid, kind, &methods::vm_call(method, &vm.moref))
                .await?;
            return Ok(self.observation(&vm, Some(self.pending(uid, kind, Some(&task)))));
        }
        lock(&self.shutdowns).remove(uid);
        let waiting = want == PowerState::PoweredOn
            && self.settings.wait_for_address
            && vm.addresses().is_empty();
        let pending = waiting.then(|| Pending {
            operation: "WaitingForAddress".into(),
            task: None,
            retry_after: self.settings.pacing.task_poll_interval,
        });
        Ok(self.observation(&vm, pending))
    }

    /// VMs named after the object whose notes say banlieue made them for its namespace
    /// and name (the `locate` module).
    async fn made_for(
        &self,
        kind: &str,
        identity: &MachineIdentity,
    ) -> Result<Vec<banlieue_sdk::backend::MadeFor>, BackendError> {
        if kind != "VSphereMachine" {
            return Ok(Vec::new());
        }
        self.made_for_machine(identity).await
    }

    async fn observe(
        &self,
        identity: &MachineIdentity,
    ) -> Result<Option<MachineObservation>, BackendError> {
        if !is_uuid(&identity.uid) {
            return Ok(None);
        }
        let Some(vm) = self.find(identity).await? else {
            return Ok(None);
        };
        let pending = self
            .tasks
            .get(&identity.uid)
            .map(|(kind, task)| self.pending(&identity.uid, kind, Some(&task)));
        Ok(Some(self.observation(&vm, pending)))
    }

    async fn delete(&self, identity: &MachineIdentity) -> Result<Deletion, BackendError> {
        if !is_uuid(&identity.uid) {
            return Ok(Deletion::Gone);
        }
        let uid = &identity.uid;
        match self.destroyed(uid).await? {
            Some(true) => {
                self.failed_clones.forget(uid);
                lock(&self.failed_changes).remove(uid);
                return Ok(Deletion::Gone);
            }
            Some(false) => {
                return Ok(Deletion::InProgress {
                    retry_after: self.next_poll(uid),
                });
            }
            None => {}
        }
        let (vm, polled) = self.find_and_poll(identity).await?;
        let running = match polled {
            Ok(op) => op,
            // A failed clone or power task does not block deletion.
            Err(e) if vm.is_none() || !e.is_transient() || e.reason != "DeleteFailed" => None,
            Err(e) => return Err(e),
        };
        let Some(vm) = vm else {
            self.failed_clones.forget(uid);
            lock(&self.failed_changes).remove(uid);
            return Ok(match running {
                Some(_) => Deletion::InProgress {
                    retry_after: self.next_poll(uid),
                },
                None => Deletion::Gone,
            });
        };
        if running.is_some() {
            return Ok(Deletion::InProgress {
                retry_after: self.next_poll(uid),
            });
        }
        if vm.power != PowerState::PoweredOff {
            self.hard_power_off(uid, &vm).await?;
            info!(uid = %uid, vm = %vm.moref, "vsphere: powering off to delete");
            return Ok(Deletion::InProgress {
                retry_after: self.next_poll(uid),
            });
        }
        match self
            .start(
                uid,
                OpKind::Destroy,
                &methods::vm_call("Destroy_Task", &vm.moref),
            )
            .await
        {
            Ok(_) => {}
            Err(e) if e.reason == "ObjectNotFound" => return Ok(Deletion::Gone),
            Err(e) => return Err(e),
        }
        info!(uid = %uid, vm = %vm.moref, "vsphere: destroying");
        Ok(Deletion::InProgress {
            retry_after: self.next_poll(uid),
        })
    }

    /// One `ReconfigVM_Task` for every field handed over (`resize_spec`:
    /// CPUs, cores per socket and memory while powered off, disks grown in any power
    /// state), returned `Pending` with the task like every other task; the next
    /// `ensure` polls it and reads the VM back. A task of the machine's still running
    /// is reported, not doubled; fields the VM has already add nothing.
    async fn apply_changes(
        &self,
        request: &MachineRequest,
        fields: &[MachineField],
    ) -> Result<MachineObservation, BackendError> {
        let identity = &request.identity;
        check_uid(identity)?;
        let uid = &identity.uid;
        let (found, polled) = self.find_and_poll(identity).await?;
        let Some(vm) = found else {
            return Err(BackendError::machine_missing(
                identity.provider_id.as_deref().unwrap_or(uid),
                self.client.endpoint(),
            ));
        };
        if let Some((kind, task)) = polled? {
            return Ok(self.observation(&vm, Some(self.pending(uid, kind, Some(&task)))));
        }
        // The last try failed: say so once (transient: the controller tries again).
        if let Some(error) = lock(&self.failed_changes).remove(uid) {
            return Err(error);
        }
        let Some(config) = resize::resize_spec(&vm, &request.spec.resources(), fields)? else {
            return Ok(self.observation(&vm, None));
        };
        let task = self
            .start(
                uid,
                OpKind::Resize,
                &methods::reconfig_vm_task(&vm.moref, &config),
            )
            .await?;
        info!(uid = %uid, vm = %vm.moref, ?fields, cpus = ?config.num_cpus, memory_mib = ?config.memory_mib, disks = config.device_change.len(), "vsphere: applying changes");
        Ok(self.observation(&vm, Some(self.pending(uid, OpKind::Resize, Some(&task)))))
    }

    fn disk_transfer(&self) -> Option<&dyn DiskTransfer> {
        Some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids() {
        assert!(is_uuid("7f1c2a5e-0000-4000-8000-000000000001"));
        assert!(!is_uuid("uid-1"));
        assert!(!is_uuid("7f1c2a5e-0000-4000-8000-00000000000g"));
    }
}
