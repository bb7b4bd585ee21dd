//! The per-Provider cap on machines being created at once (`maxConcurrentCreates`):
//! a hypervisor asked for hundreds of clones in one burst queues, times out or fails
//! them (Proxmox VE limits concurrent clones from one template), so a burst is let
//! through this many at a time and the rest wait with a condition that says why.
//!
//! A machine takes a slot right before it asks its backend for a machine that does
//! not exist yet (no `spec.providerID`), after everything the create needs was read:
//! one waiting for its bootstrap Secret or an IPAM address holds none (it only peeks,
//! [`CreateSlots::would_admit`], so one queued behind the cap reads nothing), and a
//! reconcile that stops before the backend gives back a slot it held. It keeps the
//! slot until the backend reports its provider ID (the VM exists:
//! the clone is done; booting and waiting for an address do not hold a slot, so a
//! guest that never gets an address cannot block the Provider), a terminal error, or
//! its deletion.
//! Slots live in memory: after a restart, creates already running on the hypervisor
//! are not counted until their machines are reconciled again.
//!
//! Machines queued behind the cap wait in order; a slot given back wakes the first of
//! them through its controller ([`CreateSlots::wakes`]) instead of leaving every
//! queued machine to look again on a timer.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Mutex, MutexGuard, PoisonError};

use futures::channel::mpsc;

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

/// A machine queued for a slot, as its controller finds it again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiter {
    /// The machine's kind (`VSphereMachine`): which controller to wake.
    pub kind: String,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

#[derive(Debug, Default)]
struct Slots {
    held: HashSet<String>,
    peak: usize,
    queue: Queue,
}

/// Machines waiting for a slot, by UID, first come first. Every operation is O(1)
/// (amortised): a burst of 100,000 machines behind a cap of 10 would otherwise scan the
/// queue on each wait, admission and release. A machine that leaves the queue leaves a
/// stale entry behind, recognised by its ticket and dropped when reached or compacted.
#[derive(Debug, Default)]
struct Queue {
    order: VecDeque<(u64, String, Waiter)>,
    tickets: HashMap<String, u64>,
    next_ticket: u64,
}

impl Queue {
    /// Queues `uid` at the back, unless it is queued already (it keeps its place).
    fn push(&mut self, uid: &str, waiter: Waiter) {
        if self.tickets.contains_key(uid) {
            return;
        }
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.tickets.insert(uid.to_owned(), ticket);
        self.order.push_back((ticket, uid.to_owned(), waiter));
    }

    /// Takes `uid` out of the queue, if it is there.
    fn remove(&mut self, uid: &str) {
        if self.tickets.remove(uid).is_some() && self.order.len() > 2 * self.tickets.len() + 64 {
            let tickets = &self.tickets;
            self.order
                .retain(|(ticket, uid, _)| tickets.get(uid) == Some(ticket));
        }
    }

    /// The first machine queued, out of the queue.
    fn pop(&mut self) -> Option<Waiter> {
        while let Some((ticket, uid, waiter)) = self.order.pop_front() {
            if self.tickets.get(&uid) == Some(&ticket) {
                self.tickets.remove(&uid);
                return Some(waiter);
            }
        }
        None
    }
}

/// Slots per Provider (`namespace/name`).
#[derive(Debug, Default)]
pub struct CreateSlots {
    providers: Mutex<HashMap<String, Slots>>,
    wakers: Mutex<HashMap<String, mpsc::UnboundedSender<Waiter>>>,
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
        slots.queue.remove(uid);
        Admission::Go
    }

    /// What [`Self::admit`] would answer now, taking nothing: a machine asks this
    /// before it reads what its create needs (bootstrap data, addresses), so that one
    /// queued behind the cap reads nothing, and takes its slot only right before the
    /// backend create.
    pub fn would_admit(&self, provider: &str, uid: &str, cap: Option<usize>) -> Admission {
        let providers = self.lock();
        let Some(slots) = providers.get(provider) else {
            return Admission::Go;
        };
        match cap {
            Some(cap) if !slots.held.contains(uid) && slots.held.len() >= cap => {
                Admission::Queued {
                    in_flight: slots.held.len(),
                    cap,
                }
            }
            _ => Admission::Go,
        }
    }

    /// Queues machine `uid` (refused a slot by [`Self::admit`]) to be woken when one
    /// is given back; a machine already queued keeps its place.
    pub fn wait(&self, provider: &str, uid: &str, waiter: Waiter) {
        let mut providers = self.lock();
        let slots = providers.entry(provider.to_owned()).or_default();
        slots.queue.push(uid, waiter);
    }

    /// The machines of `kind` to reconcile because a slot was given back for them.
    /// One receiver per kind: a second call replaces the first.
    pub fn wakes(&self, kind: &str) -> mpsc::UnboundedReceiver<Waiter> {
        let (tx, rx) = mpsc::unbounded();
        self.wakers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(kind.to_owned(), tx);
        rx
    }

    /// True when `uid` holds a slot on `provider`.
    pub fn holds(&self, provider: &str, uid: &str) -> bool {
        self.lock()
            .get(provider)
            .is_some_and(|slots| slots.held.contains(uid))
    }

    /// Gives back `uid`'s slot (and its place in a queue: a machine deleted while
    /// queued), waking the first machine queued on that Provider; the Provider the
    /// slot was held on, if any.
    pub fn release(&self, uid: &str) -> Option<String> {
        let (provider, next) = {
            let mut providers = self.lock();
            for slots in providers.values_mut() {
                slots.queue.remove(uid);
            }
            let (provider, slots) = providers
                .iter_mut()
                .find(|(_, slots)| slots.held.contains(uid))?;
            slots.held.remove(uid);
            (provider.clone(), slots.queue.pop())
        };
        if let Some(waiter) = next {
            self.wake(waiter);
        }
        Some(provider)
    }

    fn wake(&self, waiter: Waiter) {
        let wakers = self.wakers.lock().unwrap_or_else(PoisonError::into_inner);
        // No controller of that kind listening (or it stopped): the machine's own
        // recheck finds the slot.
        if let Some(tx) = wakers.get(&waiter.kind) {
            let _ = tx.unbounded_send(waiter);
        }
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

    #[test]
    fn a_peek_takes_nothing_and_answers_as_admission_would() {
        let slots = CreateSlots::default();
        assert_eq!(slots.would_admit("ns/p", "a", Some(1)), Admission::Go);
        assert_eq!(slots.in_flight("ns/p"), (0, 0), "a peek holds no slot");
        assert_eq!(slots.admit("ns/p", "a", Some(1)), Admission::Go);
        let full = Admission::Queued {
            in_flight: 1,
            cap: 1,
        };
        assert_eq!(slots.would_admit("ns/p", "b", Some(1)), full);
        assert_eq!(slots.admit("ns/p", "b", Some(1)), full);
        assert_eq!(
            slots.would_admit("ns/p", "a", Some(1)),
            Admission::Go,
            "the holder"
        );
        assert_eq!(
            slots.would_admit("ns/p", "b", None),
            Admission::Go,
            "no cap"
        );
        slots.release("a");
        assert_eq!(slots.would_admit("ns/p", "b", Some(1)), Admission::Go);
    }

    fn waiter(name: &str) -> Waiter {
        Waiter {
            kind: "VSphereMachine".into(),
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    #[test]
    fn a_slot_given_back_wakes_the_first_machine_queued_on_that_provider() {
        use futures::StreamExt;
        let slots = CreateSlots::default();
        let mut wakes = slots.wakes("VSphereMachine");
        assert_eq!(slots.admit("ns/p", "a", Some(1)), Admission::Go);
        for queued in ["b", "c", "d"] {
            assert_ne!(slots.admit("ns/p", queued, Some(1)), Admission::Go);
            slots.wait("ns/p", queued, waiter(queued));
        }
        slots.wait("ns/p", "b", waiter("b"));
        // c is deleted while queued: it leaves the queue, and wakes no one.
        assert_eq!(slots.release("c"), None);
        assert_eq!(slots.release("a").as_deref(), Some("ns/p"));
        assert_eq!(
            futures::executor::block_on(wakes.next()),
            Some(waiter("b")),
            "first come, once"
        );
        assert_eq!(slots.admit("ns/p", "b", Some(1)), Admission::Go);
        slots.release("b");
        assert_eq!(futures::executor::block_on(wakes.next()), Some(waiter("d")));
        assert!(wakes.try_recv().is_err(), "nothing else queued");
    }

    proptest! {
        /// The queue behaves as the plain list it replaces (first come first, one place
        /// per machine, leaving on removal), whatever the operations.
        #[test]
        fn the_queue_is_a_list_without_duplicates(
            ops in proptest::collection::vec((0u8..3, 0u8..8), 0..400),
        ) {
            let mut queue = Queue::default();
            let mut model: VecDeque<String> = VecDeque::new();
            for (op, machine) in ops {
                let uid = machine.to_string();
                match op {
                    0 => {
                        queue.push(&uid, waiter(&uid));
                        if !model.contains(&uid) {
                            model.push_back(uid);
                        }
                    }
                    1 => {
                        queue.remove(&uid);
                        model.retain(|m| *m != uid);
                    }
                    _ => {
                        let popped = queue.pop().map(|w| w.name);
                        prop_assert_eq!(popped, model.pop_front());
                    }
                }
                prop_assert_eq!(queue.tickets.len(), model.len());
            }
            let mut rest = vec![];
            while let Some(w) = queue.pop() {
                rest.push(w.name);
            }
            prop_assert_eq!(rest, Vec::from(model));
        }

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
