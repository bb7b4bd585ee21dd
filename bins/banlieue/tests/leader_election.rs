//! Two `banlieue run --leader-elect` processes against a real apiserver: one reconciles,
//! the other stands by (`/readyz` 503); kill -9 the leader and the other takes over.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use banlieue_integration_tests::apply;
use banlieue_integration_tests::operator::wait_for;
use banlieue_sdk::api::VirtualMachine;
use banlieue_sdk::conditions;
use kube::api::Api;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const WAIT: Duration = Duration::from_secs(60);

struct Replica {
    child: Child,
    health: u16,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start(namespace: &str, log: &std::path::Path) -> Replica {
    let health = free_port();
    let log = std::fs::File::create(log).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_banlieue"))
        .args(["run", "--leader-elect", "--log-format", "json"])
        .args([
            "--kubeconfig",
            banlieue_testenv::kubeconfig_path().to_str().unwrap(),
        ])
        .args([
            "--namespace",
            namespace,
            "--leader-election-namespace",
            namespace,
        ])
        .args([
            "--leader-elect-lease-duration",
            "4s",
            "--leader-elect-renew-deadline",
            "3s",
        ])
        .args([
            "--leader-elect-retry-period",
            "500ms",
            "--sync-period",
            "30s",
        ])
        .args([
            "--health-addr",
            &format!("127.0.0.1:{health}"),
            "--diagnostics-address",
            "0",
        ])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    Replica { child, health }
}

/// The status code of `GET /readyz`, or None when nothing answers.
async fn readyz(port: u16) -> Option<u16> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    stream
        .write_all(b"GET /readyz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    response.split_whitespace().nth(1)?.parse().ok()
}

async fn leaders(replicas: &[&Replica]) -> Vec<bool> {
    let mut out = Vec::new();
    for r in replicas {
        out.push(readyz(r.health).await == Some(200));
    }
    out
}

async fn wait_for_leaders(replicas: &[&Replica], want: &[bool]) {
    let started = Instant::now();
    loop {
        let now = leaders(replicas).await;
        if now == want {
            return;
        }
        assert!(
            started.elapsed() < WAIT,
            "readyz of the replicas: {now:?}, want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn vm(name: &str, class: &str, image: &str) -> serde_json::Value {
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": name},
           "spec": {"classRef": {"name": class}, "imageRef": {"name": image}, "placement": {"providerRef": {"name": "sim"}}}})
}

fn is_ready(vm: &VirtualMachine) -> bool {
    vm.status
        .as_ref()
        .is_some_and(|s| conditions::is_true(&s.conditions, "Ready"))
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
    let a = start(&ns.name, &logs.path().join("a.log"));
    // Let A take the lease first so the roles are known.
    wait_for_leaders(&[&a], &[true]).await;
    let b = start(&ns.name, &logs.path().join("b.log"));
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

/// SIGKILL (what `Child::kill` sends on Unix): no chance to release the Lease.
fn kill_9(replica: &mut Replica) {
    replica.child.kill().unwrap();
    replica.child.wait().unwrap();
}
