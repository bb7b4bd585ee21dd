//! Crash safety: the operator is killed without warning at seeded random moments while
//! 200 VirtualMachines on the simulated backend are being created, and again while they
//! are being deleted, and restarted each time. Afterwards there is exactly one backend
//! machine per VirtualMachine, nothing is left once they are deleted, and no finalizer
//! is stuck. The seed is printed; `BANLIEUE_CHAOS_SEED=<seed>` replays a run.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use banlieue_backend_sim::SimFactory;
use banlieue_integration_tests::apply;
use banlieue_integration_tests::chaos::Chaos;
use banlieue_integration_tests::crashable::CrashableOperator;
use banlieue_sdk::api::VirtualMachine;
use banlieue_sdk::api::common::ProviderClass;
use banlieue_sdk::api::infra::libvirt::LibvirtMachine;
use banlieue_sdk::backend::BackendRegistry;
use banlieue_sdk::conditions;
use banlieue_testenv::TestNamespace;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams};
use serde_json::{Value, json};

/// 200 by default; `make chaos` sets `BANLIEUE_CHAOS_VMS` higher.
fn vm_count() -> usize {
    std::env::var("BANLIEUE_CHAOS_VMS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(200)
}
const KILLS_WHILE_CREATING: usize = 4;
const KILLS_WHILE_DELETING: usize = 3;
const CONVERGE: Duration = Duration::from_secs(240);

fn fixtures(ns: &TestNamespace) -> Vec<Value> {
    vec![
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "sim"},
               "spec": {"class": "sim", "connection": {"endpoint": format!("sim://{}", ns.name)},
                        "capabilities": {"storageClasses": [{"name": "fast", "target": {"pool": "default"}}]},
                        // Long enough that kills land while operations are in flight.
                        "settings": {"latency": "300ms"}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": format!("{}-small", ns.name)},
               "spec": {"cpus": 1, "memoryMiB": 512, "disk": {"sizeGiB": 5, "storageClass": "fast"}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": format!("{}-debian", ns.name)},
               "spec": {"os": {"family": "linux", "distribution": "debian", "version": "13"}, "sources": {"sim": {"name": "debian"}}}}),
    ]
}

fn vm(ns: &TestNamespace, index: usize) -> Value {
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": format!("vm-{index:05}")},
           "spec": {"classRef": {"name": format!("{}-small", ns.name)}, "imageRef": {"name": format!("{}-debian", ns.name)},
                    "placement": {"providerRef": {"name": "sim"}}}})
}

fn is_ready(vm: &VirtualMachine) -> bool {
    vm.status
        .as_ref()
        .is_some_and(|s| conditions::is_true(&s.conditions, "Ready"))
}

struct Rig {
    ns: TestNamespace,
    sim: Arc<SimFactory>,
    endpoint: String,
    chaos: Chaos,
    incarnations: usize,
}

impl Rig {
    fn start_operator(&mut self) -> CrashableOperator {
        let mut registry = BackendRegistry::default();
        registry.register(ProviderClass::Sim, self.sim.clone());
        let mut config = banlieue_testenv::shared().kube_config();
        config.default_namespace.clone_from(&self.ns.name);
        self.incarnations += 1;
        CrashableOperator::start(config, &self.ns.name, registry, Duration::from_secs(30))
    }

    /// Kills and restarts the operator `kills` times at random moments, while `work`
    /// proceeds; returns the incarnation left running.
    async fn kill_repeatedly(
        &mut self,
        mut operator: CrashableOperator,
        kills: usize,
    ) -> CrashableOperator {
        for _ in 0..kills {
            let uptime = self
                .chaos
                .between(Duration::from_millis(300), Duration::from_millis(3000));
            tokio::time::sleep(uptime).await;
            assert!(
                !operator.has_exited(),
                "seed {}: the operator returned on its own",
                self.chaos.seed()
            );
            operator.kill();
            let downtime = self
                .chaos
                .between(Duration::from_millis(0), Duration::from_millis(1000));
            tokio::time::sleep(downtime).await;
            operator = self.start_operator();
        }
        operator
    }

    fn backend_uids(&self) -> BTreeSet<String> {
        self.sim
            .machines(&self.endpoint)
            .into_iter()
            .map(|m| m.identity.uid)
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_operator_while_creating_and_deleting_200_vms_loses_and_leaks_nothing() {
    let ns = banlieue_testenv::namespace("crash").await;
    for object in fixtures(&ns) {
        apply(&ns.client, &ns.name, &object).await.expect("fixture");
    }
    let endpoint = format!("sim://{}", ns.name);
    let mut rig = Rig {
        chaos: Chaos::from_env("crash_safety"),
        sim: Arc::new(SimFactory::new()),
        endpoint,
        ns,
        incarnations: 0,
    };
    let seed = rig.chaos.seed();
    let count = vm_count();
    let vms: Api<VirtualMachine> = rig.ns.api();
    let machines: Api<LibvirtMachine> = rig.ns.api();

    // Create: all 200 objects go in at once, the operator is killed while it works.
    let operator = rig.start_operator();
    let client = rig.ns.client.clone();
    let namespace = rig.ns.name.clone();
    let objects: Vec<Value> = (0..count).map(|i| vm(&rig.ns, i)).collect();
    let creator = tokio::spawn(async move {
        for object in objects {
            apply(&client, &namespace, &object)
                .await
                .expect("create a VM");
        }
    });
    let operator = rig.kill_repeatedly(operator, KILLS_WHILE_CREATING).await;
    creator.await.expect("creator");
    let started = Instant::now();
    loop {
        let list = vms.list(&ListParams::default()).await.expect("list VMs");
        let ready = list.items.iter().filter(|v| is_ready(v)).count();
        if ready == count {
            break;
        }
        assert!(
            started.elapsed() < CONVERGE,
            "seed {seed}: only {ready}/{count} VMs Ready {CONVERGE:?} after the last restart"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // Exactly one backend machine per VirtualMachine, and it is the one its infra
    // machine stands for.
    let infra = machines.list(&ListParams::default()).await.expect("list");
    let infra_uids: BTreeSet<String> = infra.items.iter().filter_map(|m| m.uid()).collect();
    assert_eq!(infra.items.len(), count, "seed {seed}: infra machines");
    let backend = rig.sim.machines(&rig.endpoint);
    assert_eq!(
        backend.len(),
        count,
        "seed {seed}: backend machines after {} incarnations",
        rig.incarnations
    );
    assert_eq!(
        rig.backend_uids(),
        infra_uids,
        "seed {seed}: backend machines are not exactly the infra machines"
    );
    assert!(
        backend.iter().all(|m| m.created && !m.deleting),
        "seed {seed}: a backend machine is not plainly running"
    );

    // Delete: everything goes at once, the operator is killed while it cleans up.
    vms.delete_collection(&DeleteParams::background(), &ListParams::default())
        .await
        .expect("delete all VMs");
    let operator = rig.kill_repeatedly(operator, KILLS_WHILE_DELETING).await;
    let started = Instant::now();
    loop {
        let left = vms.list(&ListParams::default()).await.expect("list").items;
        let infra_left = machines
            .list(&ListParams::default())
            .await
            .expect("list")
            .items;
        if left.is_empty() && infra_left.is_empty() {
            break;
        }
        assert!(
            started.elapsed() < CONVERGE,
            "seed {seed}: {} VMs and {} infra machines still there {CONVERGE:?} after the last restart; \
             first: {:?}",
            left.len(),
            infra_left.len(),
            left.first()
                .map(|v| (v.name_any(), v.finalizers().to_vec()))
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        rig.backend_uids(),
        BTreeSet::new(),
        "seed {seed}: backend machines leaked after delete-all"
    );
    assert!(!operator.has_exited(), "seed {seed}: the operator returned");
    eprintln!(
        "crash_safety: seed {seed}, {} incarnations, {count} VMs created and deleted",
        rig.incarnations
    );
    operator.kill();
}
