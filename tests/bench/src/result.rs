//! What one size measured, saved as JSON (so that sizes run separately end up in one
//! report), and the figures the report derives from it.

use std::path::Path;

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use crate::baseline::Baseline;
use crate::measure::{ProcSample, RequestCounts};
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
    /// The client settings the operator logged (`qps=... burst=... adaptive=...`), i.e.
    /// the shipped defaults when `operator_args` does not set them (first pair; absent in
    /// older results).
    #[serde(default)]
    pub operator_client: Option<String>,
    /// Flags passed to kube-apiserver beyond the harness's and the audit log's.
    pub apiserver_args: Vec<String>,
    /// Ready VirtualMachines over time, from the start of the creates (first pair).
    pub ready: Curve,
    /// VirtualMachines remaining over time, from the start of the deletes (first pair).
    pub gone: Curve,
    /// Length of the idle window after convergence, seconds (first pair only).
    pub idle_seconds: f64,
    /// The minimal-writes client's timings (first pair).
    pub baseline: Baseline,
    /// Every baseline/operator pair, each run on a fresh control plane (empty in older
    /// results, which ran both on one).
    #[serde(default)]
    pub pairs: Vec<Pair>,
    /// API requests by phase, actor, verb and resource (audit logs, first pair).
    pub requests: RequestCounts,
    /// The operator's own `banlieue_api_writes_total` at the end (first pair).
    pub operator_counted_writes: Option<f64>,
    /// The most machines the operator had being created at once on the Provider
    /// (`banlieue_creates_in_flight_peak`, first pair; absent in older results).
    #[serde(default)]
    pub creates_in_flight_peak: Option<f64>,
    /// The operator process when all were Ready, after the idle window, and at the end
    /// (first pair).
    pub proc_ready: ProcSample,
    /// See [`proc_ready`](Self::proc_ready).
    pub proc_idle: ProcSample,
    /// See [`proc_ready`](Self::proc_ready).
    pub proc_end: ProcSample,
}

/// One baseline run and one operator run for the same N, each on a fresh control plane
/// of the same build and flags, so that neither inherits the other's etcd history or
/// apiserver heap.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Pair {
    /// Whether the operator's run came first (pairs alternate, so that a drift of the
    /// machine over the session does not favour one side).
    pub operator_first: bool,
    /// The operator's time to all Ready, seconds.
    pub ready_seconds: f64,
    /// The operator's time to all gone, seconds.
    pub gone_seconds: f64,
    /// The baseline's time to all Ready, seconds.
    pub baseline_ready_seconds: f64,
    /// The baseline's time to all gone, seconds.
    pub baseline_gone_seconds: f64,
    /// CPU seconds kube-apiserver and etcd spent from the first create to all Ready, with
    /// the operator.
    pub control_plane_cpu_ready: f64,
    /// The same for the baseline.
    pub baseline_control_plane_cpu_ready: f64,
}

impl Pair {
    /// Time to all Ready as a multiple of the baseline's.
    pub fn ready_ratio(&self) -> f64 {
        quotient(self.ready_seconds, self.baseline_ready_seconds)
    }

    /// Time to all gone as a multiple of the baseline's.
    pub fn gone_ratio(&self) -> f64 {
        quotient(self.gone_seconds, self.baseline_gone_seconds)
    }

    /// Control-plane CPU until all Ready as a multiple of the baseline's: the work the
    /// operator's requests cost the apiserver and etcd, beyond the floor.
    pub fn cpu_ratio(&self) -> f64 {
        quotient(
            self.control_plane_cpu_ready,
            self.baseline_control_plane_cpu_ready,
        )
    }
}

fn quotient(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { f64::NAN }
}

pub use banlieue_bench::median;

impl SizeResult {
    fn over_pairs(&self, of: impl Fn(&Pair) -> f64) -> Option<f64> {
        (!self.pairs.is_empty()).then(|| median(self.pairs.iter().map(of).collect()))
    }

    /// The operator's time to all Ready: the median over the pairs.
    pub fn ready_seconds(&self) -> f64 {
        self.over_pairs(|p| p.ready_seconds)
            .unwrap_or(self.ready.seconds)
    }

    /// The operator's time to all gone: the median over the pairs.
    pub fn gone_seconds(&self) -> f64 {
        self.over_pairs(|p| p.gone_seconds)
            .unwrap_or(self.gone.seconds)
    }

    /// The baseline's time to all Ready: the median over the pairs (older results: their
    /// one baseline run).
    pub fn baseline_ready(&self) -> f64 {
        self.over_pairs(|p| p.baseline_ready_seconds)
            .unwrap_or(self.baseline.ready.seconds)
    }

    /// The baseline's time to all gone, as [`baseline_ready`](Self::baseline_ready).
    pub fn baseline_gone(&self) -> f64 {
        self.over_pairs(|p| p.baseline_gone_seconds)
            .unwrap_or(self.baseline.gone.seconds)
    }

    /// Time to all Ready as a multiple of the baseline's: the median of the pairs' ratios.
    pub fn ready_ratio(&self) -> f64 {
        self.over_pairs(Pair::ready_ratio)
            .unwrap_or_else(|| quotient(self.ready.seconds, self.baseline_ready()))
    }

    /// Time to all gone as a multiple of the baseline's, as [`ready_ratio`](Self::ready_ratio).
    pub fn gone_ratio(&self) -> f64 {
        self.over_pairs(Pair::gone_ratio)
            .unwrap_or_else(|| quotient(self.gone.seconds, self.baseline_gone()))
    }

    /// Control-plane CPU until all Ready as a multiple of the baseline's: the median of the
    /// pairs' ratios; `None` for older results, which did not measure it.
    pub fn cpu_ratio(&self) -> Option<f64> {
        self.over_pairs(Pair::cpu_ratio)
    }

    /// `; pairs 1.41×, 1.38×, 1.52×` when more than one pair ran, from each pair's
    /// `ratio`; empty otherwise.
    pub fn each_pair(&self, ratio: impl Fn(&Pair) -> f64) -> String {
        if self.pairs.len() < 2 {
            return String::new();
        }
        let each: Vec<String> = self
            .pairs
            .iter()
            .map(|p| format!("{:.2}×", ratio(p)))
            .collect();
        format!("; pairs {}", each.join(", "))
    }

    /// Operator writes in `phase`, per VirtualMachine.
    pub fn writes_per_vm(&self, phase: &str) -> f64 {
        self.requests.writes(phase, "operator") as f64 / self.n as f64
    }

    /// Events the operator created per VM in `phase` (counted apart from the minimum).
    pub fn events_per_vm(&self, phase: &str) -> f64 {
        let events = self
            .requests
            .of(phase, "operator")
            .get("create events")
            .copied()
            .unwrap_or(0);
        events as f64 / self.n as f64
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
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if is_scale_result(name) {
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

/// Whether a data file is this benchmark's (`n<N>.json`): other benchmarks write beside
/// it on the same date (`capi-peer-n1000.json`), in their own shapes.
fn is_scale_result(name: &str) -> bool {
    name.strip_prefix('n')
        .and_then(|rest| rest.strip_suffix(".json"))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_n_digits_json_files_are_scale_results() {
        assert!(is_scale_result("n1000.json"));
        assert!(is_scale_result("n100000.json"));
        assert!(!is_scale_result("capi-peer-n1000.json"));
        assert!(!is_scale_result("n.json"));
        assert!(!is_scale_result("n1000-old.json"));
        assert!(!is_scale_result("notes.md"));
    }

    fn pair(ready: f64, baseline: f64) -> Pair {
        Pair {
            ready_seconds: ready,
            baseline_ready_seconds: baseline,
            ..Pair::default()
        }
    }

    #[test]
    fn the_ratio_is_the_median_of_the_pairs_ratios() {
        let result = SizeResult {
            pairs: vec![pair(300.0, 200.0), pair(200.0, 100.0), pair(130.0, 100.0)],
            ..SizeResult::default()
        };
        // Pair ratios 1.5, 2.0, 1.3: the median is 1.5, not median(times) = 200/100.
        assert_eq!(result.ready_ratio(), 1.5);
        assert_eq!(result.ready_seconds(), 200.0);
        assert_eq!(result.baseline_ready(), 100.0);
        assert_eq!(
            result.each_pair(Pair::ready_ratio),
            "; pairs 1.50×, 2.00×, 1.30×"
        );
    }

    #[test]
    fn older_results_use_their_one_baseline() {
        let mut result = SizeResult::default();
        result.ready.seconds = 270.0;
        result.baseline.ready.seconds = 180.0;
        assert_eq!(result.baseline_ready(), 180.0);
        assert_eq!(result.ready_ratio(), 1.5);
        assert_eq!(result.cpu_ratio(), None);
        assert_eq!(result.each_pair(Pair::ready_ratio), "");
    }
}
