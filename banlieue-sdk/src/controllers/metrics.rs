//! Prometheus metrics with controller-runtime's names, plus backend request
//! histograms, registered into the binary's registry.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// `controller` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabel {
    /// Controller name, e.g. `virtualmachine`.
    pub controller: String,
}

/// `controller` and `result` labels (`success`, `error`, `requeue`, `requeue_after`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcileLabels {
    /// Controller name.
    pub controller: String,
    /// Outcome.
    pub result: String,
}

/// `class`, `operation` and `outcome` labels of a backend call.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BackendLabels {
    /// Provider class.
    pub class: String,
    /// `check`, `find_image`, `ensure`, `observe`, `delete`.
    pub operation: String,
    /// `ok`, `transient`, `terminal`.
    pub outcome: String,
}

/// `provider` label (`namespace/name`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderLabel {
    /// The Provider, `namespace/name`.
    pub provider: String,
}

/// Every metric the controllers record.
#[derive(Clone)]
pub struct Metrics {
    reconcile_total: Family<ReconcileLabels, Counter>,
    reconcile_errors: Family<ControllerLabel, Counter>,
    reconcile_time: Family<ControllerLabel, Histogram>,
    active_workers: Family<ControllerLabel, Gauge>,
    backend_requests: Family<BackendLabels, Histogram>,
    api_writes: Family<ControllerLabel, Counter>,
    creates_in_flight: Family<ProviderLabel, Gauge>,
    creates_in_flight_peak: Family<ProviderLabel, Gauge>,
}

impl Metrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn new(registry: &mut Registry) -> Self {
        let metrics = Self::unregistered();
        // controller-runtime names (the prometheus-client encoder adds `_total` to counters).
        registry.register(
            "controller_runtime_reconcile",
            "Total number of reconciliations per controller",
            metrics.reconcile_total.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_errors",
            "Total number of reconciliation errors per controller",
            metrics.reconcile_errors.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_time_seconds",
            "Length of time per reconciliation per controller",
            metrics.reconcile_time.clone(),
        );
        registry.register(
            "controller_runtime_active_workers",
            "Number of currently used workers per controller",
            metrics.active_workers.clone(),
        );
        registry.register(
            "banlieue_backend_request_duration_seconds",
            "Duration of backend calls by provider class, operation and outcome",
            metrics.backend_requests.clone(),
        );
        registry.register(
            "banlieue_api_writes",
            "Writes to the Kubernetes API per controller (apply, status, delete, finalizer)",
            metrics.api_writes.clone(),
        );
        registry.register(
            "banlieue_creates_in_flight",
            "Machines being created on each Provider now (capped by its maxConcurrentCreates)",
            metrics.creates_in_flight.clone(),
        );
        registry.register(
            "banlieue_creates_in_flight_peak",
            "The most machines created on each Provider at once since the operator started",
            metrics.creates_in_flight_peak.clone(),
        );
        metrics
    }

    /// Metrics that are recorded but exported nowhere (for tests and embedding).
    pub fn unregistered() -> Self {
        Self {
            reconcile_total: Family::default(),
            reconcile_errors: Family::default(),
            reconcile_time: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.001, 2.0, 16))
            }),
            active_workers: Family::default(),
            backend_requests: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.001, 2.0, 16))
            }),
            api_writes: Family::default(),
            creates_in_flight: Family::default(),
            creates_in_flight_peak: Family::default(),
        }
    }

    pub(crate) fn reconciled(&self, controller: &str, result: &str, took: Duration) {
        self.reconcile_total
            .get_or_create(&ReconcileLabels {
                controller: controller.into(),
                result: result.into(),
            })
            .inc();
        let label = ControllerLabel {
            controller: controller.into(),
        };
        // Created at the first reconcile (as 0), so that a rate over it is 0, not absent.
        let errors = self.reconcile_errors.get_or_create(&label);
        if result == "error" {
            errors.inc();
        }
        self.reconcile_time
            .get_or_create(&label)
            .observe(took.as_secs_f64());
    }

    pub(crate) fn worker(&self, controller: &str) -> WorkerGuard {
        let gauge = self
            .active_workers
            .get_or_create(&ControllerLabel {
                controller: controller.into(),
            })
            .clone();
        gauge.inc();
        WorkerGuard(gauge)
    }

    pub(crate) fn backend_call(&self, class: &str, operation: &str, outcome: &str, took: Duration) {
        self.backend_requests
            .get_or_create(&BackendLabels {
                class: class.into(),
                operation: operation.into(),
                outcome: outcome.into(),
            })
            .observe(took.as_secs_f64());
    }

    pub(crate) fn wrote(&self, controller: &str) {
        self.api_writes
            .get_or_create(&ControllerLabel {
                controller: controller.into(),
            })
            .inc();
    }
}

impl Metrics {
    pub(crate) fn creates(&self, provider: &str, (now, peak): (usize, usize)) {
        let label = ProviderLabel {
            provider: provider.into(),
        };
        let as_gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.creates_in_flight
            .get_or_create(&label)
            .set(as_gauge(now));
        self.creates_in_flight_peak
            .get_or_create(&label)
            .set(as_gauge(peak));
    }
}

/// Decrements the active-worker gauge when dropped.
pub(crate) struct WorkerGuard(Gauge);

impl Drop for WorkerGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}
