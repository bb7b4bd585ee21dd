//! A vSphere VM that exists changes honestly (issue 38), against vcsim: the operator
//! (real apiserver) edits a VSphereMachine after it is Ready, and what the VM runs with
//! is read from vcsim by the harness (govmomi, not banlieue's client), counting the
//! `ReconfigVM_Task` calls. The vSphere change table
//! (`banlieue_backend_vsphere::change_table`): disks grow live; CPUs and memory grow
//! live on a VM made with hot-add, else wait for a power-off, as cores per socket and
//! every shrink do; firmware and network devices are never changed on a made VM.

use std::sync::Arc;
use std::time::Duration;

use banlieue_backend_sim::SimFactory;
use banlieue_backend_vsphere::VSphereFactory;
use banlieue_backend_vsphere::client::MoRef;
use banlieue_integration_tests::apply;
use banlieue_integration_tests::operator::{Operator, wait_for};
use banlieue_integration_tests::vcsim::Vcsim;
use banlieue_sdk::api::VirtualMachine;
use banlieue_sdk::api::common::{PowerState, ProviderClass};
use banlieue_sdk::api::infra::vsphere::VSphereMachine;
use banlieue_sdk::api::resources::{ChangeMode, MachineField, MachineResources};
use banlieue_sdk::backend::{
    Backend, BackendRegistry, Connection, MachineIdentity, MachineRequest, MachineSpec, SecretValue,
};
use banlieue_sdk::conditions;
use banlieue_sdk::contract::InfraMachineRead;
use banlieue_testenv::TestNamespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::Api;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(90);
const GIB_KB: u64 = 1024 * 1024;

fn connection(sim: &Vcsim) -> Connection {
    Connection {
        class: ProviderClass::Vsphere,
        endpoint: format!("{}/sdk", sim.ready.endpoint),
        credentials: [
            (
                "username".to_string(),
                SecretValue::new(sim.ready.username.clone()),
            ),
            (
                "password".to_string(),
                SecretValue::new(sim.ready.password.clone()),
            ),
        ]
        .into(),
        ca_bundle: Some(sim.ready.ca_pem.clone()),
        insecure_skip_tls_verify: false,
        settings: [("taskPollInterval".to_string(), "50ms".to_string())].into(),
    }
}

async fn world(prefix: &str, sim: &Vcsim) -> (TestNamespace, Operator) {
    let ns = banlieue_testenv::namespace(prefix).await;
    for object in [
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
    ] {
        apply(&ns.client, &ns.name, &object).await.expect("fixture");
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

/// The machine's spec: what each step of the test edits.
#[derive(Clone)]
struct Shape {
    cpus: u32,
    cores: u32,
    memory: u64,
    disk: u32,
    data: u32,
    firmware: Option<&'static str>,
    networks: usize,
    power: &'static str,
}

fn machine(sim: &Vcsim, s: &Shape) -> Value {
    let network: Vec<Value> = (0..s.networks)
        .map(|_| json!({"networkName": "VM Network"}))
        .collect();
    let mut spec = json!({
        "providerRef": {"name": "vc"}, "template": sim.ready.template,
        "datacenter": "DC0", "cluster": "DC0_C0",
        "numCPUs": s.cpus, "numCoresPerSocket": s.cores, "memoryMiB": s.memory,
        "diskGiB": s.disk,
        "additionalDisks": [{"name": "data", "sizeGiB": s.data}],
        "network": network, "powerState": s.power,
    });
    if let Some(f) = s.firmware {
        spec["firmware"] = f.into();
    }
    json!({
        "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "VSphereMachine",
        "metadata": {"name": "m"}, "spec": spec,
    })
}

fn condition<'a>(m: &'a VSphereMachine, type_: &str) -> Option<&'a Condition> {
    m.status
        .as_ref()
        .and_then(|s| conditions::get(&s.conditions, type_))
}

fn is(m: &VSphereMachine, type_: &str, status: &str, reason: &str) -> bool {
    condition(m, type_).is_some_and(|c| {
        c.status == status && c.reason == reason && c.observed_generation == m.metadata.generation
    })
}

fn running(m: &VSphereMachine) -> Option<MachineResources> {
    m.status
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.running.clone())
}

/// The disks' capacities in KiB, as vcsim has them, largest first (the test keeps the
/// OS disk the larger): vSphere lists an edited device last, so the device order is
/// not the disks' order.
fn disks_kb(vm: &Value) -> Vec<u64> {
    let mut kb: Vec<u64> = vm["disksKB"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap())
        .collect();
    kb.sort_unstable_by(|a, b| b.cmp(a));
    kb
}

/// Disks grow live; CPUs, cores and memory wait for a power-off, say so, and a power
/// cycle applies them in one reconfigure; a firmware change and an added network
/// device are refused by name and nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vsphere_vm_grows_its_disks_live_and_resizes_across_a_power_cycle() {
    let Some(sim) = Vcsim::start() else { return };
    let (ns, _operator) = world("vs-change", &sim).await;
    let machines: Api<VSphereMachine> = ns.api();
    let mut shape = Shape {
        cpus: 2,
        cores: 1,
        memory: 1024,
        disk: 16,
        data: 10,
        firmware: None,
        networks: 1,
        power: "PoweredOn",
    };
    apply(&ns.client, &ns.name, &machine(&sim, &shape))
        .await
        .unwrap();
    let m = wait_for(&machines, "m", WAIT, |m: &VSphereMachine| {
        m.is_ready() && is(m, "UpToDate", "True", "UpToDate")
    })
    .await;
    let provider_id = m.provider_id().unwrap().to_owned();
    let r = running(&m).expect("status.resources.running");
    assert_eq!(
        (r.cpus, r.cores_per_socket, r.memory_mib, r.os_disk_gib),
        (2, Some(1), 1024, Some(16)),
        "{r:?}"
    );
    assert_eq!(r.data_disks.len(), 1);
    assert_eq!(
        (r.data_disks[0].name.as_str(), r.data_disks[0].size_gib),
        ("data", 10)
    );
    assert_eq!(r.networks, 1);
    // vcsim's template has no hot-add: its ceilings are what it has.
    assert_eq!((r.max_cpus, r.max_memory_mib), (Some(2), Some(1024)));
    assert!(is(&m, "RestartRequired", "False", "NoRestartPending"));
    let vm = sim.vm("m").expect("the clone");
    assert_eq!(disks_kb(&vm), [16 * GIB_KB, 10 * GIB_KB]);
    // The configure (and any firmware fix) are the reconfigures so far.
    let reconfigures = sim.calls("ReconfigVM_Task");
    eprintln!("ReconfigVM_Task calls to make the machine: {reconfigures}");

    // The disks grow live: one reconfigure, read back, never powered off.
    shape.disk = 20;
    shape.data = 15;
    apply(&ns.client, &ns.name, &machine(&sim, &shape))
        .await
        .unwrap();
    let m = wait_for(&machines, "m", WAIT, |m: &VSphereMachine| {
        is(m, "UpToDate", "True", "UpToDate")
            && running(m).is_some_and(|r| {
                r.os_disk_gib == Some(20) && r.data_disks.first().map(|d| d.size_gib) == Some(15)
            })
    })
    .await;
    assert!(m.is_ready(), "a live change keeps it Ready");
    let vm = sim.vm("m").unwrap();
    assert_eq!(disks_kb(&vm), [20 * GIB_KB, 15 * GIB_KB], "{vm}");
    assert_eq!(vm["power"], "poweredOn");
    assert_eq!(
        sim.calls("ReconfigVM_Task"),
        reconfigures + 1,
        "both disks in one ReconfigVM_Task"
    );
    assert_eq!(sim.calls("PowerOffVM_Task"), 0);

    // vSphere fails the next three reconfigures: the change says so with vSphere's
    // message (UpToDate=False ChangeFailed), the VM runs on as it was, and the change
    // is tried again until it is applied.
    // Three failures: the condition stands through backoffs of 1, 2 and 4 s, long
    // enough for this poll to see it on a loaded machine (with two, a run under `make
    // test` once missed the 3 s window).
    sim.fail_task("ReconfigVM_Task", "the disk is locked by a backup", 3);
    shape.disk = 22;
    apply(&ns.client, &ns.name, &machine(&sim, &shape))
        .await
        .unwrap();
    let m = wait_for(&machines, "m", WAIT, |m: &VSphereMachine| {
        is(m, "UpToDate", "False", "ChangeFailed")
    })
    .await;
    let message = &condition(&m, "UpToDate").unwrap().message;
    assert!(
        message.contains("ReconfigVM_Task failed") && message.contains("locked by a backup"),
        "{message}"
    );
    assert!(
        m.is_ready(),
        "a failed change keeps it Ready: it runs as it was"
    );
    let m = wait_for(&machines, "m", WAIT, |m: &VSphereMachine| {
        is(m, "UpToDate", "True", "UpToDate")
            && running(m).is_some_and(|r| r.os_disk_gib == Some(22))
    })
    .await;
    assert!(m.is_ready());
    assert_eq!(disks_kb(&sim.vm("m").unwrap()), [22 * GIB_KB, 15 * GIB_KB]);
    assert_eq!(
        sim.calls("ReconfigVM_Task"),
        reconfigures + 5,
        "three failed tries, then the one that took"
    );
    let reconfigures = reconfigures + 4;

    // CPUs, cores and memory: no hot-add, so they wait for a power-off, named; the VM
    // runs on unchanged and nothing is sent to vSphere.
    shape.cpus = 4;
    shape.cores = 2;
    shape.memory = 2048;
    apply(&ns.client, &ns.name, &machine(&sim, &shape))
        .await
        .unwrap();
    let m = wait_for(&machines, "m", WAIT, |m: &VSphereMachine| {
        is(m, "RestartRequired", "True", "RestartRequired")
    })
    .await;
    let message = &condition(&m, "RestartRequired").unwrap().message;
    for text in [
        "cpus 2 → 4 waits for a power-off",
        "coresPerSocket 1 → 2 waits for a power-off",
        "memoryMiB 1024 → 2048 waits for a power-off",
    ] {
        assert!(message.contains(text), "{message}");
    }
    assert!(is(&m, "UpToDate", "False", "RestartRequired"));
    assert!(m.is_ready(), "a waiting change keeps it Ready");
    let pending: Vec<(MachineField, ChangeMode)> = m
        .status
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .unwrap()
        .pending
        .iter()
        .map(|p| (p.field, p.waits_for))
        .collect();
    assert_eq!(
        pending,
        [
            (MachineField::Cpus, ChangeMode::PowerOff),
            (MachineField::CoresPerSocket, ChangeMode::PowerOff),
            (MachineField::MemoryMib, ChangeMode::PowerOff),
        ]
    );
    // Two resyncs later: still nothing sent.
    tokio::time::sleep(Duration::from_secs(11)).await;
    let vm = sim.vm("m").unwrap();
    assert_eq!(
        (vm["cpus"].as_i64(), vm["memoryMB"].as_i64()),
        (Some(2), Some(1024))
    );
    assert_eq!(sim.calls("ReconfigVM_Task"), reconfigures + 1);

    // The owner powers it off: the three fields go in one reconfigure while off.
    shape.power = "PoweredOff";
    apply(&ns.client, &ns.name, &machine(&sim, &shape))
        .await
        .unwrap();
    wait_for(&machines, "m", WAIT, |m: &VSphereMachine| {
        m.is_ready()
            && is(m, "UpToDate", "True", "UpToDate")
            && running(m).is_some_and(|r| r.cpus == 4)
    })
    .await;
    let vm = sim.vm("m").unwrap();
    assert_eq!(vm["power"], "poweredOff");
    assert_eq!(
        (vm["cpus"].as_i64(), vm["memoryMB"].as_i64()),
        (Some(4), Some(2048))
    );
    assert_eq!(
        sim.calls("ReconfigVM_Task"),
        reconfigures + 2,
        "cpus, cores and memory in one ReconfigVM_Task"
    );
    // Cores per socket, which the harness does not list: read from vCenter directly.
    let reader = VSphereFactory::new()
        .connect_vsphere(&connection(&sim))
        .unwrap();
    let moref = MoRef::new("VirtualMachine", vm["moref"].as_str().unwrap());
    let cores = reader
        .client()
        .properties(&moref, &["config.hardware.numCoresPerSocket"])
        .await
        .unwrap()
        .and_then(|o| {
            o.text("config.hardware.numCoresPerSocket")
                .map(str::to_owned)
        });
    assert_eq!(cores.as_deref(), Some("2"));

    // And on: it runs with what was asked, nothing waits.
    shape.power = "PoweredOn";
    apply(&ns.client, &ns.name, &machine(&sim, &shape))
        .await
        .unwrap();
    let m = wait_for(&machines, "m", WAIT, |m: &VSphereMachine| {
        m.is_ready()
            && is(m, "UpToDate", "True", "UpToDate")
            && is(m, "RestartRequired", "False", "NoRestartPending")
            && m.status.as_ref().and_then(|s| s.power_state) == Some(PowerState::PoweredOn)
    })
    .await;
    let r = running(&m).unwrap();
    assert_eq!(
        (r.cpus, r.cores_per_socket, r.memory_mib),
        (4, Some(2), 2048)
    );
    assert_eq!(sim.vm("m").unwrap()["power"], "poweredOn");
    let reconfigures = sim.calls("ReconfigVM_Task");

    // Hostile: another firmware and a second network device, on a made VM. Refused by
    // name; the VM runs on as it was, the same VM.
    shape.firmware = Some("efi");
    shape.networks = 2;
    apply(&ns.client, &ns.name, &machine(&sim, &shape))
        .await
        .unwrap();
    let m = wait_for(&machines, "m", WAIT, |m: &VSphereMachine| {
        is(m, "UpToDate", "False", "ChangeRefused")
    })
    .await;
    let message = &condition(&m, "UpToDate").unwrap().message;
    for text in [
        "networks 1 → 2 cannot be applied to this machine",
        "firmware bios → efi cannot be applied to this machine",
    ] {
        assert!(message.contains(text), "{message}");
    }
    assert!(m.is_ready(), "refused, and it runs on");
    assert_eq!(m.provider_id(), Some(provider_id.as_str()), "the same VM");
    tokio::time::sleep(Duration::from_secs(6)).await;
    let vm = sim.vm("m").unwrap();
    assert_eq!(vm["firmware"], "bios");
    assert_eq!(vm["nics"].as_array().map(Vec::len), Some(1));
    assert_eq!(vm["power"], "poweredOn");
    assert_eq!(
        (vm["cpus"].as_i64(), vm["memoryMB"].as_i64()),
        (Some(4), Some(2048))
    );
    assert_eq!(disks_kb(&vm), [22 * GIB_KB, 15 * GIB_KB]);
    assert_eq!(
        sim.calls("ReconfigVM_Task"),
        reconfigures,
        "nothing sent for a refused change"
    );
    let clones = sim
        .vms()
        .into_iter()
        .filter(|v| v["template"] != true && v["name"] == "m")
        .count();
    assert_eq!(clones, 1, "never a second VM");
}

/// A VirtualMachine on vSphere moved to a larger class: resized in place, the same VM;
/// it says what waits for the power-off (mirrored from its VSphereMachine), and its
/// owner's power cycle applies it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_virtual_machine_moved_to_a_larger_class_is_resized_by_a_power_cycle() {
    let Some(sim) = Vcsim::start() else { return };
    let (ns, _operator) = world("vs-class", &sim).await;
    let class = |name: &str, cpus: u32, memory: u64| {
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": name},
               "spec": {"cpus": cpus, "memoryMiB": memory, "disk": {"sizeGiB": 16, "storageClass": "fast"}}})
    };
    let small = format!("{}-small", ns.name);
    let large = format!("{}-large", ns.name);
    let image = format!("{}-ubuntu", ns.name);
    for object in [
        class(&small, 2, 1024),
        class(&large, 4, 2048),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": image},
               "spec": {"os": {"family": "linux", "distribution": "ubuntu", "version": "24.04"},
                        "sources": {"vsphere": {"template": sim.ready.template}}}}),
    ] {
        apply(&ns.client, &ns.name, &object).await.unwrap();
    }
    let vm = |class: &str, power: &str| {
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": "web"},
               "spec": {"classRef": {"name": class}, "imageRef": {"name": image},
                        "networks": [{"name": "eth0", "networkClass": "lan"}],
                        "powerState": power}})
    };
    let vms: Api<VirtualMachine> = ns.api();
    let vm_condition = |v: &VirtualMachine, type_: &str| {
        v.status
            .as_ref()
            .and_then(|s| conditions::get(&s.conditions, type_))
            .cloned()
    };
    let vm_running = |v: &VirtualMachine| {
        v.status
            .as_ref()
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.running.clone())
    };
    let up_to_date = |v: &VirtualMachine, cpus: u32| {
        v.status.as_ref().is_some_and(|s| {
            conditions::is_true(&s.conditions, "Ready")
                && conditions::is_true(&s.conditions, "UpToDate")
        }) && vm_running(v).is_some_and(|r| r.cpus == cpus)
    };
    apply(&ns.client, &ns.name, &vm(&small, "PoweredOn"))
        .await
        .unwrap();
    let v = wait_for(&vms, "web", WAIT, |v: &VirtualMachine| up_to_date(v, 2)).await;
    let provider_id = v.status.as_ref().unwrap().provider_id.clone().unwrap();
    let reconfigures = sim.calls("ReconfigVM_Task");

    apply(&ns.client, &ns.name, &vm(&large, "PoweredOn"))
        .await
        .unwrap();
    let v = wait_for(&vms, "web", WAIT, |v: &VirtualMachine| {
        vm_condition(v, "RestartRequired").is_some_and(|c| c.status == "True")
    })
    .await;
    let message = vm_condition(&v, "RestartRequired").unwrap().message;
    assert!(
        message.contains("cpus 2 → 4 waits for a power-off")
            && message.contains("memoryMiB 1024 → 2048 waits for a power-off"),
        "{message}"
    );
    let on_vcsim = sim.vm("web").unwrap();
    assert_eq!(on_vcsim["cpus"].as_i64(), Some(2), "not while it runs");
    assert_eq!(sim.calls("ReconfigVM_Task"), reconfigures);

    apply(&ns.client, &ns.name, &vm(&large, "PoweredOff"))
        .await
        .unwrap();
    wait_for(&vms, "web", WAIT, |v: &VirtualMachine| {
        vm_condition(v, "UpToDate").is_some_and(|c| c.status == "True")
            && vm_running(v).is_some_and(|r| r.cpus == 4)
    })
    .await;
    apply(&ns.client, &ns.name, &vm(&large, "PoweredOn"))
        .await
        .unwrap();
    let v = wait_for(&vms, "web", WAIT, |v: &VirtualMachine| {
        up_to_date(v, 4)
            && vm_condition(v, "RestartRequired").is_some_and(|c| c.status == "False")
            && v.status.as_ref().and_then(|s| s.power_state) == Some(PowerState::PoweredOn)
    })
    .await;
    assert_eq!(
        v.status.as_ref().unwrap().provider_id.as_deref(),
        Some(provider_id.as_str()),
        "resized, not replaced"
    );
    let on_vcsim = sim.vm("web").unwrap();
    assert_eq!(
        (on_vcsim["cpus"].as_i64(), on_vcsim["memoryMB"].as_i64()),
        (Some(4), Some(2048))
    );
    assert_eq!(on_vcsim["power"], "poweredOn");
    assert_eq!(
        sim.calls("ReconfigVM_Task"),
        reconfigures + 1,
        "one reconfigure for both"
    );
    let clones = sim
        .vms()
        .into_iter()
        .filter(|v| v["template"] != true && v["name"] == "web")
        .count();
    assert_eq!(clones, 1);
}

/// `config.cpuHotAddEnabled` and `config.memoryHotAddEnabled` of the VM named `name`,
/// read from vcsim directly (the harness does not list them).
async fn hot_add(sim: &Vcsim, name: &str) -> (Option<String>, Option<String>) {
    let reader = VSphereFactory::new()
        .connect_vsphere(&connection(sim))
        .unwrap();
    let moref = MoRef::new(
        "VirtualMachine",
        sim.vm(name).unwrap()["moref"].as_str().unwrap(),
    );
    let o = reader
        .client()
        .properties(
            &moref,
            &["config.cpuHotAddEnabled", "config.memoryHotAddEnabled"],
        )
        .await
        .unwrap()
        .unwrap();
    let text = |path: &str| o.text(path).map(str::to_owned);
    (
        text("config.cpuHotAddEnabled"),
        text("config.memoryHotAddEnabled"),
    )
}

/// Hot-add headroom (issue 38, item 3): a VirtualMachine whose class asks `maxCPUs` /
/// `maxMemoryMiB` is made with CPU and memory hot-add (read back from vcsim), and moved
/// to a larger class with the same headroom it grows live: one `ReconfigVM_Task`, no
/// power cycle, Ready throughout, nothing waiting. A shrink still waits for a
/// power-off, and nothing is sent for it. vcsim takes a reconfigure of `numCPUs` and
/// `memoryMB` in any power state: that vSphere refuses it without hot-add is what the
/// backend's own refusal and the unit tests show, not this test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_virtual_machine_with_hot_add_headroom_grows_live_without_a_power_cycle() {
    let Some(sim) = Vcsim::start() else { return };
    let (ns, _operator) = world("vs-hotadd", &sim).await;
    let class = |name: &str, cpus: u32, memory: u64| {
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": name},
               "spec": {"cpus": cpus, "maxCPUs": 8, "memoryMiB": memory, "maxMemoryMiB": 4096,
                        "disk": {"sizeGiB": 16, "storageClass": "fast"}}})
    };
    let small = format!("{}-small", ns.name);
    let large = format!("{}-large", ns.name);
    let image = format!("{}-ubuntu", ns.name);
    for object in [
        class(&small, 2, 1024),
        class(&large, 4, 2048),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": image},
               "spec": {"os": {"family": "linux", "distribution": "ubuntu", "version": "24.04"},
                        "sources": {"vsphere": {"template": sim.ready.template}}}}),
    ] {
        apply(&ns.client, &ns.name, &object).await.unwrap();
    }
    let vm = |class: &str| {
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": "web"},
               "spec": {"classRef": {"name": class}, "imageRef": {"name": image},
                        "networks": [{"name": "eth0", "networkClass": "lan"}]}})
    };
    let vms: Api<VirtualMachine> = ns.api();
    let machines: Api<VSphereMachine> = ns.api();
    let vm_condition = |v: &VirtualMachine, type_: &str| {
        v.status
            .as_ref()
            .and_then(|s| conditions::get(&s.conditions, type_))
            .cloned()
    };
    let settled = |v: &VirtualMachine, cpus: u32, memory: u64| {
        v.status.as_ref().is_some_and(|s| {
            conditions::is_true(&s.conditions, "Ready")
                && conditions::is_true(&s.conditions, "UpToDate")
                && s.resources
                    .as_ref()
                    .and_then(|r| r.running.as_ref())
                    .is_some_and(|r| (r.cpus, r.memory_mib) == (cpus, memory))
        })
    };
    apply(&ns.client, &ns.name, &vm(&small)).await.unwrap();
    let v = wait_for(&vms, "web", WAIT, |v: &VirtualMachine| settled(v, 2, 1024)).await;
    let provider_id = v.status.as_ref().unwrap().provider_id.clone().unwrap();
    let m = machines.get("web").await.unwrap();
    assert_eq!(
        (m.spec.max_cpus, m.spec.max_memory_mib),
        (Some(8), Some(4096)),
        "the class's headroom, copied"
    );
    assert_eq!(
        hot_add(&sim, "web").await,
        (Some("true".into()), Some("true".into())),
        "made with CPU and memory hot-add"
    );
    let r = running(&m).unwrap();
    assert_eq!(
        (r.max_cpus, r.max_memory_mib),
        (None, None),
        "with hot-add, no ceiling of its own"
    );
    let (reconfigures, power_offs, shutdowns) = (
        sim.calls("ReconfigVM_Task"),
        sim.calls("PowerOffVM_Task"),
        sim.calls("ShutdownGuest"),
    );

    // A larger class: added live.
    apply(&ns.client, &ns.name, &vm(&large)).await.unwrap();
    let v = wait_for(&vms, "web", WAIT, |v: &VirtualMachine| settled(v, 4, 2048)).await;
    assert_eq!(
        vm_condition(&v, "RestartRequired").map(|c| c.status),
        Some("False".into())
    );
    let on_vcsim = sim.vm("web").unwrap();
    assert_eq!(
        (on_vcsim["cpus"].as_i64(), on_vcsim["memoryMB"].as_i64()),
        (Some(4), Some(2048))
    );
    assert_eq!(on_vcsim["power"], "poweredOn");
    let sent = sim.calls("ReconfigVM_Task") - reconfigures;
    eprintln!("ReconfigVM_Task calls for a live 2 → 4 CPUs, 1024 → 2048 MiB: {sent}");
    assert_eq!(sent, 1, "CPUs and memory in one ReconfigVM_Task");
    assert_eq!(
        (sim.calls("PowerOffVM_Task"), sim.calls("ShutdownGuest")),
        (power_offs, shutdowns),
        "no power cycle"
    );
    assert_eq!(
        v.status.as_ref().unwrap().provider_id.as_deref(),
        Some(provider_id.as_str()),
        "the same VM"
    );

    // Back to the small class: vSphere has no hot-remove, so it waits for a power-off,
    // and nothing is sent.
    apply(&ns.client, &ns.name, &vm(&small)).await.unwrap();
    let v = wait_for(&vms, "web", WAIT, |v: &VirtualMachine| {
        vm_condition(v, "RestartRequired").is_some_and(|c| c.status == "True")
    })
    .await;
    let message = vm_condition(&v, "RestartRequired").unwrap().message;
    assert!(
        message.contains("cpus 4 → 2 waits for a power-off")
            && message.contains("memoryMiB 2048 → 1024 waits for a power-off"),
        "{message}"
    );
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(sim.calls("ReconfigVM_Task"), reconfigures + 1);
    assert_eq!(sim.vm("web").unwrap()["cpus"].as_i64(), Some(4));
}

fn request(sim: &Vcsim, uid: &str, networks: usize) -> MachineRequest {
    let network: Vec<Value> = (0..networks)
        .map(|_| json!({"networkName": "VM Network"}))
        .collect();
    let spec = serde_json::from_value(json!({
        "template": sim.ready.template, "numCPUs": 2, "memoryMiB": 2048, "diskGiB": 12,
        "network": network,
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
        bootstrap: None,
        instance_id: None,
        disks_imported: false,
    }
}

/// The backend alone: what the VM runs with comes with the one property read each
/// `ensure` already makes (no round trip of its own), and more networks than the
/// template has network devices are refused before anything is cloned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resources_cost_no_extra_call_and_too_many_networks_are_refused_before_the_clone() {
    let Some(sim) = Vcsim::start() else { return };
    let backend = VSphereFactory::new()
        .connect_vsphere(&connection(&sim))
        .unwrap();

    // The template has one network device; two asked: refused, nothing cloned.
    let req = request(&sim, "0000000a-1111-4000-8000-000000000000", 2);
    let error = backend.ensure(&req).await.unwrap_err();
    assert_eq!(error.reason, "TooManyNetworkDevices", "{error}");
    assert!(!error.is_transient());
    assert!(
        error
            .message
            .contains("asks for 2 network devices and the template has 1"),
        "{error}"
    );
    assert_eq!(sim.calls("CloneVM_Task"), 0, "refused before the clone");
    assert!(sim.vm(&req.identity.name).is_none());

    // One network: made, and each look at it is one property read with its resources.
    let req = request(&sim, "0000000b-1111-4000-8000-000000000000", 1);
    let mut settled = None;
    for _ in 0..400 {
        match backend.ensure(&req).await {
            Ok(o) if o.settled_at(req.spec.power_state()) => {
                settled = Some(o);
                break;
            }
            Ok(_) => {}
            Err(e) if e.is_transient() => {}
            Err(e) => panic!("{e}"),
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let settled = settled.expect("the machine settles");
    assert_eq!(sim.calls("CloneVM_Task"), 1);
    let r = settled.resources.expect("resources read back");
    assert_eq!(
        (r.cpus, r.memory_mib, r.os_disk_gib, r.networks),
        (2, 2048, Some(12), 1)
    );
    let reads = sim.calls("RetrievePropertiesEx");
    let o = backend.ensure(&req).await.unwrap();
    let per_ensure = sim.calls("RetrievePropertiesEx") - reads;
    eprintln!("RetrievePropertiesEx calls per ensure of a running VM: {per_ensure}");
    assert_eq!(per_ensure, 1, "resources come with the one read");
    assert!(o.resources.is_some());
    let reads = sim.calls("RetrievePropertiesEx");
    let o = backend.observe(&req.identity).await.unwrap().unwrap();
    assert_eq!(sim.calls("RetrievePropertiesEx") - reads, 1);
    assert_eq!(o.resources.map(|r| r.cpus), Some(2));

    // apply_changes: the OS disk grows live with one ReconfigVM_Task, returned
    // pending; the next ensure reads it back. Asked again, nothing more is sent.
    let mut grown = req.clone();
    if let MachineSpec::VSphere(s) = &mut grown.spec {
        s.disk_gib = Some(14);
    }
    let reconfigures = sim.calls("ReconfigVM_Task");
    let o = backend
        .apply_changes(&grown, &[MachineField::OsDiskSize])
        .await
        .unwrap();
    assert!(o.pending.is_some(), "the task is returned, not waited for");
    assert_eq!(sim.calls("ReconfigVM_Task"), reconfigures + 1);
    let mut read_back = None;
    for _ in 0..200 {
        let o = backend.ensure(&grown).await.unwrap();
        if o.pending.is_none() {
            read_back = o.resources;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(read_back.and_then(|r| r.os_disk_gib), Some(14));
    assert_eq!(
        sim.vm(&req.identity.name).unwrap()["diskKB"].as_u64(),
        Some(14 * GIB_KB)
    );
    let o = backend
        .apply_changes(&grown, &[MachineField::OsDiskSize])
        .await
        .unwrap();
    assert!(o.pending.is_none());
    assert_eq!(sim.calls("ReconfigVM_Task"), reconfigures + 1, "idempotent");
    // CPUs while it runs: refused by the backend too, naming the field.
    let mut more = req.clone();
    if let MachineSpec::VSphere(s) = &mut more.spec {
        s.num_cpus = 4;
    }
    let error = backend
        .apply_changes(&more, &[MachineField::Cpus])
        .await
        .unwrap_err();
    assert_eq!(error.reason, "PowerOffRequired");
    assert!(error.message.contains("cpus"), "{error}");
    assert_eq!(sim.calls("ReconfigVM_Task"), reconfigures + 1);
}
