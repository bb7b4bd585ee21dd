//! The example runs: its binary, against a real API server (the test suite's local
//! control plane with banlieue's CRDs, plus the example's own `LabMachine` CRD), serves
//! a Provider of its own class `lab` with its own backend and machine kind, brings a
//! VirtualMachine to Ready through a `LabMachine`, and its own controller reports it.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use banlieue_sdk::api::{Provider, VirtualMachine};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(90);

/// The example's process, killed when the test ends however it ends.
struct Example(Child);

impl Drop for Example {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn ready(conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition]) -> bool {
    conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// Installs the example's `LabMachine` CRD (as `crd` prints it) and waits until the
/// API server serves it.
async fn install_lab_machine_crd(client: kube::Client) {
    let printed = Command::new(env!("CARGO_BIN_EXE_banlieue-example-embedding"))
        .arg("crd")
        .output()
        .expect("print the LabMachine CRD");
    assert!(printed.status.success(), "crd: {printed:?}");
    let crd: CustomResourceDefinition =
        serde_json::from_slice(&printed.stdout).expect("the printed CRD");
    let crds: Api<CustomResourceDefinition> = Api::all(client);
    let name = crd.metadata.name.clone().expect("the CRD's name");
    crds.patch(
        &name,
        &PatchParams::apply("embedding-smoke").force(),
        &Patch::Apply(&crd),
    )
    .await
    .expect("apply the LabMachine CRD");
    let started = Instant::now();
    loop {
        let established = crds
            .get(&name)
            .await
            .ok()
            .and_then(|c| c.status)
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        if established {
            return;
        }
        assert!(started.elapsed() < WAIT, "{name} never became Established");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_embedding_example_brings_a_virtual_machine_to_ready_on_its_own_class_and_kind() {
    let ns = banlieue_testenv::namespace("embedding").await;
    install_lab_machine_crd(ns.client.clone()).await;
    // Its own namespace and Lease: the other test's replicas run at the same time, each
    // with a lab of its own, and must not reconcile (and so make machines for) this
    // test's objects.
    let mut child = Command::new(env!("CARGO_BIN_EXE_banlieue-example-embedding"))
        .env("KUBECONFIG", banlieue_testenv::kubeconfig_path())
        .env("WATCH_NAMESPACE", &ns.name)
        .env("LEASE_NAMESPACE", &ns.name)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the example");
    let stdout = child.stdout.take().expect("stdout");
    let _example = Example(child);
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            seen.lock().expect("lines").push(line);
        }
    });

    let params = PatchParams::apply("embedding-smoke").force();
    let objects = [
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass",
               "metadata": {"name": "embedding-small"},
               "spec": {"cpus": 1, "memoryMiB": 512, "disk": {"sizeGiB": 10}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage",
               "metadata": {"name": "embedding-image"},
               "spec": {"os": {"family": "linux", "distribution": "debian", "version": "13"},
                        "sources": {"other": {"lab": {"volume": "debian-13.qcow2"}}}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider",
               "metadata": {"name": "lab", "namespace": ns.name},
               "spec": {"class": "lab", "connection": {"endpoint": "lab://bench-room"},
                        "failureDomains": [{"name": "lab", "location": {"bench": "b1"}}]}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
               "metadata": {"name": "hello", "namespace": ns.name},
               "spec": {"classRef": {"name": "embedding-small"},
                        "imageRef": {"name": "embedding-image"},
                        "placement": {"providerRef": {"name": "lab"}}}}),
    ];
    for object in &objects {
        let name = object["metadata"]["name"].as_str().expect("name");
        let result = match object["kind"].as_str() {
            Some("VMClass") => Api::<banlieue_sdk::api::VMClass>::all(ns.client.clone())
                .patch(name, &params, &Patch::Apply(object))
                .await
                .map(drop),
            Some("VMImage") => Api::<banlieue_sdk::api::VMImage>::all(ns.client.clone())
                .patch(name, &params, &Patch::Apply(object))
                .await
                .map(drop),
            Some("Provider") => ns
                .api::<Provider>()
                .patch(name, &params, &Patch::Apply(object))
                .await
                .map(drop),
            _ => ns
                .api::<VirtualMachine>()
                .patch(name, &params, &Patch::Apply(object))
                .await
                .map(drop),
        };
        result.unwrap_or_else(|e| panic!("apply {name}: {e}"));
    }

    let vms: Api<VirtualMachine> = ns.api();
    let providers: Api<Provider> = ns.api();
    let started = Instant::now();
    let vm = loop {
        let vm = vms.get("hello").await.expect("get the VirtualMachine");
        let status = vm.status.clone().unwrap_or_default();
        if ready(&status.conditions) {
            break vm;
        }
        if started.elapsed() > WAIT {
            let provider = providers.get("lab").await.ok().and_then(|p| p.status);
            panic!(
                "the VirtualMachine is not Ready after {WAIT:?}: {:?}\nProvider: {provider:?}\nexample's output: {:?}",
                status.conditions,
                lines.lock().expect("lines")
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };

    let status = vm.status.expect("status");
    let placement = status.placement.expect("placement");
    assert_eq!(placement.provider, "lab");
    assert_eq!(placement.failure_domain.as_deref(), Some("lab"));
    // The VM's machine is the example's own kind, built by the example's own code
    // from the VM, its class, its image's `sources.other.lab` and its failure domain.
    let reference = status
        .infrastructure_ref
        .clone()
        .expect("infrastructureRef");
    assert_eq!(
        (reference.api_group.as_str(), reference.kind.as_str()),
        ("infrastructure.banlieue.io", "LabMachine")
    );
    let lab_machines = Api::<kube::api::DynamicObject>::namespaced_with(
        ns.client.clone(),
        &ns.name,
        &kube::api::ApiResource {
            group: "infrastructure.banlieue.io".into(),
            version: "v1alpha1".into(),
            api_version: "infrastructure.banlieue.io/v1alpha1".into(),
            kind: "LabMachine".into(),
            plural: "labmachines".into(),
        },
    );
    let machine = lab_machines
        .get(&reference.name)
        .await
        .expect("the VirtualMachine's LabMachine");
    let spec = &machine.data["spec"];
    assert_eq!(spec["volume"], "debian-13.qcow2");
    assert_eq!(spec["bench"], "b1");
    assert_eq!(
        (spec["cpus"].as_u64(), spec["memoryMiB"].as_u64()),
        (Some(1), Some(512))
    );
    assert_eq!(
        machine.data["status"]["initialization"]["provisioned"],
        true
    );
    // The lab backend names machines after the infrastructure object's UID.
    let uid = machine.metadata.uid.clone().unwrap_or_default();
    assert_eq!(spec["providerID"], format!("lab://{uid}").as_str());
    assert_eq!(
        status.provider_id.as_deref(),
        Some(format!("lab://{uid}").as_str())
    );

    // kubectl-banlieue finds a machine kind it was never built with, by discovery.
    let plugin = banlieue_testenv::workspace_binary("kubectl-banlieue", "kubectl-banlieue");
    let args = ["describe", "hello", "-n", ns.name.as_str()].map(str::to_owned);
    let described = tokio::task::spawn_blocking(move || {
        Command::new(plugin)
            .args(args)
            .env("KUBECONFIG", banlieue_testenv::kubeconfig_path())
            .output()
            .expect("run kubectl-banlieue")
    })
    .await
    .expect("join");
    let report = String::from_utf8_lossy(&described.stdout);
    let machine_line = format!("LabMachine {:?}", reference.name);
    assert!(
        described.status.success()
            && report
                .lines()
                .any(|l| l.trim_start().starts_with("ok") && l.contains(&machine_line)),
        "kubectl-banlieue describe does not show the LabMachine as ok:\n{report}\n{}",
        String::from_utf8_lossy(&described.stderr)
    );

    // The example's own controller, next to banlieue's, saw it running.
    let started = Instant::now();
    while !lines
        .lock()
        .expect("lines")
        .iter()
        .any(|l| l == "hello is Some(Running)")
    {
        assert!(
            started.elapsed() < WAIT,
            "the example never printed 'hello is Some(Running)': {:?}",
            lines.lock().expect("lines")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `GET path` on a probe server: (status code, body).
fn probe(addr: std::net::SocketAddr, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    let code = answer.split_whitespace().nth(1)?.parse().ok()?;
    let body = answer
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_string();
    Some((code, body))
}

fn free_port() -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("its address")
}

/// A replica of the example with its probe server on `health`, electing on a Lease in
/// `namespace` with short timings.
fn replica(health: std::net::SocketAddr, namespace: &str) -> Example {
    let child = Command::new(env!("CARGO_BIN_EXE_banlieue-example-embedding"))
        .env("KUBECONFIG", banlieue_testenv::kubeconfig_path())
        .env("HEALTH_ADDR", health.to_string())
        .env("LEASE_NAMESPACE", namespace)
        .env("WATCH_NAMESPACE", namespace)
        .env("LEASE_DURATION", "6s")
        .env("RENEW_DEADLINE", "4s")
        .env("RETRY_PERIOD", "1s")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start a replica");
    Example(child)
}

/// Waits until exactly one of the replicas answers `/readyz` as the leader (`ok`)
/// and every other as a standby; returns the leader's index.
async fn one_leader(replicas: &[std::net::SocketAddr]) -> usize {
    let started = Instant::now();
    loop {
        let answers: Vec<_> = replicas.iter().map(|a| probe(*a, "/readyz")).collect();
        let leaders: Vec<usize> = answers
            .iter()
            .enumerate()
            .filter(|(_, a)| matches!(a, Some((200, body)) if body == "ok"))
            .map(|(i, _)| i)
            .collect();
        let standbys = answers
            .iter()
            .filter(|a| matches!(a, Some((200, body)) if body.starts_with("standby")))
            .count();
        if leaders.len() == 1 && leaders.len() + standbys == replicas.len() {
            return leaders[0];
        }
        assert!(
            started.elapsed() < WAIT,
            "no single leader after {WAIT:?}: /readyz answered {answers:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn two_replicas_elect_one_leader_serve_probes_and_fail_over_on_sigterm() {
    let ns = banlieue_testenv::namespace("embedding-ha").await;
    let addrs = [free_port(), free_port()];
    let mut replicas = vec![
        Some(replica(addrs[0], &ns.name)),
        Some(replica(addrs[1], &ns.name)),
    ];

    let leader = one_leader(&addrs).await;
    for addr in addrs {
        assert_eq!(
            probe(addr, "/healthz"),
            Some((200, "ok".to_string())),
            "{addr}"
        );
    }
    let lease =
        Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(ns.client.clone(), &ns.name)
            .get("banlieue-example-embedding")
            .await
            .expect("the replicas' Lease");
    let first_holder = lease
        .spec
        .and_then(|s| s.holder_identity)
        .expect("the Lease has a holder");

    // SIGTERM: the leader drains, releases the Lease and exits 0; the standby takes
    // over well before the Lease would have expired.
    let mut stopped = replicas[leader].take().expect("the leader");
    let pid = stopped.0.id().to_string();
    let sent = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(sent.success());
    let started = Instant::now();
    let status = loop {
        if let Some(status) = stopped.0.try_wait().expect("wait") {
            break status;
        }
        assert!(
            started.elapsed() < WAIT,
            "the leader did not stop on SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(status.success(), "a graceful stop exits 0: {status}");

    let other = 1 - leader;
    assert_eq!(one_leader(&addrs[other..=other]).await, 0);
    let lease =
        Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(ns.client.clone(), &ns.name)
            .get("banlieue-example-embedding")
            .await
            .expect("the Lease");
    let holder = lease.spec.and_then(|s| s.holder_identity);
    assert!(
        holder.as_ref().is_some_and(|h| *h != first_holder),
        "the standby holds the Lease now: {holder:?} (was {first_holder})"
    );
    drop(replicas);
}
