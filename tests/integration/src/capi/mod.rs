//! The real Cluster API core manager (v1.14, built by `tests/testbin/capi/build.sh`)
//! running against the shared test control plane, for the CAPI contract tests.
//!
//! [`Capi::start`] does, once per test binary (CAPI is cluster-wide, so one manager
//! serves every test, like the control plane itself):
//!
//! 1. installs CAPI core's CRDs with their conversion webhook pointed at the manager
//!    (`https://127.0.0.1:<port>/convert`, our own CA bundle), as CAPI's kustomize
//!    patches and cert-manager would in a cluster;
//! 2. installs CAPI's RBAC as its release does (`capi-manager-role`, labelled for
//!    aggregation, aggregated into `capi-aggregated-manager-role`, bound to the
//!    ServiceAccount `capi-system/capi-manager`) plus banlieue's
//!    `deploy/capi/clusterrole-aggregate.yaml`. The control plane has no
//!    kube-controller-manager, so a task here does the ClusterRole aggregation
//!    controller's job (union of the rules of the roles each `aggregationRule` selects);
//! 3. generates a CA and a serving certificate for `127.0.0.1`/`localhost` (no
//!    cert-manager), and installs CAPI's webhook configurations with each
//!    `clientConfig.service` rewritten to a URL on the manager;
//! 4. starts the manager with a kubeconfig that **impersonates** that ServiceAccount,
//!    so it has exactly the rights an in-cluster CAPI would: without banlieue's
//!    aggregate role it could not read banlieue's infrastructure kinds;
//! 5. waits until `/readyz` answers and its admission webhooks answer a dry-run create.
//!
//! The manager is killed by the kernel when the test binary exits (`PR_SET_PDEATHSIG`
//! from the thread that spawned it, which lives as long as the process); its files live
//! in the control plane's directory, which the harness removes.
//!
//! Outside CI a rig that cannot be built skips the test (with a message); under
//! CI or `make` (`banlieue_testenv::rigs_required`) it fails it.

mod aggregate;
mod manifests;
mod process;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};

use aggregate::{aggregate_forever, aggregate_once};
pub use manifests::{crds_with_conversion, rbac_objects, webhook_configurations};
// For other controller-runtime managers run beside CAPI's (the peer of `make bench-capi-peer`).
use manifests::{install_crds, install_rbac, install_webhooks};
pub use process::{free_ports, http_ok, spawn_manager, write_serving_cert};
use process::{stop_at_exit, webhooks_answer, write_impersonating_kubeconfig};

/// The ServiceAccount the manager runs as (by impersonation).
pub const SERVICE_ACCOUNT: &str = "system:serviceaccount:capi-system:capi-manager";
/// Its groups, as the apiserver would assign them to a token of that ServiceAccount.
pub const SERVICE_ACCOUNT_GROUPS: [&str; 3] = [
    "system:serviceaccounts",
    "system:serviceaccounts:capi-system",
    "system:authenticated",
];
/// CAPI's namespace (its release's `capi-system`).
pub const NAMESPACE: &str = "capi-system";
/// The ClusterRole CAPI's ServiceAccount is bound to; aggregated from every ClusterRole
/// labelled `cluster.x-k8s.io/aggregate-to-manager: "true"`.
pub const AGGREGATED_ROLE: &str = "capi-aggregated-manager-role";
/// Field manager for the rig's server-side applies.
const FIELD_MANAGER: &str = "banlieue-capi-rig";
/// Feature gates: the release defaults plus ClusterTopology (ClusterClass; our
/// `*ClusterTemplate`s must pass its SSA dry runs).
const FEATURE_GATES: &str = "MachinePool=true,ClusterTopology=true,RuntimeSDK=false,\
     MachineSetPreflightChecks=true,PriorityQueue=true,ReconcilerRateLimiting=true,\
     InPlaceUpdates=false,MachineTaintPropagation=false";
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// The running CAPI core manager (see the module docs).
#[derive(Debug)]
pub struct Capi {
    rig: PathBuf,
    work: PathBuf,
    webhook_port: u16,
    health_addr: String,
    diagnostics_addr: String,
    ca_pem: String,
    log: PathBuf,
    kubeconfig: PathBuf,
    version: String,
    pid: u32,
    started_in: Duration,
    control_plane: &'static banlieue_testenv::ControlPlane,
}

static SHARED: OnceLock<Result<Capi, String>> = OnceLock::new();

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn in_ci() -> bool {
    banlieue_testenv::rigs_required()
}

/// The rig's directory: `$BANLIEUE_CAPI_DIR`, else what `tests/testbin/capi/build.sh`
/// prints (it builds the binaries on first use). `Err` when it cannot be had.
pub fn rig_dir() -> Result<PathBuf, String> {
    if let Ok(dir) = std::env::var("BANLIEUE_CAPI_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let script = repo_root().join("tests/testbin/capi/build.sh");
    let out = Command::new(&script)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!("{} failed ({})", script.display(), out.status));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// [`rig_dir`], or `None` (with a SKIPPED message) outside CI and make; under them a
/// missing rig panics, so CI fails instead of skipping.
pub fn rig_dir_or_skip() -> Option<PathBuf> {
    match rig_dir() {
        Ok(dir) => Some(dir),
        Err(e) if in_ci() => panic!("the Cluster API rig is required under CI and make: {e}"),
        Err(e) => {
            eprintln!("SKIPPED: the Cluster API rig is unavailable: {e}");
            None
        }
    }
}

impl Capi {
    /// The shared manager, started on first use (blocks for its startup, ~10 s; safe
    /// from sync code and from any Tokio runtime). `None` when the rig cannot be built
    /// outside CI (the test should return early).
    ///
    /// # Panics
    /// If the rig is missing under CI or `make`, or the manager does not start (the
    /// message quotes its log). A failed start is remembered: later callers panic with
    /// the same message.
    pub fn start() -> Option<&'static Capi> {
        let rig = rig_dir_or_skip()?;
        let started = SHARED.get_or_init(|| start_on_own_thread(rig, banlieue_testenv::shared()));
        match started {
            Ok(capi) => Some(capi),
            Err(message) => panic!("{message}"),
        }
    }

    /// Another manager, on another control plane (a second management cluster, e.g.
    /// the target of `clusterctl move`); it lives as long as the process, like the
    /// shared one. `None` as [`Capi::start`].
    ///
    /// # Panics
    /// As [`Capi::start`].
    pub fn start_on(control_plane: &'static banlieue_testenv::ControlPlane) -> Option<Capi> {
        let rig = rig_dir_or_skip()?;
        match start_on_own_thread(rig, control_plane) {
            Ok(capi) => Some(capi),
            Err(message) => panic!("{message}"),
        }
    }

    /// The rig's directory (binaries, CAPI's CRDs, webhooks, RBAC, metadata.yaml).
    pub fn rig(&self) -> &Path {
        &self.rig
    }

    /// The `clusterctl` binary of the same release.
    pub fn clusterctl(&self) -> PathBuf {
        self.rig.join("clusterctl")
    }

    /// The CAPI version running (`v1.14.x`).
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The manager's process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// How long the rig took to start (CRDs, RBAC, webhooks, manager ready).
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// The webhook server's base URL, `https://127.0.0.1:<port>`.
    pub fn webhook_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.webhook_port)
    }

    /// `host:port` of the manager's health endpoints (`/healthz`, `/readyz`).
    pub fn health_addr(&self) -> &str {
        &self.health_addr
    }

    /// `host:port` of the manager's metrics (`/metrics`, plain HTTP).
    pub fn diagnostics_addr(&self) -> &str {
        &self.diagnostics_addr
    }

    /// The CA (PEM) that signed the webhook serving certificate.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The kubeconfig the manager uses (admin credentials impersonating
    /// [`SERVICE_ACCOUNT`]).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The rig's working directory (certificates, kubeconfig, log).
    pub fn work_dir(&self) -> &Path {
        &self.work
    }

    /// The manager's log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The last `lines` lines of the manager's log, for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log, lines)
    }

    /// Lines of the manager's log containing `needle` (e.g. an object's name).
    pub fn log_grep(&self, needle: &str) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|line| line.contains(needle))
            .map(str::to_owned)
            .collect()
    }

    /// A client acting as CAPI's ServiceAccount (the same impersonation the manager
    /// uses), bound to the calling runtime: to check what CAPI may and may not do.
    pub async fn client_as_manager(&self) -> kube::Client {
        let mut config = self.control_plane.kube_config();
        config.auth_info.impersonate = Some(SERVICE_ACCOUNT.to_owned());
        config.auth_info.impersonate_groups = Some(
            SERVICE_ACCOUNT_GROUPS
                .iter()
                .map(|g| (*g).to_owned())
                .collect(),
        );
        kube::Client::try_from(config).expect("an impersonating client")
    }

    /// Asks the apiserver (SubjectAccessReview) whether CAPI's ServiceAccount may
    /// `verb` the `resource` (`plural` or `plural/subresource`) of `group`, in
    /// `namespace` (or cluster-wide).
    pub async fn can(
        &self,
        client: &kube::Client,
        verb: &str,
        group: &str,
        resource: &str,
        namespace: Option<&str>,
    ) -> bool {
        let (resource, subresource) = resource.split_once('/').unwrap_or((resource, ""));
        let review = json!({
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": SERVICE_ACCOUNT,
                "groups": SERVICE_ACCOUNT_GROUPS,
                "resourceAttributes": {
                    "verb": verb,
                    "group": group,
                    "resource": resource,
                    "subresource": subresource,
                    "namespace": namespace.unwrap_or(""),
                },
            },
        });
        let request = http::Request::post("/apis/authorization.k8s.io/v1/subjectaccessreviews")
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(serde_json::to_vec(&review).expect("JSON"))
            .expect("request");
        let answer: Value = client.request(request).await.expect("SubjectAccessReview");
        answer["status"]["allowed"].as_bool().unwrap_or(false)
    }
}

/// The last `lines` lines of a file.
fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Starts the rig on a thread that lives as long as the process: the manager's
/// `PR_SET_PDEATHSIG` fires when the spawning thread dies, and the same thread then
/// keeps aggregating ClusterRoles.
fn start_on_own_thread(
    rig: PathBuf,
    control_plane: &'static banlieue_testenv::ControlPlane,
) -> Result<Capi, String> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("capi-rig".to_owned())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(e) => {
                    let _ = tx.send(Err(format!("capi rig: building a runtime: {e}")));
                    return;
                }
            };
            let _entered = runtime.enter();
            let client = kube::Client::try_from(control_plane.kube_config())
                .expect("capi rig: an admin client");
            let child = Mutex::new(None::<Child>);
            let started = runtime.block_on(setup(&rig, control_plane, &client, &child));
            let ok = started.is_ok();
            let _ = tx.send(started);
            if ok {
                // Serve ClusterRole aggregation for as long as the process runs; keeps
                // this thread (and so the manager) alive.
                runtime.block_on(aggregate_forever(client));
            }
            // Setup failed: the child (if any) dies with this thread.
            drop(child);
        })
        .map_err(|e| format!("capi rig: spawning its thread: {e}"))?;
    rx.recv()
        .unwrap_or_else(|_| Err("capi rig: its thread panicked while starting".to_owned()))
}

async fn setup(
    rig: &Path,
    control_plane: &'static banlieue_testenv::ControlPlane,
    client: &kube::Client,
    child_slot: &Mutex<Option<Child>>,
) -> Result<Capi, String> {
    let started = Instant::now();
    let work = control_plane.dir().join("capi");
    std::fs::create_dir_all(work.join("certs")).map_err(|e| format!("capi rig: {e}"))?;
    let version = std::fs::read_to_string(rig.join("VERSION"))
        .map(|v| v.trim().to_owned())
        .unwrap_or_default();
    let [webhook_port, health_port, diagnostics_port] = free_ports()?;
    let webhook_base = format!("https://127.0.0.1:{webhook_port}");

    let ca_pem = write_serving_cert(&work.join("certs"))?;
    let ca_bundle = base64::engine::general_purpose::STANDARD.encode(&ca_pem);

    install_crds(client, rig, &webhook_base, &ca_bundle).await?;
    install_rbac(client, rig).await?;
    aggregate_once(client).await?;
    install_webhooks(client, rig, &webhook_base, &ca_bundle).await?;

    let kubeconfig = work.join("manager.kubeconfig");
    write_impersonating_kubeconfig(control_plane.kubeconfig_path(), &kubeconfig)?;
    let log = work.join("manager.log");
    let health_addr = format!("127.0.0.1:{health_port}");
    let diagnostics_addr = format!("127.0.0.1:{diagnostics_port}");
    let child = spawn_manager(
        rig,
        &[
            format!("--kubeconfig={}", kubeconfig.display()),
            "--leader-elect=false".to_owned(),
            format!("--webhook-port={webhook_port}"),
            format!("--webhook-cert-dir={}", work.join("certs").display()),
            format!("--health-addr={health_addr}"),
            format!("--diagnostics-address={diagnostics_addr}"),
            "--insecure-diagnostics=true".to_owned(),
            format!("--feature-gates={FEATURE_GATES}"),
            "--sync-period=10m".to_owned(),
            "--v=2".to_owned(),
        ],
        &log,
    )?;
    let pid = child.id();
    stop_at_exit(pid);
    *child_slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(child);

    let deadline = Instant::now() + START_TIMEOUT;
    let failed = |what: &str| {
        format!(
            "capi rig: {what}; manager log ({}):\n{}",
            log.display(),
            tail(&log, 60)
        )
    };
    loop {
        if let Some(status) = child_slot
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
        {
            return Err(failed(&format!("the manager exited ({status})")));
        }
        if http_ok(&health_addr, "/readyz") && webhooks_answer(client).await.is_ok() {
            break;
        }
        if Instant::now() >= deadline {
            let why = webhooks_answer(client).await.err().unwrap_or_default();
            return Err(failed(&format!(
                "the manager was not ready after {START_TIMEOUT:?} ({why})"
            )));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(Capi {
        rig: rig.to_owned(),
        work,
        webhook_port,
        health_addr,
        diagnostics_addr,
        ca_pem,
        log,
        kubeconfig,
        version,
        pid,
        started_in: started.elapsed(),
        control_plane,
    })
}
