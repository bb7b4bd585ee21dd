//! What every reconciler shares: the client, backends, caches, metrics, events and
//! per-object retry state.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::events::{Event, EventType, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use tokio::sync::oneshot;

use super::backends::BackendCache;
use super::machine_cache::{ClaimRank, LeftBehind, MachineSummary, Slot};
use super::placements::Placements;
use super::written::Written;
use super::{Metrics, Readiness, Settings, watch};
use crate::api::infra::{ClusterStatus, MachineStatus, MachineTemplateStatus};
use crate::api::provider::ProviderStatus;
use crate::api::virtual_machine::VirtualMachineStatus;
use crate::api::{Provider, VMClass, VMImage, VirtualMachine};
use crate::backend::BackendRegistry;
use crate::contract::KindTable;

/// Read caches of the objects reconcilers look up by name.
#[derive(Clone)]
pub(crate) struct Stores {
    pub providers: Store<Provider>,
    pub classes: Store<VMClass>,
    pub images: Store<VMImage>,
    /// Every registered infra machine kind's cache (see [`super::kinds`]).
    pub machines: Vec<Arc<dyn Slot<Context>>>,
}

impl Stores {
    /// The other live machine that claims provider ID `id` and ranks before `rank`
    /// (see [`ClaimRank`]), as `Kind/namespace/name`: that machine owns the backend VM,
    /// and a lower claimant (a copied or hand-set `spec.providerID`) must neither adopt
    /// nor delete it.
    pub fn elder_claimant(&self, id: &str, uid: &str, rank: &ClaimRank) -> Option<String> {
        self.machines
            .iter()
            .flat_map(|kind| kind.claiming(id, uid))
            .filter(|other| other < rank)
            .min()
            .map(|(_, _, other)| other)
    }

    /// The infra machines (`Kind/name`, sorted) that hold Provider `provider` of
    /// `namespace`: while any exists, deleting the Provider would strand its backend VM.
    pub fn machines_on(&self, namespace: &str, provider: &str) -> Vec<String> {
        let mut all: Vec<String> = self
            .machines
            .iter()
            .flat_map(|kind| kind.on_provider(namespace, provider))
            .collect();
        all.sort();
        all
    }

    /// The backend VMs of the infra machines on Provider `provider` of `namespace`, as
    /// they would be left behind (see [`super::orphan_backend`]).
    pub fn left_on(&self, namespace: &str, provider: &str) -> Vec<LeftBehind> {
        self.machines
            .iter()
            .flat_map(|kind| kind.left_on(namespace, provider))
            .collect()
    }

    /// Every cached infra machine, of all kinds.
    pub fn infra_machines(&self) -> Vec<MachineSummary> {
        self.machines
            .iter()
            .flat_map(|kind| kind.summaries())
            .collect()
    }
}

/// Statuses written recently, by kind of status (see [`super::written`]).
#[derive(Default)]
pub(crate) struct WrittenStatuses {
    pub virtual_machines: Written<VirtualMachineStatus>,
    /// Every infra machine kind (uids do not collide across kinds).
    pub machines: Written<MachineStatus>,
    pub providers: Written<ProviderStatus>,
    /// Every InfraCluster kind.
    pub clusters: Written<ClusterStatus>,
    /// Every machine template kind.
    pub templates: Written<MachineTemplateStatus>,
}

struct Writers {
    providers: reflector::store::Writer<Provider>,
    classes: reflector::store::Writer<VMClass>,
    images: reflector::store::Writer<VMImage>,
}

/// Shared by every reconciler.
pub(crate) struct Context {
    pub client: Client,
    pub settings: Settings,
    pub metrics: Arc<Metrics>,
    pub readiness: Readiness,
    pub backends: BackendCache,
    /// The registered machine kinds, and which class builds each.
    pub kinds: KindTable,
    pub stores: Stores,
    /// The VirtualMachine controller's own cache (siblings for anti-affinity and spread).
    pub vms: OnceLock<Store<VirtualMachine>>,
    /// The scheduler's memory: placements decided until the cache catches up, and
    /// spread counts.
    pub placements: Mutex<Placements>,
    /// Whether Cluster API's `cluster.x-k8s.io/v1beta2` was served at start-up (then
    /// its Machines and Clusters are watched).
    pub capi_installed: bool,
    /// Cluster API Machines and Clusters, cached from shared watches (when Cluster API
    /// is installed).
    pub capi: Option<super::capi_cache::CapiCache>,
    /// Failure domains banlieue chose for CAPI machines, by uid, until their status
    /// says so (so replicas created together spread instead of piling up).
    pub capi_placements: Mutex<HashMap<String, String>>,
    /// What this process wrote last, for reconciles whose cache lags behind it.
    pub written: WrittenStatuses,
    /// Machines being created, per Provider, under its `maxConcurrentCreates`.
    pub create_slots: super::create_slots::CreateSlots,
    /// `CopyDisk` disk copies running beside the reconciles, by VM UID.
    pub copies: super::virtual_machine::copy_disk::job::Jobs,
    /// Whether every shared store has listed once: before, a VM's machines may be
    /// missing from the cache (a move in flight would look finished).
    pub stores_synced: super::synced::StoresSynced,
    /// VMs whose infra machine we created and the cache has not shown yet.
    pub unseen_machines: super::unseen::UnseenMachines,
    /// Our writes of infra machines whose watch events have not come back yet (they
    /// wake no reconcile).
    pub echoes: super::echoes::Echoes,
    events: super::events::Events,
    writers: Mutex<Option<Writers>>,
    failures: Mutex<HashMap<String, super::failure_backoff::Failures>>,
}

impl Context {
    /// A context, with an empty cache for every registered machine kind; the caches
    /// fill once [`Context::start_stores`] runs.
    pub fn new(
        client: Client,
        registry: BackendRegistry,
        settings: Settings,
        metrics: Arc<Metrics>,
        readiness: Readiness,
        capi_installed: bool,
    ) -> Arc<Self> {
        let (providers, providers_w) = reflector::store();
        let (classes, classes_w) = reflector::store();
        let (images, images_w) = reflector::store();
        let kinds = registry.kinds().clone();
        let machines: Vec<_> = kinds.entries().iter().map(|e| e.runtime.slot()).collect();
        // One set of triggers per infrastructure machine controller (one per kind).
        let capi = capi_installed.then(|| super::capi_cache::CapiCache::new(machines.len()));
        let reporter = Reporter {
            controller: "banlieue".into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Arc::new(Self {
            events: super::events::Events::new(client.clone(), reporter),
            backends: BackendCache::new(registry, metrics.clone()),
            kinds,
            client,
            settings,
            metrics,
            readiness,
            stores: Stores {
                providers,
                classes,
                images,
                machines,
            },
            vms: OnceLock::new(),
            placements: Mutex::new(Placements::default()),
            capi_installed,
            capi,
            capi_placements: Mutex::new(HashMap::new()),
            written: WrittenStatuses::default(),
            create_slots: Default::default(),
            copies: Default::default(),
            stores_synced: Default::default(),
            unseen_machines: Default::default(),
            echoes: Default::default(),
            writers: Mutex::new(Some(Writers {
                providers: providers_w,
                classes: classes_w,
                images: images_w,
            })),
            failures: Mutex::new(HashMap::new()),
        })
    }

    /// Feeds the shared stores until `shutdown`; counts as synced once all have listed.
    pub async fn start_stores(
        self: Arc<Self>,
        shutdown: impl std::future::Future<Output = ()> + Send,
    ) {
        let Some(w) = self.writers.lock().expect("writers").take() else {
            return;
        };
        let client = &self.client;
        let settings = &self.settings;
        let mut tasks: Vec<futures::future::BoxFuture<'static, ()>> = vec![
            feed(
                watch::namespaced::<Provider>(client, settings),
                watch::unfiltered(),
                w.providers,
            ),
            feed(
                Api::<VMClass>::all(client.clone()),
                watch::unfiltered(),
                w.classes,
            ),
            feed(
                Api::<VMImage>::all(client.clone()),
                watch::unfiltered(),
                w.images,
            ),
        ];
        let mut listed: Vec<oneshot::Receiver<()>> = Vec::new();
        for kind in &self.stores.machines {
            if let Some((watch, synced)) = kind.feed(client, settings) {
                tasks.push(watch);
                listed.push(synced);
            }
        }
        if let Some(capi) = &self.capi {
            let (watches, synced) = capi.feeds(client, settings);
            tasks.extend(watches);
            listed.extend(synced);
        }
        // kube's ready signal wakes only one waiter per store: the stores no controller
        // waits on are waited on here; the infra machine kinds' controllers wait on
        // theirs, so their feeds say when they have listed.
        let stores = self.stores.clone();
        let readiness = self.readiness.clone();
        let context = self.clone();
        tokio::spawn(async move {
            let _ = stores.providers.wait_until_ready().await;
            let _ = stores.classes.wait_until_ready().await;
            let _ = stores.images.wait_until_ready().await;
            for synced in listed {
                let _ = synced.await;
            }
            context.stores_synced.mark();
            readiness.synced();
        });
        tokio::select! {
            _ = futures::future::join_all(tasks) => {},
            _ = shutdown => {},
        }
    }

    /// Records an Event on `object` (best effort: a failed event never fails a reconcile).
    pub async fn event<K: Resource<DynamicType = ()>>(
        &self,
        object: &K,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: action.into(),
            secondary: None,
        };
        if let Err(error) = self.events.publish(&event, &object.object_ref(&())).await {
            tracing::debug!(%error, "could not publish event");
        }
    }

    /// As [`Self::event`], about `related` too: Warnings about one object are counted
    /// into one series per reason, so one naming each of several other objects (each
    /// backend VM a Provider leaves) needs its `related` to stay apart.
    pub async fn event_related<K: Resource<DynamicType = ()>>(
        &self,
        object: &K,
        related: k8s_openapi::api::core::v1::ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: action.into(),
            secondary: Some(related),
        };
        if let Err(error) = self.events.publish(&event, &object.object_ref(&())).await {
            tracing::debug!(%error, "could not publish event");
        }
    }

    /// How long `key` waits after a failure: 1 s, 2 s, 4 s, ... (+0–25 % jitter) per
    /// failed retry, capped at 5 minutes; a failure before the current wait ends
    /// (a watch event woke it) keeps that wait's deadline. See [`super::failure_backoff`].
    pub fn backoff(&self, key: &str) -> Duration {
        let mut failures = self.failures.lock().expect("failures");
        let previous = failures.get(key).copied();
        let (run, wait) =
            super::failure_backoff::after_failure(previous, fxhash(key), std::time::Instant::now());
        failures.insert(key.to_owned(), run);
        wait
    }

    /// Forgets an object's failures after a success.
    pub fn succeeded(&self, key: &str) {
        self.failures.lock().expect("failures").remove(key);
    }
}

fn fxhash(s: &str) -> u64 {
    s.bytes().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
    })
}

fn feed<K: watch::Watched>(
    api: Api<K>,
    config: watcher::Config,
    writer: reflector::store::Writer<K>,
) -> futures::future::BoxFuture<'static, ()> {
    Box::pin(async move {
        watcher(api, config)
            .backoff(super::watch::backoff())
            .modify(super::watch::strip_managed_fields)
            .reflect(writer)
            .applied_objects()
            .for_each(|event| async move {
                if let Err(error) = event {
                    tracing::warn!(%error, kind = %K::kind(&()), "watch error");
                }
            })
            .await;
    })
}

/// `Kind/namespace/name` of an object, for logs and per-object retry state (the kind
/// keeps a VirtualMachine and its infra machine, which share a name, apart).
pub(crate) fn key_of<K: Resource<DynamicType = ()>>(object: &K) -> String {
    format!(
        "{}/{}/{}",
        K::kind(&()),
        object.namespace().unwrap_or_default(),
        object.name_any()
    )
}
