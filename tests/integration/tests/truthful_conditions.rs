//! Conditions and Events that tell the truth (issue 18, items 5 and 6): a machine whose
//! hand-set providerID the backend contradicts stops and says so; the real blocker of
//! a VM is shown, not a cause fixed since; a running VM whose class is deleted keeps
//! running and says why it cannot change; a Provider unready from its first check is
//! announced by one Warning. Every message is prose (the [`Operator`] checks that of
//! all of them when it is dropped).

use std::time::Duration;

use banlieue_integration_tests::apply;
use banlieue_integration_tests::fixtures::sim_provider;
use banlieue_integration_tests::messages;
use banlieue_integration_tests::operator::{Operator, wait_for, wait_gone};
use banlieue_sdk::api::infra::libvirt::LibvirtMachine;
use banlieue_sdk::api::virtual_machine::VirtualMachinePhase;
use banlieue_sdk::api::{Provider, VMClass, VirtualMachine};
use banlieue_sdk::conditions;
use banlieue_testenv::TestNamespace;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);

/// A short sync period: terminal and unready objects are looked at again every 2 s,
/// so a test sees whether a recheck repeats an Event.
const SYNC: Duration = Duration::from_secs(2);

fn class(name: &str) -> Value {
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": name},
           "spec": {"cpus": 1, "memoryMiB": 512, "disk": {"sizeGiB": 5, "storageClass": "fast"}}})
}

fn image(name: &str) -> Value {
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": name},
           "spec": {"os": {"family": "linux", "distribution": "debian", "version": "13"}, "sources": {"sim": {"name": "debian"}}}})
}

fn vm(name: &str, class: &str, image: &str) -> Value {
    json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": name},
        "spec": {"classRef": {"name": class}, "imageRef": {"name": image},
                 "networks": [{"name": "eth0", "networkClass": "lan"}],
                 "placement": {"providerRef": {"name": "sim"}}}
    })
}

/// A namespace with a Provider `sim` (`settings`), a class and an image, and the
/// operator on it with a [`SYNC`] sync period.
async fn world(prefix: &str, settings: Value) -> (TestNamespace, Operator, String, String) {
    let ns = banlieue_testenv::namespace(prefix).await;
    let class_name = format!("{}-small", ns.name);
    let image_name = format!("{}-debian", ns.name);
    for object in [
        sim_provider("sim", &format!("sim://{}", ns.name), settings),
        class(&class_name),
        image(&image_name),
    ] {
        apply(&ns.client, &ns.name, &object).await.expect("fixture");
    }
    let operator = Operator::start_with(ns.client.clone(), &ns.name, SYNC);
    (ns, operator, class_name, image_name)
}

fn vm_condition<'a>(vm: &'a VirtualMachine, type_: &str) -> Option<&'a Condition> {
    vm.status
        .as_ref()
        .and_then(|s| conditions::get(&s.conditions, type_))
}

fn machine_ready(m: &LibvirtMachine) -> Option<&Condition> {
    m.status
        .as_ref()
        .and_then(|s| conditions::get(&s.conditions, "Ready"))
}

/// The Events about the object `name` of `kind` with `reason`.
async fn events(ns: &TestNamespace, kind: &str, name: &str, reason: &str) -> Vec<Event> {
    let events: Api<Event> = ns.api();
    events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().is_some_and(|r| {
                    r.kind.as_deref() == Some(kind) && r.name.as_deref() == Some(name)
                })
        })
        .collect()
}

/// Asserts `reason` was announced about `name` exactly once: one Event, which no
/// repeat turned into a series.
async fn announced_once(ns: &TestNamespace, kind: &str, name: &str, reason: &str) -> Event {
    let found = events(ns, kind, name, reason).await;
    assert_eq!(
        found.len(),
        1,
        "one {reason} Event about {name}: {found:#?}"
    );
    let event = found.into_iter().next().unwrap();
    assert!(
        event.series.is_none(),
        "announced again on a recheck: {event:#?}"
    );
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    event
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_id_the_backend_contradicts_is_a_terminal_condition_not_a_hot_loop() {
    // Creating takes 2 × 3 s: time to set spec.providerID by hand while it does.
    let (ns, operator, _, _) = world("provider-id", json!({"latency": "3s"})).await;
    let endpoint = format!("sim://{}", ns.name);
    let machines: Api<LibvirtMachine> = ns.api();
    let machine = json!({"apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "LibvirtMachine",
        "metadata": {"name": "m"},
        "spec": {"providerRef": {"name": "sim"}, "image": {"path": "/var/lib/images/debian.qcow2"},
                 "storagePool": "default", "cpus": 1, "memoryMiB": 256}});
    apply(&ns.client, &ns.name, &machine).await.unwrap();
    wait_for(&machines, "m", WAIT, |m| {
        machine_ready(m).is_some_and(|c| c.reason == "Creating")
    })
    .await;
    let wrong = "libvirt://0b9e8a62-5d7c-4c51-9f0e-2a9f6c1d3e47";
    machines
        .patch(
            "m",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"providerID": wrong}})),
        )
        .await
        .expect("an unset providerID may be set");

    let stuck = wait_for(&machines, "m", WAIT, |m| {
        machine_ready(m).is_some_and(|c| c.message.starts_with("ProviderIDMismatch:"))
    })
    .await;
    let ready = machine_ready(&stuck).unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "TerminalFailure")
    );
    let backend = operator.sim.machines(&endpoint);
    assert_eq!(
        backend.len(),
        1,
        "one machine, made before the providerID was set"
    );
    let made = backend[0].provider_id.clone();
    assert_ne!(made, wrong);
    for id in [wrong, made.as_str()] {
        assert!(ready.message.contains(id), "names {id}: {}", ready.message);
    }
    assert!(
        ready.message.contains("Delete this object"),
        "{}",
        ready.message
    );
    assert_eq!(
        stuck.spec.provider_id.as_deref(),
        Some(wrong),
        "the immutable field is left alone"
    );

    // Several rechecks later: still one Event, nothing patched, nothing created.
    tokio::time::sleep(SYNC * 4).await;
    let event = announced_once(&ns, "LibvirtMachine", "m", "ProviderIDMismatch").await;
    assert!(event.note.unwrap_or_default().contains(wrong));
    let later = machines.get("m").await.unwrap();
    assert_eq!(later.spec.provider_id.as_deref(), Some(wrong));
    assert_eq!(
        machine_ready(&later).map(|c| &c.last_transition_time),
        Some(&ready.last_transition_time)
    );
    assert_eq!(operator.sim.machines(&endpoint).len(), 1);

    // Deleting the object takes the machine made for it along: nothing leaks.
    machines
        .delete("m", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&machines, "m", WAIT).await;
    assert!(operator.sim.machines(&endpoint).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_blocker_is_shown_not_a_cause_fixed_since() {
    let (ns, _operator, class, image) = world("blocker", json!({})).await;
    let vms: Api<VirtualMachine> = ns.api();
    let mut object = vm("v", &class, &image);
    object["spec"]["bootstrap"] = json!({"format": "cloud-config", "userData": {"name": "ud"}});
    apply(&ns.client, &ns.name, &object).await.unwrap();

    // First cause: the Secret is not there yet.
    let waiting = wait_for(&vms, "v", WAIT, |vm| {
        vm_condition(vm, "InfrastructureReady").is_some_and(|c| c.reason == "BootstrapDataNotFound")
    })
    .await;
    assert_eq!(
        vm_condition(&waiting, "InfrastructureReady")
            .unwrap()
            .message,
        "bootstrap Secret ud not found"
    );
    // Fixed.
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "ud"},
                        "stringData": {"value": "#cloud-config\n"}});
    apply(&ns.client, &ns.name, &secret).await.unwrap();
    wait_for(&vms, "v", WAIT, |vm| {
        vm_condition(vm, "Ready").is_some_and(|c| c.status == "True")
    })
    .await;

    // The Secret goes, and the VM is changed: the machine cannot be updated, and the
    // VM says why instead of mirroring a machine that knows nothing of it.
    let secrets: Api<Secret> = ns.api();
    secrets
        .delete("ud", &DeleteParams::default())
        .await
        .unwrap();
    vms.patch(
        "v",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"powerState": "PoweredOff"}})),
    )
    .await
    .unwrap();
    let blocked = wait_for(&vms, "v", WAIT, |vm| {
        vm_condition(vm, "InfrastructureReady").is_some_and(|c| c.reason == "BootstrapDataNotFound")
    })
    .await;
    let infra = vm_condition(&blocked, "InfrastructureReady").unwrap();
    assert_eq!(infra.status, "False");
    assert!(
        infra.message.starts_with("bootstrap Secret ud not found; "),
        "{}",
        infra.message
    );
    assert_eq!(
        blocked.status.as_ref().unwrap().phase,
        Some(VirtualMachinePhase::Running),
        "it still runs"
    );
    assert_eq!(
        vm_condition(&blocked, "PowerState").unwrap().message,
        "want PoweredOff, observed PoweredOn"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_vm_whose_class_is_deleted_keeps_running_and_says_so() {
    let (ns, _operator, class, image) = world("class-gone", json!({})).await;
    let vms: Api<VirtualMachine> = ns.api();
    apply(&ns.client, &ns.name, &vm("v", &class, &image))
        .await
        .unwrap();
    wait_for(&vms, "v", WAIT, |vm| {
        vm_condition(vm, "Ready").is_some_and(|c| c.status == "True")
    })
    .await;
    let classes: Api<VMClass> = Api::all(ns.client.clone());
    classes
        .delete(&class, &DeleteParams::default())
        .await
        .unwrap();
    // It stays placed (Scheduled=True: nothing moves it) and says what is missing
    // where it matters, on InfrastructureReady (power operations still reach it:
    // binding.rs `power_operations_work_while_the_class_is_missing`).
    let orphaned = wait_for(&vms, "v", WAIT, |vm| {
        vm_condition(vm, "InfrastructureReady").is_some_and(|c| c.reason == "ClassNotFound")
    })
    .await;
    let status = orphaned.status.as_ref().unwrap();
    assert_eq!(
        status.phase,
        Some(VirtualMachinePhase::Running),
        "not Pending"
    );
    assert!(
        vm_condition(&orphaned, "Scheduled").is_some_and(|c| c.status == "True"),
        "still placed"
    );
    let missing = vm_condition(&orphaned, "InfrastructureReady").unwrap();
    assert!(
        missing
            .message
            .starts_with(&format!("VMClass {class} not found")),
        "{}",
        missing.message
    );
    assert!(status.provider_id.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_unready_from_its_first_check_is_announced_once() {
    let (ns, _operator, _, _) = world("unready", json!({"noSuchSetting": "1"})).await;
    let providers: Api<Provider> = ns.api();
    let unready = wait_for(&providers, "sim", WAIT, |p| {
        p.status
            .as_ref()
            .and_then(|s| conditions::get(&s.conditions, "Ready"))
            .is_some_and(|c| c.status == "False")
    })
    .await;
    let reason = conditions::get(&unready.status.as_ref().unwrap().conditions, "Ready")
        .unwrap()
        .reason
        .clone();
    // Unready Providers are rechecked every sync period (here 2 s): still one Event.
    tokio::time::sleep(SYNC * 4).await;
    let event = announced_once(&ns, "Provider", "sim", &reason).await;
    assert!(
        event
            .note
            .as_deref()
            .unwrap_or_default()
            .contains("noSuchSetting"),
        "{event:#?}"
    );
    messages::assert_prose(&ns.client, &ns.name).await;
}
