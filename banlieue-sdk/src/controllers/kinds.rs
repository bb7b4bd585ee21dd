//! The runtime side of the kind table: for each registered machine kind, its shared
//! watch and cache, its controller (and, for banlieue's own kinds, the InfraCluster and
//! machine template controllers beside it), its place among the VirtualMachine
//! controller's children, and the lookups every reconciler makes across kinds. Kinds
//! are type-erased here, once, so nothing else lists them.

use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use kube::Client;
use kube::runtime::Controller;
use kube::runtime::reflector::{self, ObjectRef, Store};
use tokio::sync::oneshot;

use super::Settings;
use super::claims::ProviderIds;
use super::context::Context;
use super::feed::{self, MachineFeeds, Subscriber, Subscription, machine_feeds};
use super::machine_cache::{
    ClaimRank, Existing, LeftBehind, MachineSummary, Slot, claim_rank, claims, existing,
    machines_on_provider, on_provider, summaries,
};
use super::watch;
use crate::api::VirtualMachine;
use crate::backend::MachineSpec;
use crate::contract::{InfraMachineKind, MachineKind};

pub(crate) use super::machine_cache::Shutdown;

/// How the runtime makes a kind's [`Slot`] (kept in the kind table's entry).
#[derive(Clone, Copy)]
pub(crate) struct Runtime {
    slot: fn() -> Arc<dyn Slot<Context>>,
}

impl Runtime {
    pub(crate) fn of<K: MachineKind>() -> Self {
        Self {
            slot: new_slot::<K>,
        }
    }

    /// A new slot: an empty cache and the subscriptions its watch will feed.
    pub(crate) fn slot(&self) -> Arc<dyn Slot<Context>> {
        (self.slot)()
    }
}

/// A kind's cache, and what is handed out once: the watch's writer and subscribers,
/// and the two subscriptions (its own controller's, the VM controller's).
struct Typed<K: MachineKind> {
    store: Store<K>,
    /// Kept by the watch beside `store`.
    provider_ids: Arc<ProviderIds>,
    watch: Mutex<Option<Watch<K>>>,
    controller: Mutex<Option<Subscription<K>>>,
    owner: Mutex<Option<Subscription<K>>>,
    deleted: Mutex<Option<Subscription<K>>>,
}

/// A kind's watch before it starts: the cache's writer and whom it feeds.
type Watch<K> = (reflector::store::Writer<K>, Vec<Subscriber<K>>);

fn new_slot<K: MachineKind>() -> Arc<dyn Slot<Context>> {
    let (store, writer) = reflector::store();
    let (
        subscribers,
        MachineFeeds {
            controller,
            owner,
            deleted,
        },
    ) = machine_feeds();
    Arc::new(Typed::<K> {
        store,
        provider_ids: Default::default(),
        watch: Mutex::new(Some((writer, subscribers))),
        controller: Mutex::new(Some(controller)),
        owner: Mutex::new(Some(owner)),
        deleted: Mutex::new(Some(deleted)),
    })
}

impl<K: MachineKind> Typed<K> {
    fn get(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        self.store.get(&ObjectRef::new(name).within(namespace))
    }
}

impl<K: MachineKind> Slot<Context> for Typed<K> {
    fn kind(&self) -> InfraMachineKind {
        K::KIND
    }

    fn find(&self, namespace: &str, name: &str, owner_uid: &str) -> Option<Existing> {
        self.get(namespace, name)
            .and_then(|m| existing(m, owner_uid))
    }

    fn backend_spec(&self, namespace: &str, name: &str) -> Option<MachineSpec> {
        self.get(namespace, name).map(|m| m.backend_spec())
    }

    fn claiming(&self, id: &str, uid: &str) -> Vec<ClaimRank> {
        self.provider_ids
            .claimants(id)
            .into_iter()
            .filter_map(|(namespace, name)| self.get(&namespace, &name))
            .filter(|m| claims(m.as_ref(), id, uid))
            .map(|m| claim_rank(m.as_ref()))
            .collect()
    }

    fn on_provider(&self, namespace: &str, provider: &str) -> Vec<String> {
        on_provider(&self.store, namespace, provider)
    }

    fn left_on(&self, namespace: &str, provider: &str) -> Vec<LeftBehind> {
        machines_on_provider(&self.store, namespace, provider)
            .map(|m| LeftBehind::of(m.as_ref(), provider))
            .collect()
    }

    fn summaries(&self) -> Vec<MachineSummary> {
        summaries(&self.store).collect()
    }

    fn feed(
        &self,
        client: &Client,
        settings: &Settings,
    ) -> Option<(BoxFuture<'static, ()>, oneshot::Receiver<()>)> {
        let (writer, subscribers) = self.watch.lock().expect("kind watch").take()?;
        let (synced, listed) = oneshot::channel();
        let provider_ids = self.provider_ids.clone();
        let watch = feed::run(
            watch::namespaced::<K>(client, settings),
            watch::filtered(settings),
            writer,
            subscribers,
            synced,
            move |event| provider_ids.observe(event),
        );
        Some((Box::pin(watch), listed))
    }

    fn controllers(&self, ctx: Arc<Context>, shutdown: Shutdown) -> Vec<BoxFuture<'static, ()>> {
        let Some(feed) = self.controller.lock().expect("kind controller feed").take() else {
            return Vec::new();
        };
        let mut tasks: Vec<BoxFuture<'static, ()>> = vec![Box::pin(super::machine::run::<K>(
            ctx.clone(),
            feed,
            self.store.clone(),
            shutdown.clone(),
        ))];
        if let Some(deleted) = self.deleted.lock().expect("kind deletions feed").take() {
            tasks.push(Box::pin(super::machine::orphan::sweep::<K>(
                ctx.clone(),
                deleted,
                shutdown.clone(),
            )));
        }
        tasks.extend(companions(K::KIND, &ctx, &shutdown));
        tasks
    }

    fn owned_by(&self, controller: Controller<VirtualMachine>) -> Controller<VirtualMachine> {
        match self.owner.lock().expect("kind owner feed").take() {
            Some(owner) => controller.owns_stream(owner.into_stream()),
            None => controller,
        }
    }
}

/// The InfraCluster and machine template controllers of banlieue's own kinds (a kind
/// declared out of tree brings none: its machines are placed by the VM controller).
fn companions(
    kind: InfraMachineKind,
    ctx: &Arc<Context>,
    shutdown: &Shutdown,
) -> Vec<BoxFuture<'static, ()>> {
    use crate::api::infra::{cloud_hypervisor as ch, libvirt as lv, proxmox as px, vsphere as vs};
    fn pair<C, T>(ctx: &Arc<Context>, shutdown: &Shutdown) -> Vec<BoxFuture<'static, ()>>
    where
        C: super::cluster::InfraCluster,
        T: super::object::Namespaced + crate::contract::InfraTemplateRead,
    {
        vec![
            Box::pin(super::cluster::run::<C>(ctx.clone(), shutdown.clone())),
            Box::pin(super::template::run::<T>(ctx.clone(), shutdown.clone())),
        ]
    }
    match kind {
        k if k == InfraMachineKind::VSphere => {
            pair::<vs::VSphereCluster, vs::VSphereMachineTemplate>(ctx, shutdown)
        }
        k if k == InfraMachineKind::Proxmox => {
            pair::<px::ProxmoxCluster, px::ProxmoxMachineTemplate>(ctx, shutdown)
        }
        k if k == InfraMachineKind::Libvirt => {
            pair::<lv::LibvirtCluster, lv::LibvirtMachineTemplate>(ctx, shutdown)
        }
        k if k == InfraMachineKind::CloudHypervisor => {
            pair::<ch::CloudHypervisorCluster, ch::CloudHypervisorMachineTemplate>(ctx, shutdown)
        }
        _ => Vec::new(),
    }
}
