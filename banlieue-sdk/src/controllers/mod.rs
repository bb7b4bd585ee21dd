//! banlieue's controllers (feature `controllers`): Provider, VirtualMachine, VMImage,
//! and the Cluster API side: one generic controller per registered infrastructure
//! machine kind (the registry's [`crate::contract::KindTable`]), and for banlieue's own
//! kinds one per InfraCluster kind (failure domains across Providers) and per machine
//! template kind (capacity for scale-from-zero).
//!
//! Each reconciler is thin: it fetches, calls the pure functions of
//! [`crate::scheduling`], [`crate::builder`] and [`crate::status`], applies what it
//! builds with server-side apply under a named field manager, and writes status only
//! when it changed, as a merge patch of what changed (ADR 0013).
//!
//! Embedding them in another operator:
//!
//! ```no_run
//! # async fn embed(client: kube::Client) -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use banlieue_sdk::backend::BackendRegistry;
//! use banlieue_sdk::controllers::{self, Metrics, Readiness, Settings};
//!
//! let registry = BackendRegistry::default(); // register your backends here
//! let readiness = Readiness::default();
//! let metrics = Arc::new(Metrics::unregistered());
//! controllers::run(client, registry, Settings::default(), metrics, readiness, std::future::pending()).await;
//! # Ok(()) }
//! ```

mod backends;
mod bootstrap;
mod capi;
mod capi_cache;
mod claims;
mod cluster;
mod context;
mod create_slots;
pub mod disk_copy;
mod echoes;
mod events;
mod expected;
mod failure_backoff;
mod feed;
mod image;
mod infra;
mod kernel;
pub(crate) mod kinds;
mod machine;
mod machine_cache;
mod metrics;
mod object;
mod orphan_backend;
mod placements;
mod provider;
mod status_patch;
mod status_write;
mod synced;
mod template;
mod unseen;
mod virtual_machine;
mod watch;
mod written;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::future::join_all;
use kube::Client;

use crate::backend::BackendRegistry;

pub use metrics::Metrics;
/// The Prometheus registry [`Metrics::new`] registers into.
pub use prometheus_client::registry::Registry as PrometheusRegistry;

/// Finalizer on VirtualMachines: the infra machine must be gone first.
pub const VIRTUAL_MACHINE_FINALIZER: &str = "banlieue.io/virtual-machine";
/// Finalizer on infra machines: the backend VM must be gone first.
pub const MACHINE_FINALIZER: &str = "infrastructure.banlieue.io/machine";

/// Annotation that lets an infra machine, a VirtualMachine or a Provider being deleted
/// go without deleting its backend VMs (value `"true"`): the escape when a backend
/// refuses the delete or a Provider cannot be had. Every VM left behind is named, with
/// its providerID, backend handle, Provider and machine UID, in a Warning Event
/// (`BackendVMAbandoned`) and a log line.
pub const ORPHAN_BACKEND_ANNOTATION: &str = "banlieue.io/orphan-backend";

/// How the controllers run.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Watch only this namespace (all when `None`).
    pub namespace: Option<String>,
    /// Only reconcile objects labelled `cluster.x-k8s.io/watch-filter=<value>`.
    pub watch_filter: Option<String>,
    /// How often a settled object is looked at again (backend drift, Provider re-check).
    pub sync_period: Duration,
    /// Parallel reconciles per controller.
    pub concurrency: Concurrency,
    /// Where `CopyDisk` stages disks between export and import (a directory per VM,
    /// removed after): an emptyDir or PVC in the Deployment, as large as the largest
    /// VM's disks twice over (the export and its conversion).
    pub staging_dir: std::path::PathBuf,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            namespace: None,
            watch_filter: None,
            sync_period: Duration::from_secs(600),
            concurrency: Concurrency::default(),
            staging_dir: std::env::temp_dir().join("banlieue-staging"),
        }
    }
}

/// Parallel reconciles per controller.
#[derive(Clone, Copy, Debug)]
pub struct Concurrency {
    /// Provider controller.
    pub provider: u16,
    /// VirtualMachine controller.
    pub virtual_machine: u16,
    /// Each infra machine controller.
    pub machine: u16,
    /// VMImage controller.
    pub image: u16,
}

impl Default for Concurrency {
    fn default() -> Self {
        Self {
            provider: 4,
            virtual_machine: 16,
            machine: 16,
            image: 2,
        }
    }
}

/// Whether every controller's caches have synced (for `/readyz`).
#[derive(Clone, Debug, Default)]
pub struct Readiness {
    synced: Arc<AtomicUsize>,
    expected: Arc<AtomicUsize>,
}

impl Readiness {
    /// True once every started controller has synced its caches.
    pub fn is_ready(&self) -> bool {
        let expected = self.expected.load(Ordering::SeqCst);
        expected > 0 && self.synced.load(Ordering::SeqCst) >= expected
    }

    pub(crate) fn expect(&self, n: usize) {
        self.expected.store(n, Ordering::SeqCst);
    }

    pub(crate) fn synced(&self) {
        self.synced.fetch_add(1, Ordering::SeqCst);
    }
}

/// Runs every controller until `shutdown` completes (then they drain and stop).
pub async fn run(
    client: Client,
    registry: BackendRegistry,
    settings: Settings,
    metrics: Arc<Metrics>,
    readiness: Readiness,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let capi_installed = capi::installed(&client).await;
    tracing::info!(
        capi_installed,
        "Cluster API cluster.x-k8s.io/v1beta2 served"
    );
    let ctx = context::Context::new(
        client,
        registry,
        settings,
        metrics,
        readiness.clone(),
        capi_installed,
    );
    tracing::info!(
        kinds = ?ctx.kinds.kinds().map(|k| k.kind()).collect::<Vec<_>>(),
        "infrastructure machine kinds served"
    );
    let shutdown: kinds::Shutdown =
        futures::future::FutureExt::shared(Box::pin(shutdown) as std::pin::Pin<Box<_>>);
    let mut tasks: Vec<std::pin::Pin<Box<dyn Future<Output = ()> + Send>>> = vec![
        Box::pin(ctx.clone().start_stores(shutdown.clone())),
        Box::pin(provider::run(ctx.clone(), shutdown.clone())),
        Box::pin(virtual_machine::run(ctx.clone(), shutdown.clone())),
        Box::pin(image::run(ctx.clone(), shutdown.clone())),
    ];
    // Every registered infra machine kind, on its shared watch (see `feed`).
    for kind in &ctx.stores.machines {
        tasks.extend(kind.controllers(ctx.clone(), shutdown.clone()));
    }
    // Ready once the shared caches (Providers, classes, images, every infra kind) have
    // listed; the controllers watch the same kinds.
    readiness.expect(1);
    join_all(tasks).await;
}
