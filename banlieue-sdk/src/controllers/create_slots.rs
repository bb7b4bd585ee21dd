//! The per-Provider cap on machines being created at once (`maxConcurrentCreates`):
//! a hypervisor asked for hundreds of clones in one burst queues, times out or fails
//! them (Proxmox VE limits concurrent clones from one template), so a burst is let
//! through this many at a time and the rest wait with a condition that says why.
//!
//! A machine holds a slot from the reconcile that first asks its backend for it (no
//! `spec.providerID` yet) until the backend reports its provider ID (the VM exists:
//! the clone is done; booting and waiting for an address do not hold a slot, so a
//! guest that never gets an address cannot block the Provider), a terminal error, or
//! its deletion.
//! Slots live in memory: after a restart, creates already running on the hypervisor
//! are not counted until their machines are reconciled again.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard, PoisonError};

pub(crate) use crate::backend::concurrency::{
    MAX_CONCURRENT_CREATES_SETTING, max_concurrent_creates as cap,
};

/// Whether a machine may go on to its backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// It holds a slot (or there is no cap).
    Go,
    /// Every slot is held: `in_flight` creates are running, at the cap.
    Queued {
        /// Creates running on the Provider now.
        in_flight: usize,
        /// The cap.
        cap: usize,
    },
}

#[derive(Debug, Default)]
struct Slots {
    held: HashSet<String>,
    peak: usize,
}

/// Slots per Provider (`namespace/name`).
#[derive(Debug, Default)]
pub struct CreateSlots {
    providers: Mutex<HashMap<String, Slots>>,
}

impl CreateSlots {
    /// Takes (or keeps) a slot on `provider` for machine `uid` under `cap`.
    pub fn admit(&self, provider: &str, uid: &str, cap: Option<usize>) -> Admission {
        let mut providers = self.lock();
        let slots = providers.entry(provider.to_owned()).or_default();
        if slots.held.contains(uid) {
            return Admission::Go;
        }
        if let Some(cap) = cap
            && slots.held.len() >= cap
        {
            return Admission::Queued {
                in_flight: slots.held.len(),
                cap,
            };
        }
        slots.held.insert(uid.to_owned());
        slots.peak = slots.peak.max(slots.held.len());
        Admission::Go
    }

    /// True when `uid` holds a slot on `provider`.
    pub fn holds(&self, provider: &str, uid: &str) -> bool {
        self.lock()
            .get(provider)
            .is_some_and(|slots| slots.held.contains(uid))
    }

    /// Gives back `uid`'s slot; the Provider it was held on, if any.
    pub fn release(&self, uid: &str) -> Option<String> {
        self.lock()
            .iter_mut()
            .find_map(|(provider, slots)| slots.held.remove(uid).then(|| provider.clone()))
    }

    /// Creates running on `provider` now, and the most at once since start.
    pub fn in_flight(&self, provider: &str) -> (usize, usize) {
        self.lock()
            .get(provider)
            .map_or((0, 0), |slots| (slots.held.len(), slots.peak))
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Slots>> {
        // Each update is one insert or remove: a panic cannot leave one half-done.
        self.providers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[test]
    fn the_setting_overrides_the_backend_default_and_zero_means_no_cap() {
        let set =
            |v: &str| BTreeMap::from([(MAX_CONCURRENT_CREATES_SETTING.to_owned(), v.to_owned())]);
        assert_eq!(cap(&BTreeMap::new(), Some(10)), Ok(Some(10)));
        assert_eq!(cap(&BTreeMap::new(), None), Ok(None));
        assert_eq!(cap(&set("3"), Some(10)), Ok(Some(3)));
        assert_eq!(cap(&set(" 25 "), None), Ok(Some(25)));
        assert_eq!(cap(&set("0"), Some(10)), Ok(None));
        let bad = cap(&set("ten"), Some(10)).unwrap_err();
        assert!(bad.contains("maxConcurrentCreates \"ten\""), "{bad}");
        assert!(cap(&set("-1"), None).is_err());
    }

    #[test]
    fn a_full_provider_queues_new_machines_but_not_those_holding_a_slot() {
        let slots = CreateSlots::default();
        assert_eq!(slots.admit("ns/p", "a", Some(2)), Admission::Go);
        assert_eq!(slots.admit("ns/p", "b", Some(2)), Admission::Go);
        assert_eq!(
            slots.admit("ns/p", "c", Some(2)),
            Admission::Queued {
                in_flight: 2,
                cap: 2
            }
        );
        assert_eq!(
            slots.admit("ns/p", "a", Some(2)),
            Admission::Go,
            "a holds one"
        );
        assert_eq!(
            slots.admit("ns/q", "c", Some(2)),
            Admission::Go,
            "per Provider"
        );
        slots.release("a");
        assert!(!slots.holds("ns/p", "a"));
        assert_eq!(slots.admit("ns/p", "c", Some(2)), Admission::Go);
        assert_eq!(slots.in_flight("ns/p"), (2, 2));
        assert_eq!(slots.admit("ns/p", "d", None), Admission::Go, "no cap");
        assert_eq!(slots.in_flight("ns/p"), (3, 3));
    }

    proptest! {
        /// Whatever the order of admissions and releases, no more than `cap` machines
        /// hold a slot on one Provider at once.
        #[test]
        fn never_more_than_the_cap(
            cap in 1usize..6,
            steps in proptest::collection::vec((any::<bool>(), 0u8..12), 0..200),
        ) {
            let slots = CreateSlots::default();
            for (admit, machine) in steps {
                let uid = machine.to_string();
                if admit {
                    slots.admit("ns/p", &uid, Some(cap));
                } else {
                    slots.release(&uid);
                }
                let (now, peak) = slots.in_flight("ns/p");
                prop_assert!(now <= cap && peak <= cap, "{now} {peak} > {cap}");
            }
        }
    }
}
