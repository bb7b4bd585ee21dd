//! Every failure a condition, and nothing the operator derives breaks a valid object:
//! a VirtualMachine with a name of the longest length Kubernetes allows becomes Ready
//! (its labels, bootstrap Secret and Events are derived within Kubernetes' limits), a
//! bootstrap Secret of exactly 1 MiB is delivered, and bootstrap data that cannot fit
//! in one Secret is a condition that says so, not a line in the log.

use std::time::Duration;

use banlieue_integration_tests::apply;
use banlieue_integration_tests::fixtures::sim_provider;
use banlieue_integration_tests::operator::{Operator, wait_for};
use banlieue_sdk::api::VirtualMachine;
use banlieue_sdk::api::infra::libvirt::LibvirtMachine;
use banlieue_sdk::builder::{MAX_LABEL_VALUE, VIRTUAL_MACHINE_LABEL};
use banlieue_sdk::conditions;
use banlieue_testenv::TestNamespace;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);
const MIB: usize = 1024 * 1024;

async fn world(prefix: &str) -> (TestNamespace, Operator) {
    let ns = banlieue_testenv::namespace(prefix).await;
    for object in [
        sim_provider("sim", &format!("sim://{}", ns.name), json!({})),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": format!("{}-small", ns.name)},
               "spec": {"cpus": 1, "memoryMiB": 512, "disk": {"sizeGiB": 5, "storageClass": "fast"}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": format!("{}-debian", ns.name)},
               "spec": {"os": {"family": "linux", "distribution": "debian", "version": "13"}, "sources": {"sim": {"name": "debian"}}}}),
    ] {
        apply(&ns.client, &ns.name, &object).await.expect("fixture");
    }
    let operator = Operator::start(ns.client.clone(), &ns.name);
    (ns, operator)
}

fn vm(ns: &TestNamespace, name: &str, bootstrap: Option<Value>) -> Value {
    let mut vm = json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": name},
        "spec": {"classRef": {"name": format!("{}-small", ns.name)}, "imageRef": {"name": format!("{}-debian", ns.name)},
                 "networks": [{"name": "eth0", "networkClass": "lan"}]}
    });
    if let Some(b) = bootstrap {
        vm["spec"]["bootstrap"] = b;
    }
    vm
}

async fn secret(ns: &TestNamespace, name: &str, key: &str, size: usize) {
    let secrets: Api<Secret> = ns.api();
    let mut value = b"#cloud-config\n".to_vec();
    value.resize(size, b'#');
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some([(key.to_owned(), ByteString(value))].into()),
        ..Default::default()
    };
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .expect("a Secret of this size is valid");
}

fn ready(vm: &VirtualMachine) -> bool {
    vm.status
        .as_ref()
        .is_some_and(|s| conditions::is_true(&s.conditions, "Ready"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vm_with_the_longest_name_becomes_ready() {
    let (ns, _operator) = world("long-name").await;
    secret(&ns, "ud", "value", 64).await;
    // 253 characters: dots keep each DNS label within 63, as a name must.
    let name = format!(
        "{}.{}.{}.{}",
        "a".repeat(63),
        "b".repeat(63),
        "c".repeat(63),
        "d".repeat(61)
    );
    assert_eq!(name.len(), 253);
    apply(
        &ns.client,
        &ns.name,
        &vm(&ns, &name, Some(json!({"userData": {"name": "ud"}}))),
    )
    .await
    .expect("a valid name is accepted");
    let vms: Api<VirtualMachine> = ns.api();
    wait_for(&vms, &name, WAIT, ready).await;

    let machines: Api<LibvirtMachine> = ns.api();
    let machine = machines.get(&name).await.unwrap();
    let label = &machine.labels()[VIRTUAL_MACHINE_LABEL];
    assert!(label.len() <= MAX_LABEL_VALUE, "{label}");
    assert!(label.starts_with("aaaa"), "{label}");
    let secret_name = &machine.spec.bootstrap.as_ref().unwrap().data_secret_name;
    assert!(
        secret_name.len() <= 253 && secret_name.ends_with("-bootstrap"),
        "{secret_name}"
    );
    let events: Api<Event> = ns.api();
    let scheduled = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("Scheduled"))
        .count();
    assert_eq!(scheduled, 1, "the Scheduled Event was recorded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bootstrap_secret_of_exactly_one_mib_is_delivered() {
    let (ns, operator) = world("mib").await;
    secret(&ns, "ud", "value", MIB).await;
    apply(
        &ns.client,
        &ns.name,
        &vm(&ns, "full", Some(json!({"userData": {"name": "ud"}}))),
    )
    .await
    .unwrap();
    let vms: Api<VirtualMachine> = ns.api();
    wait_for(&vms, "full", WAIT, ready).await;
    let machines: Api<LibvirtMachine> = ns.api();
    let uid = machines.get("full").await.unwrap().uid().unwrap();
    let data = operator
        .sim
        .bootstrap_data(&format!("sim://{}", ns.name), &uid)
        .expect("the backend received the data");
    assert_eq!(data.user_data.expose().len(), MIB);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_data_too_large_for_one_secret_is_a_condition() {
    let (ns, operator) = world("too-big").await;
    secret(&ns, "ud", "value", MIB - 100).await;
    secret(&ns, "net", "network-config", 4096).await;
    apply(
        &ns.client,
        &ns.name,
        &vm(
            &ns,
            "big",
            Some(json!({"userData": {"name": "ud"}, "networkConfig": {"name": "net"}})),
        ),
    )
    .await
    .unwrap();
    let vms: Api<VirtualMachine> = ns.api();
    let vm = wait_for(&vms, "big", WAIT, |vm| {
        vm.status.as_ref().is_some_and(|s| {
            conditions::get(&s.conditions, "InfrastructureReady")
                .is_some_and(|c| c.reason == "BootstrapDataTooLarge")
        })
    })
    .await;
    let status = vm.status.unwrap();
    let message = &conditions::get(&status.conditions, "InfrastructureReady")
        .unwrap()
        .message;
    assert!(
        message.contains(&format!("{} bytes", MIB - 100 + 4096))
            && message.contains("make it smaller"),
        "{message}"
    );
    assert!(
        operator
            .sim
            .machines(&format!("sim://{}", ns.name))
            .is_empty(),
        "nothing was created"
    );
}
