//! An operator of your own that embeds banlieue.
//!
//! It runs banlieue's controllers (Provider, VirtualMachine, the infrastructure
//! machines, VMImage) in its own process, next to a controller of its own, and serves
//! `libvirt`-class Providers with a backend it brings itself (`lab::Lab`, an in-memory
//! stand-in for, say, a company-internal VM API). Nothing here is banlieue-specific
//! plumbing: the SDK's `Backend` trait, `BackendRegistry` and `controllers::run` are
//! the whole interface.
//!
//! Run it against any cluster with banlieue's CRDs installed:
//! `cargo run -p banlieue-example-embedding` (uses your kubeconfig).

mod lab;

use std::sync::Arc;

use banlieue_sdk::api::VirtualMachine;
use banlieue_sdk::api::common::ProviderClass;
use banlieue_sdk::backend::BackendRegistry;
use banlieue_sdk::controllers::{self, Metrics, Readiness, Settings};
use futures::StreamExt;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let client = Client::try_default().await?;

    // 1. Your backend, for the Provider class you choose.
    let mut registry = BackendRegistry::default();
    registry.register(ProviderClass::Libvirt, Arc::new(lab::LabFactory::default()));

    // 2. banlieue's controllers, with your settings and your metrics registry.
    let mut prometheus = prometheus_registry();
    let metrics = Arc::new(Metrics::new(&mut prometheus));
    let banlieue = controllers::run(
        client.clone(),
        registry,
        Settings::default(),
        metrics,
        Readiness::default(),
        async {
            let _ = tokio::signal::ctrl_c().await;
        },
    );

    // 3. A controller of your own, side by side: here it just reports VMs turning Ready.
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
        () = banlieue => {},
        () = yours => {},
    }
    Ok(())
}

fn prometheus_registry() -> banlieue_sdk::controllers::PrometheusRegistry {
    banlieue_sdk::controllers::PrometheusRegistry::default()
}
