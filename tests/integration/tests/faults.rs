//! Backend faults without a retry storm, and a burst held to the Provider's create cap. The operator runs against a real apiserver;
//! faults come from the sim backend's injection (`failureRate`, `failureCalls`) and,
//! in `faults_pve.rs`/`faults_vcsim.rs`, from the simulators' own.
//!
//! Each test keeps a fault on for a window, counts the backend calls it caused, and
//! checks them against what the controllers' backoff allows (1 s doubling per
//! consecutive failure, +0–25 % jitter, capped at 5 min: `Context::backoff`); a hot
//! loop (a requeue per status write, a fixed short requeue) would exceed that by far.
//! Then it checks that conditions name the fault and that healing converges.
//!
//! Randomness (which VMs, the sim's fault draws) comes from one seed, printed first:
//! rerun with `BANLIEUE_FAULT_SEED=<seed>` to replay a failure.

use std::collections::BTreeMap;
use std::time::Duration;

use banlieue_backend_sim::SimCall;
use banlieue_integration_tests::apply;
use banlieue_integration_tests::fixtures::sim_provider;
use banlieue_integration_tests::operator::{Operator, wait_for, wait_gone};
use banlieue_sdk::api::infra::libvirt::LibvirtMachine;
use banlieue_sdk::api::virtual_machine::VirtualMachinePhase;
use banlieue_sdk::api::{Provider, VirtualMachine};
use banlieue_testenv::TestNamespace;
use fault_support::{backoff_bound, condition_of, is_ready, seed, spacing_report};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};

mod fault_support;

const WAIT: Duration = Duration::from_secs(60);
/// How long a fault stays on while calls are counted.
const WINDOW: Duration = Duration::from_secs(20);

fn vm(ns: &TestNamespace, name: &str) -> Value {
    json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": name},
        "spec": {"classRef": {"name": format!("{}-small", ns.name)},
                 "imageRef": {"name": format!("{}-debian", ns.name)},
                 "placement": {"providerRef": {"name": "sim"}},
                 "networks": [{"name": "eth0", "networkClass": "lan"}]}
    })
}

/// A namespace with a sim Provider (`settings`, endpoint unique to the test), a class,
/// an image and the operator.
async fn world(prefix: &str, settings: Value) -> (TestNamespace, Operator, String) {
    let ns = banlieue_testenv::namespace(prefix).await;
    let endpoint = format!("sim://{}", ns.name);
    for object in [
        sim_provider("sim", &endpoint, settings),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": format!("{}-small", ns.name)},
               "spec": {"cpus": 1, "memoryMiB": 512, "disk": {"sizeGiB": 5, "storageClass": "fast"}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": format!("{}-debian", ns.name)},
               "spec": {"os": {"family": "linux", "distribution": "debian", "version": "13"}, "sources": {"sim": {"name": "debian"}}}}),
    ] {
        apply(&ns.client, &ns.name, &object).await.expect("fixture");
    }
    let operator = Operator::start(ns.client.clone(), &ns.name);
    (ns, operator, endpoint)
}

/// Replaces the Provider's settings (the operator reconnects with them).
async fn set_settings(ns: &TestNamespace, settings: Value) {
    let providers: Api<Provider> = ns.api();
    providers
        .patch(
            "sim",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"settings": null}})),
        )
        .await
        .expect("clearing settings");
    providers
        .patch(
            "sim",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"settings": settings}})),
        )
        .await
        .expect("setting settings");
}

/// The recorded `call`s per machine uid, as times since the first call of that uid.
fn per_uid(calls: &[SimCall], call: &str) -> BTreeMap<String, Vec<Duration>> {
    let mut out: BTreeMap<String, Vec<Duration>> = BTreeMap::new();
    let mut first = BTreeMap::new();
    for c in calls.iter().filter(|c| c.call == call) {
        let uid = c.uid.clone().unwrap_or_default();
        let start = *first.entry(uid.clone()).or_insert(c.at);
        out.entry(uid).or_default().push(c.at - start);
    }
    out
}

/// Calls of one uid within `WINDOW` of its first one.
fn within_window(times: &[Duration]) -> usize {
    times.iter().filter(|t| **t <= WINDOW).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persistent_ensure_fault_backs_off_with_jitter_and_heals() {
    let seed = seed();
    // 5 or 6 VMs: enough that jittered retries cannot all land within 100 ms by chance.
    let n = 5 + (seed % 2) as usize;
    let (ns, operator, endpoint) = world(
        "fault-ensure",
        json!({"failureRate": "1", "failureKinds": "transient", "failureCalls": "ensure",
               "recordCalls": "true", "seed": seed.to_string()}),
    )
    .await;
    let vms: Api<VirtualMachine> = ns.api();
    for i in 0..n {
        apply(&ns.client, &ns.name, &vm(&ns, &format!("v{i}")))
            .await
            .unwrap();
    }
    // The condition says what happened: reason and the backend's message.
    let machines: Api<LibvirtMachine> = ns.api();
    for i in 0..n {
        let machine = wait_for(&machines, &format!("v{i}"), WAIT, |m| {
            condition_of(m.status.as_ref().map(|s| &s.conditions[..]), "Ready")
                .is_some_and(|c| c.reason == "SimulatedFault")
        })
        .await;
        let ready = condition_of(machine.status.as_ref().map(|s| &s.conditions[..]), "Ready")
            .unwrap()
            .clone();
        assert_eq!(ready.status, "False");
        assert!(
            ready.message.contains("injected transient fault in ensure"),
            "seed {seed}: {ready:?}"
        );
        let vm = wait_for(&vms, &format!("v{i}"), WAIT, |vm| {
            condition_of(
                vm.status.as_ref().map(|s| &s.conditions[..]),
                "InfrastructureReady",
            )
            .is_some_and(|c| c.reason == "SimulatedFault")
        })
        .await;
        let infra = condition_of(
            vm.status.as_ref().map(|s| &s.conditions[..]),
            "InfrastructureReady",
        )
        .unwrap();
        assert!(
            infra.message.contains("injected transient fault"),
            "seed {seed}: the VirtualMachine mirrors the machine's message: {infra:?}"
        );
    }

    tokio::time::sleep(WINDOW).await;
    let calls = operator.sim.calls(&endpoint);
    let ensure = per_uid(&calls, "ensure");
    assert_eq!(ensure.len(), n, "seed {seed}: every machine was tried");
    let bound = backoff_bound(WINDOW);
    let report = spacing_report(&ensure);
    eprintln!(
        "seed {seed}: ensure calls per machine under a persistent transient fault, \
         bound {bound} per {WINDOW:?}:\n{report}"
    );
    for (uid, times) in &ensure {
        let counted = within_window(times);
        assert!(
            counted as u64 <= bound,
            "seed {seed}: {uid} was called {counted} times in {WINDOW:?} (backoff allows {bound}): \
             a retry storm\n{report}"
        );
        assert!(
            counted >= 4,
            "seed {seed}: {uid} was retried only {counted} times in {WINDOW:?}: \
             a transient fault must be retried\n{report}"
        );
        // Backoff grows: the last gap is the longest so far, and at least 4 s.
        let gaps: Vec<Duration> = times.windows(2).map(|w| w[1] - w[0]).collect();
        let last = *gaps.last().unwrap();
        assert!(
            last >= Duration::from_secs(4) && gaps.iter().all(|g| *g <= last),
            "seed {seed}: {uid}'s retries do not back off: gaps {gaps:?}"
        );
    }
    // Jitter: machines that failed together do not retry in lockstep. The 4th call
    // comes after 1+2+4 s of backoff plus up to 25 % each; without jitter all would
    // land within a few milliseconds of each other.
    let fourth: Vec<Duration> = ensure.values().map(|t| t[3]).collect();
    let spread = *fourth.iter().max().unwrap() - *fourth.iter().min().unwrap();
    assert!(
        spread >= Duration::from_millis(100),
        "seed {seed}: retries are not jittered: 4th calls at {fourth:?}"
    );

    // Healed: the Provider change wakes the machines at once, whatever their backoff.
    let healed = tokio::time::Instant::now();
    set_settings(&ns, json!({"recordCalls": "true"})).await;
    for i in 0..n {
        wait_for(&vms, &format!("v{i}"), WAIT, is_ready).await;
    }
    let converged = healed.elapsed();
    eprintln!("seed {seed}: {n} VMs Ready {converged:?} after the fault was healed");
    assert!(
        converged < Duration::from_secs(15),
        "seed {seed}: healing took {converged:?}; the Provider change should wake the machines"
    );
    assert_eq!(
        operator.sim.machines(&endpoint).len(),
        n,
        "seed {seed}: one backend machine per VirtualMachine"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_provider_check_is_retried_with_backoff_and_heals() {
    let seed = seed();
    let (ns, operator, endpoint) = world(
        "fault-check",
        json!({"failureRate": "1", "failureKinds": "transient", "failureCalls": "check",
               "seed": seed.to_string()}),
    )
    .await;
    apply(&ns.client, &ns.name, &vm(&ns, "v")).await.unwrap();
    let providers: Api<Provider> = ns.api();
    let provider = wait_for(&providers, "sim", WAIT, |p| {
        condition_of(p.status.as_ref().map(|s| &s.conditions[..]), "Ready")
            .is_some_and(|c| c.reason == "SimulatedFault")
    })
    .await;
    let ready = condition_of(provider.status.as_ref().map(|s| &s.conditions[..]), "Ready")
        .unwrap()
        .clone();
    assert_eq!(ready.status, "False");
    assert!(
        ready.message.contains("injected transient fault in check"),
        "{ready:?}"
    );
    let vms: Api<VirtualMachine> = ns.api();
    let waiting = wait_for(&vms, "v", WAIT, |vm| {
        condition_of(vm.status.as_ref().map(|s| &s.conditions[..]), "Scheduled")
            .is_some_and(|c| c.status == "False")
    })
    .await;
    let scheduled = condition_of(
        waiting.status.as_ref().map(|s| &s.conditions[..]),
        "Scheduled",
    )
    .unwrap();
    assert!(
        !scheduled.reason.is_empty() && scheduled.message.contains("sim"),
        "the VM says why it is not placed: {scheduled:?}"
    );

    let before = operator.sim.stats(&endpoint).check;
    tokio::time::sleep(WINDOW).await;
    let checks = operator.sim.stats(&endpoint).check - before;
    // The Provider is one object; `before` already counted its first failures.
    let bound = backoff_bound(WINDOW);
    eprintln!(
        "seed {seed}: {checks} Provider checks in {WINDOW:?} under a persistent fault (bound {bound})"
    );
    assert!(
        checks <= bound,
        "seed {seed}: {checks} checks in {WINDOW:?} (backoff allows {bound}): a retry storm"
    );
    assert!(checks >= 1, "seed {seed}: a failing Provider is re-checked");

    set_settings(&ns, json!({})).await;
    wait_for(&vms, "v", WAIT, is_ready).await;
    assert_eq!(operator.sim.machines(&endpoint).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persistent_delete_fault_backs_off_keeps_the_finalizer_and_heals() {
    let seed = seed();
    let (ns, operator, endpoint) = world("fault-delete", json!({})).await;
    let vms: Api<VirtualMachine> = ns.api();
    apply(&ns.client, &ns.name, &vm(&ns, "v")).await.unwrap();
    wait_for(&vms, "v", WAIT, is_ready).await;
    set_settings(
        &ns,
        json!({"failureRate": "1", "failureKinds": "transient", "failureCalls": "delete",
               "recordCalls": "true", "seed": seed.to_string()}),
    )
    .await;
    // Wait for the reconnect: the Provider's status follows its new generation.
    let providers: Api<Provider> = ns.api();
    wait_for(&providers, "sim", WAIT, |p| {
        p.status.as_ref().and_then(|s| s.observed_generation) == p.metadata.generation
    })
    .await;
    vms.delete("v", &DeleteParams::default()).await.unwrap();
    tokio::time::sleep(WINDOW + Duration::from_secs(2)).await;
    let deletes = per_uid(&operator.sim.calls(&endpoint), "delete");
    let bound = backoff_bound(WINDOW);
    let report = spacing_report(&deletes);
    eprintln!(
        "seed {seed}: delete calls under a persistent transient fault (bound {bound}):\n{report}"
    );
    assert_eq!(deletes.len(), 1, "seed {seed}: {report}");
    for (uid, times) in &deletes {
        let counted = within_window(times);
        assert!(
            counted as u64 <= bound && counted >= 3,
            "seed {seed}: {uid}: {counted} deletes in {WINDOW:?}, want 3..={bound}\n{report}"
        );
    }
    assert_eq!(
        operator.sim.machines(&endpoint).len(),
        1,
        "seed {seed}: the backend machine is still there"
    );
    let machines: Api<LibvirtMachine> = ns.api();
    let machine = machines
        .get("v")
        .await
        .expect("the finalizer holds the machine");
    assert!(machine.metadata.deletion_timestamp.is_some());
    let ready = condition_of(machine.status.as_ref().map(|s| &s.conditions[..]), "Ready");
    assert!(
        ready.is_some_and(|c| c.status == "False"
            && c.reason == "DeleteFailed"
            && c.message.starts_with("SimulatedFault: ")),
        "seed {seed}: the machine says why it is stuck: {ready:?}"
    );
    let vm = vms.get("v").await.expect("the VM waits for its machine");
    let status = vm.status.as_ref();
    let infra_ready = condition_of(status.map(|s| &s.conditions[..]), "InfrastructureReady");
    assert!(
        infra_ready.is_some_and(
            |c| c.reason == "DeleteFailed" && c.message.starts_with("SimulatedFault: ")
        ),
        "seed {seed}: the VM says why it is stuck: {infra_ready:?}"
    );
    let vm_ready = condition_of(status.map(|s| &s.conditions[..]), "Ready");
    assert!(
        vm_ready.is_some_and(|c| c.status == "False" && c.reason == "Deleting"),
        "seed {seed}: {vm_ready:?}"
    );
    assert_eq!(
        status.and_then(|s| s.phase),
        Some(VirtualMachinePhase::Deleting),
        "seed {seed}"
    );

    set_settings(&ns, json!({})).await;
    wait_gone(&vms, "v", WAIT).await;
    assert!(
        operator.sim.machines(&endpoint).is_empty(),
        "seed {seed}: nothing leaked"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_faults_converge_without_duplicates_or_leaks() {
    let seed = seed();
    let (ns, operator, endpoint) = world(
        "fault-random",
        json!({"failureRate": "0.4", "failureKinds": "transient,slow", "latency": "100ms",
               "seed": seed.to_string()}),
    )
    .await;
    let vms: Api<VirtualMachine> = ns.api();
    let n = 8;
    for i in 0..n {
        apply(&ns.client, &ns.name, &vm(&ns, &format!("r{i}")))
            .await
            .unwrap();
    }
    for i in 0..n {
        wait_for(&vms, &format!("r{i}"), WAIT, is_ready).await;
    }
    let stats = operator.sim.stats(&endpoint);
    eprintln!("seed {seed}: {n} VMs Ready through 40 % faults: {stats:?}");
    assert_eq!(
        operator.sim.machines(&endpoint).len(),
        n,
        "seed {seed}: one backend machine per VirtualMachine"
    );
    for vm in vms.list(&Default::default()).await.unwrap() {
        vms.delete(&vm.name_any(), &DeleteParams::default())
            .await
            .unwrap();
    }
    for i in 0..n {
        wait_gone(&vms, &format!("r{i}"), WAIT).await;
    }
    assert!(
        operator.sim.machines(&endpoint).is_empty(),
        "seed {seed}: nothing leaked: {:?}",
        operator.sim.machines(&endpoint)
    );
}

/// A 200-VM burst on a Provider capped at 10 concurrent creates
/// (`maxConcurrentCreates`): the simulator never has more than 10 machines being
/// created at once (its own count, from the `ensure` that starts a create until the
/// create's latency passed), the machines held back say why, and all 200 become
/// Ready. Then the cap is lifted (`"0"`) for a second burst, which the same count sees
/// going past 10: the measure can tell a capped burst from an uncapped one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_is_created_no_more_than_the_providers_cap_at_a_time() {
    const CAP: u64 = 10;
    let (ns, operator, endpoint) = world(
        "create-cap",
        json!({"latency": "500ms", "maxConcurrentCreates": CAP.to_string()}),
    )
    .await;
    let vms: Api<VirtualMachine> = ns.api();
    let machines: Api<LibvirtMachine> = ns.api();
    let burst = |prefix: &'static str, n: usize| {
        let ns = &ns;
        futures::future::join_all((0..n).map(move |i| async move {
            apply(&ns.client, &ns.name, &vm(ns, &format!("{prefix}{i}")))
                .await
                .expect("a VirtualMachine")
        }))
    };
    burst("b", 200).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    let mut queued_seen = None;
    loop {
        let listed = vms.list(&Default::default()).await.expect("list VMs");
        if listed.items.len() == 200 && listed.items.iter().all(is_ready) {
            break;
        }
        if queued_seen.is_none() {
            queued_seen = machines
                .list(&Default::default())
                .await
                .expect("list machines")
                .items
                .iter()
                .find_map(|m| {
                    condition_of(m.status.as_ref().map(|s| &s.conditions[..]), "Ready")
                        .filter(|c| c.reason == "CreateQueued")
                        .map(|c| c.message.clone())
                });
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not all 200 VMs Ready after 180 s; sim: {:?}",
            operator.sim.stats(&endpoint)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let stats = operator.sim.stats(&endpoint);
    eprintln!("capped burst of 200: {stats:?}");
    assert!(
        (CAP / 2..=CAP).contains(&stats.creating_peak),
        "at most {CAP} creates at once, and the cap was reached (not a trickle): {stats:?}"
    );
    assert_eq!(
        operator.sim.machines(&endpoint).len(),
        200,
        "one machine per VM"
    );
    let queued = queued_seen.expect("a machine held back by the cap reports CreateQueued");
    assert!(
        queued.contains("its cap (spec.settings.maxConcurrentCreates: 10)"),
        "{queued}"
    );

    set_settings(
        &ns,
        json!({"latency": "500ms", "maxConcurrentCreates": "0"}),
    )
    .await;
    burst("u", 60).await;
    for i in 0..60 {
        wait_for(&vms, &format!("u{i}"), Duration::from_secs(120), is_ready).await;
    }
    let uncapped = operator.sim.stats(&endpoint);
    eprintln!("uncapped burst of 60 after it: {uncapped:?}");
    assert!(
        uncapped.creating_peak > CAP,
        "without a cap the burst goes past {CAP} at once (else the capped check proves nothing): {uncapped:?}"
    );
}
