//! Lease-based leader election (`--leader-elect`), on kube-lease-manager.
//!
//! Only the replica holding the Lease runs the controllers. The mapping of
//! controller-runtime's timing flags onto kube-lease-manager's whole-second
//! parameters:
//!
//! - `--leader-elect-lease-duration` is the Lease's `leaseDurationSeconds`: how long
//!   other replicas wait after the last renewal before taking over;
//! - `--leader-elect-renew-deadline`: the holder renews this long after its last
//!   renewal, i.e. `lease duration - renew deadline` (kube-lease-manager's "grace")
//!   before the Lease would expire;
//! - `--leader-elect-retry-period`: how often a waiting replica reads the Lease, and
//!   the pause between attempts after an API error. kube-lease-manager alone sleeps
//!   until the holder's Lease would expire; a Lease *released* by a holder shutting
//!   down gracefully is seen at the next read and taken at once, as client-go's
//!   candidates do (they retry every retry period).
//!
//! A renewal that fails with an API error counts as lost leadership: the holder
//! cannot know whether the Lease is still its own, so it stops, as a
//! controller-runtime manager does when its renew deadline passes.

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};

/// Leader election settings.
#[derive(Clone, Debug)]
pub struct LeaderConfig {
    /// Name of the Lease.
    pub lease_name: String,
    /// Namespace of the Lease.
    pub namespace: String,
    /// `--leader-elect-lease-duration`.
    pub lease_duration: Duration,
    /// `--leader-elect-renew-deadline`.
    pub renew_deadline: Duration,
    /// `--leader-elect-retry-period`.
    pub retry_period: Duration,
}

impl LeaderConfig {
    /// Election on Lease `lease_name` in `namespace`, with `banlieue run`'s default
    /// timings (15 s lease, 10 s renew deadline, 2 s retry period), as client-go's.
    pub fn new(lease_name: impl Into<String>, namespace: impl Into<String>) -> Self {
        Self {
            lease_name: lease_name.into(),
            namespace: namespace.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// kube-lease-manager's `(duration, grace)` in whole seconds, or why the timing
    /// flags do not fit together.
    pub fn lease_seconds(&self) -> Result<(u64, u64), String> {
        let duration = self.lease_duration.as_secs();
        let renew = self.renew_deadline.as_secs();
        if self.retry_period.is_zero() {
            return Err("--leader-elect-retry-period must be positive".into());
        }
        if renew == 0 {
            return Err("--leader-elect-renew-deadline must be at least 1s".into());
        }
        if duration <= renew {
            return Err(format!(
                "--leader-elect-lease-duration ({duration}s) must be longer than --leader-elect-renew-deadline ({renew}s) by at least 1s"
            ));
        }
        Ok((duration, duration - renew))
    }
}

/// Whether this replica holds the Lease; cheap to clone and read (for `/readyz`), and
/// exported as client-go's `leader_election_master_status{name}` (1 while leading).
#[derive(Clone, Debug, Default)]
pub struct LeaderStatus {
    leading: Arc<AtomicBool>,
    gauge: Gauge,
}

/// `name`: the Lease's.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LeaseLabel {
    name: String,
}

impl LeaderStatus {
    /// A status whose gauge is registered in `registry` for the Lease `lease_name`.
    pub fn registered(registry: &mut Registry, lease_name: &str) -> Self {
        let family = Family::<LeaseLabel, Gauge>::default();
        registry.register(
            "leader_election_master_status",
            "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease.",
            family.clone(),
        );
        let gauge = family
            .get_or_create(&LeaseLabel {
                name: lease_name.to_owned(),
            })
            .clone();
        Self {
            leading: Arc::default(),
            gauge,
        }
    }

    /// True while this replica holds the Lease.
    pub fn is_leader(&self) -> bool {
        self.leading.load(Ordering::SeqCst)
    }

    fn set(&self, leader: bool) {
        self.leading.store(leader, Ordering::SeqCst);
        self.gauge.set(i64::from(leader));
    }
}

/// One replica's participation in the election.
pub struct LeaderElection {
    /// Replaced when the Lease is seen released, so that its state is read afresh.
    manager: Mutex<Arc<LeaseManager>>,
    client: kube::Client,
    leases: Api<Lease>,
    config: LeaderConfig,
    identity: String,
    status: LeaderStatus,
}

impl LeaderElection {
    /// Creates the Lease if it does not exist yet (without taking it). `status`
    /// follows this replica's leadership from then on.
    pub async fn new(
        client: kube::Client,
        config: &LeaderConfig,
        status: LeaderStatus,
    ) -> crate::Result<Self> {
        let (duration, grace) = config.lease_seconds().map_err(crate::Error::Leader)?;
        let identity = identity();
        let manager = build_manager(&client, config, &identity).await?;
        tracing::info!(
            lease = %config.lease_name, namespace = %config.namespace, %identity,
            lease_duration_seconds = duration, renew_before_expiry_seconds = grace,
            "leader election prepared"
        );
        Ok(Self {
            manager: Mutex::new(Arc::new(manager)),
            leases: Api::namespaced(client.clone(), &config.namespace),
            client,
            config: config.clone(),
            identity,
            status,
        })
    }

    fn manager(&self) -> Arc<LeaseManager> {
        self.manager
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Waits until this replica holds the Lease, retrying API errors every retry period.
    pub async fn acquire(&self) {
        tracing::info!(identity = %self.identity, "waiting to become the leader");
        let retry = self.config.retry_period;
        loop {
            let manager = self.manager();
            let changed = tokio::select! {
                changed = manager.changed() => changed,
                () = self.released() => {
                    // kube-lease-manager would sleep until the old holder's expiry; a
                    // fresh manager reads the Lease again and takes it now.
                    match build_manager(&self.client, &self.config, &self.identity).await {
                        Ok(fresh) => {
                            tracing::info!("the Lease was released; taking it");
                            *self.manager.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(fresh);
                        }
                        Err(error) => {
                            tracing::warn!(error = format!("{error:#}"), retry_in = ?retry, "leader election: cannot read the Lease");
                            tokio::time::sleep(retry).await;
                        }
                    }
                    continue;
                }
            };
            match changed {
                Ok(true) => break,
                Ok(false) => {}
                Err(error) => {
                    tracing::warn!(%error, retry_in = ?retry, "leader election: cannot take the Lease");
                    tokio::time::sleep(retry).await;
                }
            }
        }
        self.status.set(true);
        tracing::info!(identity = %self.identity, "became the leader");
    }

    /// Completes once the Lease has no holder (read every retry period).
    async fn released(&self) {
        loop {
            tokio::time::sleep(self.config.retry_period).await;
            if let Ok(lease) = self.leases.get(&self.config.lease_name).await
                && lease.spec.and_then(|s| s.holder_identity).is_none()
            {
                return;
            }
        }
    }

    /// Keeps renewing the Lease; returns why leadership was lost. Cancel-safe: drop
    /// the future to stop renewing.
    pub async fn hold(&self) -> String {
        let manager = self.manager();
        let reason = loop {
            match manager.changed().await {
                Ok(false) => break "another replica took the Lease".to_string(),
                Ok(true) => {}
                Err(error) => break format!("renewing the Lease failed: {error}"),
            }
        };
        self.status.set(false);
        reason
    }

    /// Gives the Lease up (if held), so that another replica takes over at once.
    pub async fn release(&self) {
        let was_leader = self.status.is_leader();
        self.status.set(false);
        match self.manager().release().await {
            Ok(()) if was_leader => tracing::info!(identity = %self.identity, "released the Lease"),
            Ok(()) => {}
            Err(error) => tracing::warn!(%error, "releasing the Lease"),
        }
    }
}

/// A kube-lease-manager for `identity`; creates the Lease if it does not exist yet.
async fn build_manager(
    client: &kube::Client,
    config: &LeaderConfig,
    identity: &str,
) -> crate::Result<LeaseManager> {
    let (duration, grace) = config.lease_seconds().map_err(crate::Error::Leader)?;
    LeaseManagerBuilder::new(client.clone(), &config.lease_name)
        .with_namespace(&config.namespace)
        .with_identity(identity)
        .with_duration(duration)
        .with_grace(grace)
        // The field manager stays per identity (kube-lease-manager-<identity>):
        // server-side apply conflicts between replicas are what make the lock safe.
        .build()
        .await
        .map_err(|e| {
            crate::Error::Leader(format!(
                "preparing Lease {}/{}: {e}",
                config.namespace, config.lease_name
            ))
        })
}

/// `<hostname>_<random>`: the pod name in a cluster, unique per process.
fn identity() -> String {
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "banlieue".into());
    let random = RandomState::new().hash_one((std::process::id(), std::time::SystemTime::now()));
    format!("{host}_{random:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(lease: u64, renew: u64, retry: u64) -> LeaderConfig {
        LeaderConfig {
            lease_name: "banlieue-leader-election".into(),
            namespace: "banlieue-system".into(),
            lease_duration: Duration::from_secs(lease),
            renew_deadline: Duration::from_secs(renew),
            retry_period: Duration::from_secs(retry),
        }
    }

    #[test]
    fn defaults_map_to_fifteen_seconds_renewed_five_before_expiry() {
        assert_eq!(config(15, 10, 2).lease_seconds(), Ok((15, 5)));
    }

    #[test]
    fn inconsistent_timing_is_rejected() {
        assert!(config(10, 10, 2).lease_seconds().is_err());
        assert!(config(10, 15, 2).lease_seconds().is_err());
        assert!(config(15, 0, 2).lease_seconds().is_err());
        assert!(config(15, 10, 0).lease_seconds().is_err());
    }

    #[test]
    fn identities_differ() {
        assert_ne!(identity(), identity());
    }
}
