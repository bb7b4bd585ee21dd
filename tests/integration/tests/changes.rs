//! A machine that runs changes honestly (issue 38), on the simulator, whose change
//! table uses every mode (`banlieue_backend_sim::change_table`): a live change is
//! applied and read back; a change that waits says so (`RestartRequired=True`, naming
//! the field and what it waits for) and is applied by a power cycle; a change that can
//! never be applied says so (`UpToDate=False ChangeRefused`) and loses nothing. What the
//! machine runs with is read from the simulator itself, not from the status.

use std::time::Duration;

use banlieue_integration_tests::apply;
use banlieue_integration_tests::fixtures::sim_provider;
use banlieue_integration_tests::operator::{Operator, wait_for};
use banlieue_sdk::api::VirtualMachine;
use banlieue_sdk::api::infra::libvirt::LibvirtMachine;
use banlieue_sdk::api::resources::{ChangeMode, MachineField};
use banlieue_sdk::conditions;
use banlieue_sdk::contract::InfraMachineRead;
use banlieue_testenv::TestNamespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;
use kube::api::Api;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);

fn machine(
    name: &str,
    cpus: u32,
    memory: u64,
    firmware: &str,
    networks: usize,
    power: &str,
) -> Value {
    let network: Vec<Value> = (0..networks)
        .map(|_| json!({"network": "default"}))
        .collect();
    json!({
        "apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "LibvirtMachine",
        "metadata": {"name": name},
        "spec": {"providerRef": {"name": "sim"}, "image": {"path": "/var/lib/images/debian.qcow2"},
                 "storagePool": "default", "cpus": cpus, "memoryMiB": memory, "firmware": firmware,
                 "network": network, "powerState": power}
    })
}

fn condition<'a>(m: &'a LibvirtMachine, type_: &str) -> Option<&'a Condition> {
    m.status
        .as_ref()
        .and_then(|s| conditions::get(&s.conditions, type_))
}

fn is(m: &LibvirtMachine, type_: &str, status: &str, reason: &str) -> bool {
    condition(m, type_).is_some_and(|c| {
        c.status == status && c.reason == reason && c.observed_generation == m.metadata.generation
    })
}

async fn world(prefix: &str) -> (TestNamespace, Operator, String) {
    let ns = banlieue_testenv::namespace(prefix).await;
    let endpoint = format!("sim://{}", ns.name);
    apply(
        &ns.client,
        &ns.name,
        &sim_provider("sim", &endpoint, json!({"latency": "100ms"})),
    )
    .await
    .expect("Provider");
    let operator = Operator::start_with(ns.client.clone(), &ns.name, Duration::from_secs(5));
    (ns, operator, endpoint)
}

/// CPUs and memory grow live; memory shrinks only while off: the machine keeps
/// running, says what waits, and a power cycle applies it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_machine_grows_live_and_shrinks_after_a_power_cycle() {
    let (ns, operator, endpoint) = world("change-live").await;
    let machines: Api<LibvirtMachine> = ns.api();
    apply(
        &ns.client,
        &ns.name,
        &machine("m", 1, 512, "efi", 1, "PoweredOn"),
    )
    .await
    .unwrap();
    let m = wait_for(&machines, "m", WAIT, |m: &LibvirtMachine| {
        m.is_ready() && is(m, "UpToDate", "True", "UpToDate")
    })
    .await;
    let uid = m.uid().unwrap();
    let sim = |uid: &str| {
        operator
            .sim
            .machine(&endpoint, uid)
            .expect("the sim machine")
    };
    assert_eq!((sim(&uid).cpus, sim(&uid).memory_mib), (1, 512));
    let running = |m: &LibvirtMachine| {
        m.status
            .as_ref()
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.running.clone())
    };
    assert_eq!(running(&m).map(|r| (r.cpus, r.memory_mib)), Some((1, 512)));
    assert!(is(&m, "RestartRequired", "False", "NoRestartPending"));

    // Grown live: applied, read back, nothing waits, never powered off.
    apply(
        &ns.client,
        &ns.name,
        &machine("m", 4, 2048, "efi", 1, "PoweredOn"),
    )
    .await
    .unwrap();
    let m = wait_for(&machines, "m", WAIT, |m: &LibvirtMachine| {
        is(m, "UpToDate", "True", "UpToDate")
            && running(m).is_some_and(|r| (r.cpus, r.memory_mib) == (4, 2048))
    })
    .await;
    assert_eq!((sim(&uid).cpus, sim(&uid).memory_mib), (4, 2048));
    assert!(m.is_ready(), "a live change keeps it Ready");
    assert_eq!(
        sim(&uid).power_state,
        Some(banlieue_sdk::api::common::PowerState::PoweredOn)
    );
    assert!(operator.sim.stats(&endpoint).apply_changes >= 1);

    // Shrunk: waits for a power-off, named; the machine runs on, unchanged.
    apply(
        &ns.client,
        &ns.name,
        &machine("m", 4, 1024, "efi", 1, "PoweredOn"),
    )
    .await
    .unwrap();
    let m = wait_for(&machines, "m", WAIT, |m: &LibvirtMachine| {
        is(m, "RestartRequired", "True", "RestartRequired")
    })
    .await;
    let message = &condition(&m, "RestartRequired").unwrap().message;
    assert!(
        message.contains("memoryMiB 2048 → 1024 waits for a power-off"),
        "{message}"
    );
    assert!(is(&m, "UpToDate", "False", "RestartRequired"));
    assert!(
        m.is_ready(),
        "a waiting change keeps it Ready: it runs as it was"
    );
    let pending = &m
        .status
        .as_ref()
        .unwrap()
        .resources
        .as_ref()
        .unwrap()
        .pending;
    assert_eq!(pending.len(), 1);
    assert_eq!(
        (pending[0].field, pending[0].waits_for),
        (MachineField::MemoryMib, ChangeMode::PowerOff)
    );
    assert_eq!(sim(&uid).memory_mib, 2048, "not applied while it runs");

    // The VM's owner power-cycles it: applied while off, then it runs with it.
    apply(
        &ns.client,
        &ns.name,
        &machine("m", 4, 1024, "efi", 1, "PoweredOff"),
    )
    .await
    .unwrap();
    wait_for(&machines, "m", WAIT, |m: &LibvirtMachine| {
        m.is_ready() && is(m, "UpToDate", "True", "UpToDate")
    })
    .await;
    assert_eq!(sim(&uid).memory_mib, 1024);
    apply(
        &ns.client,
        &ns.name,
        &machine("m", 4, 1024, "efi", 1, "PoweredOn"),
    )
    .await
    .unwrap();
    let m = wait_for(&machines, "m", WAIT, |m: &LibvirtMachine| {
        m.is_ready()
            && is(m, "UpToDate", "True", "UpToDate")
            && is(m, "RestartRequired", "False", "NoRestartPending")
    })
    .await;
    assert_eq!(running(&m).map(|r| r.memory_mib), Some(1024));
    assert_eq!(
        operator.sim.machines(&endpoint).len(),
        1,
        "never a second machine"
    );
}

/// A `NextBoot` change is written at once and taken at the next boot; a `Never`
/// change is refused, named, and nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn next_boot_changes_wait_for_the_boot_and_never_changes_are_refused() {
    let (ns, operator, endpoint) = world("change-boot").await;
    let machines: Api<LibvirtMachine> = ns.api();
    apply(
        &ns.client,
        &ns.name,
        &machine("m", 1, 512, "efi", 1, "PoweredOn"),
    )
    .await
    .unwrap();
    let m = wait_for(&machines, "m", WAIT, |m: &LibvirtMachine| {
        m.is_ready() && is(m, "UpToDate", "True", "UpToDate")
    })
    .await;
    let uid = m.uid().unwrap();
    let provider_id = m.provider_id().unwrap().to_owned();

    // A second network device: written for the next boot (the sim's table), pending.
    apply(
        &ns.client,
        &ns.name,
        &machine("m", 1, 512, "efi", 2, "PoweredOn"),
    )
    .await
    .unwrap();
    let m = wait_for(&machines, "m", WAIT, |m: &LibvirtMachine| {
        is(m, "RestartRequired", "True", "RestartRequired")
    })
    .await;
    let message = &condition(&m, "RestartRequired").unwrap().message;
    assert!(
        message.contains("networks 1 → 2 waits for the next boot"),
        "{message}"
    );
    let calls = operator.sim.stats(&endpoint).apply_changes;
    assert!(calls >= 1, "written for the next boot");
    let on_sim = operator.sim.machine(&endpoint, &uid).unwrap();
    assert_eq!(
        on_sim.resources.networks, 1,
        "the running guest has not taken it"
    );
    assert_eq!(
        on_sim.next_boot.map(|n| n.networks),
        Some(2),
        "its next boot has"
    );
    // Written once: the resyncs (every 5 s) do not write it again.
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert_eq!(
        operator.sim.stats(&endpoint).apply_changes,
        calls,
        "written once"
    );

    // Taken back before any boot: the next boot's configuration is put back too.
    apply(
        &ns.client,
        &ns.name,
        &machine("m", 1, 512, "efi", 1, "PoweredOn"),
    )
    .await
    .unwrap();
    wait_for(&machines, "m", WAIT, |m: &LibvirtMachine| {
        is(m, "UpToDate", "True", "UpToDate")
            && is(m, "RestartRequired", "False", "NoRestartPending")
    })
    .await;
    let deadline = std::time::Instant::now() + WAIT;
    while operator
        .sim
        .machine(&endpoint, &uid)
        .unwrap()
        .next_boot
        .is_some()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the next boot still takes the change taken back"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    apply(
        &ns.client,
        &ns.name,
        &machine("m", 1, 512, "efi", 2, "PoweredOn"),
    )
    .await
    .unwrap();
    wait_for(&machines, "m", WAIT, |m: &LibvirtMachine| {
        is(m, "RestartRequired", "True", "RestartRequired")
    })
    .await;

    // The firmware: never changed on a made machine.
    apply(
        &ns.client,
        &ns.name,
        &machine("m", 1, 512, "bios", 2, "PoweredOn"),
    )
    .await
    .unwrap();
    let m = wait_for(&machines, "m", WAIT, |m: &LibvirtMachine| {
        is(m, "UpToDate", "False", "ChangeRefused")
    })
    .await;
    let message = &condition(&m, "UpToDate").unwrap().message;
    assert!(
        message.contains("firmware efi → bios cannot be applied to this machine"),
        "{message}"
    );
    assert!(m.is_ready(), "refused, and it runs on");
    assert_eq!(
        m.provider_id(),
        Some(provider_id.as_str()),
        "the same machine"
    );
    assert_eq!(operator.sim.machines(&endpoint).len(), 1);

    // A power cycle takes the network change; the firmware stays refused.
    apply(
        &ns.client,
        &ns.name,
        &machine("m", 1, 512, "bios", 2, "PoweredOff"),
    )
    .await
    .unwrap();
    wait_for(&machines, "m", WAIT, |m: &LibvirtMachine| m.is_ready()).await;
    apply(
        &ns.client,
        &ns.name,
        &machine("m", 1, 512, "bios", 2, "PoweredOn"),
    )
    .await
    .unwrap();
    let m = wait_for(&machines, "m", WAIT, |m: &LibvirtMachine| {
        m.is_ready()
            && is(m, "RestartRequired", "False", "NoRestartPending")
            && m.status
                .as_ref()
                .and_then(|s| s.resources.as_ref())
                .and_then(|r| r.running.as_ref())
                .is_some_and(|r| r.networks == 2)
    })
    .await;
    assert!(is(&m, "UpToDate", "False", "ChangeRefused"));
    let on_sim = operator.sim.machine(&endpoint, &uid).unwrap();
    assert_eq!(on_sim.provider_id, provider_id);
    assert_eq!(on_sim.resources.networks, 2, "taken at the boot");
    assert_eq!(
        on_sim.resources.firmware,
        Some(banlieue_sdk::api::common::Firmware::Efi),
        "never changed"
    );

    // Back to what it was made with: up to date again.
    apply(
        &ns.client,
        &ns.name,
        &machine("m", 1, 512, "efi", 2, "PoweredOn"),
    )
    .await
    .unwrap();
    wait_for(&machines, "m", WAIT, |m: &LibvirtMachine| {
        is(m, "UpToDate", "True", "UpToDate")
    })
    .await;
}

/// With `changePolicy: Restart`, a change that waits for a power-off is applied by
/// banlieue itself: it powers the machine off, applies, powers it on, and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_policy_power_cycles_the_machine_to_apply_what_waits() {
    let (ns, operator, endpoint) = world("change-restart").await;
    let machines: Api<LibvirtMachine> = ns.api();
    let restarting = |memory: u64| {
        banlieue_integration_tests::with(
            machine("m", 2, memory, "efi", 1, "PoweredOn"),
            "/spec/changePolicy",
            json!("Restart"),
        )
    };
    apply(&ns.client, &ns.name, &restarting(2048))
        .await
        .unwrap();
    let m = wait_for(&machines, "m", WAIT, |m: &LibvirtMachine| {
        m.is_ready() && is(m, "UpToDate", "True", "UpToDate")
    })
    .await;
    let uid = m.uid().unwrap();

    apply(&ns.client, &ns.name, &restarting(1024))
        .await
        .unwrap();
    let m = wait_for(&machines, "m", WAIT, |m: &LibvirtMachine| {
        m.is_ready()
            && is(m, "UpToDate", "True", "UpToDate")
            && is(m, "RestartRequired", "False", "NoRestartPending")
    })
    .await;
    let on_sim = operator.sim.machine(&endpoint, &uid).unwrap();
    assert_eq!(on_sim.memory_mib, 1024, "applied");
    assert_eq!(
        on_sim.power_state,
        Some(banlieue_sdk::api::common::PowerState::PoweredOn),
        "and running again"
    );
    assert_eq!(
        m.status.as_ref().unwrap().power_state,
        Some(banlieue_sdk::api::common::PowerState::PoweredOn)
    );
    let calls: Vec<_> = operator.sim.machines(&endpoint);
    assert_eq!(calls.len(), 1, "the same machine");
    let events: Api<k8s_openapi::api::events::v1::Event> = ns.api();
    let said = events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("RestartingToApplyChanges"))
        .filter_map(|e| e.note)
        .collect::<Vec<_>>();
    assert!(
        said.iter().any(|n| n.contains("memoryMiB 2048 → 1024")),
        "an Event says why it was restarted: {said:?}"
    );
}

/// A change the backend fails to apply (here: every `apply_changes` of the simulator
/// fails, as an unreachable backend would) is reported, retried with backoff, and
/// loses nothing; once the backend answers again it is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_the_backend_fails_to_apply_is_reported_and_retried() {
    let (ns, operator, endpoint) = world("change-fails").await;
    let machines: Api<LibvirtMachine> = ns.api();
    apply(
        &ns.client,
        &ns.name,
        &machine("m", 1, 512, "efi", 1, "PoweredOn"),
    )
    .await
    .unwrap();
    let m = wait_for(&machines, "m", WAIT, |m: &LibvirtMachine| {
        m.is_ready() && is(m, "UpToDate", "True", "UpToDate")
    })
    .await;
    let uid = m.uid().unwrap();
    let failing = json!({"latency": "100ms", "failureRate": "1", "failureCalls": "applyChanges"});
    apply(
        &ns.client,
        &ns.name,
        &sim_provider("sim", &endpoint, failing),
    )
    .await
    .unwrap();
    // The Provider's new settings reach the backend before the change is made.
    tokio::time::sleep(Duration::from_secs(3)).await;
    apply(
        &ns.client,
        &ns.name,
        &machine("m", 2, 512, "efi", 1, "PoweredOn"),
    )
    .await
    .unwrap();
    let m = wait_for(&machines, "m", WAIT, |m: &LibvirtMachine| {
        is(m, "UpToDate", "False", "ChangeFailed")
    })
    .await;
    let message = &condition(&m, "UpToDate").unwrap().message;
    assert!(message.starts_with("SimulatedFault"), "{message}");
    assert!(m.is_ready(), "it runs on as it was");
    let on_sim = operator.sim.machine(&endpoint, &uid).unwrap();
    assert_eq!(on_sim.cpus, 1, "nothing applied");
    assert_eq!(
        operator.sim.machines(&endpoint).len(),
        1,
        "nothing lost or doubled"
    );
    // Retried with backoff, not in a hot loop: a handful of attempts in 10 s.
    let before = operator.sim.stats(&endpoint).apply_changes;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let attempts = operator.sim.stats(&endpoint).apply_changes - before;
    assert!((1..=12).contains(&attempts), "{attempts} attempts in 10 s");

    apply(
        &ns.client,
        &ns.name,
        &sim_provider("sim", &endpoint, json!({"latency": "100ms"})),
    )
    .await
    .unwrap();
    wait_for(&machines, "m", WAIT, |m: &LibvirtMachine| {
        is(m, "UpToDate", "True", "UpToDate")
    })
    .await;
    assert_eq!(operator.sim.machine(&endpoint, &uid).unwrap().cpus, 2);
}

/// A VirtualMachine whose class changes is resized in place (the same machine), and
/// mirrors what its infra machine says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_virtual_machine_resized_by_its_class_mirrors_its_machine() {
    let (ns, operator, endpoint) = world("change-vm").await;
    let class = |name: &str, cpus: u32, memory: u64| {
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": name},
               "spec": {"cpus": cpus, "memoryMiB": memory, "disk": {"sizeGiB": 5, "storageClass": "fast"}}})
    };
    let small = format!("{}-small", ns.name);
    let large = format!("{}-large", ns.name);
    let image = format!("{}-debian", ns.name);
    for object in [
        class(&small, 1, 512),
        class(&large, 2, 1024),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": image},
               "spec": {"os": {"family": "linux", "distribution": "debian", "version": "13"}, "sources": {"sim": {"name": "debian"}}}}),
    ] {
        apply(&ns.client, &ns.name, &object).await.unwrap();
    }
    let vm = |class: &str| {
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": "web"},
               "spec": {"classRef": {"name": class}, "imageRef": {"name": image},
                        "networks": [{"name": "eth0", "networkClass": "lan"}],
                        "placement": {"providerRef": {"name": "sim"}}}})
    };
    let vms: Api<VirtualMachine> = ns.api();
    apply(&ns.client, &ns.name, &vm(&small)).await.unwrap();
    let up_to_date = |v: &VirtualMachine, cpus: u32| {
        v.status.as_ref().is_some_and(|s| {
            conditions::is_true(&s.conditions, "Ready")
                && conditions::is_true(&s.conditions, "UpToDate")
                && s.resources
                    .as_ref()
                    .and_then(|r| r.running.as_ref())
                    .is_some_and(|r| r.cpus == cpus)
        })
    };
    let v = wait_for(&vms, "web", WAIT, |v: &VirtualMachine| up_to_date(v, 1)).await;
    let provider_id = v.status.as_ref().unwrap().provider_id.clone().unwrap();

    apply(&ns.client, &ns.name, &vm(&large)).await.unwrap();
    let v = wait_for(&vms, "web", WAIT, |v: &VirtualMachine| up_to_date(v, 2)).await;
    let status = v.status.as_ref().unwrap();
    assert_eq!(
        status.provider_id.as_deref(),
        Some(provider_id.as_str()),
        "resized, not replaced"
    );
    let machines = operator.sim.machines(&endpoint);
    assert_eq!(machines.len(), 1);
    assert_eq!((machines[0].cpus, machines[0].memory_mib), (2, 1024));
    assert_eq!(
        status
            .resources
            .as_ref()
            .and_then(|r| r.desired.as_ref())
            .map(|d| d.memory_mib),
        Some(1024)
    );
}

/// A VMClass edited in place (issue 38, item 4): with the default `updatePolicy: Keep`
/// its VMs keep the hardware their machines were built with and say the class has
/// moved on (`ClassUpToDate=False ClassChanged`, naming each field); once the class
/// says `Apply`, the edit flows to the machine and the change machinery applies it
/// (live here); a VM pointed at another class always takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_class_edit_reaches_its_vms_only_when_the_class_says_so() {
    let (ns, operator, endpoint) = world("class-edit").await;
    let small = format!("{}-small", ns.name);
    let large = format!("{}-large", ns.name);
    let image = format!("{}-debian", ns.name);
    let class = |name: &str, cpus: u32, memory: u64, policy: Option<&str>| {
        let mut spec = json!({"cpus": cpus, "memoryMiB": memory,
                              "disk": {"sizeGiB": 5, "storageClass": "fast"}});
        if let Some(policy) = policy {
            spec["updatePolicy"] = policy.into();
        }
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": name},
               "spec": spec})
    };
    for object in [
        class(&small, 1, 512, None),
        class(&large, 4, 2048, None),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": image},
               "spec": {"os": {"family": "linux", "distribution": "debian", "version": "13"}, "sources": {"sim": {"name": "debian"}}}}),
    ] {
        apply(&ns.client, &ns.name, &object).await.unwrap();
    }
    let vm = |class: &str| {
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": "web"},
               "spec": {"classRef": {"name": class}, "imageRef": {"name": image},
                        "networks": [{"name": "eth0", "networkClass": "lan"}],
                        "placement": {"providerRef": {"name": "sim"}}}})
    };
    let vms: Api<VirtualMachine> = ns.api();
    let machines: Api<LibvirtMachine> = ns.api();
    let class_condition = |v: &VirtualMachine| {
        v.status
            .as_ref()
            .and_then(|s| conditions::get(&s.conditions, "ClassUpToDate"))
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
    };
    let built_from = |v: &VirtualMachine| {
        v.status
            .as_ref()
            .and_then(|s| s.class.clone())
            .map(|c| (c.name, c.generation))
    };
    let settled = |v: &VirtualMachine, cpus: u32| {
        v.status.as_ref().is_some_and(|s| {
            conditions::is_true(&s.conditions, "Ready")
                && conditions::is_true(&s.conditions, "UpToDate")
                && s.resources
                    .as_ref()
                    .and_then(|r| r.running.as_ref())
                    .is_some_and(|r| r.cpus == cpus)
        })
    };
    apply(&ns.client, &ns.name, &vm(&small)).await.unwrap();
    let v = wait_for(&vms, "web", WAIT, |v: &VirtualMachine| {
        settled(v, 1) && class_condition(v).is_some_and(|c| c.0 == "True")
    })
    .await;
    assert_eq!(built_from(&v), Some((small.clone(), Some(1))));
    let (_, reason, message) = class_condition(&v).unwrap();
    assert_eq!(reason, "Current", "{message}");
    let provider_id = v.status.as_ref().unwrap().provider_id.clone().unwrap();
    let m = machines.get("web").await.unwrap();
    assert!(
        m.annotations().contains_key("banlieue.io/class"),
        "the machine records what it was built from"
    );
    let machine_generation = m.metadata.generation;

    // Edited in place, Keep (the default): nothing is resized, the VM says so.
    apply(&ns.client, &ns.name, &class(&small, 2, 1024, None))
        .await
        .unwrap();
    let v = wait_for(&vms, "web", WAIT, |v: &VirtualMachine| {
        class_condition(v).is_some_and(|c| c.0 == "False")
    })
    .await;
    let (_, reason, message) = class_condition(&v).unwrap();
    assert_eq!(reason, "ClassChanged", "{message}");
    for text in [
        &format!("VMClass {small} changed since this VM's machine was built (generation 1 → 2"),
        "cpus 1 → 2",
        "memoryMiB 512 → 1024",
        "set updatePolicy: Apply on the class",
    ] {
        assert!(message.contains(text), "{message}");
    }
    assert_eq!(
        built_from(&v),
        Some((small.clone(), Some(1))),
        "still the generation it was built from"
    );
    assert!(
        settled(&v, 1),
        "Ready and up to date with what it was built with"
    );
    // Two resyncs later: the machine's spec and the simulator's VM are untouched.
    tokio::time::sleep(Duration::from_secs(11)).await;
    let m = machines.get("web").await.unwrap();
    assert_eq!((m.spec.cpus, m.spec.memory_mib), (1, 512));
    assert_eq!(
        m.metadata.generation, machine_generation,
        "its spec never written"
    );
    let on_sim = operator.sim.machines(&endpoint);
    assert_eq!(on_sim.len(), 1);
    assert_eq!((on_sim[0].cpus, on_sim[0].memory_mib), (1, 512));
    let v = vms.get("web").await.unwrap();
    assert_eq!(
        class_condition(&v).map(|c| c.1).as_deref(),
        Some("ClassChanged")
    );

    // The class says Apply: the edit flows, applied live (the simulator's table).
    apply(&ns.client, &ns.name, &class(&small, 2, 1024, Some("Apply")))
        .await
        .unwrap();
    let v = wait_for(&vms, "web", WAIT, |v: &VirtualMachine| {
        settled(v, 2) && class_condition(v).is_some_and(|c| c.0 == "True")
    })
    .await;
    assert_eq!(built_from(&v), Some((small.clone(), Some(3))));
    let m = machines.get("web").await.unwrap();
    assert_eq!((m.spec.cpus, m.spec.memory_mib), (2, 1024));
    let on_sim = operator.sim.machines(&endpoint);
    assert_eq!((on_sim[0].cpus, on_sim[0].memory_mib), (2, 1024));
    assert_eq!(
        v.status.as_ref().unwrap().provider_id.as_deref(),
        Some(provider_id.as_str()),
        "resized, not replaced"
    );

    // Another class (whose policy is Keep): a change of classRef always resizes.
    apply(&ns.client, &ns.name, &vm(&large)).await.unwrap();
    let v = wait_for(&vms, "web", WAIT, |v: &VirtualMachine| {
        settled(v, 4) && built_from(v).is_some_and(|(name, _)| name == large)
    })
    .await;
    assert_eq!(
        class_condition(&v).map(|c| (c.0, c.1)),
        Some(("True".into(), "Current".into()))
    );
    let on_sim = operator.sim.machines(&endpoint);
    assert_eq!(on_sim.len(), 1, "the same machine");
    assert_eq!((on_sim[0].cpus, on_sim[0].memory_mib), (4, 2048));
}
