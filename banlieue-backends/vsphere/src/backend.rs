//! [`VSphereBackend`]: the [`Backend`] implementation, and [`VSphereFactory`].

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use banlieue_sdk::api::common::{Firmware, PowerState};
use banlieue_sdk::api::infra::vsphere::{CloneMode, VSphereMachineSpec};
use banlieue_sdk::api::infra::{MachineAddress, MachineAddressType};
use banlieue_sdk::async_trait;
use banlieue_sdk::backend::{
    Backend, BackendError, BackendFactory, Connection, Deletion, ImageLookup, ImageSourceSet,
    Inventory, MachineIdentity, MachineObservation, MachineRequest, MachineSpec, Pending,
};
use tracing::{debug, info};

use crate::client::methods::{self, CloneSpec, ConfigSpec, RelocateSpec};
use crate::client::{MoRef, ObjectContent, PropertySpec, TaskState, VimClient, VimError};
use crate::devices::{self, NetworkBacking, WantedNic};
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
    Configure,
    PowerOn,
    PowerOff,
    Suspend,
    Destroy,
}

impl OpKind {
    fn operation(self) -> &'static str {
        match self {
            Self::Clone => "Cloning",
            Self::Configure => "Configuring",
            Self::PowerOn => "PoweringOn",
            Self::PowerOff => "PoweringOff",
            Self::Suspend => "Suspending",
            Self::Destroy => "Deleting",
        }
    }

    fn method(self) -> &'static str {
        match self {
            Self::Clone => "CloneVM_Task",
            Self::Configure => "ReconfigVM_Task",
            Self::PowerOn => "PowerOnVM_Task",
            Self::PowerOff => "PowerOffVM_Task",
            Self::Suspend => "SuspendVM_Task",
            Self::Destroy => "Destroy_Task",
        }
    }

    fn failure_reason(self) -> &'static str {
        match self {
            Self::Clone => "CloneFailed",
            Self::Configure => "ReconfigureFailed",
            Self::PowerOn => "PowerOnFailed",
            Self::PowerOff => "PowerOffFailed",
            Self::Suspend => "SuspendFailed",
            Self::Destroy => "DeleteFailed",
        }
    }
}

#[derive(Clone, Debug)]
struct Op {
    kind: OpKind,
    task: MoRef,
}

/// A VM as banlieue reads it.
#[derive(Clone, Debug)]
pub(crate) struct Vm {
    pub(crate) moref: MoRef,
    pub(crate) name: String,
    pub(crate) bios_uuid: Option<String>,
    pub(crate) extra: BTreeMap<String, String>,
    pub(crate) power: PowerState,
    pub(crate) ips: Vec<String>,
    pub(crate) tools_running: bool,
}

pub(crate) const VM_PATHS: &[&str] = &[
    "name",
    "config.uuid",
    "config.extraConfig",
    "runtime.powerState",
    "guest.ipAddress",
    "guest.net",
    "guest.toolsRunningStatus",
];

impl Vm {
    pub(crate) fn from(o: &ObjectContent) -> Self {
        let extra = o
            .prop("config.extraConfig")
            .map(methods::option_values)
            .unwrap_or_default()
            .into_iter()
            .collect();
        let mut ips: Vec<String> = o
            .prop("guest.net")
            .map(methods::guest_ips)
            .unwrap_or_default();
        if let Some(ip) = o.text("guest.ipAddress").filter(|ip| !ip.is_empty())
            && !ips.iter().any(|i| i == ip)
        {
            ips.insert(0, ip.to_string());
        }
        Self {
            moref: o.obj.clone(),
            name: o.text("name").unwrap_or_default().to_string(),
            bios_uuid: o
                .text("config.uuid")
                .filter(|u| !u.is_empty())
                .map(str::to_string),
            extra,
            power: match o.text("runtime.powerState") {
                Some("poweredOn") => PowerState::PoweredOn,
                Some("suspended") => PowerState::Suspended,
                _ => PowerState::PoweredOff,
            },
            ips,
            tools_running: o.text("guest.toolsRunningStatus") == Some("guestToolsRunning"),
        }
    }

    pub(crate) fn addresses(&self) -> Vec<MachineAddress> {
        let mut out: Vec<MachineAddress> = Vec::new();
        for ip in &self.ips {
            let Ok(parsed) = ip.parse::<IpAddr>() else {
                continue;
            };
            let link_local = match parsed {
                IpAddr::V4(v4) => v4.is_link_local(),
                IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
            };
            if parsed.is_loopback() || link_local || parsed.is_unspecified() {
                continue;
            }
            if !out.iter().any(|a| a.address == *ip) {
                out.push(MachineAddress {
                    type_: MachineAddressType::InternalIp,
                    address: ip.clone(),
                });
            }
        }
        out
    }
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
    ops: Mutex<HashMap<String, Op>>,
    shutdowns: Mutex<HashMap<String, Instant>>,
    failed_clones: Mutex<HashMap<String, (BackendError, Instant)>>,
    topology: tokio::sync::Mutex<Option<(Arc<Topology>, Instant)>>,
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
    match &request.spec {
        MachineSpec::VSphere(spec) => Ok(spec),
        other => Err(BackendError::terminal(
            "UnsupportedMachineKind",
            format!(
                "a vsphere Provider serves VSphereMachines, not {}",
                other.kind()
            ),
        )),
    }
}

fn check_uid(identity: &MachineIdentity) -> Result<(), BackendError> {
    if is_uuid(&identity.uid) {
        Ok(())
    } else {
        Err(BackendError::terminal(
            "InvalidRequest",
            format!(
                "the machine's uid {:?} is not a UUID (it becomes the VM's instance UUID)",
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
            ops: Mutex::new(HashMap::new()),
            shutdowns: Mutex::new(HashMap::new()),
            failed_clones: Mutex::new(HashMap::new()),
            topology: tokio::sync::Mutex::new(None),
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

    fn pending(&self, kind: OpKind, task: Option<&MoRef>) -> Pending {
        Pending {
            operation: kind.operation().to_string(),
            task: task.map(|t| t.value.clone()),
            retry_after: self.settings.task_poll_interval,
        }
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

    /// The VM whose instance UUID is the UID.
    async fn find(&self, identity: &MachineIdentity) -> Result<Option<Vm>, BackendError> {
        let Some(moref) = self
            .client
            .find_vm_by_instance_uuid(&identity.uid)
            .await
            .map_err(vim)?
        else {
            return Ok(None);
        };
        Ok(self
            .client
            .properties(&moref, VM_PATHS)
            .await
            .map_err(vim)?
            .map(|o| Vm::from(&o)))
    }

    /// Polls the task in flight for `uid`: `Some` while it runs; a finished task is
    /// forgotten, a failed one returned as an error with vSphere's message.
    async fn poll(&self, uid: &str) -> Result<Option<(OpKind, MoRef)>, BackendError> {
        let Some(op) = lock(&self.ops).get(uid).cloned() else {
            return Ok(None);
        };
        match self.client.task_state(&op.task).await.map_err(vim)? {
            Some(TaskState::Running) => Ok(Some((op.kind, op.task))),
            Some(TaskState::Succeeded(_)) | None => {
                lock(&self.ops).remove(uid);
                Ok(None)
            }
            Some(TaskState::Failed(fault)) => {
                lock(&self.ops).remove(uid);
                info!(uid, task = %op.task, %fault, "vsphere: task failed");
                let message = format!("{} failed: {fault}", op.kind.method());
                Err(match (op.kind, fault.kind.as_str()) {
                    // Someone else's lock or a concurrent change: try again.
                    (_, "TaskInProgress" | "ConcurrentAccess" | "InvalidState") => {
                        BackendError::transient("Busy", message)
                    }
                    // A clone from before a restart still running, or a name taken.
                    (OpKind::Clone, "DuplicateName") => {
                        BackendError::transient(op.kind.failure_reason(), message)
                    }
                    (OpKind::Clone | OpKind::Configure | OpKind::PowerOn, _) => {
                        BackendError::terminal(op.kind.failure_reason(), message)
                    }
                    _ => BackendError::transient(op.kind.failure_reason(), message),
                })
            }
        }
    }

    async fn start(&self, uid: &str, kind: OpKind, body: &str) -> Result<MoRef, BackendError> {
        let task = self.client.start_task(body).await.map_err(vim)?;
        debug!(uid, task = %task, operation = kind.operation(), "vsphere: task started");
        lock(&self.ops).insert(
            uid.to_string(),
            Op {
                kind,
                task: task.clone(),
            },
        );
        Ok(task)
    }

    /// A template by inventory path (`/DC0/vm/templates/ubuntu`) or by name.
    async fn resolve_template(&self, template: &str) -> Result<Option<MoRef>, BackendError> {
        if template.starts_with('/') {
            return self.client.find_by_path(template).await.map_err(vim);
        }
        let root = self
            .client
            .content()
            .await
            .map_err(vim)?
            .root_folder
            .clone();
        let vms = self
            .client
            .retrieve_all(
                &root,
                &["VirtualMachine"],
                &[PropertySpec {
                    kind: "VirtualMachine",
                    paths: &["name"],
                }],
            )
            .await
            .map_err(vim)?;
        Ok(vms
            .into_iter()
            .find(|o| o.text("name") == Some(template))
            .map(|o| o.obj))
    }

    /// A resource pool or folder given as an absolute inventory path, or relative to
    /// `base`.
    async fn resolve_path(
        &self,
        path: &str,
        base: &str,
        what: &str,
    ) -> Result<MoRef, BackendError> {
        let full = if path.starts_with('/') {
            path.to_string()
        } else {
            format!("{base}/{path}")
        };
        self.client
            .find_by_path(&full)
            .await
            .map_err(vim)?
            .ok_or_else(|| {
                BackendError::terminal(
                    format!("{what}NotFound"),
                    format!("no {what} at inventory path {full:?}"),
                )
            })
    }

    async fn start_clone(
        &self,
        request: &MachineRequest,
        spec: &VSphereMachineSpec,
    ) -> Result<MachineObservation, BackendError> {
        let identity = &request.identity;
        if let Some(policy) = &spec.storage_policy_name {
            return Err(BackendError::terminal(
                "StoragePolicyUnsupported",
                format!(
                    "storagePolicyName {policy:?}: storage policies are not supported yet; name a datastore"
                ),
            ));
        }
        let template = self
            .resolve_template(&spec.template)
            .await?
            .ok_or_else(|| {
                BackendError::terminal(
                    "TemplateNotFound",
                    format!(
                        "no template {:?} on {}",
                        spec.template,
                        self.client.endpoint()
                    ),
                )
            })?;
        let topology = self.topology(false).await?;
        let from_fd = request
            .failure_domain
            .as_deref()
            .and_then(inventory::parse_failure_domain);
        let dc_name = spec
            .datacenter
            .clone()
            .or_else(|| from_fd.map(|(dc, _)| dc.to_string()))
            .or_else(|| self.settings.datacenter.clone())
            .or_else(|| {
                (topology.datacenters.len() == 1)
                    .then(|| topology.datacenters.keys().next().cloned())
                    .flatten()
            })
            .ok_or_else(|| {
                BackendError::terminal(
                    "NoPlacement",
                    "the machine names no datacenter, it has no failure domain, and the vCenter has several datacenters",
                )
            })?;
        let dc_name = dc_name.trim_start_matches('/').to_string();
        let dc = topology.datacenters.get(&dc_name).ok_or_else(|| {
            BackendError::terminal("DatacenterNotFound", format!("no datacenter {dc_name:?}"))
        })?;
        let cluster_name = spec
            .cluster
            .clone()
            .or_else(|| from_fd.map(|(_, c)| c.to_string()))
            .or_else(|| {
                let mut in_dc = topology.clusters.iter().filter(|c| c.datacenter == dc_name);
                match (in_dc.next(), in_dc.next()) {
                    (Some(only), None) => Some(only.name.clone()),
                    _ => None,
                }
            })
            .ok_or_else(|| {
                BackendError::terminal(
                    "NoPlacement",
                    format!("the machine names no cluster and datacenter {dc_name:?} has several"),
                )
            })?;
        let cluster = topology.cluster(&dc_name, &cluster_name).ok_or_else(|| {
            BackendError::terminal(
                "ClusterNotFound",
                format!("no compute cluster {cluster_name:?} in datacenter {dc_name:?}"),
            )
        })?;
        let pool = match &spec.resource_pool {
            Some(p) => {
                self.resolve_path(
                    p,
                    &format!("/{dc_name}/host/{cluster_name}/Resources"),
                    "ResourcePool",
                )
                .await?
            }
            None => cluster.resource_pool.clone().ok_or_else(|| {
                BackendError::terminal(
                    "ResourcePoolNotFound",
                    format!("cluster {cluster_name:?} has no resource pool"),
                )
            })?,
        };
        let folder = match &spec.folder {
            Some(f) => {
                self.resolve_path(f, &format!("/{dc_name}/vm"), "Folder")
                    .await?
            }
            None => dc.vm_folder.clone().ok_or_else(|| {
                BackendError::terminal(
                    "FolderNotFound",
                    format!("datacenter {dc_name:?} has no VM folder"),
                )
            })?,
        };
        let datastore = match &spec.datastore {
            Some(name) => Some(match cluster.datastores.get(name) {
                Some(ds) => ds.clone(),
                None => {
                    self.resolve_path(name, &format!("/{dc_name}/datastore"), "Datastore")
                        .await?
                }
            }),
            None => None,
        };
        let (snapshot, disk_move_type) = if spec.clone_mode == CloneMode::LinkedClone {
            let snap = self
                .client
                .properties(&template, &["snapshot.currentSnapshot"])
                .await
                .map_err(vim)?
                .and_then(|o| o.moref("snapshot.currentSnapshot"))
                .ok_or_else(|| {
                    BackendError::terminal(
                        "LinkedCloneNeedsSnapshot",
                        format!(
                            "template {:?} has no snapshot to link clones to",
                            spec.template
                        ),
                    )
                })?;
            (Some(snap), Some("createNewChildDiskBacking".to_string()))
        } else {
            (None, None)
        };
        let fd = inventory::failure_domain_name(&dc_name, &cluster_name);
        let clone = CloneSpec {
            location: RelocateSpec {
                datastore,
                disk_move_type,
                pool: Some(pool),
                ..Default::default()
            },
            template: false,
            config: Some(ConfigSpec {
                instance_uuid: Some(identity.uid.clone()),
                annotation: Some(format!(
                    "Managed by banlieue: {}/{} (uid {})",
                    identity.namespace, identity.name, identity.uid
                )),
                num_cpus: Some(spec.num_cpus),
                num_cores_per_socket: spec.num_cores_per_socket,
                memory_mib: Some(spec.memory_mib),
                extra_config: guestinfo::clone_keys(identity, &fd),
                device_change: Vec::new(),
                firmware: spec.firmware.map(|f| match f {
                    Firmware::Bios => "bios".to_string(),
                    _ => "efi".to_string(),
                }),
            }),
            power_on: false,
            snapshot,
        };
        let task = self
            .start(
                &identity.uid,
                OpKind::Clone,
                &methods::clone_vm_task(&template, &folder, &identity.name, &clone),
            )
            .await?;
        info!(uid = %identity.uid, template = %spec.template, failure_domain = %fd, "vsphere: cloning");
        Ok(MachineObservation {
            failure_domain: Some(fd),
            pending: Some(self.pending(OpKind::Clone, Some(&task))),
            ..Default::default()
        })
    }

    /// Device edits for the configuring reconfigure: network devices onto the
    /// machine's port groups, the first disk grown to `diskGiB`.
    async fn device_changes(
        &self,
        vm: &Vm,
        spec: &VSphereMachineSpec,
    ) -> Result<Vec<methods::DeviceChange>, BackendError> {
        if spec.network.is_empty() && spec.disk_gib.is_none() && spec.additional_disks.is_empty() {
            return Ok(Vec::new());
        }
        let devices = self
            .client
            .properties(&vm.moref, &["config.hardware.device"])
            .await
            .map_err(vim)?
            .and_then(|o| o.prop("config.hardware.device").map(devices::devices))
            .unwrap_or_default();
        let mut changes = Vec::new();
        if !spec.network.is_empty() {
            let mut wanted = Vec::new();
            for nic in &spec.network {
                wanted.push(WantedNic {
                    backing: self.network_backing(vm, &nic.network_name).await?,
                    mac_address: nic.mac_address.clone(),
                });
            }
            changes.extend(devices::nic_edits(&devices, &wanted)?);
        }
        if let Some(gib) = spec.disk_gib {
            changes.extend(devices::disk_grow(&devices, gib));
        }
        changes.extend(devices::disk_adds(&devices, &spec.additional_disks)?);
        Ok(changes)
    }

    /// A port group by name (among the networks of the VM's cluster, else any
    /// cluster's) or inventory path, as a NIC backing.
    async fn network_backing(&self, vm: &Vm, name: &str) -> Result<NetworkBacking, BackendError> {
        let network = if name.starts_with('/') {
            self.client.find_by_path(name).await.map_err(vim)?
        } else {
            let topology = self.topology(false).await?;
            let home = vm
                .extra
                .get(guestinfo::FAILURE_DOMAIN_KEY)
                .and_then(|fd| inventory::parse_failure_domain(fd))
                .and_then(|(dc, c)| topology.cluster(dc, c));
            home.and_then(|c| c.networks.get(name))
                .or_else(|| topology.clusters.iter().find_map(|c| c.networks.get(name)))
                .cloned()
        };
        let network = network.ok_or_else(|| {
            BackendError::terminal("NetworkNotFound", format!("no port group {name:?}"))
        })?;
        if network.kind != "DistributedVirtualPortgroup" {
            return Ok(NetworkBacking::Standard {
                name: name.rsplit('/').next().unwrap_or(name).to_string(),
                network,
            });
        }
        let pg = self
            .client
            .properties(&network, &["key", "config.distributedVirtualSwitch"])
            .await
            .map_err(vim)?;
        let key = pg.as_ref().and_then(|o| o.text("key")).map(str::to_string);
        let dvs = pg
            .as_ref()
            .and_then(|o| o.moref("config.distributedVirtualSwitch"));
        let uuid = match &dvs {
            Some(dvs) => self
                .client
                .properties(dvs, &["uuid"])
                .await
                .map_err(vim)?
                .and_then(|o| o.text("uuid").map(str::to_string)),
            None => None,
        };
        match (key, uuid) {
            (Some(portgroup_key), Some(switch_uuid)) => Ok(NetworkBacking::Distributed {
                switch_uuid,
                portgroup_key,
            }),
            _ => Err(BackendError::transient(
                "NetworkNotFound",
                format!("distributed port group {name:?} has no key or switch"),
            )),
        }
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
            provider_id: vm.bios_uuid.as_ref().map(|u| format!("vsphere://{u}")),
            power_state: Some(vm.power),
            addresses,
            failure_domain: vm.extra.get(guestinfo::FAILURE_DOMAIN_KEY).cloned(),
            backend_ref: Some(vm.moref.value.clone()),
            pending,
        }
    }

    /// Powers a VM off: a guest shutdown first when VMware Tools runs, a hard power-off
    /// when there are no Tools or the shutdown took longer than `shutdownTimeout`.
    async fn power_off(&self, uid: &str, vm: &Vm) -> Result<Pending, BackendError> {
        let asked = lock(&self.shutdowns).get(uid).copied();
        let hard = !vm.tools_running
            || vm.power == PowerState::Suspended
            || asked.is_some_and(|at| at.elapsed() >= self.settings.shutdown_timeout);
        if !hard {
            if asked.is_none() {
                match self
                    .client
                    .call(&methods::vm_call("ShutdownGuest", &vm.moref))
                    .await
                {
                    Ok(_) => {
                        lock(&self.shutdowns).insert(uid.to_string(), Instant::now());
                    }
                    // No Tools after all: power off.
                    Err(VimError::Fault(f)) if f.kind.starts_with("Tools") => {
                        return self.hard_power_off(uid, vm).await;
                    }
                    Err(e) => return Err(vim(e)),
                }
            }
            return Ok(Pending {
                operation: "ShuttingDown".into(),
                task: None,
                retry_after: self.settings.task_poll_interval,
            });
        }
        self.hard_power_off(uid, vm).await
    }

    async fn hard_power_off(&self, uid: &str, vm: &Vm) -> Result<Pending, BackendError> {
        lock(&self.shutdowns).remove(uid);
        let task = self
            .start(
                uid,
                OpKind::PowerOff,
                &methods::vm_call("PowerOffVM_Task", &vm.moref),
            )
            .await?;
        Ok(self.pending(OpKind::PowerOff, Some(&task)))
    }
}

#[async_trait]
impl Backend for VSphereBackend {
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
        Ok(match self.resolve_template(template).await? {
            Some(moref) => ImageLookup::Available {
                resolved: moref.value,
            },
            None => ImageLookup::Missing {
                message: format!("no template {template:?} on {}", self.client.endpoint()),
            },
        })
    }

    async fn ensure(&self, request: &MachineRequest) -> Result<MachineObservation, BackendError> {
        let spec = spec_of(request)?;
        let identity = &request.identity;
        check_uid(identity)?;
        let uid = &identity.uid;
        let Some(vm) = self.find(identity).await? else {
            match self.poll(uid).await {
                Ok(Some((kind, task))) => {
                    return Ok(MachineObservation {
                        pending: Some(self.pending(kind, Some(&task))),
                        ..Default::default()
                    });
                }
                Ok(None) => {}
                Err(e) => {
                    lock(&self.failed_clones).insert(uid.clone(), (e.clone(), Instant::now()));
                    return Err(e);
                }
            }
            // A clone that just finished is visible now.
            if let Some(vm) = self.find(identity).await? {
                return Ok(self.observation(
                    &vm,
                    Some(Pending {
                        operation: "Configuring".into(),
                        task: None,
                        retry_after: Duration::from_millis(100),
                    }),
                ));
            }
            // A failed clone is reported for a while before the next attempt.
            let backoff = self.settings.failed_clone_backoff;
            let failed = lock(&self.failed_clones).get(uid).cloned();
            if let Some((error, at)) = failed
                && at.elapsed() < backoff
            {
                return Err(error.retry_after(backoff.saturating_sub(at.elapsed())));
            }
            lock(&self.failed_clones).remove(uid);
            return self.start_clone(request, spec).await;
        };
        if let Some((kind, task)) = self.poll(uid).await? {
            return Ok(self.observation(&vm, Some(self.pending(kind, Some(&task)))));
        }
        if vm.extra.get(guestinfo::CONFIGURED_KEY).map(String::as_str) != Some("true") {
            let config = ConfigSpec {
                device_change: self.device_changes(&vm, spec).await?,
                extra_config: guestinfo::bootstrap_keys(
                    identity,
                    &vm.name,
                    request.bootstrap.as_ref(),
                ),
                ..Default::default()
            };
            let task = self
                .start(
                    uid,
                    OpKind::Configure,
                    &methods::reconfig_vm_task(&vm.moref, &config),
                )
                .await?;
            info!(uid = %uid, vm = %vm.moref, "vsphere: configuring guestinfo");
            return Ok(self.observation(&vm, Some(self.pending(OpKind::Configure, Some(&task)))));
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
            return Ok(self.observation(&vm, Some(self.pending(kind, Some(&task)))));
        }
        lock(&self.shutdowns).remove(uid);
        let waiting = want == PowerState::PoweredOn
            && self.settings.wait_for_address
            && vm.addresses().is_empty();
        let pending = waiting.then(|| Pending {
            operation: "WaitingForAddress".into(),
            task: None,
            retry_after: self.settings.task_poll_interval,
        });
        Ok(self.observation(&vm, pending))
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
        let pending = lock(&self.ops)
            .get(&identity.uid)
            .map(|op| self.pending(op.kind, Some(&op.task)));
        Ok(Some(self.observation(&vm, pending)))
    }

    async fn delete(&self, identity: &MachineIdentity) -> Result<Deletion, BackendError> {
        let retry_after = self.settings.task_poll_interval;
        if !is_uuid(&identity.uid) {
            return Ok(Deletion::Gone);
        }
        let uid = &identity.uid;
        let vm = self.find(identity).await?;
        let running = match self.poll(uid).await {
            Ok(op) => op,
            // A failed clone or power task does not block deletion.
            Err(e) if vm.is_none() || !e.is_transient() || e.reason != "DeleteFailed" => None,
            Err(e) => return Err(e),
        };
        let Some(vm) = vm else {
            lock(&self.failed_clones).remove(uid);
            return Ok(match running {
                Some(_) => Deletion::InProgress { retry_after },
                None => Deletion::Gone,
            });
        };
        if running.is_some() {
            return Ok(Deletion::InProgress { retry_after });
        }
        if vm.power != PowerState::PoweredOff {
            self.hard_power_off(uid, &vm).await?;
            info!(uid = %uid, vm = %vm.moref, "vsphere: powering off to delete");
            return Ok(Deletion::InProgress { retry_after });
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
        Ok(Deletion::InProgress { retry_after })
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
