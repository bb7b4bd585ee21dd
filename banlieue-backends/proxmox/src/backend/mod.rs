//! [`ProxmoxBackend`]: the [`Backend`] implementation, and [`ProxmoxFactory`].

mod addresses;
mod apply;
mod clone;
mod delete;
mod ensure;
mod find;
mod observe;
mod ops;
mod seed_volume;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use banlieue_kit::recent::Recent;
use banlieue_kit::rounds::SharedRead;
use banlieue_kit::tasks::{FailureBook, TaskBook, TaskKind};
use banlieue_sdk::api::common::PowerState;
use banlieue_sdk::api::infra::proxmox::ProxmoxMachineSpec;
use banlieue_sdk::api::infra::{MachineAddress, MachineAddressType};
use banlieue_sdk::async_trait;
use banlieue_sdk::backend::{
    Backend, BackendError, BackendFactory, Connection, Deletion, ImageLookup, ImageSourceSet,
    Inventory, MachineIdentity, MachineObservation, MachineRequest, MadeFor, Pending,
};
use serde_json::Value;
use tracing::{debug, info};

use crate::changes;
use crate::client::{Form, PveClient, PveError, encode, is_lock_message};
use crate::config;
use crate::inventory;
use crate::provisioning;
use crate::seed;
use crate::settings::ProxmoxSettings;
use crate::tasks::{TaskState, Upid, task_state, upid_of};
use crate::vmid::{MAX_ATTEMPTS, VmidPicker};

/// The reason of an image that names only `sources.proxmox.volume`.
pub const IMAGE_SOURCE_UNSUPPORTED: &str = "ImageSourceUnsupported";

/// How long a round of reconciles gathers before its one `/cluster/resources`: short
/// beside the task poll interval (2 s), long enough that a burst shares one listing.
const LISTING_GATHER: Duration = Duration::from_millis(50);

/// How long the storage chosen for seed ISOs on a node is reused.
const SEED_STORAGE_TTL: Duration = Duration::from_secs(60);

/// The [`BackendFactory`] of the `proxmox` Provider class: one [`ProxmoxBackend`]
/// (one API client, one ticket session) per connection.
#[derive(Clone, Debug, Default)]
pub struct ProxmoxFactory;

impl ProxmoxFactory {
    /// A factory.
    pub fn new() -> Self {
        Self
    }

    /// Like [`BackendFactory::connect`], with the concrete type.
    pub fn connect_proxmox(
        &self,
        connection: &Connection,
    ) -> Result<Arc<ProxmoxBackend>, BackendError> {
        Ok(Arc::new(ProxmoxBackend::new(connection)?))
    }
}

impl BackendFactory for ProxmoxFactory {
    fn connect(&self, connection: &Connection) -> Result<Arc<dyn Backend>, BackendError> {
        Ok(self.connect_proxmox(connection)?)
    }
}

/// What a task in flight is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OpKind {
    Clone,
    Resize,
    Start,
    Shutdown,
    Suspend,
    Resume,
    Stop,
    Destroy,
    UploadSeed,
    DeleteSeed,
}

impl TaskKind for OpKind {
    fn operation(self) -> &'static str {
        match self {
            Self::Clone => "Cloning",
            Self::Resize => "ResizingDisk",
            Self::Start => "PoweringOn",
            Self::Shutdown => "PoweringOff",
            Self::Suspend => "Suspending",
            Self::Resume => "Resuming",
            Self::Stop => "Stopping",
            Self::Destroy => "Deleting",
            Self::UploadSeed => "UploadingSeed",
            Self::DeleteSeed => "DeletingSeed",
        }
    }

    fn failure_reason(self) -> &'static str {
        match self {
            Self::Clone => "CloneFailed",
            Self::Resize => "ResizeFailed",
            Self::Start => "StartFailed",
            Self::Shutdown => "ShutdownFailed",
            Self::Suspend => "SuspendFailed",
            Self::Resume => "ResumeFailed",
            Self::Stop => "StopFailed",
            Self::Destroy => "DeleteFailed",
            Self::UploadSeed => "SeedUploadFailed",
            Self::DeleteSeed => "SeedDeleteFailed",
        }
    }
}

/// A VM found by its UID.
#[derive(Clone, Debug)]
struct Found {
    node: String,
    vmid: u32,
    lock: Option<String>,
    configured: bool,
    /// Found by `spec.providerID` under another UID: to be retagged with this one.
    adopted: bool,
    /// Its config, when finding it took reading that.
    config: Option<Value>,
}

/// A backend connected to one Proxmox VE cluster. Made by [`ProxmoxFactory`]; safe to
/// call from many tasks.
///
/// Tasks it started (clone, power, delete) are remembered per UID in memory so the
/// next call polls them instead of waiting; after a restart it still finds the VM by
/// its UID tag or description, and sees a clone in flight by PVE's `clone` lock.
pub struct ProxmoxBackend {
    client: PveClient,
    settings: ProxmoxSettings,
    tasks: TaskBook<OpKind, Upid>,
    failed_clones: FailureBook,
    allocation: tokio::sync::Mutex<()>,
    listing: SharedRead<Vec<Value>>,
    seed_storages: Recent<String>,
}

impl std::fmt::Debug for ProxmoxBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxmoxBackend")
            .field("client", &self.client)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

fn pve(error: PveError) -> BackendError {
    error.into_backend()
}

fn as_u32(v: &Value) -> Option<u32> {
    v.as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
}

fn vm_path(node: &str, vmid: u32) -> String {
    format!("/nodes/{}/qemu/{vmid}", encode(node))
}

impl ProxmoxBackend {
    /// A backend for the connection (no I/O yet).
    pub fn new(connection: &Connection) -> Result<Self, BackendError> {
        Ok(Self {
            settings: ProxmoxSettings::parse(&connection.settings)?,
            client: PveClient::new(connection)?,
            tasks: TaskBook::new(),
            failed_clones: FailureBook::new(),
            allocation: tokio::sync::Mutex::new(()),
            listing: SharedRead::new(LISTING_GATHER),
            seed_storages: Recent::new(SEED_STORAGE_TTL),
        })
    }

    /// The API client.
    pub fn client(&self) -> &PveClient {
        &self.client
    }

    /// The settings it was connected with.
    pub fn settings(&self) -> &ProxmoxSettings {
        &self.settings
    }

    /// Refuses, before anything is made for them, the additional disks `current` (the
    /// VM's config, or its template's before the clone) lacks whose provisioning their
    /// storage does not give ([`provisioning::check`]). Reads `GET /storage` only when
    /// there is such a disk.
    async fn check_new_disks(
        &self,
        spec: &ProxmoxMachineSpec,
        current: &Value,
    ) -> Result<(), BackendError> {
        let disks = config::new_disks(spec, current);
        if disks.is_empty() {
            return Ok(());
        }
        let storages = self
            .client
            .get("/storage", &Form::new())
            .await
            .map_err(pve)?;
        provisioning::check(&disks, &storages)
    }

    fn pending(&self, uid: &str, kind: OpKind, upid: Option<&Upid>) -> Pending {
        banlieue_kit::tasks::pending(kind, upid.map(|u| u.raw.clone()), self.next_poll(uid))
    }

    /// How soon to look at `uid`'s task again ([`TaskBook::next_poll`]).
    fn next_poll(&self, uid: &str) -> Duration {
        self.tasks
            .next_poll(uid, self.settings.pacing.task_poll_interval)
    }
}

fn spec_of(request: &MachineRequest) -> Result<&ProxmoxMachineSpec, BackendError> {
    request.spec_as::<ProxmoxMachineSpec>()
}

/// The spec's additional disks' names, in order: `scsi1`, `scsi2`, ... carry them.
fn disk_names(spec: &ProxmoxMachineSpec) -> Vec<String> {
    spec.additional_disks
        .iter()
        .map(|d| d.name.clone())
        .collect()
}

fn power_of(status: &Value) -> PowerState {
    match (
        status.get("status").and_then(Value::as_str),
        status.get("qmpstatus").and_then(Value::as_str),
    ) {
        (Some("running"), Some("paused" | "suspended")) => PowerState::Suspended,
        (Some("running"), _) => PowerState::PoweredOn,
        _ => PowerState::PoweredOff,
    }
}

#[async_trait]
impl Backend for ProxmoxBackend {
    /// [`crate::capabilities`]: what this backend does for real.
    fn capabilities(&self) -> banlieue_sdk::backend::BackendCapabilities {
        crate::capabilities()
    }

    /// `maxConcurrentCreates` when the Provider does not set it: 10 (PVE limits concurrent clones from one template (9.1), and users of peers added a semaphore of about 10).
    fn default_max_concurrent_creates(&self) -> Option<usize> {
        Some(10)
    }

    async fn check(&self) -> Result<Inventory, BackendError> {
        inventory::read(
            &self.client,
            self.settings.cluster.as_deref(),
            &self.settings.vlans,
        )
        .await
        .map_err(pve)
    }

    async fn find_image(&self, sources: &ImageSourceSet) -> Result<ImageLookup, BackendError> {
        let Some(source) = &sources.proxmox else {
            return Ok(ImageLookup::Missing {
                message: "the image names no proxmox source (sources.proxmox.templateID)".into(),
            });
        };
        let Some(id) = source.template_id else {
            // Terminal: no retry makes a volume clonable.
            return Err(BackendError::terminal(
                IMAGE_SOURCE_UNSUPPORTED,
                "sources.proxmox.volume is not supported: the proxmox backend clones templates \
                 (sources.proxmox.templateID) and does not import disk volumes",
            ));
        };
        let resources = self.resources().await?;
        Ok(
            match resources
                .iter()
                .find(|r| r.get("vmid").and_then(as_u32) == Some(id))
            {
                Some(r) if r.get("template").and_then(Value::as_i64) == Some(1) => {
                    ImageLookup::Available {
                        resolved: format!(
                            "{}/{id}",
                            r.get("node").and_then(Value::as_str).unwrap_or_default()
                        ),
                    }
                }
                Some(_) => ImageLookup::Missing {
                    message: format!("VM {id} exists but is not a template"),
                },
                None => ImageLookup::Missing {
                    message: format!("no template with VMID {id} on {}", self.client.endpoint()),
                },
            },
        )
    }

    async fn ensure(&self, request: &MachineRequest) -> Result<MachineObservation, BackendError> {
        self.ensure_machine(request).await
    }

    /// Writes CPUs, memory and added disks with one `PUT …/config` (PVE keeps them
    /// pending on a running VM until its next start), grows a disk with
    /// `PUT …/resize`, and reads the VM back (see [`crate::changes`]).
    async fn apply_changes(
        &self,
        request: &MachineRequest,
        fields: &[banlieue_sdk::api::resources::MachineField],
    ) -> Result<MachineObservation, BackendError> {
        self.apply_machine_changes(request, fields).await
    }

    /// The VMs named after the object whose description says banlieue made them for
    /// its namespace and name (every banlieue VM's description has, so VMs made before
    /// this was asked for are found too).
    async fn made_for(
        &self,
        kind: &str,
        identity: &MachineIdentity,
    ) -> Result<Vec<MadeFor>, BackendError> {
        if kind != "ProxmoxMachine" {
            return Ok(Vec::new());
        }
        let resources = self.resources().await?;
        self.made_for_machine(identity, &resources).await
    }

    async fn observe(
        &self,
        identity: &MachineIdentity,
    ) -> Result<Option<MachineObservation>, BackendError> {
        self.observe_machine(identity).await
    }

    async fn delete(&self, identity: &MachineIdentity) -> Result<Deletion, BackendError> {
        self.delete_machine(identity).await
    }
}
