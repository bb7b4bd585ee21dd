//! An in-process operator that can be killed without warning, for crash-safety tests.
//!
//! Each incarnation runs the controllers on a Tokio runtime of its own, with a kube
//! client built inside it. [`CrashableOperator::kill`] drops that runtime with
//! `shutdown_background`: every task the operator spawned (controllers, watches, the
//! client's connection tasks) stops at its next suspension point and no shutdown code
//! runs — a request already sent may or may not have reached the apiserver, exactly as
//! with SIGKILL. The backends' factories live in the test and outlive incarnations, the
//! way a hypervisor outlives the operator process.

use std::time::Duration;

use banlieue_sdk::backend::BackendRegistry;
use banlieue_sdk::controllers::{self, Concurrency, Metrics, Readiness, Settings};
use tokio::runtime::Runtime;

/// One incarnation of the operator, watching one namespace.
pub struct CrashableOperator {
    runtime: Option<Runtime>,
    finished: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl CrashableOperator {
    /// Starts the controllers for `namespace` with `registry`'s backends on a fresh
    /// two-worker runtime.
    ///
    /// # Panics
    /// If the runtime or the client cannot be built (a test-harness bug).
    pub fn start(
        config: kube::Config,
        namespace: &str,
        registry: BackendRegistry,
        sync_period: Duration,
    ) -> Self {
        init_logging();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("crashable-operator")
            .enable_all()
            .build()
            .expect("operator runtime");
        let settings = Settings {
            namespace: Some(namespace.to_owned()),
            watch_filter: None,
            sync_period,
            concurrency: Concurrency::default(),
            ..Settings::default()
        };
        let finished = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let done = finished.clone();
        runtime.spawn(async move {
            let client = kube::Client::try_from(config).expect("operator client");
            controllers::run(
                client,
                registry,
                settings,
                std::sync::Arc::new(Metrics::unregistered()),
                Readiness::default(),
                std::future::pending::<()>(),
            )
            .await;
            done.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        Self {
            runtime: Some(runtime),
            finished,
        }
    }

    /// Whether the controllers returned on their own (they never should: an operator
    /// that gives up after an outage is a crash loop waiting to happen).
    pub fn has_exited(&self) -> bool {
        self.finished.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Kills this incarnation abruptly (see the module doc).
    pub fn kill(mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Drop for CrashableOperator {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// `BANLIEUE_TEST_LOG=<filter>` (e.g. `info,kube=debug`) prints the operator's logs.
pub(crate) fn init_logging() {
    if let Ok(filter) = std::env::var("BANLIEUE_TEST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_test_writer()
            .try_init();
    }
}
