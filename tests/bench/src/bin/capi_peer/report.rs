//! The report: per N, each side's medians, banlieue / peer as ratios against the goals
//! (≥ 2× the peer's machines per minute at ≤ ½ its CPU and RSS), the requests per
//! Machine by kind, and a chart of Machines provisioned over time.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use banlieue_bench::median;
use banlieue_bench::svg::{self, Series};

use crate::Side;
use crate::run::{BURST, MACHINE_CONCURRENCY, QPS, RunResult};

/// One side's medians at one N.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Medians {
    seconds: f64,
    per_minute: f64,
    cpu: f64,
    rss: f64,
    requests: f64,
    writes: f64,
    capi_cpu: f64,
    /// Median over runs of each run's median lag from creation to provisioned.
    lag: f64,
    /// Seconds from the first apply until Cluster API had created every Machine.
    all_created: f64,
}

fn medians(runs: &[&RunResult]) -> Medians {
    let of = |f: &dyn Fn(&RunResult) -> f64| median(runs.iter().map(|r| f(r)).collect());
    Medians {
        seconds: of(&|r| r.seconds),
        per_minute: of(&|r| r.per_minute()),
        cpu: of(&|r| r.provider_cpu_seconds),
        rss: of(&|r| r.provider_peak_rss_mib),
        requests: of(&|r| r.requests() as f64 / r.n as f64),
        writes: of(&|r| r.writes() as f64 / r.n as f64),
        capi_cpu: of(&|r| r.capi_cpu_seconds),
        lag: of(&|r| median(r.lags.clone())),
        all_created: of(&|r| r.created.last().map_or(f64::NAN, |p| p.0)),
    }
}

/// A goal's verdict: `met` or `not met`.
fn verdict(met: bool) -> &'static str {
    if met { "**met**" } else { "**not met**" }
}

/// The report from every `capi-peer-n*.json` in `data` (the day's results).
pub fn render(data: &Path, date: &str) -> anyhow::Result<String> {
    let mut by_n: BTreeMap<usize, Vec<RunResult>> = BTreeMap::new();
    for entry in std::fs::read_dir(data)? {
        let path = entry?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if name.starts_with("capi-peer-n") && name.ends_with(".json") {
            let runs: Vec<RunResult> = serde_json::from_slice(&std::fs::read(&path)?)?;
            for run in runs {
                by_n.entry(run.n).or_default().push(run);
            }
        }
    }
    let out = data.parent().and_then(Path::parent).unwrap_or(data);
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# banlieue beside Cluster API's in-memory provider, {date}\n"
    );
    let _ = writeln!(
        md,
        "`make bench-capi-peer` (`tests/bench/src/bin/capi_peer`). One Cluster API workload, \
         run against each provider on a fresh control plane (etcd + kube-apiserver with an \
         audit log) with the same CAPI core manager ({}, same build and flags): one Cluster \
         and MachineDeployments of at most 100 replicas totalling N Machines, whose \
         bootstrap data Secret exists already, applied at once.\n\n\
         - **banlieue**: `banlieue run` (release build) with its shipped defaults, a `sim` \
           Provider with `latency: 0s` behind a VSphereCluster, VSphereMachines.\n\
         - **peer**: Cluster API's development provider (CAPD, `test/infrastructure/docker` \
           of `sigs.k8s.io/cluster-api/test`, the same version), DevCluster/DevMachines with \
           the `inMemory` backend, every `startupDuration` 0 s. It fakes a workload cluster \
           for itself (an in-process API server on a loopback listener); with no control \
           plane in the workload it only records a VM and a Node per Machine, which is the \
           work banlieue's `sim` does (a record per VM), so the two do comparable work.\n\
         - Both get the same client settings and machine concurrency: {QPS} QPS, burst \
           {BURST}, {MACHINE_CONCURRENCY} machine reconciles at once (banlieue's shipped \
           defaults; the peer's own are 100 QPS, burst 200, 50 reconciles). Other settings \
           are each side's defaults (the peer logs at `-v=2`, banlieue at `info`).\n\
         - Time: from the first apply to every Machine's \
           `status.initialization.infrastructureProvisioned`, polled every 1 s (2 s above \
           2,000 Machines). CPU: the provider process's user + system seconds over that \
           time (start-up excluded). RSS: its peak (`VmHWM`). Requests: the provider's, by \
           `User-Agent`, over that time, per Machine.\n\
         - Goal: banlieue ≥ 2× the peer's Machines per minute at ≤ ½ its CPU and peak RSS.\n",
        by_n.values()
            .flatten()
            .next()
            .map_or("?", |r| r.capi_version.as_str())
    );
    for (n, runs) in &by_n {
        let side = |s: Side| runs.iter().filter(|r| r.side == s).collect::<Vec<_>>();
        let (ours, peers) = (side(Side::Banlieue), side(Side::Peer));
        if ours.is_empty() || peers.is_empty() {
            continue;
        }
        let (a, b) = (medians(&ours), medians(&peers));
        let _ = writeln!(md, "## N = {n} ({} run(s) per side; medians)\n", ours.len());
        let _ = writeln!(
            md,
            "| side | all provisioned | Machines/min | provider CPU | provider peak RSS | requests/Machine | writes/Machine | CAPI manager CPU | all created by CAPI | lag created → provisioned (median) |\n|---|---|---|---|---|---|---|---|---|---|"
        );
        for (name, m) in [("banlieue", a), ("peer (CAPD in-memory)", b)] {
            let _ = writeln!(
                md,
                "| {name} | {:.1} s | {:.0} | {:.2} s | {:.1} MiB | {:.2} | {:.2} | {:.2} s | {:.0} s | {:.0} s |",
                m.seconds,
                m.per_minute,
                m.cpu,
                m.rss,
                m.requests,
                m.writes,
                m.capi_cpu,
                m.all_created,
                m.lag
            );
        }
        let speed = a.per_minute / b.per_minute;
        let cpu = a.cpu / b.cpu;
        let rss = a.rss / b.rss;
        let _ = writeln!(
            md,
            "| **banlieue / peer** | {:.2}× | **{speed:.2}×** | **{cpu:.2}×** | **{rss:.2}×** | {:.2}× | {:.2}× | {:.2}× | | |\n",
            a.seconds / b.seconds,
            a.requests / b.requests,
            a.writes / b.writes,
            a.capi_cpu / b.capi_cpu
        );
        let _ = writeln!(
            md,
            "Goals: Machines per minute ≥ 2× the peer's: {} ({speed:.2}×); CPU ≤ ½: {} ({cpu:.2}×); peak RSS ≤ ½: {} ({rss:.2}×).\n",
            verdict(speed >= 2.0),
            verdict(cpu <= 0.5),
            verdict(rss <= 0.5)
        );
        requests_table(&mut md, *n, ours[0], peers[0]);
        let chart = format!("capi-peer-{date}-n{n}.svg");
        let line = |label: &str, color, dashed, points: &Vec<_>| Series {
            label: label.into(),
            color,
            dashed,
            points: points.clone(),
        };
        let (ours_color, peer_color) = ("#1f77b4", "#ff7f0e");
        let series = [
            line("banlieue", ours_color, false, &ours[0].curve),
            line("peer (CAPD in-memory)", peer_color, false, &peers[0].curve),
            line(
                "Machines created by CAPI, banlieue's run",
                ours_color,
                true,
                &ours[0].created,
            ),
            line(
                "Machines created by CAPI, the peer's run",
                peer_color,
                true,
                &peers[0].created,
            ),
        ];
        std::fs::write(
            out.join(&chart),
            svg::line_chart(
                &format!("{n} CAPI Machines: infrastructure provisioned"),
                "seconds since the first apply",
                "Machines provisioned",
                &series,
            ),
        )?;
        let _ = writeln!(md, "![Machines provisioned over time, N = {n}]({chart})\n");
    }
    let notes = data.join("capi-peer-notes.md");
    if let Ok(text) = std::fs::read_to_string(notes) {
        md.push_str(&text);
    }
    Ok(md)
}

/// The first run of each side: the provider's requests per Machine by kind.
fn requests_table(md: &mut String, n: usize, ours: &RunResult, peer: &RunResult) {
    let mut keys: Vec<&String> = ours
        .provider_requests
        .keys()
        .chain(peer.provider_requests.keys())
        .collect();
    keys.sort();
    keys.dedup();
    let per = |r: &RunResult, k: &String| {
        r.provider_requests.get(k).copied().unwrap_or(0) as f64 / n as f64
    };
    keys.sort_by(|x, y| {
        let total = |k| per(ours, k) + per(peer, k);
        total(y).total_cmp(&total(x))
    });
    let _ = writeln!(
        md,
        "<details><summary>Requests per Machine by kind (first run of each side)</summary>\n\n| request | banlieue | peer |\n|---|---|---|"
    );
    let mut small = 0;
    for key in keys {
        let (a, b) = (per(ours, key), per(peer, key));
        if a < 0.005 && b < 0.005 {
            small += 1;
            continue;
        }
        let _ = writeln!(md, "| `{key}` | {a:.2} | {b:.2} |");
    }
    if small > 0 {
        let _ = writeln!(
            md,
            "\n{small} more kinds (watches and lists at start-up) under 0.005 per Machine on both sides."
        );
    }
    let _ = writeln!(md, "\n</details>\n");
}
