//! Shared by the fault suites (`faults*.rs`, `bad_input.rs`, `secrets.rs`): the seed, the retry bound the
//! controllers' backoff allows, and condition lookups.

use std::collections::BTreeMap;
use std::time::Duration;

use banlieue_sdk::api::VirtualMachine;
use banlieue_sdk::conditions;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// The run's seed: `$BANLIEUE_FAULT_SEED`, else the clock. Printed (on stderr, which
/// the test harness shows for failing tests) so a failure can be replayed.
pub fn seed() -> u64 {
    let seed = std::env::var("BANLIEUE_FAULT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos().into())
                .unwrap_or_default()
        });
    eprintln!("seed {seed} (replay with BANLIEUE_FAULT_SEED={seed})");
    seed
}

/// The most backend calls one object may cause in `window` under a persistent fault.
///
/// The controllers requeue a failing object after 1 s, 2 s, 4 s, ... (+0–25 % jitter),
/// so calls land at 0, ≥1, ≥3, ≥7, ≥15 s: ⌊log₂(window/1 s + 1)⌋ + 1 calls. Doubled
/// for reconciles that watch events bring besides (the object's own first status
/// write, the Provider's status changing). A requeue per status write or a fixed
/// sub-second requeue makes hundreds.
pub fn backoff_bound(window: Duration) -> u64 {
    let retries = (window.as_secs_f64() + 1.0).log2().floor() as u64;
    2 * (retries + 1)
}

/// The condition `type_` of a condition list, if the list and the condition exist.
pub fn condition_of<'a>(list: Option<&'a [Condition]>, type_: &str) -> Option<&'a Condition> {
    list.and_then(|l| conditions::get(l, type_))
}

/// True once a VirtualMachine's `Ready` condition is `True`.
pub fn is_ready(vm: &VirtualMachine) -> bool {
    condition_of(vm.status.as_ref().map(|s| &s.conditions[..]), "Ready")
        .is_some_and(|c| c.status == "True")
}

/// One line per key: its call times (seconds after its first call) and the gaps.
#[allow(dead_code)] // not every suite reports spacing
pub fn spacing_report(calls: &BTreeMap<String, Vec<Duration>>) -> String {
    calls
        .iter()
        .map(|(key, times)| {
            let at: Vec<String> = times
                .iter()
                .map(|t| format!("{:.2}", t.as_secs_f64()))
                .collect();
            format!("  {key}: {} calls at [{}] s", times.len(), at.join(", "))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_follows_the_doubling_backoff() {
        // 0, 1, 3, 7, 15 s fit in 20 s: 5 calls, doubled.
        assert_eq!(backoff_bound(Duration::from_secs(20)), 10);
        assert_eq!(backoff_bound(Duration::from_secs(60)), 12);
        // A 50 ms hot loop makes 400 calls in 20 s.
        assert!(backoff_bound(Duration::from_secs(20)) < 400 / 10);
    }
}
