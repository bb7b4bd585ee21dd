//! The libvirt backend end to end: banlieue's controllers against a real apiserver,
//! the backend against a real libvirtd + QEMU (TCG) running in namespaces this test
//! run creates, with the tiny test guest booting, reading its NoCloud seed and taking
//! a DHCP lease. Each test starts its own rig.

use std::future::pending;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use banlieue_backend_libvirt::LibvirtFactory;
use banlieue_backend_sim::SimFactory;
use banlieue_integration_tests::apply;
use banlieue_integration_tests::libvirt::{IMAGE_VOLUME, LibvirtRig, NETWORK, POOL};
use banlieue_integration_tests::operator::{Operator, wait_for, wait_gone};
use banlieue_sdk::api::common::{PowerState, ProviderClass};
use banlieue_sdk::api::infra::libvirt::LibvirtMachine;
use banlieue_sdk::api::{Provider, VirtualMachine};
use banlieue_sdk::async_trait;
use banlieue_sdk::backend::{
    Backend, BackendError, BackendFactory, BackendRegistry, Connection, Deletion, ImageLookup,
    ImageSourceSet, Inventory, MachineIdentity, MachineObservation, MachineRequest,
};
use banlieue_sdk::conditions;
use banlieue_testenv::TestNamespace;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;

/// TCG boots the guest in ~20 s on 2 cores; leave room for a loaded CI machine.
const WAIT: Duration = Duration::from_secs(240);

fn operator(ns: &TestNamespace, factory: Arc<dyn BackendFactory>) -> Operator {
    let mut registry = BackendRegistry::default();
    registry.register(ProviderClass::Libvirt, factory);
    Operator::start_with_registry(
        ns.client.clone(),
        &ns.name,
        registry,
        Arc::new(SimFactory::new()),
        Duration::from_secs(5),
    )
}

/// A namespace with a Provider on the rig, a class and the guest image.
async fn world(rig: &LibvirtRig, prefix: &str) -> TestNamespace {
    let ns = banlieue_testenv::namespace(prefix).await;
    let objects = [
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "host"},
        "spec": {
            "class": "libvirt",
            "connection": {"endpoint": rig.uri},
            "capabilities": {
                "storageClasses": [{"name": "local", "target": {"pool": POOL}}],
                "networkClasses": [{"name": "isolated", "target": {"network": NETWORK}}]
            },
            // TCG explicitly, whatever this machine's /dev/kvm is; a 1 s poll and a
            // generous ACPI timeout (the test asserts the guest powered itself off).
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
    for object in &objects {
        apply(&ns.client, &ns.name, object).await.expect("fixture");
    }
    ns
}

fn vm(ns: &TestNamespace, name: &str) -> serde_json::Value {
    json!({
        "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": name},
        "spec": {"classRef": {"name": format!("{}-tiny", ns.name)},
                 "imageRef": {"name": format!("{}-guest", ns.name)},
                 "networks": [{"name": "eth0", "networkClass": "isolated"}]}
    })
}

fn is_ready(vm: &VirtualMachine) -> bool {
    vm.status
        .as_ref()
        .is_some_and(|s| conditions::is_true(&s.conditions, "Ready"))
}

fn lease_address(vm: &VirtualMachine) -> Option<String> {
    vm.status.as_ref().and_then(|s| {
        s.addresses
            .iter()
            .find(|a| a.address.starts_with("192.168.150."))
            .map(|a| a.address.clone())
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_virtual_machine_boots_gets_a_lease_powers_off_and_on_and_is_deleted() {
    let Some(rig) = LibvirtRig::start() else {
        return;
    };
    let ns = world(&rig, "lv-life").await;
    let _operator = operator(&ns, Arc::new(LibvirtFactory::new()));

    let providers: Api<Provider> = ns.api();
    let provider = wait_for(&providers, "host", WAIT, |p| {
        p.status
            .as_ref()
            .is_some_and(|s| conditions::is_true(&s.conditions, "Ready"))
    })
    .await;
    let status = provider.status.unwrap();
    let version = status.version.clone().unwrap_or_default();
    assert!(
        version.starts_with("QEMU ") && version.contains("domain type qemu"),
        "{version}"
    );
    assert_eq!(status.failure_domains.len(), 1);
    let fd = &status.failure_domains[0];
    assert_eq!(fd.name, "rig-host");
    assert_eq!(fd.storage_classes, ["local"]);
    assert_eq!(fd.network_classes, ["isolated"]);

    let created = Instant::now();
    apply(&ns.client, &ns.name, &vm(&ns, "web-1"))
        .await
        .unwrap();
    let vms: Api<VirtualMachine> = ns.api();
    let ready = wait_for(&vms, "web-1", WAIT, |v| {
        is_ready(v) && lease_address(v).is_some()
    })
    .await;
    let to_ready = created.elapsed();
    let status = ready.status.as_ref().unwrap();
    let address = lease_address(&ready).unwrap();

    // Exactly one domain, whose UUID is the LibvirtMachine's UID and the providerID's.
    let machines: Api<LibvirtMachine> = ns.api();
    let machine = machines.get("web-1").await.unwrap();
    let uid = machine.metadata.uid.clone().unwrap();
    assert_eq!(
        status.provider_id.as_deref(),
        Some(format!("libvirt://{uid}").as_str())
    );
    let domains = rig.domains();
    assert_eq!(domains, [(format!("{}.web-1", ns.name), uid.clone(), true)]);
    let conn = rig.connect();
    let dom = conn.lookup_domain_by_uuid_string(&uid).unwrap();
    let xml = dom.xml_desc(0).unwrap();
    assert!(
        xml.contains(&format!("<banlieue:uid>{uid}</banlieue:uid>")),
        "{xml}"
    );
    assert!(xml.contains("<domain type='qemu'"), "{xml}");

    // The OS disk is an overlay on the image; the seed sits next to it.
    assert_eq!(
        rig.volumes(),
        [
            format!("bnl-{uid}-os.qcow2"),
            format!("bnl-{uid}-seed.img"),
            IMAGE_VOLUME.to_string()
        ]
    );
    let pool = conn.lookup_storage_pool_by_name(POOL).unwrap();
    let os = pool
        .lookup_storage_vol_by_name(&format!("bnl-{uid}-os.qcow2"))
        .unwrap();
    let os_xml = os.xml_desc(0).unwrap();
    assert!(
        os_xml.contains("<backingStore>") && os_xml.contains(IMAGE_VOLUME),
        "{os_xml}"
    );

    // The guest read its seed (instance ID = the machine's UID, hostname) and leased the
    // address the status shows, under that hostname.
    let domain = format!("{}.web-1", ns.name);
    let console = rig.console(&domain);
    assert!(
        console.contains(&format!("instance-id={uid} hostname=web-1")),
        "{console}"
    );
    assert!(
        console.contains(&format!("banlieue-guest: lease {address}/24")),
        "{console}"
    );
    let leases = rig.leases();
    assert!(
        leases.contains(&address) && leases.contains("web-1"),
        "{leases}"
    );
    eprintln!("libvirt: create -> Ready with lease {address} in {to_ready:.1?}");

    // Power off: an ACPI shutdown the guest honours (not a destroy).
    let off = Instant::now();
    set_power(&vms, "web-1", "PoweredOff").await;
    wait_for(&vms, "web-1", WAIT, |v| {
        v.status.as_ref().and_then(|s| s.power_state) == Some(PowerState::PoweredOff)
    })
    .await;
    assert!(!rig.domains()[0].2, "domain shut off");
    let console = rig.console(&domain);
    assert!(console.contains("power button, powering off"), "{console}");
    eprintln!("libvirt: power off in {:.1?}", off.elapsed());

    let on = Instant::now();
    set_power(&vms, "web-1", "PoweredOn").await;
    wait_for(&vms, "web-1", WAIT, |v| {
        is_ready(v)
            && v.status.as_ref().and_then(|s| s.power_state) == Some(PowerState::PoweredOn)
            && lease_address(v).is_some()
    })
    .await;
    assert!(rig.domains()[0].2, "domain running again");
    let ready_again = on.elapsed();
    // dnsmasq still holds the old lease, so Ready can come before the guest is up:
    // wait for the rebooted guest to lease again (the console log restarts per boot).
    let started = Instant::now();
    while !rig.console(&domain).contains("banlieue-guest: lease ") {
        assert!(started.elapsed() < WAIT, "{}", rig.console(&domain));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    eprintln!(
        "libvirt: power on -> Ready in {ready_again:.1?}, guest leased again after {:.1?}",
        on.elapsed()
    );

    let deleting = Instant::now();
    vms.delete("web-1", &DeleteParams::default()).await.unwrap();
    wait_gone(&vms, "web-1", WAIT).await;
    wait_gone(&machines, "web-1", WAIT).await;
    let to_deleted = deleting.elapsed();
    assert!(rig.domains().is_empty(), "{:?}", rig.domains());
    assert_eq!(
        rig.volumes(),
        [IMAGE_VOLUME.to_string()],
        "only the image is left"
    );
    eprintln!("libvirt: delete -> gone (domain, volumes, objects) in {to_deleted:.1?}");
}

/// A backend that defines and starts the domain, then never answers: the operator
/// "dies" between define and the status write.
struct DiesAfterDefine {
    inner: Arc<dyn Backend>,
    armed: Arc<AtomicBool>,
}

#[async_trait]
impl Backend for DiesAfterDefine {
    async fn check(&self) -> Result<Inventory, BackendError> {
        self.inner.check().await
    }
    async fn find_image(&self, sources: &ImageSourceSet) -> Result<ImageLookup, BackendError> {
        self.inner.find_image(sources).await
    }
    async fn ensure(&self, request: &MachineRequest) -> Result<MachineObservation, BackendError> {
        let observation = self.inner.ensure(request).await?;
        if self.armed.swap(false, Ordering::SeqCst) {
            pending::<()>().await;
        }
        Ok(observation)
    }
    async fn observe(
        &self,
        identity: &MachineIdentity,
    ) -> Result<Option<MachineObservation>, BackendError> {
        self.inner.observe(identity).await
    }
    async fn delete(&self, identity: &MachineIdentity) -> Result<Deletion, BackendError> {
        self.inner.delete(identity).await
    }
}

struct DiesAfterDefineFactory(Arc<AtomicBool>);

impl BackendFactory for DiesAfterDefineFactory {
    fn connect(&self, connection: &Connection) -> Result<Arc<dyn Backend>, BackendError> {
        Ok(Arc::new(DiesAfterDefine {
            inner: LibvirtFactory::new().connect(connection)?,
            armed: self.0.clone(),
        }))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_killed_between_define_and_status_write_leaves_exactly_one_domain() {
    let Some(rig) = LibvirtRig::start() else {
        return;
    };
    let ns = world(&rig, "lv-crash").await;
    let armed = Arc::new(AtomicBool::new(true));
    let first = operator(&ns, Arc::new(DiesAfterDefineFactory(armed.clone())));
    apply(&ns.client, &ns.name, &vm(&ns, "db-1")).await.unwrap();

    // Wait until the first operator defined (and started) the domain and hung.
    let started = Instant::now();
    while rig.domains().is_empty() || armed.load(Ordering::SeqCst) {
        assert!(started.elapsed() < WAIT, "no domain was defined");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let machines: Api<LibvirtMachine> = ns.api();
    let machine = machines.get("db-1").await.unwrap();
    assert!(
        machine.spec.provider_id.is_none()
            && machine
                .status
                .as_ref()
                .and_then(|s| s.backend_ref.as_ref())
                .is_none(),
        "the first operator never recorded the domain: {machine:?}"
    );
    drop(first);

    let _second = operator(&ns, Arc::new(LibvirtFactory::new()));
    let vms: Api<VirtualMachine> = ns.api();
    let ready = wait_for(&vms, "db-1", WAIT, |v| {
        is_ready(v) && lease_address(v).is_some()
    })
    .await;
    let uid = machines.get("db-1").await.unwrap().metadata.uid.unwrap();
    assert_eq!(
        ready.status.as_ref().and_then(|s| s.provider_id.clone()),
        Some(format!("libvirt://{uid}"))
    );
    assert_eq!(
        rig.domains(),
        [(format!("{}.db-1", ns.name), uid.clone(), true)]
    );
    assert_eq!(
        rig.volumes(),
        [
            format!("bnl-{uid}-os.qcow2"),
            format!("bnl-{uid}-seed.img"),
            IMAGE_VOLUME.to_string()
        ]
    );

    vms.delete("db-1", &DeleteParams::default()).await.unwrap();
    wait_gone(&vms, "db-1", WAIT).await;
    assert!(rig.domains().is_empty());
    assert_eq!(rig.volumes(), [IMAGE_VOLUME.to_string()]);
}

fn connection(uri: &str) -> Connection {
    Connection {
        class: ProviderClass::Libvirt,
        endpoint: uri.into(),
        credentials: Default::default(),
        ca_bundle: None,
        insecure_skip_tls_verify: false,
        settings: [("domainType".to_string(), "qemu".to_string())].into(),
    }
}

fn request(uid: &str, name: &str, pool: &str, image: &str) -> MachineRequest {
    use banlieue_sdk::api::infra::libvirt::{LibvirtMachineSpec, LibvirtNetworkInterface};
    use banlieue_sdk::api::vm_image::{LibvirtImageSource, PoolVolume};
    use banlieue_sdk::backend::MachineSpec;
    MachineRequest {
        identity: MachineIdentity {
            uid: uid.into(),
            namespace: "direct".into(),
            name: name.into(),
            provider_id: None,
        },
        spec: MachineSpec::Libvirt(LibvirtMachineSpec {
            change_policy: Default::default(),
            provider_ref: None,
            provider_id: None,
            power_state: PowerState::PoweredOff,
            bootstrap: None,
            image: LibvirtImageSource {
                volume: Some(PoolVolume {
                    pool: POOL.into(),
                    name: image.into(),
                }),
                path: None,
                format: Default::default(),
            },
            storage_pool: pool.into(),
            cpus: 1,
            max_cpus: None,
            cores_per_socket: None,
            max_memory_mib: None,
            memory_mib: 128,
            disk_gib: None,
            firmware: banlieue_sdk::api::common::Firmware::Bios,
            cpu_mode: Default::default(),
            additional_disks: vec![],
            network: vec![LibvirtNetworkInterface {
                network: Some(NETWORK.into()),
                ..Default::default()
            }],
        }),
        failure_domain: None,
        bootstrap: None,
        instance_id: None,
        disks_imported: false,
    }
}

/// The backend alone against the rig: errors carry libvirt's reason and class, a
/// foreign domain's name is never taken over, and delete sweeps volumes a crashed
/// create left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_errors_are_classified_and_delete_sweeps_leftovers() {
    let Some(rig) = LibvirtRig::start() else {
        return;
    };
    let backend = LibvirtFactory::new()
        .connect(&connection(&rig.uri))
        .unwrap();
    let uid = "0b0c0d0e-1111-4222-8333-444455556666";

    let inventory = backend.check().await.unwrap();
    let fd = &inventory.failure_domains[0];
    assert!(fd.resources["pool"].contains(POOL), "{fd:?}");
    assert!(fd.resources["network"].contains(NETWORK), "{fd:?}");

    let err = backend
        .ensure(&request(uid, "m", "no-such-pool", IMAGE_VOLUME))
        .await
        .unwrap_err();
    assert_eq!(
        (err.reason.as_str(), err.is_transient()),
        ("StoragePoolNotFound", false),
        "{err}"
    );
    let err = backend
        .ensure(&request(uid, "m", POOL, "no-such-image.qcow2"))
        .await
        .unwrap_err();
    assert_eq!(
        (err.reason.as_str(), err.is_transient()),
        ("ImageNotFound", false),
        "{err}"
    );
    assert!(rig.domains().is_empty());

    // A domain that is not ours holds the name: never redefined, never deleted.
    let foreign = "<domain type='qemu'><name>direct.taken</name><memory unit='MiB'>64</memory>\
                   <os><type arch='x86_64'>hvm</type></os></domain>";
    rig.connect().define_domain_xml(foreign).unwrap();
    let err = backend
        .ensure(&request(uid, "taken", POOL, IMAGE_VOLUME))
        .await
        .unwrap_err();
    assert_eq!(
        (err.reason.as_str(), err.is_transient()),
        ("DomainNameTaken", false),
        "{err}"
    );

    // Powered off: defined with its volumes, not started, settled.
    let observed = backend
        .ensure(&request(uid, "m", POOL, IMAGE_VOLUME))
        .await
        .unwrap();
    assert_eq!(observed.power_state, Some(PowerState::PoweredOff));
    assert!(observed.settled_at(PowerState::PoweredOff), "{observed:?}");
    assert_eq!(rig.domains().len(), 2);
    // Volumes of this UID that no domain references (a crash before define).
    let conn = rig.connect();
    let pool = conn.lookup_storage_pool_by_name(POOL).unwrap();
    virt::storage_vol::StorageVol::create_xml(
        &pool,
        &format!(
            "<volume><name>bnl-{uid}-disk-orphan.qcow2</name><capacity>1048576</capacity>\
             <target><format type='qcow2'/></target></volume>"
        ),
        0,
    )
    .unwrap();
    assert_eq!(rig.volumes().len(), 4, "{:?}", rig.volumes());
    let identity = MachineIdentity {
        uid: uid.into(),
        namespace: "direct".into(),
        name: "m".into(),
        provider_id: None,
    };
    assert_eq!(backend.delete(&identity).await.unwrap(), Deletion::Gone);
    assert_eq!(backend.observe(&identity).await.unwrap(), None);
    assert_eq!(
        backend.delete(&identity).await.unwrap(),
        Deletion::Gone,
        "idempotent"
    );
    assert_eq!(rig.volumes(), [IMAGE_VOLUME.to_string()]);
    assert_eq!(
        rig.domains()
            .iter()
            .map(|d| d.0.as_str())
            .collect::<Vec<_>>(),
        ["direct.taken"],
        "the foreign domain is untouched"
    );

    // A daemon that is not there is transient and says so.
    let gone = LibvirtFactory::new()
        .connect(&connection(
            "qemu:///system?socket=/nonexistent/libvirt-sock",
        ))
        .unwrap();
    let err = gone.check().await.unwrap_err();
    assert_eq!(
        (err.reason.as_str(), err.is_transient()),
        ("Unreachable", true),
        "{err}"
    );
}

/// What the test guest runs from its seed (user data that starts with `#!`): it onlines
/// every vCPU the kernel sees (no udev in the guest) and prints, whenever it changes,
/// each vCPU's package and core as the guest kernel reads them (`cpuN=package/core`).
const TOPOLOGY_PRINTER: &str = r#"#!/bin/sh
last=""
while true; do
  for c in /sys/devices/system/cpu/cpu[0-9]*; do
    [ "$(cat $c/online 2>/dev/null)" = 0 ] && echo 1 > $c/online
  done
  t=""
  for c in /sys/devices/system/cpu/cpu[0-9]*; do
    [ -r $c/topology/physical_package_id ] && t="$t ${c##*/}=$(cat $c/topology/physical_package_id)/$(cat $c/topology/core_id)"
  done
  [ "$t" != "$last" ] && echo "banlieue-guest: topology$t" && last="$t"
  sleep 1
done
"#;

/// Calls `ensure` until the machine settles at `want`.
async fn settle(
    backend: &dyn Backend,
    request: &MachineRequest,
    want: PowerState,
) -> MachineObservation {
    let started = Instant::now();
    loop {
        let seen = backend.ensure(request).await.expect("ensure");
        if seen.settled_at(want) {
            return seen;
        }
        assert!(
            started.elapsed() < WAIT,
            "never settled at {want:?}: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The last `topology` line the guest printed on its console, once it contains `want`.
async fn guest_topology(rig: &LibvirtRig, domain: &str, want: &str) -> String {
    let started = Instant::now();
    loop {
        let console = rig.console(domain);
        if let Some(line) = console
            .lines()
            .rev()
            .find(|l| l.contains("banlieue-guest: topology"))
            && line.contains(want)
        {
            return line.trim().to_owned();
        }
        assert!(
            started.elapsed() < WAIT,
            "the guest never printed a topology with {want:?}:\n{console}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The `-smp` argument of the last QEMU libvirt started for `domain` (its log has each
/// command line).
fn qemu_smp(rig: &LibvirtRig, domain: &str) -> String {
    let log = std::fs::read_to_string(rig.state.join(format!("log/qemu/{domain}.log")))
        .expect("the domain's QEMU log");
    let at = log
        .rfind("-smp ")
        .unwrap_or_else(|| panic!("no -smp in:\n{log}"));
    log[at + 5..]
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// The `<topology .../>` element of `virsh dumpxml` (live, or `--inactive`), if any.
fn virsh_topology(rig: &LibvirtRig, domain: &str, inactive: bool) -> Option<String> {
    let mut args = vec!["dumpxml", domain];
    if inactive {
        args.push("--inactive");
    }
    virsh(rig, &args)
        .lines()
        .find(|l| l.contains("<topology"))
        .map(|l| l.trim().to_owned())
}

/// `coresPerSocket` on the real libvirtd + QEMU, the backend alone: a maximum it does
/// not divide is refused before anything is made; a domain made without a topology is
/// one core per socket (QEMU's `-smp`, the guest's own view, the read-back agree);
/// asking 2 cores per socket waits for the next boot (the persistent definition has
/// the topology, the running domain not); after a power cycle QEMU runs with 2 sockets
/// of 2 cores and the guest sees them; then vCPUs are hot-plugged into that topology
/// one at a time (3 of 4: half a socket).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cpu_topology_waits_for_the_next_boot_and_takes_hot_plugged_vcpus() {
    use banlieue_sdk::api::infra::libvirt::LibvirtMachineSpec;
    use banlieue_sdk::api::resources::{ChangeMode, MachineField as F};
    use banlieue_sdk::backend::{BootstrapData, MachineSpec, SecretValue};
    use banlieue_sdk::changes::assess;
    let Some(rig) = LibvirtRig::start() else {
        return;
    };
    let backend = LibvirtFactory::new()
        .connect(&connection(&rig.uri))
        .unwrap();
    let table = banlieue_backend_libvirt::changes::change_table();
    let uid = "0b0c0d0e-2222-4333-8444-555566667777";
    let domain = "direct.topo";
    let set = |req: &mut MachineRequest, f: &dyn Fn(&mut LibvirtMachineSpec)| {
        let MachineSpec::Libvirt(spec) = &mut req.spec else {
            unreachable!()
        };
        f(spec);
    };
    let mut on = request(uid, "topo", POOL, IMAGE_VOLUME);
    on.bootstrap = Some(BootstrapData {
        format: Default::default(),
        user_data: SecretValue::new(TOPOLOGY_PRINTER.to_owned()),
        network_config: None,
    });

    // 3 vCPUs at most do not split into sockets of 2 cores: refused, nothing made.
    set(&mut on, &|s| {
        s.power_state = PowerState::PoweredOn;
        s.max_cpus = Some(3);
        s.cores_per_socket = Some(2);
    });
    let err = backend.ensure(&on).await.unwrap_err();
    eprintln!("{}: {}", err.reason, err.message);
    assert_eq!(
        (err.reason.as_str(), err.is_transient()),
        ("CpuTopologyMismatch", false)
    );
    assert!(
        err.message.contains("3 vCPUs") && err.message.contains("coresPerSocket 2"),
        "{err}"
    );
    assert!(rig.domains().is_empty());
    assert_eq!(rig.volumes(), [IMAGE_VOLUME.to_string()], "nothing made");

    // Made without a topology: one core per socket, as QEMU and the guest see it.
    set(&mut on, &|s| {
        s.max_cpus = Some(4);
        s.cores_per_socket = None;
    });
    let made = settle(&*backend, &on, PowerState::PoweredOn).await;
    let r = made.resources.expect("read back");
    assert_eq!(
        (r.cpus, r.max_cpus, r.cores_per_socket),
        (1, Some(4), Some(1))
    );
    assert_eq!(virsh_topology(&rig, domain, false), None);
    let smp = qemu_smp(&rig, domain);
    eprintln!("no topology: -smp {smp}");
    assert!(
        smp.contains("maxcpus=4") && smp.contains("sockets=4") && smp.contains("cores=1"),
        "{smp}"
    );
    eprintln!("{}", guest_topology(&rig, domain, " cpu0=0/0").await);

    // 2 cores per socket: NextBoot, in the persistent definition only.
    set(&mut on, &|s| s.cores_per_socket = Some(2));
    let seen = settle(&*backend, &on, PowerState::PoweredOn).await;
    let first = assess(
        &on.spec.resources(),
        seen.resources.as_ref().unwrap(),
        seen.next_boot.as_ref(),
        &table,
        seen.power_state,
    );
    assert_eq!(first.apply, [F::CoresPerSocket]);
    assert_eq!(first.pending[0].waits_for, ChangeMode::NextBoot);
    let staged = backend.apply_changes(&on, &first.apply).await.unwrap();
    let (r, next) = (
        staged.resources.unwrap(),
        staged.next_boot.expect("a next boot"),
    );
    assert_eq!(
        (r.cores_per_socket, next.cores_per_socket),
        (Some(1), Some(2))
    );
    let inactive = virsh_topology(&rig, domain, true).expect("a topology for the next boot");
    eprintln!("next boot: {inactive}");
    assert!(
        inactive.contains("sockets='2'")
            && inactive.contains("cores='2'")
            && inactive.contains("threads='1'"),
        "{inactive}"
    );
    assert_eq!(
        virsh_topology(&rig, domain, false),
        None,
        "not the running domain"
    );
    assert!(rig.domains()[0].2, "still running");

    // The power cycle: QEMU starts with 2 sockets of 2 cores.
    let mut off = on.clone();
    set(&mut off, &|s| s.power_state = PowerState::PoweredOff);
    settle(&*backend, &off, PowerState::PoweredOff).await;
    let cycled = settle(&*backend, &on, PowerState::PoweredOn).await;
    let r = cycled.resources.unwrap();
    assert_eq!(
        (r.cpus, r.max_cpus, r.cores_per_socket),
        (1, Some(4), Some(2))
    );
    assert_eq!(cycled.next_boot, None);
    let live = virsh_topology(&rig, domain, false).expect("the running domain's topology");
    let smp = qemu_smp(&rig, domain);
    eprintln!("after the power cycle: {live}, -smp {smp}");
    assert!(
        live.contains("sockets='2'") && live.contains("cores='2'"),
        "{live}"
    );
    assert!(
        smp.contains("maxcpus=4") && smp.contains("sockets=2") && smp.contains("cores=2"),
        "{smp}"
    );
    eprintln!("{}", guest_topology(&rig, domain, " cpu0=0/0").await);

    // Two vCPUs hot-plugged into the topology, one at a time: 3 of 4, half a socket.
    set(&mut on, &|s| s.cpus = 3);
    let seen = settle(&*backend, &on, PowerState::PoweredOn).await;
    let live_change = assess(
        &on.spec.resources(),
        seen.resources.as_ref().unwrap(),
        seen.next_boot.as_ref(),
        &table,
        seen.power_state,
    );
    assert_eq!(
        (live_change.apply.as_slice(), live_change.pending.len()),
        ([F::Cpus].as_slice(), 0)
    );
    let grown = backend.apply_changes(&on, &[F::Cpus]).await.unwrap();
    let r = grown.resources.unwrap();
    assert_eq!((r.cpus, r.cores_per_socket), (3, Some(2)));
    assert_eq!(vcpus(&rig, domain, "--live", false), 3, "hot-plugged");
    assert_eq!(vcpus(&rig, domain, "--config", false), 3, "and kept");
    let three = guest_topology(&rig, domain, "cpu2=").await;
    eprintln!("hot-plugged: {three}");
    assert!(
        three.contains(" cpu0=0/0 cpu1=0/1 cpu2=1/0"),
        "the guest sees package 1 started: {three}"
    );
    assert!(
        !rig.console(domain).contains("power button"),
        "no restart for the hot-plug"
    );

    let identity = on.identity.clone();
    assert_eq!(backend.delete(&identity).await.unwrap(), Deletion::Gone);
    assert!(rig.domains().is_empty());
    assert_eq!(rig.volumes(), [IMAGE_VOLUME.to_string()]);
}

/// Image paths are confined to where images may be on the libvirt host (here the
/// default: the directories of its active directory pools, i.e. the rig's pool): a
/// machine whose image path is `/etc/shadow`, one whose image is a volume that is a
/// symlink in the pool pointing out of it are refused `PathNotAllowed` naming the image
/// and the directories, before any volume or domain is made; one whose image is `..`
/// out of the pool is refused at admission.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_outside_the_allowed_directories_are_refused_before_anything_is_made() {
    let Some(rig) = LibvirtRig::start() else {
        return;
    };
    let ns = world(&rig, "libvirt-paths").await;
    let _operator = operator(&ns, Arc::new(LibvirtFactory::new()));
    let conn = rig.connect();
    let pool = conn.lookup_storage_pool_by_name(POOL).expect("pool");
    let pool_dir = banlieue_backend_libvirt::paths::pool_dir(&pool.xml_desc(0).expect("pool XML"))
        .expect("the rig's pool is a directory pool");
    let outside = pool_dir.with_file_name("outside.qcow2");
    std::fs::write(&outside, b"not for guests").expect("a file outside the pool");
    std::os::unix::fs::symlink(&outside, pool_dir.join("escape.qcow2")).expect("a symlink out");
    pool.refresh(0).expect("refresh");
    assert!(
        rig.volumes().contains(&"escape.qcow2".to_owned()),
        "libvirt lists the symlink as a volume of the pool: {:?}",
        rig.volumes()
    );
    let volumes_before = rig.volumes();
    let machines: Api<LibvirtMachine> = ns.api();
    let machine = |name: &str, image: serde_json::Value| {
        json!({"apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "LibvirtMachine",
               "metadata": {"name": name},
               "spec": {"providerRef": {"name": "host"}, "image": image, "storagePool": POOL,
                        "cpus": 1, "memoryMiB": 128, "firmware": "bios",
                        "network": [{"network": NETWORK}]}})
    };
    let dotdot = format!("{}/../outside.qcow2", pool_dir.display());
    let cases = [
        (
            "shadow",
            json!({"path": "/etc/shadow"}),
            "/etc/shadow".to_owned(),
        ),
        (
            "link",
            json!({"volume": {"pool": POOL, "name": "escape.qcow2"}}),
            std::fs::canonicalize(&outside)
                .unwrap()
                .display()
                .to_string(),
        ),
    ];
    // `..` out of the pool no longer gets as far as the backend: admission refuses it
    // (the backend's own folding of `..` is covered by its unit tests).
    let refused = apply(
        &ns.client,
        &ns.name,
        &machine("dotdot", json!({"path": dotdot})),
    )
    .await
    .expect_err("a path with '..' is refused at admission");
    assert!(
        refused.to_string().contains("without '..' segments"),
        "says what to fix: {refused}"
    );
    for (name, image, _) in &cases {
        apply(&ns.client, &ns.name, &machine(name, image.clone()))
            .await
            .unwrap();
    }
    for (name, _, resolved) in &cases {
        let refused = wait_for(&machines, name, Duration::from_secs(60), |m| {
            m.status.as_ref().is_some_and(|s| {
                conditions::get(&s.conditions, "Ready")
                    .is_some_and(|c| c.message.starts_with("PathNotAllowed"))
            })
        })
        .await;
        let ready = conditions::get(&refused.status.as_ref().unwrap().conditions, "Ready")
            .unwrap()
            .clone();
        eprintln!("{name}: {}: {}", ready.reason, ready.message);
        assert_eq!(ready.reason, "TerminalFailure", "{name}");
        assert!(
            ready.message.contains(&format!("(at {resolved})"))
                && ready.message.contains(&pool_dir.display().to_string()),
            "{name}: names where it leads and the allowed directories: {}",
            ready.message
        );
        assert!(refused.spec.provider_id.is_none(), "{name}");
    }
    assert!(
        rig.domains().is_empty(),
        "no domain defined: {:?}",
        rig.domains()
    );
    assert_eq!(rig.volumes(), volumes_before, "no volume made");
    for (name, ..) in &cases {
        machines
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
        wait_gone(&machines, name, Duration::from_secs(60)).await;
    }
}

/// `virsh -c <rig> ARGS`: the rig's libvirtd asked by its own client, independently of
/// the backend's code.
fn virsh(rig: &LibvirtRig, args: &[&str]) -> String {
    let out = std::process::Command::new("virsh")
        .arg("-c")
        .arg(&rig.uri)
        .args(args)
        .output()
        .expect("running virsh");
    assert!(
        out.status.success(),
        "virsh {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// `virsh vcpucount DOMAIN --live|--config [--maximum]`.
fn vcpus(rig: &LibvirtRig, domain: &str, scope: &str, maximum: bool) -> u32 {
    let mut args = vec!["vcpucount", domain, scope];
    if maximum {
        args.push("--maximum");
    } else if scope == "--live" {
        args.push("--active");
    }
    virsh(rig, &args).parse().expect("a count")
}

/// A field of `virsh domblkinfo DOMAIN TARGET` (bytes) or `virsh dominfo DOMAIN`.
fn virsh_field(output: &str, field: &str) -> u64 {
    output
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in:\n{output}"))
}

async fn set_machine_power(machines: &Api<LibvirtMachine>, state: &str) {
    machines
        .patch(
            "grow",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"powerState": state}})),
        )
        .await
        .unwrap();
}

/// `(status, reason, message)` of `type_` when it speaks of the object's current generation.
fn condition_now(m: &LibvirtMachine, type_: &str) -> Option<(String, String, String)> {
    let status = m.status.as_ref()?;
    let c = conditions::get(&status.conditions, type_)?;
    (c.observed_generation == m.metadata.generation)
        .then(|| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

fn running(m: &LibvirtMachine) -> Option<&banlieue_sdk::api::resources::MachineResources> {
    m.status.as_ref()?.resources.as_ref()?.running.as_ref()
}

/// A running domain changes honestly (issue 38), seen through the real libvirtd + QEMU:
/// vCPUs hot-plugged within `maxCPUs` and a data disk and the OS disk grown under the
/// running guest (UpToDate=True, `status.resources.running`, and virsh agree); vCPUs
/// beyond `maxCPUs` and memory wait for a power cycle (RestartRequired names them,
/// the persistent definition has them already, the running guest not), then apply
/// after PoweredOff → PoweredOn; a firmware change is refused (ChangeRefused) and
/// leaves the domain as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_domain_grows_live_within_its_headroom_and_the_rest_waits_for_a_power_cycle() {
    let Some(rig) = LibvirtRig::start() else {
        return;
    };
    let ns = world(&rig, "lv-change").await;
    let _operator = operator(&ns, Arc::new(LibvirtFactory::new()));
    let machines: Api<LibvirtMachine> = ns.api();
    apply(
        &ns.client,
        &ns.name,
        &json!({"apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "LibvirtMachine",
           "metadata": {"name": "grow"},
           "spec": {"providerRef": {"name": "host"},
                    "image": {"volume": {"pool": POOL, "name": IMAGE_VOLUME}},
                    "storagePool": POOL, "cpus": 1, "maxCPUs": 2, "memoryMiB": 256,
                    "maxMemoryMiB": 512,
                    "diskGiB": 1, "firmware": "bios",
                    "additionalDisks": [{"name": "data", "sizeGiB": 1}],
                    "network": [{"network": NETWORK}]}}),
    )
    .await
    .unwrap();
    // The headroom is at least what the machine asks: refused at admission otherwise.
    for (field, value, message) in [
        ("maxCPUs", 1, "maxCPUs must be at least cpus"),
        (
            "maxMemoryMiB",
            128,
            "maxMemoryMiB must be at least memoryMiB",
        ),
    ] {
        let refused = apply(
            &ns.client,
            &ns.name,
            &json!({"apiVersion": "infrastructure.banlieue.io/v1alpha1", "kind": "LibvirtMachine",
               "metadata": {"name": "too-small"},
               "spec": {"providerRef": {"name": "host"},
                        "image": {"volume": {"pool": POOL, "name": IMAGE_VOLUME}},
                        "storagePool": POOL, "cpus": 2, "memoryMiB": 256, field: value,
                        "firmware": "bios"}}),
        )
        .await
        .expect_err("less headroom than asked");
        assert!(refused.to_string().contains(message), "{refused}");
    }
    let domain = format!("{}.grow", ns.name);
    let up_to_date = |m: &LibvirtMachine| {
        condition_now(m, "UpToDate").is_some_and(|(s, ..)| s == "True")
            && m.status
                .as_ref()
                .is_some_and(|s| conditions::is_true(&s.conditions, "Ready"))
    };
    let made = wait_for(&machines, "grow", WAIT, up_to_date).await;
    let r = running(&made).expect("resources read back");
    assert_eq!(
        (
            r.cpus,
            r.max_cpus,
            r.memory_mib,
            r.max_memory_mib,
            r.os_disk_gib,
            r.networks
        ),
        (1, Some(2), 256, Some(512), Some(1), 1),
        "{r:?}"
    );
    assert_eq!(r.data_disks[0].size_gib, 1);
    assert_eq!(vcpus(&rig, &domain, "--live", false), 1);
    assert_eq!(
        vcpus(&rig, &domain, "--live", true),
        2,
        "QEMU started with room for 2 vCPUs"
    );
    let xml_before = virsh(&rig, &["dumpxml", &domain]);
    assert!(xml_before.contains("current='1'>2</vcpu>"), "{xml_before}");
    assert!(
        xml_before.contains("<maxMemory slots='16' unit='KiB'>524288</maxMemory>"),
        "{xml_before}"
    );

    // Live: one more vCPU (within maxCPUs) and both disks grown, the guest running on.
    let live = Instant::now();
    machines
        .patch(
            "grow",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"cpus": 2, "memoryMiB": 384, "diskGiB": 2,
                "additionalDisks": [{"name": "data", "sizeGiB": 3}],
                "network": [{"network": NETWORK}, {"network": NETWORK}]}})),
        )
        .await
        .unwrap();
    let grown = wait_for(&machines, "grow", WAIT, |m| {
        up_to_date(m) && running(m).is_some_and(|r| r.cpus == 2 && r.memory_mib == 384)
    })
    .await;
    let r = running(&grown).unwrap();
    assert_eq!(
        (r.cpus, r.os_disk_gib, r.data_disks[0].size_gib, r.networks),
        (2, Some(2), 3, 2),
        "{r:?}"
    );
    // The second interface is plugged into the running domain and kept for the next boot.
    let nics = |inactive: bool| {
        let mut args = vec!["domiflist", domain.as_str()];
        if inactive {
            args.push("--inactive");
        }
        let out = virsh(&rig, &args);
        out.lines()
            .filter(|l| l.contains(NETWORK) && l.contains("virtio"))
            .count()
    };
    assert_eq!((nics(false), nics(true)), (2, 2));
    // 128 MiB more as a memory module plugged into the running guest.
    let info = virsh(&rig, &["dominfo", &domain]);
    assert_eq!(virsh_field(&info, "Max memory:"), 384 * 1024, "{info}");
    let live_xml = virsh(&rig, &["dumpxml", &domain]);
    assert!(live_xml.contains("<memory model='dimm'"), "{live_xml}");
    assert_eq!(vcpus(&rig, &domain, "--live", false), 2, "hot-plugged");
    assert_eq!(
        vcpus(&rig, &domain, "--config", false),
        2,
        "and kept for the next boot"
    );
    let gib = 1u64 << 30;
    let vdb = virsh(&rig, &["domblkinfo", &domain, "vdb"]);
    assert_eq!(virsh_field(&vdb, "Capacity:"), 3 * gib, "{vdb}");
    let vda = virsh(&rig, &["domblkinfo", &domain, "vda"]);
    assert_eq!(virsh_field(&vda, "Capacity:"), 2 * gib, "{vda}");
    assert!(rig.domains()[0].2, "still running");
    let uid = grown.metadata.uid.clone().unwrap();
    assert!(
        !rig.console(&domain).contains("power button"),
        "never restarted"
    );
    eprintln!(
        "libvirt: cpus 1 -> 2, memory 256 -> 384 MiB (hot-plug), OS disk 1 -> 2 GiB, data disk 1 -> 3 GiB, NICs 1 -> 2 live in {:.1?}",
        live.elapsed()
    );

    // Beyond the headroom: written for the next boot, the running guest keeps 2 vCPUs.
    machines
        .patch(
            "grow",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"cpus": 3, "maxCPUs": 3, "memoryMiB": 640,
                "maxMemoryMiB": 1024}})),
        )
        .await
        .unwrap();
    let waiting = wait_for(&machines, "grow", WAIT, |m| {
        condition_now(m, "RestartRequired").is_some_and(|(s, ..)| s == "True")
    })
    .await;
    let (_, reason, message) = condition_now(&waiting, "RestartRequired").unwrap();
    eprintln!("RestartRequired {reason}: {message}");
    assert!(
        message.contains("cpus 2 → 3") && message.contains("memoryMiB 384 → 640"),
        "{message}"
    );
    let (status, reason, _) = condition_now(&waiting, "UpToDate").unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "RestartRequired")
    );
    let pending = &waiting
        .status
        .as_ref()
        .unwrap()
        .resources
        .as_ref()
        .unwrap()
        .pending;
    assert!(
        pending
            .iter()
            .all(|p| p.waits_for == banlieue_sdk::api::resources::ChangeMode::NextBoot),
        "{pending:?}"
    );
    assert_eq!(vcpus(&rig, &domain, "--live", false), 2);
    assert_eq!(vcpus(&rig, &domain, "--config", false), 3, "written");
    assert_eq!(vcpus(&rig, &domain, "--config", true), 3);
    let info = virsh(&rig, &["dominfo", &domain]);
    assert_eq!(virsh_field(&info, "Max memory:"), 384 * 1024, "{info}");
    let inactive = virsh(&rig, &["dumpxml", "--inactive", &domain]);
    assert!(
        inactive.contains("<memory unit='KiB'>655360</memory>")
            && inactive.contains("<maxMemory slots='16' unit='KiB'>1048576</maxMemory>")
            && inactive.contains("cpus='0-2' memory='655360'")
            && !inactive.contains("model='dimm'"),
        "the next boot boots with it all: {inactive}"
    );
    assert_eq!(running(&waiting).unwrap().cpus, 2);

    // The power cycle applies it.
    let cycle = Instant::now();
    machines
        .patch(
            "grow",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"powerState": "PoweredOff"}})),
        )
        .await
        .unwrap();
    wait_for(&machines, "grow", WAIT, |m| {
        m.status.as_ref().and_then(|s| s.power_state) == Some(PowerState::PoweredOff)
    })
    .await;
    machines
        .patch(
            "grow",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"powerState": "PoweredOn"}})),
        )
        .await
        .unwrap();
    let cycled = wait_for(&machines, "grow", WAIT, |m| {
        up_to_date(m)
            && m.status.as_ref().and_then(|s| s.power_state) == Some(PowerState::PoweredOn)
            && condition_now(m, "RestartRequired").is_some_and(|(s, ..)| s == "False")
    })
    .await;
    let r = running(&cycled).unwrap();
    assert_eq!(
        (r.cpus, r.max_cpus, r.memory_mib, r.max_memory_mib),
        (3, Some(3), 640, Some(1024)),
        "{r:?}"
    );
    assert_eq!(vcpus(&rig, &domain, "--live", false), 3);
    let info = virsh(&rig, &["dominfo", &domain]);
    assert_eq!(virsh_field(&info, "Max memory:"), 640 * 1024, "{info}");
    eprintln!(
        "libvirt: cpus 2 -> 3 and memory 384 -> 640 MiB (beyond maxMemory 512) after a power cycle in {:.1?}",
        cycle.elapsed()
    );

    // Shrinks wait for the next boot too.
    machines
        .patch(
            "grow",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"cpus": 1, "memoryMiB": 256}})),
        )
        .await
        .unwrap();
    let waiting = wait_for(&machines, "grow", WAIT, |m| {
        condition_now(m, "RestartRequired").is_some_and(|(s, ..)| s == "True")
    })
    .await;
    let (_, _, message) = condition_now(&waiting, "RestartRequired").unwrap();
    eprintln!("RestartRequired: {message}");
    assert!(
        message.contains("cpus 3 → 1") && message.contains("memoryMiB 640 → 256"),
        "{message}"
    );
    assert_eq!(
        vcpus(&rig, &domain, "--live", false),
        3,
        "nothing unplugged"
    );
    assert_eq!(vcpus(&rig, &domain, "--config", false), 1, "written");
    set_machine_power(&machines, "PoweredOff").await;
    wait_for(&machines, "grow", WAIT, |m| {
        m.status.as_ref().and_then(|s| s.power_state) == Some(PowerState::PoweredOff)
    })
    .await;
    set_machine_power(&machines, "PoweredOn").await;
    let shrunk = wait_for(&machines, "grow", WAIT, |m| {
        up_to_date(m)
            && m.status.as_ref().and_then(|s| s.power_state) == Some(PowerState::PoweredOn)
            && running(m).is_some_and(|r| r.cpus == 1)
    })
    .await;
    let r = running(&shrunk).unwrap();
    assert_eq!((r.cpus, r.memory_mib), (1, 256), "{r:?}");
    assert_eq!(vcpus(&rig, &domain, "--live", false), 1);
    let info = virsh(&rig, &["dominfo", &domain]);
    assert_eq!(virsh_field(&info, "Max memory:"), 256 * 1024, "{info}");
    eprintln!("libvirt: cpus 3 -> 1 and memory 640 -> 256 MiB after a power cycle");

    // Hostile: firmware is fixed at define. Refused, named, nothing touched.
    let before = virsh(&rig, &["dumpxml", "--inactive", &domain]);
    machines
        .patch(
            "grow",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"firmware": "efi"}})),
        )
        .await
        .unwrap();
    let refused = wait_for(&machines, "grow", WAIT, |m| {
        condition_now(m, "UpToDate").is_some_and(|(_, reason, _)| reason == "ChangeRefused")
    })
    .await;
    let (status, _, message) = condition_now(&refused, "UpToDate").unwrap();
    eprintln!("UpToDate False ChangeRefused: {message}");
    assert_eq!(status, "False");
    assert!(message.contains("firmware bios → efi"), "{message}");
    // A few more reconciles: still untouched.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        virsh(&rig, &["dumpxml", "--inactive", &domain]),
        before,
        "the domain's definition is untouched"
    );
    assert!(rig.domains()[0].2, "still running");
    assert_eq!(vcpus(&rig, &domain, "--live", false), 1);
    assert_eq!(
        running(&machines.get("grow").await.unwrap())
            .unwrap()
            .firmware,
        Some(banlieue_sdk::api::common::Firmware::Bios)
    );

    machines
        .delete("grow", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&machines, "grow", WAIT).await;
    assert!(rig.domains().is_empty());
    assert_eq!(rig.volumes(), [IMAGE_VOLUME.to_string()], "{uid}");
}

fn vm_condition(v: &VirtualMachine, type_: &str) -> Option<(String, String, String)> {
    let status = v.status.as_ref()?;
    let c = conditions::get(&status.conditions, type_)?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

fn vm_running(v: &VirtualMachine) -> Option<&banlieue_sdk::api::resources::MachineResources> {
    v.status.as_ref()?.resources.as_ref()?.running.as_ref()
}

/// A VirtualMachine made from a class (no `maxCPUs`/`maxMemoryMiB`: its domain has no
/// room to grow live) whose class grows: the vCPU count and memory are written to the
/// domain's persistent definition (`setVcpus`/`setMemory` with `CONFIG`), the VM says
/// RestartRequired naming both and runs on unchanged, and a power cycle of the VM
/// applies them; the VM mirrors `status.resources` and UpToDate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_virtual_machine_without_headroom_takes_a_bigger_class_at_its_next_boot() {
    let Some(rig) = LibvirtRig::start() else {
        return;
    };
    let ns = world(&rig, "lv-nextboot").await;
    let _operator = operator(&ns, Arc::new(LibvirtFactory::new()));
    apply(&ns.client, &ns.name, &vm(&ns, "app-1"))
        .await
        .unwrap();
    let vms: Api<VirtualMachine> = ns.api();
    let made = wait_for(&vms, "app-1", WAIT, |v| {
        is_ready(v) && vm_condition(v, "UpToDate").is_some_and(|(s, ..)| s == "True")
    })
    .await;
    let r = vm_running(&made).expect("the VM mirrors status.resources");
    assert_eq!(
        (
            r.cpus,
            r.max_cpus,
            r.memory_mib,
            r.max_memory_mib,
            r.networks
        ),
        (1, Some(1), 256, Some(256), 1),
        "{r:?}"
    );
    let domain = format!("{}.app-1", ns.name);
    assert_eq!(
        vcpus(&rig, &domain, "--live", true),
        1,
        "no room to hot-plug"
    );

    let classes: Api<banlieue_sdk::api::VMClass> = Api::all(ns.client.clone());
    classes
        .patch(
            &format!("{}-tiny", ns.name),
            &PatchParams::default(),
            // A class edit reaches the VMs using it only when the class says so.
            &Patch::Merge(&json!({"spec": {"cpus": 2, "memoryMiB": 320, "updatePolicy": "Apply"}})),
        )
        .await
        .unwrap();
    let waiting = wait_for(&vms, "app-1", WAIT, |v| {
        vm_condition(v, "RestartRequired").is_some_and(|(s, ..)| s == "True")
    })
    .await;
    let (_, _, message) = vm_condition(&waiting, "RestartRequired").unwrap();
    eprintln!("VM RestartRequired: {message}");
    assert!(
        message.contains("cpus 1 → 2") && message.contains("memoryMiB 256 → 320"),
        "{message}"
    );
    assert_eq!(
        vm_condition(&waiting, "UpToDate").map(|(s, r, _)| (s, r)),
        Some(("False".to_owned(), "RestartRequired".to_owned()))
    );
    assert_eq!(
        vcpus(&rig, &domain, "--live", false),
        1,
        "runs on unchanged"
    );
    assert_eq!(vcpus(&rig, &domain, "--config", false), 2, "written");
    let inactive = virsh(&rig, &["dumpxml", "--inactive", &domain]);
    assert!(
        inactive.contains("<memory unit='KiB'>327680</memory>"),
        "{inactive}"
    );
    assert!(rig.domains()[0].2, "still running");

    set_power(&vms, "app-1", "PoweredOff").await;
    wait_for(&vms, "app-1", WAIT, |v| {
        v.status.as_ref().and_then(|s| s.power_state) == Some(PowerState::PoweredOff)
    })
    .await;
    set_power(&vms, "app-1", "PoweredOn").await;
    let cycled = wait_for(&vms, "app-1", WAIT, |v| {
        is_ready(v)
            && v.status.as_ref().and_then(|s| s.power_state) == Some(PowerState::PoweredOn)
            && vm_condition(v, "UpToDate").is_some_and(|(s, ..)| s == "True")
            && vm_running(v).is_some_and(|r| r.cpus == 2)
    })
    .await;
    let r = vm_running(&cycled).unwrap();
    assert_eq!(
        (r.cpus, r.max_cpus, r.memory_mib),
        (2, Some(2), 320),
        "{r:?}"
    );
    assert_eq!(vcpus(&rig, &domain, "--live", false), 2);
    let info = virsh(&rig, &["dominfo", &domain]);
    assert_eq!(virsh_field(&info, "Max memory:"), 320 * 1024, "{info}");
    eprintln!("libvirt: VM class 1 -> 2 cpus, 256 -> 320 MiB applied after a power cycle");

    vms.delete("app-1", &DeleteParams::default()).await.unwrap();
    wait_gone(&vms, "app-1", WAIT).await;
    assert!(rig.domains().is_empty());
}
