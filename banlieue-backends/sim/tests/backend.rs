//! The simulator through the `Backend` trait, as the operator uses it.

mod support;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use banlieue_backend_sim::{SimFactory, SimMachineInfo};
use banlieue_sdk::api::common::{BootstrapFormat, PowerState};
use banlieue_sdk::api::infra::MachineAddressType;
use banlieue_sdk::api::vm_image::{ImageSources, SimImageSource};
use banlieue_sdk::backend::{
    Backend, BackendFactory, BootstrapData, Deletion, ErrorClass, ImageLookup, MachineObservation,
    SecretValue,
};
use support::*;
use tokio::time::advance;

use PowerState::{PoweredOff, PoweredOn, Suspended};

fn addresses(o: &MachineObservation) -> Vec<(MachineAddressType, String)> {
    o.addresses
        .iter()
        .map(|a| (a.type_, a.address.clone()))
        .collect()
}

fn pending_op(o: &MachineObservation) -> Option<&str> {
    o.pending.as_ref().map(|p| p.operation.as_str())
}

fn uids(machines: &[SimMachineInfo]) -> Vec<&str> {
    machines.iter().map(|m| m.identity.uid.as_str()).collect()
}

#[tokio::test]
async fn ensure_is_idempotent() {
    let sim = SimFactory::new();
    let backend = connect(&sim, "sim://idempotent", &[]);
    let first = backend.ensure(&on("a")).await.unwrap();
    let second = backend.ensure(&on("a")).await.unwrap();
    assert!(first.settled_at(PoweredOn), "{first:?}");
    assert_eq!(first, second);
    assert_eq!(uids(&sim.machines("sim://idempotent")), ["a"]);
    assert_eq!(sim.stats("sim://idempotent").machines_created, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_ensures_of_one_uid_make_one_machine() {
    let sim = SimFactory::new();
    let backend = connect(&sim, "sim://race", &[("latency", "10ms")]);
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let backend = backend.clone();
            tokio::spawn(async move { backend.ensure(&on("same")).await.unwrap() })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(sim.machines("sim://race").len(), 1);
    assert_eq!(sim.stats("sim://race").machines_created, 1);
}

#[tokio::test(start_paused = true)]
async fn latency_reports_pending_then_settles() {
    let sim = SimFactory::new();
    let backend = connect(&sim, "sim://slow", &[("latency", "1s")]);
    let id = identity("a");

    let o = backend.ensure(&on("a")).await.unwrap();
    let pending = o.pending.clone().expect("creation takes a second");
    assert_eq!(pending.operation, "Creating");
    assert!(
        pending
            .task
            .as_deref()
            .is_some_and(|t| t.starts_with("sim-task-"))
    );
    assert_eq!(pending.retry_after, Duration::from_secs(1));
    assert_eq!(o.provider_id, None, "no provider ID before the VM exists");
    assert_eq!(o.power_state, None);
    assert!(o.addresses.is_empty());
    assert!(o.failure_domain.is_some());

    advance(Duration::from_millis(980)).await;
    let o = backend.observe(&id).await.unwrap().unwrap();
    assert_eq!(
        o.pending.unwrap().retry_after,
        Duration::from_millis(50),
        "at least 50ms"
    );

    advance(Duration::from_millis(20)).await;
    let o = backend.observe(&id).await.unwrap().unwrap();
    assert_eq!(pending_op(&o), Some("PoweringOn"));
    assert!(
        o.provider_id
            .as_deref()
            .is_some_and(|p| p.starts_with("vsphere://"))
    );
    assert_eq!(o.power_state, Some(PoweredOff));
    assert!(o.addresses.is_empty(), "no addresses while powered off");
    assert!(o.backend_ref.is_some());

    // Calling ensure meanwhile changes nothing.
    assert_eq!(backend.ensure(&on("a")).await.unwrap(), o);

    advance(Duration::from_secs(1)).await;
    let o = backend.observe(&id).await.unwrap().unwrap();
    assert!(o.settled_at(PoweredOn), "{o:?}");
    let addrs = addresses(&o);
    assert_eq!(addrs.len(), 2);
    assert_eq!(addrs[0].0, MachineAddressType::InternalIp);
    assert!(addrs[0].1.starts_with("10."));
    assert_eq!(addrs[1], (MachineAddressType::Hostname, "vm-a".to_string()));
    assert_eq!(backend.ensure(&on("a")).await.unwrap(), o);
}

#[tokio::test(start_paused = true)]
async fn power_round_trip() {
    let sim = SimFactory::new();
    let backend = connect(&sim, "sim://power", &[("latency", "100ms")]);
    let step = Duration::from_millis(100);
    let ensure = |p: PowerState| {
        let backend = backend.clone();
        async move { backend.ensure(&request("a", vsphere(p))).await.unwrap() }
    };

    ensure(PoweredOn).await;
    advance(step * 2).await;
    let running = ensure(PoweredOn).await;
    assert!(running.settled_at(PoweredOn));

    let cases = [
        (PoweredOff, "PoweringOff"),
        (Suspended, "Suspending"),
        (PoweredOn, "Resuming"),
        (Suspended, "Suspending"),
        (PoweredOff, "PoweringOff"),
        (PoweredOn, "PoweringOn"),
    ];
    for (want, operation) in cases {
        let o = ensure(want).await;
        assert_eq!(pending_op(&o), Some(operation), "towards {want:?}");
        assert_eq!(o.pending.as_ref().unwrap().retry_after, step);
        advance(step).await;
        let o = ensure(want).await;
        assert!(o.settled_at(want), "{o:?}");
        assert_eq!(
            o.provider_id, running.provider_id,
            "same machine throughout"
        );
        if want == PoweredOn {
            assert_eq!(
                o.addresses, running.addresses,
                "same address after power cycles"
            );
        } else {
            assert!(o.addresses.is_empty(), "no addresses while {want:?}");
        }
    }
    assert_eq!(sim.machines("sim://power").len(), 1);
}

#[tokio::test(start_paused = true)]
async fn power_change_during_creation_is_queued_behind_it() {
    let sim = SimFactory::new();
    let backend = connect(&sim, "sim://queue", &[("latency", "1s")]);
    backend.ensure(&on("a")).await.unwrap();
    advance(Duration::from_millis(500)).await;
    // Now wanted off: the queued power-on is dropped; creation continues.
    let o = backend
        .ensure(&request("a", vsphere(PoweredOff)))
        .await
        .unwrap();
    assert_eq!(pending_op(&o), Some("Creating"));
    advance(Duration::from_millis(500)).await;
    let o = backend.observe(&identity("a")).await.unwrap().unwrap();
    assert!(o.settled_at(PoweredOff), "{o:?}");

    // Created powered off directly: no power operation at all.
    let o = backend
        .ensure(&request("b", vsphere(PoweredOff)))
        .await
        .unwrap();
    assert_eq!(pending_op(&o), Some("Creating"));
    advance(Duration::from_secs(1)).await;
    assert!(
        backend
            .ensure(&request("b", vsphere(PoweredOff)))
            .await
            .unwrap()
            .settled_at(PoweredOff)
    );
}

#[tokio::test(start_paused = true)]
async fn delete_lifecycle() {
    let sim = SimFactory::new();
    let ep = "sim://delete";
    let backend = connect(&sim, ep, &[("latency", "1s")]);
    let id = identity("a");
    backend.ensure(&on("a")).await.unwrap();
    advance(Duration::from_secs(2)).await;

    assert_eq!(
        backend.delete(&id).await.unwrap(),
        Deletion::InProgress {
            retry_after: Duration::from_secs(1)
        }
    );
    advance(Duration::from_millis(400)).await;
    assert_eq!(
        backend.delete(&id).await.unwrap(),
        Deletion::InProgress {
            retry_after: Duration::from_millis(600)
        },
        "deleting again continues the same deletion"
    );
    let o = backend
        .observe(&id)
        .await
        .unwrap()
        .expect("still there while deleting");
    assert_eq!(pending_op(&o), Some("Deleting"));
    assert!(sim.machine(ep, "a").unwrap().deleting);

    // ensure during deletion does not resurrect the machine.
    let o = backend.ensure(&on("a")).await.unwrap();
    assert_eq!(pending_op(&o), Some("Deleting"));
    assert_eq!(sim.machines(ep).len(), 1);

    advance(Duration::from_millis(600)).await;
    assert_eq!(
        sim.machines(ep),
        [],
        "gone once the deletion completed, even unobserved"
    );
    assert_eq!(backend.delete(&id).await.unwrap(), Deletion::Gone);
    assert_eq!(backend.observe(&id).await.unwrap(), None);
    assert_eq!(
        backend.delete(&identity("never")).await.unwrap(),
        Deletion::Gone
    );
    let stats = sim.stats(ep);
    assert_eq!(
        (
            stats.machines_created,
            stats.machines_deleted,
            stats.machines
        ),
        (1, 1, 0)
    );

    // A later ensure with the same UID creates a new machine with a new provider ID.
    let old = o.provider_id;
    backend.ensure(&on("a")).await.unwrap();
    advance(Duration::from_secs(2)).await;
    let new = backend.observe(&id).await.unwrap().unwrap();
    assert!(new.settled_at(PoweredOn));
    assert_ne!(new.provider_id, old);
}

#[tokio::test(start_paused = true)]
async fn deleting_cancels_the_operation_in_flight() {
    let sim = SimFactory::new();
    let backend = connect(&sim, "sim://cancel", &[("latency", "1s")]);
    backend.ensure(&on("a")).await.unwrap();
    advance(Duration::from_millis(100)).await;
    assert!(matches!(
        backend.delete(&identity("a")).await.unwrap(),
        Deletion::InProgress { .. }
    ));
    advance(Duration::from_secs(1)).await;
    assert_eq!(
        backend.delete(&identity("a")).await.unwrap(),
        Deletion::Gone
    );
    assert_eq!(sim.machines("sim://cancel"), []);
}

#[tokio::test]
async fn without_latency_everything_completes_at_once() {
    let sim = SimFactory::new();
    let backend = connect(&sim, "sim://instant", &[]);
    assert!(
        backend
            .ensure(&on("a"))
            .await
            .unwrap()
            .settled_at(PoweredOn)
    );
    let off = backend
        .ensure(&request("a", vsphere(PoweredOff)))
        .await
        .unwrap();
    assert!(off.settled_at(PoweredOff));
    assert_eq!(
        backend.delete(&identity("a")).await.unwrap(),
        Deletion::Gone
    );
    assert_eq!(backend.observe(&identity("a")).await.unwrap(), None);
}

#[tokio::test]
async fn capacity_limits_machines() {
    let sim = SimFactory::new();
    let backend = connect(&sim, "sim://small", &[("capacity", "2")]);
    backend.ensure(&on("a")).await.unwrap();
    backend.ensure(&on("b")).await.unwrap();
    let err = backend.ensure(&on("c")).await.unwrap_err();
    assert_eq!(err.class, ErrorClass::Terminal);
    assert_eq!(err.reason, "InsufficientCapacity");
    assert!(err.message.contains("capacity"), "{}", err.message);
    // Existing machines are still served.
    assert!(
        backend
            .ensure(&on("a"))
            .await
            .unwrap()
            .settled_at(PoweredOn)
    );
    // Deleting one makes room.
    backend.delete(&identity("a")).await.unwrap();
    assert!(
        backend
            .ensure(&on("c"))
            .await
            .unwrap()
            .settled_at(PoweredOn)
    );
    assert_eq!(uids(&sim.machines("sim://small")), ["b", "c"]);

    let full = connect(&sim, "sim://full", &[("capacity", "0")]);
    assert_eq!(
        full.ensure(&on("a")).await.unwrap_err().reason,
        "InsufficientCapacity"
    );
}

async fn fault_pattern(seed: &str, kinds: &str) -> Vec<Option<(ErrorClass, String)>> {
    let sim = SimFactory::new();
    let backend = connect(
        &sim,
        "sim://faults",
        &[
            ("failureRate", "0.5"),
            ("seed", seed),
            ("failureKinds", kinds),
        ],
    );
    let mut outcomes = Vec::new();
    for _ in 0..1000 {
        outcomes.push(backend.observe(&identity("x")).await.err().map(|e| {
            assert_eq!(e.reason, "SimulatedFault");
            assert!(e.message.contains("observe"), "{}", e.message);
            (e.class, e.reason)
        }));
    }
    let stats = sim.stats("sim://faults");
    assert_eq!(stats.observe, 1000);
    let failed = outcomes.iter().filter(|o| o.is_some()).count() as u64;
    assert_eq!(stats.transient_faults + stats.terminal_faults, failed);
    outcomes
}

#[tokio::test]
async fn fault_injection_is_reproducible_and_matches_the_rate() {
    let a = fault_pattern("42", "transient").await;
    let b = fault_pattern("42", "transient").await;
    assert_eq!(a, b, "same seed, same faults");
    let failed = a.iter().filter(|o| o.is_some()).count();
    assert!(
        (430..=570).contains(&failed),
        "{failed} of 1000 calls failed at rate 0.5"
    );
    assert!(
        a.iter()
            .flatten()
            .all(|(class, _)| *class == ErrorClass::Transient)
    );

    let c = fault_pattern("43", "transient").await;
    assert_ne!(a, c, "another seed, other faults");

    let mixed = fault_pattern("42", "transient,terminal").await;
    let terminal = mixed
        .iter()
        .flatten()
        .filter(|(c, _)| *c == ErrorClass::Terminal)
        .count();
    let transient = mixed
        .iter()
        .flatten()
        .filter(|(c, _)| *c == ErrorClass::Transient)
        .count();
    assert!(
        terminal > 150 && transient > 150,
        "{terminal} terminal, {transient} transient"
    );
}

#[tokio::test]
async fn default_seed_is_reproducible_per_endpoint() {
    let run = || async {
        let sim = SimFactory::new();
        let backend = connect(&sim, "sim://seeded", &[("failureRate", "0.3")]);
        let mut outcomes = Vec::new();
        for _ in 0..200 {
            outcomes.push(backend.check().await.is_ok());
        }
        outcomes
    };
    assert_eq!(run().await, run().await);
}

#[tokio::test]
async fn faulted_calls_change_nothing() {
    let sim = SimFactory::new();
    let backend = connect(
        &sim,
        "sim://broken",
        &[("failureRate", "1"), ("failureKinds", "terminal")],
    );
    let err = backend.ensure(&on("a")).await.unwrap_err();
    assert_eq!(
        (err.class, err.reason.as_str()),
        (ErrorClass::Terminal, "SimulatedFault")
    );
    assert_eq!(sim.machines("sim://broken"), []);
    assert!(backend.check().await.is_err());
    assert!(backend.find_image(&ImageSources::default()).await.is_err());
    assert!(backend.delete(&identity("a")).await.is_err());
    let stats = sim.stats("sim://broken");
    assert_eq!((stats.terminal_faults, stats.calls()), (4, 4));
}

#[tokio::test(start_paused = true)]
async fn slow_faults_take_ten_times_the_latency() {
    let sim = SimFactory::new();
    let backend = connect(
        &sim,
        "sim://sluggish",
        &[
            ("latency", "100ms"),
            ("failureRate", "1"),
            ("failureKinds", "slow"),
        ],
    );
    let o = backend.ensure(&on("a")).await.unwrap();
    assert_eq!(o.pending.unwrap().retry_after, Duration::from_secs(1));
    assert_eq!(
        backend.delete(&identity("a")).await.unwrap(),
        Deletion::InProgress {
            retry_after: Duration::from_secs(1)
        }
    );
    assert_eq!(sim.stats("sim://sluggish").slow_faults, 2);
}

#[tokio::test]
async fn placement_honours_failure_domains() {
    let sim = SimFactory::new();
    let backend = connect(&sim, "sim://zones", &[("failureDomains", "z1,z2")]);

    let mut req = on("pinned");
    req.failure_domain = Some("z2".into());
    assert_eq!(
        backend
            .ensure(&req)
            .await
            .unwrap()
            .failure_domain
            .as_deref(),
        Some("z2")
    );

    req.identity = identity("lost");
    req.failure_domain = Some("z9".into());
    let err = backend.ensure(&req).await.unwrap_err();
    assert_eq!(
        (err.class, err.reason.as_str()),
        (ErrorClass::Terminal, "UnknownFailureDomain")
    );
    assert!(
        err.message.contains("failure domain z9 does not exist") && err.message.contains("z1, z2"),
        "{}",
        err.message
    );
    assert!(sim.machine("sim://zones", "lost").is_none());

    // Unpinned machines go to the least loaded domain, the first on ties
    // (z2 already holds "pinned").
    let mut placed = Vec::new();
    for uid in ["a", "b", "c", "d", "e"] {
        placed.push(
            backend
                .ensure(&on(uid))
                .await
                .unwrap()
                .failure_domain
                .unwrap(),
        );
    }
    assert_eq!(placed, ["z1", "z1", "z2", "z1", "z2"]);
}

#[tokio::test]
async fn provider_ids_use_the_scheme_of_each_kind() {
    let sim = SimFactory::new();
    let backend = connect(&sim, "sim://kinds", &[]);
    let cases = [
        ("v", vsphere(PoweredOn), "vsphere://", "VSphereMachine"),
        ("p", proxmox(PoweredOn), "proxmox://", "ProxmoxMachine"),
        ("l", libvirt(PoweredOn), "libvirt://", "LibvirtMachine"),
        (
            "c",
            cloud_hypervisor(PoweredOn),
            "cloud-hypervisor://",
            "CloudHypervisorMachine",
        ),
    ];
    let mut ids = HashSet::new();
    for (uid, spec, scheme, kind) in cases {
        let o = backend.ensure(&request(uid, spec)).await.unwrap();
        let id = o.provider_id.unwrap();
        let uuid = id
            .strip_prefix(scheme)
            .unwrap_or_else(|| panic!("{id} should start with {scheme}"));
        assert_eq!(uuid.len(), 36, "{id}");
        assert_eq!(uuid.matches('-').count(), 4, "{id}");
        assert!(ids.insert(uuid.to_string()));
        let info = sim.machine("sim://kinds", uid).unwrap();
        assert_eq!(info.kind, kind);
        assert_eq!(info.provider_id, id);
        assert_eq!(Some(info.backend_ref), o.backend_ref);
    }
    let info = sim.machine("sim://kinds", "p").unwrap();
    assert_eq!((info.cpus, info.memory_mib), (2, 2048));
    assert!(
        info.backend_ref
            .starts_with(&format!("{}/", info.failure_domain))
    );
    assert_eq!(
        sim.machine("sim://kinds", "l").unwrap().backend_ref,
        "default_vm-l"
    );
}

#[tokio::test]
async fn addresses_are_unique_across_ten_thousand_machines() {
    let sim = SimFactory::new();
    let backend = connect(&sim, "sim://scale", &[]);
    let mut seen = HashSet::new();
    for i in 0..10_000 {
        let o = backend.ensure(&on(&format!("m{i}"))).await.unwrap();
        let ip = &o.addresses[0];
        assert_eq!(ip.type_, MachineAddressType::InternalIp);
        assert!(
            seen.insert(ip.address.clone()),
            "{} handed out twice",
            ip.address
        );
    }
    let machines = sim.machines("sim://scale");
    assert_eq!(machines.len(), 10_000);
    let provider_ids: HashSet<_> = machines.iter().map(|m| &m.provider_id).collect();
    assert_eq!(provider_ids.len(), 10_000);
    let per_domain = machines
        .iter()
        .filter(|m| m.failure_domain == "sim-a")
        .count();
    assert_eq!(per_domain, 5_000, "spread evenly");

    // Deleting half and creating more never collides with the living.
    for i in (0..10_000).step_by(2) {
        backend.delete(&identity(&format!("m{i}"))).await.unwrap();
    }
    for i in 10_000..15_000 {
        backend.ensure(&on(&format!("m{i}"))).await.unwrap();
    }
    let living: HashSet<_> = sim
        .machines("sim://scale")
        .iter()
        .map(|m| m.address)
        .collect();
    assert_eq!(living.len(), 10_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn many_workers_many_machines() {
    let sim = SimFactory::new();
    let backend = connect(&sim, "sim://workers", &[("latency", "1ms")]);
    let tasks: Vec<_> = (0..8)
        .map(|worker| {
            let backend = backend.clone();
            tokio::spawn(async move {
                // Every worker touches every machine, in a different order.
                for i in 0..500 {
                    let uid = format!("m{}", (i * 7 + worker * 61) % 500);
                    loop {
                        let o = backend.ensure(&on(&uid)).await.unwrap();
                        match o.pending {
                            Some(p) => {
                                tokio::time::sleep(p.retry_after.min(Duration::from_millis(2)))
                                    .await
                            }
                            None => break,
                        }
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let machines = sim.machines("sim://workers");
    assert_eq!(machines.len(), 500);
    assert!(machines.iter().all(|m| m.power_state == Some(PoweredOn)));
    let addrs: HashSet<_> = machines.iter().map(|m| m.address).collect();
    assert_eq!(addrs.len(), 500);
    assert_eq!(sim.stats("sim://workers").machines_created, 500);
}

#[tokio::test]
async fn machines_survive_reconnecting_and_endpoints_are_isolated() {
    let sim = SimFactory::new();
    let first = connect(&sim, "sim://lab-a", &[]);
    let created = first.ensure(&on("a")).await.unwrap();
    drop(first);

    // The operator reconnects with new settings: same world, same machine.
    let again = connect(&sim, "sim://lab-a", &[("latency", "1s")]);
    assert_eq!(
        again.observe(&identity("a")).await.unwrap(),
        Some(created.clone())
    );
    assert_eq!(again.ensure(&on("a")).await.unwrap(), created);

    // Through the trait object too.
    let dynamic: Arc<dyn Backend> = sim.connect(&connection("sim://lab-a", &[])).unwrap();
    assert!(dynamic.observe(&identity("a")).await.unwrap().is_some());

    // Another endpoint is another hypervisor.
    let other = connect(&sim, "sim://lab-b", &[]);
    assert_eq!(other.observe(&identity("a")).await.unwrap(), None);
    assert_eq!(other.delete(&identity("a")).await.unwrap(), Deletion::Gone);
    assert_eq!(sim.machines("sim://lab-b"), []);
    assert_eq!(sim.machines("sim://lab-a").len(), 1);
    assert_eq!(sim.endpoints(), ["sim://lab-a", "sim://lab-b"]);

    // A clone of the factory shares the worlds; a new factory does not.
    assert_eq!(sim.clone().machines("sim://lab-a").len(), 1);
    assert_eq!(SimFactory::new().machines("sim://lab-a"), []);
    assert_eq!(sim.machines("sim://never"), []);
}

#[tokio::test]
async fn check_reports_version_and_failure_domains() {
    let sim = SimFactory::new();
    let inventory = connect(&sim, "sim://check", &[]).check().await.unwrap();
    assert_eq!(
        inventory.version,
        format!("banlieue-sim {}", env!("CARGO_PKG_VERSION"))
    );
    let names: Vec<_> = inventory
        .failure_domains
        .iter()
        .map(|d| d.name.as_str())
        .collect();
    assert_eq!(names, ["sim-a", "sim-b"]);
    let a = &inventory.failure_domains[0];
    assert_eq!(a.labels["topology.kubernetes.io/zone"], "sim-a");
    assert_eq!(a.location["host"], "sim-a");
    for key in [
        "datastore",
        "portGroup",
        "storage",
        "bridge",
        "pool",
        "network",
        "directory",
    ] {
        assert!(a.resources[key].contains("default"), "{key}");
    }

    let custom = connect(
        &sim,
        "sim://check",
        &[
            ("version", "VMware vCenter Server 8.0.3 (sim)"),
            ("failureDomains", "east"),
            ("features", "nestedVirtualization"),
            ("resources.datastore", "ssd,hdd"),
        ],
    );
    let inventory = custom.check().await.unwrap();
    assert_eq!(inventory.version, "VMware vCenter Server 8.0.3 (sim)");
    let east = &inventory.failure_domains[0];
    assert!(east.features.contains("nestedVirtualization"));
    assert_eq!(east.resources["datastore"].len(), 2);
    assert_eq!(sim.stats("sim://check").check, 2);
}

#[tokio::test]
async fn find_image_needs_a_sim_source() {
    let sim = SimFactory::new();
    let backend = connect(&sim, "sim://images", &[]);
    let sources = ImageSources {
        sim: Some(SimImageSource {
            name: "ubuntu-2404".into(),
        }),
        ..Default::default()
    };
    assert_eq!(
        backend.find_image(&sources).await.unwrap(),
        ImageLookup::Available {
            resolved: "sim:ubuntu-2404".into()
        }
    );
    match backend.find_image(&ImageSources::default()).await.unwrap() {
        ImageLookup::Missing { message } => assert!(message.contains("sources.sim"), "{message}"),
        other => panic!("expected Missing, got {other:?}"),
    }
    assert_eq!(sim.stats("sim://images").find_image, 2);
}

#[tokio::test(start_paused = true)]
async fn bootstrap_data_is_kept_and_never_shown() {
    let sim = SimFactory::new();
    let backend = connect(&sim, "sim://boot", &[("latency", "1s")]);
    let mut req = on("a");
    req.bootstrap = Some(BootstrapData {
        format: BootstrapFormat::Ignition,
        user_data: SecretValue::new(
            "{\"ignition\":{\"version\":\"3.4.0\"},\"passwd\":\"hunter2\"}",
        ),
        network_config: Some(SecretValue::new("version: 2")),
    });
    backend.ensure(&req).await.unwrap();

    let info = sim.machine("sim://boot", "a").unwrap();
    assert_eq!(info.bootstrap_format, Some(BootstrapFormat::Ignition));
    assert!(info.bootstrap_network_config);
    assert!(!format!("{info:?} {:?}", sim.machines("sim://boot")).contains("hunter2"));
    let data = sim.bootstrap_data("sim://boot", "a").unwrap();
    assert!(data.user_data.expose().contains("hunter2"));
    assert!(!format!("{data:?}").contains("hunter2"));

    // A machine created without bootstrap data picks it up while still being created.
    backend.ensure(&on("b")).await.unwrap();
    assert_eq!(
        sim.machine("sim://boot", "b").unwrap().bootstrap_format,
        None
    );
    let mut later = on("b");
    later.bootstrap = Some(BootstrapData {
        format: BootstrapFormat::CloudConfig,
        user_data: SecretValue::new("#cloud-config"),
        network_config: None,
    });
    backend.ensure(&later).await.unwrap();
    let info = sim.machine("sim://boot", "b").unwrap();
    assert_eq!(info.bootstrap_format, Some(BootstrapFormat::CloudConfig));
    assert!(!info.bootstrap_network_config);
}

#[tokio::test]
async fn out_of_band_changes_are_seen_and_repaired() {
    let sim = SimFactory::new();
    let ep = "sim://drift";
    let backend = connect(&sim, ep, &[]);
    backend.ensure(&on("a")).await.unwrap();

    assert!(sim.set_power_state(ep, "a", PoweredOff));
    let o = backend.observe(&identity("a")).await.unwrap().unwrap();
    assert!(o.settled_at(PoweredOff));
    assert!(
        backend
            .ensure(&on("a"))
            .await
            .unwrap()
            .settled_at(PoweredOn)
    );

    assert!(sim.remove_machine(ep, "a"));
    assert!(!sim.remove_machine(ep, "a"));
    assert!(!sim.set_power_state(ep, "a", PoweredOn));
    assert_eq!(backend.observe(&identity("a")).await.unwrap(), None);
    assert!(
        backend
            .ensure(&on("a"))
            .await
            .unwrap()
            .settled_at(PoweredOn)
    );
    assert_eq!(sim.stats(ep).machines_created, 2);
}

#[test]
fn connect_rejects_bad_settings_and_empty_endpoints() {
    let sim = SimFactory::new();
    let err = sim
        .connect(&connection(
            "sim://bad",
            &[("latency", "soon"), ("colour", "blue")],
        ))
        .err()
        .expect("bad settings are rejected");
    assert_eq!(
        (err.class, err.reason.as_str()),
        (ErrorClass::Terminal, "InvalidSettings")
    );
    assert!(err.message.contains("settings.latency") && err.message.contains("settings.colour"));
    assert_eq!(
        sim.endpoints(),
        Vec::<String>::new(),
        "no world for a failed connect"
    );

    let err = sim
        .connect(&connection("", &[]))
        .err()
        .expect("an endpoint is needed");
    assert_eq!(err.reason, "InvalidEndpoint");
}

#[tokio::test]
async fn stats_count_every_call() {
    let sim = SimFactory::new();
    let ep = "sim://stats";
    let backend = connect(&sim, ep, &[]);
    backend.check().await.unwrap();
    backend.ensure(&on("a")).await.unwrap();
    backend.ensure(&on("a")).await.unwrap();
    backend.observe(&identity("a")).await.unwrap();
    backend.delete(&identity("a")).await.unwrap();
    let s = sim.stats(ep);
    assert_eq!(
        (s.check, s.find_image, s.ensure, s.observe, s.delete),
        (1, 0, 2, 1, 1)
    );
    assert_eq!(s.calls(), 5);
    assert_eq!(
        (s.machines_created, s.machines_deleted, s.machines),
        (1, 1, 0)
    );
    assert_eq!(sim.stats("sim://unknown"), Default::default());
}

#[tokio::test]
async fn an_empty_uid_is_rejected() {
    let sim = SimFactory::new();
    let backend = connect(&sim, "sim://empty", &[]);
    let err = backend.ensure(&on("")).await.unwrap_err();
    assert_eq!(err.reason, "InvalidRequest");
}

#[tokio::test]
async fn a_new_uid_with_the_provider_id_adopts_the_machine_and_an_unknown_one_creates_nothing() {
    let sim = SimFactory::new();
    let endpoint = "sim://adopt";
    let backend = connect(&sim, endpoint, &[]);
    let created = backend.ensure(&on("before-move")).await.unwrap();
    let provider_id = created.provider_id.clone().expect("a provider ID");

    // `clusterctl move`: the same object (same providerID) with a new UID.
    let mut moved = on("after-move");
    moved.identity = moved.identity.with_provider_id(&provider_id);
    let adopted = backend.ensure(&moved).await.unwrap();
    assert_eq!(adopted.provider_id.as_deref(), Some(provider_id.as_str()));
    assert_eq!(adopted.backend_ref, created.backend_ref);
    assert_eq!(uids(&sim.machines(endpoint)), ["after-move"]);
    assert_eq!(sim.stats(endpoint).machines_created, 1);
    assert!(backend.observe(&moved.identity).await.unwrap().is_some());

    // A providerID no machine has: nothing is created, the machine says why.
    let mut lost = on("restored");
    lost.identity = lost
        .identity
        .with_provider_id("vsphere://00000000-0000-4000-8000-000000000000");
    let error = backend.ensure(&lost).await.unwrap_err();
    assert_eq!(error.reason, banlieue_sdk::backend::BACKEND_VM_MISSING);
    assert_eq!(error.class, ErrorClass::Terminal);
    assert_eq!(sim.stats(endpoint).machines_created, 1);
    assert_eq!(uids(&sim.machines(endpoint)), ["after-move"]);

    // Deleting the moved object deletes the machine it adopted.
    assert_eq!(
        backend.delete(&moved.identity).await.unwrap(),
        Deletion::Gone
    );
    assert!(sim.machines(endpoint).is_empty());
}

#[tokio::test]
async fn machines_made_for_an_objects_namespace_kind_and_name_are_found_whatever_their_uid() {
    let sim = SimFactory::new();
    let endpoint = "sim://made-for";
    let backend = connect(&sim, endpoint, &[]);
    let created = backend.ensure(&on("old")).await.unwrap();
    // Another object (another name) and the same name as another kind: not listed.
    backend.ensure(&on("other")).await.unwrap();

    // The restored object: a new UID, the same namespace and name, no providerID.
    let mut restored = on("new");
    restored.identity.name = "vm-old".into();
    let found = backend
        .made_for("VSphereMachine", &restored.identity)
        .await
        .unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].provider_id, created.provider_id.clone().unwrap());
    assert_eq!(found[0].uid.as_deref(), Some("old"));
    assert!(!found[0].deleting);
    assert!(
        backend
            .made_for("ProxmoxMachine", &restored.identity)
            .await
            .unwrap()
            .is_empty(),
        "another kind's machine of that name"
    );

    // Adopted by its provider ID (what the controller does with it): still one machine.
    restored.identity = restored
        .identity
        .with_provider_id(created.provider_id.clone().unwrap());
    backend.ensure(&restored).await.unwrap();
    assert_eq!(sim.stats(endpoint).machines_created, 2);
    let found = backend
        .made_for("VSphereMachine", &restored.identity)
        .await
        .unwrap();
    assert_eq!(found[0].uid.as_deref(), Some("new"), "retagged");

    // Being deleted: listed as such (never adopted).
    backend.delete(&restored.identity).await.unwrap();
    let found = backend
        .made_for("VSphereMachine", &restored.identity)
        .await
        .unwrap();
    assert!(found.iter().all(|m| m.deleting), "{found:?}");
}
