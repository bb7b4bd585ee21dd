//! The operator lives through kube-apiserver and etcd crashes: both are SIGKILLed and
//! restarted while VirtualMachines are being created and deleted. The operator keeps
//! running (no exit, so no crash loop), its watches come back (a VM created after the
//! outages becomes Ready), and the backend ends with exactly one machine per VM, then
//! none. Each test owns its control plane, since it crashes it.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use banlieue_backend_sim::SimFactory;
use banlieue_integration_tests::apply;
use banlieue_integration_tests::crashable::CrashableOperator;
use banlieue_sdk::api::VirtualMachine;
use banlieue_sdk::api::common::ProviderClass;
use banlieue_sdk::api::infra::libvirt::LibvirtMachine;
use banlieue_sdk::backend::BackendRegistry;
use banlieue_sdk::conditions;
use banlieue_testenv::{Component, ControlPlane, ControlPlaneConfig, TestNamespace};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::{Value, json};

const VMS: usize = 60;
const CONVERGE: Duration = Duration::from_secs(180);
const OUTAGE: Duration = Duration::from_secs(3);

fn fixtures(ns: &TestNamespace) -> Vec<Value> {
    vec![
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "sim"},
               "spec": {"class": "sim", "connection": {"endpoint": format!("sim://{}", ns.name)},
                        "capabilities": {"storageClasses": [{"name": "fast", "target": {"pool": "default"}}]},
                        "settings": {"latency": "300ms"}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": "small"},
               "spec": {"cpus": 1, "memoryMiB": 512, "disk": {"sizeGiB": 5, "storageClass": "fast"}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": "debian"},
               "spec": {"os": {"family": "linux", "distribution": "debian", "version": "13"},
                        "sources": {"sim": {"name": "debian"}}}}),
    ]
}

fn vm(name: &str) -> Value {
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": name},
           "spec": {"classRef": {"name": "small"}, "imageRef": {"name": "debian"},
                    "placement": {"providerRef": {"name": "sim"}}}})
}

fn is_ready(vm: &VirtualMachine) -> bool {
    vm.status
        .as_ref()
        .is_some_and(|s| conditions::is_true(&s.conditions, "Ready"))
}

/// Applies `object`, retrying through an outage.
async fn apply_through_outage(ns: &TestNamespace, object: &Value) {
    let started = Instant::now();
    loop {
        match apply(&ns.client, &ns.name, object).await {
            Ok(_) => return,
            Err(error) if started.elapsed() < CONVERGE => {
                eprintln!("retrying an apply through the outage: {error}");
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            Err(error) => panic!("apply: {error}"),
        }
    }
}

/// Polls `count` (errors during outages count as "not yet") until it returns `want`.
async fn wait_until<F, Fut>(what: &str, want: usize, mut count: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<usize, kube::Error>>,
{
    let started = Instant::now();
    let mut last = String::new();
    while started.elapsed() < CONVERGE {
        match count().await {
            Ok(n) if n == want => return,
            Ok(n) => last = format!("{n}"),
            Err(error) => last = format!("error: {error}"),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("{what}: want {want}, last {last} after {CONVERGE:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_lives_through_apiserver_and_etcd_crashes() {
    let control_plane =
        ControlPlane::start(ControlPlaneConfig::from_env().banlieue_api()).expect("control plane");
    let ns = control_plane.namespace("restarts").await;
    for object in fixtures(&ns) {
        apply(&ns.client, &ns.name, &object).await.expect("fixture");
    }
    let sim = Arc::new(SimFactory::new());
    let endpoint = format!("sim://{}", ns.name);
    let mut registry = BackendRegistry::default();
    registry.register(ProviderClass::Sim, sim.clone());
    let mut config = control_plane.kube_config();
    config.default_namespace.clone_from(&ns.name);
    let operator = CrashableOperator::start(config, &ns.name, registry, Duration::from_secs(30));
    let vms: Api<VirtualMachine> = ns.api();
    let machines: Api<LibvirtMachine> = ns.api();

    // Create while the apiserver, then etcd, crash.
    for i in 0..VMS / 2 {
        apply(&ns.client, &ns.name, &vm(&format!("vm-{i:02}")))
            .await
            .expect("create");
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    control_plane
        .crash(Component::KubeApiServer, OUTAGE)
        .await
        .expect("apiserver back");
    for i in VMS / 2..VMS {
        apply_through_outage(&ns, &vm(&format!("vm-{i:02}"))).await;
    }
    control_plane
        .crash(Component::Etcd, OUTAGE)
        .await
        .expect("etcd back");
    // A VM created after both outages proves the watches came back.
    apply_through_outage(&ns, &vm("after-outages")).await;
    wait_until("Ready VMs", VMS + 1, || async {
        let list = vms.list(&ListParams::default()).await?;
        Ok(list.items.iter().filter(|v| is_ready(v)).count())
    })
    .await;
    assert!(!operator.has_exited(), "the operator returned");

    let infra = machines.list(&ListParams::default()).await.expect("list");
    let infra_uids: BTreeSet<String> = infra.items.iter().filter_map(|m| m.uid()).collect();
    let backend_uids: BTreeSet<String> = sim
        .machines(&endpoint)
        .into_iter()
        .map(|m| m.identity.uid)
        .collect();
    assert_eq!(infra_uids.len(), VMS + 1, "one infra machine per VM");
    assert_eq!(
        backend_uids, infra_uids,
        "exactly one backend machine per infra machine"
    );

    // Delete while the apiserver crashes.
    vms.delete_collection(&DeleteParams::background(), &ListParams::default())
        .await
        .expect("delete all");
    tokio::time::sleep(Duration::from_millis(500)).await;
    control_plane
        .crash(Component::KubeApiServer, OUTAGE)
        .await
        .expect("apiserver back");
    wait_until("VMs and infra machines left", 0, || async {
        let left = vms.list(&ListParams::default()).await?.items.len();
        Ok(left + machines.list(&ListParams::default()).await?.items.len())
    })
    .await;
    assert!(
        sim.machines(&endpoint).is_empty(),
        "backend machines leaked after the delete"
    );
    assert!(!operator.has_exited(), "the operator returned");
    operator.kill();
}
