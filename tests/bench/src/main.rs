//! `make bench`: banlieue's scale benchmark.
//!
//! For each N, on a fresh local control plane (etcd + kube-apiserver with an audit log):
//!
//! 1. **baseline**: a plain client performs only the minimal writes for N
//!    VirtualMachines ([`baseline::MINIMUM`]), with no operator running;
//! 2. the operator (`banlieue run`, release build) starts as a child process; a `sim`
//!    Provider, VMClass and VMImage are created;
//! 3. N VirtualMachines are created at once and followed until all are Ready;
//! 4. nothing happens for the idle window (writes there should be zero);
//! 5. all are deleted at once and followed until gone.
//!
//! Results are saved as `docs/benchmarks/data/<date>/n<N>.json`, and the report
//! `docs/benchmarks/scale-<date>.md` (with SVG charts) is regenerated from every result of
//! that date, so sizes run separately share one report. `scale.md` points to it. A
//! hand-written `data/<date>/notes.md`, if present, is appended to the report.

mod baseline;
mod measure;
mod operator;
mod report;
mod svg;
mod workload;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use banlieue_testenv::{ControlPlane, ControlPlaneConfig};
use clap::Parser;
use http::{HeaderName, HeaderValue};
use k8s_openapi::jiff::Timestamp;
use kube::Client;

use crate::measure::{BENCH_USER_AGENT, Phase};
use crate::operator::Operator;
use crate::report::SizeResult;
use crate::workload::Tracker;

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

    /// Extra flag for `banlieue run` (repeatable), e.g. `--operator-arg=--kube-api-qps=500`.
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

    /// Audit level: `Metadata`, or `Request` to see each write's body when studying
    /// where writes come from (the counts are the same).
    #[arg(long, default_value = "Metadata")]
    audit_level: String,
}

/// Parses `300`, `300s`, `5m`, `1h` or `1500ms`.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let invalid = || format!("{text:?} is not a duration like 60s, 5m or 300");
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().map_err(|_| invalid())?;
    Ok(match unit {
        "" | "s" => Duration::from_secs(number),
        "ms" => Duration::from_millis(number),
        "m" => Duration::from_secs(number * 60),
        "h" => Duration::from_secs(number * 3600),
        _ => return Err(invalid()),
    })
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
                "    all Ready {:.1}s (baseline {:.1}s{}), all gone {:.1}s (baseline {:.1}s{}), \
                 writes/VM {:.2}, idle writes/min {:.1}, peak RSS {:.1} MiB, CPU {:.1}s",
                result.ready.seconds,
                result.baseline_ready(),
                result.baseline_runs(|b| b.ready.seconds),
                result.gone.seconds,
                result.baseline_gone(),
                result.baseline_runs(|b| b.gone.seconds),
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
    let results = report::load(&data)?;
    let notes = std::fs::read_to_string(data.join("notes.md")).ok();
    let header = report::Header {
        date: &date,
        machine: &machine(),
        control_plane: &control_plane_version(),
        notes,
    };
    report::write(&args.out, &header, &results)?;
    eprintln!(
        "==> {}",
        args.out.join(format!("scale-{date}.md")).display()
    );
    Ok(())
}

/// One size, on its own control plane.
async fn run_size(args: &Args, n: usize) -> anyhow::Result<SizeResult> {
    let scratch = tempfile::Builder::new()
        .prefix("banlieue-bench-")
        .tempdir()?;
    let policy = scratch.path().join("audit-policy.yaml");
    let audit_log = scratch.path().join("audit.log");
    std::fs::write(&policy, measure::audit_policy(&args.audit_level))?;
    let mut config = ControlPlaneConfig::from_env().crds(banlieue_sdk::crds::all());
    for flag in measure::audit_flags(&policy, &audit_log)
        .into_iter()
        .chain(args.apiserver_args.iter().cloned())
    {
        config = config.apiserver_arg(flag);
    }
    let control_plane =
        tokio::task::block_in_place(|| ControlPlane::start(config)).context("control plane")?;
    let client = bench_client(&control_plane).await?;
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

    eprintln!("    baseline");
    let t_baseline = Timestamp::now();
    workload::namespace(&client, "baseline").await?;
    result.baseline = baseline::run(&client, "baseline", n, args.concurrency).await?;

    eprintln!("    operator");
    let t_startup = Timestamp::now();
    workload::namespace(&client, "bench").await?;
    let log = scratch.path().join("operator.log");
    let mut operator = Operator::spawn(
        &args.operator,
        control_plane.kubeconfig_path(),
        &log,
        &args.operator_args,
    )?;
    let ticks = measure::clock_ticks();
    let outcome = async {
        operator.wait_ready(Duration::from_secs(60)).await?;
        workload::fixtures(&client, "bench", &args.latency, Duration::from_secs(60)).await?;
        let tracker = Tracker::start(client.clone(), "bench").await?;

        eprintln!("    create");
        let t_create = Timestamp::now();
        let started = Instant::now();
        let creates = tokio::spawn(workload::create_all(
            client.clone(),
            "bench".into(),
            n,
            args.concurrency,
        ));
        let ready_count =
            |vms: &[std::sync::Arc<_>]| vms.iter().filter(|vm| workload::is_ready(vm)).count();
        result.ready = tracker
            .follow(started, args.timeout, ready_count, |v| v >= n)
            .await
            .with_context(|| {
                format!(
                    "waiting for Ready; e.g. not Ready: {:?}",
                    tracker.not_ready(5)
                )
            })?;
        creates.await??;
        result.proc_ready = measure::sample(operator.pid(), ticks).unwrap_or_default();

        eprintln!("    idle {:?}", args.idle);
        let t_idle = Timestamp::now();
        tokio::time::sleep(args.idle).await;
        let t_idle_end = Timestamp::now();
        result.proc_idle = measure::sample(operator.pid(), ticks).unwrap_or_default();

        eprintln!("    delete");
        let t_delete = Timestamp::now();
        let started = Instant::now();
        let deletes = tokio::spawn(workload::delete_all(
            client.clone(),
            "bench".into(),
            n,
            args.concurrency,
        ));
        result.gone = tracker
            .follow(started, args.timeout, <[_]>::len, |v| v == 0)
            .await
            .context("waiting for all to be gone")?;
        deletes.await??;
        result.operator_counted_writes = operator.writes_total().await;
        result.proc_end = measure::sample(operator.pid(), ticks).unwrap_or_default();
        anyhow::Ok([t_create, t_idle, t_idle_end, t_delete])
    }
    .await;
    operator.stop(Duration::from_secs(10));
    let t_end = Timestamp::now();
    let [t_create, t_idle, t_idle_end, t_delete] = match outcome {
        Ok(marks) => marks,
        Err(e) => {
            let kept = scratch.keep();
            return Err(e.context(format!(
                "operator log and audit log kept in {}",
                kept.display()
            )));
        }
    };
    // The audit backend writes synchronously; give the last lines a moment anyway.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let phases = [
        Phase {
            name: "baseline",
            start: t_baseline,
            end: t_startup,
        },
        Phase {
            name: "startup",
            start: t_startup,
            end: t_create,
        },
        Phase {
            name: "create",
            start: t_create,
            end: t_idle,
        },
        Phase {
            name: "idle",
            start: t_idle,
            end: t_idle_end,
        },
        Phase {
            name: "between",
            start: t_idle_end,
            end: t_delete,
        },
        Phase {
            name: "delete",
            start: t_delete,
            end: t_end,
        },
    ];
    result.requests = measure::count_requests(&audit_log, &phases)?;

    // The floor again, the operator stopped: the same baseline costs more CPU later in a
    // run, and runs on either side of the operator's let the report use their mean.
    eprintln!("    baseline again");
    workload::namespace(&client, "baseline-after").await?;
    result.baseline_after =
        Some(baseline::run(&client, "baseline-after", n, args.concurrency).await?);
    if std::env::var_os("BENCH_KEEP").is_some() {
        eprintln!("    kept {}", scratch.keep().display());
    }
    drop(control_plane);
    Ok(result)
}

/// An admin client whose requests carry the `User-Agent` [`BENCH_USER_AGENT`].
async fn bench_client(control_plane: &ControlPlane) -> anyhow::Result<Client> {
    // Building one harness client installs rustls's crypto provider for the process.
    drop(control_plane.client().await);
    let mut config = control_plane.kube_config();
    config.headers.push((
        HeaderName::from_static("user-agent"),
        HeaderValue::from_static(BENCH_USER_AGENT),
    ));
    Ok(Client::try_from(config)?)
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
