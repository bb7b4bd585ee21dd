//! Running banlieue's controllers in-process against the test control plane, with the
//! simulated backend, scoped to one test namespace.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant};

use banlieue_backend_sim::SimFactory;
use banlieue_sdk::api::common::ProviderClass;
use banlieue_sdk::backend::BackendRegistry;
use banlieue_sdk::controllers::{self, Concurrency, Metrics, Readiness, Settings};
use kube::api::Api;
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::oneshot;

/// Controllers running for one namespace; stopped on drop.
pub struct Operator {
    /// The simulator behind every `sim` Provider, for inspecting backend state.
    pub sim: Arc<SimFactory>,
    /// Cache-sync state.
    pub readiness: Readiness,
    stop: Option<oneshot::Sender<()>>,
    /// The namespace whose messages are checked on drop (see [`crate::messages`]), and
    /// a client of its control plane.
    namespace: String,
    client: Client,
}

impl Operator {
    /// Starts every controller watching only `namespace`, with a short sync period.
    pub fn start(client: Client, namespace: &str) -> Self {
        Self::start_with(client, namespace, Duration::from_secs(30))
    }

    /// As [`Operator::start`], with a given sync period.
    pub fn start_with(client: Client, namespace: &str, sync_period: Duration) -> Self {
        let sim = Arc::new(SimFactory::new());
        let mut registry = BackendRegistry::default();
        registry.register(ProviderClass::Sim, sim.clone());
        Self::start_with_registry(client, namespace, registry, sim, sync_period)
    }

    /// As [`Operator::start_with`], with the caller's backends (e.g. a Proxmox
    /// factory); `sim` is the factory reported in [`Operator::sim`].
    pub fn start_with_registry(
        client: Client,
        namespace: &str,
        registry: BackendRegistry,
        sim: Arc<SimFactory>,
        sync_period: Duration,
    ) -> Self {
        crate::crashable::init_logging();
        let settings = Settings {
            namespace: Some(namespace.to_owned()),
            watch_filter: None,
            sync_period,
            concurrency: Concurrency::default(),
            ..Settings::default()
        };
        let checker = client.clone();
        let readiness = Readiness::default();
        let (stop, stopped) = oneshot::channel::<()>();
        let shutdown = async move {
            let _ = stopped.await;
        };
        tokio::spawn(controllers::run(
            client,
            registry,
            settings,
            Arc::new(Metrics::unregistered()),
            readiness.clone(),
            shutdown,
        ));
        Self {
            sim,
            readiness,
            stop: Some(stop),
            namespace: namespace.to_owned(),
            client: checker,
        }
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // Every message the scenario produced must read as prose. The check runs on a
        // thread of its own (this may run inside the test's runtime, which cannot block
        // on a request), through the test's client, served by the test runtime's workers:
        // only a multi-threaded runtime has workers free while this thread waits.
        let served = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        if std::thread::panicking() || self.namespace.is_empty() || !served {
            return;
        }
        let namespace = std::mem::take(&mut self.namespace);
        let client = self.client.clone();
        let found = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the message check");
            runtime.block_on(async {
                // A control plane stopped by the test answers nothing: no check then.
                tokio::time::timeout(
                    Duration::from_secs(20),
                    crate::messages::debug_texts(&client, &namespace),
                )
                .await
                .unwrap_or_default()
            })
        })
        .join()
        .expect("the message check");
        assert!(
            found.is_empty(),
            "messages for users show Rust debug formatting:\n  {}",
            found.join("\n  ")
        );
    }
}

/// Polls `name` until `done` holds, or panics after `timeout` showing the last state.
pub async fn wait_for<K>(
    api: &Api<K>,
    name: &str,
    timeout: Duration,
    done: impl Fn(&K) -> bool,
) -> K
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let started = Instant::now();
    let mut last = None;
    while started.elapsed() < timeout {
        match api.get_opt(name).await {
            Ok(Some(object)) if done(&object) => return object,
            Ok(object) => last = Some(format!("{object:#?}")),
            Err(error) => last = Some(format!("error: {error}")),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!(
        "timed out after {timeout:?} waiting for {name}; last seen:\n{}",
        last.unwrap_or_default()
    );
}

/// Polls until `name` no longer exists, or panics after `timeout`.
pub async fn wait_gone<K>(api: &Api<K>, name: &str, timeout: Duration)
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let started = Instant::now();
    while started.elapsed() < timeout {
        if api.get_opt(name).await.expect("get").is_none() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let last = api.get_opt(name).await.expect("get");
    panic!("{name} still exists after {timeout:?}: {last:#?}");
}
