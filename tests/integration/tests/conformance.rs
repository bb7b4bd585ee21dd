//! Every in-tree backend runs the backend conformance suite (`banlieue-conformance`)
//! against its real test target: vSphere on vcsim, Proxmox VE on fakepve, libvirt on
//! the real libvirtd + QEMU, Cloud Hypervisor on the OpenAPI-checked fake VMM (the sim
//! runs it in its own crate, `examples/embedding` in its own). The suite drives each
//! backend as the controllers do: create, ensure again, found after a restart, adopted
//! under a new UID, a missing provider ID, power, each row of its change table, an
//! outage, delete. Each target makes its outage its own way:
//!
//! - vcsim and fakepve: the backend talks to the simulator through a TCP relay the
//!   test cuts (open connections dropped, new ones closed at once), as a network
//!   outage does;
//! - libvirt: the daemon's socket is moved away, so new connections fail (an operator
//!   restarting while libvirtd is unreachable); the open one stays;
//! - Cloud Hypervisor: the machine's VMM processes are stopped (SIGSTOP), so its API
//!   socket does not answer within `apiTimeout`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use banlieue_backend_cloud_hypervisor::ChFactory;
use banlieue_backend_libvirt::LibvirtFactory;
use banlieue_backend_proxmox::ProxmoxFactory;
use banlieue_backend_vsphere::VSphereFactory;
use banlieue_conformance::{Outage, Target};
use banlieue_integration_tests::cloud_hypervisor::{ChRig, Guest};
use banlieue_integration_tests::fakepve::FakePve;
use banlieue_integration_tests::libvirt::{IMAGE_VOLUME, LibvirtRig, NETWORK, POOL};
use banlieue_integration_tests::vcsim::Vcsim;
use banlieue_sdk::api::common::ProviderClass;
use banlieue_sdk::async_trait;
use banlieue_sdk::backend::{
    Backend, BackendError, BackendFactory, Connection, MachineIdentity, MachineRequest,
    MachineSpec, SecretValue,
};
use serde_json::json;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

const FAKE_CH: &str = env!("CARGO_BIN_EXE_fake-ch-vmm");

/// A TCP relay to a simulator that can be cut: what a network outage looks like from
/// the backend (connections reset, new ones closed).
struct Relay {
    port: u16,
    down: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accept: JoinHandle<()>,
}

impl Relay {
    async fn start(upstream_endpoint: &str) -> Self {
        let upstream = authority(upstream_endpoint).to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("relay port");
        let port = listener.local_addr().expect("relay address").port();
        let down = Arc::new(AtomicBool::new(false));
        let open: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let (d, o) = (down.clone(), open.clone());
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if d.load(Ordering::SeqCst) {
                    drop(inbound);
                    continue;
                }
                let upstream = upstream.clone();
                let relay = tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(&upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                o.lock().unwrap().push(relay);
            }
        });
        Self {
            port,
            down,
            open,
            accept,
        }
    }

    /// `endpoint` with the relay's port instead of the simulator's.
    fn endpoint(&self, endpoint: &str) -> String {
        let authority = authority(endpoint);
        let host = authority.rsplit_once(':').map_or(authority, |(h, _)| h);
        endpoint.replacen(authority, &format!("{host}:{}", self.port), 1)
    }

    fn cut(&self) -> Box<dyn Outage> {
        self.down.store(true, Ordering::SeqCst);
        for relay in self.open.lock().unwrap().drain(..) {
            relay.abort();
        }
        Box::new(Cut(self.down.clone()))
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// `127.0.0.1:8989` of `https://127.0.0.1:8989/sdk`.
fn authority(endpoint: &str) -> &str {
    let rest = endpoint.split_once("://").map_or(endpoint, |(_, r)| r);
    rest.split('/').next().unwrap_or(rest)
}

struct Cut(Arc<AtomicBool>);

#[async_trait]
impl Outage for Cut {
    async fn end(self: Box<Self>) {
        self.0.store(false, Ordering::SeqCst);
    }
}

fn secret(s: &str) -> SecretValue {
    SecretValue::new(s.to_owned())
}

fn request(identity: MachineIdentity, spec: MachineSpec, domain: Option<&str>) -> MachineRequest {
    MachineRequest {
        identity,
        spec,
        failure_domain: domain.map(str::to_owned),
        bootstrap: None,
        instance_id: None,
        disks_imported: false,
    }
}

// ---- vSphere on vcsim ----

struct VSphereOnVcsim {
    sim: Vcsim,
    relay: Relay,
}

#[async_trait]
impl Target for VSphereOnVcsim {
    fn name(&self) -> String {
        "vsphere on vcsim".into()
    }

    async fn connect(&self) -> Result<Arc<dyn Backend>, BackendError> {
        VSphereFactory::new().connect(&Connection {
            class: ProviderClass::Vsphere,
            endpoint: self
                .relay
                .endpoint(&format!("{}/sdk", self.sim.ready.endpoint)),
            credentials: [
                ("username".into(), secret(&self.sim.ready.username)),
                ("password".into(), secret(&self.sim.ready.password)),
            ]
            .into(),
            ca_bundle: Some(self.sim.ready.ca_pem.clone()),
            insecure_skip_tls_verify: false,
            settings: [
                ("taskPollInterval".into(), "50ms".into()),
                ("shutdownTimeout".into(), "2s".into()),
            ]
            .into(),
        })
    }

    fn request(&self, identity: MachineIdentity) -> MachineRequest {
        let spec = serde_json::from_value(json!({
            "template": self.sim.ready.template, "datacenter": "DC0", "cluster": "DC0_C0",
            "datastore": "LocalDS_0", "numCPUs": 2, "numCoresPerSocket": 1, "memoryMiB": 1024,
            // Hot-add: CPUs and memory grow live within these; they shrink while off.
            "maxCPUs": 4, "maxMemoryMiB": 4096,
            "additionalDisks": [{"name": "data", "sizeGiB": 1}],
            "network": [{"networkName": "VM Network"}], "powerState": "PoweredOn",
        }))
        .expect("a valid VSphereMachine spec");
        request(identity, MachineSpec::VSphere(spec), Some("DC0/DC0_C0"))
    }

    async fn outage(&self) -> Result<Box<dyn Outage>, String> {
        Ok(self.relay.cut())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vsphere_conforms_on_vcsim() {
    let Some(sim) = Vcsim::start() else { return };
    let relay = Relay::start(&sim.ready.endpoint).await;
    let target = VSphereOnVcsim { sim, relay };
    let report = banlieue_conformance::run(&target).await;
    eprintln!("{report}");
    report.assert_complete();
    let left: Vec<_> = target
        .sim
        .vms()
        .into_iter()
        .filter(|vm| vm["name"].as_str().is_some_and(|n| n.contains("conf-")))
        .collect();
    assert_eq!(left, Vec::<serde_json::Value>::new(), "VMs left in vcsim");
}

// ---- Proxmox VE on fakepve ----

struct ProxmoxOnFakePve {
    pve: FakePve,
    relay: Relay,
}

#[async_trait]
impl Target for ProxmoxOnFakePve {
    fn name(&self) -> String {
        "proxmox on fakepve".into()
    }

    async fn connect(&self) -> Result<Arc<dyn Backend>, BackendError> {
        ProxmoxFactory::new().connect(&Connection {
            class: ProviderClass::Proxmox,
            endpoint: self.relay.endpoint(&self.pve.ready.endpoint),
            credentials: [
                ("tokenID".into(), secret(&self.pve.ready.token_id)),
                ("tokenSecret".into(), secret(&self.pve.ready.token_secret)),
            ]
            .into(),
            ca_bundle: Some(self.pve.ready.ca_pem.clone()),
            insecure_skip_tls_verify: false,
            settings: [
                ("taskPollInterval".into(), "100ms".into()),
                ("shutdownTimeout".into(), "2s".into()),
            ]
            .into(),
        })
    }

    fn request(&self, identity: MachineIdentity) -> MachineRequest {
        let spec = serde_json::from_value(json!({
            "templateID": self.pve.ready.template_id, "cores": 1, "memoryMiB": 512,
            "network": [{"bridge": "vmbr0"}], "powerState": "PoweredOn",
        }))
        .expect("a valid ProxmoxMachine spec");
        request(identity, MachineSpec::Proxmox(spec), Some("pve1"))
    }

    async fn outage(&self) -> Result<Box<dyn Outage>, String> {
        Ok(self.relay.cut())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxmox_conforms_on_fakepve() {
    let Some(pve) = FakePve::start() else { return };
    let relay = Relay::start(&pve.ready.endpoint).await;
    let target = ProxmoxOnFakePve { pve, relay };
    let report = banlieue_conformance::run(&target).await;
    eprintln!("{report}");
    report.assert_complete();
    let template = u64::from(target.pve.ready.template_id);
    let left: Vec<_> = target
        .pve
        .vms()
        .into_iter()
        .filter(|vm| vm["vmid"].as_u64() != Some(template))
        .collect();
    assert_eq!(left, Vec::<serde_json::Value>::new(), "VMs left in fakepve");
}

// ---- libvirt on the real libvirtd + QEMU ----

struct LibvirtOnQemu {
    rig: LibvirtRig,
}

impl LibvirtOnQemu {
    fn socket(&self) -> PathBuf {
        self.rig.state.join("run/libvirt-sock")
    }
}

struct SocketAway(PathBuf);

#[async_trait]
impl Outage for SocketAway {
    async fn end(self: Box<Self>) {
        std::fs::rename(self.0.with_extension("away"), &self.0).expect("socket back");
    }
}

#[async_trait]
impl Target for LibvirtOnQemu {
    fn name(&self) -> String {
        "libvirt on libvirtd + QEMU".into()
    }

    async fn connect(&self) -> Result<Arc<dyn Backend>, BackendError> {
        LibvirtFactory::new().connect(&Connection {
            class: ProviderClass::Libvirt,
            endpoint: self.rig.uri.clone(),
            credentials: Default::default(),
            ca_bundle: None,
            insecure_skip_tls_verify: false,
            settings: [
                ("domainType".into(), "qemu".into()),
                ("shutdownTimeout".into(), "20s".into()),
            ]
            .into(),
        })
    }

    fn request(&self, identity: MachineIdentity) -> MachineRequest {
        // Headroom for CPUs and memory: raised live within it (the suite's memory step
        // is 512 MiB). A CPU topology over the 4 vCPUs it can have (2 sockets of 2
        // cores), so the coresPerSocket rows run (2 → 4 → 2, at the next boot) and vCPUs
        // are hot-plugged into it.
        let spec = serde_json::from_value(json!({
            "image": {"volume": {"pool": POOL, "name": IMAGE_VOLUME}},
            "storagePool": POOL, "cpus": 1, "maxCPUs": 4, "coresPerSocket": 2,
            "memoryMiB": 256, "maxMemoryMiB": 1024,
            "firmware": "bios", "additionalDisks": [{"name": "data", "sizeGiB": 1}],
            "network": [{"network": NETWORK, "mtu": 1400}], "powerState": "PoweredOn",
        }))
        .expect("a valid LibvirtMachine spec");
        request(identity, MachineSpec::Libvirt(spec), None)
    }

    async fn outage(&self) -> Result<Box<dyn Outage>, String> {
        let socket = self.socket();
        std::fs::rename(&socket, socket.with_extension("away"))
            .map_err(|e| format!("moving {}: {e}", socket.display()))?;
        Ok(Box::new(SocketAway(socket)))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libvirt_conforms_on_qemu() {
    let Some(rig) = LibvirtRig::start() else {
        return;
    };
    let target = LibvirtOnQemu { rig };
    let report = banlieue_conformance::run(&target).await;
    eprintln!("{report}");
    report.assert_complete();
    assert_eq!(target.rig.domains(), Vec::new(), "domains left");
    assert_eq!(
        target.rig.volumes(),
        [IMAGE_VOLUME.to_string()],
        "volumes left"
    );
}

// ---- Cloud Hypervisor on the spec-checked fake VMM ----

struct ChOnFake {
    rig: ChRig,
}

struct Stopped(Vec<u32>);

fn signal(pids: &[u32], signal: &str) {
    for pid in pids {
        let _ = std::process::Command::new("kill")
            .args([signal, &pid.to_string()])
            .status();
    }
}

#[async_trait]
impl Outage for Stopped {
    async fn end(self: Box<Self>) {
        signal(&self.0, "-CONT");
    }
}

#[async_trait]
impl Target for ChOnFake {
    fn name(&self) -> String {
        "cloud-hypervisor on the fake VMM".into()
    }

    async fn connect(&self) -> Result<Arc<dyn Backend>, BackendError> {
        let mut settings: BTreeMap<String, String> = self.rig.settings();
        // A stopped VMM is an unanswered API call after 1 s, not a hung VMM to kill (60 s).
        settings.insert("apiTimeout".into(), "1s".into());
        ChFactory::new().connect(&Connection {
            class: ProviderClass::CloudHypervisor,
            endpoint: self.rig.endpoint(),
            credentials: BTreeMap::new(),
            ca_bundle: None,
            insecure_skip_tls_verify: false,
            settings,
        })
    }

    fn request(&self, identity: MachineIdentity) -> MachineRequest {
        // A CPU topology over the 4 vCPUs it can have (2 packages of 2 cores), so the
        // coresPerSocket rows run (2 → 4 → 2, at the next boot).
        let spec = serde_json::from_value(json!({
            "image": self.rig.image, "cpus": 1, "maxCPUs": 4, "coresPerSocket": 2,
            "memoryMiB": 512,
            "maxMemoryMiB": 2048, "diskGiB": 1,
            "additionalDisks": [{"name": "data", "sizeGiB": 1}],
            "network": [{"macAddress": "52:54:00:c0:ff:01"}], "powerState": "PoweredOn",
        }))
        .expect("a valid CloudHypervisorMachine spec");
        request(identity, MachineSpec::CloudHypervisor(spec), None)
    }

    async fn outage(&self) -> Result<Box<dyn Outage>, String> {
        let pids = self.rig.all_vmm_pids();
        if pids.is_empty() {
            return Err("no VMM process runs".into());
        }
        signal(&pids, "-STOP");
        Ok(Box::new(Stopped(pids)))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloud_hypervisor_conforms_on_the_fake_vmm() {
    let target = ChOnFake {
        rig: ChRig::new(FAKE_CH, Guest::Exit),
    };
    let report = banlieue_conformance::run(&target).await;
    eprintln!("{report}");
    report.assert_complete();
    assert_eq!(target.rig.all_vmm_pids(), Vec::<u32>::new(), "VMMs left");
    if target.rig.is_fake() {
        target.rig.assert_conformant();
    }
}
