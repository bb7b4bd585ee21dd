//! Ties the pieces of an operator process together: client, probes, metrics, leader
//! election and the SDK's controllers, and decides how the process ends.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use banlieue_sdk::backend::BackendRegistry;
use banlieue_sdk::controllers::{self, Metrics, Readiness, Settings};
use prometheus_client::registry::Registry;

use crate::client::ClientConfig;
use crate::leader::{LeaderConfig, LeaderElection, LeaderStatus};
use crate::logging::Logging;
use crate::shutdown::{Stop, StopReason};
use crate::{client, diagnostics, health, shutdown};

/// Everything the process was told (for `banlieue run`: its flags). The default is
/// what `banlieue run` does with no flags but one: no leader election (set
/// [`RunConfig::leader`], e.g. `Some(LeaderConfig::new("my-operator", "my-namespace"))`),
/// no probe or diagnostics server, a 5 s graceful shutdown, the SDK's default
/// [`Settings`], and the scrubbing logger installed:
///
/// ```no_run
/// # async fn embed(registry: banlieue_sdk::backend::BackendRegistry) -> banlieue_runtime::Result<()> {
/// use banlieue_runtime::{RunConfig, leader::LeaderConfig};
///
/// let config = RunConfig {
///     health_addr: Some("127.0.0.1:8081".parse().expect("an address")),
///     leader: Some(LeaderConfig::new("my-operator", "my-namespace")),
///     ..RunConfig::default()
/// };
/// banlieue_runtime::run(config, registry).await
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// How to reach the apiserver.
    pub client: ClientConfig,
    /// `--health-addr` (`None`: disabled).
    pub health_addr: Option<SocketAddr>,
    /// `--diagnostics-address` (`None`: disabled).
    pub diagnostics_addr: Option<SocketAddr>,
    /// `--insecure-diagnostics`: plain HTTP and no authentication on the diagnostics
    /// server.
    pub insecure_diagnostics: bool,
    /// Leader election, when `--leader-elect`.
    pub leader: Option<LeaderConfig>,
    /// `--graceful-shutdown-timeout`: how long in-flight reconciles get after
    /// SIGTERM/SIGINT.
    pub shutdown_timeout: Duration,
    /// What the controllers watch and how.
    pub settings: Settings,
    /// Who installs the logger: by default [`run`] installs the scrubbing one.
    pub logging: Logging,
}

impl Default for RunConfig {
    fn default() -> Self {
        Self {
            client: ClientConfig::default(),
            health_addr: None,
            diagnostics_addr: None,
            insecure_diagnostics: false,
            leader: None,
            shutdown_timeout: Duration::from_secs(5),
            settings: Settings::default(),
            logging: Logging::default(),
        }
    }
}

/// Runs the controllers for the backends in `registry` until SIGTERM/SIGINT (`Ok`,
/// after draining and releasing the Lease) or until leadership is lost or the
/// controllers die (`Err`: exit non-zero, the pod restarts cleanly).
pub async fn run(config: RunConfig, registry: BackendRegistry) -> crate::Result<()> {
    config.logging.apply()?;
    let classes: Vec<&str> = registry.classes().map(|c| c.as_str()).collect();
    tracing::info!(
        backends = %classes.join(", "),
        namespace = config.settings.namespace.as_deref().unwrap_or("(all)"),
        watch_filter = config.settings.watch_filter.as_deref().unwrap_or("(none)"),
        sync_period = ?config.settings.sync_period,
        provider_concurrency = config.settings.concurrency.provider,
        virtualmachine_concurrency = config.settings.concurrency.virtual_machine,
        machine_concurrency = config.settings.concurrency.machine,
        image_concurrency = config.settings.concurrency.image,
        staging_dir = %config.settings.staging_dir.display(),
        leader_election = config.leader.is_some(),
        "starting the operator"
    );
    if registry.classes().next().is_none() {
        tracing::warn!("no backend adapter compiled in: no Provider can become ready");
    }

    let mut metrics_registry = Registry::default();
    let client = client::build(&config.client, &mut metrics_registry).await?;
    let metrics = Arc::new(Metrics::new(&mut metrics_registry));
    let readiness = Readiness::default();
    let stop = Stop::default();
    shutdown::on_signals(stop.clone())?;

    let leader_status = config
        .leader
        .as_ref()
        .map(|leader| LeaderStatus::registered(&mut metrics_registry, &leader.lease_name));
    if let Some(addr) = config.health_addr {
        health::serve(addr, readiness.clone(), leader_status.clone()).await?;
    }
    if let Some(addr) = config.diagnostics_addr {
        let security = if config.insecure_diagnostics {
            diagnostics::Security::Insecure
        } else {
            diagnostics::Security::Secure(client.clone())
        };
        diagnostics::serve(addr, Arc::new(metrics_registry), security).await?;
    }

    let election = match (&config.leader, leader_status) {
        (Some(leader), Some(status)) => {
            Some(LeaderElection::new(client.clone(), leader, status).await?)
        }
        _ => None,
    };
    if let Some(election) = &election {
        tokio::select! {
            () = election.acquire() => {}
            () = stop.wait() => {
                election.release().await;
                tracing::info!(reason = %stop.reason().map(|r| r.to_string()).unwrap_or_default(), "stopped before becoming the leader");
                return Ok(());
            }
        }
    }

    tracing::info!("starting the controllers");
    let mut running = tokio::spawn(controllers::run(
        client,
        registry,
        config.settings,
        metrics,
        readiness,
        stop.wait(),
    ));

    // Boxed so that it can be dropped before `release`: a renewal suspended
    // mid-request holds kube-lease-manager's state lock, which `release` needs.
    let mut hold = Box::pin(hold_lease(election.as_ref()));
    let mut holding = true;
    // A JoinHandle must not be polled again once it has completed: when a signal and
    // the controllers' own return race, either branch may win.
    let mut controllers_returned = false;
    tokio::select! {
        () = stop.wait() => {}
        why = &mut hold => {
            holding = false;
            stop.trigger(StopReason::LeadershipLost(why));
        }
        result = &mut running => {
            controllers_returned = true;
            let why = match result {
                Ok(()) => "returned".to_string(),
                Err(error) => error.to_string(),
            };
            stop.trigger(StopReason::ControllersExited(why));
        }
    }
    let reason = stop
        .reason()
        .unwrap_or(StopReason::ControllersExited("unknown".into()));
    match reason {
        StopReason::Signal(_) => {
            let timeout = config.shutdown_timeout;
            tracing::info!(%reason, ?timeout, "stopping the controllers");
            // Keep renewing the Lease while draining, so no other replica starts early.
            if !controllers_returned {
                tokio::select! {
                    drained = tokio::time::timeout(timeout, &mut running) => {
                        if drained.is_err() {
                            // Dropped mid-way, as a crash would leave them: every reconcile
                            // finds its backend VM again. Stopped before the Lease goes, so
                            // that two replicas never reconcile at once.
                            running.abort();
                            let _ = (&mut running).await;
                            tracing::warn!(?timeout, "in-flight reconciles did not finish in time; dropped them");
                        }
                    }
                    why = &mut hold, if holding => {
                        return Err(crate::Error::Stopped(StopReason::LeadershipLost(why)));
                    }
                }
            }
            drop(hold);
            if let Some(election) = &election {
                election.release().await;
            }
            tracing::info!("stopped");
            Ok(())
        }
        // Like a controller-runtime manager: no graceful drain once the Lease is gone,
        // since another replica may already be reconciling.
        StopReason::LeadershipLost(_) => Err(crate::Error::Stopped(reason)),
        StopReason::ControllersExited(_) => {
            drop(hold);
            if let Some(election) = &election {
                election.release().await;
            }
            Err(crate::Error::Stopped(reason))
        }
    }
}

/// Renews the Lease until it is lost (never completes without leader election).
async fn hold_lease(election: Option<&LeaderElection>) -> String {
    match election {
        Some(election) => election.hold().await,
        None => std::future::pending().await,
    }
}
