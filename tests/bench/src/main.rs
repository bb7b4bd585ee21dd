//! `make bench`: banlieue's scale benchmark.
//!
//! For each N, `--repeat` pairs of runs, each run on a fresh local control plane (etcd +
//! kube-apiserver with an audit log), alternating which side of a pair goes first:
//!
//! - **baseline**: a plain client performs only the minimal writes for N VirtualMachines
//!   ([`baseline::MINIMUM`]), with no operator running, then deletes them;
//! - **operator**: the operator (`banlieue run`, release build) starts as a child process;
//!   a `sim` Provider, VMClass and VMImage are created; N VirtualMachines are created at
//!   once and followed until all are Ready; in the first pair nothing happens for the idle
//!   window (writes there should be zero); all are deleted at once and followed until gone.
//!
//! Each run also reads the CPU time kube-apiserver and etcd spent until all were Ready. The
//! report gives medians over the pairs.
//!
//! Results are saved as `docs/benchmarks/data/<date>/n<N>.json`, and the report
//! `docs/benchmarks/scale-<date>.md` (with SVG charts) is regenerated from every result of
//! that date, so sizes run separately share one report. `scale.md` points to it. A
//! hand-written `data/<date>/notes.md`, if present, is appended to the report.

mod baseline;
mod report;
mod result;
mod workload;

use banlieue_bench::{bench_client, measure, operator, svg};

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use banlieue_testenv::{Component, ControlPlane, ControlPlaneConfig};
use clap::Parser;
use k8s_openapi::jiff::Timestamp;
use kube::Client;

use crate::baseline::{Baseline, Flow};
use crate::measure::{Phase, ProcSample, RequestCounts};
use crate::operator::Operator;
use crate::result::{Pair, SizeResult};
use crate::workload::{Curve, Tracker};

/// banlieue's scale benchmark: N VirtualMachines on the sim backend, created at once and
/// deleted at once, against a minimal-writes baseline.
#[derive(Parser, Debug)]
#[command(name = "banlieue-bench", version)]
struct Args {
    /// Sizes to run, comma-separated.
    #[arg(
        long,
        env = "BENCH_N",
        value_delimiter = ',',
        default_value = "100,1000,10000"
    )]
    sizes: Vec<usize>,

    /// The operator binary (`cargo build --release -p banlieue`).
    #[arg(
        long,
        env = "BANLIEUE_OPERATOR",
        default_value = "target/release/banlieue"
    )]
    operator: PathBuf,

    /// Idle window after convergence (`300s`, `5m`, `60s`): writes in it should be zero.
    #[arg(long, env = "BENCH_IDLE", default_value = "5m", value_parser = parse_duration)]
    idle: Duration,

    /// The sim Provider's `latency` setting.
    #[arg(long, default_value = "0s")]
    latency: String,

    /// Requests in flight from the benchmark's client (creates, deletes, baseline chains).
    #[arg(long, default_value_t = 64)]
    concurrency: usize,

    /// Bound on each phase (all Ready, all gone).
    #[arg(long, default_value = "60m", value_parser = parse_duration)]
    timeout: Duration,

    /// Baseline/operator pairs per size, each side on a fresh control plane; the report
    /// gives medians. Only the first pair's operator run has the idle window.
    #[arg(long, env = "BENCH_REPEAT", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..))]
    repeat: u32,

    /// Extra flag for `banlieue run` (repeatable), e.g. `--operator-arg=--kube-api-qps=100`.
    /// None by default: the benchmark measures the shipped defaults, which users get.
    #[arg(long = "operator-arg", allow_hyphen_values = true)]
    operator_args: Vec<String>,

    /// Extra flag for kube-apiserver (repeatable).
    #[arg(long = "apiserver-arg", allow_hyphen_values = true)]
    apiserver_args: Vec<String>,

    /// Where reports go (the data under `<out>/data/<date>/`).
    #[arg(long, default_value = "docs/benchmarks")]
    out: PathBuf,

    /// Report date (default: today, UTC).
    #[arg(long)]
    date: Option<String>,

    /// Only regenerate the report from saved results.
    #[arg(long)]
    report_only: bool,

    /// An earlier report date whose sizes join this report's cost-per-VM table, marked
    /// with their date (repeatable; only sizes this date has no result for). At
    /// N = 100,000 a run takes a session, so the other sizes come from other days.
    #[arg(long = "cost-with")]
    cost_with: Vec<String>,

    /// Audit level: `Metadata`, or `Request` to see each write's body when studying
    /// where writes come from (the counts are the same).
    #[arg(long, default_value = "Metadata")]
    audit_level: String,
}

/// Parses `300`, `300s`, `5m`, `1h` or `1500ms`.
fn parse_duration(text: &str) -> Result<Duration, String> {
    banlieue_sdk::duration::parse_or_seconds(text)
        .map_err(|_| format!("{:?} is not a duration like 60s, 5m or 300", text.trim()))
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let date = args
        .date
        .clone()
        .unwrap_or_else(|| Timestamp::now().to_string()[..10].to_owned());
    let data = args.out.join("data").join(&date);
    std::fs::create_dir_all(&data)?;
    if !args.report_only {
        if !args.operator.exists() {
            anyhow::bail!(
                "{} not found: cargo build --release -p banlieue",
                args.operator.display()
            );
        }
        for &n in &args.sizes {
            eprintln!("==> N = {n}");
            let result = run_size(&args, n)
                .await
                .with_context(|| format!("N = {n}"))?;
            eprintln!(
                "    all Ready {:.1}s (baseline {:.1}s, {:.2}x{}), all gone {:.1}s (baseline \
                 {:.1}s, {:.2}x), writes/VM {:.2}, idle writes/min {:.1}, peak RSS {:.1} MiB, \
                 CPU {:.1}s",
                result.ready_seconds(),
                result.baseline_ready(),
                result.ready_ratio(),
                result.each_pair(Pair::ready_ratio),
                result.gone_seconds(),
                result.baseline_gone(),
                result.gone_ratio(),
                result.writes_per_vm("create") + result.writes_per_vm("delete"),
                result.idle_writes_per_minute(),
                result.proc_end.peak_rss_mib,
                result.proc_end.cpu_seconds
            );
            std::fs::write(
                data.join(format!("n{n}.json")),
                serde_json::to_string_pretty(&result)?,
            )?;
        }
    }
    let results = result::load(&data)?;
    let mut earlier: Vec<(String, SizeResult)> = Vec::new();
    for other in &args.cost_with {
        for r in result::load(&args.out.join("data").join(other))? {
            let known = results.iter().chain(earlier.iter().map(|(_, e)| e));
            if !known.map(|k| k.n).any(|n| n == r.n) {
                earlier.push((other.clone(), r));
            }
        }
    }
    let notes = std::fs::read_to_string(data.join("notes.md")).ok();
    let header = report::Header {
        date: &date,
        machine: &machine(),
        control_plane: &control_plane_version(),
        notes,
        earlier: &earlier,
    };
    report::write(&args.out, &header, &results)?;
    eprintln!(
        "==> {}",
        args.out.join(format!("scale-{date}.md")).display()
    );
    Ok(())
}

/// One size: `--repeat` baseline/operator pairs, each run on a fresh control plane.
async fn run_size(args: &Args, n: usize) -> anyhow::Result<SizeResult> {
    let mut result = SizeResult {
        n,
        started_at: Timestamp::now().to_string(),
        latency: args.latency.clone(),
        concurrency: args.concurrency,
        operator_args: args.operator_args.clone(),
        apiserver_args: args.apiserver_args.clone(),
        idle_seconds: args.idle.as_secs_f64(),
        ..SizeResult::default()
    };
    for k in 0..args.repeat {
        let first = k == 0;
        // Alternating which side runs first keeps a drift of the machine from favouring one.
        let operator_first = k % 2 == 1;
        eprintln!("    pair {} of {}", k + 1, args.repeat);
        let (operator, baseline) = if operator_first {
            let operator = run_operator(args, n, first).await?;
            (operator, run_baseline(args, n).await?)
        } else {
            let baseline = run_baseline(args, n).await?;
            (run_operator(args, n, first).await?, baseline)
        };
        let pair = Pair {
            operator_first,
            ready_seconds: operator.ready.seconds,
            gone_seconds: operator.gone.seconds,
            baseline_ready_seconds: baseline.timings.ready.seconds,
            baseline_gone_seconds: baseline.timings.gone.seconds,
            control_plane_cpu_ready: operator.control_plane_cpu_ready,
            baseline_control_plane_cpu_ready: baseline.control_plane_cpu_ready,
        };
        eprintln!(
            "    pair {}: all Ready {:.1}s vs {:.1}s ({:.2}x), control-plane CPU {:.0}s vs {:.0}s \
             ({:.2}x)",
            k + 1,
            pair.ready_seconds,
            pair.baseline_ready_seconds,
            pair.ready_ratio(),
            pair.control_plane_cpu_ready,
            pair.baseline_control_plane_cpu_ready,
            pair.cpu_ratio()
        );
        result.pairs.push(pair);
        if first {
            result.ready = operator.ready;
            result.gone = operator.gone;
            result.requests = operator.requests;
            result.requests.phases.extend(baseline.requests.phases);
            result.operator_counted_writes = operator.counted_writes;
            result.creates_in_flight_peak = operator.creates_in_flight_peak;
            result.operator_client = operator.client_settings;
            result.proc_ready = operator.proc_ready;
            result.proc_idle = operator.proc_idle;
            result.proc_end = operator.proc_end;
            result.baseline = baseline.timings;
        }
    }
    Ok(result)
}

/// A fresh control plane with an audit log, and the benchmark's client for it.
struct Plane {
    control_plane: ControlPlane,
    client: Client,
    audit_log: PathBuf,
    scratch: tempfile::TempDir,
    clock_ticks: f64,
}

impl Plane {
    async fn start(args: &Args) -> anyhow::Result<Self> {
        let scratch = tempfile::Builder::new()
            .prefix("banlieue-bench-")
            .tempdir()?;
        let policy = scratch.path().join("audit-policy.yaml");
        let audit_log = scratch.path().join("audit.log");
        std::fs::write(&policy, measure::audit_policy(&args.audit_level))?;
        let mut config = ControlPlaneConfig::from_env()
            .banlieue_api()
            .etcd_arg(format!(
                "--quota-backend-bytes={}",
                measure::ETCD_QUOTA_BYTES
            ));
        for flag in measure::audit_flags(&policy, &audit_log)
            .into_iter()
            .chain(args.apiserver_args.iter().cloned())
        {
            config = config.apiserver_arg(flag);
        }
        let control_plane =
            tokio::task::block_in_place(|| ControlPlane::start(config)).context("control plane")?;
        let client = bench_client(&control_plane).await?;
        Ok(Self {
            control_plane,
            client,
            audit_log,
            scratch,
            clock_ticks: measure::clock_ticks(),
        })
    }

    /// CPU seconds kube-apiserver and etcd have used so far.
    fn cpu_seconds(&self) -> anyhow::Result<f64> {
        [Component::KubeApiServer, Component::Etcd]
            .into_iter()
            .map(|component| {
                self.control_plane
                    .pid(component)
                    .and_then(|pid| measure::sample(pid, self.clock_ticks))
                    .map(|s| s.cpu_seconds)
                    .with_context(|| format!("reading the CPU time of {component:?}"))
            })
            .sum()
    }

    /// Counts the audit log's requests by phase; `BENCH_KEEP` keeps the directory.
    async fn finish(self, phases: &[Phase]) -> anyhow::Result<RequestCounts> {
        // The audit backend writes synchronously; give the last lines a moment anyway.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let counts = measure::count_requests(&self.audit_log, phases)?;
        if std::env::var_os("BENCH_KEEP").is_some() {
            eprintln!("    kept {}", self.scratch.keep().display());
        }
        drop(self.control_plane);
        Ok(counts)
    }
}

/// What one baseline run measured.
struct BaselineRun {
    timings: Baseline,
    /// The `baseline` phase's requests.
    requests: RequestCounts,
    control_plane_cpu_ready: f64,
}

async fn run_baseline(args: &Args, n: usize) -> anyhow::Result<BaselineRun> {
    eprintln!("    baseline");
    let plane = Plane::start(args).await?;
    let t_start = Timestamp::now();
    workload::namespace(&plane.client, "baseline").await?;
    let cpu_before = plane.cpu_seconds()?;
    let ready = baseline::run(&plane.client, "baseline", n, args.concurrency, Flow::Create).await?;
    let control_plane_cpu_ready = plane.cpu_seconds()? - cpu_before;
    let gone = baseline::run(&plane.client, "baseline", n, args.concurrency, Flow::Delete).await?;
    let phases = [Phase {
        name: "baseline",
        start: t_start,
        end: Timestamp::now(),
    }];
    Ok(BaselineRun {
        timings: Baseline { ready, gone },
        requests: plane.finish(&phases).await?,
        control_plane_cpu_ready,
    })
}

/// What one operator run measured.
struct OperatorRun {
    ready: Curve,
    gone: Curve,
    requests: RequestCounts,
    counted_writes: Option<f64>,
    creates_in_flight_peak: Option<f64>,
    client_settings: Option<String>,
    proc_ready: ProcSample,
    proc_idle: ProcSample,
    proc_end: ProcSample,
    control_plane_cpu_ready: f64,
}

/// The operator's run; with `idle` the idle window between all Ready and the deletes.
async fn run_operator(args: &Args, n: usize, idle: bool) -> anyhow::Result<OperatorRun> {
    eprintln!("    operator");
    let plane = Plane::start(args).await?;
    let client = &plane.client;
    let idle = if idle { args.idle } else { Duration::ZERO };
    let t_startup = Timestamp::now();
    workload::namespace(client, "bench").await?;
    let log = plane.scratch.path().join("operator.log");
    let mut operator = Operator::spawn(
        &args.operator,
        plane.control_plane.kubeconfig_path(),
        &log,
        &args.operator_args,
    )?;
    let ticks = plane.clock_ticks;
    let outcome = async {
        operator.wait_ready(Duration::from_secs(60)).await?;
        workload::fixtures(client, "bench", &args.latency, Duration::from_secs(60)).await?;
        let tracker = Tracker::start(client.clone(), "bench").await?;

        eprintln!("    create");
        let t_create = Timestamp::now();
        let cpu_before = plane.cpu_seconds()?;
        let started = Instant::now();
        let creates = tokio::spawn(workload::create_all(
            client.clone(),
            "bench".into(),
            n,
            args.concurrency,
        ));
        let ready_count =
            |vms: &[std::sync::Arc<_>]| vms.iter().filter(|vm| workload::is_ready(vm)).count();
        let ready = tracker
            .follow(started, args.timeout, ready_count, |v| v >= n)
            .await
            .with_context(|| {
                format!(
                    "waiting for Ready; e.g. not Ready: {:?}",
                    tracker.not_ready(5)
                )
            })?;
        let control_plane_cpu_ready = plane.cpu_seconds()? - cpu_before;
        creates.await??;
        let proc_ready = measure::sample(operator.pid(), ticks).unwrap_or_default();

        eprintln!("    idle {idle:?}");
        let t_idle = Timestamp::now();
        tokio::time::sleep(idle).await;
        let t_idle_end = Timestamp::now();
        let proc_idle = measure::sample(operator.pid(), ticks).unwrap_or_default();

        eprintln!("    delete");
        let t_delete = Timestamp::now();
        let started = Instant::now();
        let deletes = tokio::spawn(workload::delete_all(
            client.clone(),
            "bench".into(),
            n,
            args.concurrency,
        ));
        let gone = tracker
            .follow(started, args.timeout, <[_]>::len, |v| v == 0)
            .await
            .context("waiting for all to be gone")?;
        deletes.await??;
        let run = OperatorRun {
            ready,
            gone,
            requests: RequestCounts::default(),
            counted_writes: operator.writes_total().await,
            creates_in_flight_peak: operator.creates_in_flight_peak().await,
            client_settings: operator.client_settings(),
            proc_ready,
            proc_idle,
            proc_end: measure::sample(operator.pid(), ticks).unwrap_or_default(),
            control_plane_cpu_ready,
        };
        anyhow::Ok((run, [t_create, t_idle, t_idle_end, t_delete]))
    }
    .await;
    operator.stop(Duration::from_secs(10));
    let t_end = Timestamp::now();
    let (mut run, [t_create, t_idle, t_idle_end, t_delete]) = match outcome {
        Ok(outcome) => outcome,
        Err(e) => {
            let kept = plane.scratch.keep();
            return Err(e.context(format!(
                "operator log and audit log kept in {}",
                kept.display()
            )));
        }
    };
    let phase = |name, start, end| Phase { name, start, end };
    run.requests = plane
        .finish(&[
            phase("startup", t_startup, t_create),
            phase("create", t_create, t_idle),
            phase("idle", t_idle, t_idle_end),
            phase("between", t_idle_end, t_delete),
            phase("delete", t_delete, t_end),
        ])
        .await?;
    Ok(run)
}

/// `<cores> cores, <memory> GiB, <kernel>`.
fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let mem_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))?
                .split_whitespace()
                .nth(1)?
                .parse::<f64>()
                .ok()
        })
        .map_or(0.0, |kib| kib / 1024.0 / 1024.0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cores} cores, {mem_gib:.0} GiB, Linux {}", kernel.trim())
}

/// The testbin directory's name (`k8s-<version>_etcd-<version>_<go>`), from
/// `KUBEBUILDER_ASSETS`.
fn control_plane_version() -> String {
    std::env::var_os("KUBEBUILDER_ASSETS")
        .map(PathBuf::from)
        .as_deref()
        .and_then(Path::file_name)
        .map_or(
            "kube-apiserver and etcd from KUBEBUILDER_ASSETS".to_owned(),
            |n| n.to_string_lossy().replace('_', ", "),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("300"), Ok(Duration::from_secs(300)));
        assert!(parse_duration("5x").is_err());
    }
}
