//! Results of one size (saved as JSON, so that sizes run separately end up in one report)
//! and the Markdown report with its SVG charts.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use crate::baseline::{self, Baseline};
use crate::measure::{ProcSample, RequestCounts, is_write};
use crate::svg::{self, Series};
use crate::workload::Curve;

/// Everything measured for one N.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SizeResult {
    /// Number of VirtualMachines.
    pub n: usize,
    /// When the run started (RFC 3339, UTC).
    pub started_at: String,
    /// The sim Provider's `latency`.
    pub latency: String,
    /// Requests in flight from the benchmark's client (creates, deletes, baseline chains).
    pub concurrency: usize,
    /// Flags passed to `banlieue run` beyond kubeconfig, probe and metrics addresses.
    pub operator_args: Vec<String>,
    /// Flags passed to kube-apiserver beyond the harness's and the audit log's.
    pub apiserver_args: Vec<String>,
    /// Ready VirtualMachines over time, from the start of the creates.
    pub ready: Curve,
    /// VirtualMachines remaining over time, from the start of the deletes.
    pub gone: Curve,
    /// Length of the idle window after convergence, seconds.
    pub idle_seconds: f64,
    /// The minimal-writes client's timings, before the operator starts.
    pub baseline: Baseline,
    /// The same baseline again once the operator has stopped: the same work costs more later
    /// in a run, so the floor is the mean of the runs on either side of the operator's.
    #[serde(default)]
    pub baseline_after: Option<Baseline>,
    /// API requests by phase, actor, verb and resource (audit log).
    pub requests: RequestCounts,
    /// The operator's own `banlieue_api_writes_total` at the end.
    pub operator_counted_writes: Option<f64>,
    /// The operator process when all were Ready, after the idle window, and at the end.
    pub proc_ready: ProcSample,
    /// See [`proc_ready`](Self::proc_ready).
    pub proc_idle: ProcSample,
    /// See [`proc_ready`](Self::proc_ready).
    pub proc_end: ProcSample,
}

impl SizeResult {
    /// The baseline's time to all-Ready: the mean of the runs before and after the
    /// operator's, or the one before when there is no run after (older results).
    pub fn baseline_ready(&self) -> f64 {
        self.baseline_mean(|b| b.ready.seconds)
    }

    /// The baseline's time to all-gone, as [`baseline_ready`](Self::baseline_ready).
    pub fn baseline_gone(&self) -> f64 {
        self.baseline_mean(|b| b.gone.seconds)
    }

    fn baseline_mean(&self, of: impl Fn(&Baseline) -> f64) -> f64 {
        match &self.baseline_after {
            Some(after) => (of(&self.baseline) + of(after)) / 2.0,
            None => of(&self.baseline),
        }
    }

    /// ` (before 161.2 s, after 170.0 s)` when the baseline ran twice; empty otherwise.
    pub fn baseline_runs(&self, of: impl Fn(&Baseline) -> f64) -> String {
        self.baseline_after.as_ref().map_or(String::new(), |after| {
            format!(
                " (before {:.1} s, after {:.1} s)",
                of(&self.baseline),
                of(after)
            )
        })
    }

    /// Operator writes in `phase`, per VirtualMachine.
    pub fn writes_per_vm(&self, phase: &str) -> f64 {
        self.requests.writes(phase, "operator") as f64 / self.n as f64
    }

    /// Operator writes per minute during the idle window.
    pub fn idle_writes_per_minute(&self) -> f64 {
        let writes = self.requests.writes("idle", "operator") as f64;
        if self.idle_seconds > 0.0 {
            writes / (self.idle_seconds / 60.0)
        } else {
            0.0
        }
    }
}

/// Loads every `n*.json` result in `dir`, ordered by N.
pub fn load(dir: &Path) -> anyhow::Result<Vec<SizeResult>> {
    let mut results = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "json") {
            let text = std::fs::read_to_string(&path)?;
            results.push(
                serde_json::from_str::<SizeResult>(&text)
                    .with_context(|| format!("parsing {}", path.display()))?,
            );
        }
    }
    results.sort_by_key(|r| r.n);
    Ok(results)
}

/// Context for the report's header.
pub struct Header<'a> {
    /// Report date (`YYYY-MM-DD`), part of the file names.
    pub date: &'a str,
    /// A line describing the machine.
    pub machine: &'a str,
    /// The kube-apiserver/etcd build (the testbin directory name).
    pub control_plane: &'a str,
    /// Hand-written analysis appended to the report, if any.
    pub notes: Option<String>,
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.1}×", a / b)
    } else {
        "–".to_owned()
    }
}

/// Writes `scale-<date>.md`, one `scale-<date>-n<N>.svg` per size, and `scale.md`
/// (pointing to it) into `out`.
pub fn write(out: &Path, header: &Header<'_>, results: &[SizeResult]) -> anyhow::Result<()> {
    let date = header.date;
    let mut md = String::new();
    let _ = writeln!(md, "# Scale benchmark, {date}\n");
    let _ = writeln!(
        md,
        "Generated by `make bench` (`tests/bench`, binary `banlieue-bench`). The operator is \
         built with `cargo build --release -p banlieue` and runs as a child process \
         (`banlieue run`) against a fresh local control plane per size ({}). Machine: {}.\n",
        header.control_plane, header.machine
    );
    let _ = writeln!(md, "## Summary\n");
    let _ = writeln!(
        md,
        "| N | all Ready | all gone | baseline Ready | baseline gone | Ready / baseline | gone / baseline | operator writes per VM (min {}) | idle writes/min | peak RSS | CPU |",
        baseline::operator_minimum("create") + baseline::operator_minimum("delete")
    );
    let _ = writeln!(
        md,
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for r in results {
        let writes = r.writes_per_vm("create") + r.writes_per_vm("delete");
        let _ = writeln!(
            md,
            "| {} | {:.1} s | {:.1} s | {:.1} s | {:.1} s | {} | {} | {:.2} | {:.1} | {:.1} MiB | {:.1} s |",
            r.n,
            r.ready.seconds,
            r.gone.seconds,
            r.baseline_ready(),
            r.baseline_gone(),
            ratio(r.ready.seconds, r.baseline_ready()),
            ratio(r.gone.seconds, r.baseline_gone()),
            writes,
            r.idle_writes_per_minute(),
            r.proc_end.peak_rss_mib,
            r.proc_end.cpu_seconds,
        );
    }
    let _ = writeln!(md);
    write_targets(&mut md, results);
    write_setup(&mut md, results);
    write_minimum(&mut md);
    for r in results {
        write_size(&mut md, out, date, r)?;
    }
    if let Some(notes) = &header.notes {
        let _ = writeln!(md, "{notes}");
    }
    let name = format!("scale-{date}.md");
    std::fs::write(out.join(&name), &md)?;
    let pointer = format!(
        "# Scale benchmark\n\nThe latest report is [{name}]({name}); `make bench` writes a new \
         one (`make bench N=1000` for one size) and updates this pointer.\n\n\
         ![Ready VirtualMachines over time](scale-{date}-n{}.svg)\n",
        results.last().map_or(0, |r| r.n)
    );
    std::fs::write(out.join("scale.md"), pointer)?;
    Ok(())
}

fn write_targets(md: &mut String, results: &[SizeResult]) {
    let _ = writeln!(md, "## Targets (at N = 10,000)\n");
    let Some(r) = results.iter().find(|r| r.n == 10_000).or(results.last()) else {
        return;
    };
    if r.n != 10_000 {
        let _ = writeln!(
            md,
            "N = 10,000 was not measured in this report; the largest size, N = {}, stands in.\n",
            r.n
        );
    }
    let minimum =
        (baseline::operator_minimum("create") + baseline::operator_minimum("delete")) as f64;
    let writes = r.writes_per_vm("create") + r.writes_per_vm("delete");
    let verdict = |ok: bool| if ok { "met" } else { "**not met**" };
    let rss_ok = r.proc_end.peak_rss_mib < 150.0;
    let time = r.ready.seconds / r.baseline_ready().max(f64::MIN_POSITIVE);
    let _ = writeln!(md, "| target | measured (N = {}) | |", r.n);
    let _ = writeln!(md, "|---|---|---|");
    let _ = writeln!(
        md,
        "| operator peak RSS < 150 MiB | {:.1} MiB{} | {} |",
        r.proc_end.peak_rss_mib,
        projected_rss(results).map_or(String::new(), |p| format!(
            " (linear projection to N = 10,000: {p:.0} MiB)"
        )),
        verdict(rss_ok && projected_rss(results).is_none_or(|p| p < 150.0))
    );
    let _ = writeln!(
        md,
        "| all Ready within 1.5× the baseline | {time:.2}× ({:.1} s vs {:.1} s{}) | {} |",
        r.ready.seconds,
        r.baseline_ready(),
        r.baseline_runs(|b| b.ready.seconds),
        verdict(time <= 1.5)
    );
    let _ = writeln!(
        md,
        "| writes ≤ minimum + 1 per VM ({}) | {writes:.2} per VM | {} |",
        minimum + 1.0,
        verdict(writes <= minimum + 1.0)
    );
    let _ = writeln!(
        md,
        "| no writes once converged | {:.1} per minute | {} |\n",
        r.idle_writes_per_minute(),
        verdict(r.idle_writes_per_minute() == 0.0)
    );
}

fn write_setup(md: &mut String, results: &[SizeResult]) {
    let Some(r) = results.first() else { return };
    let _ = writeln!(md, "## Setup\n");
    let _ = writeln!(
        md,
        "- Workload: one `sim` Provider (`latency: {}`), one VMClass, one VMImage; N \
         VirtualMachines created at once ({} requests in flight) in one namespace, followed by \
         a watch sampled every 100 ms; after all are Ready an idle window of {:.0} s; then all \
         deleted at once and followed until gone.",
        r.latency, r.concurrency, r.idle_seconds
    );
    let _ = writeln!(
        md,
        "- Operator flags: `{}` (everything else at its defaults, e.g. `--sync-period=10m`, \
         16 VirtualMachine and 16 machine workers).",
        if r.operator_args.is_empty() {
            "(none)".to_owned()
        } else {
            r.operator_args.join(" ")
        }
    );
    let _ = writeln!(
        md,
        "- kube-apiserver: the harness's flags plus the audit log (`--audit-policy-file`, \
         `--audit-log-path`, `--audit-log-format=json`, level `Metadata`, every request){}.",
        if r.apiserver_args.is_empty() {
            String::new()
        } else {
            format!(" and `{}`", r.apiserver_args.join(" "))
        }
    );
    let _ = writeln!(
        md,
        "- Requests are counted from the audit log, attributed by `User-Agent` (the \
         benchmark's client sends `banlieue-bench`; the apiserver's own loopback requests are \
         ignored). Phases: `startup` (operator start to first create), `create` (first create \
         to all Ready), `idle`, `delete` (first delete to all gone). Watches are counted when \
         they start."
    );
    let _ = writeln!(
        md,
        "- Peak RSS is `VmHWM` and CPU is `utime + stime` of the operator process, read from \
         `/proc` just before it is stopped (so they cover startup, create, idle and delete)."
    );
    let _ = writeln!(
        md,
        "- Baseline: before the operator starts, a plain kube client (no rate limit) performs \
         exactly the minimal writes below for N VirtualMachines in another namespace of the \
         same apiserver, one dependent chain per VM, {} chains at once. Its times are the \
         floor the operator's are compared with.{}\n",
        r.concurrency,
        if r.baseline_after.is_some() {
            " It runs again, in a third namespace, once the operator has stopped, and the floor \
             is the mean of the two: the same baseline costs more CPU later in a run (29 % more \
             ten minutes later at N = 10,000 on 2026-11-30), so a floor measured only before \
             the operator, which runs second, favours the baseline; the mean of runs on either \
             side of the operator's cancels a steady drift."
        } else {
            ""
        }
    );
}

fn write_minimum(md: &mut String) {
    let _ = writeln!(md, "## The minimal flow\n");
    let _ = writeln!(
        md,
        "What one VirtualMachine cannot do without (events and reads excluded; reads are \
         served from watches, whose cost does not grow per VM). With no \
         kube-controller-manager there is no garbage collector, so the operator deletes the \
         infra machine itself — as it must anyway, to remove the backend VM first.\n"
    );
    let _ = writeln!(md, "| phase | by | request | why |");
    let _ = writeln!(md, "|---|---|---|---|");
    for w in baseline::MINIMUM {
        let _ = writeln!(
            md,
            "| {} | {} | `{}` | {} |",
            w.phase, w.actor, w.key, w.why
        );
    }
    let _ = writeln!(
        md,
        "\nOperator minimum: {} writes per VM to create, {} to delete.\n",
        baseline::operator_minimum("create"),
        baseline::operator_minimum("delete")
    );
}

fn write_size(md: &mut String, out: &Path, date: &str, r: &SizeResult) -> anyhow::Result<()> {
    let n = r.n;
    let _ = writeln!(md, "## N = {n}\n");
    let chart = format!("scale-{date}-n{n}.svg");
    let series = [
        Series {
            label: "banlieue: Ready".into(),
            color: "#1f77b4",
            dashed: false,
            points: r.ready.points.clone(),
        },
        Series {
            label: "baseline: Ready".into(),
            color: "#1f77b4",
            dashed: true,
            points: r.baseline.ready.points.clone(),
        },
        Series {
            label: "banlieue: remaining while deleting".into(),
            color: "#d62728",
            dashed: false,
            points: r.gone.points.clone(),
        },
        Series {
            label: "baseline: remaining while deleting".into(),
            color: "#d62728",
            dashed: true,
            points: remaining(&r.baseline.gone, n),
        },
    ];
    let svg = svg::line_chart(
        &format!("{n} VirtualMachines (sim, latency {})", r.latency),
        "seconds since the first create / delete",
        "VirtualMachines",
        &series,
    );
    std::fs::write(out.join(&chart), svg)?;
    let _ = writeln!(md, "![Ready VirtualMachines over time, N = {n}]({chart})\n");
    let _ = writeln!(
        md,
        "All Ready after {:.1} s (baseline {:.1} s{}), all gone {:.1} s after the deletes began \
         (baseline {:.1} s{}). Operator at the end: peak RSS {:.1} MiB (RSS {:.1} MiB when all \
         were Ready), {:.1} CPU seconds ({:.1} by the time all were Ready). The operator's own \
         write counter: {}.\n",
        r.ready.seconds,
        r.baseline_ready(),
        r.baseline_runs(|b| b.ready.seconds),
        r.gone.seconds,
        r.baseline_gone(),
        r.baseline_runs(|b| b.gone.seconds),
        r.proc_end.peak_rss_mib,
        r.proc_ready.rss_mib,
        r.proc_end.cpu_seconds,
        r.proc_ready.cpu_seconds,
        r.operator_counted_writes
            .map_or("unavailable".to_owned(), |w| format!("{w:.0}"))
    );
    let phases = ["startup", "create", "idle", "delete"];
    let keys: BTreeSet<String> = phases
        .iter()
        .flat_map(|p| r.requests.of(p, "operator").into_keys())
        .collect();
    let _ = writeln!(
        md,
        "Operator requests (audit log). `startup` and `idle` are totals; `create` and `delete` \
         are per VM, next to the minimum per VM.\n"
    );
    let _ = writeln!(
        md,
        "| request | startup | create / VM | min | idle | delete / VM | min |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|---:|");
    let minimum = |phase: &str, key: &str| {
        baseline::MINIMUM
            .iter()
            .filter(|w| w.phase == phase && w.actor == "operator" && w.key == key)
            .count()
    };
    let mut totals = [0.0; 4];
    for key in &keys {
        let count = |phase: &str| {
            r.requests
                .of(phase, "operator")
                .get(key)
                .copied()
                .unwrap_or(0)
        };
        let per_vm = |phase: &str| count(phase) as f64 / n as f64;
        let _ = writeln!(
            md,
            "| `{key}`{} | {} | {:.2} | {} | {} | {:.2} | {} |",
            if is_write(key) { " (write)" } else { "" },
            count("startup"),
            per_vm("create"),
            minimum("create", key),
            count("idle"),
            per_vm("delete"),
            minimum("delete", key),
        );
        totals[0] += count("startup") as f64;
        totals[1] += per_vm("create");
        totals[2] += count("idle") as f64;
        totals[3] += per_vm("delete");
    }
    let _ = writeln!(
        md,
        "| **all requests** | {:.0} | {:.2} | | {:.0} | {:.2} | |",
        totals[0], totals[1], totals[2], totals[3]
    );
    let _ = writeln!(
        md,
        "| **writes** | {} | {:.2} | {} | {} | {:.2} | {} |\n",
        r.requests.writes("startup", "operator"),
        r.writes_per_vm("create"),
        baseline::operator_minimum("create"),
        r.requests.writes("idle", "operator"),
        r.writes_per_vm("delete"),
        baseline::operator_minimum("delete"),
    );
    let bench_baseline = r.requests.writes("baseline", "bench") as f64 / n as f64;
    let _ = writeln!(
        md,
        "Baseline client: {bench_baseline:.2} writes per VM (audit log; {} expected).\n",
        baseline::MINIMUM.len()
    );
    Ok(())
}

/// Peak RSS at N = 10,000 extrapolated linearly from the smallest and largest sizes
/// measured, when 10,000 itself was not.
fn projected_rss(results: &[SizeResult]) -> Option<f64> {
    let (first, last) = (results.first()?, results.last()?);
    if last.n == 10_000 || last.n <= first.n {
        return None;
    }
    let per_vm =
        (last.proc_end.peak_rss_mib - first.proc_end.peak_rss_mib) / (last.n - first.n) as f64;
    Some(last.proc_end.peak_rss_mib + per_vm * (10_000 - last.n) as f64)
}

/// A completion curve (0 → n) as a remaining curve (n → 0).
fn remaining(done: &Curve, n: usize) -> Vec<(f64, f64)> {
    done.points
        .iter()
        .map(|&(t, v)| (t, n as f64 - v))
        .collect()
}
