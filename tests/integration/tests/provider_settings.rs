//! A Provider's settings are checked as a whole (issue 37, item 10): a value that is
//! wrong but looked fine (`maxConcurrentCreates: "-1"`, `"abc"`, `"1e9"`, `""`, 2^64) or
//! a misspelt key (`capabilities.secureboot`, a backend's `waitforaddress`) makes the
//! Provider `Ready=False InvalidSettings` with one Warning Event naming the key and what
//! is allowed, and no VM is placed on it until it is fixed. Before, each of these left
//! the Provider `Ready=True`: VMs landed on it and waited forever (or the setting was
//! silently ignored and `efi-secure` stayed advertised).
//!
//! Real apiserver + the operator in-process, the sim backend, and the vSphere backend's
//! settings parser (its Provider points at a closed loopback port: settings are refused
//! before any connection is made).

use std::sync::Arc;
use std::time::Duration;

use banlieue_backend_sim::SimFactory;
use banlieue_backend_vsphere::VSphereFactory;
use banlieue_integration_tests::apply;
use banlieue_integration_tests::fixtures::sim_provider;
use banlieue_integration_tests::operator::{Operator, wait_for};
use banlieue_sdk::api::common::ProviderClass;
use banlieue_sdk::api::infra::libvirt::LibvirtMachine;
use banlieue_sdk::api::{Provider, VirtualMachine};
use banlieue_sdk::backend::BackendRegistry;
use banlieue_sdk::conditions;
use banlieue_testenv::TestNamespace;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);
/// Short, so a recheck that repeated the Event would be seen.
const SYNC: Duration = Duration::from_secs(2);

/// The bad caps on creates the hostile run found left a Provider Ready.
const BAD_CAPS: [&str; 5] = ["-1", "abc", "1e9", "", "18446744073709551616"];

fn ready(p: &Provider) -> Option<Condition> {
    p.status
        .as_ref()
        .and_then(|s| conditions::get(&s.conditions, "Ready"))
        .cloned()
}

async fn warnings(ns: &TestNamespace, name: &str, reason: &str) -> Vec<Event> {
    let events: Api<Event> = ns.api();
    events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.type_.as_deref() == Some("Warning")
                && e.regarding.as_ref().is_some_and(|r| {
                    r.kind.as_deref() == Some("Provider") && r.name.as_deref() == Some(name)
                })
        })
        .collect()
}

/// Waits until `name` is `Ready=False InvalidSettings`, checks the message names every
/// part of `expected`, and that it was announced by exactly one Warning Event.
async fn refused(ns: &TestNamespace, name: &str, expected: &[&str]) -> Condition {
    let providers: Api<Provider> = ns.api();
    let seen = wait_for(&providers, name, WAIT, |p| {
        ready(p).is_some_and(|c| c.reason == "InvalidSettings")
    })
    .await;
    let condition = ready(&seen).unwrap();
    assert_eq!(condition.status, "False", "{name}");
    for part in expected {
        assert!(
            condition.message.contains(part),
            "{name}: {part:?} not in {:?}",
            condition.message
        );
    }
    // Several rechecks later (SYNC), still one Event, not a series.
    tokio::time::sleep(SYNC * 3).await;
    let events = warnings(ns, name, "InvalidSettings").await;
    assert_eq!(
        events.len(),
        1,
        "{name}: one InvalidSettings Warning: {events:#?}"
    );
    assert!(events[0].series.is_none(), "{name}: repeated: {events:#?}");
    let note = events[0].note.clone().unwrap_or_default();
    assert!(
        expected.iter().all(|part| note.contains(part)),
        "{name}: the Event names it too: {note}"
    );
    condition
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_wrong_as_a_whole_make_the_provider_not_ready_and_nothing_lands_on_it() {
    let ns = banlieue_testenv::namespace("provider-settings").await;
    let mut objects = Vec::new();
    for (i, cap) in BAD_CAPS.iter().enumerate() {
        objects.push(sim_provider(
            &format!("cap-{i}"),
            &format!("sim://{}-cap-{i}", ns.name),
            json!({"maxConcurrentCreates": cap}),
        ));
    }
    objects.push(sim_provider(
        "typo",
        &format!("sim://{}-typo", ns.name),
        json!({"capabilities.secureboot": "false"}),
    ));
    objects.push(sim_provider(
        "good",
        &format!("sim://{}-good", ns.name),
        json!({"maxConcurrentCreates": "3", "capabilities.secureBoot": "false"}),
    ));
    objects.push(
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "vc"},
                        "stringData": {"username": "vc-user-337", "password": "vc-password-8842"}}),
    );
    objects.push(
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider",
        "metadata": {"name": "vc"},
        "spec": {"class": "vsphere",
                 // Nothing listens there; the settings are refused before a connection.
                 "connection": {"endpoint": "https://127.0.0.1:9/sdk",
                                "credentialsRef": {"name": "vc"}},
                 "settings": {"waitforaddress": "false", "taskPollInterval": "1s"}}}),
    );
    let class = format!("{}-small", ns.name);
    let image = format!("{}-debian", ns.name);
    objects.push(
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": class},
        "spec": {"cpus": 1, "memoryMiB": 512, "disk": {"sizeGiB": 5, "storageClass": "fast"}}}),
    );
    objects.push(
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": image},
        "spec": {"os": {"family": "linux", "distribution": "debian", "version": "13"},
                 "sources": {"sim": {"name": "debian"}}}}),
    );
    objects.push(
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
        "metadata": {"name": "pinned"},
        "spec": {"classRef": {"name": class}, "imageRef": {"name": image},
                 "networks": [{"name": "eth0", "networkClass": "lan"}],
                 "placement": {"providerRef": {"name": "cap-0"}}}}),
    );
    for object in &objects {
        apply(&ns.client, &ns.name, object).await.expect("fixture");
    }
    let sim = Arc::new(SimFactory::new());
    let mut registry = BackendRegistry::default();
    registry.register(ProviderClass::Sim, sim.clone());
    registry.register(ProviderClass::Vsphere, Arc::new(VSphereFactory::new()));
    let _operator = Operator::start_with_registry(ns.client.clone(), &ns.name, registry, sim, SYNC);

    for (i, cap) in BAD_CAPS.iter().enumerate() {
        refused(
            &ns,
            &format!("cap-{i}"),
            &[
                &format!("settings.maxConcurrentCreates {cap:?} is not a whole number from 0 (no cap) to 100000"),
                "no VM is placed on this Provider until the settings are fixed",
            ],
        )
        .await;
    }
    refused(
        &ns,
        "typo",
        &["settings.capabilities.secureboot is not a setting (did you mean capabilities.secureBoot?)"],
    )
    .await;
    refused(
        &ns,
        "vc",
        &["settings.waitforaddress is not a setting (did you mean waitForAddress?)"],
    )
    .await;
    let providers: Api<Provider> = ns.api();
    let good = wait_for(&providers, "good", WAIT, |p| {
        ready(p).is_some_and(|c| c.status == "True")
    })
    .await;
    assert!(
        !good
            .status
            .unwrap()
            .backend_capabilities
            .unwrap()
            .firmware
            .contains(&banlieue_sdk::api::common::Firmware::EfiSecure),
        "the well-spelt key narrows"
    );

    // Nothing lands on a Provider whose settings are wrong...
    let vms: Api<VirtualMachine> = ns.api();
    let machines: Api<LibvirtMachine> = ns.api();
    wait_for(&vms, "pinned", WAIT, |vm| {
        vm.status
            .as_ref()
            .and_then(|s| conditions::get(&s.conditions, "Scheduled"))
            .is_some_and(|c| c.status == "False")
    })
    .await;
    assert!(
        machines.get_opt("pinned").await.unwrap().is_none(),
        "no machine built"
    );
    // ...until they are fixed: then it does, and becomes Ready.
    providers
        .patch(
            "cap-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"settings": {"maxConcurrentCreates": "2"}}})),
        )
        .await
        .unwrap();
    wait_for(&providers, "cap-0", WAIT, |p| {
        ready(p).is_some_and(|c| c.status == "True")
    })
    .await;
    wait_for(&vms, "pinned", WAIT, |vm| {
        vm.status
            .as_ref()
            .and_then(|s| conditions::get(&s.conditions, "Ready"))
            .is_some_and(|c| c.status == "True")
    })
    .await;
}
