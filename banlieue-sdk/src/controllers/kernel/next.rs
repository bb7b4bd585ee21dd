//! When a reconciled object is looked at again: a decision in the plan, turned into
//! kube's `Action` here, the same way for every controller.

use std::time::Duration;

use kube::runtime::controller::Action;

/// When to look at an object again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// Settled: its failures are forgotten, and only the periodic resync looks again
    /// (a backend drifts without telling the watch).
    SyncPeriod,
    /// Settled, and nothing but a change to it (or to what it watches) matters.
    AwaitChange,
    /// Again after this long, whatever happened before: a condition that is polled, not
    /// a failure (its backoff is left as it is).
    After(Duration),
    /// Not settled: again after the object's backoff (1 s, 2 s, … at most a sync
    /// period, and at most `at_most` when given), sparing whatever it waits on.
    Backoff {
        /// A bound below the sync period: something expected soon.
        at_most: Option<Duration>,
    },
}

impl Next {
    /// The action for this decision: `backoff` records one more unsettled look and
    /// answers the wait; `settle` forgets the object's failures.
    pub(crate) fn action(
        self,
        sync_period: Duration,
        backoff: impl FnOnce() -> Duration,
        settle: impl FnOnce(),
    ) -> Action {
        match self {
            Next::SyncPeriod => {
                settle();
                Action::requeue(sync_period)
            }
            Next::AwaitChange => {
                settle();
                Action::await_change()
            }
            Next::After(wait) => Action::requeue(wait),
            Next::Backoff { at_most } => {
                let wait = backoff().min(sync_period);
                Action::requeue(at_most.map_or(wait, |bound| wait.min(bound)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    #[test]
    fn each_decision_becomes_its_action_and_touches_the_backoff_as_it_says() {
        let s = Duration::from_secs;
        // (decision, the backoff's answer, action, backoff asked, failures forgotten)
        let cases = [
            (Next::SyncPeriod, s(4), Action::requeue(s(600)), false, true),
            (Next::AwaitChange, s(4), Action::await_change(), false, true),
            (Next::After(s(2)), s(4), Action::requeue(s(2)), false, false),
            (
                Next::Backoff { at_most: None },
                s(4),
                Action::requeue(s(4)),
                true,
                false,
            ),
            // The backoff never waits past a sync period.
            (
                Next::Backoff { at_most: None },
                s(900),
                Action::requeue(s(600)),
                true,
                false,
            ),
            (
                Next::Backoff {
                    at_most: Some(s(3)),
                },
                s(16),
                Action::requeue(s(3)),
                true,
                false,
            ),
            (
                Next::Backoff {
                    at_most: Some(s(3)),
                },
                s(1),
                Action::requeue(s(1)),
                true,
                false,
            ),
        ];
        for (next, answer, want, asks, settles) in cases {
            let asked = Cell::new(false);
            let settled = Cell::new(false);
            let got = next.action(
                s(600),
                || {
                    asked.set(true);
                    answer
                },
                || settled.set(true),
            );
            assert_eq!(got, want, "{next:?}");
            assert_eq!((asked.get(), settled.get()), (asks, settles), "{next:?}");
        }
    }
}
