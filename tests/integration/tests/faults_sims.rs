//! Backend faults from the simulators' own injection, without a retry storm: fakepve
//! (HTTP 5xx, rejected tokens, failing ticket logins) and vcsim (SOAP faults, failing
//! clone tasks). Each fault stays on for a window while the requests it causes are
//! counted against what the controllers' backoff allows (see `fault_support`), the
//! conditions must name it, and healing must converge with one VM per VirtualMachine.

use std::sync::Arc;
use std::time::{Duration, Instant};

use banlieue_backend_proxmox::ProxmoxFactory;
use banlieue_backend_sim::SimFactory;
use banlieue_backend_vsphere::VSphereFactory;
use banlieue_integration_tests::apply;
use banlieue_integration_tests::fakepve::FakePve;
use banlieue_integration_tests::operator::{Operator, wait_for};
use banlieue_integration_tests::vcsim::Vcsim;
use banlieue_sdk::api::common::ProviderClass;
use banlieue_sdk::api::infra::proxmox::ProxmoxMachine;
use banlieue_sdk::api::infra::vsphere::VSphereMachine;
use banlieue_sdk::api::{Provider, VirtualMachine};
use banlieue_sdk::backend::BackendRegistry;
use banlieue_testenv::TestNamespace;
use fault_support::{backoff_bound, condition_of, is_ready};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde_json::{Value, json};

#[allow(dead_code)] // each suite uses some of the helpers
mod fault_support;

const WAIT: Duration = Duration::from_secs(60);
const WINDOW: Duration = Duration::from_secs(20);
/// The operator's sync period: how soon a terminal failure is looked at again.
const SYNC_PERIOD: Duration = Duration::from_secs(15);

/// True when a condition names `reason` (as its reason, or at the start of a terminal
/// failure's message) and its message contains `text`.
fn names(conditions: Option<&[Condition]>, reason: &str, text: &str) -> bool {
    conditions.unwrap_or_default().iter().any(|c| {
        (c.reason == reason || c.message.starts_with(&format!("{reason}: ")))
            && c.message.contains(text)
    })
}

/// A namespace with `objects`, a class and an image (with `source`), and the operator
/// with `class`'s real backend.
async fn world(
    prefix: &str,
    objects: Vec<Value>,
    source: Value,
    class: ProviderClass,
) -> (TestNamespace, Operator) {
    let ns = banlieue_testenv::namespace(prefix).await;
    let mut objects = objects;
    objects.extend([
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": format!("{}-small", ns.name)},
               "spec": {"cpus": 2, "memoryMiB": 1024, "firmware": "bios", "disk": {"sizeGiB": 16, "storageClass": "fast"}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": format!("{}-image", ns.name)},
               "spec": {"os": {"family": "linux", "distribution": "debian", "version": "13"}, "sources": source}}),
    ]);
    for object in &objects {
        apply(&ns.client, &ns.name, object).await.expect("fixture");
    }
    let mut registry = BackendRegistry::default();
    match class {
        ProviderClass::Proxmox => registry.register(class, Arc::new(ProxmoxFactory::new())),
        _ => registry.register(class, Arc::new(VSphereFactory::new())),
    };
    let operator = Operator::start_with_registry(
        ns.client.clone(),
        &ns.name,
        registry,
        Arc::new(SimFactory::new()),
        SYNC_PERIOD,
    );
    (ns, operator)
}

fn vm(ns: &TestNamespace, name: &str, provider: &str) -> Value {
    json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": name},
        "spec": {"classRef": {"name": format!("{}-small", ns.name)},
                 "imageRef": {"name": format!("{}-image", ns.name)},
                 "placement": {"providerRef": {"name": provider}},
                 "networks": [{"name": "eth0", "networkClass": "lan"}]}
    })
}

fn pve_objects(pve: &FakePve, credentials: Value) -> Vec<Value> {
    vec![
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "pve-credentials"},
               "stringData": credentials}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "pve"},
        "spec": {
            "class": "proxmox",
            "connection": {"endpoint": pve.ready.endpoint,
                           "credentialsRef": {"name": "pve-credentials"},
                           "caBundle": {"inline": pve.ready.ca_pem}},
            "capabilities": {
                "storageClasses": [{"name": "fast", "target": {"storage": "local-lvm"}}],
                "networkClasses": [{"name": "lan", "target": {"bridge": "vmbr0"}}]
            },
            "settings": {"taskPollInterval": "200ms", "shutdownTimeout": "5", "failedCloneBackoff": "3s"}
        }}),
    ]
}

fn token(pve: &FakePve) -> Value {
    json!({"tokenID": pve.ready.token_id, "tokenSecret": pve.ready.token_secret})
}

/// Requests fakepve saw since `since` matching `method` and a path ending in `suffix`.
fn count(pve: &FakePve, since: usize, method: &str, suffix: &str) -> usize {
    pve.requests(since)
        .0
        .iter()
        .filter(|(m, p)| m == method && p.ends_with(suffix))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persistent_proxmox_5xx_on_clone_backs_off_and_heals() {
    let Some(pve) = FakePve::start() else { return };
    let source = json!({"proxmox": {"templateID": pve.ready.template_id}});
    let (ns, _operator) = world(
        "pve-5xx",
        pve_objects(&pve, token(&pve)),
        source,
        ProviderClass::Proxmox,
    )
    .await;
    pve.fail("POST", "/clone", 503, "proxy: upstream unavailable", None);
    let (_, start) = pve.requests(0);
    let applied = Instant::now();
    apply(&ns.client, &ns.name, &vm(&ns, "c-1", "pve"))
        .await
        .unwrap();
    let machines: kube::Api<ProxmoxMachine> = ns.api();
    wait_for(&machines, "c-1", WAIT, |m| {
        names(
            m.status.as_ref().map(|s| &s.conditions[..]),
            "ServerError",
            "upstream unavailable",
        )
    })
    .await;
    tokio::time::sleep(WINDOW).await;
    let elapsed = applied.elapsed();
    let (all, _) = pve.requests(start);
    let clones = count(&pve, start, "POST", "/clone");
    let bound = backoff_bound(elapsed);
    eprintln!(
        "fakepve: {clones} clone POSTs and {} requests in all in {elapsed:.1?} under a persistent 503 (bound {bound} clones)",
        all.len()
    );
    assert!(
        (2..=bound as usize).contains(&clones),
        "{clones} clone attempts in {elapsed:?}; backoff allows 2..={bound}"
    );
    // Every request the fault causes is a handful per attempt (look up, clone), not a loop.
    assert!(
        all.len() <= 10 * bound as usize,
        "{} requests in {elapsed:?}",
        all.len()
    );

    // Healed: one more failure, then the rule is gone.
    pve.fail(
        "POST",
        "/clone",
        503,
        "proxy: upstream unavailable",
        Some(1),
    );
    let vms: kube::Api<VirtualMachine> = ns.api();
    wait_for(&vms, "c-1", Duration::from_secs(90), is_ready).await;
    let clones: Vec<Value> = pve
        .machines()
        .into_iter()
        .filter(|m| m["name"] == "c-1")
        .collect();
    assert_eq!(clones.len(), 1, "one clone: {clones:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_proxmox_token_is_not_retried_hot_and_a_fixed_secret_heals() {
    let Some(pve) = FakePve::start() else { return };
    let source = json!({"proxmox": {"templateID": pve.ready.template_id}});
    let bad = json!({"tokenID": pve.ready.token_id, "tokenSecret": "0f1e2d3c-wrong"});
    let (ns, _operator) = world(
        "pve-badtoken",
        pve_objects(&pve, bad),
        source,
        ProviderClass::Proxmox,
    )
    .await;
    apply(&ns.client, &ns.name, &vm(&ns, "t-1", "pve"))
        .await
        .unwrap();
    let providers: kube::Api<Provider> = ns.api();
    let provider = wait_for(&providers, "pve", WAIT, |p| {
        names(
            p.status.as_ref().map(|s| &s.conditions[..]),
            "Unauthorized",
            "",
        )
    })
    .await;
    let reachable = condition_of(
        provider.status.as_ref().map(|s| &s.conditions[..]),
        "Reachable",
    )
    .unwrap();
    assert_eq!(reachable.status, "False");
    assert!(
        !reachable.message.contains("0f1e2d3c-wrong"),
        "{reachable:?}"
    );
    let vms: kube::Api<VirtualMachine> = ns.api();
    wait_for(&vms, "t-1", WAIT, |vm| {
        condition_of(vm.status.as_ref().map(|s| &s.conditions[..]), "Scheduled")
            .is_some_and(|c| c.status == "False" && c.message.contains("pve"))
    })
    .await;

    let (_, start) = pve.requests(0);
    tokio::time::sleep(WINDOW).await;
    let (seen, _) = pve.requests(start);
    let bound = backoff_bound(WINDOW);
    eprintln!(
        "fakepve: {} requests in {WINDOW:?} while the token is rejected (bound {bound})",
        seen.len()
    );
    assert!(
        seen.len() <= bound as usize,
        "{} requests in {WINDOW:?} with a rejected token: {seen:?}",
        seen.len()
    );

    // The Secret is fixed: its watch wakes the Provider at once.
    let fixed = Instant::now();
    apply(&ns.client, &ns.name, &pve_objects(&pve, token(&pve))[0])
        .await
        .unwrap();
    wait_for(&vms, "t-1", Duration::from_secs(90), is_ready).await;
    eprintln!(
        "fakepve: Ready {:.1?} after the Secret was fixed",
        fixed.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_proxmox_ticket_logins_are_not_retried_hot() {
    let Some(pve) = FakePve::start() else { return };
    let source = json!({"proxmox": {"templateID": pve.ready.template_id}});
    let ticket = json!({"username": pve.ready.username, "password": pve.ready.password});
    let (ns, _operator) = world(
        "pve-login",
        pve_objects(&pve, ticket),
        source,
        ProviderClass::Proxmox,
    )
    .await;
    apply(&ns.client, &ns.name, &vm(&ns, "l-1", "pve"))
        .await
        .unwrap();
    let vms: kube::Api<VirtualMachine> = ns.api();
    wait_for(&vms, "l-1", WAIT, is_ready).await;

    // Tickets expire and logging in fails: every call needs a login that fails.
    pve.fail(
        "POST",
        "/access/ticket",
        500,
        "auth server unavailable",
        None,
    );
    pve.revoke_tickets();
    let (_, start) = pve.requests(0);
    // Power off: the machine must talk to PVE, and cannot.
    let api: kube::Api<VirtualMachine> = ns.api();
    api.patch(
        "l-1",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&json!({"spec": {"powerState": "PoweredOff"}})),
    )
    .await
    .unwrap();
    let machines: kube::Api<ProxmoxMachine> = ns.api();
    wait_for(&machines, "l-1", WAIT, |m| {
        names(
            m.status.as_ref().map(|s| &s.conditions[..]),
            "ServerError",
            "auth server unavailable",
        )
    })
    .await;
    tokio::time::sleep(WINDOW).await;
    let logins = count(&pve, start, "POST", "/access/ticket");
    // Two objects talk to PVE (the Provider's check, the machine): each backs off.
    let bound = 2 * backoff_bound(WINDOW + Duration::from_secs(5));
    eprintln!("fakepve: {logins} failed ticket logins in ~{WINDOW:?} (bound {bound})");
    assert!(
        logins >= 1 && logins <= bound as usize,
        "{logins} login attempts; backoff allows {bound}"
    );

    pve.fail(
        "POST",
        "/access/ticket",
        500,
        "auth server unavailable",
        Some(1),
    );
    wait_for(&vms, "l-1", Duration::from_secs(90), |vm| {
        vm.status.as_ref().and_then(|s| s.power_state)
            == Some(banlieue_sdk::api::common::PowerState::PoweredOff)
    })
    .await;
}

fn vcsim_objects(sim: &Vcsim) -> Vec<Value> {
    vec![
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "vc-credentials"},
               "stringData": {"username": sim.ready.username, "password": sim.ready.password}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "vc"},
        "spec": {
            "class": "vsphere",
            "connection": {"endpoint": format!("{}/sdk", sim.ready.endpoint),
                           "credentialsRef": {"name": "vc-credentials"},
                           "caBundle": {"inline": sim.ready.ca_pem}},
            "capabilities": {
                "storageClasses": [{"name": "fast", "target": {"datastore": "LocalDS_0"}}],
                "networkClasses": [{"name": "lan", "target": {"portGroup": "VM Network"}}]
            },
            "settings": {"taskPollInterval": "100ms", "shutdownTimeout": "2s", "failedCloneBackoff": "3s"}
        }}),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persistent_vsphere_fault_and_failing_clone_tasks_back_off_and_heal() {
    let Some(sim) = Vcsim::start() else { return };
    let source = json!({"vsphere": {"template": sim.ready.template}});
    let (ns, _operator) = world(
        "vs-storm",
        vcsim_objects(&sim),
        source,
        ProviderClass::Vsphere,
    )
    .await;

    // Every clone task fails: a terminal failure (an Event, the condition), looked at
    // again only on a change or after the sync period, never in a loop.
    sim.fail_task(
        "CloneVM_Task",
        "Insufficient disk space on datastore 'LocalDS_0'.",
        1000,
    );
    apply(&ns.client, &ns.name, &vm(&ns, "f-1", "vc"))
        .await
        .unwrap();
    let machines: kube::Api<VSphereMachine> = ns.api();
    let failed = wait_for(&machines, "f-1", WAIT, |m| {
        names(
            m.status.as_ref().map(|s| &s.conditions[..]),
            "CloneFailed",
            "Insufficient disk space",
        )
    })
    .await;
    let ready = condition_of(failed.status.as_ref().map(|s| &s.conditions[..]), "Ready").unwrap();
    assert_eq!(ready.reason, "TerminalFailure", "{ready:?}");
    let started = Instant::now();
    let at_start = sim.calls("CloneVM_Task");
    tokio::time::sleep(WINDOW).await;
    let clones = sim.calls("CloneVM_Task") - at_start;
    // One re-check per sync period at most.
    let bound = WINDOW.as_secs() / SYNC_PERIOD.as_secs() + 1;
    eprintln!(
        "vcsim: {clones} more clone tasks in {:.1?} after a terminal clone failure (bound {bound})",
        started.elapsed()
    );
    assert!(
        clones <= bound,
        "{clones} clones in {WINDOW:?} after a terminal failure; the sync period allows {bound}"
    );
    sim.clear_faults();

    // Every power-on answers a SOAP fault: exponential backoff.
    sim.fail(
        "PowerOnVM_Task",
        "host DC0_C0_H0 is in maintenance mode",
        1000,
    );
    wait_for(&machines, "f-1", WAIT, |m| {
        names(
            m.status.as_ref().map(|s| &s.conditions[..]),
            "VSphereFault",
            "maintenance mode",
        )
    })
    .await;
    let at_start = sim.calls("PowerOnVM_Task");
    let started = Instant::now();
    tokio::time::sleep(WINDOW).await;
    let power_ons = sim.calls("PowerOnVM_Task") - at_start;
    let bound = backoff_bound(started.elapsed());
    eprintln!(
        "vcsim: {power_ons} failing PowerOnVM_Task calls in {:.1?} (bound {bound})",
        started.elapsed()
    );
    assert!(
        (1..=bound).contains(&power_ons),
        "{power_ons} power-on attempts in {WINDOW:?}; backoff allows {bound}"
    );

    sim.clear_faults();
    let vms: kube::Api<VirtualMachine> = ns.api();
    wait_for(&vms, "f-1", Duration::from_secs(90), is_ready).await;
    assert_eq!(
        sim.vms().iter().filter(|v| v["name"] == "f-1").count(),
        1,
        "one clone"
    );
}
