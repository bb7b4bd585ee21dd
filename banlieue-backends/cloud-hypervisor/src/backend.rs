//! [`ChBackend`]: the [`Backend`] implementation, and [`ChFactory`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::{Duration, Instant};

use banlieue_sdk::api::common::{DiskProvisioning, PowerState};
use banlieue_sdk::api::infra::cloud_hypervisor::CloudHypervisorMachineSpec;
use banlieue_sdk::api::resources::MachineField;
use banlieue_sdk::async_trait;
use banlieue_sdk::backend::{
    Backend, BackendError, BackendFactory, Connection, Deletion, DiskTransfer, ImageLookup,
    ImageSourceSet, Inventory, MachineIdentity, MachineObservation, MachineRequest, MadeFor,
    Pending,
};
use tracing::{info, warn};

use crate::addresses;
use crate::changes;
use crate::client::{ApiError, VmmClient};
use crate::disks::import;
use crate::inventory;
use crate::prepare;
use crate::settings::ChSettings;
use crate::state::{Exit, Intent, Record, VmDir, now_ms};
use crate::supervisor;

/// How long a VMM version read with `vmm.ping` is reused by `check`.
const VERSION_TTL: Duration = Duration::from_secs(600);

/// The [`BackendFactory`] of the `cloud-hypervisor` Provider class.
#[derive(Clone, Debug, Default)]
pub struct ChFactory;

impl ChFactory {
    /// A factory.
    pub fn new() -> Self {
        Self
    }

    /// Like [`BackendFactory::connect`], with the concrete type.
    pub fn connect_ch(&self, connection: &Connection) -> Result<Arc<ChBackend>, BackendError> {
        Ok(Arc::new(ChBackend::new(ChSettings::parse(connection)?)))
    }
}

impl BackendFactory for ChFactory {
    fn connect(&self, connection: &Connection) -> Result<Arc<dyn Backend>, BackendError> {
        Ok(self.connect_ch(connection)?)
    }
}

/// One lock per machine directory, shared by every backend in the process: the
/// operator may hold two backends for one Provider while its settings change, and
/// two reconciles of one machine must never start two VMMs.
static LOCKS: LazyLock<Mutex<HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>> =
    LazyLock::new(Default::default);

pub(crate) async fn lock(path: &Path) -> tokio::sync::OwnedMutexGuard<()> {
    let mutex = LOCKS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .entry(path.to_owned())
        .or_default()
        .clone();
    mutex.lock_owned().await
}

/// Cloud Hypervisor VMMs on this host, one per machine, supervised through the
/// state directory.
#[derive(Debug)]
pub struct ChBackend {
    settings: ChSettings,
    version: Mutex<Option<(String, Instant)>>,
    /// Since when each machine's live VMM has not answered.
    silent: Mutex<HashMap<String, Instant>>,
}

pub(crate) fn spec_of(
    request: &MachineRequest,
) -> Result<&CloudHypervisorMachineSpec, BackendError> {
    request.spec_as::<CloudHypervisorMachineSpec>()
}

fn host_error(what: &str, path: &Path, e: std::io::Error) -> BackendError {
    BackendError::transient("HostIOError", format!("{what} {}: {e}", path.display()))
}

/// The power state a VMM's `vm.info` state means.
pub(crate) fn power_of(state: Option<&str>) -> PowerState {
    match state {
        Some("Running") => PowerState::PoweredOn,
        Some("Paused") => PowerState::Suspended,
        _ => PowerState::PoweredOff,
    }
}

impl ChBackend {
    /// A backend with these settings.
    pub fn new(settings: ChSettings) -> Self {
        Self {
            settings,
            version: Mutex::new(None),
            silent: Mutex::new(HashMap::new()),
        }
    }

    /// The settings in use.
    pub fn settings(&self) -> &ChSettings {
        &self.settings
    }

    fn host(&self) -> String {
        self.settings
            .host_name
            .clone()
            .unwrap_or_else(inventory::host_name)
    }

    /// The machine's directory. It is named after the UID of the object that created
    /// it, which `spec.providerID` (`cloud-hypervisor://<that UID>`) keeps once set: a
    /// moved or restored object (new UID) finds the same VM.
    pub(crate) fn dir_of(&self, identity: &MachineIdentity) -> Result<VmDir, BackendError> {
        let key = identity.provider_id_for("cloud-hypervisor")?;
        VmDir::new(
            &self.settings.state_dir,
            key.as_deref().unwrap_or(&identity.uid),
        )
    }

    pub(crate) fn client(&self, dir: &VmDir) -> VmmClient {
        VmmClient::new(dir.socket(), self.settings.api_timeout)
    }

    /// A live VMM did not answer: remember since when, and once that is longer than
    /// `hangTimeout`, kill it so the next reconcile handles it like any dead VMM.
    fn unresponsive(&self, record: &Record, error: ApiError, op: &'static str) -> BackendError {
        if !matches!(error, ApiError::Unreachable(_)) {
            return error.into_backend(op);
        }
        let since = *self
            .silent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(record.uid.clone())
            .or_insert_with(Instant::now);
        let waited = since.elapsed();
        match record.pid {
            Some(pid) if waited >= self.settings.hang_timeout => {
                warn!(pid, uid = %record.uid, "VMM hung; killing it");
                supervisor::signal(pid, true);
                self.answered(&record.uid);
                BackendError::transient(
                    "VMMHung",
                    format!(
                        "the VMM (pid {pid}) did not answer for {}s and was killed",
                        waited.as_secs()
                    ),
                )
            }
            _ => error.into_backend(op),
        }
    }

    fn answered(&self, uid: &str) {
        self.silent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(uid);
    }

    /// Starts a VMM for `dir` and waits until it answers `vmm.ping`; returns its pid.
    async fn start_vmm(&self, dir: &VmDir) -> Result<u32, BackendError> {
        let socket = dir.socket();
        // sockaddr_un holds 108 bytes with the terminating NUL.
        if socket.as_os_str().len() > 107 {
            return Err(BackendError::terminal(
                "StateDirTooLong",
                format!(
                    "the API socket path {} is longer than a unix socket allows (107 bytes): use a shorter state directory",
                    socket.display()
                ),
            ));
        }
        match std::fs::remove_file(&socket) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(host_error("removing the stale socket", &socket, e));
            }
            _ => {}
        }
        let spawned = supervisor::spawn(&self.settings.binary, &socket, &dir.log())?;
        let pid = spawned.pid;
        let client = self.client(dir);
        let started = Instant::now();
        loop {
            if spawned.exited() {
                return Err(BackendError::terminal(
                    "VMMStartFailed",
                    format!(
                        "{} exited right after starting: {}",
                        self.settings.binary.display(),
                        supervisor::log_tail(&dir.log())
                    ),
                ));
            }
            if let Ok(ping) = client.ping().await {
                info!(pid, version = %ping.version, socket = %socket.display(), "VMM started");
                self.remember_version(ping.version);
                return Ok(pid);
            }
            if started.elapsed() > self.settings.start_timeout {
                supervisor::signal(pid, true);
                return Err(BackendError::transient(
                    "VMMStartTimeout",
                    format!(
                        "the VMM did not answer on {} within {:?}: {}",
                        socket.display(),
                        self.settings.start_timeout,
                        supervisor::log_tail(&dir.log())
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    fn remember_version(&self, version: String) {
        *self.version.lock().unwrap_or_else(PoisonError::into_inner) =
            Some((version, Instant::now()));
    }

    /// The VMM version: cached, else from a running VMM, else from a short-lived probe VMM.
    async fn vmm_version(&self) -> Result<String, BackendError> {
        if let Some((v, at)) = &*self.version.lock().unwrap_or_else(PoisonError::into_inner)
            && at.elapsed() < VERSION_TTL
        {
            return Ok(v.clone());
        }
        for dir in VmDir::all(&self.settings.state_dir) {
            let Ok(Some(record)) = dir.load() else {
                continue;
            };
            if record
                .pid
                .is_some_and(|p| supervisor::alive(p, &dir.socket()))
                && let Ok(ping) = self.client(&dir).ping().await
            {
                self.remember_version(ping.version.clone());
                return Ok(ping.version);
            }
        }
        let probe = VmDir::new(
            &self.settings.state_dir,
            &format!("probe-{}", std::process::id()),
        )?;
        std::fs::create_dir_all(probe.path())
            .map_err(|e| host_error("creating", probe.path(), e))?;
        let result = self.start_vmm(&probe).await;
        if let Ok(pid) = result {
            let _ = self.client(&probe).put("vmm.shutdown", None).await;
            for _ in 0..40 {
                if !supervisor::alive(pid, &probe.socket()) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            supervisor::signal(pid, true);
        }
        let _ = std::fs::remove_dir_all(probe.path());
        result?;
        let version = self
            .version
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        version
            .map(|(v, _)| v)
            .ok_or_else(|| BackendError::transient("VMMUnreachable", "no version from vmm.ping"))
    }

    /// The machine as observed. `vmm` is the VM configuration `vm.info` returned for a
    /// VM that runs (or is paused): what it runs with is read from it, and the record's
    /// configuration, when its sizes differ, is what the next boot uses. A machine that
    /// is off runs with nothing: its resources are those of the configuration its next
    /// boot is made from (the record's).
    fn observation(
        &self,
        record: &Record,
        dir: &VmDir,
        spec: Option<&CloudHypervisorMachineSpec>,
        power: PowerState,
        pending: Option<Pending>,
        vmm: Option<&serde_json::Value>,
    ) -> MachineObservation {
        let (resources, next_boot) = match (power, vmm) {
            (PowerState::PoweredOff, _) => (
                Some(changes::resources(dir.path(), record, &record.config, None)),
                None,
            ),
            (_, Some(config)) => {
                let running = changes::resources(dir.path(), record, config, record.booted_memory);
                let next = changes::sizes_differ(config, &record.config)
                    .then(|| changes::resources(dir.path(), record, &record.config, None));
                (Some(running), next)
            }
            // On, but not read back: say so rather than guess.
            (_, None) => (None, None),
        };
        let interfaces = spec.map_or(&record.interfaces, |s| &s.network);
        let addresses = if power == PowerState::PoweredOn {
            addresses::addresses(
                &record.name,
                interfaces,
                &record.macs,
                self.settings.dhcp_leases.as_deref(),
            )
        } else {
            Vec::new()
        };
        MachineObservation {
            next_boot,
            resources,
            provider_id: Some(format!("cloud-hypervisor://{}", record.uid)),
            power_state: Some(power),
            addresses,
            failure_domain: Some(self.host()),
            backend_ref: Some(dir.socket().to_string_lossy().into_owned()),
            pending,
        }
    }

    fn pending(&self, operation: &str, task: String) -> Option<Pending> {
        Some(Pending {
            operation: operation.to_owned(),
            task: Some(task),
            retry_after: self.settings.poll_interval,
        })
    }

    /// Brings a machine whose VMM should run to `want` (on or suspended).
    async fn run(
        &self,
        dir: &VmDir,
        record: &mut Record,
        spec: &CloudHypervisorMachineSpec,
        want: PowerState,
    ) -> Result<MachineObservation, BackendError> {
        let socket = dir.socket();
        let alive = record.pid.is_some_and(|p| supervisor::alive(p, &socket));
        if !alive {
            if let (Intent::Run, Some(pid)) = (record.intent, record.pid) {
                // It died while banlieue wanted it running: report, then restart.
                let now = now_ms();
                if record.exit.is_none() {
                    warn!(pid, uid = %record.uid, "VMM exited unexpectedly");
                    record.exit = Some(Exit {
                        pid,
                        noticed_ms: now,
                    });
                    dir.save(record)?;
                }
                let noticed = record.exit.as_ref().map_or(now, |e| e.noticed_ms);
                let waited = Duration::from_millis(now.saturating_sub(noticed));
                if let Some(left) = self.settings.restart_delay.checked_sub(waited)
                    && !left.is_zero()
                {
                    return Err(BackendError::transient(
                        "VMMExited",
                        format!(
                            "the VMM (pid {pid}) exited unexpectedly; starting it again in {}s (restart {})",
                            left.as_secs_f32().ceil(),
                            record.restarts + 1
                        ),
                    )
                    .retry_after(left));
                }
                record.restarts += 1;
            }
            record.intent = Intent::Run;
            record.power_button_ms = None;
            let pid = self.start_vmm(dir).await?;
            record.pid = Some(pid);
            record.exit = None;
            dir.save(record)?;
        } else if record.intent != Intent::Run || record.power_button_ms.is_some() {
            record.intent = Intent::Run;
            record.power_button_ms = None;
            dir.save(record)?;
        }
        let client = self.client(dir);
        let api = |op: &'static str| move |e: ApiError| e.into_backend(op);
        let info = client
            .info()
            .await
            .map_err(|e| self.unresponsive(record, e, "vm.info"))?;
        self.answered(&record.uid);
        let mut state = info.as_ref().map(|i| i.state.clone());
        // A VM that does not run and whose sizes differ from the record's (a change
        // written for its next boot) is made anew from the record: CH keeps a VM's
        // configuration across its boots.
        if let Some(info) = &info
            && matches!(info.state.as_str(), "Created" | "Shutdown")
            && changes::sizes_differ(&info.config, &record.config)
        {
            info!(uid = %record.uid, "the VM's next boot has other sizes: making it anew");
            client
                .put("vm.delete", None)
                .await
                .map_err(api("vm.delete"))?;
            state = None;
        }
        if state.is_none() {
            client
                .put("vm.create", Some(&record.config))
                .await
                .map_err(api("vm.create"))?;
            record.booted_memory = record.config["memory"]["size"].as_u64();
            dir.save(record)?;
            state = Some("Created".into());
        }
        let booted = matches!(state.as_deref(), Some("Created" | "Shutdown"));
        if booted {
            client.put("vm.boot", None).await.map_err(|e| {
                let e = e.into_backend("vm.boot");
                if e.reason == "VMMError" {
                    // CH answers 500 when it cannot open the payload or a disk.
                    BackendError::terminal("BootFailed", e.message)
                } else {
                    e
                }
            })?;
            state = Some("Running".into());
            prepare::attach_bridges(&record.uid, spec).await?;
        }
        match (want, state.as_deref()) {
            (PowerState::Suspended, Some("Running")) => {
                client
                    .put("vm.pause", None)
                    .await
                    .map_err(api("vm.pause"))?;
                state = Some("Paused".into());
            }
            (PowerState::PoweredOn, Some("Paused")) => {
                client
                    .put("vm.resume", None)
                    .await
                    .map_err(api("vm.resume"))?;
                state = Some("Running".into());
            }
            _ => {}
        }
        // Read back after whatever was done: what runs is what the VMM says.
        let vmm = client
            .info()
            .await
            .map_err(|e| self.unresponsive(record, e, "vm.info"))?
            .map(|i| i.config);
        Ok(self.observation(
            record,
            dir,
            Some(spec),
            power_of(state.as_deref()),
            None,
            vmm.as_ref(),
        ))
    }

    /// Powers a machine off: the ACPI power button first, `vm.shutdown` after the
    /// shutdown timeout. The real VMM exits when its guest powers off; the fake can too.
    async fn stop(
        &self,
        dir: &VmDir,
        record: &mut Record,
        spec: &CloudHypervisorMachineSpec,
    ) -> Result<MachineObservation, BackendError> {
        let alive = record
            .pid
            .is_some_and(|p| supervisor::alive(p, &dir.socket()));
        if !alive {
            if record.intent != Intent::Stop || record.exit.is_some() || record.pid.is_some() {
                record.intent = Intent::Stop;
                record.exit = None;
                record.power_button_ms = None;
                record.pid = None;
                dir.save(record)?;
            }
            return Ok(self.observation(
                record,
                dir,
                Some(spec),
                PowerState::PoweredOff,
                None,
                None,
            ));
        }
        let client = self.client(dir);
        let api = |op: &'static str| move |e: ApiError| e.into_backend(op);
        let info = client
            .info()
            .await
            .map_err(|e| self.unresponsive(record, e, "vm.info"))?;
        let state = info.as_ref().map(|i| i.state.clone());
        let vmm = info.as_ref().map(|i| &i.config);
        self.answered(&record.uid);
        if record.intent != Intent::Stop {
            record.intent = Intent::Stop;
            record.exit = None;
            dir.save(record)?;
        }
        match state.as_deref() {
            Some("Running") if record.power_button_ms.is_none() => {
                client
                    .put("vm.power-button", None)
                    .await
                    .map_err(api("vm.power-button"))?;
                record.power_button_ms = Some(now_ms());
                dir.save(record)?;
                let task = format!(
                    "ACPI power button pressed; vm.shutdown after {:?}",
                    self.settings.shutdown_timeout
                );
                Ok(self.observation(
                    record,
                    dir,
                    Some(spec),
                    PowerState::PoweredOn,
                    self.pending("PoweringOff", task),
                    vmm,
                ))
            }
            Some("Running" | "Paused") => {
                let pressed = record.power_button_ms.unwrap_or(0);
                let waited = Duration::from_millis(now_ms().saturating_sub(pressed));
                if state.as_deref() == Some("Running") && waited < self.settings.shutdown_timeout {
                    let task =
                        format!("waiting for the guest to power off ({}s)", waited.as_secs());
                    return Ok(self.observation(
                        record,
                        dir,
                        Some(spec),
                        PowerState::PoweredOn,
                        self.pending("PoweringOff", task),
                        vmm,
                    ));
                }
                client
                    .put("vm.shutdown", None)
                    .await
                    .map_err(api("vm.shutdown"))?;
                record.power_button_ms = None;
                dir.save(record)?;
                Ok(self.observation(record, dir, Some(spec), PowerState::PoweredOff, None, None))
            }
            _ => {
                if record.power_button_ms.take().is_some() {
                    dir.save(record)?;
                }
                Ok(self.observation(record, dir, Some(spec), PowerState::PoweredOff, None, None))
            }
        }
    }
}

#[async_trait]
impl Backend for ChBackend {
    /// [`crate::capabilities`]: what this backend does for real.
    fn capabilities(&self) -> banlieue_sdk::backend::BackendCapabilities {
        crate::capabilities()
    }

    /// `maxConcurrentCreates` when the Provider does not set it: 8 (each create prepares a disk on the host and starts a VMM process).
    fn default_max_concurrent_creates(&self) -> Option<usize> {
        Some(8)
    }

    async fn check(&self) -> Result<Inventory, BackendError> {
        let root = &self.settings.state_dir;
        std::fs::create_dir_all(root).map_err(|e| host_error("creating", root, e))?;
        let version = self.vmm_version().await?;
        Ok(Inventory {
            version: format!("Cloud Hypervisor {version}"),
            failure_domains: vec![inventory::failure_domain(&self.host(), root)],
        })
    }

    async fn find_image(&self, sources: &ImageSourceSet) -> Result<ImageLookup, BackendError> {
        let Some(source) = &sources.cloud_hypervisor else {
            return Ok(ImageLookup::Missing {
                message: "the image has no cloudHypervisor source".into(),
            });
        };
        let mut confined = source.clone();
        if let Err(refused) = crate::paths::confine(&mut confined, &self.settings.image_dirs) {
            return Ok(ImageLookup::Missing {
                message: format!("{}: {}", refused.reason, refused.message),
            });
        }
        let missing: Vec<&str> = [
            Some(&source.disk),
            source.kernel.as_ref(),
            source.firmware.as_ref(),
        ]
        .into_iter()
        .flatten()
        .map(String::as_str)
        .filter(|p| !Path::new(p).is_file())
        .collect();
        Ok(if missing.is_empty() {
            ImageLookup::Available {
                resolved: source.disk.clone(),
            }
        } else {
            ImageLookup::Missing {
                message: format!("not on the host: {}", missing.join(", ")),
            }
        })
    }

    async fn ensure(&self, request: &MachineRequest) -> Result<MachineObservation, BackendError> {
        let spec = spec_of(request)?;
        let dir = self.dir_of(&request.identity)?;
        let _guard = lock(dir.path()).await;
        let mut record = match (dir.load()?, &request.identity.provider_id) {
            (Some(mut record), _) => {
                // Found by provider ID for an object with another UID (or name): it
                // owns the machine now, and `made_for` says so.
                if record.adopt(&request.identity) {
                    dir.save(&record)?;
                }
                record
            }
            (None, Some(provider_id)) => {
                return Err(BackendError::machine_missing(
                    provider_id,
                    format!("Cloud Hypervisor host {}", self.host()),
                ));
            }
            (None, None) => {
                // Before anything is made: the image's host paths must be files in
                // the allowed directories; the resolved paths are the ones used.
                let mut confined = spec.clone();
                crate::paths::confine(&mut confined.image, &self.settings.image_dirs)?;
                prepare::prepare(request, &confined, &dir, self.settings.qcow2_overlay).await?
            }
        };
        match spec.power_state {
            PowerState::PoweredOff => self.stop(&dir, &mut record, spec).await,
            want => self.run(&dir, &mut record, spec, want).await,
        }
    }

    /// The machine directories whose record names the object's namespace and name
    /// (every record has, so machines made before this was asked for are found too).
    /// A directory is removed only once its VMM is gone, so none is reported deleting.
    async fn made_for(
        &self,
        kind: &str,
        identity: &MachineIdentity,
    ) -> Result<Vec<MadeFor>, BackendError> {
        if kind != "CloudHypervisorMachine" {
            return Ok(Vec::new());
        }
        let mut found = Vec::new();
        for dir in VmDir::all(&self.settings.state_dir) {
            let Some(record) = dir.load()? else {
                continue;
            };
            if record.namespace == identity.namespace && record.name == identity.name {
                found.push(MadeFor {
                    provider_id: format!("cloud-hypervisor://{}", record.uid),
                    backend_ref: dir.path().display().to_string(),
                    uid: Some(record.owner_uid().to_owned()),
                    deleting: false,
                });
            }
        }
        found.sort_by(|a, b| a.provider_id.cmp(&b.provider_id));
        Ok(found)
    }

    async fn observe(
        &self,
        identity: &MachineIdentity,
    ) -> Result<Option<MachineObservation>, BackendError> {
        let dir = self.dir_of(identity)?;
        let Some(record) = dir.load()? else {
            return Ok(None);
        };
        let alive = record
            .pid
            .is_some_and(|p| supervisor::alive(p, &dir.socket()));
        let info = if alive {
            self.client(&dir)
                .info()
                .await
                .map_err(|e| e.into_backend("vm.info"))?
        } else {
            None
        };
        let power = power_of(info.as_ref().map(|i| i.state.as_str()));
        let vmm = info.as_ref().map(|i| &i.config);
        Ok(Some(
            self.observation(&record, &dir, None, power, None, vmm),
        ))
    }

    async fn delete(&self, identity: &MachineIdentity) -> Result<Deletion, BackendError> {
        let dir = self.dir_of(identity)?;
        let _guard = lock(dir.path()).await;
        // Disks imported (or half imported) for a machine that will not be made.
        for leftover in [dir.partial(), dir.importing(), dir.imported()] {
            import::remove_dir(&leftover)?;
        }
        let record = dir.load()?;
        if let Some(pid) = record.as_ref().and_then(|r| r.pid) {
            let socket = dir.socket();
            if supervisor::alive(pid, &socket) {
                let client = self.client(&dir);
                // Errors are fine here: whatever state it is in, the process goes next.
                let _ = client.put("vm.delete", None).await;
                let _ = client.put("vmm.shutdown", None).await;
                let mut gone = false;
                for step in 0..120 {
                    if !supervisor::alive(pid, &socket) {
                        gone = true;
                        break;
                    }
                    match step {
                        40 => supervisor::signal(pid, false),
                        80 => supervisor::signal(pid, true),
                        _ => {}
                    }
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
                if !gone {
                    return Ok(Deletion::InProgress {
                        retry_after: self.settings.poll_interval,
                    });
                }
                info!(pid, uid = %identity.uid, "VMM stopped");
            }
        }
        match std::fs::remove_dir_all(dir.path()) {
            Ok(()) => Ok(Deletion::Gone),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Deletion::Gone),
            Err(e) => Err(host_error("removing", dir.path(), e)),
        }
    }

    /// Applies `fields` ([`changes::change_table`]): on a running VM, `vm.resize`
    /// for vCPUs and memory within its ceilings and `vm.resize-disk` for larger data
    /// disks; every field is also written into the record's configuration, so the
    /// next boot (a new VMM, or the VM made anew) has it — which is all a change
    /// beyond a ceiling, a memory shrink, or any change to a machine that is off,
    /// gets. A machine that is off has its data disk files grown. The machine is then
    /// read back from the VMM.
    async fn apply_changes(
        &self,
        request: &MachineRequest,
        fields: &[MachineField],
    ) -> Result<MachineObservation, BackendError> {
        let spec = spec_of(request)?;
        let table = changes::change_table();
        if let Some(field) = fields
            .iter()
            .find(|f| !table.iter().any(|r| r.field == **f))
        {
            return Err(BackendError::terminal(
                "ChangeUnsupported",
                format!(
                    "{}: Cloud Hypervisor machines do not take this change after they are made",
                    field.as_str()
                ),
            ));
        }
        let names = fields
            .iter()
            .map(|f| f.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        let named = |e: BackendError| BackendError {
            message: format!("{names}: {}", e.message),
            ..e
        };
        // A CPU topology the new maximum does not fill: refused before anything changes
        // (a live vm.resize first, then a record CH would refuse at the next boot).
        if fields
            .iter()
            .any(|f| matches!(f, MachineField::Cpus | MachineField::CoresPerSocket))
        {
            crate::config::cpus(spec).map_err(named)?;
        }
        let dir = self.dir_of(&request.identity)?;
        let _guard = lock(dir.path()).await;
        let Some(mut record) = dir.load()? else {
            return Err(BackendError::transient(
                "MachineNotFound",
                format!(
                    "{names}: no machine directory {} to change",
                    dir.path().display()
                ),
            ));
        };
        let client = self.client(&dir);
        let alive = record
            .pid
            .is_some_and(|p| supervisor::alive(p, &dir.socket()));
        let info = if alive {
            client
                .info()
                .await
                .map_err(|e| named(e.into_backend("vm.info")))?
        } else {
            None
        };
        match info.as_ref().map(|i| i.state.as_str()) {
            Some("Running") => {
                let vmm = &info.as_ref().expect("matched").config;
                let running = changes::resources(dir.path(), &record, vmm, record.booted_memory);
                if let Some(body) = changes::resize_body(spec, fields, &running)? {
                    info!(uid = %record.uid, %body, "vm.resize");
                    client
                        .put("vm.resize", Some(&body))
                        .await
                        .map_err(|e| named(e.into_backend("vm.resize")))?;
                }
                if fields.contains(&MachineField::Networks) {
                    let (remove, add) = changes::net_changes(&record.uid, spec, &vmm["net"])?;
                    for id in remove {
                        info!(uid = %record.uid, %id, "vm.remove-device");
                        client
                            .put("vm.remove-device", Some(&serde_json::json!({"id": id})))
                            .await
                            .map_err(|e| named(e.into_backend("vm.remove-device")))?;
                    }
                    for body in &add {
                        info!(uid = %record.uid, %body, "vm.add-net");
                        client
                            .put("vm.add-net", Some(body))
                            .await
                            .map_err(|e| named(e.into_backend("vm.add-net")))?;
                    }
                    if !add.is_empty() {
                        prepare::attach_bridges(&record.uid, spec).await?;
                    }
                }
                if fields.contains(&MachineField::DataDiskSize) {
                    for (name, body) in changes::resize_disk_bodies(spec, &record, &running) {
                        let had = running
                            .data_disks
                            .iter()
                            .find(|d| d.name == name)
                            .map_or(0, |d| u64::from(d.size_gib) << 30);
                        info!(uid = %record.uid, disk = %name, %body, "vm.resize-disk");
                        client
                            .put("vm.resize-disk", Some(&body))
                            .await
                            .map_err(|e| {
                                let e = e.into_backend("vm.resize-disk");
                                BackendError {
                                    message: format!("dataDiskSize {name}: {}", e.message),
                                    ..e
                                }
                            })?;
                        // The guest sees the new size now; its grown range is allocated
                        // as the disk's provisioning asks (see allocate_grown).
                        let index = record.disk_names.iter().position(|n| *n == name);
                        if let (Some(index), Some(bytes)) = (index, body["desired_size"].as_u64()) {
                            prepare::allocate_grown(
                                &dir.path().join(crate::config::data_disk_name(index)),
                                had,
                                bytes,
                                provisioning_of(spec, &name),
                            )
                            .map_err(named)?;
                        }
                    }
                }
            }
            Some("Paused") => {
                // A paused guest cannot answer the ACPI hot-plug notification.
                return Err(BackendError::transient(
                    "MachinePaused",
                    format!("{names}: applied once the machine is resumed"),
                )
                .retry_after(self.settings.poll_interval * 10));
            }
            _ if fields.contains(&MachineField::DataDiskSize) => {
                // Off: nothing holds the files but banlieue.
                let off = changes::resources(dir.path(), &record, &record.config, None);
                for (name, body) in changes::resize_disk_bodies(spec, &record, &off) {
                    let index = record.disk_names.iter().position(|n| *n == name);
                    let (Some(index), Some(bytes)) = (index, body["desired_size"].as_u64()) else {
                        continue;
                    };
                    let path = dir.path().join(crate::config::data_disk_name(index));
                    prepare::grow(&path, bytes, provisioning_of(spec, &name)).map_err(named)?;
                }
            }
            _ => {}
        }
        for field in fields {
            changes::stage(&mut record, spec, *field).map_err(named)?;
        }
        dir.save(&record)?;
        let info = if alive {
            client
                .info()
                .await
                .map_err(|e| named(e.into_backend("vm.info")))?
        } else {
            None
        };
        let power = power_of(info.as_ref().map(|i| i.state.as_str()));
        let vmm = info.as_ref().map(|i| &i.config);
        Ok(self.observation(&record, &dir, Some(spec), power, None, vmm))
    }

    /// Export and import of the machine's disk files ([`crate::disks`]).
    fn disk_transfer(&self) -> Option<&dyn DiskTransfer> {
        Some(self)
    }
}

/// The VM's directory and record, for tools and tests: `None` when no machine carries the UID.
pub fn inspect(state_dir: &Path, uid: &str) -> Result<Option<(PathBuf, Record)>, BackendError> {
    let dir = VmDir::new(state_dir, uid)?;
    Ok(dir.load()?.map(|r| (dir.path().to_owned(), r)))
}

/// The provisioning the spec asks for the additional disk `name` (thin when the
/// spec no longer lists it: nothing is grown for a disk it does not ask).
fn provisioning_of(spec: &CloudHypervisorMachineSpec, name: &str) -> DiskProvisioning {
    spec.additional_disks
        .iter()
        .find(|d| d.name == name)
        .map_or(DiskProvisioning::Thin, |d| d.provisioning)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn machines_are_found_by_the_namespace_and_name_their_record_names() {
        let root = tempfile::tempdir().unwrap();
        let settings = crate::settings::ChSettings::parse_parts(
            &format!("local://{}", root.path().display()),
            &Default::default(),
        )
        .unwrap();
        for (uid, namespace, name) in [
            ("old-1", "ns", "web"),
            ("x-2", "ns", "db"),
            ("y-3", "other", "web"),
        ] {
            let dir = VmDir::new(root.path(), uid).unwrap();
            std::fs::create_dir(dir.path()).unwrap();
            let record = Record {
                uid: uid.into(),
                namespace: namespace.into(),
                name: name.into(),
                ..Default::default()
            };
            dir.save(&record).unwrap();
        }
        let backend = ChBackend::new(settings);
        let restored = MachineIdentity::new("new-9", "ns", "web");
        let found = backend
            .made_for("CloudHypervisorMachine", &restored)
            .await
            .unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].provider_id, "cloud-hypervisor://old-1");
        assert_eq!(found[0].uid.as_deref(), Some("old-1"));
        assert!(!found[0].deleting);
        assert!(
            backend
                .made_for("LibvirtMachine", &restored)
                .await
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn maps_vm_states_to_power() {
        assert_eq!(power_of(Some("Running")), PowerState::PoweredOn);
        assert_eq!(power_of(Some("Paused")), PowerState::Suspended);
        assert_eq!(power_of(Some("Shutdown")), PowerState::PoweredOff);
        assert_eq!(power_of(None), PowerState::PoweredOff);
    }
}
