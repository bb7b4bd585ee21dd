//! Watch events that only bring back a write of our own.
//!
//! An infra machine's reconcile that creates its VM writes the machine twice (its
//! `spec.providerID`, then its status), and each write comes back as a watch event
//! that wakes the machine again. That reconcile reads what it has just written: it asks
//! the backend again, reads the bootstrap Secret again, and writes nothing. The CAPI
//! benchmark counted 4.75 Secret reads per Machine, most of them from these wake-ups.
//! A VirtualMachine's status writes came back the same way (the scale benchmark
//! counted 8.8 VirtualMachine reconciles per VM at N = 100,000). Object uids do not
//! collide across kinds, so one set serves both controllers.
//!
//! A write's event is recognised by the resourceVersion the write returned: an event
//! with that version holds nothing but what the reconcile that wrote it already acted
//! on. Any other change, also one made between two of our writes, has a version of its
//! own and passes. Only live events are dropped, never a (re)list: after a watch
//! restart the listed object stands for every change whose event was missed.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

#[cfg(test)]
use super::written::SWEEP_EVERY;
use super::written::{Written, sweep_when_due};

/// How long a write's event is waited for (expired entries are swept every
/// [`super::written::SWEEP_EVERY`] writes: an event that came before its write was
/// recorded, or never came, would otherwise keep its entry). An event that comes later than this (a
/// watch lagging this much) wakes the reconcile as any event would.
const KEEP_FOR: Duration = Duration::from_secs(60);

/// The resourceVersions of our recent writes whose events have not come back yet, by
/// object uid.
#[derive(Default)]
pub(crate) struct Echoes {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    entries: HashMap<String, Entry>,
    since_sweep: usize,
}

struct Entry {
    /// In the order written (a watch delivers events in that order).
    versions: Vec<String>,
    at: Instant,
}

impl Echoes {
    /// Expects the event of our write of `uid` that produced `resource_version`.
    pub fn expect(&self, uid: &str, resource_version: &str) {
        self.expect_at(uid, resource_version, Instant::now());
    }

    fn expect_at(&self, uid: &str, resource_version: &str, now: Instant) {
        if uid.is_empty() || resource_version.is_empty() {
            return;
        }
        let mut inner = self.inner.lock().expect("echoes");
        let Inner {
            entries,
            since_sweep,
        } = &mut *inner;
        sweep_when_due(entries, since_sweep, |e| {
            now.saturating_duration_since(e.at) < KEEP_FOR
        });
        let entry = inner
            .entries
            .entry(uid.to_owned())
            .or_insert_with(|| Entry {
                versions: Vec::new(),
                at: now,
            });
        entry.versions.push(resource_version.to_owned());
        entry.at = now;
    }

    /// Whether a live event of `uid` at `resource_version` is the event of one of our
    /// writes. It is then forgotten, with the writes before it (their events came
    /// first, or were folded into this one).
    pub fn is_echo(&self, uid: &str, resource_version: Option<&str>) -> bool {
        self.is_echo_at(uid, resource_version, Instant::now())
    }

    fn is_echo_at(&self, uid: &str, resource_version: Option<&str>, now: Instant) -> bool {
        let Some(version) = resource_version else {
            return false;
        };
        let mut inner = self.inner.lock().expect("echoes");
        let Some(entry) = inner.entries.get_mut(uid) else {
            return false;
        };
        if now.saturating_duration_since(entry.at) >= KEEP_FOR {
            inner.entries.remove(uid);
            return false;
        }
        let Some(at) = entry.versions.iter().position(|v| v == version) else {
            return false;
        };
        entry.versions.drain(..=at);
        if entry.versions.is_empty() {
            inner.entries.remove(uid);
        }
        true
    }

    /// Forgets `uid` (its object is going away).
    pub fn forget(&self, uid: &str) {
        self.inner.lock().expect("echoes").entries.remove(uid);
    }

    /// Whether a live event of the object `meta` names is our own write coming back, so
    /// that no reconcile is woken for it. If so, `written` learns that the cache now
    /// shows that write: the skipped reconcile would have told it the same.
    pub fn skip_own_write<S: Clone>(
        &self,
        written: &Written<S>,
        kind: &str,
        meta: &ObjectMeta,
    ) -> bool {
        let uid = meta.uid.as_deref().unwrap_or_default();
        let version = meta.resource_version.as_deref();
        let echo = self.is_echo(uid, version);
        if echo && let Some(version) = version {
            written.caught_up(uid, version);
            tracing::trace!(kind, uid, version, "our own write's event: no reconcile");
        }
        echo
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().unwrap().entries.len()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn our_writes_events_are_echoes_and_others_are_not() {
        let echoes = Echoes::default();
        let t0 = Instant::now();
        assert!(!echoes.is_echo_at("u", Some("1"), t0), "nothing written");
        echoes.expect_at("u", "5", t0);
        echoes.expect_at("u", "7", t0);
        assert!(
            !echoes.is_echo_at("u", Some("4"), t0),
            "a change before ours"
        );
        assert!(!echoes.is_echo_at("v", Some("5"), t0), "another object");
        assert!(echoes.is_echo_at("u", Some("5"), t0), "our first write");
        assert!(
            !echoes.is_echo_at("u", Some("6"), t0),
            "a change between our writes"
        );
        assert!(echoes.is_echo_at("u", Some("7"), t0), "our second write");
        assert_eq!(echoes.len(), 0, "both came back: nothing kept");
        assert!(
            !echoes.is_echo_at("u", Some("7"), t0),
            "an echo counts once"
        );
        assert!(
            !echoes.is_echo_at("u", None, t0),
            "no version is never ours"
        );
    }

    #[test]
    fn a_later_echo_forgets_the_earlier_writes() {
        let echoes = Echoes::default();
        let t0 = Instant::now();
        echoes.expect_at("u", "5", t0);
        echoes.expect_at("u", "7", t0);
        // The event of 5 came before 5 was recorded (it passed as a change).
        assert!(echoes.is_echo_at("u", Some("7"), t0));
        assert_eq!(echoes.len(), 0);
        assert!(!echoes.is_echo_at("u", Some("5"), t0));
    }

    #[test]
    fn late_events_wake_as_any_event_and_entries_expire() {
        let echoes = Echoes::default();
        let t0 = Instant::now();
        echoes.expect_at("u", "5", t0);
        assert!(!echoes.is_echo_at("u", Some("5"), t0 + KEEP_FOR));
        assert_eq!(echoes.len(), 0);

        let echoes = Echoes::default();
        for i in 0..SWEEP_EVERY - 1 {
            echoes.expect_at(&format!("u{i}"), "1", t0);
        }
        assert_eq!(echoes.len(), SWEEP_EVERY - 1);
        echoes.expect_at("last", "1", t0 + KEEP_FOR);
        assert_eq!(echoes.len(), 1, "only the fresh entry is left");
        echoes.forget("last");
        assert_eq!(echoes.len(), 0);
        echoes.expect_at("", "1", t0);
        echoes.expect_at("u", "", t0);
        assert_eq!(echoes.len(), 0, "no uid or no version: nothing to expect");
    }

    #[test]
    fn an_echo_is_skipped_and_tells_written_the_cache_caught_up() {
        let echoes = Echoes::default();
        let written = Written::<u8>::default();
        let meta = |version: &str| ObjectMeta {
            uid: Some("u".into()),
            resource_version: Some(version.into()),
            ..ObjectMeta::default()
        };
        written.remember("u", Some("5".into()), 1);
        echoes.expect("u", "5");
        assert!(
            !echoes.skip_own_write(&written, "Kind", &meta("4")),
            "not ours"
        );
        assert_eq!(
            written.latest("u", Some("4"), Some(&0)),
            Some(1),
            "ours is newer"
        );
        assert!(
            echoes.skip_own_write(&written, "Kind", &meta("5")),
            "our write"
        );
        assert_eq!(
            written.latest("u", Some("6"), Some(&2)),
            Some(2),
            "caught up: the cache stands for our write again"
        );
    }

    proptest! {
        /// One object's history: writes of ours and of others, with versions rising,
        /// each event delivered in order, ours recorded before or after its event
        /// arrives. Every change of someone else's wakes the controller, and every write
        /// of ours recorded before its event does not.
        #[test]
        fn only_our_recorded_writes_are_dropped(
            writes in proptest::collection::vec((any::<bool>(), any::<bool>()), 1..40)
        ) {
            let echoes = Echoes::default();
            let t0 = Instant::now();
            for (version, &(ours, recorded_first)) in writes.iter().enumerate() {
                let version = (version + 1).to_string();
                if ours && recorded_first {
                    echoes.expect_at("u", &version, t0);
                }
                let dropped = echoes.is_echo_at("u", Some(&version), t0);
                prop_assert_eq!(dropped, ours && recorded_first, "version {}", version);
                if ours && !recorded_first {
                    echoes.expect_at("u", &version, t0);
                }
            }
        }
    }
}
