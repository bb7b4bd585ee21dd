//! Deletions that cannot orphan a VM: a Provider with machines on it waits for them
//! (saying which), a machine whose Provider was removed by force keeps its finalizer
//! (saying why) until the Provider is back, and a machine that never reached a backend
//! lets go at once. On the simulator and on a real libvirtd.

use std::sync::Arc;
use std::time::Duration;

use banlieue_backend_libvirt::LibvirtFactory;
use banlieue_backend_sim::SimFactory;
use banlieue_integration_tests::apply;
use banlieue_integration_tests::fixtures::sim_provider;
use banlieue_integration_tests::libvirt::{IMAGE_VOLUME, LibvirtRig, NETWORK, POOL};
use banlieue_integration_tests::operator::{Operator, wait_for, wait_gone};
use banlieue_sdk::api::common::ProviderClass;
use banlieue_sdk::api::infra::libvirt::LibvirtMachine;
use banlieue_sdk::api::{Provider, VirtualMachine};
use banlieue_sdk::backend::BackendRegistry;
use banlieue_sdk::conditions;
use banlieue_testenv::TestNamespace;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);
/// The libvirt guest boots under TCG; leave room for a loaded machine.
const LIBVIRT_WAIT: Duration = Duration::from_secs(240);

fn sim_world_objects(ns: &TestNamespace) -> Vec<Value> {
    vec![
        sim_provider("sim", &format!("sim://{}", ns.name), json!({})),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": format!("{}-small", ns.name)},
               "spec": {"cpus": 1, "memoryMiB": 512, "disk": {"sizeGiB": 5, "storageClass": "fast"}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": format!("{}-debian", ns.name)},
               "spec": {"os": {"family": "linux", "distribution": "debian", "version": "13"}, "sources": {"sim": {"name": "debian"}}}}),
    ]
}

/// A namespace with the sim world, an operator on it, and the sim Provider's endpoint.
async fn sim_world(prefix: &str) -> (TestNamespace, Operator, String) {
    let ns = banlieue_testenv::namespace(prefix).await;
    for object in sim_world_objects(&ns) {
        apply(&ns.client, &ns.name, &object).await.expect("fixture");
    }
    let operator = Operator::start(ns.client.clone(), &ns.name);
    let endpoint = format!("sim://{}", ns.name);
    (ns, operator, endpoint)
}

fn sim_vm(ns: &TestNamespace, name: &str, provider: &str) -> Value {
    json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": name},
        "spec": {"classRef": {"name": format!("{}-small", ns.name)}, "imageRef": {"name": format!("{}-debian", ns.name)},
                 "networks": [{"name": "eth0", "networkClass": "lan"}],
                 "placement": {"providerRef": {"name": provider}}}
    })
}

fn ready(vm: &VirtualMachine) -> bool {
    vm.status
        .as_ref()
        .is_some_and(|s| conditions::is_true(&s.conditions, "Ready"))
}

fn ready_reason(conds: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition]) -> String {
    conditions::get(conds, "Ready")
        .map(|c| format!("{}: {}", c.reason, c.message))
        .unwrap_or_default()
}

async fn events(ns: &TestNamespace, reason: &str) -> Vec<Event> {
    let api: Api<Event> = ns.api();
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect()
}

async fn blocked(providers: &Api<Provider>, name: &str, timeout: Duration) -> String {
    let provider = wait_for(providers, name, timeout, |p| {
        p.status.as_ref().is_some_and(|s| {
            conditions::get(&s.conditions, "Ready").is_some_and(|c| c.reason == "DeletionBlocked")
        })
    })
    .await;
    assert!(provider.metadata.deletion_timestamp.is_some());
    ready_reason(&provider.status.unwrap().conditions)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_with_machines_waits_for_them_and_says_which() {
    let (ns, operator, endpoint) = sim_world("del-prov").await;
    let vms: Api<VirtualMachine> = ns.api();
    let providers: Api<Provider> = ns.api();
    for name in ["a", "b", "c"] {
        apply(&ns.client, &ns.name, &sim_vm(&ns, name, "sim"))
            .await
            .unwrap();
    }
    for name in ["a", "b", "c"] {
        wait_for(&vms, name, WAIT, ready).await;
    }
    assert_eq!(operator.sim.machines(&endpoint).len(), 3);

    providers
        .delete("sim", &DeleteParams::default())
        .await
        .unwrap();
    let message = blocked(&providers, "sim", WAIT).await;
    assert!(
        message.starts_with("DeletionBlocked: deletion waits for 3 machine(s) still on this Provider: LibvirtMachine/a, LibvirtMachine/b, LibvirtMachine/c."),
        "{message}"
    );
    // Still there after a while: nothing was forgotten.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(providers.get_opt("sim").await.unwrap().is_some());
    assert_eq!(operator.sim.machines(&endpoint).len(), 3);
    let warnings = events(&ns, "DeletionBlocked").await;
    assert_eq!(
        warnings.len(),
        1,
        "one Warning, not one per look: {warnings:?}"
    );
    assert_eq!(warnings[0].type_.as_deref(), Some("Warning"));

    // Nothing new lands on a Provider on its way out.
    apply(&ns.client, &ns.name, &sim_vm(&ns, "late", "sim"))
        .await
        .unwrap();
    let late = wait_for(&vms, "late", WAIT, |vm| {
        vm.status.as_ref().is_some_and(|s| {
            conditions::get(&s.conditions, "Scheduled").is_some_and(|c| c.status == "False")
        })
    })
    .await;
    let scheduled = conditions::get(&late.status.unwrap().conditions, "Scheduled")
        .unwrap()
        .clone();
    assert!(
        scheduled.message.contains("being deleted"),
        "{}",
        scheduled.message
    );

    // One gone: the message counts down.
    vms.delete("a", &DeleteParams::default()).await.unwrap();
    wait_gone(&vms, "a", WAIT).await;
    let message = wait_for(&providers, "sim", WAIT, |p| {
        ready_reason(&p.status.clone().unwrap_or_default().conditions).contains("2 machine(s)")
    })
    .await;
    assert!(
        !ready_reason(&message.status.unwrap().conditions).contains("LibvirtMachine/a"),
        "a is gone"
    );
    assert_eq!(operator.sim.machines(&endpoint).len(), 2);

    for name in ["b", "c", "late"] {
        vms.delete(name, &DeleteParams::default()).await.unwrap();
    }
    for name in ["b", "c", "late"] {
        wait_gone(&vms, name, WAIT).await;
    }
    assert!(
        operator.sim.machines(&endpoint).is_empty(),
        "every backend VM was deleted through the Provider"
    );
    wait_gone(&providers, "sim", WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_whose_provider_was_removed_by_force_keeps_its_vm_until_the_provider_is_back() {
    let (ns, operator, endpoint) = sim_world("del-force").await;
    let vms: Api<VirtualMachine> = ns.api();
    let machines: Api<LibvirtMachine> = ns.api();
    let providers: Api<Provider> = ns.api();
    apply(&ns.client, &ns.name, &sim_vm(&ns, "kept", "sim"))
        .await
        .unwrap();
    wait_for(&vms, "kept", WAIT, ready).await;

    // The administrator strips the Provider's finalizer.
    providers
        .delete("sim", &DeleteParams::default())
        .await
        .unwrap();
    blocked(&providers, "sim", WAIT).await;
    providers
        .patch(
            "sim",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    wait_gone(&providers, "sim", WAIT).await;

    vms.delete("kept", &DeleteParams::default()).await.unwrap();
    let machine = wait_for(&machines, "kept", WAIT, |m| {
        ready_reason(&m.status.clone().unwrap_or_default().conditions)
            .starts_with("DeleteFailed: ProviderGone")
    })
    .await;
    let message = ready_reason(&machine.status.unwrap().conditions);
    assert!(
        message.contains("Provider sim no longer exists")
            && message.contains("Recreate Provider sim"),
        "{message}"
    );
    let vm = wait_for(&vms, "kept", WAIT, |vm| {
        vm.status.as_ref().is_some_and(|s| {
            conditions::get(&s.conditions, "InfrastructureReady")
                .is_some_and(|c| c.reason == "DeleteFailed" && c.message.contains("ProviderGone"))
        })
    })
    .await;
    assert!(
        vm.metadata.deletion_timestamp.is_some(),
        "the VM waits, saying why"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(vms.get_opt("kept").await.unwrap().is_some());
    assert_eq!(
        operator.sim.machines(&endpoint).len(),
        1,
        "the backend VM is not forgotten"
    );
    assert_eq!(events(&ns, "ProviderGone").await.len(), 1);

    // The Provider comes back: the deletion finishes through it.
    apply(
        &ns.client,
        &ns.name,
        &sim_provider("sim", &endpoint, json!({})),
    )
    .await
    .unwrap();
    wait_gone(&vms, "kept", WAIT).await;
    assert!(operator.sim.machines(&endpoint).is_empty());
}

/// A VM deleted while its infra machine is being made: the operator trusts its cache's
/// "no machine" only when no create of its own is still unseen there; a finalizer
/// removed early would leave the machine (and its backend VM) behind, as this
/// environment has no garbage collector.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vms_deleted_while_their_machines_are_made_leave_nothing_behind() {
    const COUNT: usize = 60;
    let (ns, operator, endpoint) = sim_world("del-race").await;
    let vms: Api<VirtualMachine> = ns.api();
    let machines: Api<LibvirtMachine> = ns.api();
    let racers: Vec<_> = (0..COUNT)
        .map(|i| {
            let (client, namespace, vms) = (ns.client.clone(), ns.name.clone(), vms.clone());
            let object = sim_vm(&ns, &format!("race-{i}"), "sim");
            tokio::spawn(async move {
                let name = format!("race-{i}");
                apply(&client, &namespace, &object).await.expect("create");
                // Delete the moment the VM is finalized: its machine is applied by the
                // reconcile that follows, so some deletes land just after that apply.
                let started = std::time::Instant::now();
                loop {
                    let vm = vms.get(&name).await.expect("get");
                    if !vm.finalizers().is_empty() {
                        break;
                    }
                    assert!(started.elapsed() < WAIT, "{name} never got its finalizer");
                    tokio::time::sleep(Duration::from_millis(5 * (i as u64 % 4))).await;
                }
                vms.delete(&name, &DeleteParams::default())
                    .await
                    .expect("delete");
            })
        })
        .collect();
    for racer in racers {
        racer.await.expect("racer");
    }
    for i in 0..COUNT {
        wait_gone(&vms, &format!("race-{i}"), WAIT).await;
    }
    let left = machines.list(&ListParams::default()).await.unwrap().items;
    assert!(
        left.is_empty(),
        "infra machines outlived their VMs: {:?}",
        left.iter().map(ResourceExt::name_any).collect::<Vec<_>>()
    );
    let backend = operator.sim.machines(&endpoint);
    assert!(
        backend.is_empty(),
        "backend VMs outlived their VMs: {:?}",
        backend
            .iter()
            .map(|m| (
                &m.identity.name,
                &m.identity.uid,
                m.created,
                m.pending,
                m.deleting
            ))
            .collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vm_whose_provider_never_existed_is_deleted_at_once() {
    let (ns, _operator, _) = sim_world("del-never").await;
    let vms: Api<VirtualMachine> = ns.api();
    apply(&ns.client, &ns.name, &sim_vm(&ns, "nowhere", "missing"))
        .await
        .unwrap();
    wait_for(&vms, "nowhere", WAIT, |vm| {
        vm.status.as_ref().is_some_and(|s| {
            conditions::get(&s.conditions, "Scheduled")
                .is_some_and(|c| c.reason == "ProviderNotFound")
        })
    })
    .await;
    vms.delete("nowhere", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&vms, "nowhere", WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_libvirt_provider_waits_until_its_domain_is_deleted() {
    let Some(rig) = LibvirtRig::start() else {
        return;
    };
    let ns = banlieue_testenv::namespace("del-lv").await;
    let objects = [
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "host"},
        "spec": {
            "class": "libvirt",
            "connection": {"endpoint": rig.uri},
            "capabilities": {
                "storageClasses": [{"name": "local", "target": {"pool": POOL}}],
                "networkClasses": [{"name": "isolated", "target": {"network": NETWORK}}]
            },
            "settings": {"domainType": "qemu", "pollInterval": "1s", "failureDomain": "rig-host"}
        }}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": format!("{}-tiny", ns.name)},
               "spec": {"cpus": 1, "memoryMiB": 256, "firmware": "bios",
                        "disk": {"sizeGiB": 1, "storageClass": "local"}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": format!("{}-guest", ns.name)},
               "spec": {"os": {"family": "linux", "distribution": "busybox", "version": "1"},
                        "sources": {"libvirt": {"volume": {"pool": POOL, "name": IMAGE_VOLUME}, "format": "qcow2"}}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": "guest"},
               "spec": {"classRef": {"name": format!("{}-tiny", ns.name)},
                        "imageRef": {"name": format!("{}-guest", ns.name)},
                        "networks": [{"name": "eth0", "networkClass": "isolated"}]}}),
    ];
    for object in &objects {
        apply(&ns.client, &ns.name, object).await.expect("fixture");
    }
    let mut registry = BackendRegistry::default();
    registry.register(ProviderClass::Libvirt, Arc::new(LibvirtFactory::new()));
    let _operator = Operator::start_with_registry(
        ns.client.clone(),
        &ns.name,
        registry,
        Arc::new(SimFactory::new()),
        Duration::from_secs(5),
    );
    let vms: Api<VirtualMachine> = ns.api();
    let providers: Api<Provider> = ns.api();
    let machines: Api<LibvirtMachine> = ns.api();
    // Created on the host (a domain exists) is enough: the guest need not boot.
    wait_for(&machines, "guest", LIBVIRT_WAIT, |m| {
        m.spec
            .provider_id
            .as_deref()
            .is_some_and(|id| !id.is_empty())
    })
    .await;
    assert_eq!(rig.domains().len(), 1, "{:?}", rig.domains());

    providers
        .delete("host", &DeleteParams::default())
        .await
        .unwrap();
    let message = blocked(&providers, "host", WAIT).await;
    assert!(message.contains("LibvirtMachine/guest"), "{message}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        rig.domains().len(),
        1,
        "the domain is kept while its Provider waits"
    );

    vms.delete("guest", &DeleteParams::default()).await.unwrap();
    wait_gone(&vms, "guest", LIBVIRT_WAIT).await;
    assert!(rig.domains().is_empty(), "{:?}", rig.domains());
    wait_gone(&providers, "host", WAIT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_copying_another_machines_provider_id_neither_adopts_nor_deletes_its_vm() {
    let (ns, operator, endpoint) = sim_world("del-copy-id").await;
    let vms: Api<VirtualMachine> = ns.api();
    let machines: Api<LibvirtMachine> = ns.api();
    apply(&ns.client, &ns.name, &sim_vm(&ns, "owner", "sim"))
        .await
        .unwrap();
    wait_for(&vms, "owner", WAIT, ready).await;
    let owned = machines.get("owner").await.unwrap();
    let id = owned.spec.provider_id.clone().expect("provisioned");
    let census = operator.sim.machines(&endpoint);
    assert_eq!(census.len(), 1);

    // A hand-made machine claiming the same VM.
    let intruder = json!({"apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "LibvirtMachine",
        "metadata": {"name": "intruder"},
        "spec": {"providerRef": {"name": "sim"}, "providerID": id,
                 "image": {"path": "/var/lib/images/debian.qcow2"},
                 "storagePool": "default", "cpus": 1, "memoryMiB": 256}});
    apply(&ns.client, &ns.name, &intruder).await.unwrap();
    let refused = wait_for(&machines, "intruder", WAIT, |m| {
        ready_reason(&m.status.clone().unwrap_or_default().conditions)
            .starts_with("TerminalFailure: ProviderIDInUse")
    })
    .await;
    let message = ready_reason(&refused.status.unwrap().conditions);
    assert!(
        message.contains(&format!("LibvirtMachine/{}/owner", ns.name)),
        "{message}"
    );
    assert_eq!(
        operator.sim.machines(&endpoint),
        census,
        "the VM was not adopted, retagged or duplicated"
    );

    // Deleting the intruder keeps the owner's VM.
    machines
        .delete("intruder", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&machines, "intruder", WAIT).await;
    assert_eq!(operator.sim.machines(&endpoint), census);
    assert!(ready(&vms.get("owner").await.unwrap()));

    // The owner's own deletion still deletes it.
    vms.delete("owner", &DeleteParams::default()).await.unwrap();
    wait_gone(&vms, "owner", WAIT).await;
    assert!(operator.sim.machines(&endpoint).is_empty());
}

/// The escape hatch's annotation (`banlieue_sdk::controllers::ORPHAN_BACKEND_ANNOTATION`).
const ORPHAN: &str = "banlieue.io/orphan-backend";

/// Makes every backend delete on the sim Provider fail terminally (think: credentials
/// revoked, a locked VM), and waits until the operator has reconnected with it.
async fn refuse_deletes(ns: &TestNamespace) {
    let providers: Api<Provider> = ns.api();
    providers
        .patch(
            "sim",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"settings": {"failureRate": "1",
                "failureKinds": "terminal", "failureCalls": "delete"}}})),
        )
        .await
        .unwrap();
    wait_for(&providers, "sim", WAIT, |p| {
        p.status.as_ref().and_then(|s| s.observed_generation) == p.metadata.generation
    })
    .await;
}

async fn annotate<K>(api: &Api<K>, name: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {ORPHAN: "true"}}})),
    )
    .await
    .unwrap();
}

fn note(event: &Event) -> String {
    event.note.clone().unwrap_or_default()
}

/// A backend that refuses to delete keeps the machine (and its VM) with
/// `DeleteFailed`, saying how to get out; `banlieue.io/orphan-backend: "true"` on the
/// VirtualMachine lets both go without the backend delete, and a Warning Event names
/// the VM left behind, which still exists on the backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_whose_backend_refuses_to_delete_goes_only_when_annotated_and_names_its_vm() {
    let (ns, operator, endpoint) = sim_world("orphan-vm").await;
    let vms: Api<VirtualMachine> = ns.api();
    let machines: Api<LibvirtMachine> = ns.api();
    apply(&ns.client, &ns.name, &sim_vm(&ns, "locked", "sim"))
        .await
        .unwrap();
    wait_for(&vms, "locked", WAIT, ready).await;
    let machine = machines.get("locked").await.unwrap();
    let provider_id = machine.spec.provider_id.clone().expect("a providerID");
    let uid = machine.uid().unwrap();
    refuse_deletes(&ns).await;

    vms.delete("locked", &DeleteParams::default())
        .await
        .unwrap();
    let stuck = wait_for(&machines, "locked", WAIT, |m| {
        ready_reason(&m.status.clone().unwrap_or_default().conditions).starts_with("DeleteFailed")
    })
    .await;
    let message = ready_reason(&stuck.status.unwrap().conditions);
    assert!(
        message.contains(&format!(
            "annotate it (or its VirtualMachine) {ORPHAN}=true"
        )),
        "the condition says the way out: {message}"
    );
    // Without the annotation nothing goes, however long.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(vms.get_opt("locked").await.unwrap().is_some());
    assert!(machines.get_opt("locked").await.unwrap().is_some());
    assert!(events(&ns, "BackendVMAbandoned").await.is_empty());

    annotate(&vms, "locked").await;
    wait_gone(&machines, "locked", WAIT).await;
    wait_gone(&vms, "locked", WAIT).await;
    let abandoned = events(&ns, "BackendVMAbandoned").await;
    assert_eq!(abandoned.len(), 1, "{abandoned:?}");
    let said = note(&abandoned[0]);
    eprintln!("Event: {said}");
    assert_eq!(abandoned[0].type_.as_deref(), Some("Warning"));
    for part in [
        format!("providerID {provider_id}"),
        "Provider sim".to_owned(),
        format!("LibvirtMachine/{}/locked", ns.name),
        format!("UID {uid}"),
    ] {
        assert!(said.contains(&part), "{part:?} in {said}");
    }
    assert_eq!(
        operator.sim.machines(&endpoint).len(),
        1,
        "the backend VM was left behind, not deleted"
    );
}

/// A Provider being deleted while machines are on it waits; annotated, it goes at
/// once, naming every backend VM it leaves (one Event each): the machine already being
/// deleted (whose backend refuses) gets the annotation and goes too, the other stays
/// unmanaged. Both VMs still exist on the backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_annotated_provider_lets_go_and_names_every_vm_it_leaves() {
    let (ns, operator, endpoint) = sim_world("orphan-prov").await;
    let vms: Api<VirtualMachine> = ns.api();
    let machines: Api<LibvirtMachine> = ns.api();
    let providers: Api<Provider> = ns.api();
    for name in ["going", "staying"] {
        apply(&ns.client, &ns.name, &sim_vm(&ns, name, "sim"))
            .await
            .unwrap();
    }
    let mut ids = vec![];
    for name in ["going", "staying"] {
        wait_for(&vms, name, WAIT, ready).await;
        let id = machines.get(name).await.unwrap().spec.provider_id.unwrap();
        ids.push(id);
    }
    refuse_deletes(&ns).await;
    vms.delete("going", &DeleteParams::default()).await.unwrap();
    wait_for(&machines, "going", WAIT, |m| {
        ready_reason(&m.status.clone().unwrap_or_default().conditions).starts_with("DeleteFailed")
    })
    .await;
    providers
        .delete("sim", &DeleteParams::default())
        .await
        .unwrap();
    let message = blocked(&providers, "sim", WAIT).await;
    assert!(
        message.contains(&format!("annotate it {ORPHAN}=true")),
        "{message}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(providers.get_opt("sim").await.unwrap().is_some());

    annotate(&providers, "sim").await;
    wait_gone(&providers, "sim", WAIT).await;
    wait_gone(&vms, "going", WAIT).await;
    let on_provider: Vec<String> = events(&ns, "BackendVMAbandoned")
        .await
        .iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("Provider"))
        .map(note)
        .collect();
    eprintln!("Provider Events: {on_provider:#?}");
    assert_eq!(on_provider.len(), 2, "one per VM left: {on_provider:?}");
    for (id, name) in ids.iter().zip(["going", "staying"]) {
        assert!(
            on_provider
                .iter()
                .any(|n| n.contains(&format!("providerID {id}"))
                    && n.contains(&format!("LibvirtMachine/{}/{name}", ns.name))),
            "{name}'s VM {id} is named: {on_provider:?}"
        );
    }
    assert!(
        machines.get_opt("staying").await.unwrap().is_some(),
        "a machine not being deleted stays"
    );
    assert_eq!(
        operator.sim.machines(&endpoint).len(),
        2,
        "both backend VMs were left behind, not deleted"
    );
}
