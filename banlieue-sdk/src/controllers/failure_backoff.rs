//! How long an object waits after a failed reconcile: doubling per failed *retry*,
//! not per failed reconcile.
//!
//! A failing object is often reconciled again before its retry is due: its own status
//! write, a change to its VM or Provider, wakes it. Counting those failures too made
//! the wait grow with the number of watch events (four in half a second put a machine
//! 16 s out, and the fault suite's random run waited 60 s for a backend that had long
//! recovered). A failure before the current wait has passed keeps that wait's
//! deadline; only a retry at or after it doubles the next one.

use std::time::{Duration, Instant};

/// The longest wait between retries.
const MAX: Duration = Duration::from_secs(300);

/// One object's run of failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Failures {
    /// Retries that failed after their wait had passed (the first failure counts).
    count: u32,
    /// When the current wait ends.
    due: Instant,
}

/// The wait after a failure at `now`, and the run it leaves. `salt` spreads the jitter
/// (up to +25 %) of objects failing together.
pub(crate) fn after_failure(
    previous: Option<Failures>,
    salt: u64,
    now: Instant,
) -> (Failures, Duration) {
    if let Some(run) = previous.filter(|run| now < run.due) {
        return (run, run.due - now);
    }
    let count = previous.map_or(1, |run| run.count.saturating_add(1));
    let base = Duration::from_secs(1u64 << (count - 1).min(9)).min(MAX);
    let jitter = (salt ^ u64::from(count)) % (base.as_millis() as u64 / 4 + 1);
    let wait = base + Duration::from_millis(jitter);
    (
        Failures {
            count,
            due: now + wait,
        },
        wait,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Fails at each offset (ms after the start) in turn; returns the waits.
    fn waits(at_ms: &[u64]) -> Vec<Duration> {
        let start = Instant::now();
        let mut run = None;
        at_ms
            .iter()
            .map(|&ms| {
                let (next, wait) = after_failure(run, 0, start + Duration::from_millis(ms));
                run = Some(next);
                wait
            })
            .collect()
    }

    fn secs(list: &[f64]) -> Vec<Duration> {
        list.iter().map(|&s| Duration::from_secs_f64(s)).collect()
    }

    #[test]
    fn retries_at_their_time_double_and_early_failures_keep_the_deadline() {
        // Salt 0 and count n give jitter n % (base/4 + 1) ms: 1, 2, 3 ms.
        let cases: [(&[u64], Vec<Duration>); 3] = [
            // Each retry when due: 1 s, 2 s, 4 s.
            (&[0, 1_001, 3_003], secs(&[1.001, 2.002, 4.003])),
            // Three watch events in the first half second: the same deadline.
            (&[0, 100, 300, 500], secs(&[1.001, 0.901, 0.701, 0.501])),
            // Then the retry at its time doubles once.
            (&[0, 400, 1_001], secs(&[1.001, 0.601, 2.002])),
        ];
        for (at, want) in cases {
            assert_eq!(waits(at), want, "failures at {at:?} ms");
        }
    }

    #[test]
    fn the_wait_stops_growing_at_five_minutes() {
        let mut run = None;
        let mut now = Instant::now();
        let mut wait = Duration::ZERO;
        for _ in 0..40 {
            let (next, w) = after_failure(run, 7, now);
            run = Some(next);
            wait = w;
            now += w;
        }
        assert!(wait >= MAX && wait <= MAX + MAX / 4, "{wait:?}");
    }

    proptest! {
        /// However the failures fall, a wait never ends before the one already
        /// promised, and never exceeds the cap plus its jitter.
        #[test]
        fn no_retry_is_brought_forward(gaps in prop::collection::vec(0u64..5_000, 1..30), salt: u64) {
            let mut run: Option<Failures> = None;
            let mut now = Instant::now();
            for gap in gaps {
                now += Duration::from_millis(gap);
                let (next, wait) = after_failure(run, salt, now);
                if let Some(previous) = run.filter(|r| now < r.due) {
                    prop_assert_eq!(now + wait, previous.due);
                }
                prop_assert!(wait <= MAX + MAX / 4);
                prop_assert!(wait > Duration::ZERO);
                run = Some(next);
            }
        }
    }
}
