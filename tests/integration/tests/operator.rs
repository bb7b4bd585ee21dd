//! banlieue's controllers against a real apiserver, with the simulated backend:
//! VirtualMachines become Ready, power round-trips, unresolvable references become
//! conditions and recover, deletion cleans up, moves keep the VM, and a converged
//! system stops writing.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use banlieue_integration_tests::apply;
use banlieue_integration_tests::fixtures::sim_provider;
use banlieue_integration_tests::operator::{Operator, wait_for, wait_gone};
use banlieue_sdk::api::infra::libvirt::LibvirtMachine;
use banlieue_sdk::api::{Provider, VirtualMachine};
use banlieue_sdk::conditions;
use banlieue_sdk::contract::InfraMachineRead;
use banlieue_testenv::TestNamespace;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);

fn class(name: &str) -> Value {
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": name},
           "spec": {"cpus": 1, "memoryMiB": 512, "disk": {"sizeGiB": 5, "storageClass": "fast"}}})
}

fn image(name: &str) -> Value {
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": name},
           "spec": {"os": {"family": "linux", "distribution": "debian", "version": "13"}, "sources": {"sim": {"name": "debian"}}}})
}

fn vm(name: &str, class: &str, image: &str, provider: Option<&str>) -> Value {
    let mut vm = json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": name, "labels": {"app": "web"}},
        "spec": {"classRef": {"name": class}, "imageRef": {"name": image}, "networks": [{"name": "eth0", "networkClass": "lan"}]}
    });
    if let Some(p) = provider {
        vm["spec"]["placement"] = json!({"providerRef": {"name": p}});
    }
    vm
}

/// A namespace with a Provider `sim` (endpoint unique to the test), a class and an image.
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
    let operator = Operator::start(ns.client.clone(), &ns.name);
    (ns, operator, class_name, image_name)
}

/// [`world`], plus a Provider `sim-2` (another endpoint) that builds VSphereMachines:
/// somewhere to move to, of another machine kind.
async fn world_and_a_second_provider(
    prefix: &str,
    settings: Value,
) -> (TestNamespace, Operator, String, String) {
    let (ns, operator, class, image) = world(prefix, settings).await;
    apply(
        &ns.client,
        &ns.name,
        &sim_provider(
            "sim-2",
            &format!("sim://{}-2", ns.name),
            json!({"machineKind": "VSphereMachine"}),
        ),
    )
    .await
    .unwrap();
    (ns, operator, class, image)
}

fn condition<'a>(
    vm: &'a VirtualMachine,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    vm.status
        .as_ref()
        .and_then(|s| conditions::get(&s.conditions, type_))
}

fn is_ready(vm: &VirtualMachine) -> bool {
    condition(vm, "Ready").is_some_and(|c| c.status == "True")
}

fn reason_of(vm: &VirtualMachine, type_: &str) -> Option<String> {
    condition(vm, type_).map(|c| c.reason.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_virtual_machine_becomes_ready_with_its_infra_machine_mirrored() {
    let (ns, operator, class, image) = world("ready", json!({"latency": "200ms"})).await;
    apply(&ns.client, &ns.name, &vm("web-1", &class, &image, None))
        .await
        .unwrap();
    let vms: Api<VirtualMachine> = ns.api();
    let ready = wait_for(&vms, "web-1", WAIT, is_ready).await;

    let status = ready.status.as_ref().unwrap();
    let provider_id = status.provider_id.clone().expect("providerID mirrored");
    assert!(provider_id.starts_with("libvirt://"), "{provider_id}");
    assert!(
        status
            .addresses
            .iter()
            .any(|a| a.address.starts_with("10.")),
        "{:?}",
        status.addresses
    );
    assert_eq!(status.placement.as_ref().unwrap().provider, "sim");
    assert_eq!(
        status.phase,
        Some(banlieue_sdk::api::virtual_machine::VirtualMachinePhase::Running)
    );
    assert!(
        ready
            .finalizers()
            .iter()
            .any(|f| f == "banlieue.io/virtual-machine")
    );

    let machines: Api<LibvirtMachine> = ns.api();
    let machine = machines.get("web-1").await.unwrap();
    let owner = &machine.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
        ("VirtualMachine", ready.uid().unwrap().as_str(), Some(true))
    );
    assert_eq!(
        machine
            .labels()
            .get("banlieue.io/virtual-machine")
            .map(String::as_str),
        Some("web-1")
    );
    assert_eq!(machine.labels().get("app").map(String::as_str), Some("web"));
    assert_eq!(
        machine.spec.provider_id.as_deref(),
        Some(provider_id.as_str())
    );
    let machine_status = machine.status.as_ref().unwrap();
    assert_eq!(
        machine_status.initialization.as_ref().unwrap().provisioned,
        Some(true)
    );
    assert!(machine_status.failure_domain.is_some());
    assert!(conditions::is_true(&machine_status.conditions, "Ready"));

    // Exactly one backend machine, carrying the infra object's UID.
    let backend = operator.sim.machines(&format!("sim://{}", ns.name));
    assert_eq!(backend.len(), 1);
    assert_eq!(backend[0].identity.uid, machine.uid().unwrap());

    let providers: Api<Provider> = ns.api();
    let provider = providers.get("sim").await.unwrap();
    let provider_status = provider.status.unwrap();
    assert!(conditions::is_true(
        &provider_status.conditions,
        "Reachable"
    ));
    assert_eq!(provider_status.failure_domains.len(), 2);
    assert_eq!(provider_status.failure_domains[0].storage_classes, ["fast"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_off_and_on_round_trip() {
    let (ns, operator, class, image) = world("power", json!({"latency": "100ms"})).await;
    apply(&ns.client, &ns.name, &vm("v", &class, &image, Some("sim")))
        .await
        .unwrap();
    let vms: Api<VirtualMachine> = ns.api();
    wait_for(&vms, "v", WAIT, is_ready).await;
    let endpoint = format!("sim://{}", ns.name);
    for (state, phase) in [("PoweredOff", "Stopped"), ("PoweredOn", "Running")] {
        let patch = json!({"spec": {"powerState": state}});
        vms.patch("v", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        let vm = wait_for(&vms, "v", WAIT, |vm| {
            is_ready(vm)
                && vm
                    .status
                    .as_ref()
                    .and_then(|s| s.power_state)
                    .map(|p| format!("{p:?}"))
                    == Some(state.into())
        })
        .await;
        let status = vm.status.unwrap();
        assert_eq!(format!("{:?}", status.phase.unwrap()), phase);
        let backend = operator.sim.machines(&endpoint);
        assert_eq!(
            backend[0].power_state.map(|p| format!("{p:?}")).as_deref(),
            Some(state)
        );
        if state == "PoweredOff" {
            assert!(
                status.addresses.is_empty(),
                "a stopped machine reports no address"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_references_become_conditions_and_recover() {
    let ns = banlieue_testenv::namespace("missing").await;
    let _operator = Operator::start(ns.client.clone(), &ns.name);
    let vms: Api<VirtualMachine> = ns.api();
    let (class_name, image_name) = (format!("{}-small", ns.name), format!("{}-debian", ns.name));
    apply(
        &ns.client,
        &ns.name,
        &vm("v", &class_name, &image_name, Some("sim")),
    )
    .await
    .unwrap();

    let v = wait_for(&vms, "v", WAIT, |vm| {
        reason_of(vm, "Scheduled").as_deref() == Some("ClassNotFound")
    })
    .await;
    assert!(
        condition(&v, "Scheduled")
            .unwrap()
            .message
            .contains(&class_name)
    );
    apply(&ns.client, &ns.name, &class(&class_name))
        .await
        .unwrap();
    wait_for(&vms, "v", WAIT, |vm| {
        reason_of(vm, "Scheduled").as_deref() == Some("ImageNotFound")
    })
    .await;
    apply(&ns.client, &ns.name, &image(&image_name))
        .await
        .unwrap();
    wait_for(&vms, "v", WAIT, |vm| {
        reason_of(vm, "Scheduled").as_deref() == Some("ProviderNotFound")
    })
    .await;

    // A Provider whose credentials Secret is missing is not Ready, and says why.
    let mut provider = sim_provider("sim", &format!("sim://{}", ns.name), json!({}));
    provider["spec"]["connection"]["credentialsRef"] = json!({"name": "sim-credentials"});
    apply(&ns.client, &ns.name, &provider).await.unwrap();
    let providers: Api<Provider> = ns.api();
    let p = wait_for(&providers, "sim", WAIT, |p| {
        p.status
            .as_ref()
            .and_then(|s| conditions::get(&s.conditions, "Ready"))
            .is_some_and(|c| c.reason == "CredentialsNotFound")
    })
    .await;
    let message = &conditions::get(&p.status.as_ref().unwrap().conditions, "Ready")
        .unwrap()
        .message;
    assert!(message.contains("sim-credentials"), "{message}");
    wait_for(&vms, "v", WAIT, |vm| {
        reason_of(vm, "Scheduled").as_deref() == Some("NoFeasibleProvider")
    })
    .await;

    // The Secret appears: the Provider is re-checked at once (Secret watch), the VM proceeds.
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "sim-credentials"}, "stringData": {"token": "t0p-s3cret"}});
    apply(&ns.client, &ns.name, &secret).await.unwrap();
    let ready = wait_for(&vms, "v", WAIT, is_ready).await;
    let everything = serde_json::to_string(&ready).unwrap()
        + &serde_json::to_string(&providers.get("sim").await.unwrap()).unwrap();
    assert!(
        !everything.contains("t0p-s3cret"),
        "a secret value leaked into status"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletion_removes_the_infra_machine_and_the_backend_vm() {
    let (ns, operator, class, image) = world("delete", json!({"latency": "100ms"})).await;
    let endpoint = format!("sim://{}", ns.name);
    let vms: Api<VirtualMachine> = ns.api();
    let machines: Api<LibvirtMachine> = ns.api();
    for name in ["a", "b"] {
        apply(&ns.client, &ns.name, &vm(name, &class, &image, Some("sim")))
            .await
            .unwrap();
        wait_for(&vms, name, WAIT, is_ready).await;
    }
    assert_eq!(operator.sim.machines(&endpoint).len(), 2);

    vms.delete("a", &DeleteParams::default()).await.unwrap();
    wait_gone(&vms, "a", WAIT).await;
    assert!(
        machines.get_opt("a").await.unwrap().is_none(),
        "infra machine deleted explicitly"
    );
    assert_eq!(
        operator.sim.machines(&endpoint).len(),
        1,
        "backend VM gone before the finalizer went"
    );

    // A Provider with a machine on it waits for it: deleting the VM afterwards still
    // reaches the backend, and then the Provider goes.
    let providers: Api<Provider> = ns.api();
    providers
        .delete("sim", &DeleteParams::default())
        .await
        .unwrap();
    let blocked = wait_for(&providers, "sim", WAIT, |p| {
        p.status.as_ref().is_some_and(|s| {
            conditions::get(&s.conditions, "Ready").is_some_and(|c| c.reason == "DeletionBlocked")
        })
    })
    .await;
    let status = blocked.status.unwrap();
    let message = &conditions::get(&status.conditions, "Ready")
        .unwrap()
        .message;
    assert!(message.contains("LibvirtMachine/b"), "{message}");
    vms.delete("b", &DeleteParams::default()).await.unwrap();
    wait_gone(&vms, "b", WAIT).await;
    assert!(machines.get_opt("b").await.unwrap().is_none());
    assert!(
        operator.sim.machines(&endpoint).is_empty(),
        "the last backend VM was deleted through the Provider"
    );
    wait_gone(&providers, "sim", WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moving_to_another_provider_keeps_the_virtual_machine() {
    let (ns, operator, class, image) =
        world_and_a_second_provider("swap", json!({"latency": "100ms"})).await;
    let vms: Api<VirtualMachine> = ns.api();
    apply(&ns.client, &ns.name, &vm("v", &class, &image, Some("sim")))
        .await
        .unwrap();
    let before = wait_for(&vms, "v", WAIT, is_ready).await;
    let old_id = before.status.as_ref().unwrap().provider_id.clone().unwrap();

    apply(
        &ns.client,
        &ns.name,
        &vm("v", &class, &image, Some("sim-2")),
    )
    .await
    .unwrap();
    let after = wait_for(&vms, "v", WAIT, |vm| {
        is_ready(vm)
            && vm
                .status
                .as_ref()
                .and_then(|s| s.placement.as_ref())
                .is_some_and(|p| p.provider == "sim-2")
    })
    .await;
    assert_eq!(before.uid(), after.uid(), "the same VirtualMachine object");
    let new_id = after.status.as_ref().unwrap().provider_id.clone().unwrap();
    assert!(
        new_id.starts_with("vsphere://"),
        "rebuilt as the new Provider's kind: {new_id}"
    );
    assert_ne!(old_id, new_id);
    assert!(
        operator
            .sim
            .machines(&format!("sim://{}", ns.name))
            .is_empty(),
        "old backend VM deleted"
    );
    assert_eq!(
        operator.sim.machines(&format!("sim://{}-2", ns.name)).len(),
        1
    );
    let migrating = condition(&after, "Migrating").expect("Migrating recorded");
    assert_eq!(
        (migrating.status.as_str(), migrating.reason.as_str()),
        ("False", "Completed")
    );
    let machines: Api<LibvirtMachine> = ns.api();
    assert!(
        machines.get_opt("v").await.unwrap().is_none(),
        "the old kind's object is gone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_disk_is_refused_before_anything_moves_never_a_silent_recreate() {
    let (ns, operator, class, image) = world_and_a_second_provider("copydisk", json!({})).await;
    let vms: Api<VirtualMachine> = ns.api();
    let mut manifest = vm("v", &class, &image, Some("sim"));
    manifest["spec"]["migration"] = json!({"strategy": "CopyDisk"});
    apply(&ns.client, &ns.name, &manifest).await.unwrap();
    let before = wait_for(&vms, "v", WAIT, is_ready).await;
    let old_id = before.status.as_ref().unwrap().provider_id.clone();

    manifest["spec"]["placement"] = json!({"providerRef": {"name": "sim-2"}});
    apply(&ns.client, &ns.name, &manifest).await.unwrap();
    let refused = wait_for(&vms, "v", WAIT, |vm| {
        condition(vm, "Migrating").is_some_and(|c| c.reason == "CopyDiskUnsupported")
    })
    .await;
    let migrating = condition(&refused, "Migrating").unwrap();
    assert_eq!(migrating.status, "False");
    assert!(
        migrating.message.contains("Recreate") && migrating.message.contains("stays on sim"),
        "the message says what to do: {}",
        migrating.message
    );
    // Still where it was, still running, nothing made on the target.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let now = vms.get("v").await.unwrap();
    assert!(is_ready(&now), "{:?}", now.status);
    assert_eq!(now.status.as_ref().unwrap().provider_id, old_id);
    assert_eq!(
        now.status
            .as_ref()
            .unwrap()
            .placement
            .as_ref()
            .map(|p| p.provider.as_str()),
        Some("sim")
    );
    assert_eq!(
        operator.sim.machines(&format!("sim://{}", ns.name)).len(),
        1
    );
    assert!(
        operator
            .sim
            .machines(&format!("sim://{}-2", ns.name))
            .is_empty(),
        "no machine made on the target"
    );

    // Asking for Recreate moves it.
    manifest["spec"]["migration"] = json!({"strategy": "Recreate"});
    apply(&ns.client, &ns.name, &manifest).await.unwrap();
    wait_for(&vms, "v", WAIT, |vm| {
        is_ready(vm)
            && vm
                .status
                .as_ref()
                .and_then(|s| s.placement.as_ref())
                .is_some_and(|p| p.provider == "sim-2")
    })
    .await;
    assert!(
        operator
            .sim
            .machines(&format!("sim://{}", ns.name))
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_machine_adopts_its_vm_and_one_whose_vm_is_gone_creates_none() {
    let (ns, operator, _, _) = world("restore", json!({})).await;
    let endpoint = format!("sim://{}", ns.name);
    let machine = |name: &str, provider_id: Option<&str>| {
        let mut m = json!({"apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "LibvirtMachine",
            "metadata": {"name": name},
            "spec": {"providerRef": {"name": "sim"}, "image": {"path": "/var/lib/images/debian.qcow2"},
                     "storagePool": "default", "cpus": 1, "memoryMiB": 256}});
        if let Some(id) = provider_id {
            m["spec"]["providerID"] = json!(id);
        }
        m
    };
    let ready = |m: &LibvirtMachine| {
        m.status
            .as_ref()
            .is_some_and(|s| conditions::is_true(&s.conditions, "Ready"))
    };
    let machines: Api<LibvirtMachine> = ns.api();
    apply(&ns.client, &ns.name, &machine("m", None))
        .await
        .unwrap();
    let first = wait_for(&machines, "m", WAIT, ready).await;
    let provider_id = first.spec.provider_id.clone().expect("a providerID");
    assert_eq!(operator.sim.machines(&endpoint).len(), 1);

    // Lost and restored from a backup: the object comes back with a new UID and its
    // providerID; the VM never went away. The operator is stopped while the object is
    // lost, or it would put its finalizer back and delete the VM on the DELETE.
    let sim = operator.sim.clone();
    drop(operator);
    tokio::time::sleep(Duration::from_secs(2)).await;
    machines
        .patch(
            "m",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    machines
        .delete("m", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&machines, "m", WAIT).await;
    assert_eq!(
        sim.machines(&endpoint).len(),
        1,
        "the VM outlived its object"
    );
    let mut registry = banlieue_sdk::backend::BackendRegistry::default();
    registry.register(banlieue_sdk::api::common::ProviderClass::Sim, sim.clone());
    let operator = Operator::start_with_registry(
        ns.client.clone(),
        &ns.name,
        registry,
        sim,
        Duration::from_secs(5),
    );
    apply(&ns.client, &ns.name, &machine("m", Some(&provider_id)))
        .await
        .unwrap();
    let restored = wait_for(&machines, "m", WAIT, |m| ready(m) && m.uid() != first.uid()).await;
    assert_eq!(
        restored.spec.provider_id.as_deref(),
        Some(provider_id.as_str())
    );
    let sims = operator.sim.machines(&endpoint);
    assert_eq!(sims.len(), 1, "adopted, not created again: {sims:?}");
    assert_eq!(
        Some(sims[0].identity.uid.as_str()),
        restored.uid().as_deref(),
        "the VM now answers to the restored object's UID"
    );

    // A providerID no VM has: says so, creates nothing, and deleting it is quick.
    apply(
        &ns.client,
        &ns.name,
        &machine(
            "gone",
            Some("libvirt://0b9e8a62-5d7c-4c51-9f0e-2a9f6c1d3e47"),
        ),
    )
    .await
    .unwrap();
    let missing = wait_for(&machines, "gone", WAIT, |m| {
        m.status.as_ref().is_some_and(|s| {
            conditions::get(&s.conditions, "Ready")
                .is_some_and(|c| c.message.starts_with("BackendVMMissing:"))
        })
    })
    .await;
    let condition = missing
        .status
        .as_ref()
        .and_then(|s| conditions::get(&s.conditions, "Ready"))
        .unwrap();
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_str()),
        ("False", "TerminalFailure")
    );
    assert!(
        condition
            .message
            .contains("libvirt://0b9e8a62-5d7c-4c51-9f0e-2a9f6c1d3e47"),
        "{}",
        condition.message
    );
    assert_eq!(operator.sim.machines(&endpoint).len(), 1, "nothing created");
    machines
        .delete("gone", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&machines, "gone", WAIT).await;
    assert_eq!(operator.sim.machines(&endpoint).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_faults_converge_and_terminal_ones_stop() {
    let (ns, operator, class, image) = world(
        "faults",
        json!({"failureRate": "0.3", "failureKinds": "transient", "seed": "7"}),
    )
    .await;
    let vms: Api<VirtualMachine> = ns.api();
    for i in 0..3 {
        apply(
            &ns.client,
            &ns.name,
            &vm(&format!("v{i}"), &class, &image, Some("sim")),
        )
        .await
        .unwrap();
    }
    for i in 0..3 {
        wait_for(&vms, &format!("v{i}"), WAIT, is_ready).await;
    }
    assert_eq!(
        operator.sim.machines(&format!("sim://{}", ns.name)).len(),
        3,
        "retries never duplicate a machine"
    );

    // Terminal: capacity 0 on a second Provider.
    apply(
        &ns.client,
        &ns.name,
        &sim_provider(
            "full",
            &format!("sim://{}-full", ns.name),
            json!({"capacity": "0"}),
        ),
    )
    .await
    .unwrap();
    apply(
        &ns.client,
        &ns.name,
        &vm("too-many", &class, &image, Some("full")),
    )
    .await
    .unwrap();
    let failed = wait_for(&vms, "too-many", WAIT, |vm| {
        reason_of(vm, "InfrastructureReady").as_deref() == Some("TerminalFailure")
    })
    .await;
    assert!(
        condition(&failed, "InfrastructureReady")
            .unwrap()
            .message
            .contains("InsufficientCapacity")
    );
    assert_eq!(
        format!("{:?}", failed.status.unwrap().phase.unwrap()),
        "Failed"
    );
    let endpoint = format!("sim://{}-full", ns.name);
    let calls_before = operator.sim.stats(&endpoint).ensure;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let calls_after = operator.sim.stats(&endpoint).ensure;
    assert!(
        calls_after - calls_before <= 1,
        "a terminal failure is not retried hot: {calls_before} -> {calls_after}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_converged_system_stops_writing() {
    let (ns, _operator, class, image) = world("steady", json!({})).await;
    let vms: Api<VirtualMachine> = ns.api();
    for i in 0..5 {
        apply(
            &ns.client,
            &ns.name,
            &vm(&format!("v{i}"), &class, &image, None),
        )
        .await
        .unwrap();
    }
    for i in 0..5 {
        wait_for(&vms, &format!("v{i}"), WAIT, is_ready).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await; // let the last mirrors land
    let versions = snapshot(&ns).await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(
        versions,
        snapshot(&ns).await,
        "objects changed after convergence"
    );
}

/// resourceVersion of every VM, infra machine and Provider in the namespace.
async fn snapshot(ns: &TestNamespace) -> BTreeMap<String, String> {
    let mut versions = BTreeMap::new();
    for vm in ns
        .api::<VirtualMachine>()
        .list(&ListParams::default())
        .await
        .unwrap()
    {
        versions.insert(
            format!("vm/{}", vm.name_any()),
            vm.resource_version().unwrap(),
        );
    }
    for m in ns
        .api::<LibvirtMachine>()
        .list(&ListParams::default())
        .await
        .unwrap()
    {
        versions.insert(
            format!("machine/{}", m.name_any()),
            m.resource_version().unwrap(),
        );
    }
    for p in ns
        .api::<Provider>()
        .list(&ListParams::default())
        .await
        .unwrap()
    {
        versions.insert(
            format!("provider/{}", p.name_any()),
            p.meta().resource_version.clone().unwrap(),
        );
    }
    versions
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_reports_synced_caches() {
    let ns = banlieue_testenv::namespace("readiness").await;
    let operator = Operator::start(ns.client.clone(), &ns.name);
    let started = std::time::Instant::now();
    while !operator.readiness.is_ready() {
        assert!(
            started.elapsed() < WAIT,
            "caches never reported synced: {:?}",
            operator.readiness
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vms_applied_together_honour_anti_affinity_and_spread() {
    let (ns, _operator, class, image) = world(
        "spread",
        json!({"latency": "200ms", "failureDomains": "zone-a,zone-b,zone-c"}),
    )
    .await;
    let vms: Api<VirtualMachine> = ns.api();
    let names = ["w1", "w2", "w3"];
    for name in names {
        let mut object = vm(name, &class, &image, Some("sim"));
        object["spec"]["placement"]["antiAffinity"] = json!([{
            "labelSelector": {"matchLabels": {"app": "web"}},
            "topologyKey": "topology.kubernetes.io/zone",
            "mode": "Required"
        }]);
        apply(&ns.client, &ns.name, &object).await.unwrap();
    }
    let mut zones = std::collections::BTreeSet::new();
    for name in names {
        let ready = wait_for(&vms, name, WAIT, is_ready).await;
        zones.insert(
            ready
                .status
                .unwrap()
                .placement
                .unwrap()
                .failure_domain
                .unwrap(),
        );
    }
    assert_eq!(
        zones.len(),
        3,
        "three VMs with required zone anti-affinity in three zones: {zones:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_data_reaches_the_backend_and_never_the_status() {
    let (ns, operator, class, image) = world("bootstrap", json!({})).await;
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "user-data"},
                        "stringData": {"cloud-init": "#cloud-config\npassword: hunter2-secret\n", "net": "version: 2\n"}});
    apply(&ns.client, &ns.name, &secret).await.unwrap();
    let mut object = vm("v", &class, &image, Some("sim"));
    object["spec"]["bootstrap"] = json!({
        "format": "cloud-config",
        "userData": {"name": "user-data", "key": "cloud-init"},
        "networkConfig": {"name": "user-data", "key": "net"}
    });
    apply(&ns.client, &ns.name, &object).await.unwrap();
    let vms: Api<VirtualMachine> = ns.api();
    let ready = wait_for(&vms, "v", WAIT, is_ready).await;

    let machines: Api<LibvirtMachine> = ns.api();
    let machine = machines.get("v").await.unwrap();
    assert_eq!(
        machine.spec.bootstrap.as_ref().unwrap().data_secret_name,
        "v-bootstrap"
    );
    let data = operator
        .sim
        .bootstrap_data(&format!("sim://{}", ns.name), &machine.uid().unwrap())
        .expect("the backend received bootstrap data");
    assert!(data.user_data.expose().contains("hunter2-secret"));
    assert_eq!(
        data.network_config.as_ref().map(|n| n.expose()),
        Some("version: 2\n")
    );
    let written =
        serde_json::to_string(&ready).unwrap() + &serde_json::to_string(&machine).unwrap();
    assert!(
        !written.contains("hunter2-secret"),
        "bootstrap data leaked into an object"
    );

    // Deleting the VM removes the Secret banlieue made for it.
    vms.delete("v", &DeleteParams::default()).await.unwrap();
    wait_gone(&vms, "v", WAIT).await;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = ns.api();
    assert!(secrets.get_opt("v-bootstrap").await.unwrap().is_none());
}

/// Finding 3 of issue 37: whoever may create a VirtualMachine `x` could have the
/// operator overwrite, then delete, the Secret `x-bootstrap` of its namespace. A
/// Secret of that name that is not the VM's own copy is now neither written nor
/// deleted, and the VM says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_secret_named_like_the_bootstrap_copy_is_neither_overwritten_nor_deleted() {
    let (ns, _operator, class, image) = world("bootstrap-conflict", json!({})).await;
    for object in [
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "user-data"},
               "stringData": {"value": "#cloud-config\n"}}),
        // Someone else's Secret, which happens to (or is made to) carry the name.
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "x-bootstrap"},
               "stringData": {"tls.key": "the database's key"}}),
    ] {
        apply(&ns.client, &ns.name, &object).await.unwrap();
    }
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = ns.api();
    let before = secrets.get("x-bootstrap").await.unwrap();
    let mut object = vm("x", &class, &image, Some("sim"));
    object["spec"]["bootstrap"] =
        json!({"format": "cloud-config", "userData": {"name": "user-data"}});
    apply(&ns.client, &ns.name, &object).await.unwrap();
    let vms: Api<VirtualMachine> = ns.api();
    let refused = wait_for(&vms, "x", WAIT, |vm| {
        condition(vm, "InfrastructureReady").is_some_and(|c| c.reason == "BootstrapSecretConflict")
    })
    .await;
    assert!(!is_ready(&refused));
    let message = condition(&refused, "InfrastructureReady")
        .unwrap()
        .message
        .clone();
    assert!(
        message.contains("x-bootstrap") && message.contains("it has no owner"),
        "the condition names the Secret and its owner: {message}"
    );
    let machines: Api<LibvirtMachine> = ns.api();
    assert!(
        machines.get_opt("x").await.unwrap().is_none(),
        "no machine is made with someone else's Secret as its bootstrap data"
    );
    let after = secrets.get("x-bootstrap").await.unwrap();
    assert_eq!(
        after.data, before.data,
        "the foreign Secret was overwritten"
    );
    assert_eq!(
        after.metadata.resource_version,
        before.metadata.resource_version
    );

    vms.delete("x", &DeleteParams::default()).await.unwrap();
    wait_gone(&vms, "x", WAIT).await;
    let kept = secrets
        .get_opt("x-bootstrap")
        .await
        .unwrap()
        .expect("the foreign Secret was deleted with the VM");
    assert_eq!(kept.data, before.data);
}

/// A client of the shared control plane that records each request it sends as
/// `METHOD /path` (query left out), to count what the operator asks of the apiserver.
async fn recording_client(seen: Arc<Mutex<Vec<String>>>) -> kube::Client {
    let kubeconfig = kube::config::Kubeconfig::read_from(banlieue_testenv::kubeconfig_path())
        .expect("the control plane's kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("a client config");
    let record =
        tower::util::MapRequestLayer::new(move |request: http::Request<kube::client::Body>| {
            let line = format!("{} {}", request.method(), request.uri().path());
            seen.lock().expect("not poisoned").push(line);
            request
        });
    kube::client::ClientBuilder::try_from(config)
        .expect("a client builder")
        .with_layer(&record)
        .build()
}

/// A machine that is made (provider ID set, `Ready`) goes to the backend without its
/// bootstrap data, so its resyncs read no Secret: before, each was a live `GET`. A
/// standalone machine (no VirtualMachine, whose controller reads its own sources), so
/// every `GET` of the Secret counted is the machine controller's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_made_machine_reads_no_bootstrap_secret_when_it_resyncs() {
    let ns = banlieue_testenv::namespace("made-no-secret").await;
    let endpoint = format!("sim://{}", ns.name);
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "m-data"},
                        "stringData": {"value": "#cloud-config\n", "format": "cloud-config"}});
    for object in [sim_provider("sim", &endpoint, json!({})), secret] {
        apply(&ns.client, &ns.name, &object).await.expect("fixture");
    }
    let seen = Arc::new(Mutex::new(Vec::new()));
    // A one-second sync period: a made machine goes to the backend about once a second.
    let operator = Operator::start_with(
        recording_client(seen.clone()).await,
        &ns.name,
        Duration::from_secs(1),
    );
    let machine = json!({
        "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "LibvirtMachine", "metadata": {"name": "m"},
        "spec": {"image": {"path": "/var/lib/libvirt/images/debian.qcow2"}, "cpus": 1, "memoryMiB": 512,
                 "network": [{"network": "default"}], "providerRef": {"name": "sim"},
                 "bootstrap": {"dataSecretName": "m-data"}}
    });
    apply(&ns.client, &ns.name, &machine).await.unwrap();
    let machines: Api<LibvirtMachine> = ns.api();
    wait_for(&machines, "m", WAIT, |m: &LibvirtMachine| {
        m.has_provider_id() && m.is_ready()
    })
    .await;

    let get = format!("GET /api/v1/namespaces/{}/secrets/m-data", ns.name);
    let gets = || seen.lock().unwrap().iter().filter(|l| **l == get).count();
    let ensures = || operator.sim.stats(&endpoint).ensure;
    assert!(
        gets() >= 1,
        "the machine read its bootstrap Secret to create its VM (else this test counts nothing)"
    );
    // The reconcile that wrote Ready may be followed by one that saw the cache before it.
    let wait_ensures = |n: u64| {
        let target = ensures() + n;
        async move {
            let started = std::time::Instant::now();
            while ensures() < target {
                assert!(
                    started.elapsed() < WAIT,
                    "the made machine was not resynced"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    wait_ensures(2).await;
    let before = gets();
    wait_ensures(3).await;
    assert_eq!(
        gets(),
        before,
        "three resyncs of a made machine read its bootstrap Secret"
    );
}

/// The class is open (any DNS label, for backends registered out of tree): a Provider
/// whose class no registered backend serves is admitted and says so, and a VM placed
/// on it is reported unschedulable rather than built as some other kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_of_an_unserved_class_says_so() {
    let (ns, _operator, class, image) = world("unserved-class", json!({})).await;
    let mut provider = sim_provider("hyperv", "hyperv://host", json!({}));
    provider["spec"]["class"] = json!("hyperv");
    apply(&ns.client, &ns.name, &provider).await.unwrap();
    let providers: Api<Provider> = Api::namespaced(ns.client.clone(), &ns.name);
    let reachable = |p: &Provider| {
        p.status
            .as_ref()
            .and_then(|s| conditions::get(&s.conditions, "Reachable"))
            .cloned()
    };
    let seen = wait_for(&providers, "hyperv", WAIT, |p| {
        reachable(p).is_some_and(|c| c.status == "False")
    })
    .await;
    let unserved = reachable(&seen).unwrap();
    assert_eq!(unserved.reason, "BackendNotCompiledIn");
    assert!(
        unserved.message.contains("hyperv")
            && unserved.message.contains("it serves sim;")
            && !unserved.message.contains("did you mean"),
        "names the class and what this operator serves: {}",
        unserved.message
    );
    // A near miss of a served class is told which one it likely meant.
    let mut typo = sim_provider("typo", "simm://host", json!({}));
    typo["spec"]["class"] = json!("simm");
    apply(&ns.client, &ns.name, &typo).await.unwrap();
    let typo = wait_for(&providers, "typo", WAIT, |p| {
        reachable(p).is_some_and(|c| c.status == "False")
    })
    .await;
    let typo = reachable(&typo).unwrap();
    assert_eq!(typo.reason, "BackendNotCompiledIn");
    assert!(
        typo.message.starts_with(
            "no backend serves class simm in this operator (did you mean sim?): it serves sim;"
        ),
        "{}",
        typo.message
    );

    apply(
        &ns.client,
        &ns.name,
        &vm("pinned", &class, &image, Some("hyperv")),
    )
    .await
    .unwrap();
    let vms: Api<VirtualMachine> = Api::namespaced(ns.client.clone(), &ns.name);
    let vm = wait_for(&vms, "pinned", WAIT, |vm| {
        condition(vm, "Scheduled").is_some_and(|c| c.status == "False")
    })
    .await;
    let scheduled = condition(&vm, "Scheduled").unwrap();
    assert!(
        scheduled.message.contains("hyperv"),
        "says why it cannot go there: {} {}",
        scheduled.reason,
        scheduled.message
    );
    let machines: Api<LibvirtMachine> = Api::namespaced(ns.client.clone(), &ns.name);
    assert!(
        machines.get_opt("pinned").await.unwrap().is_none(),
        "nothing is built as another kind"
    );
}
