//! The Cloud Hypervisor backend end to end. The backend starts real processes: the
//! spec-checked fake VMM (`fake-cloud-hypervisor`, every request and response
//! validated against the official OpenAPI document and logged), or a real
//! `cloud-hypervisor` when `BANLIEUE_CH_BINARY` is set (see the backend's README).
//!
//! The first tests drive the [`Backend`] directly; the others run banlieue's
//! controllers against a real apiserver with a `cloud-hypervisor` Provider.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use banlieue_backend_cloud_hypervisor::{ChBackend, ChFactory};
use banlieue_backend_sim::SimFactory;
use banlieue_integration_tests::apply;
use banlieue_integration_tests::cloud_hypervisor::{ChRig, Guest, kill};
use banlieue_integration_tests::operator::{Operator, wait_for, wait_gone};
use banlieue_sdk::api::common::{PowerState, ProviderClass};
use banlieue_sdk::api::infra::cloud_hypervisor::{
    CloudHypervisorMachine, CloudHypervisorMachineSpec,
};
use banlieue_sdk::api::{Provider, VirtualMachine};
use banlieue_sdk::backend::{
    Backend, BackendError, BackendRegistry, BootstrapData, Connection, Deletion, ImageLookup,
    MachineIdentity, MachineObservation, MachineRequest, MachineSpec,
};
use banlieue_sdk::conditions;
use banlieue_testenv::TestNamespace;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};

const FAKE: &str = env!("CARGO_BIN_EXE_fake-ch-vmm");
const WAIT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------
// The backend alone.

fn backend(rig: &ChRig, extra: &[(&str, &str)]) -> Arc<ChBackend> {
    let mut settings = rig.settings();
    for (k, v) in extra {
        settings.insert((*k).into(), (*v).into());
    }
    ChFactory::new()
        .connect_ch(&Connection {
            class: ProviderClass::CloudHypervisor,
            endpoint: rig.endpoint(),
            credentials: BTreeMap::new(),
            ca_bundle: None,
            insecure_skip_tls_verify: false,
            settings,
        })
        .expect("connect")
}

fn request(rig: &ChRig, uid: &str, power: &str, image: Option<Value>) -> MachineRequest {
    let spec: CloudHypervisorMachineSpec = serde_json::from_value(json!({
        "image": image.unwrap_or_else(|| rig.image.clone()),
        "cpus": 2, "memoryMiB": 512, "diskGiB": 1, "powerState": power,
        "additionalDisks": [{"name": "data", "sizeGiB": 1}],
        "network": [{"macAddress": "52:54:00:c0:ff:01"},
                    {"ipam": {"mode": "static", "addresses": ["192.168.7.7/24"], "gateway": "192.168.7.1"}}]
    }))
    .expect("spec");
    MachineRequest {
        identity: MachineIdentity {
            uid: uid.into(),
            namespace: "ns".into(),
            name: format!("vm-{uid}"),
            provider_id: None,
        },
        spec: MachineSpec::CloudHypervisor(spec),
        failure_domain: None,
        bootstrap: Some(BootstrapData {
            format: Default::default(),
            user_data: "#cloud-config\nhostname: from-bootstrap\n".into(),
            network_config: None,
        }),
        instance_id: None,
        disks_imported: false,
    }
}

/// Calls `ensure` until the machine settles at `want` (following `Pending`).
async fn settle(
    backend: &ChBackend,
    req: &MachineRequest,
    want: PowerState,
) -> Result<MachineObservation, BackendError> {
    let started = Instant::now();
    loop {
        let obs = backend.ensure(req).await?;
        if obs.settled_at(want) {
            return Ok(obs);
        }
        assert!(
            started.elapsed() < WAIT,
            "never settled at {want:?}: {obs:?}"
        );
        let pause = obs
            .pending
            .as_ref()
            .map_or(Duration::from_millis(100), |p| p.retry_after);
        tokio::time::sleep(pause).await;
    }
}

fn count(ops: &[String], op: &str) -> usize {
    ops.iter().filter(|o| *o == op).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backend_runs_a_machine_through_its_life_within_the_openapi_document() {
    let rig = ChRig::new(FAKE, Guest::Exit);
    let backend = backend(&rig, &[]);
    let started = Instant::now();
    let inventory = backend.check().await.expect("check");
    if rig.is_fake() {
        assert_eq!(inventory.version, "Cloud Hypervisor v48.0.0-fake");
    }
    assert_eq!(inventory.failure_domains.len(), 1);
    let host = &inventory.failure_domains[0];
    assert_eq!(host.name, "ch-host-1");
    assert_eq!(host.location["host"], "ch-host-1");
    assert!(host.labels["banlieue.io/host-cpus"].parse::<u32>().unwrap() >= 1);
    assert!(
        host.labels["banlieue.io/host-memory-mib"]
            .parse::<u64>()
            .unwrap()
            > 0
    );
    assert!(
        rig.all_vmm_pids().is_empty(),
        "the version probe VMM is gone"
    );

    let sources = serde_json::from_value(json!({"cloudHypervisor": rig.image})).unwrap();
    assert!(matches!(
        backend.find_image(&sources).await.unwrap(),
        ImageLookup::Available { .. }
    ));
    let missing = serde_json::from_value(
        json!({"cloudHypervisor": {"disk": "/nonexistent.raw", "kernel": "/nonexistent"}}),
    )
    .unwrap();
    assert!(matches!(
        backend.find_image(&missing).await.unwrap(),
        ImageLookup::Missing { .. }
    ));

    // Create and boot.
    let uid = "0c0ffee0-0000-4000-8000-000000000001";
    rig.lease("52:54:00:c0:ff:01", "10.99.0.7", "vm-1");
    let on = request(&rig, uid, "PoweredOn", None);
    let obs = settle(&backend, &on, PowerState::PoweredOn)
        .await
        .expect("running");
    println!("create → running in {:?}", started.elapsed());
    assert_eq!(
        obs.provider_id.as_deref(),
        Some(&*format!("cloud-hypervisor://{uid}"))
    );
    assert_eq!(obs.failure_domain.as_deref(), Some("ch-host-1"));
    let addresses: Vec<&str> = obs.addresses.iter().map(|a| a.address.as_str()).collect();
    assert_eq!(
        addresses,
        ["10.99.0.7", "192.168.7.7", &*format!("vm-{uid}")]
    );
    let pids = rig.vmm_pids(uid);
    assert_eq!(pids.len(), 1, "one VMM for the machine");
    let state = rig.state(uid).expect("state.json");
    assert_eq!(state["pid"], pids[0]);
    let dir = rig.machine_dir(uid);
    assert!(
        std::fs::metadata(dir.join("disk.raw")).unwrap().len() >= 1 << 30,
        "grown to diskGiB"
    );
    assert!(dir.join("data-0.raw").is_file());
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "bootstrap data is for the owner only");
    }
    let (label, seed) =
        banlieue_backend_cloud_hypervisor::seed::read_image(&dir.join("seed.img")).unwrap();
    assert_eq!(label, "CIDATA");
    assert_eq!(
        seed["user-data"],
        b"#cloud-config\nhostname: from-bootstrap\n"
    );
    assert!(String::from_utf8_lossy(&seed["meta-data"]).contains(uid));

    // Idempotent: no second VMM, no second vm.create.
    let again = backend.ensure(&on).await.unwrap();
    assert!(again.settled_at(PowerState::PoweredOn));
    assert_eq!(rig.vmm_pids(uid), pids);
    let observed = backend
        .observe(&on.identity)
        .await
        .unwrap()
        .expect("observed");
    assert_eq!(observed.power_state, Some(PowerState::PoweredOn));
    assert_eq!(
        observed.addresses, obs.addresses,
        "observe reports addresses too"
    );

    // Suspend and resume.
    let paused = request(&rig, uid, "Suspended", None);
    settle(&backend, &paused, PowerState::Suspended)
        .await
        .unwrap();
    settle(&backend, &on, PowerState::PoweredOn).await.unwrap();

    // Power off: the power button, the guest powers off, the VMM exits.
    let off = request(&rig, uid, "PoweredOff", None);
    let first = backend.ensure(&off).await.unwrap();
    assert_eq!(
        first.pending.as_ref().map(|p| p.operation.as_str()),
        Some("PoweringOff")
    );
    settle(&backend, &off, PowerState::PoweredOff)
        .await
        .unwrap();
    if rig.is_fake() {
        assert!(rig.vmm_pids(uid).is_empty(), "the VMM exits with its guest");
    }
    // Power on again: a new VMM, the VM created and booted anew from the same disk.
    settle(&backend, &on, PowerState::PoweredOn).await.unwrap();
    let new_pids = rig.vmm_pids(uid);
    assert_eq!(new_pids.len(), 1);
    assert_ne!(new_pids, pids);
    assert_eq!(
        rig.state(uid).unwrap()["restarts"],
        0,
        "a power cycle is not a crash"
    );

    // Delete: VM, VMM and directory gone; deleting again is fine.
    assert_eq!(backend.delete(&on.identity).await.unwrap(), Deletion::Gone);
    assert!(rig.vmm_pids(uid).is_empty());
    assert!(!dir.exists());
    assert_eq!(backend.delete(&on.identity).await.unwrap(), Deletion::Gone);
    assert!(backend.observe(&on.identity).await.unwrap().is_none());

    if rig.is_fake() {
        let ops = rig.operations(uid);
        for op in [
            "vmm.ping",
            "vm.create",
            "vm.boot",
            "vm.info",
            "vm.pause",
            "vm.resume",
            "vm.power-button",
            "vm.delete",
            "vmm.shutdown",
        ] {
            assert!(ops.contains(&op.to_owned()), "{op} was never sent: {ops:?}");
        }
        assert_eq!(count(&ops, "vm.create"), 2, "one per VMM: {ops:?}");
        assert_eq!(count(&ops, "vm.boot"), 2, "{ops:?}");
        rig.assert_conformant();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_that_ignores_the_power_button_is_shut_down_and_can_boot_again() {
    let rig = ChRig::new(FAKE, Guest::Ignore);
    if !rig.is_fake() {
        return; // Needs a guest that ignores the button.
    }
    let backend = backend(&rig, &[("shutdownTimeout", "1s")]);
    let uid = "0c0ffee0-0000-4000-8000-000000000002";
    let on = request(&rig, uid, "PoweredOn", None);
    settle(&backend, &on, PowerState::PoweredOn).await.unwrap();
    let pids = rig.vmm_pids(uid);
    let off = request(&rig, uid, "PoweredOff", None);
    let started = Instant::now();
    settle(&backend, &off, PowerState::PoweredOff)
        .await
        .unwrap();
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "waited for the guest first"
    );
    assert_eq!(rig.vmm_pids(uid), pids, "the VMM stays, its VM shut down");
    settle(&backend, &on, PowerState::PoweredOn).await.unwrap();
    assert_eq!(rig.vmm_pids(uid), pids, "booted again in the same VMM");
    let ops = rig.operations(uid);
    assert_eq!(count(&ops, "vm.shutdown"), 1, "{ops:?}");
    assert_eq!(count(&ops, "vm.boot"), 2, "{ops:?}");
    assert_eq!(backend.delete(&on.identity).await.unwrap(), Deletion::Gone);
    assert!(rig.vmm_pids(uid).is_empty());
    rig.assert_conformant();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_that_wait_for_the_next_boot_remake_the_vm_in_a_vmm_that_stayed() {
    use banlieue_sdk::api::resources::MachineField as F;
    // The guest powers off and its VMM stays with the VM in Shutdown: the next boot
    // must not boot the VMM's old configuration.
    let rig = ChRig::new(FAKE, Guest::Shutdown);
    assert!(rig.is_fake(), "reads the fake's exchanges");
    let backend = backend(&rig, &[]);
    let uid = "0c0ffee0-0000-4000-8000-000000000038";
    let mut on = request(&rig, uid, "PoweredOn", None);
    let obs = settle(&backend, &on, PowerState::PoweredOn).await.unwrap();
    let r = obs.resources.expect("read back");
    assert_eq!(
        (r.cpus, r.max_cpus, r.memory_mib, r.max_memory_mib),
        (2, Some(2), 512, Some(512))
    );
    assert_eq!(obs.next_boot, None);
    let pids = rig.vmm_pids(uid);
    let resize = |on: &mut MachineRequest, f: &dyn Fn(&mut CloudHypervisorMachineSpec)| {
        let MachineSpec::CloudHypervisor(spec) = &mut on.spec else {
            unreachable!()
        };
        f(spec);
    };

    // No headroom (maxCPUs, maxMemoryMiB unset): the raise is written for the next boot.
    resize(&mut on, &|s| {
        s.cpus = 3;
        s.memory_mib = 1024;
    });
    let obs = backend
        .apply_changes(&on, &[F::Cpus, F::MemoryMib])
        .await
        .unwrap();
    let (r, next) = (obs.resources.unwrap(), obs.next_boot.expect("a next boot"));
    println!(
        "running {}/{} MiB, next boot {}/{} MiB",
        r.cpus, r.memory_mib, next.cpus, next.memory_mib
    );
    assert_eq!((r.cpus, r.memory_mib), (2, 512), "nothing live");
    assert_eq!((next.cpus, next.memory_mib), (3, 1024));
    assert!(!rig.operations(uid).contains(&"vm.resize".to_owned()));
    let mut off = on.clone();
    resize(&mut off, &|s| s.power_state = PowerState::PoweredOff);
    settle(&backend, &off, PowerState::PoweredOff)
        .await
        .unwrap();
    assert_eq!(rig.vmm_pids(uid), pids, "the VMM stays, its VM shut down");
    // While off, a data disk grows on the host.
    resize(&mut off, &|s| s.additional_disks[0].size_gib = 3);
    let obs = backend
        .apply_changes(&off, &[F::DataDiskSize])
        .await
        .unwrap();
    assert_eq!(obs.resources.unwrap().data_disks[0].size_gib, 3);
    assert_eq!(
        std::fs::metadata(rig.machine_dir(uid).join("data-0.raw"))
            .unwrap()
            .len(),
        3 << 30
    );
    resize(&mut on, &|s| s.additional_disks[0].size_gib = 3);
    let obs = settle(&backend, &on, PowerState::PoweredOn).await.unwrap();
    let r = obs.resources.unwrap();
    assert_eq!(
        (r.cpus, r.memory_mib),
        (3, 1024),
        "the next boot's sizes run"
    );
    assert_eq!(obs.next_boot, None);
    assert_eq!(rig.vmm_pids(uid), pids, "in the same VMM");
    let ops = rig.operations(uid);
    println!("{ops:?}");
    assert_eq!(count(&ops, "vm.delete"), 1, "the VM made anew: {ops:?}");
    assert_eq!(count(&ops, "vm.create"), 2, "{ops:?}");

    // With room, a raise that is not whole 128 MiB blocks is refused before anything
    // is sent, naming the field; a whole one is live.
    let uid2 = "0c0ffee0-0000-4000-8000-000000000039";
    let mut roomy = request(&rig, uid2, "PoweredOn", None);
    resize(&mut roomy, &|s| s.max_memory_mib = Some(2048));
    settle(&backend, &roomy, PowerState::PoweredOn)
        .await
        .unwrap();
    resize(&mut roomy, &|s| s.memory_mib = 600);
    let e = backend
        .apply_changes(&roomy, &[F::MemoryMib])
        .await
        .unwrap_err();
    println!("{}: {}", e.reason, e.message);
    assert_eq!(e.reason, "MemoryStepUnaligned");
    assert!(!e.is_transient());
    assert!(!rig.operations(uid2).contains(&"vm.resize".to_owned()));
    resize(&mut roomy, &|s| s.memory_mib = 640);
    let obs = backend
        .apply_changes(&roomy, &[F::MemoryMib])
        .await
        .unwrap();
    assert_eq!(obs.resources.unwrap().memory_mib, 640);
    assert_eq!(
        vm_info(&rig, uid2)["config"]["memory"]["size"],
        640u64 << 20
    );

    for req in [&on, &roomy] {
        assert_eq!(backend.delete(&req.identity).await.unwrap(), Deletion::Gone);
    }
    rig.assert_conformant();
}

/// `coresPerSocket` on the spec-checked fake: a topology the maximum does not fill is
/// refused before anything is made; otherwise the VM is created with `cpus.topology`
/// over `max_vcpus` (checked by the fake as CH checks it), read back from `vm.info`,
/// vCPUs are still added live one at a time, and a new topology waits for the next
/// boot (written to the record, nothing sent live), which makes the VM anew with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cpu_topology_is_created_read_back_and_changed_at_the_next_boot() {
    use banlieue_sdk::api::resources::{ChangeMode, MachineField as F};
    use banlieue_sdk::changes::assess;
    let rig = ChRig::new(FAKE, Guest::Exit);
    assert!(rig.is_fake(), "reads the fake's exchanges");
    let backend = backend(&rig, &[]);
    let table = banlieue_backend_cloud_hypervisor::changes::change_table();
    let set = |req: &mut MachineRequest, f: &dyn Fn(&mut CloudHypervisorMachineSpec)| {
        let MachineSpec::CloudHypervisor(spec) = &mut req.spec else {
            unreachable!()
        };
        f(spec);
    };
    let topology = |cores: u64, packages: u64| json!({"threads_per_core": 1, "cores_per_die": cores, "dies_per_package": 1, "packages": packages});

    // 3 vCPUs at most do not split into packages of 2 cores: refused, nothing made.
    let odd = "0c0ffee0-0000-4000-8000-0000000000c1";
    let mut req = request(&rig, odd, "PoweredOn", None);
    set(&mut req, &|s| {
        s.max_cpus = Some(3);
        s.cores_per_socket = Some(2);
    });
    let e = backend.ensure(&req).await.unwrap_err();
    println!("{}: {}", e.reason, e.message);
    assert_eq!(e.reason, "CpuTopologyMismatch");
    assert!(!e.is_transient());
    assert!(
        e.message.contains("3 vCPUs") && e.message.contains("coresPerSocket 2"),
        "{e}"
    );
    assert!(!rig.machine_dir(odd).exists(), "nothing made");
    assert!(rig.vmm_pids(odd).is_empty());

    // 1 vCPU of 4, 2 cores per package: two packages.
    let uid = "0c0ffee0-0000-4000-8000-0000000000c2";
    let mut on = request(&rig, uid, "PoweredOn", None);
    set(&mut on, &|s| {
        s.cpus = 1;
        s.max_cpus = Some(4);
        s.cores_per_socket = Some(2);
    });
    let obs = settle(&backend, &on, PowerState::PoweredOn).await.unwrap();
    let r = obs.resources.unwrap();
    assert_eq!(
        (r.cpus, r.max_cpus, r.cores_per_socket),
        (1, Some(4), Some(2))
    );
    let created: Vec<Value> = rig
        .exchanges()
        .into_iter()
        .filter(|e| e["path"] == "/api/v1/vm.create")
        .map(|e| e["request"]["cpus"].clone())
        .collect();
    assert_eq!(
        created.last(),
        Some(&json!({"boot_vcpus": 1, "max_vcpus": 4, "topology": topology(2, 2)}))
    );
    let info = vm_info(&rig, uid);
    println!("vm.info cpus {}", info["config"]["cpus"]);
    assert_eq!(info["config"]["cpus"]["topology"], topology(2, 2));

    // Two more vCPUs live (half a package more): vm.resize, the topology unchanged.
    set(&mut on, &|s| s.cpus = 3);
    let obs = backend.apply_changes(&on, &[F::Cpus]).await.unwrap();
    let r = obs.resources.unwrap();
    assert_eq!((r.cpus, r.cores_per_socket), (3, Some(2)));
    assert_eq!(obs.next_boot, None);

    // 4 cores per package: NextBoot, written for the next vm.create only.
    set(&mut on, &|s| s.cores_per_socket = Some(4));
    let seen = settle(&backend, &on, PowerState::PoweredOn).await.unwrap();
    let first = assess(
        &on.spec.resources(),
        seen.resources.as_ref().unwrap(),
        seen.next_boot.as_ref(),
        &table,
        seen.power_state,
    );
    assert_eq!(first.apply, [F::CoresPerSocket]);
    assert_eq!(first.pending[0].waits_for, ChangeMode::NextBoot);
    let before = rig.operations(uid);
    let obs = backend.apply_changes(&on, &first.apply).await.unwrap();
    let (r, next) = (obs.resources.unwrap(), obs.next_boot.expect("a next boot"));
    println!(
        "running {} cores per package, next boot {}",
        r.cores_per_socket.unwrap(),
        next.cores_per_socket.unwrap()
    );
    assert_eq!(
        (r.cores_per_socket, next.cores_per_socket),
        (Some(2), Some(4))
    );
    let sent = rig.operations(uid)[before.len()..].to_vec();
    assert!(
        sent.iter().all(|op| op == "vm.info"),
        "nothing sent live but reads: {sent:?}"
    );
    assert_eq!(
        vm_info(&rig, uid)["config"]["cpus"]["topology"],
        topology(2, 2)
    );
    assert_eq!(
        rig.state(uid).unwrap()["config"]["cpus"]["topology"],
        topology(4, 1)
    );
    // Staged: assessed again, nothing more to write.
    let again = settle(&backend, &on, PowerState::PoweredOn).await.unwrap();
    let second = assess(
        &on.spec.resources(),
        again.resources.as_ref().unwrap(),
        again.next_boot.as_ref(),
        &table,
        again.power_state,
    );
    assert!(
        second.apply.is_empty() && second.restart_required(),
        "{second:?}"
    );

    // A topology the maximum does not fill: refused, the record untouched.
    let mut bad = on.clone();
    set(&mut bad, &|s| s.cores_per_socket = Some(3));
    let e = backend
        .apply_changes(&bad, &[F::CoresPerSocket])
        .await
        .unwrap_err();
    assert_eq!(e.reason, "CpuTopologyMismatch");
    assert_eq!(
        rig.state(uid).unwrap()["config"]["cpus"]["topology"],
        topology(4, 1)
    );

    // The power cycle: the guest powers off, its VMM exits, the next one is created
    // with the new topology.
    let mut off = on.clone();
    set(&mut off, &|s| s.power_state = PowerState::PoweredOff);
    settle(&backend, &off, PowerState::PoweredOff)
        .await
        .unwrap();
    let obs = settle(&backend, &on, PowerState::PoweredOn).await.unwrap();
    let r = obs.resources.unwrap();
    assert_eq!(
        (r.cpus, r.max_cpus, r.cores_per_socket),
        (3, Some(4), Some(4))
    );
    assert_eq!(obs.next_boot, None);
    let info = vm_info(&rig, uid);
    println!(
        "after the power cycle: vm.info cpus {}",
        info["config"]["cpus"]
    );
    assert_eq!(
        info["config"]["cpus"],
        json!({"boot_vcpus": 3, "max_vcpus": 4, "topology": topology(4, 1)})
    );
    assert_eq!(count(&rig.operations(uid), "vm.create"), 2);

    assert_eq!(backend.delete(&on.identity).await.unwrap(), Deletion::Gone);
    rig.assert_conformant();
}

/// Bytes a file has allocated on the host (its blocks, 512 bytes each).
fn allocated(path: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).unwrap().blocks() * 512
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_disks_are_provisioned_as_asked_and_other_storage_is_refused() {
    use banlieue_sdk::api::common::DiskProvisioning as P;
    use banlieue_sdk::api::resources::MachineField as F;
    let rig = ChRig::new(FAKE, Guest::Exit);
    let backend = backend(&rig, &[]);
    let uid = "0c0ffee0-0000-4000-8000-000000000061";
    let mut req = request(&rig, uid, "PoweredOn", None);
    let MachineSpec::CloudHypervisor(spec) = &mut req.spec else {
        unreachable!()
    };
    spec.additional_disks = ["thin", "thick", "eager"]
        .iter()
        .zip([P::Thin, P::Thick, P::EagerZeroed])
        .map(
            |(name, provisioning)| banlieue_sdk::api::infra::MachineDisk {
                name: (*name).into(),
                size_gib: 1,
                storage: (*name == "thick").then(|| "local".into()),
                provisioning,
            },
        )
        .collect();
    settle(&backend, &req, PowerState::PoweredOn).await.unwrap();
    let dir = rig.machine_dir(uid);
    let sizes: Vec<u64> = (0..3)
        .map(|i| allocated(&dir.join(format!("data-{i}.raw"))))
        .collect();
    println!("allocated bytes, thin/thick/eagerZeroed 1 GiB: {sizes:?}");
    assert!(sizes[0] < 1 << 20, "thin is sparse: {sizes:?}");
    assert!(sizes[1] >= 1 << 30, "thick is allocated: {sizes:?}");
    assert!(sizes[2] >= 1 << 30, "eagerZeroed is written: {sizes:?}");

    // Grown while running: the new range of the thick disk is allocated too, the
    // thin one stays sparse.
    let MachineSpec::CloudHypervisor(spec) = &mut req.spec else {
        unreachable!()
    };
    spec.additional_disks[0].size_gib = 2;
    spec.additional_disks[1].size_gib = 2;
    let obs = backend
        .apply_changes(&req, &[F::DataDiskSize])
        .await
        .unwrap();
    let r = obs.resources.unwrap();
    let mut grown: Vec<_> = r
        .data_disks
        .iter()
        .map(|d| (d.name.as_str(), d.size_gib))
        .collect();
    grown.sort();
    assert_eq!(grown, [("eager", 1), ("thick", 2), ("thin", 2)]);
    let (thin, thick) = (
        allocated(&dir.join("data-0.raw")),
        allocated(&dir.join("data-1.raw")),
    );
    println!("after a live grow to 2 GiB: thin {thin}, thick {thick}");
    assert!(thin < 1 << 20 && thick >= 2 << 30, "{thin} {thick}");
    assert_eq!(backend.delete(&req.identity).await.unwrap(), Deletion::Gone);

    // Storage other than the host's one is refused before anything is made (admission
    // refuses it first; this is an object made before that rule).
    let uid2 = "0c0ffee0-0000-4000-8000-000000000062";
    let mut elsewhere = request(&rig, uid2, "PoweredOn", None);
    let MachineSpec::CloudHypervisor(spec) = &mut elsewhere.spec else {
        unreachable!()
    };
    spec.additional_disks[0].storage = Some("fast-nvme".into());
    let e = backend.ensure(&elsewhere).await.unwrap_err();
    println!("{}: {}", e.reason, e.message);
    assert_eq!(e.reason, "StorageUnsupported");
    assert!(!e.is_transient());
    assert!(e.message.contains("fast-nvme"), "{}", e.message);
    assert!(!rig.machine_dir(uid2).exists(), "nothing made");
    rig.assert_conformant();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_qcow2_image_becomes_an_overlay_the_vmm_is_told_to_follow() {
    let rig = ChRig::new(FAKE, Guest::Exit);
    let Some(base) = rig.qcow2_image() else {
        return;
    };
    let backend = backend(&rig, &[]);
    let uid = "0c0ffee0-0000-4000-8000-000000000005";
    let mut image = rig.image.clone();
    image["disk"] = json!(base);
    image["format"] = json!("qcow2");
    let on = request(&rig, uid, "PoweredOn", Some(image));
    settle(&backend, &on, PowerState::PoweredOn).await.unwrap();
    let disk = rig.machine_dir(uid).join("disk.qcow2");
    let info = std::process::Command::new("qemu-img")
        .args(["info", "--output=json"])
        .arg(&disk)
        .output()
        .unwrap();
    let info: Value = serde_json::from_slice(&info.stdout).expect("qemu-img info");
    assert_eq!(info["backing-filename"], json!(base));
    assert_eq!(info["virtual-size"], 1u64 << 30, "diskGiB");
    assert!(
        std::fs::metadata(&disk).unwrap().len() < 1 << 20,
        "not a copy"
    );
    let config = &rig.state(uid).unwrap()["config"];
    assert_eq!(config["disks"][0]["image_type"], "Qcow2");
    assert_eq!(config["disks"][0]["backing_files"], true);
    assert_eq!(backend.delete(&on.identity).await.unwrap(), Deletion::Gone);
    assert!(std::path::Path::new(&base).is_file(), "the image stays");
    rig.assert_conformant();
}

/// Calls `ensure` until the machine settles at `want`, riding out transient errors;
/// returns the transient reasons seen, in order, without repeats.
async fn settle_through(
    backend: &ChBackend,
    req: &MachineRequest,
    want: PowerState,
) -> Vec<String> {
    let started = Instant::now();
    let mut reasons: Vec<String> = Vec::new();
    loop {
        assert!(
            started.elapsed() < WAIT,
            "never settled at {want:?}; saw {reasons:?}"
        );
        match backend.ensure(req).await {
            Ok(obs) if obs.settled_at(want) => return reasons,
            Ok(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(e) if e.is_transient() => {
                if reasons.last() != Some(&e.reason) {
                    reasons.push(e.reason.clone());
                }
                tokio::time::sleep(
                    e.retry_after
                        .unwrap_or(Duration::from_millis(100))
                        .min(Duration::from_millis(500)),
                )
                .await;
            }
            Err(e) => panic!("terminal: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_vmm_is_killed_and_restarted() {
    let rig = ChRig::new(FAKE, Guest::Exit);
    let backend = backend(&rig, &[("apiTimeout", "300ms"), ("hangTimeout", "1s")]);
    let uid = "0c0ffee0-0000-4000-8000-000000000006";
    let on = request(&rig, uid, "PoweredOn", None);
    settle(&backend, &on, PowerState::PoweredOn).await.unwrap();
    let first = rig.vmm_pids(uid);
    assert_eq!(first.len(), 1);
    // Frozen: alive, socket open, no answers.
    let status = std::process::Command::new("kill")
        .args(["-STOP", &first[0].to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let reasons = settle_through(&backend, &on, PowerState::PoweredOn).await;
    // In this order (a reason may repeat if a reconcile lands mid-kill).
    let mut wanted = ["VMMUnreachable", "VMMHung", "VMMExited"]
        .into_iter()
        .peekable();
    for reason in &reasons {
        if wanted.peek() == Some(&reason.as_str()) {
            wanted.next();
        }
    }
    assert!(wanted.peek().is_none(), "{reasons:?}");
    assert_eq!(reasons[0], "VMMUnreachable", "{reasons:?}");
    let second = rig.vmm_pids(uid);
    assert_eq!(second.len(), 1);
    assert_ne!(second, first, "a new VMM");
    assert_eq!(rig.state(uid).unwrap()["restarts"], 1);
    assert_eq!(backend.delete(&on.identity).await.unwrap(), Deletion::Gone);
    assert!(rig.all_vmm_pids().is_empty());
    rig.assert_conformant();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_classified() {
    let rig = ChRig::new(FAKE, Guest::Exit);
    let backend_ = backend(&rig, &[]);
    let uid = "0c0ffee0-0000-4000-8000-000000000003";
    // A kernel that is not there: the fake cannot boot (500) → terminal BootFailed.
    if rig.is_fake() {
        let mut image = rig.image.clone();
        image["kernel"] = json!("/nonexistent/vmlinux");
        let bad = request(&rig, uid, "PoweredOn", Some(image));
        let e = backend_.ensure(&bad).await.unwrap_err();
        assert_eq!(
            (e.reason.as_str(), e.is_transient()),
            ("BootFailed", false),
            "{e}"
        );
        assert!(e.message.contains("/nonexistent/vmlinux"), "{e}");
        assert_eq!(
            backend_.delete(&bad.identity).await.unwrap(),
            Deletion::Gone
        );
    }
    // A missing image disk → terminal ImageNotFound, nothing left behind.
    let mut image = rig.image.clone();
    image["disk"] = json!("/nonexistent/disk.raw");
    let e = backend_
        .ensure(&request(&rig, uid, "PoweredOn", Some(image)))
        .await
        .unwrap_err();
    assert_eq!(
        (e.reason.as_str(), e.is_transient()),
        ("ImageNotFound", false)
    );
    assert!(!rig.machine_dir(uid).exists());
    // No such binary → terminal BinaryNotFound, from check and ensure.
    let missing = backend(&rig, &[("binary", "/nonexistent/cloud-hypervisor")]);
    let e = missing.check().await.unwrap_err();
    assert_eq!(
        (e.reason.as_str(), e.is_transient()),
        ("BinaryNotFound", false)
    );
    let e = missing
        .ensure(&request(&rig, uid, "PoweredOn", None))
        .await
        .unwrap_err();
    assert_eq!(e.reason, "BinaryNotFound");
    // A state directory too long for a unix socket path → terminal StateDirTooLong.
    let long = rig.state_dir.join("x".repeat(80));
    let mut settings = rig.settings();
    settings.insert("binary".into(), rig.binary.to_string_lossy().into_owned());
    let deep = ChFactory::new()
        .connect_ch(&Connection {
            class: ProviderClass::CloudHypervisor,
            endpoint: format!("local://{}", long.display()),
            credentials: BTreeMap::new(),
            ca_bundle: None,
            insecure_skip_tls_verify: false,
            settings,
        })
        .unwrap();
    let req = request(&rig, uid, "PoweredOn", None);
    let e = deep.ensure(&req).await.unwrap_err();
    assert_eq!(
        (e.reason.as_str(), e.is_transient()),
        ("StateDirTooLong", false)
    );
    assert_eq!(deep.delete(&req.identity).await.unwrap(), Deletion::Gone);
    // A remote endpoint is not supported: terminal at connect.
    let e = ChFactory::new()
        .connect_ch(&Connection {
            class: ProviderClass::CloudHypervisor,
            endpoint: "https://host:8443".into(),
            credentials: BTreeMap::new(),
            ca_bundle: None,
            insecure_skip_tls_verify: false,
            settings: BTreeMap::new(),
        })
        .unwrap_err();
    assert_eq!(e.reason, "UnsupportedEndpoint");
    assert!(rig.all_vmm_pids().is_empty());
    rig.assert_conformant();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fake_vmm_records_and_refuses_requests_outside_the_openapi_document() {
    let rig = ChRig::new(FAKE, Guest::Exit);
    if !rig.is_fake() {
        return;
    }
    // Start one VMM as the backend would, then speak to it out of spec.
    let backend = backend(&rig, &[]);
    let uid = "0c0ffee0-0000-4000-8000-000000000004";
    let on = request(&rig, uid, "PoweredOn", None);
    settle(&backend, &on, PowerState::PoweredOn).await.unwrap();
    rig.assert_conformant();
    let client = banlieue_backend_cloud_hypervisor::client::VmmClient::new(
        rig.machine_dir(uid).join("api.sock"),
        Duration::from_secs(5),
    );
    // A field the document does not know, and a wrong type.
    let bad = json!({"payload": {"kernel": "/k"}, "cpus": {"boot_vcpus": "2", "max_vcpus": 2}, "colour": "red"});
    let e = client.put("vm.resize", Some(&bad)).await.unwrap_err();
    assert_eq!(e.status(), Some(400), "{e:?}");
    let e = client.put("vm.create", Some(&bad)).await.unwrap_err();
    assert_eq!(e.status(), Some(400), "{e:?}");
    // An operation that does not exist.
    let e = client.put("vm.teleport", None).await.unwrap_err();
    assert_eq!(e.status(), Some(404), "{e:?}");
    let violations: Vec<String> = rig
        .exchanges()
        .iter()
        .flat_map(|x| x["violations"].as_array().cloned().unwrap_or_default())
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    for needle in [
        "request.colour: property not in the schema",
        "request.payload: property not in the schema",
        "request.cpus: property not in the schema",
        "request.cpus.boot_vcpus: expected an integer",
        "PUT /api/v1/vm.teleport: no such operation",
    ] {
        assert!(
            violations.iter().any(|v| v.contains(needle)),
            "{needle} not in {violations:#?}"
        );
    }
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rig.assert_conformant()));
    assert!(
        caught.is_err(),
        "the rig fails a test whose backend left the document"
    );
    assert_eq!(backend.delete(&on.identity).await.unwrap(), Deletion::Gone);
}

// ---------------------------------------------------------------------------------
// Through the operator.

async fn world(prefix: &str, rig: &ChRig) -> (TestNamespace, Operator) {
    let ns = fixtures(prefix, rig).await;
    let operator = start_operator(&ns);
    (ns, operator)
}

/// A namespace with a `cloud-hypervisor` Provider `ch` on the rig, a class and an image.
async fn fixtures(prefix: &str, rig: &ChRig) -> TestNamespace {
    let ns = banlieue_testenv::namespace(prefix).await;
    let objects = [
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
    for object in &objects {
        apply(&ns.client, &ns.name, object).await.expect("fixture");
    }
    ns
}

fn start_operator(ns: &TestNamespace) -> Operator {
    let mut registry = BackendRegistry::default();
    registry.register(ProviderClass::CloudHypervisor, Arc::new(ChFactory::new()));
    Operator::start_with_registry(
        ns.client.clone(),
        &ns.name,
        registry,
        Arc::new(SimFactory::new()),
        Duration::from_secs(5),
    )
}

fn vm(ns: &TestNamespace, name: &str, mac: &str) -> Value {
    json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": name},
        "spec": {"classRef": {"name": format!("{}-small", ns.name)},
                 "imageRef": {"name": format!("{}-debian", ns.name)},
                 "networks": [{"name": "eth0", "networkClass": "lan", "macAddress": mac}]}
    })
}

fn is_ready(vm: &VirtualMachine) -> bool {
    vm.status
        .as_ref()
        .is_some_and(|s| conditions::is_true(&s.conditions, "Ready"))
}

fn power(vm: &VirtualMachine) -> Option<PowerState> {
    vm.status.as_ref().and_then(|s| s.power_state)
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

/// The UID of the CloudHypervisorMachine realising VM `name` (its directory's name).
async fn machine_uid(ns: &TestNamespace, name: &str) -> String {
    let machines: Api<CloudHypervisorMachine> = ns.api();
    let machine = wait_for(&machines, name, WAIT, |m| m.metadata.uid.is_some()).await;
    machine.metadata.uid.unwrap()
}

fn ready_reason(machine: &CloudHypervisorMachine) -> Option<(String, String, String)> {
    let status = machine.status.as_ref()?;
    let c = conditions::get(&status.conditions, "Ready")?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_virtual_machine_boots_powers_off_and_on_and_is_deleted() {
    let rig = ChRig::new(FAKE, Guest::Exit);
    let (ns, _operator) = world("ch-life", &rig).await;
    let providers: Api<Provider> = ns.api();
    let provider = wait_for(&providers, "ch", WAIT, |p| {
        p.status
            .as_ref()
            .is_some_and(|s| conditions::is_true(&s.conditions, "Ready"))
    })
    .await;
    let status = provider.status.unwrap();
    if rig.is_fake() {
        assert_eq!(
            status.version.as_deref(),
            Some("Cloud Hypervisor v48.0.0-fake")
        );
    }
    assert_eq!(status.failure_domains.len(), 1);
    let host = &status.failure_domains[0];
    assert_eq!(host.name, "ch-host-1");
    assert_eq!(host.storage_classes, ["local"]);
    assert_eq!(host.network_classes, ["lan"]);

    rig.lease("52:54:00:c0:ff:10", "10.99.0.10", "web-1");
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "user-data"},
                        "stringData": {"cloud-init": "#cloud-config\nruncmd: [echo from-banlieue]\n",
                                       "net": "version: 2\nethernets: {}\n"}});
    apply(&ns.client, &ns.name, &secret).await.unwrap();
    let mut object = vm(&ns, "web-1", "52:54:00:c0:ff:10");
    object["spec"]["bootstrap"] = json!({
        "format": "cloud-config",
        "userData": {"name": "user-data", "key": "cloud-init"},
        "networkConfig": {"name": "user-data", "key": "net"}
    });
    let started = Instant::now();
    apply(&ns.client, &ns.name, &object).await.unwrap();
    let vms: Api<VirtualMachine> = ns.api();
    let ready = wait_for(&vms, "web-1", WAIT, |v| {
        is_ready(v)
            && v.status
                .as_ref()
                .is_some_and(|s| s.addresses.iter().any(|a| a.address == "10.99.0.10"))
    })
    .await;
    println!("VirtualMachine create → Ready in {:?}", started.elapsed());
    let uid = machine_uid(&ns, "web-1").await;
    assert_eq!(
        ready.status.as_ref().and_then(|s| s.provider_id.as_deref()),
        Some(&*format!("cloud-hypervisor://{uid}"))
    );
    assert_eq!(rig.vmm_pids(&uid).len(), 1, "one VMM started");
    let config = &rig.state(&uid).unwrap()["config"];
    assert_eq!(config["cpus"]["boot_vcpus"], 1);
    assert_eq!(config["memory"]["size"], 512u64 << 20);
    assert_eq!(config["net"][0]["mac"], "52:54:00:c0:ff:10");
    // The bootstrap data reached the guest's NoCloud seed.
    let (label, seed) = banlieue_backend_cloud_hypervisor::seed::read_image(
        &rig.machine_dir(&uid).join("seed.img"),
    )
    .unwrap();
    assert_eq!(label, "CIDATA");
    assert_eq!(
        seed["user-data"],
        b"#cloud-config\nruncmd: [echo from-banlieue]\n"
    );
    assert_eq!(seed["network-config"], b"version: 2\nethernets: {}\n");
    assert!(String::from_utf8_lossy(&seed["meta-data"]).contains("local-hostname: web-1"));

    set_power(&vms, "web-1", "PoweredOff").await;
    wait_for(&vms, "web-1", WAIT, |v| {
        power(v) == Some(PowerState::PoweredOff) && is_ready(v)
    })
    .await;
    if rig.is_fake() {
        assert!(
            rig.vmm_pids(&uid).is_empty(),
            "the VMM exited with its guest"
        );
    }
    set_power(&vms, "web-1", "PoweredOn").await;
    wait_for(&vms, "web-1", WAIT, |v| {
        power(v) == Some(PowerState::PoweredOn) && is_ready(v)
    })
    .await;
    assert_eq!(rig.vmm_pids(&uid).len(), 1);

    vms.delete("web-1", &DeleteParams::default()).await.unwrap();
    wait_gone(&vms, "web-1", WAIT).await;
    let machines: Api<CloudHypervisorMachine> = ns.api();
    wait_gone(&machines, "web-1", WAIT).await;
    assert!(rig.vmm_pids(&uid).is_empty(), "the VMM is gone");
    assert!(!rig.machine_dir(&uid).exists(), "the directory is removed");
    if rig.is_fake() {
        let ops = rig.operations(&uid);
        for op in [
            "vm.create",
            "vm.boot",
            "vm.info",
            "vm.power-button",
            "vm.delete",
            "vmm.shutdown",
        ] {
            assert!(ops.contains(&op.to_owned()), "{op} never sent: {ops:?}");
        }
        rig.assert_conformant();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_operator_finds_its_vmms_again() {
    let rig = ChRig::new(FAKE, Guest::Exit);
    let (ns, operator) = world("ch-restart", &rig).await;
    let vms: Api<VirtualMachine> = ns.api();
    for (name, mac) in [("a-1", "52:54:00:c0:ff:21"), ("a-2", "52:54:00:c0:ff:22")] {
        apply(&ns.client, &ns.name, &vm(&ns, name, mac))
            .await
            .unwrap();
    }
    let mut before = BTreeMap::new();
    for name in ["a-1", "a-2"] {
        wait_for(&vms, name, WAIT, is_ready).await;
        let uid = machine_uid(&ns, name).await;
        let pids = rig.vmm_pids(&uid);
        assert_eq!(pids.len(), 1);
        before.insert(uid, pids);
    }
    drop(operator);
    tokio::time::sleep(Duration::from_millis(500)).await;
    // While no operator runs, the VMMs keep running.
    for (uid, pids) in &before {
        assert_eq!(&rig.vmm_pids(uid), pids);
    }
    let _operator = start_operator(&ns);
    // Let the new operator reconcile everything (its first pass and a power flip).
    set_power(&vms, "a-2", "Suspended").await;
    wait_for(&vms, "a-2", WAIT, |v| {
        power(v) == Some(PowerState::Suspended) && is_ready(v)
    })
    .await;
    set_power(&vms, "a-2", "PoweredOn").await;
    wait_for(&vms, "a-2", WAIT, |v| {
        power(v) == Some(PowerState::PoweredOn) && is_ready(v)
    })
    .await;
    wait_for(&vms, "a-1", WAIT, is_ready).await;
    for (uid, pids) in &before {
        assert_eq!(&rig.vmm_pids(uid), pids, "the same VMM, no second one");
        let ops = rig.operations(uid);
        assert_eq!(count(&ops, "vm.create"), 1, "{ops:?}");
        assert_eq!(rig.state(uid).unwrap()["restarts"], 0);
    }
    assert_eq!(rig.all_vmm_pids().len(), 2, "no duplicates");
    rig.assert_conformant();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_vmm_is_reported_and_restarted_only_when_the_machine_should_run() {
    // The guest powers off without the VMM exiting, so a VMM is there to kill while off.
    let rig = ChRig::new(FAKE, Guest::Shutdown);
    let (ns, _operator) = world("ch-kill", &rig).await;
    let vms: Api<VirtualMachine> = ns.api();
    let machines: Api<CloudHypervisorMachine> = ns.api();
    apply(&ns.client, &ns.name, &vm(&ns, "k-1", "52:54:00:c0:ff:31"))
        .await
        .unwrap();
    wait_for(&vms, "k-1", WAIT, is_ready).await;
    let uid = machine_uid(&ns, "k-1").await;
    let first = rig.vmm_pids(&uid);
    assert_eq!(first.len(), 1);

    // Killed while it should run: reported, then started again, the VM booted anew.
    kill(first[0]);
    let reported = wait_for(&machines, "k-1", WAIT, |m| {
        ready_reason(m).is_some_and(|(s, r, _)| s == "False" && r == "VMMExited")
    })
    .await;
    let (_, _, message) = ready_reason(&reported).unwrap();
    assert!(message.contains(&format!("pid {}", first[0])), "{message}");
    // The machine (not the VM, whose status may lag) says Ready again once restarted.
    wait_for(&machines, "k-1", WAIT, |m| {
        ready_reason(m).is_some_and(|(s, _, _)| s == "True")
            && m.status.as_ref().and_then(|s| s.power_state) == Some(PowerState::PoweredOn)
    })
    .await;
    let second = rig.vmm_pids(&uid);
    assert_eq!(second.len(), 1);
    assert_ne!(second, first);
    assert_eq!(rig.state(&uid).unwrap()["restarts"], 1);

    // Killed while it should be off: it stays off, nothing is started.
    set_power(&vms, "k-1", "PoweredOff").await;
    wait_for(&vms, "k-1", WAIT, |v| {
        is_ready(v) && power(v) == Some(PowerState::PoweredOff)
    })
    .await;
    if rig.is_fake() {
        assert_eq!(
            rig.vmm_pids(&uid),
            second,
            "the VMM stays with its VM shut down"
        );
        kill(second[0]);
    }
    // (A real VMM exits with its guest: then there is nothing to kill, and the
    // check below is that nothing is started while the machine is off.)
    // Several reconciles (sync period 5s): the machine stays off, no VMM appears.
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert!(rig.vmm_pids(&uid).is_empty(), "no restart while off");
    let machine = machines.get("k-1").await.unwrap();
    assert_eq!(
        machine.status.as_ref().and_then(|s| s.power_state),
        Some(PowerState::PoweredOff)
    );
    assert_eq!(ready_reason(&machine).map(|r| r.0).as_deref(), Some("True"));
    assert_eq!(rig.state(&uid).unwrap()["restarts"], 1);

    // And it powers on again on request.
    set_power(&vms, "k-1", "PoweredOn").await;
    wait_for(&vms, "k-1", WAIT, |v| {
        is_ready(v) && power(v) == Some(PowerState::PoweredOn)
    })
    .await;
    assert_eq!(rig.vmm_pids(&uid).len(), 1);
    vms.delete("k-1", &DeleteParams::default()).await.unwrap();
    wait_gone(&machines, "k-1", WAIT).await;
    assert!(rig.all_vmm_pids().is_empty());
    rig.assert_conformant();
}

/// The operator as a process of its own (the `ch-operator` bin); killed on drop.
struct OperatorProcess(std::process::Child);

impl OperatorProcess {
    fn start(ns: &TestNamespace, log: &std::path::Path) -> Self {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_ch-operator"))
            .arg(banlieue_testenv::kubeconfig_path())
            .arg(&ns.name)
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting ch-operator");
        Self(child)
    }

    fn kill(mut self) {
        kill(self.0.id());
        let _ = self.0.wait();
    }
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The parent pid of a process.
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_operator_process_leaves_its_vmms_running_and_the_next_adopts_them() {
    let rig = ChRig::new(FAKE, Guest::Exit);
    let ns = fixtures("ch-opkill", &rig).await;
    let log = rig.state_dir.with_file_name("operator.log");
    let first = OperatorProcess::start(&ns, &log);
    let first_pid = first.0.id();
    let vms: Api<VirtualMachine> = ns.api();
    apply(&ns.client, &ns.name, &vm(&ns, "p-1", "52:54:00:c0:ff:41"))
        .await
        .unwrap();
    wait_for(&vms, "p-1", WAIT, is_ready).await;
    let uid = machine_uid(&ns, "p-1").await;
    let pids = rig.vmm_pids(&uid);
    assert_eq!(pids.len(), 1);
    assert_eq!(
        parent_of(pids[0]),
        Some(first_pid),
        "the operator started it"
    );

    // kill -9 the operator: its VMM lives on, handed to another parent.
    first.kill();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(rig.vmm_pids(&uid), pids, "the VMM outlives the operator");
    assert_ne!(parent_of(pids[0]), Some(first_pid));

    // The next operator adopts it: same process, no second vm.create, power still works.
    let _second = OperatorProcess::start(&ns, &log);
    set_power(&vms, "p-1", "Suspended").await;
    wait_for(&vms, "p-1", WAIT, |v| {
        power(v) == Some(PowerState::Suspended) && is_ready(v)
    })
    .await;
    set_power(&vms, "p-1", "PoweredOn").await;
    wait_for(&vms, "p-1", WAIT, |v| {
        power(v) == Some(PowerState::PoweredOn) && is_ready(v)
    })
    .await;
    assert_eq!(rig.vmm_pids(&uid), pids);
    let ops = rig.operations(&uid);
    assert_eq!(count(&ops, "vm.create"), 1, "{ops:?}");
    assert_eq!(rig.state(&uid).unwrap()["restarts"], 0);

    // And deletes it, though it is not its child.
    vms.delete("p-1", &DeleteParams::default()).await.unwrap();
    let machines: Api<CloudHypervisorMachine> = ns.api();
    wait_gone(&machines, "p-1", WAIT).await;
    assert!(rig.vmm_pids(&uid).is_empty());
    assert!(!rig.machine_dir(&uid).exists());
    rig.assert_conformant();
}

/// Host paths are confined to the Provider's `imageDirectories`: a machine whose
/// image disk is `/etc/shadow`, or a symlink in the allowed directory pointing out of
/// it, or whose kernel is a device node, is refused with `PathNotAllowed` naming the
/// path and the allowed directories, and nothing is made on the host (no machine
/// directory, no VMM). A machine on the rig's own image beside them is made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_paths_outside_the_allowed_directories_are_refused_before_anything_is_made() {
    let rig = ChRig::new(FAKE, Guest::Exit);
    let (ns, _operator) = world("ch-paths", &rig).await;
    let machines: Api<CloudHypervisorMachine> = ns.api();
    let escape = rig.root().join("escape.raw");
    std::os::unix::fs::symlink("/etc/shadow", &escape).expect("a symlink out");
    let machine = |name: &str, field: &str, path: &str| {
        let mut image = rig.image.clone();
        image[field] = json!(path);
        json!({"apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "CloudHypervisorMachine",
               "metadata": {"name": name},
               "spec": {"providerRef": {"name": "ch"}, "image": image, "cpus": 1, "memoryMiB": 256,
                        "network": [{"macAddress": "52:54:00:c0:ff:21"}]}})
    };
    let cases = [
        ("shadow", "disk", "/etc/shadow".to_owned(), "/etc/shadow"),
        (
            "link",
            "disk",
            escape.to_string_lossy().into_owned(),
            "/etc/shadow",
        ),
        ("device", "kernel", "/dev/null".to_owned(), "/dev/null"),
    ];
    for (name, field, path, _) in &cases {
        apply(&ns.client, &ns.name, &machine(name, field, path))
            .await
            .unwrap();
    }
    apply(
        &ns.client,
        &ns.name,
        &machine("fine", "disk", rig.image["disk"].as_str().unwrap()),
    )
    .await
    .unwrap();
    let allowed = rig.root().display().to_string();
    for (name, field, path, resolved) in &cases {
        let refused = wait_for(&machines, name, WAIT, |m| {
            ready_reason(m).is_some_and(|(_, _, message)| message.starts_with("PathNotAllowed"))
        })
        .await;
        let (status, reason, message) = ready_reason(&refused).unwrap();
        eprintln!("{name}: {reason}: {message}");
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("False", "TerminalFailure")
        );
        assert!(
            message.contains(&format!("image's {field} {path}"))
                && message.contains(&format!("resolving to {resolved}"))
                && message.contains(&allowed),
            "{name}: {message}"
        );
        assert!(refused.spec.provider_id.is_none(), "{name}: no VM");
        let uid = refused.metadata.uid.unwrap();
        assert!(
            !rig.machine_dir(&uid).exists()
                && !rig.state_dir.join(format!("{uid}.partial")).exists(),
            "{name}: nothing made on the host"
        );
        assert!(rig.vmm_pids(&uid).is_empty(), "{name}: no VMM");
    }
    let fine = wait_for(&machines, "fine", WAIT, |m| m.spec.provider_id.is_some()).await;
    assert!(rig.machine_dir(&fine.metadata.uid.unwrap()).exists());
    for (name, ..) in &cases {
        machines
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
        wait_gone(&machines, name, WAIT).await;
    }
    machines
        .delete("fine", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&machines, "fine", WAIT).await;
}

// ---------------------------------------------------------------------------------
// Changes to a machine that runs (issue 38).

/// `GET /api/v1/vm.info` on a VMM's socket, by hand (not through the backend's
/// client): what the VMM itself says it runs.
fn vm_info(rig: &ChRig, uid: &str) -> Value {
    use std::io::{Read, Write};
    let socket = rig.machine_dir(uid).join("api.sock");
    let mut stream = std::os::unix::net::UnixStream::connect(&socket).expect("the VMM's socket");
    stream
        .write_all(
            b"GET /api/v1/vm.info HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\nConnection: close\r\n\r\n",
        )
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    serde_json::from_str(body).expect("vm.info JSON")
}

/// A condition's (status, reason, message), once it speaks of the machine's generation.
fn condition(m: &CloudHypervisorMachine, type_: &str) -> Option<(String, String, String)> {
    let status = m.status.as_ref()?;
    let c = conditions::get(&status.conditions, type_)?;
    (c.observed_generation == m.metadata.generation)
        .then(|| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

fn running(m: &CloudHypervisorMachine) -> Option<&banlieue_sdk::api::resources::MachineResources> {
    m.status.as_ref()?.resources.as_ref()?.running.as_ref()
}

fn up_to_date(m: &CloudHypervisorMachine) -> bool {
    condition(m, "UpToDate").is_some_and(|(s, ..)| s == "True")
}

async fn patch_spec(machines: &Api<CloudHypervisorMachine>, name: &str, spec: Value) {
    machines
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": spec})),
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_machine_is_resized_live_within_its_headroom_and_beyond_it_at_its_next_boot() {
    let rig = ChRig::new(FAKE, Guest::Exit);
    assert!(rig.is_fake(), "reads the fake's exchanges");
    let (ns, _operator) = world("ch-change", &rig).await;
    let providers: Api<Provider> = ns.api();
    let provider = wait_for(&providers, "ch", WAIT, |p| {
        p.status.as_ref().is_some_and(|s| {
            conditions::is_true(&s.conditions, "Ready") && s.backend_capabilities.is_some()
        })
    })
    .await;
    let published = provider
        .status
        .unwrap()
        .backend_capabilities
        .unwrap()
        .changes;
    assert_eq!(
        published,
        banlieue_backend_cloud_hypervisor::changes::change_table()
    );

    let machines: Api<CloudHypervisorMachine> = ns.api();
    let object = json!({"apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "CloudHypervisorMachine",
        "metadata": {"name": "grow"},
        "spec": {"providerRef": {"name": "ch"}, "image": rig.image,
                 "cpus": 2, "maxCPUs": 4, "memoryMiB": 1024, "maxMemoryMiB": 2048, "diskGiB": 1,
                 "additionalDisks": [{"name": "data", "sizeGiB": 1}],
                 "network": [{"macAddress": "52:54:00:c0:ff:31"}]}});
    apply(&ns.client, &ns.name, &object).await.unwrap();
    let made = wait_for(&machines, "grow", WAIT, |m| {
        up_to_date(m) && running(m).is_some_and(|r| r.cpus == 2)
    })
    .await;
    let uid = made.metadata.uid.clone().unwrap();
    let r = running(&made).unwrap();
    println!("made: {r:?}");
    assert_eq!(
        (
            r.cpus,
            r.max_cpus,
            r.memory_mib,
            r.max_memory_mib,
            r.networks
        ),
        (2, Some(4), 1024, Some(2048), 1)
    );
    assert_eq!(
        (r.data_disks[0].name.as_str(), r.data_disks[0].size_gib),
        ("data", 1)
    );
    let info = vm_info(&rig, &uid);
    assert_eq!(
        info["config"]["cpus"],
        json!({"boot_vcpus": 2, "max_vcpus": 4,
               "topology": {"threads_per_core": 1, "cores_per_die": 1, "dies_per_package": 1, "packages": 4}})
    );
    assert_eq!(info["config"]["memory"]["hotplug_size"], 1u64 << 30);
    let pid = rig.vmm_pids(&uid);
    assert_eq!(pid.len(), 1);

    // Live: vCPUs up within maxCPUs, then one removed.
    for cpus in [4u32, 3] {
        patch_spec(&machines, "grow", json!({"cpus": cpus})).await;
        let m = wait_for(&machines, "grow", WAIT, |m| {
            up_to_date(m) && running(m).is_some_and(|r| r.cpus == cpus)
        })
        .await;
        let info = vm_info(&rig, &uid);
        println!("cpus {cpus}: vm.info cpus {}", info["config"]["cpus"]);
        assert_eq!(info["config"]["cpus"]["boot_vcpus"], cpus);
        assert_eq!(info["state"], "Running");
        assert_eq!(condition(&m, "RestartRequired").unwrap().0, "False");
    }
    // Live: memory within maxMemoryMiB (512 MiB = four 128 MiB blocks).
    patch_spec(&machines, "grow", json!({"memoryMiB": 1536})).await;
    let m = wait_for(&machines, "grow", WAIT, |m| {
        up_to_date(m) && running(m).is_some_and(|r| r.memory_mib == 1536)
    })
    .await;
    let info = vm_info(&rig, &uid);
    println!(
        "memoryMiB 1536: vm.info memory.size {} memory_actual_size {}",
        info["config"]["memory"]["size"], info["memory_actual_size"]
    );
    assert_eq!(info["config"]["memory"]["size"], 1536u64 << 20);
    assert_eq!(info["memory_actual_size"], 1536u64 << 20);
    assert_eq!(
        running(&m).unwrap().max_memory_mib,
        Some(2048),
        "the room is what it was"
    );
    // Live: the data disk grows.
    patch_spec(
        &machines,
        "grow",
        json!({"additionalDisks": [{"name": "data", "sizeGiB": 2}]}),
    )
    .await;
    wait_for(&machines, "grow", WAIT, |m| {
        up_to_date(m) && running(m).is_some_and(|r| r.data_disks[0].size_gib == 2)
    })
    .await;
    let data = rig.machine_dir(&uid).join("data-0.raw");
    assert_eq!(std::fs::metadata(&data).unwrap().len(), 2 << 30);
    let resized: Vec<Value> = rig
        .exchanges()
        .into_iter()
        .filter(|e| e["path"] == "/api/v1/vm.resize" || e["path"] == "/api/v1/vm.resize-disk")
        .map(|e| json!({"path": e["path"], "request": e["request"], "status": e["status"]}))
        .collect();
    println!("resize requests: {resized:#?}");
    assert_eq!(
        resized,
        [
            json!({"path": "/api/v1/vm.resize", "request": {"desired_vcpus": 4}, "status": 204}),
            json!({"path": "/api/v1/vm.resize", "request": {"desired_vcpus": 3}, "status": 204}),
            json!({"path": "/api/v1/vm.resize", "request": {"desired_ram": 1536u64 << 20}, "status": 204}),
            json!({"path": "/api/v1/vm.resize-disk", "request": {"id": "data0", "desired_size": 2u64 << 30}, "status": 204}),
        ]
    );
    // Live: an interface hot-plugged at the end, then unplugged.
    let nic = |mac: &str| json!({"macAddress": mac});
    for (nics, count) in [
        (
            json!([nic("52:54:00:c0:ff:31"), nic("52:54:00:c0:ff:32")]),
            2u32,
        ),
        (json!([nic("52:54:00:c0:ff:31")]), 1),
    ] {
        patch_spec(&machines, "grow", json!({"network": nics})).await;
        wait_for(&machines, "grow", WAIT, |m| {
            up_to_date(m) && running(m).is_some_and(|r| r.networks == count)
        })
        .await;
        let net = vm_info(&rig, &uid)["config"]["net"].clone();
        println!("networks {count}: vm.info net {net}");
        let macs: Vec<&str> = net
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["mac"].as_str().unwrap())
            .collect();
        assert_eq!(
            macs,
            ["52:54:00:c0:ff:31", "52:54:00:c0:ff:32"][..count as usize]
        );
    }
    let plugged: Vec<Value> = rig
        .exchanges()
        .into_iter()
        .filter(|e| e["path"] == "/api/v1/vm.add-net" || e["path"] == "/api/v1/vm.remove-device")
        .map(|e| json!({"path": e["path"], "id": e["request"]["id"], "status": e["status"]}))
        .collect();
    assert_eq!(
        plugged,
        [
            json!({"path": "/api/v1/vm.add-net", "id": "net1", "status": 200}),
            json!({"path": "/api/v1/vm.remove-device", "id": "net1", "status": 204}),
        ]
    );
    assert_eq!(
        rig.state(&uid).unwrap()["config"]["net"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(rig.vmm_pids(&uid), pid, "all live: the same VMM");

    // Beyond the headroom: written for the next boot, the machine keeps running.
    patch_spec(
        &machines,
        "grow",
        json!({"cpus": 6, "maxCPUs": 8, "memoryMiB": 3072, "maxMemoryMiB": 4096}),
    )
    .await;
    let waiting = wait_for(&machines, "grow", WAIT, |m| {
        condition(m, "RestartRequired").is_some_and(|(s, ..)| s == "True")
    })
    .await;
    let (_, reason, message) = condition(&waiting, "UpToDate").unwrap();
    let (_, _, restart) = condition(&waiting, "RestartRequired").unwrap();
    println!("beyond the headroom: UpToDate {reason}: {message}; RestartRequired: {restart}");
    assert_eq!(reason, "RestartRequired");
    assert!(
        restart.contains("cpus 3 → 6 waits for the next boot")
            && restart.contains("memoryMiB 1536 → 3072 waits for the next boot"),
        "{restart}"
    );
    let pending = &waiting
        .status
        .as_ref()
        .unwrap()
        .resources
        .as_ref()
        .unwrap()
        .pending;
    assert_eq!(pending.len(), 2, "{pending:?}");
    let info = vm_info(&rig, &uid);
    assert_eq!(
        info["config"]["cpus"],
        json!({"boot_vcpus": 3, "max_vcpus": 4,
               "topology": {"threads_per_core": 1, "cores_per_die": 1, "dies_per_package": 1, "packages": 4}}),
        "not live"
    );
    assert_eq!(info["config"]["memory"]["size"], 1536u64 << 20);
    let staged = &rig.state(&uid).unwrap()["config"];
    assert_eq!(
        staged["cpus"],
        json!({"boot_vcpus": 6, "max_vcpus": 8, "topology": {"threads_per_core": 1, "cores_per_die": 1, "dies_per_package": 1, "packages": 8}})
    );
    assert_eq!(
        staged["memory"],
        json!({"size": 3072u64 << 20, "hotplug_size": 1024u64 << 20})
    );
    assert_eq!(rig.vmm_pids(&uid), pid, "still the same VMM");
    // The power cycle applies it.
    patch_spec(&machines, "grow", json!({"powerState": "PoweredOff"})).await;
    wait_for(&machines, "grow", WAIT, |m| {
        m.status.as_ref().and_then(|s| s.power_state) == Some(PowerState::PoweredOff)
    })
    .await;
    patch_spec(&machines, "grow", json!({"powerState": "PoweredOn"})).await;
    let cycled = wait_for(&machines, "grow", WAIT, |m| {
        m.status.as_ref().and_then(|s| s.power_state) == Some(PowerState::PoweredOn)
            && up_to_date(m)
            && condition(m, "RestartRequired").is_some_and(|(s, ..)| s == "False")
    })
    .await;
    let r = running(&cycled).unwrap();
    println!("after the power cycle: {r:?}");
    assert_eq!(
        (r.cpus, r.max_cpus, r.memory_mib, r.max_memory_mib),
        (6, Some(8), 3072, Some(4096))
    );
    let info = vm_info(&rig, &uid);
    assert_eq!(
        info["config"]["cpus"],
        json!({"boot_vcpus": 6, "max_vcpus": 8,
               "topology": {"threads_per_core": 1, "cores_per_die": 1, "dies_per_package": 1, "packages": 8}})
    );
    assert_eq!(info["config"]["memory"]["size"], 3072u64 << 20);
    let pid = rig.vmm_pids(&uid);
    assert_eq!(pid.len(), 1, "a new VMM made from the next boot's config");

    // Hostile: a Never field (a data disk added) with a memory shrink (NextBoot).
    patch_spec(
        &machines,
        "grow",
        json!({"memoryMiB": 2048, "additionalDisks": [{"name": "data", "sizeGiB": 2}, {"name": "extra", "sizeGiB": 1}]}),
    )
    .await;
    let refused = wait_for(&machines, "grow", WAIT, |m| {
        condition(m, "UpToDate").is_some_and(|(_, r, _)| r == "ChangeRefused")
            && condition(m, "RestartRequired").is_some_and(|(s, ..)| s == "True")
    })
    .await;
    let (status, _, message) = condition(&refused, "UpToDate").unwrap();
    let (_, _, restart) = condition(&refused, "RestartRequired").unwrap();
    println!("hostile: UpToDate {status} ChangeRefused: {message}; RestartRequired: {restart}");
    assert_eq!(status, "False");
    assert!(
        message.contains("dataDisks data 2GiB → data 2GiB, extra 1GiB cannot be applied"),
        "{message}"
    );
    assert!(
        restart.contains("memoryMiB 3072 → 2048 waits for the next boot"),
        "{restart}"
    );
    assert!(!restart.contains("dataDisks"), "{restart}");
    // Nothing lost: the same VMM, running with what it had; the disk untouched; no new disk.
    assert!(condition(&refused, "Ready").is_some_and(|(s, ..)| s == "True"));
    assert_eq!(rig.vmm_pids(&uid), pid);
    let info = vm_info(&rig, &uid);
    assert_eq!(info["state"], "Running");
    assert_eq!(info["config"]["cpus"]["boot_vcpus"], 6);
    assert_eq!(
        info["config"]["memory"]["size"],
        3072u64 << 20,
        "a shrink is not live"
    );
    assert_eq!(std::fs::metadata(&data).unwrap().len(), 2 << 30);
    assert!(!rig.machine_dir(&uid).join("data-1.raw").exists());
    assert_eq!(
        rig.state(&uid).unwrap()["config"]["memory"]["size"],
        2048u64 << 20,
        "written for the next boot"
    );
    let r = running(&refused).unwrap();
    assert_eq!((r.cpus, r.memory_mib), (6, 3072));

    rig.assert_conformant();
    machines
        .delete("grow", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&machines, "grow", WAIT).await;
}
