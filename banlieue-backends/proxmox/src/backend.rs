//! [`ProxmoxBackend`]: the [`Backend`] implementation, and [`ProxmoxFactory`].

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use banlieue_sdk::api::common::PowerState;
use banlieue_sdk::api::infra::proxmox::ProxmoxMachineSpec;
use banlieue_sdk::api::infra::{MachineAddress, MachineAddressType};
use banlieue_sdk::async_trait;
use banlieue_sdk::backend::{
    Backend, BackendError, BackendFactory, Connection, Deletion, ImageLookup, ImageSourceSet,
    Inventory, MachineIdentity, MachineObservation, MachineRequest, MachineSpec, Pending,
};
use serde_json::Value;
use tracing::{debug, info};

use crate::client::{Form, PveClient, PveError, encode, is_lock_message};
use crate::config;
use crate::drift;
use crate::inventory;
use crate::seed;
use crate::settings::ProxmoxSettings;
use crate::tasks::{TaskState, Upid, task_state, upid_of};
use crate::vmid::{MAX_ATTEMPTS, VmidPicker};

/// The pending operation reported while config changes wait for a restart of a
/// running VM (PVE's pending config).
pub const RESTART_PENDING: &str = "RestartPending";

/// The reason of an image that names only `sources.proxmox.volume`.
pub const IMAGE_SOURCE_UNSUPPORTED: &str = "ImageSourceUnsupported";

/// How soon a VM waiting for a restart is looked at again.
const RESTART_PENDING_RECHECK: Duration = Duration::from_secs(30);

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

impl OpKind {
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

#[derive(Clone, Debug)]
struct Op {
    kind: OpKind,
    upid: Upid,
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
    ops: Mutex<HashMap<String, Op>>,
    failed_clones: Mutex<HashMap<String, (BackendError, Instant)>>,
    allocation: tokio::sync::Mutex<()>,
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
            ops: Mutex::new(HashMap::new()),
            failed_clones: Mutex::new(HashMap::new()),
            allocation: tokio::sync::Mutex::new(()),
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

    fn ops(&self) -> std::sync::MutexGuard<'_, HashMap<String, Op>> {
        self.ops.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn failed_clones(&self) -> std::sync::MutexGuard<'_, HashMap<String, (BackendError, Instant)>> {
        self.failed_clones
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn pending(&self, kind: OpKind, upid: Option<&Upid>) -> Pending {
        Pending {
            operation: kind.operation().to_string(),
            task: upid.map(|u| u.raw.clone()),
            retry_after: self.settings.task_poll_interval,
        }
    }

    async fn resources(&self) -> Result<Vec<Value>, BackendError> {
        let data = self
            .client
            .get("/cluster/resources", &Form::new().set("type", "vm"))
            .await
            .map_err(pve)?;
        Ok(data
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|r| r.get("type").and_then(Value::as_str) == Some("qemu"))
            .collect())
    }

    /// The VM carrying the UID: by its tag, else (not yet configured) by name and
    /// the UID line of its description, else (a moved or restored object, whose UID is
    /// new) by the SMBIOS UUID `spec.providerID` names.
    async fn find(
        &self,
        identity: &MachineIdentity,
        resources: &[Value],
    ) -> Result<Option<Found>, BackendError> {
        let uid = &identity.uid;
        let parse = |r: &Value, configured| {
            Some(Found {
                node: r.get("node")?.as_str()?.to_string(),
                vmid: as_u32(r.get("vmid")?)?,
                lock: r.get("lock").and_then(Value::as_str).map(str::to_string),
                configured,
                adopted: false,
            })
        };
        let not_template = |r: &&Value| r.get("template").and_then(Value::as_i64).unwrap_or(0) != 1;
        if let Some(found) = resources
            .iter()
            .filter(not_template)
            .find(|r| config::has_uid_tag(r.get("tags").and_then(Value::as_str), uid))
            .and_then(|r| parse(r, true))
        {
            return Ok(Some(found));
        }
        let name = config::vm_name(identity);
        let marker = config::uid_marker(uid);
        for r in resources.iter().filter(not_template) {
            if r.get("name").and_then(Value::as_str) != Some(name.as_str()) {
                continue;
            }
            let Some(found) = parse(r, false) else {
                continue;
            };
            match self
                .client
                .get(
                    &format!("{}/config", vm_path(&found.node, found.vmid)),
                    &Form::new(),
                )
                .await
            {
                Ok(cfg)
                    if cfg
                        .get("description")
                        .and_then(Value::as_str)
                        .is_some_and(|d| d.contains(&marker)) =>
                {
                    return Ok(Some(found));
                }
                Ok(_) => {}
                Err(e) if e.is_missing_vm() => {}
                Err(e) => return Err(pve(e)),
            }
        }
        match identity.provider_id_for("proxmox")? {
            Some(uuid) => self.find_by_smbios_uuid(&uuid, &name, resources).await,
            None => Ok(None),
        }
    }

    /// The VM whose SMBIOS UUID is `uuid`. `/cluster/resources` does not show it, so
    /// configs are read: VMs named `name` first (a move keeps the object's name).
    async fn find_by_smbios_uuid(
        &self,
        uuid: &str,
        name: &str,
        resources: &[Value],
    ) -> Result<Option<Found>, BackendError> {
        let mut candidates: Vec<&Value> = resources
            .iter()
            .filter(|r| r.get("template").and_then(Value::as_i64).unwrap_or(0) != 1)
            .collect();
        candidates.sort_by_key(|r| r.get("name").and_then(Value::as_str) != Some(name));
        for r in candidates {
            let (Some(node), Some(vmid)) = (
                r.get("node").and_then(Value::as_str),
                r.get("vmid").and_then(as_u32),
            ) else {
                continue;
            };
            match self
                .client
                .get(&format!("{}/config", vm_path(node, vmid)), &Form::new())
                .await
            {
                Ok(cfg) if config::smbios_uuid(&cfg).as_deref() == Some(uuid) => {
                    return Ok(Some(Found {
                        node: node.to_string(),
                        vmid,
                        lock: r.get("lock").and_then(Value::as_str).map(str::to_string),
                        configured: true,
                        adopted: true,
                    }));
                }
                Ok(_) => {}
                Err(e) if e.is_missing_vm() => {}
                Err(e) => return Err(pve(e)),
            }
        }
        Ok(None)
    }

    /// Polls the task in flight for `uid`, if any: `Some(kind)` while it runs; a
    /// failed task is forgotten and returned as an error.
    async fn poll(&self, uid: &str) -> Result<Option<(OpKind, Upid)>, BackendError> {
        let Some(op) = self.ops().get(uid).cloned() else {
            return Ok(None);
        };
        match task_state(&self.client, &op.upid).await {
            Ok(TaskState::Running) => Ok(Some((op.kind, op.upid))),
            Ok(TaskState::Succeeded) => {
                self.ops().remove(uid);
                Ok(None)
            }
            Ok(TaskState::Failed(exit)) => {
                self.ops().remove(uid);
                info!(uid, task = %op.upid.raw, exit, "proxmox: task failed");
                let message = format!("task {} failed: {exit}", op.upid.raw);
                Err(if is_lock_message(&exit) {
                    BackendError::transient("VMLocked", message)
                } else if matches!(op.kind, OpKind::Clone | OpKind::Resize | OpKind::Start) {
                    BackendError::terminal(op.kind.failure_reason(), message)
                } else {
                    BackendError::transient(op.kind.failure_reason(), message)
                })
            }
            // PVE forgets tasks after a restart of pvedaemon: nothing left to wait for.
            Err(e)
                if e.status() == Some(500)
                    && e.message().contains("unable to parse worker upid") =>
            {
                self.ops().remove(uid);
                Ok(None)
            }
            Err(e) => Err(pve(e)),
        }
    }

    fn remember(&self, uid: &str, kind: OpKind, data: &Value) -> Result<Upid, BackendError> {
        let upid = upid_of(data).map_err(pve)?;
        debug!(uid, task = %upid.raw, operation = kind.operation(), "proxmox: task started");
        self.ops().insert(
            uid.to_string(),
            Op {
                kind,
                upid: upid.clone(),
            },
        );
        Ok(upid)
    }

    async fn start_clone(
        &self,
        request: &MachineRequest,
        spec: &ProxmoxMachineSpec,
        resources: &[Value],
    ) -> Result<MachineObservation, BackendError> {
        let template = resources
            .iter()
            .find(|r| r.get("vmid").and_then(as_u32) == Some(spec.template_id));
        let source_node = match (&spec.source_node, template) {
            (Some(node), _) => node.clone(),
            (None, Some(t)) => t
                .get("node")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            (None, None) => {
                return Err(BackendError::terminal(
                    "TemplateNotFound",
                    format!(
                        "no VM {} (the template) on {}",
                        spec.template_id,
                        self.client.endpoint()
                    ),
                ));
            }
        };
        let target = spec
            .target_node
            .clone()
            .or_else(|| request.failure_domain.clone())
            .filter(|t| *t != source_node);
        let identity = &request.identity;
        let base = Form::new()
            .set("name", config::vm_name(identity))
            .set("description", config::description(identity))
            .set("full", if spec.full_clone { 1 } else { 0 })
            .set_opt("target", target.as_deref())
            .set_opt(
                "storage",
                spec.storage.as_deref().filter(|_| spec.full_clone),
            )
            .set_opt("pool", spec.pool.as_deref());
        let path = format!("{}/clone", vm_path(&source_node, spec.template_id));
        let used: BTreeSet<u32> = resources
            .iter()
            .filter_map(|r| r.get("vmid").and_then(as_u32))
            .collect();

        // One allocation at a time per Provider; other writers are handled by retrying.
        let _guard = self.allocation.lock().await;
        let mut picker = VmidPicker::new(spec.vm_id_range.as_ref(), used);
        for _ in 0..MAX_ATTEMPTS {
            let suggested = if picker.has_range() {
                None
            } else {
                let next = self
                    .client
                    .get("/cluster/nextid", &Form::new())
                    .await
                    .map_err(pve)?;
                as_u32(&next)
            };
            let Some(vmid) = picker.next(suggested) else {
                return Err(BackendError::terminal(
                    "VMIDRangeExhausted",
                    match &spec.vm_id_range {
                        Some(r) => {
                            format!("every VMID of vmIDRange {}-{} is in use", r.start, r.end)
                        }
                        None => "every VMID is in use".to_owned(),
                    },
                ));
            };
            let form = base.clone().set("newid", vmid);
            match self.client.post(&path, &form).await {
                Ok(data) => {
                    let upid = self.remember(&identity.uid, OpKind::Clone, &data)?;
                    info!(uid = %identity.uid, vmid, node = %source_node, target = ?target, "proxmox: cloning");
                    return Ok(MachineObservation {
                        failure_domain: Some(target.unwrap_or(source_node)),
                        backend_ref: None,
                        pending: Some(self.pending(OpKind::Clone, Some(&upid))),
                        ..Default::default()
                    });
                }
                Err(e) if e.is_vmid_taken() => {
                    debug!(
                        vmid,
                        "proxmox: VMID taken by a concurrent clone; trying the next"
                    );
                }
                Err(e) => return Err(pve(e)),
            }
        }
        Err(BackendError::transient(
            "VMIDConflict",
            format!("{MAX_ATTEMPTS} VMIDs in a row were taken by concurrent clones"),
        ))
    }

    /// The storage seeds go to on `node`: `seedStorage`, else the first active
    /// storage with `iso` content there.
    async fn seed_storage(&self, node: &str) -> Result<String, BackendError> {
        if let Some(storage) = &self.settings.seed_storage {
            return Ok(storage.clone());
        }
        let data = self
            .client
            .get(
                &format!("/nodes/{}/storage", encode(node)),
                &Form::new().set("content", "iso").set("enabled", 1),
            )
            .await
            .map_err(pve)?;
        let mut names: Vec<&str> = data
            .as_array()
            .into_iter()
            .flatten()
            .filter(|s| s.get("active").and_then(Value::as_i64).unwrap_or(1) == 1)
            .filter_map(|s| s.get("storage").and_then(Value::as_str))
            .collect();
        names.sort_unstable();
        names.first().map(|s| s.to_string()).ok_or_else(|| {
            BackendError::terminal(
                "NoSeedStorage",
                format!(
                    "no active storage with 'iso' content on node {node} for the NoCloud seed; \
                     enable 'iso' content on one or set the seedStorage setting"
                ),
            )
        })
    }

    /// True when the ISO volume `volid` is on `storage` (seen from `node`).
    async fn iso_exists(
        &self,
        node: &str,
        storage: &str,
        volid: &str,
    ) -> Result<bool, BackendError> {
        let data = self
            .client
            .get(
                &format!(
                    "/nodes/{}/storage/{}/content",
                    encode(node),
                    encode(storage)
                ),
                &Form::new().set("content", "iso"),
            )
            .await
            .map_err(pve)?;
        Ok(data
            .as_array()
            .into_iter()
            .flatten()
            .any(|v| v.get("volid").and_then(Value::as_str) == Some(volid)))
    }

    /// The seed drive for an unconfigured VM, once the seed is on the storage;
    /// `Err(Pending)` while it is being uploaded.
    async fn ensure_seed(
        &self,
        request: &MachineRequest,
        spec: &ProxmoxMachineSpec,
        bootstrap: &banlieue_sdk::backend::BootstrapData,
        found: &Found,
        current: &Value,
    ) -> Result<Result<config::SeedDrive, Upid>, BackendError> {
        let uid = &request.identity.uid;
        let macs = seed::macs(spec, uid, current);
        // Built first: an unsupported format fails before anything is uploaded.
        let files = seed::files(
            &request.identity,
            request.instance_id(),
            spec,
            bootstrap,
            &macs,
        )?;
        let storage = match seed::attached(current, uid) {
            Some((storage, _)) => storage,
            None => self.seed_storage(&found.node).await?,
        };
        let volid = seed::volid(&storage, uid);
        let key = seed::slot(current, uid).ok_or_else(|| {
            BackendError::terminal(
                "NoFreeDriveSlot",
                format!(
                    "VM {} has no free IDE or SATA slot for the NoCloud seed",
                    found.vmid
                ),
            )
        })?;
        if self.iso_exists(&found.node, &storage, &volid).await? {
            return Ok(Ok(config::SeedDrive { key, volid }));
        }
        let image = seed::image(&files)?;
        let data = self
            .client
            .upload(
                &format!(
                    "/nodes/{}/storage/{}/upload",
                    encode(&found.node),
                    encode(&storage)
                ),
                &Form::new().set("content", "iso"),
                "filename",
                &seed::file_name(uid),
                &image,
            )
            .await
            .map_err(pve)?;
        info!(uid = %uid, vmid = found.vmid, storage = %storage, bytes = image.len(), "proxmox: uploading the NoCloud seed");
        if data.is_string() {
            return Ok(Err(self.remember(uid, OpKind::UploadSeed, &data)?));
        }
        Ok(Ok(config::SeedDrive { key, volid }))
    }

    /// Deletes the machine's seed volume if it is still on its storage: `Some` while
    /// that is in progress.
    async fn delete_seed(
        &self,
        identity: &MachineIdentity,
        found: &Found,
    ) -> Result<Option<Deletion>, BackendError> {
        let path = vm_path(&found.node, found.vmid);
        let current = match self
            .client
            .get(&format!("{path}/config"), &Form::new())
            .await
        {
            Ok(c) => c,
            Err(e) if e.is_missing_vm() => return Ok(None),
            Err(e) => return Err(pve(e)),
        };
        let attached =
            seed::attached(&current, &identity.uid).or_else(|| seed::attached_any(&current));
        let (storage, volid) = match attached {
            Some(found) => found,
            // Not attached: an upload that was not followed by the config write.
            None => match self.seed_storage(&found.node).await {
                Ok(s) => {
                    let volid = seed::volid(&s, &identity.uid);
                    (s, volid)
                }
                Err(_) => return Ok(None),
            },
        };
        if !self.iso_exists(&found.node, &storage, &volid).await? {
            return Ok(None);
        }
        let data = self
            .client
            .delete(
                &format!(
                    "/nodes/{}/storage/{}/content/{}",
                    encode(&found.node),
                    encode(&storage),
                    encode(&volid)
                ),
                &Form::new(),
            )
            .await
            .map_err(pve)?;
        info!(uid = %identity.uid, volid = %volid, "proxmox: deleting the NoCloud seed");
        if data.is_string() {
            self.remember(&identity.uid, OpKind::DeleteSeed, &data)?;
        }
        Ok(Some(Deletion::InProgress {
            retry_after: self.settings.task_poll_interval,
        }))
    }

    async fn addresses(&self, found: &Found, name: &str) -> Vec<MachineAddress> {
        let path = format!(
            "{}/agent/network-get-interfaces",
            vm_path(&found.node, found.vmid)
        );
        let mut out = Vec::new();
        // No agent (yet): no addresses, not an error.
        if let Ok(data) = self.client.get(&path, &Form::new()).await {
            let interfaces = data
                .get("result")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            for iface in interfaces {
                for ip in iface
                    .get("ip-addresses")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let Some(addr) = ip.get("ip-address").and_then(Value::as_str) else {
                        continue;
                    };
                    let Ok(parsed) = addr.parse::<std::net::IpAddr>() else {
                        continue;
                    };
                    let link_local = match parsed {
                        std::net::IpAddr::V4(v4) => v4.is_link_local(),
                        std::net::IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
                    };
                    if parsed.is_loopback() || link_local || parsed.is_unspecified() {
                        continue;
                    }
                    out.push(MachineAddress {
                        type_: MachineAddressType::InternalIp,
                        address: addr.to_string(),
                    });
                }
            }
        }
        out.push(MachineAddress {
            type_: MachineAddressType::Hostname,
            address: name.to_string(),
        });
        out
    }
}

fn spec_of(request: &MachineRequest) -> Result<&ProxmoxMachineSpec, BackendError> {
    match &request.spec {
        MachineSpec::Proxmox(spec) => Ok(spec),
        other => Err(BackendError::terminal(
            "UnsupportedMachineKind",
            format!(
                "a proxmox Provider serves ProxmoxMachines, not {}",
                other.kind()
            ),
        )),
    }
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
        let spec = spec_of(request)?;
        let identity = &request.identity;
        if identity.uid.is_empty() {
            return Err(BackendError::terminal(
                "InvalidRequest",
                "the machine identity has an empty uid",
            ));
        }
        let resources = self.resources().await?;
        let found = self.find(identity, &resources).await?;
        if let (None, Some(provider_id)) = (&found, &identity.provider_id) {
            return Err(BackendError::machine_missing(
                provider_id,
                self.client.endpoint(),
            ));
        }
        let Some(found) = found else {
            // Not there: a clone may be in flight (or just failed).
            match self.poll(&identity.uid).await {
                Ok(Some((kind, upid))) => {
                    return Ok(MachineObservation {
                        pending: Some(self.pending(kind, Some(&upid))),
                        ..Default::default()
                    });
                }
                Ok(None) => {}
                Err(e) => {
                    self.failed_clones()
                        .insert(identity.uid.clone(), (e.clone(), Instant::now()));
                    return Err(e);
                }
            }
            // A failed clone is reported for a while before the next attempt.
            let backoff = self.settings.failed_clone_backoff;
            let failed = self.failed_clones().get(&identity.uid).cloned();
            if let Some((error, at)) = failed
                && at.elapsed() < backoff
            {
                return Err(error.retry_after(backoff.saturating_sub(at.elapsed())));
            }
            self.failed_clones().remove(&identity.uid);
            return self.start_clone(request, spec, &resources).await;
        };
        let backend_ref = Some(format!("{}/{}", found.node, found.vmid));
        let observation = |pending: Option<Pending>| MachineObservation {
            failure_domain: Some(found.node.clone()),
            backend_ref: backend_ref.clone(),
            pending,
            ..Default::default()
        };
        if found.lock.as_deref() == Some("clone") {
            let task = self.ops().get(&identity.uid).map(|o| o.upid.clone());
            return Ok(observation(Some(
                self.pending(OpKind::Clone, task.as_ref()),
            )));
        }
        if let Some((kind, upid)) = self.poll(&identity.uid).await? {
            return Ok(observation(Some(self.pending(kind, Some(&upid)))));
        }
        let path = vm_path(&found.node, found.vmid);
        let current = self
            .client
            .get(&format!("{path}/config"), &Form::new())
            .await
            .map_err(pve)?;
        if found.adopted {
            self.client
                .put(
                    &format!("{path}/config"),
                    &config::adoption(identity, &current),
                )
                .await
                .map_err(pve)?;
            info!(uid = %identity.uid, vmid = found.vmid, node = %found.node, "proxmox: adopted (retagged with the new UID)");
            return Ok(observation(Some(Pending {
                operation: "Adopting".into(),
                task: None,
                retry_after: Duration::from_millis(100),
            })));
        }
        if !found.configured {
            if let Some(lock) = &found.lock {
                return Err(BackendError::transient(
                    "VMLocked",
                    format!("VM {} is locked ({lock})", found.vmid),
                ));
            }
            let seed = match &request.bootstrap {
                Some(bootstrap) => {
                    match self
                        .ensure_seed(request, spec, bootstrap, &found, &current)
                        .await?
                    {
                        Ok(drive) => Some(drive),
                        Err(upid) => {
                            return Ok(observation(Some(
                                self.pending(OpKind::UploadSeed, Some(&upid)),
                            )));
                        }
                    }
                }
                None => None,
            };
            let form = config::machine_config(
                spec,
                identity,
                request.bootstrap.as_ref(),
                seed.as_ref(),
                &current,
            );
            self.client
                .put(&format!("{path}/config"), &form)
                .await
                .map_err(pve)?;
            info!(uid = %identity.uid, vmid = found.vmid, node = %found.node, "proxmox: configured");
            if let Some(resize) = config::disk_resize(spec, &current) {
                let data = self
                    .client
                    .put(&format!("{path}/resize"), &resize)
                    .await
                    .map_err(pve)?;
                if data.is_string() {
                    let upid = self.remember(&identity.uid, OpKind::Resize, &data)?;
                    return Ok(observation(Some(self.pending(OpKind::Resize, Some(&upid)))));
                }
            }
            return Ok(observation(Some(Pending {
                operation: "Configuring".into(),
                task: None,
                retry_after: Duration::from_millis(100),
            })));
        }
        let provider_id = config::smbios_uuid(&current).map(|u| format!("proxmox://{u}"));
        let status = self
            .client
            .get(&format!("{path}/status/current"), &Form::new())
            .await
            .map_err(pve)?;
        let power = power_of(&status);
        // Spec changes after the first configuration (see `drift`).
        let pending_config = drift::read_pending(
            &self
                .client
                .get(&format!("{path}/pending"), &Form::new())
                .await
                .map_err(pve)?,
        );
        let changes = drift::spec_changes(spec, &pending_config.effective);
        let resize = config::disk_resize(spec, &pending_config.effective);
        if !changes.is_empty() || resize.is_some() {
            if let Some(lock) = &found.lock {
                return Err(BackendError::transient(
                    "VMLocked",
                    format!("VM {} is locked ({lock})", found.vmid),
                ));
            }
            let (kind, data) = if changes.is_empty() {
                let resize = resize.unwrap_or_default();
                let data = self
                    .client
                    .put(&format!("{path}/resize"), &resize)
                    .await
                    .map_err(pve)?;
                (OpKind::Resize, data)
            } else {
                self.client
                    .put(&format!("{path}/config"), &changes)
                    .await
                    .map_err(pve)?;
                (OpKind::Resize, Value::Null)
            };
            info!(uid = %identity.uid, vmid = found.vmid, config = ?changes, "proxmox: applying spec changes");
            let pending = if data.is_string() {
                let upid = self.remember(&identity.uid, kind, &data)?;
                self.pending(kind, Some(&upid))
            } else {
                Pending {
                    operation: "Reconfiguring".into(),
                    task: None,
                    retry_after: Duration::from_millis(100),
                }
            };
            return Ok(MachineObservation {
                provider_id,
                power_state: Some(power),
                ..observation(Some(pending))
            });
        }
        let want = spec.power_state;
        let action = match (want, power) {
            (PowerState::PoweredOn, PowerState::PoweredOff) => {
                Some((OpKind::Start, "start", Form::new()))
            }
            (PowerState::PoweredOn, PowerState::Suspended) => {
                Some((OpKind::Resume, "resume", Form::new()))
            }
            (PowerState::PoweredOff, PowerState::PoweredOn | PowerState::Suspended) => Some((
                OpKind::Shutdown,
                "shutdown",
                Form::new()
                    .set("timeout", self.settings.shutdown_timeout)
                    .set("forceStop", 1),
            )),
            (PowerState::Suspended, PowerState::PoweredOn) => {
                Some((OpKind::Suspend, "suspend", Form::new()))
            }
            (PowerState::Suspended, PowerState::PoweredOff) => {
                Some((OpKind::Start, "start", Form::new()))
            }
            _ => None,
        };
        if let Some((kind, verb, form)) = action {
            if let Some(lock) = &found.lock {
                return Err(BackendError::transient(
                    "VMLocked",
                    format!("VM {} is locked ({lock})", found.vmid),
                ));
            }
            let data = self
                .client
                .post(&format!("{path}/status/{verb}"), &form)
                .await
                .map_err(pve)?;
            let upid = self.remember(&identity.uid, kind, &data)?;
            return Ok(MachineObservation {
                provider_id,
                power_state: Some(power),
                ..observation(Some(self.pending(kind, Some(&upid))))
            });
        }
        let addresses = if power == PowerState::PoweredOn {
            self.addresses(&found, &config::vm_name(identity)).await
        } else {
            Vec::new()
        };
        // Running on the old config: say so until someone restarts it.
        let restart = (power != PowerState::PoweredOff && !pending_config.waiting.is_empty())
            .then(|| {
                debug!(uid = %identity.uid, keys = ?pending_config.waiting, "proxmox: changes wait for a restart");
                Pending {
                    operation: RESTART_PENDING.into(),
                    task: None,
                    retry_after: RESTART_PENDING_RECHECK,
                }
            });
        Ok(MachineObservation {
            provider_id,
            power_state: Some(power),
            addresses,
            ..observation(restart)
        })
    }

    async fn observe(
        &self,
        identity: &MachineIdentity,
    ) -> Result<Option<MachineObservation>, BackendError> {
        let resources = self.resources().await?;
        let Some(found) = self.find(identity, &resources).await? else {
            return Ok(None);
        };
        let path = vm_path(&found.node, found.vmid);
        let current = self
            .client
            .get(&format!("{path}/config"), &Form::new())
            .await
            .map_err(pve)?;
        let status = self
            .client
            .get(&format!("{path}/status/current"), &Form::new())
            .await
            .map_err(pve)?;
        let power = power_of(&status);
        let addresses = if power == PowerState::PoweredOn {
            self.addresses(&found, &config::vm_name(identity)).await
        } else {
            Vec::new()
        };
        let pending = self
            .ops()
            .get(&identity.uid)
            .map(|op| self.pending(op.kind, Some(&op.upid)));
        Ok(Some(MachineObservation {
            provider_id: config::smbios_uuid(&current).map(|u| format!("proxmox://{u}")),
            power_state: Some(power),
            addresses,
            failure_domain: Some(found.node.clone()),
            backend_ref: Some(format!("{}/{}", found.node, found.vmid)),
            pending,
        }))
    }

    async fn delete(&self, identity: &MachineIdentity) -> Result<Deletion, BackendError> {
        let retry_after = self.settings.task_poll_interval;
        let resources = self.resources().await?;
        let found = self.find(identity, &resources).await?;
        let running = match self.poll(&identity.uid).await {
            Ok(op) => op,
            // A failed clone or power task does not block deletion.
            Err(e) if found.is_none() || !e.is_transient() => None,
            Err(e) => return Err(e),
        };
        let Some(found) = found else {
            return Ok(match running {
                Some(_) => Deletion::InProgress { retry_after },
                None => Deletion::Gone,
            });
        };
        if running.is_some() || found.lock.as_deref() == Some("clone") {
            return Ok(Deletion::InProgress { retry_after });
        }
        if let Some(lock) = &found.lock {
            return Err(BackendError::transient(
                "VMLocked",
                format!("VM {} is locked ({lock})", found.vmid),
            ));
        }
        let path = vm_path(&found.node, found.vmid);
        let status = match self
            .client
            .get(&format!("{path}/status/current"), &Form::new())
            .await
        {
            Ok(s) => s,
            Err(e) if e.is_missing_vm() => return Ok(Deletion::Gone),
            Err(e) => return Err(pve(e)),
        };
        let (kind, data) = if status.get("status").and_then(Value::as_str) == Some("running") {
            let data = self
                .client
                .post(&format!("{path}/status/stop"), &Form::new())
                .await
                .map_err(pve)?;
            (OpKind::Stop, data)
        } else {
            // ISO volumes are not the VM's own disks: PVE's purge leaves them.
            if let Some(progress) = self.delete_seed(identity, &found).await? {
                return Ok(progress);
            }
            let query = Form::new()
                .set("purge", 1)
                .set("destroy-unreferenced-disks", 1);
            match self.client.delete(&path, &query).await {
                Ok(data) => (OpKind::Destroy, data),
                Err(e) if e.is_missing_vm() => return Ok(Deletion::Gone),
                Err(e) => return Err(pve(e)),
            }
        };
        self.remember(&identity.uid, kind, &data)?;
        info!(uid = %identity.uid, vmid = found.vmid, operation = kind.operation(), "proxmox: deleting");
        Ok(Deletion::InProgress { retry_after })
    }
}
