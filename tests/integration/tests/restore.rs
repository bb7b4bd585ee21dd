//! Restore from backup, as a backup tool does it: VirtualMachines are made until Ready;
//! each VM and its infra machine are dumped without status (and without what a restore
//! drops: UID, resourceVersion, owner references, finalizers, managed fields); the
//! operator is stopped; the objects are deleted with their finalizers stripped, so the
//! backend VMs stay; they are re-created in every order — the VM alone, the VM before
//! its machine, the machine before its VM — and the operator is started again. Then
//! each VM has exactly one backend VM (counted on the backend), the same providerID as
//! before, and is Ready. On sim, vcsim, fakepve, a real libvirtd and Cloud Hypervisor
//! (the repo's OpenAPI-checked fake VMM).
//!
//! `flock /tmp/banlieue-libvirt.lock` around the libvirt one when helpers share a host.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use banlieue_backend_cloud_hypervisor::ChFactory;
use banlieue_backend_libvirt::LibvirtFactory;
use banlieue_backend_proxmox::ProxmoxFactory;
use banlieue_backend_sim::{SimFactory, SimMachineInfo};
use banlieue_backend_vsphere::VSphereFactory;
use banlieue_integration_tests::cloud_hypervisor::{ChRig, Guest};
use banlieue_integration_tests::crashable::CrashableOperator;
use banlieue_integration_tests::fakepve::FakePve;
use banlieue_integration_tests::libvirt::{IMAGE_VOLUME, LibvirtRig, NETWORK, POOL};
use banlieue_integration_tests::operator::wait_gone;
use banlieue_integration_tests::vcsim::Vcsim;
use banlieue_integration_tests::{apply, post};
use banlieue_sdk::api::VirtualMachine;
use banlieue_sdk::api::common::ProviderClass;
use banlieue_sdk::api::infra::libvirt::LibvirtMachineSpec;
use banlieue_sdk::backend::{
    Backend, BackendRegistry, Connection, MachineIdentity, MachineRequest, MachineSpec,
};
use banlieue_sdk::conditions;
use banlieue_testenv::TestNamespace;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};

/// The spec-checked fake Cloud Hypervisor VMM.
const FAKE_VMM: &str = env!("CARGO_BIN_EXE_fake-ch-vmm");

/// The three restore orders, one VM each.
const ALONE: &str = "alone";
const VM_FIRST: &str = "vm-first";
const MACHINE_FIRST: &str = "machine-first";
const NAMES: [&str; 3] = [ALONE, VM_FIRST, MACHINE_FIRST];

/// How long each simulated operation takes.
const SIM_LATENCY: &str = "100ms";

/// One backend under test.
struct Target {
    label: &'static str,
    /// The infra kind its Provider builds, and its plural.
    kind: &'static str,
    plural: &'static str,
    class: ProviderClass,
    factory: Arc<dyn banlieue_sdk::backend::BackendFactory>,
    /// The VirtualMachine `name`.
    vm: Box<dyn Fn(&str) -> Value>,
    /// Backend VMs, by the object name they were made for.
    count: Box<dyn Fn() -> BTreeMap<String, usize>>,
    wait: Duration,
}

fn start(ns: &TestNamespace, target: &Target) -> CrashableOperator {
    let mut registry = BackendRegistry::default();
    registry.register(target.class, target.factory.clone());
    let mut config = banlieue_testenv::shared().kube_config();
    config.default_namespace.clone_from(&ns.name);
    CrashableOperator::start(config, &ns.name, registry, Duration::from_secs(5))
}

fn machines_api(ns: &TestNamespace, target: &Target) -> Api<DynamicObject> {
    let resource = ApiResource {
        group: "infrastructure.banlieue.io".into(),
        version: "v1alpha1".into(),
        api_version: "infrastructure.banlieue.io/v1alpha1".into(),
        kind: target.kind.into(),
        plural: target.plural.into(),
    };
    Api::namespaced_with(ns.client.clone(), &ns.name, &resource)
}

/// VirtualMachines as plain objects, the way a backup tool reads and writes them.
fn vm_objects(ns: &TestNamespace) -> Api<DynamicObject> {
    Api::namespaced_with(
        ns.client.clone(),
        &ns.name,
        &ApiResource {
            group: "banlieue.io".into(),
            version: "v1alpha1".into(),
            api_version: "banlieue.io/v1alpha1".into(),
            kind: "VirtualMachine".into(),
            plural: "virtualmachines".into(),
        },
    )
}

fn is_ready(vm: &VirtualMachine) -> bool {
    vm.status
        .as_ref()
        .is_some_and(|s| conditions::is_true(&s.conditions, "Ready"))
}

fn provider_id(machine: &DynamicObject) -> Option<String> {
    machine.data["spec"]["providerID"]
        .as_str()
        .filter(|id| !id.is_empty())
        .map(str::to_owned)
}

/// Waits until every VM is Ready and its machine has a providerID; returns them.
async fn made(ns: &TestNamespace, target: &Target, why: &str) -> BTreeMap<String, String> {
    let vms: Api<VirtualMachine> = ns.api();
    let machines = machines_api(ns, target);
    let started = Instant::now();
    loop {
        let mut ids = BTreeMap::new();
        let mut last = String::new();
        for name in NAMES {
            let vm = vms.get_opt(name).await.expect("get VM");
            let machine = machines.get_opt(name).await.expect("get machine");
            match (vm, machine.as_ref().and_then(provider_id)) {
                (Some(vm), Some(id)) if is_ready(&vm) => {
                    ids.insert(name.to_owned(), id);
                }
                (vm, _) => {
                    last = format!(
                        "{name}: VM conditions {:?}; machine {:?}",
                        vm.and_then(|v| v.status).map(|s| s
                            .conditions
                            .iter()
                            .map(|c| format!(
                                "{}={} {}: {}",
                                c.type_, c.status, c.reason, c.message
                            ))
                            .collect::<Vec<_>>()),
                        machine.map(|m| (
                            m.data["spec"]["providerID"].clone(),
                            m.data["status"]["conditions"].clone()
                        ))
                    );
                }
            }
        }
        if ids.len() == NAMES.len() {
            return ids;
        }
        assert!(
            started.elapsed() < target.wait,
            "{}: {why}: not all Ready with a providerID after {:?}; backend {:?}; {last}",
            target.label,
            target.wait,
            (target.count)()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The object as a backup holds it and a restore re-creates it: spec, labels and
/// annotations; no status, UID, resourceVersion, owner references (a restore drops
/// them: the owners' UIDs are new), finalizers or managed fields.
fn dumped(object: &Value) -> Value {
    let meta = &object["metadata"];
    let mut metadata = json!({"name": meta["name"]});
    for key in ["labels", "annotations"] {
        if let Some(value) = meta.get(key).filter(|v| !v.is_null()) {
            metadata[key] = value.clone();
        }
    }
    json!({
        "apiVersion": object["apiVersion"],
        "kind": object["kind"],
        "metadata": metadata,
        "spec": object["spec"],
    })
}

/// Re-creates a dumped object as a restore does (a POST); an object that exists
/// already is left as it is and reported, as Velero does.
async fn restore(ns: &TestNamespace, object: &Value) -> &'static str {
    match post(&ns.client, &ns.name, object).await {
        Ok(_) => "created",
        Err(kube::Error::Api(s)) if s.code == 409 => "already there",
        Err(e) => panic!("restoring {}: {e}", object["metadata"]["name"]),
    }
}

async fn strip_and_delete(api: &Api<DynamicObject>, name: &str) {
    let strip = json!({"metadata": {"finalizers": null}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&strip))
        .await
        .expect("strip finalizers");
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => panic!("delete {name}: {e}"),
    }
    wait_gone(api, name, Duration::from_secs(30)).await;
}

async fn scenario(ns: &TestNamespace, target: &Target) {
    let vm_api = vm_objects(ns);
    let machines = machines_api(ns, target);

    // Made, Ready.
    let operator = start(ns, target);
    for name in NAMES {
        apply(&ns.client, &ns.name, &(target.vm)(name))
            .await
            .expect("VM");
    }
    let before = made(ns, target, "before the backup").await;
    let counted_before = (target.count)();

    // The backup.
    let mut backup = BTreeMap::new();
    for name in NAMES {
        let vm = serde_json::to_value(vm_api.get(name).await.expect("VM")).unwrap();
        let machine = serde_json::to_value(machines.get(name).await.expect("machine")).unwrap();
        backup.insert(name, (dumped(&vm), dumped(&machine)));
    }

    // The loss: the operator is stopped, the objects go, the backend VMs stay.
    operator.kill();
    for name in NAMES {
        strip_and_delete(&machines, name).await;
        strip_and_delete(&vm_api, name).await;
    }
    assert_eq!(
        (target.count)(),
        counted_before,
        "{}: deleting the objects with the operator stopped touched the backend",
        target.label
    );

    // The restore, in every order.
    let mut how = Vec::new();
    let (vm, _) = &backup[ALONE];
    how.push(format!("{ALONE}: VM {}", restore(ns, vm).await));
    let (vm, machine) = &backup[VM_FIRST];
    let first = restore(ns, vm).await;
    let then = restore(ns, machine).await;
    how.push(format!("{VM_FIRST}: VM {first}, then machine {then}"));
    let (vm, machine) = &backup[MACHINE_FIRST];
    let first = restore(ns, machine).await;
    let then = restore(ns, vm).await;
    how.push(format!("{MACHINE_FIRST}: machine {first}, then VM {then}"));

    let operator = start(ns, target);
    let after = made(ns, target, "after the restore").await;
    // A few more rounds: an adoption that would still create something shows here.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let counted_after = (target.count)();
    eprintln!(
        "restore on {}: backend VMs before {counted_before:?}, after {counted_after:?}; \
         providerIDs equal: {} ({})",
        target.label,
        before == after,
        how.join("; ")
    );
    assert_eq!(
        after, before,
        "{}: the restored objects' providerIDs",
        target.label
    );
    assert_eq!(
        counted_after, counted_before,
        "{}: backend VMs per object after the restore",
        target.label
    );
    for name in NAMES {
        assert_eq!(
            counted_after.get(name),
            Some(&1),
            "{}: backend VMs of {name}",
            target.label
        );
    }
    operator.kill();
}

/// A sim Provider (its endpoint named after the namespace), class and image in `ns`;
/// the target, its factory (to look at the simulated hypervisor) and the endpoint.
async fn sim_target(ns: &TestNamespace) -> (Target, Arc<SimFactory>, String) {
    let endpoint = format!("sim://{}", ns.name);
    let fixtures = [
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "sim"},
               "spec": {"class": "sim", "connection": {"endpoint": endpoint},
                        "capabilities": {"storageClasses": [{"name": "fast", "target": {"pool": "default"}}]},
                        "settings": {"latency": SIM_LATENCY}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": format!("{}-small", ns.name)},
               "spec": {"cpus": 1, "memoryMiB": 512, "disk": {"sizeGiB": 5, "storageClass": "fast"}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": format!("{}-debian", ns.name)},
               "spec": {"os": {"family": "linux", "distribution": "debian", "version": "13"}, "sources": {"sim": {"name": "debian"}}}}),
    ];
    for object in &fixtures {
        apply(&ns.client, &ns.name, object).await.expect("fixture");
    }
    let sim = Arc::new(SimFactory::new());
    let counted = sim.clone();
    let (class, image) = (format!("{}-small", ns.name), format!("{}-debian", ns.name));
    let at = endpoint.clone();
    let target = Target {
        label: "sim",
        kind: "LibvirtMachine",
        plural: "libvirtmachines",
        class: ProviderClass::Sim,
        factory: sim.clone(),
        vm: Box::new(move |name| {
            json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": name},
                   "spec": {"classRef": {"name": class}, "imageRef": {"name": image},
                            "placement": {"providerRef": {"name": "sim"}}}})
        }),
        count: Box::new(move || {
            let mut count = BTreeMap::new();
            for m in counted.machines(&at) {
                if !m.deleting {
                    *count.entry(m.identity.name.clone()).or_default() += 1;
                }
            }
            count
        }),
        wait: Duration::from_secs(60),
    };
    (target, sim, endpoint)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restored_objects_find_their_sim_vms_in_every_order() {
    let ns = banlieue_testenv::namespace("restore-sim").await;
    let (target, _, _) = sim_target(&ns).await;
    scenario(&ns, &target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restored_objects_find_their_vcsim_vms_in_every_order() {
    let Some(sim) = Vcsim::start() else { return };
    let sim = Arc::new(sim);
    let ns = banlieue_testenv::namespace("restore-vs").await;
    let fixtures = [
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
            "settings": {"taskPollInterval": "100ms", "shutdownTimeout": "2s"}
        }}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": format!("{}-small", ns.name)},
               "spec": {"cpus": 2, "memoryMiB": 1024, "disk": {"sizeGiB": 16, "storageClass": "fast"}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": format!("{}-ubuntu", ns.name)},
               "spec": {"os": {"family": "linux", "distribution": "ubuntu", "version": "24.04"},
                        "sources": {"vsphere": {"template": sim.ready.template}}}}),
    ];
    for object in &fixtures {
        apply(&ns.client, &ns.name, object).await.expect("fixture");
    }
    let counted = sim.clone();
    let (class, image) = (format!("{}-small", ns.name), format!("{}-ubuntu", ns.name));
    let target = Target {
        label: "vcsim",
        kind: "VSphereMachine",
        plural: "vspheremachines",
        class: ProviderClass::Vsphere,
        factory: Arc::new(VSphereFactory::new()),
        vm: Box::new(move |name| {
            json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": name},
                   "spec": {"classRef": {"name": class}, "imageRef": {"name": image},
                            "networks": [{"name": "eth0", "networkClass": "lan"}]}})
        }),
        count: Box::new(move || {
            let mut count = BTreeMap::new();
            for vm in counted.vms() {
                if vm["template"] != true
                    && let Some(name) = vm["name"].as_str()
                {
                    *count.entry(name.to_owned()).or_default() += 1;
                }
            }
            count
        }),
        wait: Duration::from_secs(90),
    };
    scenario(&ns, &target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restored_objects_find_their_fakepve_vms_in_every_order() {
    let Some(pve) = FakePve::start() else { return };
    let pve = Arc::new(pve);
    let ns = banlieue_testenv::namespace("restore-pve").await;
    let r = &pve.ready;
    let fixtures = [
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "pve-credentials"},
               "stringData": {"tokenID": r.token_id, "tokenSecret": r.token_secret}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "pve"},
        "spec": {
            "class": "proxmox",
            "connection": {"endpoint": r.endpoint,
                           "credentialsRef": {"name": "pve-credentials"},
                           "caBundle": {"inline": r.ca_pem}},
            "capabilities": {
                "storageClasses": [{"name": "fast", "target": {"storage": "local-lvm"}}],
                "networkClasses": [{"name": "lan", "target": {"bridge": "vmbr0"}}]
            },
            "settings": {"taskPollInterval": "200ms", "shutdownTimeout": "5"}
        }}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": format!("{}-small", ns.name)},
               "spec": {"cpus": 2, "memoryMiB": 1024, "firmware": "bios", "disk": {"sizeGiB": 8, "storageClass": "fast"}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": format!("{}-debian", ns.name)},
               "spec": {"os": {"family": "linux", "distribution": "debian", "version": "13"},
                        "sources": {"proxmox": {"templateID": r.template_id}}}}),
    ];
    for object in &fixtures {
        apply(&ns.client, &ns.name, object).await.expect("fixture");
    }
    let counted = pve.clone();
    let (class, image) = (format!("{}-small", ns.name), format!("{}-debian", ns.name));
    let target = Target {
        label: "fakepve",
        kind: "ProxmoxMachine",
        plural: "proxmoxmachines",
        class: ProviderClass::Proxmox,
        factory: Arc::new(ProxmoxFactory::new()),
        vm: Box::new(move |name| {
            json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": name},
                   "spec": {"classRef": {"name": class}, "imageRef": {"name": image},
                            "networks": [{"name": "eth0", "networkClass": "lan"}]}})
        }),
        count: Box::new(move || {
            let mut count = BTreeMap::new();
            for vm in counted.machines() {
                if let Some(name) = vm["name"].as_str() {
                    *count.entry(name.to_owned()).or_default() += 1;
                }
            }
            count
        }),
        wait: Duration::from_secs(90),
    };
    scenario(&ns, &target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restored_objects_find_their_libvirt_domains_in_every_order() {
    let Some(rig) = LibvirtRig::start() else {
        return;
    };
    let rig = Arc::new(rig);
    let ns = banlieue_testenv::namespace("restore-lv").await;
    let fixtures = [
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "host"},
        "spec": {
            "class": "libvirt",
            "connection": {"endpoint": rig.uri},
            "capabilities": {
                "storageClasses": [{"name": "local", "target": {"pool": POOL}}],
                "networkClasses": [{"name": "isolated", "target": {"network": NETWORK}}]
            },
            "settings": {"domainType": "qemu", "pollInterval": "1s", "shutdownTimeout": "60s",
                         "failureDomain": "rig-host"}
        }}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": format!("{}-tiny", ns.name)},
               "spec": {"cpus": 1, "memoryMiB": 256, "firmware": "bios",
                        "disk": {"sizeGiB": 1, "storageClass": "local"}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": format!("{}-guest", ns.name)},
               "spec": {"os": {"family": "linux", "distribution": "busybox", "version": "1"},
                        "sources": {"libvirt": {"volume": {"pool": POOL, "name": IMAGE_VOLUME}, "format": "qcow2"}}}}),
    ];
    for object in &fixtures {
        apply(&ns.client, &ns.name, object).await.expect("fixture");
    }
    let counted = rig.clone();
    let prefix = format!("{}.", ns.name);
    let (class, image) = (format!("{}-tiny", ns.name), format!("{}-guest", ns.name));
    let target = Target {
        label: "libvirt",
        kind: "LibvirtMachine",
        plural: "libvirtmachines",
        class: ProviderClass::Libvirt,
        factory: Arc::new(LibvirtFactory::new()),
        vm: Box::new(move |name| {
            json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": name},
                   "spec": {"classRef": {"name": class}, "imageRef": {"name": image},
                            "networks": [{"name": "eth0", "networkClass": "isolated"}]}})
        }),
        count: Box::new(move || {
            let mut count = BTreeMap::new();
            for (domain, _, _) in counted.domains() {
                if let Some(name) = domain.strip_prefix(&prefix) {
                    *count.entry(name.to_owned()).or_default() += 1;
                }
            }
            count
        }),
        wait: Duration::from_secs(300),
    };
    scenario(&ns, &target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restored_objects_find_their_cloud_hypervisor_vms_in_every_order() {
    let rig = Arc::new(ChRig::new(FAKE_VMM, Guest::Exit));
    let ns = banlieue_testenv::namespace("restore-ch").await;
    let fixtures = [
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "ch"},
        "spec": {
            "class": "cloud-hypervisor",
            "connection": {"endpoint": rig.endpoint()},
            "capabilities": {
                "storageClasses": [{"name": "local", "target": {"storage": "local"}}],
                "networkClasses": [{"name": "lan", "target": {"network": "tap"}}]
            },
            "settings": rig.settings()
        }}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": format!("{}-small", ns.name)},
               "spec": {"cpus": 1, "memoryMiB": 512, "disk": {"sizeGiB": 1, "storageClass": "local"}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": format!("{}-debian", ns.name)},
               "spec": {"os": {"family": "linux", "distribution": "debian", "version": "13"},
                        "sources": {"cloudHypervisor": rig.image}}}),
    ];
    for object in &fixtures {
        apply(&ns.client, &ns.name, object).await.expect("fixture");
    }
    let counted = rig.clone();
    let (class, image) = (format!("{}-small", ns.name), format!("{}-debian", ns.name));
    let target = Target {
        label: "cloud-hypervisor",
        kind: "CloudHypervisorMachine",
        plural: "cloudhypervisormachines",
        class: ProviderClass::CloudHypervisor,
        factory: Arc::new(ChFactory::new()),
        vm: Box::new(move |name| {
            json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": name},
                   "spec": {"classRef": {"name": class}, "imageRef": {"name": image},
                            "networks": [{"name": "eth0", "networkClass": "lan"}]}})
        }),
        // A machine is a directory of the state directory whose record names the
        // object it was made for; each must run one VMM (a second VM would be a
        // second directory, a second VMM a restart).
        count: Box::new(move || {
            let mut count = BTreeMap::new();
            let Ok(dirs) = std::fs::read_dir(&counted.state_dir) else {
                return count;
            };
            for dir in dirs.flatten() {
                let uid = dir.file_name().to_string_lossy().into_owned();
                // `<uid>.partial`, `.importing`, `.imported`: not (yet) a machine.
                if uid.contains('.') {
                    continue;
                }
                let Some(record) = counted.state(&uid) else {
                    continue;
                };
                let name = record["name"].as_str().unwrap_or_default().to_owned();
                let vmms = counted.vmm_pids(&uid).len();
                assert_eq!(vmms, 1, "{name} ({uid}): VMMs {vmms}");
                *count.entry(name).or_default() += 1;
            }
            count
        }),
        wait: Duration::from_secs(90),
    };
    scenario(&ns, &target).await;
    rig.assert_conformant();
}

/// The machine's `Ready` condition: (status, reason, message).
fn machine_ready(machine: &DynamicObject) -> Option<(String, String, String)> {
    let c = machine.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")?;
    let text = |key: &str| c[key].as_str().unwrap_or_default().to_owned();
    Some((text("status"), text("reason"), text("message")))
}

/// Two backend VMs made for one object (the object's own, and one made for the same
/// namespace, kind and name under another UID — a create that ran twice, a copy made
/// by hand): the restored object cannot tell which is its own, so its machine waits,
/// `Ready=False RestorePending`, naming both, and nothing is created or adopted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_object_with_two_sim_vms_made_for_it_waits_for_a_human() {
    let ns = banlieue_testenv::namespace("restore-two").await;
    let (target, sim, endpoint) = sim_target(&ns).await;
    let (vm_api, machines) = (vm_objects(&ns), machines_api(&ns, &target));
    let live = |sim: &SimFactory| -> Vec<SimMachineInfo> {
        sim.machines(&endpoint)
            .into_iter()
            .filter(|m| !m.deleting)
            .collect()
    };

    // Made, Ready, backed up; then lost with the operator stopped.
    let operator = start(&ns, &target);
    apply(&ns.client, &ns.name, &(target.vm)(ALONE))
        .await
        .expect("VM");
    let started = Instant::now();
    let machine = loop {
        let vm: Option<VirtualMachine> = ns.api().get_opt(ALONE).await.expect("get VM");
        if let Some(m) = machines.get_opt(ALONE).await.expect("get machine")
            && provider_id(&m).is_some()
            && vm.as_ref().is_some_and(is_ready)
        {
            break m;
        }
        assert!(started.elapsed() < target.wait, "never Ready");
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let backup = dumped(&serde_json::to_value(vm_api.get(ALONE).await.expect("VM")).unwrap());
    operator.kill();
    strip_and_delete(&machines, ALONE).await;
    strip_and_delete(&vm_api, ALONE).await;

    // A second backend VM made for the same namespace, kind and name.
    let backend = sim
        .connect_sim(&Connection {
            class: ProviderClass::Sim,
            endpoint: endpoint.clone(),
            credentials: BTreeMap::new(),
            ca_bundle: None,
            insecure_skip_tls_verify: false,
            settings: BTreeMap::from([("latency".into(), SIM_LATENCY.into())]),
        })
        .expect("sim");
    let spec: LibvirtMachineSpec =
        serde_json::from_value(machine.data["spec"].clone()).expect("LibvirtMachine spec");
    let twin = MachineRequest {
        identity: MachineIdentity::new("0d0d0d0d-0000-4000-8000-000000000002", &ns.name, ALONE),
        spec: MachineSpec::Libvirt(spec),
        failure_domain: None,
        bootstrap: None,
        instance_id: None,
        disks_imported: false,
    };
    while live(&sim).iter().filter(|m| m.created).count() < 2 {
        backend.ensure(&twin).await.expect("the second VM");
        assert!(started.elapsed() < target.wait, "the second VM never made");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The simulator names both by the object (one backend ref), so each is named by
    // its provider ID with it.
    let both: Vec<(String, String)> = live(&sim)
        .into_iter()
        .map(|m| (m.backend_ref, m.provider_id))
        .collect();
    assert_eq!(both.len(), 2, "{both:?}");
    let created = sim.stats(&endpoint).machines_created;

    // The VM alone comes back (its machine is rebuilt, no providerID).
    assert_eq!(restore(&ns, &backup).await, "created");
    let operator = start(&ns, &target);
    let waiting = loop {
        if let Some(m) = machines.get_opt(ALONE).await.expect("get machine")
            && let Some((status, reason, message)) = machine_ready(&m)
            && reason == "RestorePending"
        {
            assert_eq!(status, "False");
            break message;
        }
        assert!(
            started.elapsed() < target.wait * 2,
            "never RestorePending; backend {:?}",
            (target.count)()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    eprintln!("RestorePending: {waiting}");
    for (backend_ref, provider_id) in &both {
        assert!(
            waiting.contains(&format!("{backend_ref} ({provider_id}")),
            "names {backend_ref} ({provider_id}): {waiting}"
        );
    }
    // A few more rounds: nothing created, nothing adopted.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let machine = machines.get(ALONE).await.expect("machine");
    assert_eq!(provider_id(&machine), None, "adopted one of two");
    assert_eq!(
        machine_ready(&machine)
            .map(|(_, reason, _)| reason)
            .as_deref(),
        Some("RestorePending")
    );
    assert_eq!(
        sim.stats(&endpoint).machines_created,
        created,
        "created one"
    );
    assert_eq!(live(&sim).len(), 2);
    let vm: VirtualMachine = ns.api().get(ALONE).await.expect("VM");
    let condition = |kind: &str| {
        vm.status
            .as_ref()
            .and_then(|s| conditions::get(&s.conditions, kind))
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
    };
    let (ready, infra) = (condition("Ready"), condition("InfrastructureReady"));
    eprintln!("the VM: Ready {ready:?}; InfrastructureReady {infra:?}");
    assert!(
        ready
            .as_ref()
            .is_some_and(|(status, _, _)| status == "False"),
        "the VM is not Ready: {ready:?}"
    );
    assert!(
        infra
            .as_ref()
            .is_some_and(|(status, reason, _)| status == "False" && reason == "RestorePending"),
        "the VM says what it waits for: {infra:?}"
    );
    operator.kill();
}
