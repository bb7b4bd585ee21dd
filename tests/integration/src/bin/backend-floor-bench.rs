//! `backend-floor-bench`: banlieue's calls to a hypervisor API, sessions and times for N
//! machines, as ratios to a minimal client doing the same lifecycle on the same
//! simulator. Writes `docs/benchmarks/backends-<date>.md`; `make bench-backends` builds
//! and runs it.
//!
//! ```text
//! backend-floor-bench [--n N] [--backends vsphere,proxmox] [--out DIR]
//! ```
//!
//! The lifecycle, for N machines at once: clone from the template with the bootstrap
//! data, power on, wait for a guest address, power off, destroy.
//!
//! - **floor**: a minimal client inside the simulator's harness process, talking to the
//!   simulator over loopback like any client: govmomi for vcsim
//!   (`tests/testbin/vcsim/floor.go`), plain HTTP for fakepve
//!   (`tests/testbin/fakepve/harness.py`, `floor`). It makes every call it needs and
//!   no other: one session, one lookup of each inventory object, waits that cost the
//!   fewest requests the API allows.
//! - **banlieue**: the controllers (as the integration tests run them: in this process,
//!   watching one namespace of the shared test control plane) with the shipped
//!   defaults (no Provider settings; the 10-minute sync period), against a fresh
//!   simulator: a Provider, a class, an image, then N VirtualMachines applied at once,
//!   timed to all Ready with an address, then deleted at once, timed to all gone.
//!
//! Both sides are counted by the simulator itself (calls by method, sessions opened),
//! so a ratio compares like with like. Nothing is asserted: the numbers are reported.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use banlieue_backend_proxmox::ProxmoxFactory;
use banlieue_backend_sim::SimFactory;
use banlieue_backend_vsphere::VSphereFactory;
use banlieue_integration_tests::apply;
use banlieue_integration_tests::fakepve::FakePve;
use banlieue_integration_tests::operator::{Operator, wait_for};
use banlieue_integration_tests::vcsim::{self, Vcsim};
use banlieue_sdk::api::common::ProviderClass;
use banlieue_sdk::api::{Provider, VMImage, VirtualMachine};
use banlieue_sdk::backend::BackendRegistry;
use banlieue_sdk::conditions;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::{Value, json};

/// How long one side may take to get all machines Ready, or all gone.
const WAIT: Duration = Duration::from_secs(600);
/// How often the VirtualMachines are listed while waiting (costs the simulator nothing).
const POLL: Duration = Duration::from_millis(100);

struct Args {
    n: usize,
    backends: Vec<String>,
    out: PathBuf,
}

fn usage(why: &str) -> ! {
    eprintln!(
        "backend-floor-bench: {why}\nusage: backend-floor-bench [--n N] [--backends vsphere,proxmox] [--out DIR]"
    );
    std::process::exit(2);
}

fn args() -> Args {
    let mut args = Args {
        n: 100,
        backends: vec!["vsphere".into(), "proxmox".into()],
        out: Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/benchmarks"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .unwrap_or_else(|| usage(&format!("{flag} needs a value")))
        };
        match flag.as_str() {
            "--n" => {
                args.n = value()
                    .parse()
                    .unwrap_or_else(|_| usage("--n takes a count"))
            }
            "--backends" => args.backends = value().split(',').map(str::to_owned).collect(),
            "--out" => args.out = PathBuf::from(value()),
            other => usage(&format!("unknown flag {other}")),
        }
    }
    if args.n == 0 {
        usage("--n must be positive");
    }
    args
}

/// One side's run: seconds to all addressed and to all gone, the calls of each phase by
/// method (or by `METHOD path` for PVE), and the sessions (logins) it opened.
#[derive(Debug, Default, Clone)]
struct Side {
    ready_seconds: f64,
    gone_seconds: f64,
    ready_calls: BTreeMap<String, u64>,
    gone_calls: BTreeMap<String, u64>,
    sessions: u64,
}

impl Side {
    fn calls(&self) -> u64 {
        self.ready_calls
            .values()
            .chain(self.gone_calls.values())
            .sum()
    }
}

fn counts(value: &Value) -> BTreeMap<String, u64> {
    value
        .as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_u64()?)))
                .collect()
        })
        .unwrap_or_default()
}

fn diff(after: &BTreeMap<String, u64>, before: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter_map(|(k, v)| {
            let d = v.saturating_sub(before.get(k).copied().unwrap_or(0));
            (d > 0).then(|| (k.clone(), d))
        })
        .collect()
}

/// What each backend's simulator needs from the common driver.
trait Simulator {
    /// Calls so far, by method.
    fn calls(&self) -> BTreeMap<String, u64>;
    /// How many of `calls` opened a session.
    fn logins(calls: &BTreeMap<String, u64>) -> u64;
    /// The Provider `hv`, as [`provider`] takes it.
    fn provider(&self) -> ProviderParts;
    /// The image's `sources`.
    fn image_sources(&self) -> Value;
    /// Every VM the simulator has, the template(s) included, as its harness lists them.
    fn vms(&self) -> Vec<Value>;
    /// The machines the simulator has, the template(s) left out.
    fn machines_left(&self) -> usize {
        self.vms()
            .iter()
            .filter(|vm| vm["template"] != true)
            .count()
    }
}

/// What differs between the backends' Providers: class, connection, credentials and
/// where the `fast` storage class and the `lan` network class go.
struct ProviderParts {
    class: &'static str,
    endpoint: String,
    ca_pem: String,
    credentials: Value,
    storage: Value,
    network: Value,
}

/// The Provider `hv` (with its credentials Secret) that banlieue's side uses.
fn provider(parts: ProviderParts) -> [Value; 2] {
    [
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hv-credentials"},
               "stringData": parts.credentials}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "hv"},
        "spec": {
            "class": parts.class,
            "connection": {"endpoint": parts.endpoint,
                           "credentialsRef": {"name": "hv-credentials"},
                           "caBundle": {"inline": parts.ca_pem}},
            "capabilities": {
                "storageClasses": [{"name": "fast", "target": parts.storage}],
                "networkClasses": [{"name": "lan", "target": parts.network}]
            }
        }}),
    ]
}

struct VcsimSide(Vcsim);

impl Simulator for VcsimSide {
    fn calls(&self) -> BTreeMap<String, u64> {
        counts(&self.0.command(json!({"cmd": "calls"}))["calls"])
    }
    fn logins(calls: &BTreeMap<String, u64>) -> u64 {
        calls.get("Login").copied().unwrap_or(0)
    }
    fn provider(&self) -> ProviderParts {
        let sim = &self.0.ready;
        ProviderParts {
            class: "vsphere",
            endpoint: format!("{}/sdk", sim.endpoint),
            ca_pem: sim.ca_pem.clone(),
            credentials: json!({"username": sim.username, "password": sim.password}),
            storage: json!({"datastore": "LocalDS_0"}),
            network: json!({"portGroup": "VM Network"}),
        }
    }
    fn image_sources(&self) -> Value {
        json!({"vsphere": {"template": self.0.ready.template}})
    }
    fn vms(&self) -> Vec<Value> {
        self.0.vms()
    }
}

struct FakePveSide(FakePve);

impl Simulator for FakePveSide {
    fn calls(&self) -> BTreeMap<String, u64> {
        counts(&self.0.command(json!({"cmd": "request_counts"}))["counts"])
    }
    fn logins(calls: &BTreeMap<String, u64>) -> u64 {
        calls.get("POST /access/ticket").copied().unwrap_or(0)
    }
    fn provider(&self) -> ProviderParts {
        let r = &self.0.ready;
        ProviderParts {
            class: "proxmox",
            endpoint: r.endpoint.clone(),
            ca_pem: r.ca_pem.clone(),
            credentials: json!({"tokenID": r.token_id, "tokenSecret": r.token_secret}),
            storage: json!({"storage": "local-lvm"}),
            network: json!({"bridge": "vmbr0"}),
        }
    }
    fn image_sources(&self) -> Value {
        json!({"proxmox": {"templateID": self.0.ready.template_id}})
    }
    fn vms(&self) -> Vec<Value> {
        self.0.vms()
    }
}

fn is_ready(vm: &VirtualMachine) -> bool {
    let status = vm.status.as_ref();
    conditions::is_true(
        status.map(|s| s.conditions.as_slice()).unwrap_or_default(),
        "Ready",
    ) && status.is_some_and(|s| !s.addresses.is_empty())
}

/// banlieue's side against `sim`, whose factory `registry` holds.
async fn banlieue<S: Simulator>(
    sim: &S,
    class: ProviderClass,
    registry: BackendRegistry,
    n: usize,
) -> Side {
    let ns = banlieue_testenv::namespace(&format!("floor-{}", class.as_str())).await;
    let at_start = sim.calls();
    let others = sim.machines_left();
    let mut objects = provider(sim.provider()).to_vec();
    objects.extend([
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": format!("{}-small", ns.name)},
               "spec": {"cpus": 2, "memoryMiB": 1024, "disk": {"sizeGiB": 16, "storageClass": "fast"}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": format!("{}-image", ns.name)},
               "spec": {"os": {"family": "linux", "distribution": "ubuntu", "version": "24.04"},
                        "sources": sim.image_sources()}}),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "user-data"},
               "stringData": {"value": "#cloud-config\nruncmd: [echo banlieue]\n"}}),
    ]);
    for object in &objects {
        apply(&ns.client, &ns.name, object).await.expect("fixture");
    }
    let shipped = banlieue_sdk::controllers::Settings::default().sync_period;
    let operator = Operator::start_with_registry(
        ns.client.clone(),
        &ns.name,
        registry,
        Arc::new(SimFactory::new()),
        shipped,
    );
    let providers: Api<Provider> = ns.api();
    wait_for(&providers, "hv", WAIT, |p| {
        conditions::is_true(
            p.status
                .as_ref()
                .map(|s| s.conditions.as_slice())
                .unwrap_or_default(),
            "Ready",
        )
    })
    .await;
    let images: Api<VMImage> = Api::all(ns.client.clone());
    wait_for(&images, &format!("{}-image", ns.name), WAIT, |i| {
        i.status.as_ref().is_some_and(|s| {
            s.providers
                .iter()
                .any(|r| r.namespace == ns.name && r.available)
        })
    })
    .await;

    let before = sim.calls();
    let started = Instant::now();
    let vms: Api<VirtualMachine> = ns.api();
    futures::future::join_all((0..n).map(|i| {
        let vm = json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
            "metadata": {"name": format!("m-{i}")},
            "spec": {"classRef": {"name": format!("{}-small", ns.name)},
                     "imageRef": {"name": format!("{}-image", ns.name)},
                     "bootstrap": {"format": "cloud-config", "userData": {"name": "user-data"}},
                     "networks": [{"name": "eth0", "networkClass": "lan"}]}
        });
        let ns = &ns;
        async move {
            apply(&ns.client, &ns.name, &vm)
                .await
                .expect("a VirtualMachine")
        }
    }))
    .await;
    wait_all(&vms, n, is_ready, "Ready with an address").await;
    let ready_seconds = started.elapsed().as_secs_f64();
    let at_ready = sim.calls();

    let deleting = Instant::now();
    for vm in vms.list(&ListParams::default()).await.expect("list").items {
        vms.delete(&vm.name_any(), &DeleteParams::default())
            .await
            .expect("delete");
    }
    wait_all(&vms, 0, |_| true, "gone").await;
    let gone_seconds = deleting.elapsed().as_secs_f64();
    let at_gone = sim.calls();
    drop(operator);
    let left = sim.machines_left().saturating_sub(others);
    if left != 0 {
        eprintln!(
            "backend-floor-bench: {left} {class:?} machines left after every VirtualMachine was gone"
        );
    }
    Side {
        ready_seconds,
        gone_seconds,
        ready_calls: diff(&at_ready, &before),
        gone_calls: diff(&at_gone, &at_ready),
        sessions: S::logins(&diff(&at_gone, &at_start)),
    }
}

/// Waits until `want` VirtualMachines are listed and all pass `done` (0: none left).
async fn wait_all(
    vms: &Api<VirtualMachine>,
    want: usize,
    done: impl Fn(&VirtualMachine) -> bool,
    what: &str,
) {
    let started = Instant::now();
    loop {
        let listed = vms
            .list(&ListParams::default())
            .await
            .expect("list VMs")
            .items;
        let passing = listed.iter().filter(|v| done(v)).count();
        if listed.len() == want && passing == want {
            return;
        }
        if started.elapsed() > WAIT {
            eprintln!(
                "backend-floor-bench: not all {what} after {WAIT:?}: {passing} of {}",
                listed.len()
            );
            std::process::exit(1);
        }
        tokio::time::sleep(POLL).await;
    }
}

fn floor_side(answer: &Value) -> Side {
    Side {
        ready_seconds: answer["readySeconds"].as_f64().unwrap_or_default(),
        gone_seconds: answer["goneSeconds"].as_f64().unwrap_or_default(),
        ready_calls: counts(&answer["readyCalls"]),
        gone_calls: counts(&answer["goneCalls"]),
        sessions: answer["sessions"].as_u64().unwrap_or(1),
    }
}

async fn vsphere(n: usize) -> (Side, Side, String) {
    let binary = vcsim::binary().unwrap_or_else(|why| {
        eprintln!("backend-floor-bench: vcsim cannot be built here: {why}");
        std::process::exit(1);
    });
    let floor = {
        let sim = Vcsim::start_with(&binary, &[]);
        let answer = sim.command(json!({"cmd": "floor", "n": n}));
        let mut side = floor_side(&answer);
        side.sessions = VcsimSide::logins(&side.ready_calls) + VcsimSide::logins(&side.gone_calls);
        side
    };
    let sim = VcsimSide(Vcsim::start_with(&binary, &[]));
    let version = sim.0.ready.version.clone();
    let mut registry = BackendRegistry::default();
    registry.register(ProviderClass::Vsphere, Arc::new(VSphereFactory::new()));
    let ours = banlieue(&sim, ProviderClass::Vsphere, registry, n).await;
    (floor, ours, version)
}

async fn proxmox(n: usize) -> (Side, Side, String) {
    let venv = banlieue_integration_tests::fakepve::venv().unwrap_or_else(|why| {
        eprintln!("backend-floor-bench: fakepve cannot be installed here: {why}");
        std::process::exit(1);
    });
    let floor = {
        let pve = FakePve::start_with(&venv);
        let answer = pve.command(json!({"cmd": "floor", "n": n}));
        let mut side = floor_side(&answer);
        side.sessions =
            FakePveSide::logins(&side.ready_calls) + FakePveSide::logins(&side.gone_calls);
        side
    };
    let pve = FakePveSide(FakePve::start_with(&venv));
    let version = "fakepve 0.5.0".to_owned();
    let mut registry = BackendRegistry::default();
    registry.register(ProviderClass::Proxmox, Arc::new(ProxmoxFactory::new()));
    let ours = banlieue(&pve, ProviderClass::Proxmox, registry, n).await;
    (floor, ours, version)
}

// ---- report --------------------------------------------------------------------------

fn ratio(ours: f64, floor: f64) -> String {
    if floor > 0.0 {
        format!("{:.2}×", ours / floor)
    } else {
        "n/a".into()
    }
}

fn per_machine(calls: u64, n: usize) -> String {
    format!("{:.2}", calls as f64 / n as f64)
}

fn calls_table(out: &mut String, floor: &Side, ours: &Side, n: usize) {
    let mut methods: Vec<&String> = floor
        .ready_calls
        .keys()
        .chain(floor.gone_calls.keys())
        .chain(ours.ready_calls.keys())
        .chain(ours.gone_calls.keys())
        .collect();
    methods.sort();
    methods.dedup();
    out.push_str("| call | floor, to Ready | banlieue, to Ready | floor, to gone | banlieue, to gone |\n|---|---|---|---|---|\n");
    let get = |m: &BTreeMap<String, u64>, k: &str| m.get(k).copied().unwrap_or(0);
    for method in methods {
        out.push_str(&format!(
            "| `{method}` | {} | {} | {} | {} |\n",
            get(&floor.ready_calls, method),
            get(&ours.ready_calls, method),
            get(&floor.gone_calls, method),
            get(&ours.gone_calls, method),
        ));
    }
    out.push_str(&format!(
        "| **per machine** | {} | {} | {} | {} |\n\n",
        per_machine(floor.ready_calls.values().sum(), n),
        per_machine(ours.ready_calls.values().sum(), n),
        per_machine(floor.gone_calls.values().sum(), n),
        per_machine(ours.gone_calls.values().sum(), n),
    ));
}

/// The calls banlieue makes beyond the floor, largest first: `name +x.xx` per machine.
fn excess(floor: &Side, ours: &Side, n: usize) -> String {
    let total = |side: &Side| {
        let mut all = side.ready_calls.clone();
        for (k, v) in &side.gone_calls {
            *all.entry(k.clone()).or_default() += v;
        }
        all
    };
    let (floor, ours) = (total(floor), total(ours));
    let mut extra: Vec<(String, f64)> = ours
        .iter()
        .map(|(k, v)| {
            let over = *v as f64 - floor.get(k).copied().unwrap_or(0) as f64;
            (k.clone(), over / n as f64)
        })
        .filter(|(_, over)| *over > 0.0)
        .collect();
    extra.sort_by(|a, b| b.1.total_cmp(&a.1));
    extra
        .iter()
        .take(5)
        .map(|(k, over)| format!("`{k}` +{over:.2}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn today() -> String {
    let out = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d"])
        .output()
        .expect("date");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = args();
    let started = Instant::now();
    let mut rows = Vec::new();
    for backend in &args.backends {
        eprintln!("backend-floor-bench: {backend}, N = {}", args.n);
        let (floor, ours, version) = match backend.as_str() {
            "vsphere" => vsphere(args.n).await,
            "proxmox" => proxmox(args.n).await,
            other => usage(&format!("unknown backend {other}")),
        };
        eprintln!(
            "backend-floor-bench: {backend}: calls/machine {} vs floor {}, sessions {} vs {}, Ready {:.1}s vs {:.1}s, gone {:.1}s vs {:.1}s",
            per_machine(ours.calls(), args.n),
            per_machine(floor.calls(), args.n),
            ours.sessions,
            floor.sessions,
            ours.ready_seconds,
            floor.ready_seconds,
            ours.gone_seconds,
            floor.gone_seconds
        );
        rows.push((backend.clone(), version, floor, ours));
    }
    let date = today();
    let mut out = format!(
        "# Backend floors, {date}\n\n\
         Written by `make bench-backends` (`tests/integration/src/bin/backend-floor-bench.rs`; \
         how each side is run is in its header). N = {n} machines at once per backend: clone from \
         the template with the bootstrap data, power on, wait for a guest address, power off, destroy. \
         **floor**: a minimal client in the simulator's harness process. **banlieue**: the controllers \
         with the shipped defaults against a fresh simulator, timed from the first VirtualMachine \
         applied (its Provider Ready and image found before; the floor's time includes its login and lookups). \
         Both counted by the simulator. \
         Goal (issue 21 §5): calls per machine and time to all Ready ≤ 1.2× the floor, 1 session per Provider. \
         Took {took:.0} s in all.\n\n",
        n = args.n,
        took = started.elapsed().as_secs_f64(),
    );
    out.push_str("| backend | simulator | calls/machine (banlieue / floor) | ratio | sessions (banlieue / floor) | all Ready (s) | ratio | all gone (s) | ratio |\n|---|---|---|---|---|---|---|---|---|\n");
    for (backend, version, floor, ours) in &rows {
        out.push_str(&format!(
            "| {backend} | {version} | {} / {} | {} | {} / {} | {:.2} / {:.2} | {} | {:.2} / {:.2} | {} |\n",
            per_machine(ours.calls(), args.n),
            per_machine(floor.calls(), args.n),
            ratio(ours.calls() as f64, floor.calls() as f64),
            ours.sessions,
            floor.sessions,
            ours.ready_seconds,
            floor.ready_seconds,
            ratio(ours.ready_seconds, floor.ready_seconds),
            ours.gone_seconds,
            floor.gone_seconds,
            ratio(ours.gone_seconds, floor.gone_seconds),
        ));
    }
    out.push_str("\nGoals (issue 21 §5), met or not:\n\n");
    let verdict = |ok: bool| if ok { "met" } else { "**not met**" };
    for (backend, _, floor, ours) in &rows {
        let calls = ours.calls() as f64 / floor.calls().max(1) as f64;
        let ready = ours.ready_seconds / floor.ready_seconds.max(f64::EPSILON);
        out.push_str(&format!(
            "- {backend}: calls per machine ≤ 1.2× the floor: {} ({calls:.2}×); all Ready ≤ 1.2×: {} ({ready:.2}×); \
             one session per Provider: {} ({} opened{})\n",
            verdict(calls <= 1.2),
            verdict(ready <= 1.2),
            verdict(ours.sessions <= 1),
            ours.sessions,
            if backend == "proxmox" { "; API tokens open none" } else { "" },
        ));
    }
    out.push_str(
        "\nWhat stands in the way, by the calls banlieue makes beyond the floor (per machine, whole lifecycle):\n\n",
    );
    for (backend, _, floor, ours) in &rows {
        out.push_str(&format!("- {backend}: {}\n", excess(floor, ours, args.n)));
    }
    out.push_str(
        "\nThe floor's waits: on vcsim, one property filter over a container view (no polling); on fakepve, \
         one `GET /cluster/resources` per 100 ms round for all machines. banlieue shares one listing among \
         the reconciles of a 50 ms round on Proxmox and reads a vSphere VM with its task in one call, but \
         each machine is still reconciled on its own, its tasks polled from 250 ms after they start up to \
         the shipped `taskPollInterval` (2 s on Proxmox, 1 s on vSphere), and its creates held to the \
         shipped cap of 10 at a time per Provider (`maxConcurrentCreates`), which the floor does not have: \
         those waits, not the simulators (whose tasks end at once), are most of its time here.\n",
    );
    out.push('\n');
    for (backend, _, floor, ours) in &rows {
        out.push_str(&format!("## {backend}: calls by method\n\n"));
        calls_table(&mut out, floor, ours, args.n);
    }
    std::fs::create_dir_all(&args.out).expect("report dir");
    let path = args.out.join(format!("backends-{date}.md"));
    std::fs::write(&path, out).expect("writing the report");
    println!("{}", path.display());
}
