//! The task book: the long operation (a clone, a power change) a backend started for
//! each machine and has not seen finish, and the failures it reports for a while
//! before trying again. Kept in memory: after a restart a backend finds its VMs by
//! identity and starts what is still missing, so nothing here has to survive.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use banlieue_sdk::backend::{BackendError, Pending};

/// What an operation in flight is doing, as a backend names it.
pub trait TaskKind: Copy {
    /// For humans and `Pending.operation`: `Cloning`, `PoweringOn`.
    fn operation(self) -> &'static str;
    /// The condition reason when it fails: `CloneFailed`.
    fn failure_reason(self) -> &'static str;
}

/// The `Pending` a backend reports while `kind` runs, with the backend's task handle.
pub fn pending<K: TaskKind>(kind: K, task: Option<String>, retry_after: Duration) -> Pending {
    Pending {
        operation: kind.operation().to_string(),
        task,
        retry_after,
    }
}

/// The first look at an operation just started: [`TaskBook::next_poll`].
pub const FIRST_POLL: Duration = Duration::from_millis(250);

/// The operation in flight per machine UID: its kind and the backend's handle (a
/// vSphere task moref, a Proxmox UPID).
#[derive(Debug)]
pub struct TaskBook<K, H> {
    tasks: Mutex<HashMap<String, (K, H, Instant)>>,
}

impl<K, H> Default for TaskBook<K, H> {
    fn default() -> Self {
        Self {
            tasks: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Copy, H: Clone> TaskBook<K, H> {
    /// An empty book.
    pub fn new() -> Self {
        Self::default()
    }

    /// The operation in flight for `uid`, if any.
    pub fn get(&self, uid: &str) -> Option<(K, H)> {
        self.lock().get(uid).map(|(k, h, _)| (*k, h.clone()))
    }

    /// How soon to look at `uid`'s operation again: soon after it started (most
    /// reconfigures and power changes end within a second), then less often as it runs
    /// on — its age, between [`FIRST_POLL`] and `interval` (the backend's
    /// `taskPollInterval`, never exceeded). `interval` when nothing is in flight.
    pub fn next_poll(&self, uid: &str, interval: Duration) -> Duration {
        let age = self
            .lock()
            .get(uid)
            .map_or(interval, |(_, _, at)| at.elapsed());
        age.clamp(FIRST_POLL.min(interval), interval)
    }

    /// Records that `kind` runs for `uid` as `handle` (replacing what was there).
    pub fn remember(&self, uid: &str, kind: K, handle: H) {
        self.lock()
            .insert(uid.to_string(), (kind, handle, Instant::now()));
    }

    /// Forgets `uid`'s operation (it finished, failed or was lost).
    pub fn forget(&self, uid: &str) {
        self.lock().remove(uid);
    }

    /// How many operations are in flight.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True when nothing is in flight.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, (K, H, Instant)>> {
        // A panic elsewhere cannot leave a map entry half-written.
        self.tasks.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Failures reported again for a backoff before the next attempt: a failed clone is
/// not retried at once (it would fail the same way, and each try costs a full copy).
#[derive(Debug, Default)]
pub struct FailureBook {
    failures: Mutex<HashMap<String, (BackendError, Instant)>>,
}

impl FailureBook {
    /// An empty book.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that `uid`'s attempt failed with `error` now.
    pub fn record(&self, uid: &str, error: &BackendError) {
        self.lock()
            .insert(uid.to_string(), (error.clone(), Instant::now()));
    }

    /// The failure to report instead of trying again, while `backoff` has not passed
    /// since it happened; its `retry_after` is what is left. Once it has passed the
    /// failure is forgotten and `None` says: try again.
    pub fn still_failing(&self, uid: &str, backoff: Duration) -> Option<BackendError> {
        let mut failures = self.lock();
        match failures.get(uid) {
            Some((error, at)) if at.elapsed() < backoff => Some(
                error
                    .clone()
                    .retry_after(backoff.saturating_sub(at.elapsed())),
            ),
            Some(_) => {
                failures.remove(uid);
                None
            }
            None => None,
        }
    }

    /// Forgets `uid`'s failure (it was deleted, or succeeded).
    pub fn forget(&self, uid: &str) {
        self.lock().remove(uid);
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, (BackendError, Instant)>> {
        self.failures.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Op {
        Clone,
    }

    impl TaskKind for Op {
        fn operation(self) -> &'static str {
            "Cloning"
        }
        fn failure_reason(self) -> &'static str {
            "CloneFailed"
        }
    }

    #[test]
    fn the_book_holds_one_operation_per_machine() {
        let book: TaskBook<Op, String> = TaskBook::new();
        assert!(book.is_empty());
        book.remember("a", Op::Clone, "task-1".into());
        book.remember("a", Op::Clone, "task-2".into());
        book.remember("b", Op::Clone, "task-3".into());
        assert_eq!(book.len(), 2);
        assert_eq!(book.get("a"), Some((Op::Clone, "task-2".to_string())));
        book.forget("a");
        assert_eq!(book.get("a"), None);
        let p = pending(Op::Clone, Some("task-3".into()), Duration::from_secs(2));
        assert_eq!(
            (p.operation.as_str(), p.task.as_deref(), p.retry_after),
            ("Cloning", Some("task-3"), Duration::from_secs(2))
        );
    }

    #[test]
    fn a_task_is_looked_at_soon_then_at_most_every_interval() {
        let book: TaskBook<Op, String> = TaskBook::new();
        let interval = Duration::from_secs(2);
        assert_eq!(book.next_poll("a", interval), interval, "nothing in flight");
        book.remember("a", Op::Clone, "task-1".into());
        assert_eq!(book.next_poll("a", interval), FIRST_POLL);
        // An interval shorter than the first look is never exceeded.
        let short = Duration::from_millis(100);
        assert_eq!(book.next_poll("a", short), short);
        std::thread::sleep(Duration::from_millis(300));
        let later = book.next_poll("a", interval);
        assert!(
            later >= Duration::from_millis(300) && later < interval,
            "{later:?}"
        );
    }

    #[test]
    fn a_failure_is_reported_until_its_backoff_passes() {
        let book = FailureBook::new();
        let error = BackendError::terminal("CloneFailed", "no space");
        book.record("a", &error);
        let again = book.still_failing("a", Duration::from_secs(60)).unwrap();
        assert_eq!(again.reason, "CloneFailed");
        let left = again.retry_after.unwrap();
        assert!(
            left <= Duration::from_secs(60) && left > Duration::from_secs(50),
            "{left:?}"
        );
        assert!(book.still_failing("b", Duration::from_secs(60)).is_none());
        // A zero backoff has passed at once: the failure is forgotten.
        assert!(book.still_failing("a", Duration::ZERO).is_none());
        assert!(book.still_failing("a", Duration::from_secs(60)).is_none());
    }
}
