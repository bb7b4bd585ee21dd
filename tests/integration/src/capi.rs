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
//! `CI=true` it fails it.

// `Command::pre_exec` (to set PR_SET_PDEATHSIG in the child) is unsafe with no safe
// wrapper in std; the one use carries a SAFETY comment.
#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

use base64::Engine as _;
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::config::Kubeconfig;
use kube::runtime::wait::{await_condition, conditions};
use kube::runtime::watcher;
use serde_json::{Value, json};

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
}

static SHARED: OnceLock<Result<Capi, String>> = OnceLock::new();

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
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

/// [`rig_dir`], or `None` (with a SKIPPED message) outside CI; under `CI=true` a
/// missing rig panics, so CI fails instead of skipping.
pub fn rig_dir_or_skip() -> Option<PathBuf> {
    match rig_dir() {
        Ok(dir) => Some(dir),
        Err(e) if in_ci() => panic!("the Cluster API rig is required in CI: {e}"),
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
    /// If the rig is missing under `CI=true`, or the manager does not start (the
    /// message quotes its log). A failed start is remembered: later callers panic with
    /// the same message.
    pub fn start() -> Option<&'static Capi> {
        let rig = rig_dir_or_skip()?;
        let started = SHARED.get_or_init(|| start_on_own_thread(rig));
        match started {
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
        let mut config = banlieue_testenv::shared().kube_config();
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
fn start_on_own_thread(rig: PathBuf) -> Result<Capi, String> {
    // Start the control plane from this (caller's) thread first: it has its own thread.
    let control_plane = banlieue_testenv::shared();
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
    control_plane: &banlieue_testenv::ControlPlane,
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
    })
}

/// Reserves distinct free loopback ports by binding them all at once.
fn free_ports<const N: usize>() -> Result<[u16; N], String> {
    let listeners = (0..N)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("capi rig: reserving a port: {e}"))?;
    let mut ports = [0; N];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener.local_addr().map_err(|e| e.to_string())?.port();
    }
    Ok(ports)
}

/// A CA and a serving certificate for 127.0.0.1/localhost signed by it, written as
/// `tls.crt`/`tls.key` (the manager's defaults); returns the CA's PEM.
fn write_serving_cert(dir: &Path) -> Result<String, String> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose,
    };
    let err = |e: rcgen::Error| format!("capi rig: generating certificates: {e}");
    let ca_key = KeyPair::generate().map_err(err)?;
    let mut ca_params = CertificateParams::default();
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "banlieue-capi-rig-ca");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca_params.self_signed(&ca_key).map_err(err)?;
    let ca = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().map_err(err)?;
    let mut params =
        CertificateParams::new(["127.0.0.1".to_owned(), "localhost".to_owned()]).map_err(err)?;
    params
        .distinguished_name
        .push(DnType::CommonName, "capi-webhook-service");
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.signed_by(&key, &ca).map_err(err)?;
    for (name, pem) in [("tls.crt", cert.pem()), ("tls.key", key.serialize_pem())] {
        std::fs::write(dir.join(name), pem).map_err(|e| format!("capi rig: {e}"))?;
    }
    Ok(ca_cert.pem())
}

/// Every YAML document in `path`.
fn yaml_documents(path: &Path) -> Result<Vec<Value>, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
        .map_err(|e| format!("parsing {}: {e}", path.display()))?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

fn yaml_files(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("reading {}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    Ok(files)
}

/// CAPI's CRDs with `spec.conversion` pointed at the manager (the release's
/// `webhook_in_*.yaml` patches plus cert-manager's CA injection, done here).
pub fn crds_with_conversion(
    rig: &Path,
    webhook_base: &str,
    ca_bundle: &str,
) -> Result<Vec<Value>, String> {
    let mut crds = Vec::new();
    for file in yaml_files(&rig.join("crds"))? {
        for mut crd in yaml_documents(&file)? {
            crd["spec"]["conversion"] = json!({
                "strategy": "Webhook",
                "webhook": {
                    "conversionReviewVersions": ["v1"],
                    "clientConfig": {"url": format!("{webhook_base}/convert"), "caBundle": ca_bundle},
                },
            });
            let labels = &mut crd["metadata"]["labels"];
            if !labels.is_object() {
                *labels = json!({});
            }
            labels["cluster.x-k8s.io/provider"] = json!("cluster-api");
            crds.push(crd);
        }
    }
    Ok(crds)
}

async fn install_crds(
    client: &kube::Client,
    rig: &Path,
    webhook_base: &str,
    ca_bundle: &str,
) -> Result<(), String> {
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let crds = crds_with_conversion(rig, webhook_base, ca_bundle)?;
    for crd in &crds {
        let name = crd["metadata"]["name"].as_str().unwrap_or_default();
        api.patch(name, &params, &Patch::Apply(crd))
            .await
            .map_err(|e| format!("capi rig: applying CRD {name}: {e}"))?;
    }
    for crd in &crds {
        let name = crd["metadata"]["name"].as_str().unwrap_or_default();
        let established = await_condition(api.clone(), name, conditions::is_crd_established());
        tokio::time::timeout(START_TIMEOUT, established)
            .await
            .map_err(|_| format!("capi rig: CRD {name} not established"))?
            .map_err(|e| format!("capi rig: CRD {name}: {e}"))?;
    }
    Ok(())
}

/// CAPI's RBAC as its release renders it (kustomize `namePrefix: capi-`, namespace
/// `capi-system`, the `manager_role_aggregation_patch`), plus banlieue's aggregate role.
pub fn rbac_objects(rig: &Path) -> Result<Vec<Value>, String> {
    let mut objects = vec![json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": NAMESPACE, "labels": {"cluster.x-k8s.io/provider": "cluster-api"}},
    })];
    for file in yaml_files(&rig.join("rbac"))? {
        for mut object in yaml_documents(&file)? {
            let kind = object["kind"].as_str().unwrap_or_default().to_owned();
            let name = object["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            object["metadata"]["name"] = json!(format!("capi-{name}"));
            if object["metadata"]["namespace"].is_string()
                || kind == "Role"
                || kind == "RoleBinding"
            {
                object["metadata"]["namespace"] = json!(NAMESPACE);
            }
            if let Some(role_ref) = object.get_mut("roleRef") {
                let target = role_ref["name"].as_str().unwrap_or_default().to_owned();
                // The release binds the manager to the aggregated role, not to its own.
                let target = if target == "manager-role" && kind == "ClusterRoleBinding" {
                    "aggregated-manager-role".to_owned()
                } else {
                    target
                };
                role_ref["name"] = json!(format!("capi-{target}"));
            }
            if let Some(Value::Array(subjects)) = object.get_mut("subjects") {
                for subject in subjects {
                    subject["name"] = json!(format!(
                        "capi-{}",
                        subject["name"].as_str().unwrap_or_default()
                    ));
                    subject["namespace"] = json!(NAMESPACE);
                }
            }
            let labels = &mut object["metadata"]["labels"];
            if !labels.is_object() {
                *labels = json!({});
            }
            labels["cluster.x-k8s.io/provider"] = json!("cluster-api");
            if kind == "ClusterRole" && name == "manager-role" {
                labels["cluster.x-k8s.io/aggregate-to-manager"] = json!("true");
            }
            objects.push(object);
        }
    }
    let ours = repo_root().join("deploy/capi/clusterrole-aggregate.yaml");
    objects.extend(yaml_documents(&ours)?);
    Ok(objects)
}

async fn install_rbac(client: &kube::Client, rig: &Path) -> Result<(), String> {
    for object in rbac_objects(rig)? {
        crate::apply(client, NAMESPACE, &object)
            .await
            .map_err(|e| format!("capi rig: applying RBAC: {e}"))?;
    }
    Ok(())
}

/// CAPI's webhook configurations with each `clientConfig.service` replaced by a URL on
/// the manager and our CA (envtest's `ModifyWebhookDefinitions`), names prefixed
/// `capi-` as the release's kustomization does.
pub fn webhook_configurations(
    rig: &Path,
    webhook_base: &str,
    ca_bundle: &str,
) -> Result<Vec<Value>, String> {
    let mut configurations = Vec::new();
    for mut configuration in yaml_documents(&rig.join("webhook/manifests.yaml"))? {
        let name = configuration["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        configuration["metadata"]["name"] = json!(format!("capi-{name}"));
        configuration["metadata"]["labels"] = json!({"cluster.x-k8s.io/provider": "cluster-api"});
        if let Some(Value::Array(webhooks)) = configuration.get_mut("webhooks") {
            for webhook in webhooks {
                let path = webhook["clientConfig"]["service"]["path"]
                    .as_str()
                    .unwrap_or("/")
                    .to_owned();
                webhook["clientConfig"] =
                    json!({"url": format!("{webhook_base}{path}"), "caBundle": ca_bundle});
            }
        }
        configurations.push(configuration);
    }
    Ok(configurations)
}

async fn install_webhooks(
    client: &kube::Client,
    rig: &Path,
    webhook_base: &str,
    ca_bundle: &str,
) -> Result<(), String> {
    for configuration in webhook_configurations(rig, webhook_base, ca_bundle)? {
        crate::apply(client, NAMESPACE, &configuration)
            .await
            .map_err(|e| format!("capi rig: applying webhook configuration: {e}"))?;
    }
    Ok(())
}

/// Writes a kubeconfig with the admin's credentials that impersonates CAPI's
/// ServiceAccount (`as`/`as-groups`), so the manager has exactly that identity's rights.
fn write_impersonating_kubeconfig(admin: &Path, out: &Path) -> Result<(), String> {
    let config = Kubeconfig::read_from(admin).map_err(|e| format!("capi rig: {e}"))?;
    let cluster = config
        .clusters
        .first()
        .and_then(|c| c.cluster.as_ref())
        .ok_or("capi rig: the admin kubeconfig has no cluster")?;
    let user = config
        .auth_infos
        .first()
        .and_then(|a| a.auth_info.as_ref())
        .ok_or("capi rig: the admin kubeconfig has no user")?;
    let quote = |s: Option<&str>| format!("{:?}", s.unwrap_or_default());
    let mut yaml = String::new();
    let _ = write!(
        yaml,
        "apiVersion: v1
kind: Config
clusters:
- name: banlieue-testenv
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: capi-manager
  user:
    client-certificate: {cert}
    client-key: {key}
    as: {sa}
    as-groups: [{groups}]
contexts:
- name: capi-manager
  context:
    cluster: banlieue-testenv
    user: capi-manager
current-context: capi-manager
",
        server = cluster.server.as_deref().unwrap_or_default(),
        ca = quote(cluster.certificate_authority.as_deref()),
        cert = quote(user.client_certificate.as_deref()),
        key = quote(user.client_key.as_deref()),
        sa = SERVICE_ACCOUNT,
        groups = SERVICE_ACCOUNT_GROUPS
            .iter()
            .map(|g| format!("{g:?}"))
            .collect::<Vec<_>>()
            .join(", "),
    );
    std::fs::write(out, yaml).map_err(|e| format!("capi rig: writing {}: {e}", out.display()))
}

fn spawn_manager(rig: &Path, args: &[String], log: &Path) -> Result<Child, String> {
    let file = std::fs::File::create(log).map_err(|e| format!("capi rig: {e}"))?;
    let stderr = file.try_clone().map_err(|e| format!("capi rig: {e}"))?;
    let mut command = Command::new(rig.join("manager"));
    command
        .args(args)
        .env("POD_NAMESPACE", NAMESPACE)
        .env("POD_NAME", "capi-controller-manager-0")
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(stderr)
        .process_group(0);
    let parent = std::process::id();
    // SAFETY: the closure runs in the forked child before exec and only makes
    // async-signal-safe system calls (prctl, getppid, kill).
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != parent as libc::pid_t {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
            Ok(())
        });
    }
    command
        .spawn()
        .map_err(|e| format!("capi rig: starting {}: {e}", rig.join("manager").display()))
}

static MANAGER_PID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Kills the manager when the test binary exits, before the harness stops the apiserver
/// (`atexit` handlers run in reverse order of registration, and the control plane
/// registered its own first): its open watches would otherwise hold the apiserver's
/// graceful shutdown for the whole stop timeout.
fn stop_at_exit(pid: u32) {
    extern "C" fn kill_manager() {
        let pid = MANAGER_PID.load(std::sync::atomic::Ordering::SeqCst);
        if pid != 0 {
            // SAFETY: plain system calls on our own child's pid; no memory is touched.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGKILL);
                libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), 0);
            }
        }
    }
    MANAGER_PID.store(pid, std::sync::atomic::Ordering::SeqCst);
    // SAFETY: registers a handler that is a plain `extern "C" fn` without captures.
    unsafe {
        libc::atexit(kill_manager);
    }
}

/// A plain-HTTP GET answering 200.
fn http_ok(addr: &str, path: &str) -> bool {
    let probe = || -> std::io::Result<String> {
        let mut stream = TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(Duration::from_secs(2)))?;
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )?;
        let mut response = String::new();
        stream.read_to_string(&mut response)?;
        Ok(response)
    };
    probe().is_ok_and(|r| r.starts_with("HTTP/1.1 200"))
}

/// A dry-run create of a v1beta2 Cluster goes through CAPI's defaulting and validating
/// webhooks; any answer from them (accepted, or rejected by them) means they serve.
async fn webhooks_answer(client: &kube::Client) -> Result<(), String> {
    let cluster = json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Cluster",
        "metadata": {"name": "capi-rig-probe", "namespace": "default"},
        "spec": {},
    });
    let request = http::Request::post(
        "/apis/cluster.x-k8s.io/v1beta2/namespaces/default/clusters?dryRun=All",
    )
    .header(http::header::CONTENT_TYPE, "application/json")
    .body(serde_json::to_vec(&cluster).expect("JSON"))
    .expect("request");
    match client.request::<Value>(request).await {
        Ok(_) => Ok(()),
        Err(e) => {
            let text = e.to_string();
            if text.contains("failed calling webhook") || text.contains("connection refused") {
                Err(text)
            } else {
                Ok(())
            }
        }
    }
}

/// The ClusterRole aggregation controller's job (kube-controller-manager is not
/// running): every ClusterRole with an `aggregationRule` gets the union of the rules
/// of the ClusterRoles its `matchLabels` selectors select.
async fn aggregate_once(client: &kube::Client) -> Result<(), String> {
    let api = Api::<ClusterRole>::all(client.clone());
    let roles = api
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("capi rig: listing ClusterRoles: {e}"))?
        .items;
    for role in &roles {
        let Some(rule) = &role.aggregation_rule else {
            continue;
        };
        let selectors: Vec<BTreeMap<String, String>> = rule
            .cluster_role_selectors
            .iter()
            .flatten()
            .map(|s| s.match_labels.clone().unwrap_or_default())
            .collect();
        let mut rules = Vec::new();
        for source in &roles {
            let labels = source.metadata.labels.clone().unwrap_or_default();
            let selected = selectors
                .iter()
                .any(|s| !s.is_empty() && s.iter().all(|(k, v)| labels.get(k) == Some(v)));
            if selected && source.metadata.name != role.metadata.name {
                for r in source.rules.iter().flatten() {
                    if !rules.contains(r) {
                        rules.push(r.clone());
                    }
                }
            }
        }
        if role.rules.as_ref().unwrap_or(&Vec::new()) != &rules {
            let name = role.metadata.name.clone().unwrap_or_default();
            api.patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"rules": rules})),
            )
            .await
            .map_err(|e| format!("capi rig: aggregating {name}: {e}"))?;
        }
    }
    Ok(())
}

async fn aggregate_forever(client: kube::Client) {
    use futures::StreamExt as _;
    let api = Api::<ClusterRole>::all(client.clone());
    let mut events = std::pin::pin!(watcher(api, watcher::Config::default()));
    while let Some(event) = events.next().await {
        if matches!(
            event,
            Ok(watcher::Event::InitDone | watcher::Event::Apply(_) | watcher::Event::Delete(_))
        ) && let Err(e) = aggregate_once(&client).await
        {
            eprintln!("{e}");
        }
    }
}
