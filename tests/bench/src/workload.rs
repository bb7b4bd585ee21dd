//! The workload: a `sim` Provider (with a credentials Secret), a VMClass and a
//! VMImage, then N VirtualMachines created at once and deleted at once, followed
//! through a watch.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use banlieue_sdk::api::{Provider, VMClass, VMImage, VirtualMachine};
use banlieue_sdk::conditions::{self, types};
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Client, ResourceExt as _};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

/// How often progress is sampled.
pub const TICK: Duration = Duration::from_millis(100);

/// Name of the Provider, VMClass and VMImage the VirtualMachines use.
const FIXTURE: &str = "bench";

/// A progress curve: `(seconds since the phase started, count)` at each change, and
/// when the phase finished.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Curve {
    /// Points, in time order.
    pub points: Vec<(f64, f64)>,
    /// Seconds from the phase's start until its goal was reached.
    pub seconds: f64,
}

impl Curve {
    /// Appends `(at, value)` if `value` differs from the last point.
    pub fn record(&mut self, at: f64, value: usize) {
        let value = value as f64;
        if self.points.last().is_none_or(|p| p.1 != value) {
            self.points.push((at, value));
        }
    }

    /// Ends the curve at `at` (with a closing point at the last value).
    pub fn finish(&mut self, at: f64) {
        if let Some(&(_, last)) = self.points.last() {
            self.points.push((at, last));
        }
        self.seconds = at;
    }
}

/// Creates namespace `name`.
pub async fn namespace(client: &Client, name: &str) -> anyhow::Result<()> {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .with_context(|| format!("creating namespace {name}"))?;
    Ok(())
}

fn parse<K: DeserializeOwned>(value: Value) -> anyhow::Result<K> {
    Ok(serde_json::from_value(value)?)
}

/// Creates the `sim` Provider (with `latency`, no capacity limit), VMClass and VMImage in
/// `ns`, and waits (up to `timeout`) until the image is available on the Provider (which
/// implies the Provider is Ready), so that the VirtualMachines' clock starts on a ready
/// system.
pub async fn fixtures(
    client: &Client,
    ns: &str,
    latency: &str,
    timeout: Duration,
) -> anyhow::Result<()> {
    let provider: Provider = parse(json!({
        "metadata": {"name": FIXTURE},
        "spec": {
            "class": "sim",
            // A credentials Secret, as every real backend has, so that the report
            // shows what reading it costs per VM (sim itself ignores it).
            "connection": {"endpoint": format!("sim://{ns}"),
                           "credentialsRef": {"name": FIXTURE}},
            "capabilities": {
                "storageClasses": [{"name": "fast", "target": {"pool": "default"}}],
                "networkClasses": [{"name": "lan", "target": {"network": "default"}}]
            },
            "settings": {"latency": latency}
        }
    }))?;
    let class: VMClass = parse(json!({"metadata": {"name": FIXTURE},
        "spec": {"cpus": 1, "memoryMiB": 512, "disk": {"sizeGiB": 5, "storageClass": "fast"}}}))?;
    let image: VMImage = parse(json!({"metadata": {"name": FIXTURE},
        "spec": {"os": {"family": "linux", "distribution": "debian", "version": "13"},
                 "sources": {"sim": {"name": "debian"}}}}))?;
    let secret: Secret = parse(json!({"metadata": {"name": FIXTURE},
        "stringData": {"username": "bench", "password": "bench-credentials-unused"}}))?;
    let providers: Api<Provider> = Api::namespaced(client.clone(), ns);
    let pp = PostParams::default();
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(&pp, &secret)
        .await
        .context("credentials Secret")?;
    providers.create(&pp, &provider).await.context("Provider")?;
    Api::<VMClass>::all(client.clone())
        .create(&pp, &class)
        .await
        .context("VMClass")?;
    Api::<VMImage>::all(client.clone())
        .create(&pp, &image)
        .await
        .context("VMImage")?;
    let images: Api<VMImage> = Api::all(client.clone());
    let started = Instant::now();
    let mut nudged = false;
    loop {
        let image = images.get(FIXTURE).await?;
        let available = image
            .status
            .as_ref()
            .is_some_and(|s| conditions::is_true(&s.conditions, types::READY));
        if available {
            return Ok(());
        }
        // Workaround for a race in the VMImage controller (see the report): when the
        // Provider turns Ready, the image may be re-evaluated against a Provider cache that
        // has not seen it yet, and then not again until the sync period. A metadata change
        // makes it look again.
        if !nudged && started.elapsed() > NUDGE_AFTER {
            eprintln!("    VMImage not available after {NUDGE_AFTER:?}: nudging it (annotation)");
            images
                .patch(
                    FIXTURE,
                    &PatchParams::default(),
                    &Patch::Merge(
                        json!({"metadata": {"annotations": {"banlieue.io/bench-nudge": "1"}}}),
                    ),
                )
                .await?;
            nudged = true;
        }
        if started.elapsed() >= timeout {
            let provider = providers.get(FIXTURE).await?;
            bail!(
                "VMImage {FIXTURE} not available within {timeout:?}: {:?}; Provider: {:?}",
                image.status,
                provider.status
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// How long the VMImage may take to become available before it is nudged.
const NUDGE_AFTER: Duration = Duration::from_secs(10);

/// The name of VirtualMachine `i`.
pub fn vm_name(i: usize) -> String {
    format!("vm-{i:05}")
}

/// VirtualMachine `i` of the workload, using the fixtures.
pub fn vm(i: usize) -> anyhow::Result<VirtualMachine> {
    parse(json!({
        "metadata": {"name": vm_name(i), "labels": {"app": "bench"}},
        "spec": {"classRef": {"name": FIXTURE}, "imageRef": {"name": FIXTURE},
                 "networks": [{"name": "eth0", "networkClass": "lan"}]}
    }))
}

/// Creates VirtualMachines `0..n` in `ns`, `concurrency` requests in flight.
pub async fn create_all(
    client: Client,
    ns: String,
    n: usize,
    concurrency: usize,
) -> anyhow::Result<()> {
    let api: Api<VirtualMachine> = Api::namespaced(client, &ns);
    futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                api.create(&PostParams::default(), &vm(i)?)
                    .await
                    .with_context(|| format!("creating {}", vm_name(i)))?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(concurrency)
        .try_collect::<()>()
        .await
}

/// Deletes VirtualMachines `0..n` in `ns`, `concurrency` requests in flight.
pub async fn delete_all(
    client: Client,
    ns: String,
    n: usize,
    concurrency: usize,
) -> anyhow::Result<()> {
    let api: Api<VirtualMachine> = Api::namespaced(client, &ns);
    futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                api.delete(&vm_name(i), &DeleteParams::background())
                    .await
                    .with_context(|| format!("deleting {}", vm_name(i)))?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(concurrency)
        .try_collect::<()>()
        .await
}

/// Whether a VirtualMachine's Ready condition is True.
pub fn is_ready(vm: &VirtualMachine) -> bool {
    vm.status
        .as_ref()
        .is_some_and(|s| conditions::is_true(&s.conditions, types::READY))
}

/// A live local copy of one namespace's VirtualMachines (one list, then a watch).
pub struct Tracker {
    store: Store<VirtualMachine>,
    task: JoinHandle<()>,
}

impl Tracker {
    /// Starts watching `ns`; returns once the initial list has arrived.
    pub async fn start(client: Client, ns: &str) -> anyhow::Result<Self> {
        let (store, writer) = reflector::store();
        let api: Api<VirtualMachine> = Api::namespaced(client, ns);
        let stream = reflector::reflector(
            writer,
            watcher(api, watcher::Config::default()).default_backoff(),
        );
        let task = tokio::spawn(stream.for_each(|_| futures::future::ready(())));
        tokio::time::timeout(Duration::from_secs(30), store.wait_until_ready())
            .await
            .context("the VirtualMachine watch did not sync")??;
        Ok(Self { store, task })
    }

    /// Samples `measure` over the store every [`TICK`] from `started` until `done` holds
    /// (or `timeout` passes: an error saying how far it got).
    pub async fn follow(
        &self,
        started: Instant,
        timeout: Duration,
        measure: impl Fn(&[Arc<VirtualMachine>]) -> usize,
        done: impl Fn(usize) -> bool,
    ) -> anyhow::Result<Curve> {
        let mut curve = Curve::default();
        loop {
            let value = measure(&self.store.state());
            let at = started.elapsed().as_secs_f64();
            curve.record(at, value);
            if done(value) {
                curve.finish(at);
                return Ok(curve);
            }
            if started.elapsed() >= timeout {
                bail!("timed out after {timeout:?} at {value}");
            }
            tokio::time::sleep(TICK).await;
        }
    }

    /// Names of up to `limit` VirtualMachines that are not Ready, for error messages.
    pub fn not_ready(&self, limit: usize) -> Vec<String> {
        self.store
            .state()
            .iter()
            .filter(|vm| !is_ready(vm))
            .take(limit)
            .map(|vm| vm.name_any())
            .collect()
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        self.task.abort();
    }
}
