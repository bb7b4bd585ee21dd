//! Which cached machines claim which provider ID, kept beside a kind's cache by its
//! shared watch.
//!
//! A machine that may be a newcomer (its `spec.providerID` set, not yet provisioned)
//! or is being deleted asks whether an elder claims the same backend VM. Answering by
//! scanning the cache made each such reconcile cost O(machines): at 100,000 VMs the
//! delete phase alone scanned the cache hundreds of thousands of times (the scale
//! benchmark's CPU per VM tripled from 10k to 100k). Here the answer is one lookup.
//!
//! The index only narrows the search: callers read each named machine from the cache
//! and check its provider ID there, so an entry a moment behind the cache is harmless.

use std::collections::HashMap;
use std::sync::Mutex;

use kube::ResourceExt;
use kube::runtime::watcher::Event;

use crate::contract::InfraMachineRead;

/// A machine, by namespace and name.
pub(crate) type Key = (String, String);

/// Provider ID to the machines that claim it, and back.
#[derive(Debug, Default)]
pub(crate) struct ProviderIds(Mutex<Index>);

#[derive(Debug, Default)]
struct Index {
    live: Claims,
    /// Built during a (re)list, which replaces `live` when complete: a machine deleted
    /// while the watch was down sends no event, and must not stay indexed.
    relisting: Option<Claims>,
}

/// The pure map, tested on its own.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Claims {
    /// Sorted, without repeats. A Vec, not a set: an ID almost always has one claimant,
    /// and a one-key `BTreeSet` allocates a whole node (the heap profile at N = 5,000
    /// put this index at 850 bytes per machine with one).
    by_id: HashMap<String, Vec<Key>>,
    of: HashMap<Key, String>,
}

impl Claims {
    /// `key` now claims `id` (none: it claims nothing).
    fn set(&mut self, key: Key, id: Option<&str>) {
        if self.of.get(&key).map(String::as_str) == id {
            return;
        }
        self.remove(&key);
        if let Some(id) = id {
            let keys = self.by_id.entry(id.to_owned()).or_default();
            if let Err(at) = keys.binary_search(&key) {
                keys.insert(at, key.clone());
            }
            self.of.insert(key, id.to_owned());
        }
    }

    fn remove(&mut self, key: &Key) {
        let Some(id) = self.of.remove(key) else {
            return;
        };
        if let Some(keys) = self.by_id.get_mut(&id) {
            keys.retain(|k| k != key);
            if keys.is_empty() {
                self.by_id.remove(&id);
            }
        }
    }

    fn claimants(&self, id: &str) -> Vec<Key> {
        self.by_id.get(id).cloned().unwrap_or_default()
    }
}

/// One change the watch saw, reduced to what the index keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Change {
    /// A (re)list begins.
    Relist,
    /// A listed object.
    Listed(Key, Option<String>),
    /// The (re)list is complete.
    ListDone,
    /// A live add or change.
    Applied(Key, Option<String>),
    /// A live deletion.
    Deleted(Key),
}

impl ProviderIds {
    /// Takes in one of the watch's events (after the cache did).
    pub fn observe<K: InfraMachineRead + kube::Resource>(&self, event: &Event<K>) {
        let key = |m: &K| (m.namespace().unwrap_or_default(), m.name_any());
        let id = |m: &K| {
            m.provider_id()
                .filter(|id| !id.is_empty())
                .map(str::to_owned)
        };
        let change = match event {
            Event::Init => Change::Relist,
            Event::InitApply(m) => Change::Listed(key(m), id(m)),
            Event::InitDone => Change::ListDone,
            Event::Apply(m) => Change::Applied(key(m), id(m)),
            Event::Delete(m) => Change::Deleted(key(m)),
        };
        self.0.lock().expect("provider ids").apply(change);
    }

    /// The machines that claimed `id` when last seen (check each against the cache).
    pub fn claimants(&self, id: &str) -> Vec<Key> {
        self.0.lock().expect("provider ids").live.claimants(id)
    }
}

impl Index {
    fn apply(&mut self, change: Change) {
        match change {
            Change::Relist => self.relisting = Some(Claims::default()),
            Change::Listed(key, id) => match self.relisting.as_mut() {
                Some(next) => next.set(key, id.as_deref()),
                // A list event outside a list: keep it rather than lose it.
                None => self.live.set(key, id.as_deref()),
            },
            Change::ListDone => {
                if let Some(next) = self.relisting.take() {
                    self.live = next;
                }
            }
            // kube's watcher sends none during a list; were it to, the list in progress
            // must not lose it.
            Change::Applied(key, id) => {
                if let Some(next) = self.relisting.as_mut() {
                    next.set(key.clone(), id.as_deref());
                }
                self.live.set(key, id.as_deref());
            }
            Change::Deleted(key) => {
                if let Some(next) = self.relisting.as_mut() {
                    next.remove(&key);
                }
                self.live.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(name: &str) -> Key {
        ("ns".to_owned(), name.to_owned())
    }

    fn applied(name: &str, id: Option<&str>) -> Change {
        Change::Applied(key(name), id.map(str::to_owned))
    }

    fn claimants(index: &Index, id: &str) -> Vec<String> {
        index
            .live
            .claimants(id)
            .into_iter()
            .map(|(_, name)| name)
            .collect()
    }

    #[test]
    fn claims_follow_changes_of_provider_id_and_deletions() {
        let mut index = Index::default();
        for change in [
            applied("a", None),
            applied("a", Some("sim://1")),
            applied("b", Some("sim://1")),
            applied("c", Some("sim://2")),
        ] {
            index.apply(change);
        }
        assert_eq!(claimants(&index, "sim://1"), ["a", "b"]);
        index.apply(applied("b", Some("sim://3")));
        assert_eq!(claimants(&index, "sim://1"), ["a"], "b moved to another ID");
        index.apply(Change::Deleted(key("a")));
        assert!(claimants(&index, "sim://1").is_empty());
        assert!(
            !index.live.by_id.contains_key("sim://1"),
            "an ID nobody claims is not kept"
        );
        index.apply(applied("c", None));
        assert!(
            claimants(&index, "sim://2").is_empty(),
            "the ID was cleared"
        );
    }

    #[test]
    fn a_relist_drops_machines_deleted_while_the_watch_was_down_and_serves_until_done() {
        let mut index = Index::default();
        index.apply(applied("gone", Some("sim://1")));
        index.apply(applied("kept", Some("sim://2")));
        index.apply(Change::Relist);
        index.apply(Change::Listed(key("kept"), Some("sim://2".into())));
        assert_eq!(
            claimants(&index, "sim://1"),
            ["gone"],
            "until the list is complete, the last complete view answers"
        );
        index.apply(Change::ListDone);
        assert!(claimants(&index, "sim://1").is_empty());
        assert_eq!(claimants(&index, "sim://2"), ["kept"]);
    }

    fn change() -> impl Strategy<Value = Change> {
        let name = prop::sample::select(vec!["a", "b", "c", "d"]);
        let id = prop::option::of(prop::sample::select(vec!["x", "y", "z"]));
        prop_oneof![
            4 => (name.clone(), id.clone()).prop_map(|(n, i)| Change::Applied(key(n), i.map(Into::into))),
            2 => name.clone().prop_map(|n| Change::Deleted(key(n))),
            1 => Just(Change::Relist),
            2 => (name, id).prop_map(|(n, i)| Change::Listed(key(n), i.map(Into::into))),
            1 => Just(Change::ListDone),
        ]
    }

    proptest! {
        /// Against a model that keeps each machine's last provider ID (and, during a
        /// relist, only what the list showed, from when it is complete): the index
        /// names exactly the machines whose ID it is.
        #[test]
        fn the_index_names_exactly_the_machines_that_claim_an_id(
            changes in prop::collection::vec(change(), 0..60)
        ) {
            let mut index = Index::default();
            let mut model: HashMap<Key, String> = HashMap::new();
            let mut listing: Option<HashMap<Key, String>> = None;
            for change in changes {
                match &change {
                    Change::Relist => listing = Some(HashMap::new()),
                    Change::Listed(k, i) => {
                        let target = listing.as_mut().unwrap_or(&mut model);
                        match i {
                            Some(i) => { target.insert(k.clone(), i.clone()); }
                            None => { target.remove(k); }
                        }
                    }
                    Change::ListDone => {
                        if let Some(next) = listing.take() {
                            model = next;
                        }
                    }
                    Change::Applied(k, _) | Change::Deleted(k) => {
                        let id = match &change {
                            Change::Applied(_, id) => id.clone(),
                            _ => None,
                        };
                        for target in std::iter::once(&mut model).chain(listing.as_mut()) {
                            match &id {
                                Some(id) => { target.insert(k.clone(), id.clone()); }
                                None => { target.remove(k); }
                            }
                        }
                    }
                }
                index.apply(change);
                for id in ["x", "y", "z"] {
                    let mut expected: Vec<Key> = model
                        .iter()
                        .filter(|(_, i)| i.as_str() == id)
                        .map(|(k, _)| k.clone())
                        .collect();
                    expected.sort();
                    prop_assert_eq!(index.live.claimants(id), expected);
                }
                prop_assert_eq!(index.live.of.len(), model.len());
            }
        }
    }
}
