//! Two `banlieue run --leader-elect` processes against a real apiserver: one reconciles,
//! the other stands by (`/readyz` says `standby`); kill -9 the leader and the other takes over.

mod common;

use std::time::{Duration, Instant};

use banlieue_integration_tests::apply;
use banlieue_integration_tests::operator::wait_for;
use banlieue_sdk::api::VirtualMachine;
use kube::api::Api;
use serde_json::json;

use common::{LEADER_FLAGS, WAIT, is_ready, kill_9, start, wait_for_leaders};

fn vm(name: &str, class: &str, image: &str) -> serde_json::Value {
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": name},
           "spec": {"classRef": {"name": class}, "imageRef": {"name": image}, "placement": {"providerRef": {"name": "sim"}}}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_leads_and_the_other_takes_over_when_it_dies() {
    let ns = banlieue_testenv::namespace("leader").await;
    let (class, image) = (format!("{}-c", ns.name), format!("{}-i", ns.name));
    for object in [
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "sim"},
               "spec": {"class": "sim", "connection": {"endpoint": format!("sim://{}", ns.name)}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": class},
               "spec": {"cpus": 1, "memoryMiB": 256, "disk": {"sizeGiB": 1}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": image},
               "spec": {"os": {"family": "linux", "distribution": "d", "version": "1"}, "sources": {"sim": {"name": "d"}}}}),
    ] {
        apply(&ns.client, &ns.name, &object).await.unwrap();
    }
    let logs = tempfile::tempdir().unwrap();
    let a = start(&ns.name, &logs.path().join("a.log"), LEADER_FLAGS);
    // Let A take the lease first so the roles are known.
    wait_for_leaders(&[&a], &[true]).await;
    let b = start(&ns.name, &logs.path().join("b.log"), LEADER_FLAGS);
    tokio::time::sleep(Duration::from_secs(2)).await;
    wait_for_leaders(&[&a, &b], &[true, false]).await;

    let vms: Api<VirtualMachine> = ns.api();
    apply(&ns.client, &ns.name, &vm("first", &class, &image))
        .await
        .unwrap();
    wait_for(&vms, "first", WAIT, is_ready).await;

    // kill -9: no release; B must wait out the lease and take over.
    let mut a = a;
    kill_9(&mut a);
    let killed = Instant::now();
    wait_for_leaders(&[&b], &[true]).await;
    let took_over = killed.elapsed();
    apply(&ns.client, &ns.name, &vm("second", &class, &image))
        .await
        .unwrap();
    wait_for(&vms, "second", WAIT, is_ready).await;
    eprintln!("leader election: standby took over {took_over:?} after kill -9 (lease 4s)");
    assert!(
        took_over < Duration::from_secs(30),
        "takeover took {took_over:?}"
    );
}
