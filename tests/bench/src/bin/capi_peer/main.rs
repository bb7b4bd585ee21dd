//! `make bench-capi-peer`: the same Cluster API workload against banlieue and against
//! Cluster API's own in-memory infrastructure provider (CAPD's `DevMachine` with the
//! `inMemory` backend, the provider CAPI uses for its scale tests).
//!
//! For each N and repeat, one run per side, order alternating between repeats; each run
//! is a child process of this one (`--one-run`) with a fresh control plane (etcd +
//! kube-apiserver with an audit log), the real CAPI core manager (same build and flags
//! for both, `tests/testbin/capi`), and the provider under test. The workload is one
//! Cluster and MachineDeployments of at most `--per-md` replicas totalling N Machines,
//! whose bootstrap data Secret exists already; provider delays are zero on both sides.
//! Measured per run: time from the first apply to every Machine's infrastructure
//! provisioned, the provider process's CPU seconds over that time and its peak RSS, and
//! its API requests per Machine (the audit log, by `User-Agent`).
//!
//! Results go to `docs/benchmarks/data/<date>/capi-peer-n<N>.json` and the report to
//! `docs/benchmarks/capi-peer-<date>.md`, regenerated from every result of that date.

mod report;
mod run;
mod workload;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::{Parser, ValueEnum};
use serde::{Deserialize, Serialize};

use crate::run::RunResult;

/// Which provider a run measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    /// banlieue (`banlieue run`, release build), `sim` Provider, VSphereMachines.
    Banlieue,
    /// CAPD's in-memory backend (DevMachines).
    Peer,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Self::Banlieue => "banlieue",
            Self::Peer => "peer",
        }
    }
}

/// The same CAPI workload against banlieue and Cluster API's in-memory provider.
#[derive(Parser, Debug)]
#[command(name = "capi-peer-bench", version)]
struct Args {
    /// Machines per run, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "100,1000")]
    sizes: Vec<usize>,
    /// Runs per side and size (the order of the sides alternates).
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    #[command(flatten)]
    run: RunArgs,
    /// Where results and the report go.
    #[arg(long, default_value = "docs/benchmarks")]
    out: PathBuf,
    /// Only regenerate the report from the saved results of the day.
    #[arg(long)]
    report_only: bool,
    /// Run one side at `--n` in this process and write its result as JSON to this path.
    #[arg(long, hide = true)]
    one_run: Option<PathBuf>,
}

/// What one run needs.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// The side of a `--one-run`.
    #[arg(long, value_enum, default_value = "banlieue")]
    side: Side,
    /// The size of a `--one-run`.
    #[arg(long, default_value_t = 100)]
    n: usize,
    /// The operator binary (`cargo build --release -p banlieue`).
    #[arg(long, default_value = "target/release/banlieue")]
    operator: PathBuf,
    /// The peer's directory; by default what `tests/testbin/capi-peer/build.sh` prints
    /// (it builds the peer on first use).
    #[arg(long, env = "BANLIEUE_CAPI_PEER_DIR")]
    peer_dir: Option<PathBuf>,
    /// Replicas per MachineDeployment.
    #[arg(long, default_value_t = 100)]
    per_md: usize,
    /// Bound on a run's wait for every Machine.
    #[arg(long, default_value = "30m", value_parser = parse_duration)]
    timeout: Duration,
    /// Where the providers' logs go.
    #[arg(long, default_value = "target/capi-peer-bench")]
    log_dir: PathBuf,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    banlieue_sdk::duration::parse(s).map_err(|e| e.to_string())
}

fn main() -> anyhow::Result<()> {
    let mut args = Args::parse();
    std::fs::create_dir_all(&args.run.log_dir)?;
    if let Some(out) = &args.one_run {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        let result = runtime.block_on(run::run(&args.run))?;
        std::fs::write(out, serde_json::to_vec_pretty(&result)?)?;
        // The control plane and CAPI were leaked on purpose: exiting ends them.
        std::process::exit(0);
    }
    let date = k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%d")
        .to_string();
    if !args.report_only && args.run.peer_dir.is_none() {
        args.run.peer_dir = Some(build_peer()?);
    }
    let data = args.out.join("data").join(&date);
    std::fs::create_dir_all(&data)?;
    if !args.report_only {
        for &n in &args.sizes {
            let mut results: Vec<RunResult> = Vec::new();
            for repeat in 0..args.repeat {
                let order = if repeat % 2 == 0 {
                    [Side::Banlieue, Side::Peer]
                } else {
                    [Side::Peer, Side::Banlieue]
                };
                for side in order {
                    eprintln!(
                        "capi-peer-bench: n={n} repeat {} {}",
                        repeat + 1,
                        side.name()
                    );
                    results.push(one_run(&args.run, side, n)?);
                }
            }
            let path = data.join(format!("capi-peer-n{n}.json"));
            std::fs::write(&path, serde_json::to_vec_pretty(&results)?)?;
            eprintln!("capi-peer-bench: wrote {}", path.display());
        }
    }
    let report = report::render(&data, &date)?;
    let path = args.out.join(format!("capi-peer-{date}.md"));
    std::fs::write(&path, report)?;
    eprintln!("capi-peer-bench: report {}", path.display());
    Ok(())
}

impl RunArgs {
    /// The peer's directory (set before any run).
    fn peer_dir(&self) -> anyhow::Result<&std::path::Path> {
        self.peer_dir
            .as_deref()
            .context("no --peer-dir (tests/testbin/capi-peer/build.sh prints it)")
    }
}

/// Builds the peer (or finds it built) with `tests/testbin/capi-peer/build.sh`.
fn build_peer() -> anyhow::Result<PathBuf> {
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../testbin/capi-peer/build.sh");
    let out = Command::new(&script)
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!("{} failed ({})", script.display(), out.status);
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// Runs one side in a child process of this binary and reads its result.
fn one_run(run: &RunArgs, side: Side, n: usize) -> anyhow::Result<RunResult> {
    let out = tempfile::NamedTempFile::new()?;
    let status = Command::new(std::env::current_exe()?)
        .arg(format!("--one-run={}", out.path().display()))
        .arg(format!("--side={}", side.name()))
        .arg(format!("--n={n}"))
        .arg(format!("--operator={}", run.operator.display()))
        .arg(format!("--peer-dir={}", run.peer_dir()?.display()))
        .arg(format!("--per-md={}", run.per_md))
        .arg(format!("--timeout={}s", run.timeout.as_secs()))
        .arg(format!("--log-dir={}", run.log_dir.display()))
        // The in-memory provider's workload-cluster listeners: loopback only.
        .env("POD_IP", "127.0.0.1")
        .status()
        .context("starting a run")?;
    if !status.success() {
        bail!("the {} run at n={n} failed ({status})", side.name());
    }
    let text = std::fs::read(out.path())?;
    Ok(serde_json::from_slice(&text)?)
}
