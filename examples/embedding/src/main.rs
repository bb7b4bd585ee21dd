//! An operator of your own that embeds banlieue.
//!
//! It runs banlieue's controllers (Provider, VirtualMachine, the infrastructure
//! machines, VMImage) in its own process, next to a controller of its own, and serves
//! Providers of its own class, `lab`, with a backend it brings itself (`lab::Lab`, an
//! in-memory stand-in for, say, a company-internal VM API) and a machine kind of its
//! own (`machine::LabMachine`, whose CRD `crd` prints): no change to banlieue for
//! either. Only the `LabMachine` controller runs: the kinds registered are the kinds
//! served. The process around the controllers
//! is `banlieue-runtime`'s, as in `banlieue run`: leader election on a Lease (run two
//! replicas; one reconciles, the other stands by and takes over), `/healthz` and
//! `/readyz` probes, and a graceful shutdown on SIGTERM that drains in-flight
//! reconciles and releases the Lease.
//!
//! Run it against any cluster with banlieue's CRDs and the `LabMachine` CRD installed
//! (`cargo run -p banlieue-example-embedding -- crd | kubectl apply -f -`):
//! `cargo run -p banlieue-example-embedding` (uses your kubeconfig). The environment
//! tunes it: `HEALTH_ADDR` (e.g. `127.0.0.1:8081`; unset, no probe server),
//! `LEASE_NAMESPACE` (default `default`), `LEASE_DURATION`, `RENEW_DEADLINE`,
//! `RETRY_PERIOD` (default `15s`, `10s`, `2s`), and `WATCH_NAMESPACE` (serve only the
//! objects of that namespace; unset, every namespace). Two operators serving the same
//! namespace without sharing a Lease would fight over its machines: each keeps its own
//! lab, so one would find provider IDs the other's lab made.

use banlieue_example_embedding::{CLASS, lab, machine};

use std::sync::Arc;

use banlieue_sdk::api::VirtualMachine;
use banlieue_sdk::api::common::ProviderClass;
use banlieue_sdk::backend::BackendRegistry;
use std::time::Duration;

use anyhow::Context as _;
use banlieue_runtime::RunConfig;
use banlieue_runtime::leader::LeaderConfig;
use banlieue_sdk::controllers::Settings;
use futures::StreamExt;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    if std::env::args().nth(1).as_deref() == Some("crd") {
        use kube::CustomResourceExt;
        print!(
            "{}",
            serde_json::to_string_pretty(&machine::LabMachine::crd())?
        );
        return Ok(());
    }

    // 1. Your backend and your machine kind, for a Provider class of your own.
    let class = ProviderClass::new(CLASS)?;
    let mut registry = BackendRegistry::default();
    registry
        .register(class, Arc::new(lab::LabFactory::default()))
        .register_kind::<machine::LabMachine>(class);

    // 2. banlieue's controllers in banlieue's process: one leader among the replicas,
    //    probes, graceful shutdown.
    // The runtime installs its scrubbing logger by default: credentials (and the
    // session secrets and bootstrap tokens registered while they live) never reach this
    // operator's logs (`logging: Logging::Installed` opts out, for a logger of your own).
    let config = RunConfig {
        health_addr: env("HEALTH_ADDR")
            .map(|a| a.parse())
            .transpose()
            .context("HEALTH_ADDR")?,
        leader: Some(LeaderConfig {
            lease_duration: duration("LEASE_DURATION", "15s")?,
            renew_deadline: duration("RENEW_DEADLINE", "10s")?,
            retry_period: duration("RETRY_PERIOD", "2s")?,
            ..LeaderConfig::new(
                "banlieue-example-embedding",
                env("LEASE_NAMESPACE").unwrap_or_else(|| "default".into()),
            )
        }),
        shutdown_timeout: Duration::from_secs(10),
        settings: Settings {
            namespace: env("WATCH_NAMESPACE"),
            ..Settings::default()
        },
        ..RunConfig::default()
    };
    let banlieue = banlieue_runtime::run(config, registry);

    // 3. A controller of your own, side by side: here it just reports VMs turning Ready.
    let client = Client::try_default().await?;
    let yours = watcher(
        Api::<VirtualMachine>::all(client),
        watcher::Config::default(),
    )
    .applied_objects()
    .for_each(|vm| async move {
        if let Ok(vm) = vm {
            let phase = vm.status.as_ref().and_then(|s| s.phase);
            println!("{} is {phase:?}", vm.name_any());
        }
    });

    tokio::select! {
        result = banlieue => Ok(result?),
        () = yours => Ok(()),
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn duration(name: &str, default: &str) -> anyhow::Result<Duration> {
    let text = env(name).unwrap_or_else(|| default.into());
    banlieue_sdk::duration::parse(&text).with_context(|| format!("{name} {text:?}"))
}
