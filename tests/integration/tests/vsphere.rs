//! The vSphere backend end to end: banlieue's controllers against a real apiserver,
//! the backend against vcsim (govmomi's vCenter simulator, a project-owned main run as
//! a separate process on loopback with TLS). Each test starts its own vcsim(s).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use banlieue_backend_sim::SimFactory;
use banlieue_backend_vsphere::VSphereFactory;
use banlieue_integration_tests::apply;
use banlieue_integration_tests::operator::{Operator, wait_for, wait_gone};
use banlieue_integration_tests::vcsim::Vcsim;
use banlieue_sdk::api::common::{BootstrapFormat, PowerState, ProviderClass};
use banlieue_sdk::api::infra::vsphere::VSphereMachine;
use banlieue_sdk::api::{Provider, VirtualMachine};
use banlieue_sdk::backend::{
    Backend, BackendRegistry, BootstrapData, Connection, Deletion, MachineIdentity, MachineRequest,
    MachineSpec, SecretValue,
};
use banlieue_sdk::conditions;
use banlieue_testenv::TestNamespace;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);

fn connection(sim: &Vcsim, password: &str) -> Connection {
    Connection {
        class: ProviderClass::Vsphere,
        endpoint: format!("{}/sdk", sim.ready.endpoint),
        credentials: [
            (
                "username".to_string(),
                SecretValue::new(sim.ready.username.clone()),
            ),
            ("password".to_string(), SecretValue::new(password)),
        ]
        .into(),
        ca_bundle: Some(sim.ready.ca_pem.clone()),
        insecure_skip_tls_verify: false,
        settings: [("taskPollInterval".to_string(), "50ms".to_string())].into(),
    }
}

fn request(uid: &str, template: &str, linked: bool) -> MachineRequest {
    let spec = serde_json::from_value(json!({
        "template": template, "numCPUs": 2, "memoryMiB": 2048, "diskGiB": 20,
        "additionalDisks": [{"name": "data", "sizeGiB": 30, "storage": "LocalDS_1"}],
        "cloneMode": if linked { "LinkedClone" } else { "FullClone" },
        // Full clones on a standard port group with a fixed MAC, linked ones on the
        // distributed port group.
        "network": [if linked { json!({"networkName": "DC0_DVPG0"}) }
                    else { json!({"networkName": "VM Network", "macAddress": "00:50:56:3f:00:01",
                                "ipam": {"mode": "static", "addresses": ["10.0.0.5/24"], "gateway": "10.0.0.1"}}) }],
    }))
    .unwrap();
    MachineRequest {
        identity: MachineIdentity {
            uid: uid.into(),
            namespace: "direct".into(),
            name: format!("m-{}", &uid[..8]),
            provider_id: None,
        },
        spec: MachineSpec::VSphere(spec),
        failure_domain: Some("DC0/DC0_C1".into()),
        bootstrap: Some(BootstrapData {
            format: BootstrapFormat::CloudConfig,
            user_data: SecretValue::new("#cloud-config\nruncmd: [echo hi]\n"),
            network_config: None,
        }),
        instance_id: None,
        disks_imported: false,
    }
}

fn decoded(vm: &Value, key: &str) -> String {
    let v = vm["extraConfig"][key].as_str().unwrap_or_default();
    String::from_utf8(STANDARD.decode(v).unwrap()).unwrap()
}

async fn settle(
    backend: &dyn Backend,
    req: &MachineRequest,
) -> banlieue_sdk::backend::MachineObservation {
    for _ in 0..400 {
        match backend.ensure(req).await {
            Ok(o) if o.settled_at(req.spec.power_state()) => return o,
            Ok(_) => {}
            Err(e) if e.is_transient() => {}
            Err(e) => panic!("{e}"),
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("machine did not settle")
}

/// The backend alone against vcsim: inventory, clone (full and linked) with guestinfo,
/// power, addresses, delete, one session throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backend_clones_configures_powers_and_deletes_on_vcsim() {
    let Some(sim) = Vcsim::start() else { return };
    let backend = VSphereFactory::new()
        .connect_vsphere(&connection(&sim, &sim.ready.password))
        .unwrap();
    let inventory = backend.check().await.unwrap();
    assert_eq!(inventory.version, sim.ready.version);
    let names: Vec<&str> = inventory
        .failure_domains
        .iter()
        .map(|f| f.name.as_str())
        .collect();
    assert_eq!(names, ["DC0/DC0_C0", "DC0/DC0_C1"]);
    let fd = &inventory.failure_domains[1];
    assert_eq!(fd.labels["topology.kubernetes.io/zone"], "DC0_C1");
    assert_eq!(fd.labels["topology.kubernetes.io/region"], "DC0");
    assert_eq!(fd.location["cluster"], "DC0_C1");
    assert!(fd.resources["datastore"].contains("LocalDS_0"), "{fd:?}");
    assert!(fd.resources["portGroup"].contains("VM Network"), "{fd:?}");

    for (i, linked) in [(1, false), (2, true)] {
        let uid = format!("{i:08x}-1111-4000-8000-000000000000");
        let req = request(&uid, &sim.ready.template, linked);
        let started = Instant::now();
        let o = settle(backend.as_ref(), &req).await;
        eprintln!(
            "clone (linked: {linked}) to running with an IP: {:?}",
            started.elapsed()
        );
        let vm = sim.vm(&req.identity.name).expect("the clone");
        assert_eq!(
            o.provider_id.as_deref(),
            Some(format!("vsphere://{}", vm["biosUUID"].as_str().unwrap()).as_str())
        );
        assert_eq!(vm["power"], "poweredOn");
        assert_eq!(
            (vm["cpus"].as_i64(), vm["memoryMB"].as_i64()),
            (Some(2), Some(2048))
        );
        assert_eq!(vm["extraConfig"]["banlieue.uid"], uid.as_str());
        assert_eq!(vm["extraConfig"]["guestinfo.userdata.encoding"], "base64");
        assert_eq!(
            decoded(&vm, "guestinfo.userdata"),
            "#cloud-config\nruncmd: [echo hi]\n"
        );
        assert!(decoded(&vm, "guestinfo.metadata").contains(&uid));
        assert_eq!(o.failure_domain.as_deref(), Some("DC0/DC0_C1"));
        assert_eq!(
            vm["disksKB"],
            json!([20 * 1024 * 1024, 30 * 1024 * 1024]),
            "{vm}"
        );
        let nic = &vm["nics"][0];
        if linked {
            assert!(
                nic["portgroupKey"]
                    .as_str()
                    .unwrap()
                    .starts_with("dvportgroup-"),
                "{nic}"
            );
        } else {
            assert_eq!(nic["network"], "VM Network", "{nic}");
            assert_eq!(nic["mac"], "00:50:56:3f:00:01", "{nic}");
            // Static IPAM becomes cloud-init's network config, matched by MAC.
            let meta: Value = serde_json::from_str(&decoded(&vm, "guestinfo.metadata")).unwrap();
            let network: Value = serde_json::from_slice(
                &STANDARD.decode(meta["network"].as_str().unwrap()).unwrap(),
            )
            .unwrap();
            assert_eq!(meta["network.encoding"], "base64");
            let eth0 = &network["ethernets"]["eth0"];
            assert_eq!(
                eth0["match"]["macaddress"], "00:50:56:3f:00:01",
                "{network}"
            );
            assert_eq!(eth0["addresses"], json!(["10.0.0.5/24"]), "{network}");
        }
        let ip = vm["ip"].as_str().unwrap();
        assert!(
            o.addresses.iter().any(|a| a.address == ip),
            "{:?}",
            o.addresses
        );
        // Observing again clones nothing more.
        backend.ensure(&req).await.unwrap();
        assert_eq!(
            sim.vms()
                .iter()
                .filter(|v| v["name"] == req.identity.name.as_str())
                .count(),
            1
        );
    }
    for i in [1, 2] {
        let id = request(&format!("{i:08x}-1111-4000-8000-000000000000"), "", false).identity;
        let mut gone = false;
        for _ in 0..200 {
            if backend.delete(&id).await.unwrap() == Deletion::Gone {
                gone = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        assert!(gone);
        assert!(sim.vm(&id.name).is_none());
        assert!(backend.observe(&id).await.unwrap().is_none());
    }
    let sessions = sim.sessions();
    assert_eq!(sessions.len(), 1, "{sessions:?}");
    assert_eq!(backend.client().logins(), 1);
    // Dropping the backend (the Provider went away) ends its session.
    drop(backend);
    for _ in 0..100 {
        if sim.sessions().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(sim.sessions().is_empty(), "{:?}", sim.sessions());
}

/// An operator restart while a clone is in flight: the new backend knows nothing of
/// the task, clones again, vSphere refuses the name (DuplicateName, transient), and
/// once the first clone is done the VM is found by its instance UUID. One VM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_during_a_clone_never_clones_twice() {
    let Some(sim) = Vcsim::start() else { return };
    sim.task_delay(1500);
    let mut connection = connection(&sim, &sim.ready.password);
    connection
        .settings
        .insert("failedCloneBackoff".into(), "200ms".into());
    let req = request(
        "00000003-1111-4000-8000-000000000000",
        &sim.ready.template,
        false,
    );
    let before = VSphereFactory::new().connect_vsphere(&connection).unwrap();
    let first = before.ensure(&req).await.unwrap();
    assert_eq!(
        first.pending.as_ref().map(|p| p.operation.as_str()),
        Some("Cloning")
    );
    drop(before);
    let after = VSphereFactory::new().connect_vsphere(&connection).unwrap();
    let mut saw_duplicate = false;
    let mut settled = false;
    for _ in 0..400 {
        match after.ensure(&req).await {
            Ok(o) if o.settled_at(PowerState::PoweredOn) => {
                settled = true;
                break;
            }
            Ok(_) => {}
            Err(e) if e.is_transient() => {
                saw_duplicate |= e.message.contains("DuplicateName");
            }
            Err(e) => panic!("{e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(settled, "the machine settled");
    assert!(saw_duplicate, "the second clone was refused by name");
    let named = sim
        .vms()
        .into_iter()
        .filter(|v| v["name"] == req.identity.name.as_str())
        .count();
    assert_eq!(named, 1, "one VM");
}

/// TLS is verified: without the Provider's CA the vCenter is unreachable with the
/// TLS error as the message; `insecureSkipTLSVerify` connects anyway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_is_verified_against_the_providers_ca_bundle() {
    let Some(sim) = Vcsim::start() else { return };
    let mut no_ca = connection(&sim, &sim.ready.password);
    no_ca.ca_bundle = None;
    let backend = VSphereFactory::new().connect_vsphere(&no_ca).unwrap();
    let error = backend.check().await.unwrap_err();
    assert_eq!(error.reason, "Unreachable");
    assert!(error.is_transient());
    assert!(
        error.message.to_lowercase().contains("certificate"),
        "{}",
        error.message
    );
    let mut insecure = no_ca.clone();
    insecure.insecure_skip_tls_verify = true;
    let backend = VSphereFactory::new().connect_vsphere(&insecure).unwrap();
    assert_eq!(backend.check().await.unwrap().failure_domains.len(), 2);
    let mut garbage = connection(&sim, &sim.ready.password);
    garbage.ca_bundle = Some("not a certificate".into());
    let error = VSphereFactory::new().connect_vsphere(&garbage).unwrap_err();
    assert_eq!(error.reason, "InvalidCABundle");
}

/// A Provider `name` on `sim` (password `password`) with storage class `fast`
/// (LocalDS_0) and network class `lan` (VM Network).
fn provider(sim: &Vcsim, name: &str, password: &str) -> [Value; 2] {
    let secret = format!("{name}-credentials");
    [
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": secret},
               "stringData": {"username": sim.ready.username, "password": password}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": name},
        "spec": {
            "class": "vsphere",
            "connection": {"endpoint": format!("{}/sdk", sim.ready.endpoint),
                           "credentialsRef": {"name": secret},
                           "caBundle": {"inline": sim.ready.ca_pem}},
            "capabilities": {
                "storageClasses": [{"name": "fast", "target": {"datastore": "LocalDS_0"}}],
                "networkClasses": [{"name": "lan", "target": {"portGroup": "VM Network"}}]
            },
            "settings": {"taskPollInterval": "100ms", "shutdownTimeout": "2s", "failedCloneBackoff": "3s"}
        }}),
    ]
}

/// A namespace with the given Providers (vcsim, password), a class, an image and the
/// operator.
async fn world(prefix: &str, providers: &[(&str, &Vcsim, &str)]) -> (TestNamespace, Operator) {
    let ns = banlieue_testenv::namespace(prefix).await;
    let template = &providers[0].1.ready.template;
    let mut objects: Vec<Value> = providers
        .iter()
        .flat_map(|(name, sim, password)| provider(sim, name, password))
        .collect();
    objects.extend([
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": format!("{}-small", ns.name)},
               "spec": {"cpus": 2, "memoryMiB": 1024, "disk": {"sizeGiB": 16, "storageClass": "fast"}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": format!("{}-ubuntu", ns.name)},
               "spec": {"os": {"family": "linux", "distribution": "ubuntu", "version": "24.04"},
                        "sources": {"vsphere": {"template": template}}}}),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "user-data"},
               "stringData": {"value": "#cloud-config\nruncmd: [echo banlieue]\n"}}),
    ]);
    for object in &objects {
        apply(&ns.client, &ns.name, object).await.expect("fixture");
    }
    let mut registry = BackendRegistry::default();
    registry.register(ProviderClass::Vsphere, Arc::new(VSphereFactory::new()));
    let operator = Operator::start_with_registry(
        ns.client.clone(),
        &ns.name,
        registry,
        Arc::new(SimFactory::new()),
        Duration::from_secs(5),
    );
    (ns, operator)
}

fn vm(ns: &TestNamespace, name: &str) -> Value {
    json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
        "metadata": {"name": name, "labels": {"app": "web"}},
        "spec": {"classRef": {"name": format!("{}-small", ns.name)},
                 "imageRef": {"name": format!("{}-ubuntu", ns.name)},
                 "bootstrap": {"format": "cloud-config", "userData": {"name": "user-data"}},
                 "networks": [{"name": "eth0", "networkClass": "lan"}]}
    })
}

type Conditions = [k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition];

fn vm_conditions(vm: &VirtualMachine) -> &Conditions {
    vm.status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default()
}

fn is_ready(vm: &VirtualMachine) -> bool {
    conditions::get(vm_conditions(vm), "Ready").is_some_and(|c| c.status == "True")
}

fn has_address(vm: &VirtualMachine) -> bool {
    vm.status
        .as_ref()
        .is_some_and(|s| s.addresses.iter().any(|a| a.address.starts_with("10.7")))
}

/// True when a condition of the VSphereMachine names `reason` (as its reason, or at
/// the start of its message) and its message contains `text`.
fn has_condition(machine: &VSphereMachine, reason: &str, text: &str) -> bool {
    machine.status.as_ref().is_some_and(|s| {
        s.conditions.iter().any(|c| {
            (c.reason == reason || c.message.starts_with(&format!("{reason}: ")))
                && c.message.contains(text)
        })
    })
}

async fn set_power(vms: &Api<VirtualMachine>, name: &str, state: &str) {
    vms.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"powerState": state}})),
    )
    .await
    .unwrap();
}

async fn ready_provider(providers: &Api<Provider>, name: &str) -> Provider {
    wait_for(providers, name, WAIT, |p| {
        p.status
            .as_ref()
            .is_some_and(|s| conditions::is_true(&s.conditions, "Ready"))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_virtual_machine_is_cloned_with_guestinfo_powered_on_addressed_and_deleted() {
    let Some(sim) = Vcsim::start() else { return };
    let (ns, _operator) = world("vs-life", &[("vc", &sim, &sim.ready.password)]).await;
    let providers: Api<Provider> = ns.api();
    let status = ready_provider(&providers, "vc").await.status.unwrap();
    assert_eq!(status.version.as_deref(), Some(sim.ready.version.as_str()));
    let names: Vec<&str> = status
        .failure_domains
        .iter()
        .map(|f| f.name.as_str())
        .collect();
    assert_eq!(names, ["DC0/DC0_C0", "DC0/DC0_C1"]);
    for fd in &status.failure_domains {
        assert_eq!(fd.storage_classes, ["fast"], "{fd:?}");
        assert_eq!(fd.network_classes, ["lan"], "{fd:?}");
        assert_eq!(fd.labels["topology.kubernetes.io/region"], "DC0");
    }

    let started = Instant::now();
    apply(&ns.client, &ns.name, &vm(&ns, "web-1"))
        .await
        .unwrap();
    let vms: Api<VirtualMachine> = ns.api();
    let ready = wait_for(&vms, "web-1", WAIT, |v| is_ready(v) && has_address(v)).await;
    eprintln!(
        "VirtualMachine applied to Ready with an address: {:?}",
        started.elapsed()
    );
    let status = ready.status.as_ref().unwrap();
    let machine = sim.vm("web-1").expect("a clone in vcsim");
    assert_eq!(
        status.provider_id.as_deref(),
        Some(format!("vsphere://{}", machine["biosUUID"].as_str().unwrap()).as_str())
    );
    assert!(
        status
            .addresses
            .iter()
            .any(|a| a.address == machine["ip"].as_str().unwrap()),
        "{:?} vs {machine}",
        status.addresses
    );
    assert_eq!(machine["power"], "poweredOn");
    assert_eq!(machine["nics"][0]["network"], "VM Network", "{machine}");
    assert_eq!(
        machine["diskKB"],
        16 * 1024 * 1024,
        "grown from 10 GiB: {machine}"
    );
    assert_eq!(
        (machine["cpus"].as_i64(), machine["memoryMB"].as_i64()),
        (Some(2), Some(1024))
    );
    let machines: Api<VSphereMachine> = ns.api();
    let infra = machines.get("web-1").await.unwrap();
    let uid = infra.metadata.uid.clone().unwrap();
    assert_eq!(machine["extraConfig"]["banlieue.uid"], uid.as_str());
    assert_eq!(
        decoded(&machine, "guestinfo.userdata"),
        "#cloud-config\nruncmd: [echo banlieue]\n"
    );
    assert_eq!(
        machine["extraConfig"]["guestinfo.userdata.encoding"],
        "base64"
    );
    let meta: Value = serde_json::from_str(&decoded(&machine, "guestinfo.metadata")).unwrap();
    assert_eq!(meta["instance-id"], uid.as_str());
    assert_eq!(meta["local-hostname"], "web-1");
    let fd = status
        .placement
        .as_ref()
        .unwrap()
        .failure_domain
        .clone()
        .unwrap();
    assert_eq!(
        machine["extraConfig"]["banlieue.failureDomain"],
        fd.as_str()
    );
    let clones = sim
        .vms()
        .into_iter()
        .filter(|v| v["template"] != true)
        .count();
    assert_eq!(clones, 2, "the seeded VM and exactly one clone");

    set_power(&vms, "web-1", "PoweredOff").await;
    wait_for(&vms, "web-1", WAIT, |v| {
        v.status.as_ref().and_then(|s| s.power_state) == Some(PowerState::PoweredOff)
    })
    .await;
    assert_eq!(sim.vm("web-1").unwrap()["power"], "poweredOff");
    set_power(&vms, "web-1", "PoweredOn").await;
    wait_for(&vms, "web-1", WAIT, |v| {
        is_ready(v) && v.status.as_ref().and_then(|s| s.power_state) == Some(PowerState::PoweredOn)
    })
    .await;
    assert_eq!(sim.vm("web-1").unwrap()["power"], "poweredOn");

    vms.delete("web-1", &DeleteParams::default()).await.unwrap();
    wait_gone(&vms, "web-1", WAIT).await;
    assert!(sim.vm("web-1").is_none(), "{:?}", sim.vms());
}

/// Two vCenters as two Providers: failure domains from both, and VMs spread over
/// both by the scheduler (anti-affinity on the Provider).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_vcenters_are_two_providers_and_vms_spread_across_them() {
    let Some(a) = Vcsim::start() else { return };
    let Some(b) = Vcsim::start_args(&["-ip-prefix", "10.78"]) else {
        return;
    };
    let (ns, _operator) = world(
        "vs-two",
        &[
            ("vc-a", &a, &a.ready.password),
            ("vc-b", &b, &b.ready.password),
        ],
    )
    .await;
    let providers: Api<Provider> = ns.api();
    for name in ["vc-a", "vc-b"] {
        let p = ready_provider(&providers, name).await;
        assert_eq!(p.status.unwrap().failure_domains.len(), 2);
    }
    let vms: Api<VirtualMachine> = ns.api();
    let names = ["w1", "w2"];
    for name in names {
        let mut object = vm(&ns, name);
        object["spec"]["placement"]["antiAffinity"] = json!([{
            "labelSelector": {"matchLabels": {"app": "web"}},
            "topologyKey": "banlieue.io/provider",
            "mode": "Required"
        }]);
        apply(&ns.client, &ns.name, &object).await.unwrap();
    }
    let mut placed = BTreeSet::new();
    for name in names {
        let ready = wait_for(&vms, name, WAIT, |v| is_ready(v) && has_address(v)).await;
        placed.insert(ready.status.unwrap().placement.unwrap().provider);
    }
    assert_eq!(
        placed,
        BTreeSet::from(["vc-a".to_string(), "vc-b".to_string()])
    );
    let on = |sim: &Vcsim| names.iter().filter(|n| sim.vm(n).is_some()).count();
    assert_eq!((on(&a), on(&b)), (1, 1));
    assert_eq!(
        (a.sessions().len(), b.sessions().len()),
        (1, 1),
        "one session per vCenter"
    );
}

/// Ten machines, each reconciled at least five times (clone, configure, power on,
/// address, ready) and then powered off and on again: one vCenter session for all of
/// it, and a session ended under the operator's feet is renewed transparently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_session_serves_every_reconcile_and_an_ended_session_is_renewed() {
    let Some(sim) = Vcsim::start() else { return };
    let (ns, _operator) = world("vs-sessions", &[("vc", &sim, &sim.ready.password)]).await;
    let vms: Api<VirtualMachine> = ns.api();
    let started = Instant::now();
    let names: Vec<String> = (0..10).map(|i| format!("s-{i}")).collect();
    for name in &names {
        apply(&ns.client, &ns.name, &vm(&ns, name)).await.unwrap();
    }
    for name in &names {
        wait_for(&vms, name, WAIT, |v| is_ready(v) && has_address(v)).await;
    }
    eprintln!(
        "10 VirtualMachines applied to Ready with addresses: {:?}",
        started.elapsed()
    );
    let sessions = sim.sessions();
    assert_eq!(sessions.len(), 1, "{sessions:?}");
    assert_eq!(sessions[0]["userName"], sim.ready.username.as_str());
    // One login (the harness logged in once itself).
    assert_eq!(sim.calls("Login"), 2);

    assert_eq!(sim.terminate_sessions(), 1);
    for name in &names {
        set_power(&vms, name, "PoweredOff").await;
    }
    for name in &names {
        wait_for(&vms, name, WAIT, |v| {
            v.status.as_ref().and_then(|s| s.power_state) == Some(PowerState::PoweredOff)
        })
        .await;
        assert_eq!(sim.vm(name).unwrap()["power"], "poweredOff");
    }
    let renewed = sim.sessions();
    assert_eq!(renewed.len(), 1, "{renewed:?}");
    assert_ne!(renewed[0]["key"], sessions[0]["key"], "a new session");
    assert_eq!(
        sim.calls("Login"),
        3,
        "one more login after the session ended"
    );
    // Every reconcile reads its VM: well over 50 reads in all, over 2 sessions. A VM is
    // searched for by UUID only until its reference is known, not on every reconcile.
    let (reads, lookups) = (sim.calls("RetrievePropertiesEx"), sim.calls("FindByUuid"));
    eprintln!("{reads} reads and {lookups} VM lookups over 2 sessions");
    assert!(reads >= 50, "{reads}");
    assert!(lookups <= 30, "{lookups} lookups for {} VMs", names.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_makes_the_provider_unreachable_with_a_clear_reason() {
    let Some(sim) = Vcsim::start() else { return };
    let (ns, _operator) = world("vs-badpw", &[("vc", &sim, "not-the-password")]).await;
    let providers: Api<Provider> = ns.api();
    let provider = wait_for(&providers, "vc", WAIT, |p| {
        p.status.as_ref().is_some_and(|s| {
            conditions::get(&s.conditions, "Reachable").is_some_and(|c| c.status == "False")
        })
    })
    .await;
    let status = provider.status.unwrap();
    let reachable = conditions::get(&status.conditions, "Reachable").unwrap();
    assert_eq!(reachable.reason, "Unauthorized");
    assert!(
        reachable.message.contains("rejected the credentials")
            && reachable.message.contains("InvalidLogin"),
        "{}",
        reachable.message
    );
    assert!(!reachable.message.contains("not-the-password"));
    assert!(sim.sessions().is_empty());
    // No login storm: the rejection is remembered (a minute) while the Provider is
    // checked again and again. The harness logged in once itself.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let logins = sim.calls("Login");
    eprintln!("logins while the password is wrong: {logins} (the harness's own included)");
    assert_eq!(logins, 2, "one login by the harness, one by the backend");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_failures_and_soap_faults_become_conditions_with_vspheres_message() {
    let Some(sim) = Vcsim::start() else { return };
    let (ns, _operator) = world("vs-faults", &[("vc", &sim, &sim.ready.password)]).await;
    sim.fail_task(
        "CloneVM_Task",
        "Insufficient disk space on datastore 'LocalDS_0'.",
        1,
    );
    // Until cleared: the condition must stay long enough for the test to see it.
    sim.fail(
        "PowerOnVM_Task",
        "host DC0_C0_H0 is in maintenance mode",
        1000,
    );
    apply(&ns.client, &ns.name, &vm(&ns, "app-1"))
        .await
        .unwrap();
    let machines: Api<VSphereMachine> = ns.api();
    wait_for(&machines, "app-1", WAIT, |m| {
        has_condition(
            m,
            "CloneFailed",
            "Insufficient disk space on datastore 'LocalDS_0'.",
        )
    })
    .await;
    // Reported for failedCloneBackoff (3 s here), then cloned again; the power-on
    // fault comes next and is retried until it clears.
    wait_for(&machines, "app-1", WAIT, |m| {
        has_condition(m, "VSphereFault", "maintenance mode")
    })
    .await;
    assert!(sim.calls("PowerOnVM_Task") >= 1);
    sim.clear_faults();
    let vms: Api<VirtualMachine> = ns.api();
    let ready = wait_for(&vms, "app-1", WAIT, |v| is_ready(v) && has_address(v)).await;
    assert!(ready.status.unwrap().provider_id.is_some());
    assert_eq!(
        sim.vms().iter().filter(|v| v["name"] == "app-1").count(),
        1,
        "one clone"
    );
}

/// `networks[].mtu` on vSphere (issue 38: it was dropped): a vSphere NIC has no MTU of
/// its own, so it travels to the guest in the cloud-init network config banlieue
/// writes to `guestinfo.metadata`, matched by the NIC's MAC. A VM whose bootstrap data
/// brings its own network config (given to the guest as is) and asks an MTU is refused
/// before the clone, its VSphereMachine and the VM naming the field and why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_network_mtu_reaches_the_guest_through_guestinfo_or_is_refused_before_the_clone() {
    let Some(sim) = Vcsim::start() else { return };
    let (ns, _operator) = world("vs-mtu", &[("vc", &sim, &sim.ready.password)]).await;
    let mut object = vm(&ns, "mtu-1");
    object["spec"]["networks"] = json!([{"name": "eth0", "networkClass": "lan", "mtu": 9000}]);
    apply(&ns.client, &ns.name, &object).await.unwrap();
    let vms: Api<VirtualMachine> = ns.api();
    wait_for(&vms, "mtu-1", WAIT, is_ready).await;
    let machines: Api<VSphereMachine> = ns.api();
    let infra = machines.get("mtu-1").await.unwrap();
    assert_eq!(infra.spec.network[0].mtu, Some(9000), "built from the VM");
    let machine = sim.vm("mtu-1").expect("a clone in vcsim");
    let meta: Value = serde_json::from_str(&decoded(&machine, "guestinfo.metadata")).unwrap();
    assert_eq!(meta["network.encoding"], "base64");
    let network: Value = serde_json::from_slice(
        &STANDARD
            .decode(meta["network"].as_str().expect("a network config"))
            .unwrap(),
    )
    .unwrap();
    eprintln!("guestinfo.metadata network: {network}");
    let eth0 = &network["ethernets"]["eth0"];
    assert_eq!(eth0["mtu"], 9000, "{network}");
    assert_eq!(eth0["dhcp4"], true, "{network}");
    assert_eq!(
        eth0["match"]["macaddress"].as_str(),
        machine["nics"][0]["mac"].as_str(),
        "{network} vs {machine}"
    );

    // Its own network config in the bootstrap data: the MTU would never reach the guest.
    apply(
        &ns.client,
        &ns.name,
        &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "own-network"},
                "stringData": {"value": "#cloud-config\n", "network-config": "version: 2\nethernets: {}\n"}}),
    )
    .await
    .unwrap();
    let mut object = vm(&ns, "mtu-2");
    object["spec"]["networks"] = json!([{"name": "eth0", "networkClass": "lan", "mtu": 9000}]);
    object["spec"]["bootstrap"] = json!({"format": "cloud-config", "userData": {"name": "own-network"},
                                         "networkConfig": {"name": "own-network"}});
    apply(&ns.client, &ns.name, &object).await.unwrap();
    let want = "network[0].mtu 9000 (VM Network): the bootstrap data brings its own network config";
    wait_for(&machines, "mtu-2", WAIT, |m| {
        has_condition(m, "MTUUnsupported", want)
    })
    .await;
    let refused = wait_for(&vms, "mtu-2", WAIT, |v| {
        vm_conditions(v).iter().any(|c| c.message.contains(want))
    })
    .await;
    assert!(!is_ready(&refused));
    assert!(sim.vm("mtu-2").is_none(), "nothing cloned: {:?}", sim.vms());
}
