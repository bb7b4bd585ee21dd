//! A placed VM is bound to its Provider (SPEC §3.1): an edit to another object that
//! makes its placement no longer match — a Provider relabelled, a failure domain's
//! labels changed, a capability narrowed by the Provider's settings, the Provider being
//! deleted — is reported on the VM (`PlacementDrifted`, one Event) and moves nothing:
//! the backend VM keeps its identity and sees no create or delete. Its own spec still
//! moves it.
//!
//! Real apiserver + operator with the sim backend (call counters per endpoint), and
//! vcsim for one trigger on a real vSphere API.

use std::sync::Arc;
use std::time::Duration;

use banlieue_backend_sim::{SimFactory, SimStats};
use banlieue_backend_vsphere::VSphereFactory;
use banlieue_integration_tests::apply;
use banlieue_integration_tests::fixtures::sim_provider;
use banlieue_integration_tests::operator::{Operator, wait_for};
use banlieue_integration_tests::vcsim::Vcsim;
use banlieue_sdk::api::common::{PowerState, ProviderClass};
use banlieue_sdk::api::{Provider, VMImage, VirtualMachine};
use banlieue_sdk::backend::BackendRegistry;
use banlieue_sdk::conditions;
use banlieue_testenv::TestNamespace;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);
/// How long a bound VM is watched after its drift is reported: a Recreate move (the
/// bug) deletes the old machine within a second or two.
const SETTLE: Duration = Duration::from_secs(6);

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

fn drifted(vm: &VirtualMachine, reason: &str) -> bool {
    condition(vm, "PlacementDrifted").is_some_and(|c| c.status == "True" && c.reason == reason)
}

fn provider_of(vm: &VirtualMachine) -> Option<String> {
    vm.status
        .as_ref()
        .and_then(|s| s.placement.as_ref())
        .map(|p| p.provider.clone())
}

fn provider_id(vm: &VirtualMachine) -> Option<String> {
    vm.status.as_ref().and_then(|s| s.provider_id.clone())
}

/// A namespace with `providers` (name, settings, labels, declared failure domains), a
/// class asking `features`, an image, and the operator.
async fn world(
    prefix: &str,
    providers: &[(&str, Value, Value, Value)],
    features: &[&str],
) -> (TestNamespace, Operator, String, String) {
    let ns = banlieue_testenv::namespace(prefix).await;
    let class = format!("{}-small", ns.name);
    let image = format!("{}-debian", ns.name);
    let mut objects: Vec<Value> = providers
        .iter()
        .map(|(name, settings, labels, domains)| {
            let mut p = sim_provider(name, &format!("sim://{}-{name}", ns.name), settings.clone());
            p["metadata"]["labels"] = labels.clone();
            // Published where the backend has it (the sim's `features` setting).
            p["spec"]["capabilities"]["features"] = json!(["gpu"]);
            p["spec"]["failureDomains"] = domains.clone();
            p
        })
        .collect();
    objects.push(
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": class},
        "spec": {"cpus": 1, "memoryMiB": 512, "requiredFeatures": features,
                 "disk": {"sizeGiB": 5, "storageClass": "fast"}}}),
    );
    objects.push(
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": image},
        "spec": {"os": {"family": "linux", "distribution": "debian", "version": "13"},
                 "sources": {"sim": {"name": "debian"}}}}),
    );
    for object in &objects {
        apply(&ns.client, &ns.name, object).await.expect("fixture");
    }
    let operator = Operator::start(ns.client.clone(), &ns.name);
    (ns, operator, class, image)
}

fn vm(class: &str, image: &str, placement: Value) -> Value {
    json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
        "metadata": {"name": "v", "labels": {"app": "web"}},
        "spec": {"classRef": {"name": class}, "imageRef": {"name": image},
                 "placement": placement,
                 "networks": [{"name": "eth0", "networkClass": "lan"}]}
    })
}

async fn patch_provider(ns: &TestNamespace, name: &str, patch: Value) {
    let providers: Api<Provider> = ns.api();
    providers
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// The `PlacementDrifted` Events about VM `v`: one, never repeated as a series.
async fn drift_events(ns: &TestNamespace) -> Vec<Event> {
    let events: Api<Event> = ns.api();
    events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some("PlacementDrifted")
                && e.regarding
                    .as_ref()
                    .is_some_and(|r| r.name.as_deref() == Some("v"))
        })
        .collect()
}

/// Waits until every one of `providers` is Ready and VMImage `image` is available on
/// each: the scheduler places a VM only on a Ready Provider that has its image, so a VM
/// applied sooner would land on whichever answered first, not where the test expects.
async fn ready_for_placement(ns: &TestNamespace, image: &str, providers: &[&str]) {
    let apis: Api<Provider> = ns.api();
    for name in providers {
        wait_for(&apis, name, WAIT, |p: &Provider| {
            p.status
                .as_ref()
                .is_some_and(|s| conditions::is_true(&s.conditions, conditions::types::READY))
        })
        .await;
    }
    let images: Api<VMImage> = Api::all(ns.client.clone());
    wait_for(&images, image, WAIT, |i: &VMImage| {
        providers.iter().all(|name| {
            i.status.as_ref().is_some_and(|s| {
                s.providers
                    .iter()
                    .any(|r| r.namespace == ns.name && r.name == *name && r.available)
            })
        })
    })
    .await;
}

/// What a move would have done to a world: machines created, deleted, delete calls.
fn moves(stats: &SimStats) -> (u64, u64, u64) {
    (stats.machines_created, stats.machines_deleted, stats.delete)
}

/// Runs one trigger: VM `v` placed by `placement` on Provider `sim-a` (of `providers`),
/// `edit` applied to another object, then: the drift is reported with `reason`, one
/// Event, the VM is still Ready on the same backend VM, and no world saw a create or a
/// delete. Returns the namespace and operator for more.
async fn trigger(
    prefix: &str,
    providers: &[(&str, Value, Value, Value)],
    features: &[&str],
    placement: Value,
    edit: impl AsyncFnOnce(&TestNamespace),
    reason: &str,
) -> (TestNamespace, Operator, String, String) {
    let (ns, operator, class, image) = world(prefix, providers, features).await;
    // The VM is to be placed among all of them (on sim-a, the first by name).
    let names: Vec<&str> = providers.iter().map(|(name, ..)| *name).collect();
    ready_for_placement(&ns, &image, &names).await;
    let vms: Api<VirtualMachine> = ns.api();
    apply(&ns.client, &ns.name, &vm(&class, &image, placement))
        .await
        .unwrap();
    let before = wait_for(&vms, "v", WAIT, is_ready).await;
    assert_eq!(provider_of(&before).as_deref(), Some("sim-a"));
    let id = provider_id(&before).expect("a providerID");
    let worlds: Vec<String> = providers
        .iter()
        .map(|(name, ..)| format!("sim://{}-{name}", ns.name))
        .collect();
    let counts = |op: &Operator| -> Vec<(u64, u64, u64)> {
        worlds.iter().map(|w| moves(&op.sim.stats(w))).collect()
    };
    let counted = counts(&operator);
    let machine = operator.sim.machines(&worlds[0]);
    assert_eq!(machine.len(), 1);

    edit(&ns).await;
    let shown = wait_for(&vms, "v", WAIT, |v| drifted(v, reason)).await;
    let message = &condition(&shown, "PlacementDrifted").unwrap().message;
    assert!(
        message.contains("Nothing is moved") && message.contains("sim-a"),
        "says what holds and where: {message}"
    );
    tokio::time::sleep(SETTLE).await;
    let after = vms.get("v").await.unwrap();
    assert!(
        is_ready(&after),
        "Ready is not affected: {:?}",
        after.status
    );
    assert!(drifted(&after, reason), "{:?}", after.status);
    assert_eq!(provider_of(&after).as_deref(), Some("sim-a"), "not moved");
    assert_eq!(
        provider_id(&after).as_deref(),
        Some(id.as_str()),
        "the same VM"
    );
    let now = operator.sim.machines(&worlds[0]);
    assert_eq!(
        (
            now.len(),
            now[0].identity.uid.as_str(),
            now[0].provider_id.as_str()
        ),
        (
            1,
            machine[0].identity.uid.as_str(),
            machine[0].provider_id.as_str()
        ),
        "the same backend VM"
    );
    let recounted = counts(&operator);
    eprintln!(
        "{prefix}: (machines created, machines deleted, delete calls) per world before the edit \
         {counted:?}, {SETTLE:?} after the drift was shown {recounted:?}"
    );
    assert_eq!(recounted, counted, "no create, no delete anywhere");
    let events = drift_events(&ns).await;
    assert_eq!(events.len(), 1, "one Event: {events:#?}");
    assert!(events[0].series.is_none(), "not repeated: {events:#?}");
    (ns, operator, class, image)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_relabelled_moves_nothing_and_the_vms_own_spec_still_moves_it() {
    let lab = json!({"tier": "lab"});
    let providers = [
        ("sim-a", json!({}), lab.clone(), json!([])),
        ("sim-b", json!({}), lab.clone(), json!([])),
    ];
    let (ns, operator, _, _) = trigger(
        "bind-relabel",
        &providers,
        &[],
        json!({"providerSelector": {"matchLabels": {"tier": "lab"}}}),
        async |ns: &TestNamespace| {
            patch_provider(
                ns,
                "sim-a",
                json!({"metadata": {"labels": {"tier": "prod"}}}),
            )
            .await;
        },
        "ProviderLabelsChanged",
    )
    .await;

    // Relabelled back: the drift clears, still nothing moved.
    patch_provider(
        &ns,
        "sim-a",
        json!({"metadata": {"labels": {"tier": "lab"}}}),
    )
    .await;
    let vms: Api<VirtualMachine> = ns.api();
    let cleared = wait_for(&vms, "v", WAIT, |v| {
        condition(v, "PlacementDrifted").is_some_and(|c| c.status == "False")
    })
    .await;
    assert_eq!(provider_of(&cleared).as_deref(), Some("sim-a"));

    // The VM's own spec asks for another Provider: it moves (Recreate).
    let a = format!("sim://{}-sim-a", ns.name);
    let b = format!("sim://{}-sim-b", ns.name);
    vms.patch(
        "v",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"placement": {"providerSelector": null,
                                                     "providerRef": {"name": "sim-b"}}}})),
    )
    .await
    .unwrap();
    let moved = wait_for(&vms, "v", WAIT, |v| {
        is_ready(v) && provider_of(v).as_deref() == Some("sim-b")
    })
    .await;
    let migrating = condition(&moved, "Migrating").expect("a move recorded");
    assert_eq!(
        (migrating.status.as_str(), migrating.reason.as_str()),
        ("False", "Completed")
    );
    assert!(
        migrating.message.contains("sim-b"),
        "a finished move says where the VM is: {migrating:?}"
    );
    let (sa, sb) = (operator.sim.stats(&a), operator.sim.stats(&b));
    eprintln!(
        "own providerRef changed: sim-a (created, deleted, delete calls) {:?}, sim-b {:?}",
        moves(&sa),
        moves(&sb)
    );
    assert_eq!((sa.machines_deleted, sb.machines_created), (1, 1));
    assert!(operator.sim.machines(&a).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_domains_labels_changed_move_nothing() {
    let domains = |tier: &str| json!([{"name": "sim-a", "labels": {"tier": tier}}, {"name": "sim-b", "labels": {"tier": "other"}}]);
    let providers = [("sim-a", json!({}), json!({}), domains("gold"))];
    let (ns, operator, _, _) = trigger(
        "bind-domain",
        &providers,
        &[],
        json!({"providerRef": {"name": "sim-a"},
               "failureDomainSelector": {"matchLabels": {"tier": "gold"}}}),
        async move |ns: &TestNamespace| {
            patch_provider(
                ns,
                "sim-a",
                json!({"spec": {"failureDomains": domains("silver")}}),
            )
            .await;
        },
        "FailureDomainChanged",
    )
    .await;
    let vms: Api<VirtualMachine> = ns.api();
    let v = vms.get("v").await.unwrap();
    assert_eq!(
        v.status
            .unwrap()
            .placement
            .unwrap()
            .failure_domain
            .as_deref(),
        Some("sim-a")
    );
    drop(operator);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capability_narrowed_by_provider_settings_moves_nothing() {
    let providers = [
        ("sim-a", json!({"features": "gpu"}), json!({}), json!([])),
        ("sim-b", json!({"features": "gpu"}), json!({}), json!([])),
    ];
    trigger(
        "bind-caps",
        &providers,
        &["gpu"],
        json!({}),
        async |ns: &TestNamespace| {
            patch_provider(
                ns,
                "sim-a",
                json!({"spec": {"settings": {"features": null}}}),
            )
            .await;
        },
        "CapabilitiesChanged",
    )
    .await;
}

/// Finding 13 (VMs on a Provider being deleted stay Ready with nothing saying so): the
/// VM says so, and stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_being_deleted_is_shown_on_its_vms() {
    let providers = [("sim-a", json!({}), json!({}), json!([]))];
    let (ns, operator, _, _) = trigger(
        "bind-deleting",
        &providers,
        &[],
        json!({}),
        async |ns: &TestNamespace| {
            let providers: Api<Provider> = ns.api();
            providers
                .delete("sim-a", &DeleteParams::default())
                .await
                .unwrap();
        },
        "ProviderDeleting",
    )
    .await;
    let vms: Api<VirtualMachine> = ns.api();
    let v = vms.get("v").await.unwrap();
    let message = &condition(&v, "PlacementDrifted").unwrap().message;
    assert!(message.contains("being deleted"), "{message}");
    drop(operator);
}

/// Finding 13: a running VM whose VMClass is deleted stays Scheduled, and its power is
/// still switched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_operations_work_while_the_class_is_missing() {
    let providers = [("sim-a", json!({}), json!({}), json!([]))];
    let (ns, operator, class, image) = world("bind-noclass", &providers, &[]).await;
    let vms: Api<VirtualMachine> = ns.api();
    apply(&ns.client, &ns.name, &vm(&class, &image, json!({})))
        .await
        .unwrap();
    let before = wait_for(&vms, "v", WAIT, is_ready).await;
    let classes: Api<banlieue_sdk::api::VMClass> = Api::all(ns.client.clone());
    classes
        .delete(&class, &DeleteParams::default())
        .await
        .unwrap();
    wait_for(&vms, "v", WAIT, |v| {
        condition(v, "InfrastructureReady").is_some_and(|c| c.reason == "ClassNotFound")
    })
    .await;
    vms.patch(
        "v",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"powerState": "PoweredOff"}})),
    )
    .await
    .unwrap();
    let off = wait_for(&vms, "v", WAIT, |v| {
        v.status.as_ref().and_then(|s| s.power_state) == Some(PowerState::PoweredOff)
    })
    .await;
    let scheduled = condition(&off, "Scheduled").unwrap();
    assert_eq!(scheduled.status, "True", "still placed: {scheduled:?}");
    let infra = condition(&off, "InfrastructureReady").unwrap();
    assert!(
        infra.message.contains(&class) && infra.message.contains("powerState"),
        "says what is missing and what still works: {infra:?}"
    );
    assert_eq!(provider_id(&off), provider_id(&before), "the same machine");
    let machines = operator.sim.machines(&format!("sim://{}-sim-a", ns.name));
    assert_eq!(machines.len(), 1);
    assert_eq!(machines[0].power_state, Some(PowerState::PoweredOff));
}

/// One trigger on a real vSphere API (vcsim): two vCenters as Providers labelled alike,
/// the VM placed on the first; relabelling it clones nothing and destroys nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vcenter_relabelled_keeps_its_vm_on_vcsim() {
    let Some(a) = Vcsim::start() else { return };
    let Some(b) = Vcsim::start_args(&["-ip-prefix", "10.78"]) else {
        return;
    };
    let ns = banlieue_testenv::namespace("bind-vcsim").await;
    let mut objects = Vec::new();
    for (name, sim) in [("vc-a", &a), ("vc-b", &b)] {
        let secret = format!("{name}-credentials");
        objects.push(
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": secret},
               "stringData": {"username": sim.ready.username, "password": sim.ready.password}}),
        );
        objects.push(
            json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider",
            "metadata": {"name": name, "labels": {"tier": "lab"}},
            "spec": {
                "class": "vsphere",
                "connection": {"endpoint": format!("{}/sdk", sim.ready.endpoint),
                               "credentialsRef": {"name": secret},
                               "caBundle": {"inline": sim.ready.ca_pem}},
                "capabilities": {
                    "storageClasses": [{"name": "fast", "target": {"datastore": "LocalDS_0"}}],
                    "networkClasses": [{"name": "lan", "target": {"portGroup": "VM Network"}}]
                },
                "settings": {"taskPollInterval": "100ms", "shutdownTimeout": "2s"}
            }}),
        );
    }
    let class = format!("{}-small", ns.name);
    let image = format!("{}-ubuntu", ns.name);
    objects.push(json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": class},
           "spec": {"cpus": 2, "memoryMiB": 1024, "disk": {"sizeGiB": 16, "storageClass": "fast"}}}));
    objects.push(
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": image},
           "spec": {"os": {"family": "linux", "distribution": "ubuntu", "version": "24.04"},
                    "sources": {"vsphere": {"template": a.ready.template}}}}),
    );
    for object in &objects {
        apply(&ns.client, &ns.name, object).await.expect("fixture");
    }
    let mut registry = BackendRegistry::default();
    registry.register(ProviderClass::Vsphere, Arc::new(VSphereFactory::new()));
    let _operator = Operator::start_with_registry(
        ns.client.clone(),
        &ns.name,
        registry,
        Arc::new(SimFactory::new()),
        Duration::from_secs(5),
    );
    // Both ready for the VM before it comes: it goes to vc-a (name order) only then.
    ready_for_placement(&ns, &image, &["vc-a", "vc-b"]).await;
    let vms: Api<VirtualMachine> = ns.api();
    apply(
        &ns.client,
        &ns.name,
        &vm(
            &class,
            &image,
            json!({"providerSelector": {"matchLabels": {"tier": "lab"}}}),
        ),
    )
    .await
    .unwrap();
    let before = wait_for(&vms, "v", WAIT, is_ready).await;
    assert_eq!(provider_of(&before).as_deref(), Some("vc-a"));
    let clone = a.vm("v").expect("the clone on vc-a");
    let bios = clone["biosUUID"].as_str().unwrap().to_owned();
    assert_eq!(
        provider_id(&before).as_deref(),
        Some(format!("vsphere://{bios}").as_str())
    );
    let calls = |sim: &Vcsim| (sim.calls("CloneVM_Task"), sim.calls("Destroy_Task"));
    let counted = (calls(&a), calls(&b));

    patch_provider(
        &ns,
        "vc-a",
        json!({"metadata": {"labels": {"tier": "prod"}}}),
    )
    .await;
    wait_for(&vms, "v", WAIT, |v| drifted(v, "ProviderLabelsChanged")).await;
    tokio::time::sleep(SETTLE).await;
    let after = vms.get("v").await.unwrap();
    assert!(is_ready(&after), "{:?}", after.status);
    assert_eq!(provider_of(&after).as_deref(), Some("vc-a"));
    assert_eq!(provider_id(&after), provider_id(&before));
    let recounted = (calls(&a), calls(&b));
    eprintln!(
        "vcsim (CloneVM_Task, Destroy_Task) on (vc-a, vc-b): before the relabel {counted:?}, \
         {SETTLE:?} after the drift was shown {recounted:?}"
    );
    assert_eq!(recounted, counted, "no clone, no destroy on either vCenter");
    assert_eq!(a.vm("v").unwrap()["biosUUID"], bios.as_str(), "the same VM");
    assert!(b.vm("v").is_none(), "nothing made on vc-b");
    assert_eq!(drift_events(&ns).await.len(), 1);
}
