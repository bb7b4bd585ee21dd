//! One run: a fresh control plane with an audit log, the real CAPI core manager, one
//! provider (banlieue or the peer), the workload applied at once, followed until every
//! Machine's infrastructure is provisioned. Each run is its own process (`--one-run`),
//! so everything it started dies with it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use banlieue_bench::bench_client;
use banlieue_bench::measure::{self, BENCH_USER_AGENT, Phase};
use banlieue_bench::operator::Operator;
use banlieue_integration_tests::capi::{self, Capi};
use banlieue_testenv::{ControlPlane, ControlPlaneConfig};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use kube::runtime::wait::{await_condition, conditions};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::workload;
use crate::{RunArgs, Side};

/// banlieue's shipped client and machine-controller settings, which the peer is given
/// too (its own defaults: 100 QPS, burst 200, 50 DevMachine reconciles at once).
pub const QPS: &str = "500";
/// See [`QPS`].
pub const BURST: &str = "1000";
/// See [`QPS`].
pub const MACHINE_CONCURRENCY: &str = "16";

const NAMESPACE: &str = "bench";

/// What one run measured.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunResult {
    /// Which provider ran.
    pub side: Side,
    /// Machines.
    pub n: usize,
    /// From the first apply to every Machine's `status.initialization.infrastructureProvisioned`.
    pub seconds: f64,
    /// The provider process's CPU seconds over that interval.
    pub provider_cpu_seconds: f64,
    /// The provider process's peak RSS (`VmHWM`) at the end, MiB.
    pub provider_peak_rss_mib: f64,
    /// The CAPI core manager's CPU seconds over that interval.
    pub capi_cpu_seconds: f64,
    /// The provider's API requests over that interval, by `"<verb> <resource>"`.
    pub provider_requests: BTreeMap<String, u64>,
    /// Machines provisioned over time: (seconds since the first apply, count).
    pub curve: Vec<(f64, f64)>,
    /// Machines created by Cluster API over time (their `creationTimestamp`s).
    #[serde(default)]
    pub created: Vec<(f64, f64)>,
    /// Each Machine's seconds from creation to `InfrastructureReady`.
    #[serde(default)]
    pub lags: Vec<f64>,
    /// The Cluster API release (the CAPI manager's, and the peer's).
    pub capi_version: String,
}

impl RunResult {
    /// All the provider's requests.
    pub fn requests(&self) -> u64 {
        self.provider_requests.values().sum()
    }

    /// The provider's writes.
    pub fn writes(&self) -> u64 {
        self.provider_requests
            .iter()
            .filter(|(k, _)| measure::is_write(k))
            .map(|(_, n)| n)
            .sum()
    }

    /// Machines provisioned per minute.
    pub fn per_minute(&self) -> f64 {
        self.n as f64 * 60.0 / self.seconds
    }
}

/// The provider under test, killed on drop.
enum Provider {
    Banlieue(Operator),
    Peer(Child),
}

impl Provider {
    fn pid(&self) -> u32 {
        match self {
            Self::Banlieue(operator) => operator.pid(),
            Self::Peer(child) => child.id(),
        }
    }

    /// What its requests' `User-Agent` holds (CAPD's reads `manager/<version>
    /// cluster-api-docker-controller-manager (<os>/<arch>) ...`).
    fn user_agent(&self) -> &'static str {
        match self {
            Self::Banlieue(_) => "banlieue/",
            Self::Peer(_) => " cluster-api-docker-controller-manager ",
        }
    }

    fn exited(&mut self) -> bool {
        match self {
            Self::Banlieue(operator) => operator.exited(),
            Self::Peer(child) => child.try_wait().ok().flatten().is_some(),
        }
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        if let Self::Peer(child) = self {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Runs `args.side` at `args.n` and returns what it measured.
pub async fn run(args: &RunArgs) -> anyhow::Result<RunResult> {
    let scratch = tempfile::Builder::new()
        .prefix("banlieue-capi-peer-")
        .tempdir()?;
    // BENCH_KEEP keeps the audit log and certificates for a look afterwards.
    let scratch = if std::env::var_os("BENCH_KEEP").is_some() {
        scratch.keep()
    } else {
        scratch.path().to_owned()
    };
    let scratch = scratch.as_path();
    let policy = scratch.join("audit-policy.yaml");
    let audit_log = scratch.join("audit.log");
    std::fs::write(&policy, measure::audit_policy("Metadata"))?;
    let mut config = ControlPlaneConfig::from_env().banlieue_api();
    for flag in measure::audit_flags(&policy, &audit_log) {
        config = config.apiserver_arg(flag);
    }
    // The process ends with the run; CAPI's harness wants a control plane that outlives it.
    let control_plane: &'static ControlPlane = Box::leak(Box::new(
        tokio::task::block_in_place(|| ControlPlane::start(config)).context("control plane")?,
    ));
    let capi = tokio::task::block_in_place(|| Capi::start_on(control_plane))
        .context("the Cluster API rig is missing (tests/testbin/capi/build.sh)")?;
    let client = bench_client(control_plane).await?;
    install_crds(&client, &args.peer_dir()?.join("crds")).await?;
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NAMESPACE}}))?,
        )
        .await?;

    let log = args
        .log_dir
        .join(format!("{}-n{}.log", args.side.name(), args.n));
    let mut provider = start(args, control_plane.kubeconfig_path(), scratch, &log).await?;
    let ticks = measure::clock_ticks();
    let cpu = |pid: u32| {
        measure::sample(pid, ticks)
            .map(|s| s.cpu_seconds)
            .unwrap_or(0.0)
    };
    let (provider_cpu0, capi_cpu0) = (cpu(provider.pid()), cpu(capi.pid()));

    let from = Timestamp::now();
    let started = Instant::now();
    for object in workload::objects(args.side, NAMESPACE, args.n, args.per_md) {
        banlieue_integration_tests::apply(&client, NAMESPACE, &object)
            .await
            .with_context(|| {
                format!("applying {} {}", object["kind"], object["metadata"]["name"])
            })?;
    }
    let machines: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        NAMESPACE,
        &ApiResource::from_gvk(&GroupVersionKind::gvk(
            "cluster.x-k8s.io",
            "v1beta2",
            "Machine",
        )),
    );
    let poll = if args.n > 2_000 {
        Duration::from_secs(2)
    } else {
        Duration::from_secs(1)
    };
    let mut curve = vec![(0.0, 0.0)];
    let (seconds, last) = loop {
        tokio::time::sleep(poll).await;
        let list = machines.list(&ListParams::default()).await?;
        let provisioned = list
            .items
            .iter()
            .filter(|m| {
                m.data["status"]["initialization"]["infrastructureProvisioned"] == json!(true)
            })
            .count();
        let at = started.elapsed().as_secs_f64();
        curve.push((at, provisioned as f64));
        if provisioned >= args.n {
            break (at, list.items);
        }
        if provider.exited() {
            bail!("{} exited; see {}", args.side.name(), log.display());
        }
        if started.elapsed() > args.timeout {
            bail!(
                "{provisioned} of {} Machines provisioned after {:?}; see {}",
                args.n,
                args.timeout,
                log.display()
            );
        }
    };
    let to = Timestamp::now();
    let (created, lags) = creation(&last, from);
    let sample = measure::sample(provider.pid(), ticks).context("sampling the provider")?;
    let capi_cpu_seconds = cpu(capi.pid()) - capi_cpu0;
    eprintln!(
        "    {} n={}: all provisioned in {seconds:.1}s",
        args.side.name(),
        args.n
    );
    // The audit backend writes synchronously; give the last lines a moment anyway.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let needle = provider.user_agent();
    let counts = measure::count_requests_by(
        &audit_log,
        &[Phase {
            name: "run",
            start: from,
            end: to,
        }],
        |agent| {
            if agent.contains(needle) {
                Some("provider")
            } else if agent.starts_with(BENCH_USER_AGENT) {
                Some("bench")
            } else {
                None
            }
        },
    )?;
    drop(provider);
    Ok(RunResult {
        side: args.side,
        n: args.n,
        seconds,
        provider_cpu_seconds: sample.cpu_seconds - provider_cpu0,
        provider_peak_rss_mib: sample.peak_rss_mib,
        capi_cpu_seconds,
        provider_requests: counts.of("run", "provider"),
        curve,
        created,
        lags,
        capi_version: capi.version().to_owned(),
    })
}

/// From the Machines at the end: Cluster API's creation curve (their
/// `creationTimestamp`s, in seconds since `from`) and each Machine's lag from creation
/// to `InfrastructureReady` (its `lastTransitionTime`). Both have the API's
/// one-second resolution.
fn creation(machines: &[DynamicObject], from: Timestamp) -> (Vec<(f64, f64)>, Vec<f64>) {
    let seconds = |t: &Value| {
        t.as_str()
            .and_then(|t| t.parse::<Timestamp>().ok())
            .map(|t| t.duration_since(from).as_secs_f64())
    };
    let mut born: Vec<f64> = Vec::new();
    let mut lags = Vec::new();
    for machine in machines {
        let Some(created) = machine
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.duration_since(from).as_secs_f64())
        else {
            continue;
        };
        born.push(created);
        let ready = machine.data["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "InfrastructureReady" && c["status"] == "True")
            .and_then(|c| seconds(&c["lastTransitionTime"]));
        if let Some(ready) = ready {
            lags.push((ready - created).max(0.0));
        }
    }
    born.sort_by(f64::total_cmp);
    let curve = born
        .iter()
        .enumerate()
        .map(|(i, t)| (t.max(0.0), (i + 1) as f64))
        .collect();
    (curve, lags)
}

/// Starts the provider of `args.side` with the same QPS, burst and machine concurrency,
/// and waits until it answers `/readyz`.
async fn start(
    args: &RunArgs,
    kubeconfig: &Path,
    scratch: &Path,
    log: &Path,
) -> anyhow::Result<Provider> {
    match args.side {
        Side::Banlieue => {
            // Its shipped defaults are these values; passing them documents that.
            let flags = [
                format!("--kube-api-qps={QPS}"),
                format!("--kube-api-burst={BURST}"),
                format!("--machine-concurrency={MACHINE_CONCURRENCY}"),
            ];
            let mut operator = Operator::spawn(&args.operator, kubeconfig, log, &flags)?;
            operator.wait_ready(Duration::from_secs(120)).await?;
            Ok(Provider::Banlieue(operator))
        }
        Side::Peer => {
            let certs = scratch.join("peer-certs");
            std::fs::create_dir_all(&certs)?;
            capi::write_serving_cert(&certs).map_err(anyhow::Error::msg)?;
            let [webhook, health, diagnostics] =
                capi::free_ports::<3>().map_err(anyhow::Error::msg)?;
            let health = format!("127.0.0.1:{health}");
            let flags = vec![
                format!("--kubeconfig={}", kubeconfig.display()),
                format!("--webhook-port={webhook}"),
                format!("--webhook-cert-dir={}", certs.display()),
                format!("--health-addr={health}"),
                format!("--diagnostics-address=127.0.0.1:{diagnostics}"),
                "--insecure-diagnostics".to_owned(),
                format!("--kube-api-qps={QPS}"),
                format!("--kube-api-burst={BURST}"),
                format!("--devmachine-concurrency={MACHINE_CONCURRENCY}"),
            ];
            let mut child =
                capi::spawn_manager(args.peer_dir()?, &flags, log).map_err(anyhow::Error::msg)?;
            let deadline = Instant::now() + Duration::from_secs(120);
            while !capi::http_ok(&health, "/readyz") {
                if let Some(status) = child.try_wait()? {
                    bail!("the peer exited ({status}); see {}", log.display());
                }
                if Instant::now() > deadline {
                    bail!("the peer was not ready within 120 s; see {}", log.display());
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Ok(Provider::Peer(child))
        }
    }
}

/// The peer's Dev* CRDs, labelled with the contract version CAPI reads (its release's
/// kustomization adds that label), installed on both sides so both control planes hold
/// the same kinds.
async fn install_crds(client: &Client, dir: &PathBuf) -> anyhow::Result<()> {
    let api = Api::<CustomResourceDefinition>::all(client.clone());
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let text = std::fs::read_to_string(&path)?;
        let mut crd: Value =
            serde_saphyr::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        crd["metadata"]["labels"] = json!({"cluster.x-k8s.io/v1beta2": "v1beta2"});
        let name = crd["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        api.patch(
            &name,
            &PatchParams::apply("capi-peer-bench").force(),
            &Patch::Apply(&crd),
        )
        .await
        .with_context(|| format!("applying CRD {name}"))?;
        names.push(name);
    }
    if names.is_empty() {
        bail!("no CRD in {}", dir.display());
    }
    for name in names {
        tokio::time::timeout(
            Duration::from_secs(60),
            await_condition(api.clone(), &name, conditions::is_crd_established()),
        )
        .await
        .with_context(|| format!("CRD {name} not established"))??;
    }
    Ok(())
}
