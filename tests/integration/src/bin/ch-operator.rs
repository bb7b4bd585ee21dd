//! banlieue's controllers with the Cloud Hypervisor backend for one namespace, as a
//! process of its own, so a test can `kill -9` the operator and start another one:
//! `ch-operator <kubeconfig> <namespace>`. Runs until killed.

use std::sync::Arc;
use std::time::Duration;

use banlieue_backend_cloud_hypervisor::ChFactory;
use banlieue_backend_sim::SimFactory;
use banlieue_integration_tests::operator::Operator;
use banlieue_sdk::api::common::ProviderClass;
use banlieue_sdk::backend::BackendRegistry;
use kube::config::{KubeConfigOptions, Kubeconfig};

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(kubeconfig), Some(namespace)) = (args.next(), args.next()) else {
        eprintln!("usage: ch-operator <kubeconfig> <namespace>");
        std::process::exit(2);
    };
    let kubeconfig = Kubeconfig::read_from(&kubeconfig).expect("reading the kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("the kubeconfig");
    let client = kube::Client::try_from(config).expect("a client");
    let mut registry = BackendRegistry::default();
    registry.register(ProviderClass::CloudHypervisor, Arc::new(ChFactory::new()));
    let _operator = Operator::start_with_registry(
        client,
        &namespace,
        registry,
        Arc::new(SimFactory::new()),
        Duration::from_secs(5),
    );
    eprintln!("ch-operator: running for namespace {namespace}");
    std::future::pending::<()>().await;
}
