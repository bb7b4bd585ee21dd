//! Statuses this process wrote recently, so a reconcile that reads a cache which has
//! not caught up with our own write does not write the same status again.
//!
//! Our status patch and the watch event that brings it into the cache are apart: a
//! reconcile in between (triggered by another event, or by the requeue after the write)
//! sees the old status, computes the new one again with fresh transition times, and
//! writes it a second time. The scale benchmark counted about one such write per
//! object. Remembering what we wrote, with the resourceVersion it produced, lets the
//! reconcile start from the newer of the two.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a written status stands in for the cache. Long enough for a loaded
/// apiserver's watch to deliver our own write; short enough that a status someone
/// else changed is corrected soon.
const FRESH_FOR: Duration = Duration::from_secs(15);

/// Sweep stale entries every this many writes (entries of objects never reconciled
/// again would otherwise stay until they are deleted).
pub(super) const SWEEP_EVERY: usize = 1024;

/// Counts one insert into `entries`; every [`SWEEP_EVERY`] inserts, keeps only the
/// entries that are still `fresh` (entries of objects never looked at again would
/// otherwise stay until their objects are deleted).
pub(super) fn sweep_when_due<V>(
    entries: &mut HashMap<String, V>,
    since_sweep: &mut usize,
    fresh: impl Fn(&V) -> bool,
) {
    *since_sweep += 1;
    if *since_sweep >= SWEEP_EVERY {
        *since_sweep = 0;
        entries.retain(|_, e| fresh(e));
    }
}

/// The last status written for each object, by uid.
pub(crate) struct Written<S> {
    inner: Mutex<Inner<S>>,
}

struct Inner<S> {
    entries: HashMap<String, Entry<S>>,
    since_sweep: usize,
}

struct Entry<S> {
    resource_version: Option<String>,
    status: S,
    at: Instant,
}

impl<S: Clone> Default for Written<S> {
    fn default() -> Self {
        Self {
            inner: Mutex::new(Inner {
                entries: HashMap::new(),
                since_sweep: 0,
            }),
        }
    }
}

impl<S: Clone> Written<S> {
    /// The status to compute from: ours if we wrote one recently and the cached object
    /// (`cached_version`, `cached`) does not show that write yet; else the cached one.
    pub fn latest(&self, uid: &str, cached_version: Option<&str>, cached: Option<&S>) -> Option<S> {
        self.latest_at(uid, cached_version, cached, Instant::now())
    }

    fn latest_at(
        &self,
        uid: &str,
        cached_version: Option<&str>,
        cached: Option<&S>,
        now: Instant,
    ) -> Option<S> {
        let mut inner = self.inner.lock().expect("written statuses");
        let ours = inner.entries.get(uid).and_then(|entry| {
            let caught_up = entry.resource_version.is_some()
                && entry.resource_version.as_deref() == cached_version;
            let fresh = now.saturating_duration_since(entry.at) < FRESH_FOR;
            (fresh && !caught_up).then(|| entry.status.clone())
        });
        if ours.is_none() {
            inner.entries.remove(uid);
        }
        ours.or_else(|| cached.cloned())
    }

    /// Remembers that `status` was written for `uid`, producing `resource_version`.
    pub fn remember(&self, uid: &str, resource_version: Option<String>, status: S) {
        self.remember_at(uid, resource_version, status, Instant::now());
    }

    fn remember_at(&self, uid: &str, resource_version: Option<String>, status: S, now: Instant) {
        let mut inner = self.inner.lock().expect("written statuses");
        let Inner {
            entries,
            since_sweep,
        } = &mut *inner;
        sweep_when_due(entries, since_sweep, |e| {
            now.saturating_duration_since(e.at) < FRESH_FOR
        });
        inner.entries.insert(
            uid.to_owned(),
            Entry {
                resource_version,
                status,
                at: now,
            },
        );
    }

    /// The cache now holds `uid` at `resource_version`: if that is our last write, the
    /// cache stands for it again (what a reconcile reading it would find, see
    /// [`Written::latest`], for a controller not woken by its own writes' events).
    pub fn caught_up(&self, uid: &str, resource_version: &str) {
        let mut inner = self.inner.lock().expect("written statuses");
        if inner
            .entries
            .get(uid)
            .is_some_and(|e| e.resource_version.as_deref() == Some(resource_version))
        {
            inner.entries.remove(uid);
        }
    }

    /// Forgets `uid` (its object is going away).
    pub fn forget(&self, uid: &str) {
        self.inner
            .lock()
            .expect("written statuses")
            .entries
            .remove(uid);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().unwrap().entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ours_stands_in_until_the_cache_shows_it_or_it_ages() {
        let written = Written::default();
        let t0 = Instant::now();
        let old = "old".to_owned();
        assert_eq!(
            written.latest_at("u", Some("1"), Some(&old), t0),
            Some(old.clone()),
            "nothing written: the cache"
        );
        written.remember_at("u", Some("2".into()), "new".to_owned(), t0);
        let later = t0 + Duration::from_secs(1);
        assert_eq!(
            written
                .latest_at("u", Some("1"), Some(&old), later)
                .as_deref(),
            Some("new"),
            "stale cache: ours"
        );
        assert_eq!(
            written
                .latest_at("u", Some("2"), Some(&"new2".to_owned()), later)
                .as_deref(),
            Some("new2"),
            "the cache shows our write: the cache, and the entry goes"
        );
        assert_eq!(written.len(), 0);

        written.remember_at("u", Some("3".into()), "mine".to_owned(), t0);
        let aged = t0 + FRESH_FOR;
        assert_eq!(
            written.latest_at("u", Some("1"), Some(&old), aged),
            Some(old),
            "after FRESH_FOR the cache wins again"
        );
        assert_eq!(written.len(), 0);

        written.remember_at("u", None, "unversioned".to_owned(), t0);
        assert_eq!(
            written.latest_at("u", None, None, later).as_deref(),
            Some("unversioned"),
            "no resourceVersion never counts as caught up"
        );
        written.forget("u");
        assert_eq!(written.latest_at("u", None, None, later), None);
    }

    #[test]
    fn caught_up_drops_only_our_last_write() {
        let written = Written::default();
        let t0 = Instant::now();
        written.remember_at("u", Some("2".into()), "mine".to_owned(), t0);
        written.caught_up("u", "1");
        assert_eq!(written.len(), 1, "an older version is not our last write");
        written.caught_up("u", "2");
        assert_eq!(written.len(), 0, "the cache holds our last write");
        let cached = "someone else's".to_owned();
        assert_eq!(
            written.latest_at("u", Some("3"), Some(&cached), t0),
            Some(cached),
            "a later change of someone else's shows"
        );
    }

    #[test]
    fn stale_entries_are_swept() {
        let written = Written::default();
        let t0 = Instant::now();
        for i in 0..SWEEP_EVERY - 1 {
            written.remember_at(&format!("u{i}"), None, i, t0);
        }
        assert_eq!(written.len(), SWEEP_EVERY - 1);
        written.remember_at("last", None, 0, t0 + FRESH_FOR);
        assert_eq!(written.len(), 1, "only the fresh entry is left");
    }
}
