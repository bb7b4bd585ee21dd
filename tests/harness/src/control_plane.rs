//! Starting etcd and kube-apiserver, and the [`ControlPlane`] handle.

use std::env;
use std::fmt::Write as _;
use std::future::Future;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, Config};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use crate::binaries::Binaries;
use crate::crash::{self, Component};
use crate::namespace::{TestNamespace, unique_name};
use crate::process::ManagedProcess;
use crate::teardown::{self, Running, Slot};
use crate::{Error, certs};

/// Field manager for the server-side apply of CRDs.
pub const FIELD_MANAGER: &str = "banlieue-testenv";

pub(crate) const ETCD: &str = "etcd";
pub(crate) const KUBE_APISERVER: &str = "kube-apiserver";
const DEFAULT_START_TIMEOUT: Duration = Duration::from_secs(60);
const DEFAULT_STOP_TIMEOUT: Duration = Duration::from_secs(10);
const POLL_INTERVAL: Duration = Duration::from_millis(100);
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// How to start a [`ControlPlane`]. [`ControlPlaneConfig::from_env`] (also `Default`) reads
/// envtest's environment variables; the builder methods override them.
#[derive(Clone, Debug)]
#[must_use]
pub struct ControlPlaneConfig {
    crds: Vec<CustomResourceDefinition>,
    policies: Vec<ValidatingAdmissionPolicy>,
    policy_bindings: Vec<ValidatingAdmissionPolicyBinding>,
    binaries: Option<Binaries>,
    start_timeout: Duration,
    stop_timeout: Duration,
    attach_output: bool,
    keep_dir: bool,
    apiserver_args: Vec<String>,
    etcd_args: Vec<String>,
}

impl Default for ControlPlaneConfig {
    fn default() -> Self {
        Self::from_env()
    }
}

impl ControlPlaneConfig {
    /// Defaults, overridden by the environment:
    ///
    /// - `KUBEBUILDER_CONTROLPLANE_START_TIMEOUT` (default `60s`) bounds each of etcd's and
    ///   the apiserver's startup and the CRDs becoming established; `..._STOP_TIMEOUT`
    ///   (default `10s`) is the grace period between SIGTERM and SIGKILL. Both accept Go-style
    ///   durations (`90s`, `2m`, `1m30s`, `500ms`) or plain seconds.
    /// - `KUBEBUILDER_ATTACH_CONTROL_PLANE_OUTPUT=true` streams process output to the test's
    ///   stdout/stderr instead of log files in the control plane's directory.
    /// - `BANLIEUE_TESTENV_KEEP=1` keeps the directory (certificates, kubeconfig, logs, etcd
    ///   data) after the run and prints its path.
    ///
    /// Binaries are located at start (see [`Binaries::locate`]) unless set with
    /// [`binaries`](Self::binaries).
    pub fn from_env() -> Self {
        Self {
            crds: Vec::new(),
            policies: Vec::new(),
            policy_bindings: Vec::new(),
            binaries: None,
            start_timeout: env_duration("KUBEBUILDER_CONTROLPLANE_START_TIMEOUT")
                .unwrap_or(DEFAULT_START_TIMEOUT),
            stop_timeout: env_duration("KUBEBUILDER_CONTROLPLANE_STOP_TIMEOUT")
                .unwrap_or(DEFAULT_STOP_TIMEOUT),
            attach_output: env_flag("KUBEBUILDER_ATTACH_CONTROL_PLANE_OUTPUT"),
            keep_dir: env_flag("BANLIEUE_TESTENV_KEEP"),
            apiserver_args: Vec::new(),
            etcd_args: Vec::new(),
        }
    }

    /// CRDs to apply (server-side, forced) and wait for until they are `Established`.
    pub fn crds(mut self, crds: impl IntoIterator<Item = CustomResourceDefinition>) -> Self {
        self.crds.extend(crds);
        self
    }

    /// ValidatingAdmissionPolicies and their bindings to apply (server-side, forced)
    /// once the CRDs are established. The apiserver enforces a new policy about a
    /// second later (its policy informer); nothing in the API says when, so a test of
    /// a policy waits for its first refusal.
    pub fn admission_policies(
        mut self,
        policies: impl IntoIterator<Item = ValidatingAdmissionPolicy>,
        bindings: impl IntoIterator<Item = ValidatingAdmissionPolicyBinding>,
    ) -> Self {
        self.policies.extend(policies);
        self.policy_bindings.extend(bindings);
        self
    }

    /// banlieue's API as an install has it: every CRD ([`banlieue_sdk::crds::all`])
    /// and the admission policies shipped with them ([`banlieue_sdk::admission`]).
    pub fn banlieue_api(self) -> Self {
        self.crds(banlieue_sdk::crds::all()).admission_policies(
            banlieue_sdk::admission::policies(),
            banlieue_sdk::admission::bindings(),
        )
    }

    /// Uses these binaries instead of looking them up.
    pub fn binaries(mut self, binaries: Binaries) -> Self {
        self.binaries = Some(binaries);
        self
    }

    /// Bounds each startup phase (etcd, apiserver, CRDs).
    pub fn start_timeout(mut self, timeout: Duration) -> Self {
        self.start_timeout = timeout;
        self
    }

    /// Grace period between SIGTERM and SIGKILL at teardown.
    pub fn stop_timeout(mut self, timeout: Duration) -> Self {
        self.stop_timeout = timeout;
        self
    }

    /// Streams process output to the test's output instead of log files.
    pub fn attach_output(mut self, attach: bool) -> Self {
        self.attach_output = attach;
        self
    }

    /// Keeps the control plane's directory after teardown.
    pub fn keep_dir(mut self, keep: bool) -> Self {
        self.keep_dir = keep;
        self
    }

    /// Appends a kube-apiserver flag (e.g. `--feature-gates=...`); later flags win.
    pub fn apiserver_arg(mut self, arg: impl Into<String>) -> Self {
        self.apiserver_args.push(arg.into());
        self
    }

    /// Appends an etcd flag (e.g. `--quota-backend-bytes=...`); later flags win.
    pub fn etcd_arg(mut self, arg: impl Into<String>) -> Self {
        self.etcd_args.push(arg.into());
        self
    }
}

/// A running etcd + kube-apiserver pair with an admin kubeconfig.
///
/// The processes belong to a dedicated thread that lives as long as the handle (forever for
/// [`shared`](crate::shared)), so the handle holds no runtime-bound state: each test builds
/// its own [`Client`] with [`client`](Self::client). Dropping the handle stops the
/// processes and removes the directory; so does process exit, for handles never dropped.
#[derive(Debug)]
pub struct ControlPlane {
    dir: PathBuf,
    server_url: String,
    kubeconfig_path: PathBuf,
    config: Config,
    janitor: mpsc::UnboundedSender<String>,
    crashes: mpsc::UnboundedSender<crash::Request>,
    running: Slot,
}

impl ControlPlane {
    /// Starts etcd and kube-apiserver, waits until the apiserver is ready, and installs the
    /// configured CRDs. Blocks the calling thread (the work happens on a dedicated thread),
    /// so it may be called from synchronous code or from within a Tokio runtime.
    ///
    /// # Errors
    /// If a binary is missing, a process fails or does not get ready within the start
    /// timeout (the error quotes the tail of its log), or a CRD is rejected or does not get
    /// established.
    pub fn start(config: ControlPlaneConfig) -> Result<Self, Error> {
        let (tx, rx) = std_mpsc::channel();
        std::thread::Builder::new()
            .name("banlieue-testenv".to_owned())
            .spawn(move || control_plane_thread(config, &tx))
            .map_err(Error::io("spawning the control-plane thread"))?;
        rx.recv().unwrap_or_else(|_| {
            Err(Error::Io {
                context: "starting the control plane".to_owned(),
                source: std::io::Error::other("the control-plane thread panicked"),
            })
        })
    }

    /// The apiserver's URL, `https://127.0.0.1:<port>`.
    pub fn server_url(&self) -> &str {
        &self.server_url
    }

    /// The admin kubeconfig (`<dir>/kubeconfig`), e.g. for `kubectl --kubeconfig` or a
    /// controller started as a subprocess.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig_path
    }

    /// The temporary directory holding certificates, kubeconfig, logs and etcd data.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The admin client configuration (user `admin`, group `system:masters`; default
    /// namespace `default`).
    pub fn kube_config(&self) -> Config {
        self.config.clone()
    }

    /// A new admin [`Client`], bound to the calling Tokio runtime.
    ///
    /// # Panics
    /// If the client cannot be built (which would be a harness bug).
    // `async` only to guarantee a runtime context: building the client spawns a task.
    pub async fn client(&self) -> Client {
        client_for(self.config.clone())
    }

    /// Creates a namespace named `<prefix>-<n>-<random>` and returns it with a client whose
    /// default namespace it is. Dropping the [`TestNamespace`] deletes it (best effort).
    ///
    /// # Panics
    /// If the namespace cannot be created.
    pub async fn namespace(&self, prefix: &str) -> TestNamespace {
        let name = unique_name(prefix);
        let mut config = self.config.clone();
        config.default_namespace.clone_from(&name);
        let client = client_for(config);
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(
                    [(
                        "app.kubernetes.io/managed-by".to_owned(),
                        FIELD_MANAGER.to_owned(),
                    )]
                    .into(),
                ),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .unwrap_or_else(|e| panic!("banlieue-testenv: creating namespace {name}: {e}"));
        TestNamespace::new(client, name, self.janitor.clone())
    }
}

impl ControlPlane {
    /// Simulates a crash of one control-plane process: SIGKILLs it, leaves it down for
    /// `down_for`, starts it again with the same flags and data, and returns once it is
    /// ready (or its start timeout passed). Clients see the outage as a real one:
    /// refused connections, then broken watches.
    ///
    /// # Errors
    /// If the process cannot be started again or does not get ready.
    pub async fn crash(&self, component: Component, down_for: Duration) -> Result<(), Error> {
        let (reply, replied) = tokio::sync::oneshot::channel();
        let request = crash::Request {
            component,
            down_for,
            reply,
        };
        let gone = || Error::Io {
            context: "crashing a control-plane process".to_owned(),
            source: std::io::Error::other("the control-plane thread has ended"),
        };
        self.crashes.send(request).map_err(|_| gone())?;
        replied.await.map_err(|_| gone())?
    }
}

impl ControlPlane {
    /// The process id of `component`, e.g. to read its CPU time from `/proc`; `None` once
    /// the control plane has been shut down. A simulated [`crash`](Self::crash) changes it.
    pub fn pid(&self, component: Component) -> Option<u32> {
        teardown::lock(&self.running)
            .as_mut()?
            .process_mut(component.process_name())
            .map(|p| p.pid())
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        teardown::shutdown(&self.running);
        // Dropping `janitor` (after this) ends the control-plane thread once no
        // `TestNamespace` is left.
    }
}

/// Installs rustls's `ring` provider as the process default unless one is installed. kube
/// selects `ring`, but another crate in a test binary may compile in `aws-lc-rs` too, and
/// then rustls cannot choose on its own.
fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn client_for(config: Config) -> Client {
    install_crypto_provider();
    Client::try_from(config).unwrap_or_else(|e| panic!("banlieue-testenv: building a client: {e}"))
}

/// Body of the thread that owns the control-plane processes. `PR_SET_PDEATHSIG` fires when
/// the thread that spawned a child exits, so this thread must outlive the processes: after
/// startup it serves namespace deletions until the handle and every namespace are dropped.
fn control_plane_thread(
    config: ControlPlaneConfig,
    tx: &std_mpsc::Sender<Result<ControlPlane, Error>>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            let _ = tx.send(Err(Error::Io {
                context: "building the control-plane runtime".to_owned(),
                source: e,
            }));
            return;
        }
    };
    let (janitor_tx, janitor_rx) = mpsc::unbounded_channel();
    let (crash_tx, crash_rx) = mpsc::unbounded_channel();
    let start_timeout = config.start_timeout;
    match runtime.block_on(boot(config, janitor_tx, crash_tx)) {
        Ok((control_plane, client, etcd_port)) => {
            let crashes = crash::Crasher {
                running: control_plane.running.clone(),
                client: client.clone(),
                etcd_port,
                start_timeout,
            };
            if tx.send(Ok(control_plane)).is_ok() {
                runtime.block_on(serve(client, janitor_rx, crashes, crash_rx));
            }
        }
        Err(e) => {
            let _ = tx.send(Err(e));
        }
    }
}

/// Deletes namespaces whose [`TestNamespace`] was dropped (namespaces never finish
/// terminating without kube-controller-manager; deleting them only marks them), and
/// carries out [`ControlPlane::crash`] requests, until the handle and every namespace
/// are gone.
async fn serve(
    client: Client,
    mut names: mpsc::UnboundedReceiver<String>,
    crasher: crash::Crasher,
    mut crashes: mpsc::UnboundedReceiver<crash::Request>,
) {
    let api = Api::<Namespace>::all(client);
    loop {
        tokio::select! {
            name = names.recv() => match name {
                Some(name) => {
                    let _ = api
                        .delete(&name, &kube::api::DeleteParams::background())
                        .await;
                }
                None => return,
            },
            Some(request) = crashes.recv() => crasher.handle(request).await,
        }
    }
}

async fn boot(
    config: ControlPlaneConfig,
    janitor: mpsc::UnboundedSender<String>,
    crashes: mpsc::UnboundedSender<crash::Request>,
) -> Result<(ControlPlane, Client, u16), Error> {
    teardown::remove_stale_dirs();
    let binaries = match config.binaries.clone() {
        Some(binaries) => binaries,
        None => Binaries::locate()?,
    };
    let dir = tempfile::Builder::new()
        .prefix(&format!("{}{}-", teardown::DIR_PREFIX, std::process::id()))
        .tempdir()
        .map_err(Error::io(
            "creating the control plane's temporary directory",
        ))?;
    let dir_path = dir.path().to_owned();
    let running = teardown::register(Running::new(dir, config.keep_dir, config.stop_timeout));
    match start_processes(&config, &binaries, &dir_path, &running).await {
        Ok((server_url, kubeconfig_path, kube_config, client, etcd_port)) => Ok((
            ControlPlane {
                dir: dir_path,
                server_url,
                kubeconfig_path,
                config: kube_config,
                janitor,
                crashes,
                running,
            },
            client,
            etcd_port,
        )),
        Err(e) => {
            teardown::shutdown(&running);
            Err(e)
        }
    }
}

async fn start_processes(
    config: &ControlPlaneConfig,
    binaries: &Binaries,
    dir: &Path,
    running: &Slot,
) -> Result<(String, PathBuf, Config, Client, u16), Error> {
    let started = Instant::now();
    let pki = certs::generate(&dir.join("pki"))?;
    let [etcd_port, etcd_peer_port, apiserver_port] = free_ports()?;

    let etcd_url = format!("http://127.0.0.1:{etcd_port}");
    let peer_url = format!("http://127.0.0.1:{etcd_peer_port}");
    let mut etcd_args = vec![
        "--name=banlieue-testenv".to_owned(),
        format!("--data-dir={}", dir.join("etcd").display()),
        format!("--listen-client-urls={etcd_url}"),
        format!("--advertise-client-urls={etcd_url}"),
        format!("--listen-peer-urls={peer_url}"),
        format!("--initial-advertise-peer-urls={peer_url}"),
        format!("--initial-cluster=banlieue-testenv={peer_url}"),
        "--log-level=warn".to_owned(),
    ];
    if supports_flag(&binaries.etcd, "--unsafe-no-fsync") {
        etcd_args.push("--unsafe-no-fsync=true".to_owned());
    }
    etcd_args.extend(config.etcd_args.iter().cloned());
    let etcd = ManagedProcess::spawn(ETCD, &binaries.etcd, &etcd_args, dir, config.attach_output)?;
    adopt(running, etcd);
    wait_ready(running, ETCD, config.start_timeout, || {
        etcd_healthy(etcd_port)
    })
    .await?;
    let etcd_ready = started.elapsed();

    let server_url = format!("https://127.0.0.1:{apiserver_port}");
    let path = |p: &Path| p.display().to_string();
    let mut apiserver_args = vec![
        "--advertise-address=127.0.0.1".to_owned(),
        "--bind-address=127.0.0.1".to_owned(),
        format!("--secure-port={apiserver_port}"),
        format!("--etcd-servers={etcd_url}"),
        format!("--cert-dir={}", path(&dir.join("pki"))),
        format!("--tls-cert-file={}", path(&pki.serving_cert)),
        format!("--tls-private-key-file={}", path(&pki.serving_key)),
        format!("--client-ca-file={}", path(&pki.ca_cert)),
        "--authorization-mode=RBAC".to_owned(),
        // No token controller runs, so ServiceAccount admission would reject every pod.
        "--disable-admission-plugins=ServiceAccount".to_owned(),
        "--service-cluster-ip-range=10.0.0.0/24".to_owned(),
        "--allow-privileged=true".to_owned(),
        format!("--service-account-issuer={server_url}/"),
        format!("--service-account-key-file={}", path(&pki.sa_public_key)),
        format!(
            "--service-account-signing-key-file={}",
            path(&pki.sa_private_key)
        ),
    ];
    apiserver_args.extend(config.apiserver_args.iter().cloned());
    let apiserver = ManagedProcess::spawn(
        KUBE_APISERVER,
        &binaries.kube_apiserver,
        &apiserver_args,
        dir,
        config.attach_output,
    )?;
    adopt(running, apiserver);

    let kubeconfig_path = dir.join("kubeconfig");
    let kubeconfig = kubeconfig_yaml(&server_url, &pki);
    std::fs::write(&kubeconfig_path, &kubeconfig)
        .map_err(Error::io(format!("writing {}", kubeconfig_path.display())))?;
    let kubeconfig_error = |source| Error::Kubeconfig {
        path: kubeconfig_path.clone(),
        source,
    };
    let kube_config = Config::from_custom_kubeconfig(
        Kubeconfig::from_yaml(&kubeconfig).map_err(kubeconfig_error)?,
        &KubeConfigOptions::default(),
    )
    .await
    .map_err(kubeconfig_error)?;
    let client = client_for(kube_config.clone());
    wait_ready(running, KUBE_APISERVER, config.start_timeout, || {
        apiserver_ready(&client)
    })
    .await?;
    let apiserver_ready = started.elapsed();

    install_crds(&client, &config.crds, config.start_timeout).await?;
    install_policies(&client, &config.policies, &config.policy_bindings).await?;
    if env_flag("BANLIEUE_TESTENV_VERBOSE") {
        crate::note(&format!(
            "control plane at {server_url} ready: etcd {etcd_ready:.1?}, apiserver {apiserver_ready:.1?}, \
             {} CRDs {:.1?} (dir {})",
            config.crds.len(),
            started.elapsed(),
            dir.display()
        ));
    }
    Ok((server_url, kubeconfig_path, kube_config, client, etcd_port))
}

/// Hands `process` to the teardown state (stopping it if that was already torn down).
fn adopt(running: &Slot, process: ManagedProcess) {
    if let Some(running) = teardown::lock(running).as_mut() {
        running.push(process);
    }
}

/// Reserves distinct free loopback ports by binding them all at once, then releases them.
fn free_ports<const N: usize>() -> Result<[u16; N], Error> {
    let listeners = (0..N)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .map_err(Error::io("reserving a loopback port"))?;
    let mut ports = [0; N];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener
            .local_addr()
            .map_err(Error::io("reading a reserved port"))?
            .port();
    }
    Ok(ports)
}

/// Whether `binary --help` mentions `flag` (envtest's check for `--unsafe-no-fsync`).
fn supports_flag(binary: &Path, flag: &str) -> bool {
    Command::new(binary)
        .arg("--help")
        .output()
        .is_ok_and(|out| {
            String::from_utf8_lossy(&out.stdout).contains(flag)
                || String::from_utf8_lossy(&out.stderr).contains(flag)
        })
}

/// Polls `probe` until it succeeds, the process exits, or `timeout` passes.
pub(crate) async fn wait_ready<F, Fut>(
    running: &Slot,
    name: &str,
    timeout: Duration,
    mut probe: F,
) -> Result<(), Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let exited = teardown::lock(running)
            .as_mut()
            .and_then(|r| r.process_mut(name))
            .and_then(|p| p.exited().map(|status| (status, p.log_tail())));
        if let Some((status, log)) = exited {
            return Err(Error::Exited {
                name: name.to_owned(),
                status,
                log,
            });
        }
        let last_error = match tokio::time::timeout(PROBE_TIMEOUT, probe()).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => e,
            Err(_) => format!("probe timed out after {PROBE_TIMEOUT:?}"),
        };
        if Instant::now() >= deadline {
            let log = teardown::lock(running)
                .as_mut()
                .and_then(|r| r.process_mut(name))
                .map_or_else(|| format!("{name} was already stopped"), |p| p.log_tail());
            return Err(Error::Timeout {
                what: name.to_owned(),
                timeout,
                last_error,
                log,
            });
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// `GET /health` on etcd's client URL reports `"health":"true"`.
pub(crate) async fn etcd_healthy(port: u16) -> Result<(), String> {
    let probe = async {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await?;
        let request =
            format!("GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await?;
        Ok::<_, std::io::Error>(response)
    };
    let response = probe.await.map_err(|e| format!("GET /health: {e}"))?;
    if response.contains(r#""health":"true""#) {
        Ok(())
    } else {
        let body = response.split("\r\n\r\n").nth(1).unwrap_or(&response);
        Err(format!("GET /health: {}", body.trim()))
    }
}

/// `GET /readyz` over TLS (trusting the harness CA) returns `ok`.
pub(crate) async fn apiserver_ready(client: &Client) -> Result<(), String> {
    let request = http::Request::get("/readyz")
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    match client.request_text(request).await {
        Ok(body) if body.trim() == "ok" => Ok(()),
        Ok(body) => Err(format!("GET /readyz: {}", failed_checks(&body))),
        Err(e) => Err(format!("GET /readyz: {}", failed_checks(&e.to_string()))),
    }
}

/// The failing (`[-]`) lines of a verbose `/readyz` report, or the whole text if none.
fn failed_checks(report: &str) -> String {
    let failed: Vec<&str> = report
        .lines()
        .map(str::trim)
        .filter(|line| line.starts_with("[-]"))
        .collect();
    if failed.is_empty() {
        report.trim().to_owned()
    } else {
        failed.join("; ")
    }
}

fn kubeconfig_yaml(server_url: &str, pki: &certs::PkiFiles) -> String {
    // Paths are quoted as YAML double-quoted scalars; Debug-formatting a str escapes `"`
    // and `\` compatibly.
    let quote = |p: &Path| format!("{:?}", p.display().to_string());
    let mut yaml = String::new();
    let _ = write!(
        yaml,
        "apiVersion: v1
kind: Config
clusters:
- name: banlieue-testenv
  cluster:
    server: {server_url}
    certificate-authority: {ca}
users:
- name: admin
  user:
    client-certificate: {cert}
    client-key: {key}
contexts:
- name: banlieue-testenv
  context:
    cluster: banlieue-testenv
    user: admin
    namespace: default
current-context: banlieue-testenv
",
        ca = quote(&pki.ca_cert),
        cert = quote(&pki.client_cert),
        key = quote(&pki.client_key),
    );
    yaml
}

/// Applies each CRD server-side and waits until all are `Established`.
async fn install_crds(
    client: &Client,
    crds: &[CustomResourceDefinition],
    timeout: Duration,
) -> Result<(), Error> {
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    for crd in crds {
        let name = crd.metadata.name.as_deref().unwrap_or_default();
        api.patch(name, &params, &Patch::Apply(crd))
            .await
            .map_err(Error::kube(format!("applying CRD {name}")))?;
    }
    for crd in crds {
        let name = crd.metadata.name.as_deref().unwrap_or_default();
        let established = await_condition(api.clone(), name, conditions::is_crd_established());
        let reason = match tokio::time::timeout(timeout, established).await {
            Ok(Ok(_)) => continue,
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("not Established after {timeout:?}"),
        };
        return Err(Error::CrdNotEstablished {
            name: name.to_owned(),
            reason,
        });
    }
    Ok(())
}

/// Applies each policy, then each binding, server-side.
async fn install_policies(
    client: &Client,
    policies: &[ValidatingAdmissionPolicy],
    bindings: &[ValidatingAdmissionPolicyBinding],
) -> Result<(), Error> {
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let api = Api::<ValidatingAdmissionPolicy>::all(client.clone());
    for policy in policies {
        let name = policy.metadata.name.as_deref().unwrap_or_default();
        api.patch(name, &params, &Patch::Apply(policy))
            .await
            .map_err(Error::kube(format!(
                "applying ValidatingAdmissionPolicy {name}"
            )))?;
    }
    let api = Api::<ValidatingAdmissionPolicyBinding>::all(client.clone());
    for binding in bindings {
        let name = binding.metadata.name.as_deref().unwrap_or_default();
        api.patch(name, &params, &Patch::Apply(binding))
            .await
            .map_err(Error::kube(format!(
                "applying ValidatingAdmissionPolicyBinding {name}"
            )))?;
    }
    Ok(())
}

fn env_flag(name: &str) -> bool {
    env::var(name)
        .is_ok_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes"))
}

fn env_duration(name: &str) -> Option<Duration> {
    let value = env::var(name).ok()?;
    let parsed = parse_duration(&value);
    if parsed.is_none() {
        crate::note(&format!(
            "ignoring {name}={value:?}: expected e.g. `90s`, `2m` or `90`"
        ));
    }
    parsed
}

/// Parses Go-style durations (`1m30s`, `500ms`, `2h`) and plain seconds (`90`).
fn parse_duration(text: &str) -> Option<Duration> {
    banlieue_sdk::duration::parse_or_seconds(text).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_durations() {
        assert_eq!(parse_duration("90"), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("90s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("1500ms"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration(""), None);
        assert_eq!(parse_duration("soon"), None);
        assert_eq!(parse_duration("5x"), None);
    }

    #[test]
    fn free_ports_are_distinct() {
        let [a, b, c] = free_ports().unwrap();
        assert!(a != b && b != c && a != c);
    }

    #[test]
    fn kubeconfig_parses() {
        let dir = tempfile::tempdir().unwrap();
        let pki = certs::generate(dir.path()).unwrap();
        let yaml = kubeconfig_yaml("https://127.0.0.1:6443", &pki);
        let kubeconfig = Kubeconfig::from_yaml(&yaml).unwrap();
        let cluster = kubeconfig.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://127.0.0.1:6443"));
        assert_eq!(
            cluster.certificate_authority.as_deref(),
            Some(pki.ca_cert.to_str().unwrap())
        );
    }
}
