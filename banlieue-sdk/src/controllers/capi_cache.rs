//! Cluster API Machines and Clusters, each from one shared watch into a cache that the
//! infrastructure machine controllers read and are woken by (`feed`: a controller hears
//! of a change only once the cache holds it).
//!
//! They were read live, on the grounds that CAPI objects are few next to VMs; but every
//! CAPI-owned machine has its own Machine, and each of its reconciles read the Machine
//! and the Cluster, twice for the Cluster: `make bench-capi-peer` counted 44 requests
//! per Machine to the in-memory provider's 7, most of them these GETs. A cached read is
//! as fresh as the watch that wakes the reconcile, which is how Cluster API's own
//! providers read them (controller-runtime's cache).
//!
//! The controllers are woken only by changes they read ([`Signature`]): a Machine's or
//! Cluster's spec (its generation, which deletion bumps too), its pause annotation, its
//! first sight and its deletion. Cluster API rewrites a Cluster's status with every
//! Machine's progress, and each rewrite woke every machine of the cluster.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use futures::{Stream, StreamExt};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use tokio::sync::oneshot;

use super::feed::{self, Hears, Subscriber, Subscription};
use super::watch::Watched;
use super::{Settings, watch};
use crate::capi::metadata::PAUSED_ANNOTATION;
use crate::capi::objects::{Cluster, Machine};

/// What one infrastructure machine controller is woken by.
pub(crate) struct Triggers {
    machines: (Subscription<Machine>, Store<Machine>),
    clusters: (Subscription<Cluster>, Store<Cluster>),
}

impl Triggers {
    /// Machines (an owner changed: bootstrap data, failure domain, deletion) and
    /// Clusters (pause, infrastructure), each only when its [`Signature`] changed.
    pub(crate) fn into_streams(
        self,
    ) -> (
        impl Stream<Item = Result<Machine, watcher::Error>> + Send + 'static,
        impl Stream<Item = Result<Cluster, watcher::Error>> + Send + 'static,
    ) {
        let (machines, machine_store) = self.machines;
        let (clusters, cluster_store) = self.clusters;
        (
            significant(machines, machine_store),
            significant(clusters, cluster_store),
        )
    }
}

/// What of a Machine or Cluster an infrastructure machine reads: its spec (through
/// the generation, which the API server also bumps when deletion begins) and whether
/// it is annotated paused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Signature {
    generation: Option<i64>,
    paused: bool,
}

impl Signature {
    fn of<K: Resource>(object: &K) -> Self {
        Self {
            generation: object.meta().generation,
            paused: object.annotations().contains_key(PAUSED_ANNOTATION),
        }
    }
}

/// The last [`Signature`] passed on per object (by UID).
#[derive(Debug, Default)]
pub(crate) struct Signatures(HashMap<String, Signature>);

impl Signatures {
    /// Whether to pass on `uid` seen with `signature`: when first seen, when its
    /// signature changed, and when it is gone (`deleted`; then it is forgotten).
    pub(crate) fn changed(&mut self, uid: &str, signature: Signature, deleted: bool) -> bool {
        if deleted {
            self.0.remove(uid);
            return true;
        }
        self.0.insert(uid.to_owned(), signature) != Some(signature)
    }
}

/// `subscription`'s objects whose signature changed. The feed sends an object once
/// `store` has it, so one `store` no longer holds was deleted.
fn significant<K: Watched>(
    subscription: Subscription<K>,
    store: Store<K>,
) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static {
    let mut seen = Signatures::default();
    subscription.into_stream().filter(move |object| {
        let pass = match object {
            Ok(object) => {
                let deleted = store.get(&ObjectRef::from_obj(object)).is_none();
                let uid = object.uid().unwrap_or_default();
                seen.changed(&uid, Signature::of(object), deleted)
            }
            Err(_) => true,
        };
        futures::future::ready(pass)
    })
}

type Watch<K> = (reflector::store::Writer<K>, Vec<Subscriber<K>>);

/// The caches, and what is handed out once: the watches' writers and subscribers, and
/// one [`Triggers`] per machine kind.
pub(crate) struct CapiCache {
    machines: Store<Machine>,
    clusters: Store<Cluster>,
    watches: Mutex<Option<(Watch<Machine>, Watch<Cluster>)>>,
    triggers: Mutex<Vec<Triggers>>,
}

impl CapiCache {
    /// Caches with `controllers` sets of triggers, one per infrastructure machine
    /// controller that will run (a set nobody takes would hold the watch back once its
    /// buffer fills, so there are exactly as many as takers).
    pub(crate) fn new(controllers: usize) -> Self {
        let (machines, machines_writer) = reflector::store();
        let (clusters, clusters_writer) = reflector::store();
        let mut to_machines = Vec::new();
        let mut to_clusters = Vec::new();
        let mut triggers = Vec::new();
        for _ in 0..controllers {
            // Deletions too: a Machine going away wakes its infrastructure machine.
            let (machine_sender, machine_subscription) = feed::subscribe(Hears::Touched);
            let (cluster_sender, cluster_subscription) = feed::subscribe(Hears::Touched);
            to_machines.push(machine_sender);
            to_clusters.push(cluster_sender);
            triggers.push(Triggers {
                machines: (machine_subscription, machines.clone()),
                clusters: (cluster_subscription, clusters.clone()),
            });
        }
        Self {
            machines,
            clusters,
            watches: Mutex::new(Some((
                (machines_writer, to_machines),
                (clusters_writer, to_clusters),
            ))),
            triggers: Mutex::new(triggers),
        }
    }

    /// The Machine `name` in `namespace`, if the cache holds it.
    pub(crate) fn machine(&self, namespace: &str, name: &str) -> Option<Arc<Machine>> {
        self.machines.get(&ObjectRef::new(name).within(namespace))
    }

    /// The Cluster `name` in `namespace`, if the cache holds it.
    pub(crate) fn cluster(&self, namespace: &str, name: &str) -> Option<Arc<Cluster>> {
        self.clusters.get(&ObjectRef::new(name).within(namespace))
    }

    /// One controller's triggers (`None` once every set is taken).
    pub(crate) fn take_triggers(&self) -> Option<Triggers> {
        self.triggers.lock().expect("capi triggers").pop()
    }

    /// The two watches, and a receiver per watch told when it has listed; empty on a
    /// second call.
    pub(crate) fn feeds(
        &self,
        client: &Client,
        settings: &Settings,
    ) -> (Vec<BoxFuture<'static, ()>>, Vec<oneshot::Receiver<()>>) {
        let Some(((machines, to_machines), (clusters, to_clusters))) =
            self.watches.lock().expect("capi watches").take()
        else {
            return (Vec::new(), Vec::new());
        };
        let (machines_listed, machines_synced) = oneshot::channel();
        let (clusters_listed, clusters_synced) = oneshot::channel();
        let tasks: Vec<BoxFuture<'static, ()>> = vec![
            Box::pin(feed::run(
                watch::namespaced::<Machine>(client, settings),
                watch::filtered(settings),
                machines,
                to_machines,
                machines_listed,
                |_| {},
            )),
            Box::pin(feed::run(
                watch::namespaced::<Cluster>(client, settings),
                watch::filtered(settings),
                clusters,
                to_clusters,
                clusters_listed,
                |_| {},
            )),
        ];
        (tasks, vec![machines_synced, clusters_synced])
    }
}

#[cfg(test)]
mod tests {
    use super::{Signature, Signatures};

    fn sig(generation: i64, paused: bool) -> Signature {
        Signature {
            generation: Some(generation),
            paused,
        }
    }

    #[test]
    fn only_first_sight_spec_pause_and_deletion_pass() {
        let mut seen = Signatures::default();
        // (uid, signature, deleted, passes)
        let steps = [
            ("a", sig(1, false), false, true),  // first sight
            ("a", sig(1, false), false, false), // a status-only update
            ("a", sig(1, false), false, false), // another one
            ("b", sig(1, false), false, true),  // another object
            ("a", sig(2, false), false, true),  // spec changed
            ("a", sig(2, true), false, true),   // annotated paused
            ("a", sig(2, true), false, false),  // status again
            ("a", sig(3, true), false, true),   // deletion began (generation bumped)
            ("a", sig(3, true), true, true),    // gone
            ("a", sig(3, true), false, true),   // a new object with the same UID is new
        ];
        for (i, (uid, signature, deleted, passes)) in steps.into_iter().enumerate() {
            assert_eq!(
                seen.changed(uid, signature, deleted),
                passes,
                "step {i}: {uid} {signature:?} deleted={deleted}"
            );
        }
    }
}
