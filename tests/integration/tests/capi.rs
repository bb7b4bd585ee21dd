//! The Cluster API contract end to end: the real CAPI core manager (v1.14, built from
//! its Go module, running under a ServiceAccount bound only to its own role and
//! banlieue's aggregate role) and banlieue's controllers (sim backend, Providers
//! serving `VSphereMachine`s) on the shared control plane.
//!
//! One Cluster spanning two Providers (think: two vCenters) goes through what CAPI
//! does to an infrastructure provider: failure domains and `provisioned` flow up to the
//! Cluster; a Machine placed by CAPI in a failure domain gets its VM there with the
//! bootstrap data, and CAPI copies providerID, addresses and failure domain; a paused
//! Cluster is left alone; a MachineDeployment's replicas spread over the failure
//! domains; deleting Machine and Cluster deletes the infra objects and the VMs.

use std::collections::BTreeSet;
use std::time::Duration;

use banlieue_integration_tests::capi::Capi;
use banlieue_integration_tests::operator::{Operator, wait_for, wait_gone};
use banlieue_integration_tests::{apply, gvk_of};
use banlieue_sdk::api::Provider;
use banlieue_sdk::api::infra::vsphere::{VSphereCluster, VSphereMachine, VSphereMachineTemplate};
use banlieue_sdk::conditions;
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(120);
const CAPI: &str = "cluster.x-k8s.io/v1beta2";
const INFRA: &str = "infrastructure.banlieue.io";

fn sim_provider(ns: &str, name: &str, zones: &str) -> Value {
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": name},
           "spec": {"class": "sim", "connection": {"endpoint": format!("sim://{ns}-{name}")},
                    "settings": {"machineKind": "VSphereMachine", "failureDomains": zones, "latency": "200ms"}}})
}

fn vsphere_machine_spec() -> Value {
    json!({"template": "ubuntu-2404", "numCPUs": 2, "memoryMiB": 4096, "diskGiB": 20})
}

fn capi_machine(name: &str, failure_domain: Option<&str>) -> Value {
    capi_machine_with_secret(name, failure_domain, "c1-bootstrap")
}

fn capi_machine_with_secret(name: &str, failure_domain: Option<&str>, secret: &str) -> Value {
    let mut spec = json!({"clusterName": "c1",
        "bootstrap": {"dataSecretName": secret},
        "infrastructureRef": {"apiGroup": INFRA, "kind": "VSphereMachine", "name": name}});
    if let Some(fd) = failure_domain {
        spec["failureDomain"] = json!(fd);
    }
    json!({"apiVersion": CAPI, "kind": "Machine", "metadata": {"name": name}, "spec": spec})
}

fn dynamic(client: &kube::Client, ns: &str, object: &Value) -> Api<DynamicObject> {
    let gvk = gvk_of(object);
    let kind = gvk.kind.to_lowercase();
    let plural = if kind.ends_with('s') {
        format!("{kind}es")
    } else {
        format!("{kind}s")
    };
    Api::namespaced_with(
        client.clone(),
        ns,
        &ApiResource::from_gvk_with_plural(&gvk, &plural),
    )
}

fn names(list: &Value) -> BTreeSet<String> {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(|fd| fd["name"].as_str().map(str::to_owned))
        .collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// A client acting as banlieue's installed ServiceAccount, bound (here) to exactly the
/// controller ClusterRole `banlieue bootstrap operator` installs: the CAPI paths below
/// then prove that role is enough.
async fn as_banlieue_controller(admin: &kube::Client) -> kube::Client {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/operator");
    let rbac: Vec<Value> = banlieue_integration_tests::load_manifests(&dir)
        .into_iter()
        .map(|(_, object)| object)
        .filter(|o| {
            matches!(
                o["kind"].as_str(),
                Some("ClusterRole" | "ClusterRoleBinding")
            )
        })
        .filter(|o| o["metadata"]["name"] == "banlieue-controller")
        .collect();
    assert_eq!(
        rbac.len(),
        2,
        "deploy/operator has the controller ClusterRole and its binding"
    );
    for object in &rbac {
        apply(admin, "", object).await.expect("controller RBAC");
    }
    let mut config = banlieue_testenv::shared().kube_config();
    config.auth_info.impersonate =
        Some("system:serviceaccount:banlieue-system:banlieue-controller".to_owned());
    config.auth_info.impersonate_groups = Some(vec![
        "system:serviceaccounts".to_owned(),
        "system:serviceaccounts:banlieue-system".to_owned(),
        "system:authenticated".to_owned(),
    ]);
    kube::Client::try_from(config).expect("an impersonating client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_across_two_providers_through_the_real_capi_manager() {
    let Some(capi) = Capi::start() else { return };
    let ns = banlieue_testenv::namespace("capi-e2e").await;
    let client = ns.client.clone();
    // banlieue runs with exactly its installed controller role.
    let operator = Operator::start_with(
        as_banlieue_controller(&client).await,
        &ns.name,
        Duration::from_secs(10),
    );
    let fail = |what: &str| format!("{what}\n--- CAPI manager log ---\n{}", capi.log_tail(40));

    // Two Providers, three failure domains; a VSphereCluster spanning both.
    for object in [
        sim_provider(&ns.name, "vc1", "zone-a,zone-b"),
        sim_provider(&ns.name, "vc2", "zone-c"),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "c1-bootstrap"},
               "stringData": {"value": "#cloud-config\nhostname: from-capi\n", "format": "cloud-config"}}),
        json!({"apiVersion": format!("{INFRA}/v1alpha1"), "kind": "VSphereCluster", "metadata": {"name": "c1"},
               "spec": {"providerRefs": [{"name": "vc1"}, {"name": "vc2"}],
                        "controlPlaneEndpoint": {"host": "192.0.2.10", "port": 6443}}}),
        json!({"apiVersion": CAPI, "kind": "Cluster", "metadata": {"name": "c1"},
               "spec": {"infrastructureRef": {"apiGroup": INFRA, "kind": "VSphereCluster", "name": "c1"}}}),
    ] {
        apply(&client, &ns.name, &object)
            .await
            .unwrap_or_else(|e| panic!("{}", fail(&format!("apply: {e}"))));
    }
    let all = set(&["vc1/zone-a", "vc1/zone-b", "vc2/zone-c"]);
    let clusters: Api<VSphereCluster> = Api::namespaced(client.clone(), &ns.name);
    let infra_cluster = wait_for(&clusters, "c1", WAIT, |c| {
        c.status.as_ref().is_some_and(|s| {
            s.failure_domains
                .iter()
                .map(|f| f.name.clone())
                .collect::<BTreeSet<_>>()
                == all
                && s.initialization.as_ref().and_then(|i| i.provisioned) == Some(true)
        })
    })
    .await;
    assert!(conditions::is_true(
        &infra_cluster.status.unwrap().conditions,
        "Ready"
    ));
    let capi_clusters = dynamic(
        &client,
        &ns.name,
        &json!({"apiVersion": CAPI, "kind": "Cluster"}),
    );
    let cluster = wait_for(&capi_clusters, "c1", WAIT, |c| {
        c.data["status"]["initialization"]["infrastructureProvisioned"] == json!(true)
            && names(&c.data["status"]["failureDomains"]) == all
            && c.data["spec"]["controlPlaneEndpoint"]["host"] == json!("192.0.2.10")
    })
    .await;
    assert_eq!(
        cluster.data["status"]["failureDomains"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
    // CAPI owns the InfraCluster; banlieue labelled the Providers for clusterctl move.
    let infra_cluster = clusters.get("c1").await.unwrap();
    assert!(
        infra_cluster
            .owner_references()
            .iter()
            .any(|o| o.kind == "Cluster" && o.name == "c1")
    );
    // The label follows CAPI's adoption (the owner reference) by one reconcile, which
    // can come after the failure domains CAPI already mirrored.
    let providers: Api<Provider> = Api::namespaced(client.clone(), &ns.name);
    for name in ["vc1", "vc2"] {
        wait_for(&providers, name, WAIT, |p| {
            p.labels().contains_key("clusterctl.cluster.x-k8s.io/move")
        })
        .await;
    }

    // A Machine CAPI placed in vc2/zone-c.
    let machines: Api<VSphereMachine> = Api::namespaced(client.clone(), &ns.name);
    let capi_machines = dynamic(&client, &ns.name, &capi_machine("m1", None));
    apply(
        &client,
        &ns.name,
        &json!({"apiVersion": format!("{INFRA}/v1alpha1"), "kind": "VSphereMachine",
        "metadata": {"name": "m1"}, "spec": vsphere_machine_spec()}),
    )
    .await
    .unwrap();
    apply(&client, &ns.name, &capi_machine("m1", Some("vc2/zone-c")))
        .await
        .unwrap();
    let m1 = wait_for(&capi_machines, "m1", WAIT, |m| {
        m.data["status"]["initialization"]["infrastructureProvisioned"] == json!(true)
            && m.data["spec"]["providerID"].is_string()
            && m.data["status"]["failureDomain"] == json!("vc2/zone-c")
            && m.data["status"]["addresses"]
                .as_array()
                .is_some_and(|a| !a.is_empty())
    })
    .await;
    let infra = machines.get("m1").await.unwrap();
    assert_eq!(
        m1.data["spec"]["providerID"].as_str(),
        infra.spec.provider_id.as_deref()
    );
    assert!(
        infra
            .spec
            .provider_id
            .as_deref()
            .unwrap()
            .starts_with("vsphere://")
    );
    // CAPI made itself the controller owner and set the cluster label.
    assert!(
        infra
            .owner_references()
            .iter()
            .any(|o| o.kind == "Machine" && o.name == "m1" && o.controller == Some(true))
    );
    assert_eq!(
        infra
            .labels()
            .get("cluster.x-k8s.io/cluster-name")
            .map(String::as_str),
        Some("c1")
    );
    // The VM is on vc2, in zone-c, with the bootstrap data of the Machine's Secret.
    let vc2 = format!("sim://{}-vc2", ns.name);
    let uid = infra.uid().unwrap();
    let vm = operator.sim.machine(&vc2, &uid).expect("the VM is on vc2");
    assert_eq!(vm.failure_domain, "zone-c");
    let bootstrap = operator
        .sim
        .bootstrap_data(&vc2, &uid)
        .expect("bootstrap data delivered");
    assert!(bootstrap.user_data.expose().contains("hostname: from-capi"));
    assert!(
        operator
            .sim
            .machines(&format!("sim://{}-vc1", ns.name))
            .is_empty()
    );

    // A paused Cluster is left alone, and resumes when unpaused. m2 is adopted by CAPI
    // while its bootstrap Secret is missing, then the Cluster is paused and the
    // Secret appears: banlieue must not build it until the Cluster is unpaused.
    let pause = |paused: bool| json!({"spec": {"paused": paused}});
    apply(
        &client,
        &ns.name,
        &json!({"apiVersion": format!("{INFRA}/v1alpha1"), "kind": "VSphereMachine",
        "metadata": {"name": "m2"}, "spec": vsphere_machine_spec()}),
    )
    .await
    .unwrap();
    apply(
        &client,
        &ns.name,
        &capi_machine_with_secret("m2", Some("vc1/zone-a"), "m2-bootstrap"),
    )
    .await
    .unwrap();
    wait_for(&machines, "m2", WAIT, |m| {
        m.owner_references().iter().any(|o| o.kind == "Machine")
            && m.status.as_ref().is_some_and(|s| {
                conditions::get(&s.conditions, "Ready")
                    .is_some_and(|c| c.reason == "BootstrapDataNotFound")
            })
    })
    .await;
    capi_clusters
        .patch("c1", &PatchParams::default(), &Patch::Merge(pause(true)))
        .await
        .unwrap();
    let m2 = wait_for(&machines, "m2", WAIT, |m| {
        m.status
            .as_ref()
            .is_some_and(|s| conditions::is_true(&s.conditions, "Paused"))
    })
    .await;
    apply(
        &client,
        &ns.name,
        &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "m2-bootstrap"},
               "stringData": {"value": "#cloud-config\n", "format": "cloud-config"}}),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let m2_uid = m2.uid().unwrap();
    assert!(
        machines.get("m2").await.unwrap().spec.provider_id.is_none(),
        "a paused machine was provisioned"
    );
    assert!(
        operator
            .sim
            .machine(&format!("sim://{}-vc1", ns.name), &m2_uid)
            .is_none()
    );
    capi_clusters
        .patch("c1", &PatchParams::default(), &Patch::Merge(pause(false)))
        .await
        .unwrap();
    wait_for(&machines, "m2", WAIT, |m| {
        m.spec.provider_id.is_some()
            && m.status
                .as_ref()
                .is_some_and(|s| !conditions::is_true(&s.conditions, "Paused"))
    })
    .await;

    // Deleting the Machine deletes the infra machine and the VM.
    capi_machines
        .delete("m1", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&machines, "m1", WAIT).await;
    assert!(
        operator.sim.machine(&vc2, &uid).is_none(),
        "the VM of m1 outlived its Machine"
    );

    // A MachineDeployment of three replicas spreads over the three failure domains.
    apply(
        &client,
        &ns.name,
        &json!({"apiVersion": format!("{INFRA}/v1alpha1"), "kind": "VSphereMachineTemplate",
        "metadata": {"name": "workers"}, "spec": {"template": {"spec": vsphere_machine_spec()}}}),
    )
    .await
    .unwrap();
    let md_labels = json!({"cluster.x-k8s.io/deployment-name": "workers"});
    apply(&client, &ns.name, &json!({"apiVersion": CAPI, "kind": "MachineDeployment",
        "metadata": {"name": "workers",
                     "annotations": {"machineset.cluster.x-k8s.io/skip-preflight-checks": "All"}},
        "spec": {"clusterName": "c1", "replicas": 3,
                 "selector": {"matchLabels": md_labels},
                 "template": {"metadata": {"labels": md_labels},
                              "spec": {"clusterName": "c1",
                                       "bootstrap": {"dataSecretName": "c1-bootstrap"},
                                       "infrastructureRef": {"apiGroup": INFRA, "kind": "VSphereMachineTemplate", "name": "workers"}}}}}))
        .await
        .unwrap_or_else(|e| panic!("{}", fail(&format!("MachineDeployment: {e}"))));
    let started = std::time::Instant::now();
    let landed = loop {
        let list = machines
            .list(&ListParams::default().labels("cluster.x-k8s.io/deployment-name=workers"))
            .await
            .unwrap();
        let landed: Vec<String> = list
            .items
            .iter()
            .filter(|m| m.spec.provider_id.is_some())
            .filter_map(|m| m.status.as_ref()?.failure_domain.clone())
            .collect();
        if landed.len() == 3 {
            break landed;
        }
        assert!(
            started.elapsed() < WAIT,
            "{}",
            fail(&format!(
                "replicas placed so far: {landed:?} of {}",
                list.items.len()
            ))
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(
        landed.into_iter().collect::<BTreeSet<_>>(),
        all,
        "replicas did not spread"
    );
    // The template publishes what the autoscaler needs to scale from zero.
    let templates: Api<VSphereMachineTemplate> = Api::namespaced(client.clone(), &ns.name);
    let template = wait_for(&templates, "workers", WAIT, |t| {
        t.status.as_ref().is_some_and(|s| !s.capacity.is_empty())
    })
    .await;
    let capacity = template.status.unwrap().capacity;
    assert_eq!(
        (capacity["cpu"].0.as_str(), capacity["memory"].0.as_str()),
        ("2", "4096Mi")
    );

    // Deleting the Cluster deletes everything under it, VMs included.
    capi_clusters
        .delete("c1", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&capi_clusters, "c1", WAIT).await;
    wait_gone(&clusters, "c1", WAIT).await;
    let left = machines.list(&ListParams::default()).await.unwrap().items;
    assert!(
        left.is_empty(),
        "infra machines left: {:?}",
        left.iter().map(|m| m.name_any()).collect::<Vec<_>>()
    );
    for endpoint in [vc2.clone(), format!("sim://{}-vc1", ns.name)] {
        assert!(
            operator.sim.machines(&endpoint).is_empty(),
            "VMs left on {endpoint}"
        );
    }
}

/// A machine whose network device takes its address from a CAPI IPAM pool: banlieue
/// claims it (claim owned by the machine), waits for the pool's provider — played
/// here by the test, as the in-cluster IPAM provider would — builds the VM with that
/// address, and releases the claim on delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn addresses_come_from_an_ipam_pool_and_are_released() {
    let Some(_capi) = Capi::start() else { return };
    let ns = banlieue_testenv::namespace("capi-ipam").await;
    let client = ns.client.clone();
    let _operator = Operator::start_with(
        as_banlieue_controller(&client).await,
        &ns.name,
        Duration::from_secs(10),
    );
    let pool =
        json!({"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": "lan"});
    apply(&client, &ns.name, &sim_provider(&ns.name, "vc1", "zone-a"))
        .await
        .unwrap();
    let mut spec = vsphere_machine_spec();
    spec["providerRef"] = json!({"name": "vc1"});
    spec["network"] =
        json!([{"networkName": "VM Network", "ipam": {"mode": "pool", "poolRef": pool}}]);
    apply(
        &client,
        &ns.name,
        &json!({"apiVersion": format!("{INFRA}/v1alpha1"), "kind": "VSphereMachine",
        "metadata": {"name": "m"}, "spec": spec}),
    )
    .await
    .unwrap();

    let machines: Api<VSphereMachine> = Api::namespaced(client.clone(), &ns.name);
    let claims = dynamic(
        &client,
        &ns.name,
        &json!({"apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddressClaim"}),
    );
    let addresses = dynamic(
        &client,
        &ns.name,
        &json!({"apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddress"}),
    );
    let claim = wait_for(&claims, "m-ip-0", WAIT, |_| true).await;
    let machine = wait_for(&machines, "m", WAIT, |m| {
        m.status.as_ref().is_some_and(|s| {
            conditions::get(&s.conditions, "Ready")
                .is_some_and(|c| c.reason == "WaitingForIPAddress")
        })
    })
    .await;
    assert!(
        claim
            .owner_references()
            .iter()
            .any(|o| o.uid == machine.uid().unwrap() && o.controller == Some(true))
    );
    assert_eq!(claim.data["spec"]["poolRef"], pool);
    assert!(
        machine.spec.provider_id.is_none(),
        "built before its address was allocated"
    );

    // The pool's provider allocates.
    apply(&client, &ns.name, &json!({"apiVersion": "ipam.cluster.x-k8s.io/v1beta2", "kind": "IPAddress",
        "metadata": {"name": "m-ip-0"},
        "spec": {"claimRef": {"name": "m-ip-0"}, "poolRef": pool, "address": "10.20.0.7", "prefix": 24, "gateway": "10.20.0.1"}}))
        .await
        .unwrap();
    claims
        .patch_status(
            "m-ip-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"addressRef": {"name": "m-ip-0"}}})),
        )
        .await
        .unwrap();
    wait_for(&machines, "m", WAIT, |m| {
        m.spec.provider_id.is_some()
            && m.status
                .as_ref()
                .is_some_and(|s| s.addresses.iter().any(|a| a.address == "10.20.0.7"))
    })
    .await;

    machines
        .delete("m", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&machines, "m", WAIT).await;
    wait_gone(&claims, "m-ip-0", WAIT).await;
    // The address object is the pool provider's to remove once the claim is gone.
    assert!(addresses.get_opt("m-ip-0").await.unwrap().is_some());
}

/// Machines waiting for an IPAM address hold no create slot: on a Provider capped at
/// two creates at once (`maxConcurrentCreates: "2"`), three machines whose pool never
/// allocates wait `WaitingForIPAddress`, and a fourth with a static address is still
/// created. (Before the fix the slot was taken before the address wait: two of the
/// three held both slots forever, and the fourth stayed `CreateQueued`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn machines_waiting_for_an_address_do_not_hold_create_slots() {
    let Some(_capi) = Capi::start() else { return };
    let ns = banlieue_testenv::namespace("capi-ipam-slots").await;
    let client = ns.client.clone();
    let _operator = Operator::start_with(
        as_banlieue_controller(&client).await,
        &ns.name,
        Duration::from_secs(10),
    );
    let mut provider = sim_provider(&ns.name, "vc1", "zone-a");
    provider["spec"]["settings"]["maxConcurrentCreates"] = json!("2");
    apply(&client, &ns.name, &provider).await.unwrap();
    let pool =
        json!({"apiGroup": "ipam.cluster.x-k8s.io", "kind": "InClusterIPPool", "name": "empty"});
    let machine = |name: &str, ipam: Value| {
        let mut spec = vsphere_machine_spec();
        spec["providerRef"] = json!({"name": "vc1"});
        spec["network"] = json!([{"networkName": "VM Network", "ipam": ipam}]);
        json!({"apiVersion": format!("{INFRA}/v1alpha1"), "kind": "VSphereMachine",
               "metadata": {"name": name}, "spec": spec})
    };
    let machines: Api<VSphereMachine> = Api::namespaced(client.clone(), &ns.name);
    let reason = |m: &VSphereMachine| {
        m.status
            .as_ref()
            .and_then(|s| conditions::get(&s.conditions, "Ready"))
            .map(|c| c.reason.clone())
            .unwrap_or_default()
    };
    let waiting = ["p0", "p1", "p2"];
    for name in waiting {
        apply(
            &client,
            &ns.name,
            &machine(name, json!({"mode": "pool", "poolRef": pool})),
        )
        .await
        .unwrap();
    }
    // Settled: each waits for its address, or (without the fix) for a slot that the
    // other two hold while they wait for theirs.
    for name in waiting {
        wait_for(&machines, name, WAIT, |m| {
            matches!(reason(m).as_str(), "WaitingForIPAddress" | "CreateQueued")
        })
        .await;
    }
    apply(
        &client,
        &ns.name,
        &machine(
            "fixed",
            json!({"mode": "static", "addresses": ["10.20.0.9/24"], "gateway": "10.20.0.1"}),
        ),
    )
    .await
    .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let fixed = machines.get("fixed").await.unwrap();
        if fixed.spec.provider_id.is_some() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the machine with a static address was not created within 60 s while three wait for addresses: Ready reason {:?}, message {:?}",
            reason(&fixed),
            fixed
                .status
                .as_ref()
                .and_then(|s| conditions::get(&s.conditions, "Ready"))
                .map(|c| c.message.clone())
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    for name in waiting {
        let m = machines.get(name).await.unwrap();
        assert_eq!(
            reason(&m),
            "WaitingForIPAddress",
            "{name} still waits for its address (and was never built)"
        );
        assert!(m.spec.provider_id.is_none(), "{name} has no VM");
    }
}

/// The same contract on a real backend: a Cluster whose VSphereCluster spans two
/// vCenters (two vcsims) publishes the failure domains of both; a CAPI Machine placed
/// in the second becomes a clone there (and only there) carrying the Machine's
/// bootstrap data in `guestinfo`, CAPI copies its providerID and addresses, and
/// deleting the Machine destroys the clone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capi_machine_becomes_a_vcsim_clone() {
    use banlieue_integration_tests::vcsim::Vcsim;
    use base64::Engine as _;
    let Some(capi) = Capi::start() else { return };
    let Some(vc) = Vcsim::start() else { return };
    let Some(vc2) = Vcsim::start() else { return };
    let ns = banlieue_testenv::namespace("capi-vcsim").await;
    let client = ns.client.clone();
    let mut registry = banlieue_sdk::backend::BackendRegistry::default();
    registry.register(
        banlieue_sdk::api::common::ProviderClass::Vsphere,
        std::sync::Arc::new(banlieue_backend_vsphere::VSphereFactory::new()),
    );
    let _operator = Operator::start_with_registry(
        client.clone(),
        &ns.name,
        registry,
        std::sync::Arc::new(banlieue_backend_sim::SimFactory::new()),
        Duration::from_secs(5),
    );
    let fail = |what: &str| format!("{what}\n--- CAPI manager log ---\n{}", capi.log_tail(40));
    let vcenter = |name: &str, sim: &Vcsim| {
        [
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": format!("{name}-credentials")},
                   "stringData": {"username": sim.ready.username, "password": sim.ready.password}}),
            json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": name},
                   "spec": {"class": "vsphere",
                            "connection": {"endpoint": format!("{}/sdk", sim.ready.endpoint),
                                           "credentialsRef": {"name": format!("{name}-credentials")},
                                           "caBundle": {"inline": sim.ready.ca_pem}},
                            "settings": {"taskPollInterval": "100ms", "shutdownTimeout": "2s"}}}),
        ]
    };
    // Two vCenters (two vcsims), one cluster spanning both.
    for object in vcenter("vc", &vc).into_iter().chain(vcenter("vc2", &vc2)).chain([
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "w1-bootstrap"},
               "stringData": {"value": "#cloud-config\nhostname: w1\n", "format": "cloud-config"}}),
        json!({"apiVersion": format!("{INFRA}/v1alpha1"), "kind": "VSphereCluster", "metadata": {"name": "c1"},
               "spec": {"providerRefs": [{"name": "vc"}, {"name": "vc2"}],
                        "controlPlaneEndpoint": {"host": "192.0.2.20", "port": 6443}}}),
        json!({"apiVersion": CAPI, "kind": "Cluster", "metadata": {"name": "c1"},
               "spec": {"infrastructureRef": {"apiGroup": INFRA, "kind": "VSphereCluster", "name": "c1"}}}),
        json!({"apiVersion": format!("{INFRA}/v1alpha1"), "kind": "VSphereMachine", "metadata": {"name": "w1"},
               "spec": {"template": vc.ready.template, "numCPUs": 1, "memoryMiB": 1024,
                        "network": [{"networkName": "VM Network"}]}}),
    ]) {
        apply(&client, &ns.name, &object)
            .await
            .unwrap_or_else(|e| panic!("{}", fail(&format!("apply: {e}"))));
    }
    let capi_clusters = dynamic(
        &client,
        &ns.name,
        &json!({"apiVersion": CAPI, "kind": "Cluster"}),
    );
    let cluster = wait_for(&capi_clusters, "c1", WAIT, |c| {
        c.data["status"]["initialization"]["infrastructureProvisioned"] == json!(true)
            && names(&c.data["status"]["failureDomains"])
                == set(&[
                    "vc/DC0/DC0_C0",
                    "vc/DC0/DC0_C1",
                    "vc2/DC0/DC0_C0",
                    "vc2/DC0/DC0_C1",
                ])
    })
    .await;
    assert_eq!(
        cluster.data["status"]["failureDomains"][1]["attributes"]["banlieue.io/failure-domain"],
        "DC0/DC0_C1"
    );

    // The credentials the cluster depends on travel with it on `clusterctl move`.
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), &ns.name);
    let credentials = secrets.get("vc-credentials").await.unwrap();
    assert!(
        credentials
            .labels()
            .contains_key("clusterctl.cluster.x-k8s.io/move")
    );

    let capi_machines = dynamic(&client, &ns.name, &capi_machine("w1", None));
    apply(
        &client,
        &ns.name,
        &capi_machine_with_secret("w1", Some("vc2/DC0/DC0_C1"), "w1-bootstrap"),
    )
    .await
    .unwrap();
    let m = wait_for(&capi_machines, "w1", WAIT, |m| {
        m.data["status"]["initialization"]["infrastructureProvisioned"] == json!(true)
            && m.data["spec"]["providerID"].is_string()
            && m.data["status"]["addresses"]
                .as_array()
                .is_some_and(|a| !a.is_empty())
    })
    .await;
    let machines: Api<VSphereMachine> = Api::namespaced(client.clone(), &ns.name);
    let uid = machines.get("w1").await.unwrap().uid().unwrap();
    let clone = vc2
        .vms()
        .into_iter()
        .find(|v| v["extraConfig"]["banlieue.uid"] == uid.as_str())
        .expect("a clone in vcsim carrying the VSphereMachine's uid");
    assert_eq!(
        m.data["spec"]["providerID"],
        json!(format!("vsphere://{}", clone["biosUUID"].as_str().unwrap()))
    );
    assert_eq!(m.data["status"]["failureDomain"], "vc2/DC0/DC0_C1");
    assert!(
        vc.vms()
            .iter()
            .all(|v| v["extraConfig"]["banlieue.uid"] != uid.as_str()),
        "cloned on the wrong vCenter"
    );
    assert!(
        m.data["status"]["addresses"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["address"] == clone["ip"])
    );
    let userdata = clone["extraConfig"]["guestinfo.userdata"].as_str().unwrap();
    let userdata = String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(userdata)
            .unwrap(),
    )
    .unwrap();
    assert_eq!(userdata, "#cloud-config\nhostname: w1\n");
    assert_eq!(clone["power"], "poweredOn");

    capi_machines
        .delete("w1", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&machines, "w1", WAIT).await;
    assert!(
        !vc2.vms()
            .iter()
            .any(|v| v["extraConfig"]["banlieue.uid"] == uid.as_str()),
        "the clone outlived its Machine"
    );
    capi_clusters
        .delete("c1", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&capi_clusters, "c1", WAIT).await;
}

/// What needs no CAPI manager: an InfraCluster another system manages
/// (`cluster.x-k8s.io/managed-by`) is left alone, and templates let ClusterClass's
/// server-side-apply dry runs through while staying immutable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn managed_by_is_left_alone_and_templates_take_dry_runs() {
    let ns = banlieue_testenv::namespace("capi-rules").await;
    let client = ns.client.clone();
    let _operator = Operator::start_with(client.clone(), &ns.name, Duration::from_secs(5));
    apply(&client, &ns.name, &sim_provider(&ns.name, "vc1", "zone-a"))
        .await
        .unwrap();
    let cluster = |name: &str, annotations: Value| {
        json!({"apiVersion": format!("{INFRA}/v1alpha1"), "kind": "VSphereCluster",
               "metadata": {"name": name, "annotations": annotations},
               "spec": {"providerRefs": [{"name": "vc1"}]}})
    };
    apply(
        &client,
        &ns.name,
        &cluster(
            "external",
            json!({"cluster.x-k8s.io/managed-by": "someone-else"}),
        ),
    )
    .await
    .unwrap();
    apply(&client, &ns.name, &cluster("ours", json!({})))
        .await
        .unwrap();
    let clusters: Api<VSphereCluster> = Api::namespaced(client.clone(), &ns.name);
    wait_for(&clusters, "ours", WAIT, |c| {
        c.status
            .as_ref()
            .is_some_and(|s| s.failure_domains.len() == 1)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        clusters.get("external").await.unwrap().status.is_none(),
        "a managed-by cluster was reconciled"
    );

    let body = json!({"apiVersion": format!("{INFRA}/v1alpha1"), "kind": "VSphereClusterTemplate",
                      "metadata": {"name": "t"},
                      "spec": {"template": {"spec": {"providerRefs": [{"name": "vc1"}]}}}});
    apply(&client, &ns.name, &body).await.unwrap();
    let templates = dynamic(&client, &ns.name, &body);
    let mut dry_run = PatchParams::apply("capi-topology").force();
    dry_run.dry_run = true;
    // The topology controller's dry run: same template, its own metadata.
    let mut same = body.clone();
    same["metadata"]["annotations"] = json!({"topology.cluster.x-k8s.io/dry-run": ""});
    templates
        .patch("t", &dry_run, &Patch::Apply(&same))
        .await
        .expect("a dry run of the same template is accepted");
    let mut changed = body.clone();
    changed["spec"]["template"]["spec"]["providerRefs"] = json!([{"name": "vc2"}]);
    let refused = templates
        .patch("t", &dry_run, &Patch::Apply(&changed))
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("immutable"), "{refused}");
}

/// Another InfraCluster kind through the same generic controller: a `LibvirtCluster`
/// naming no Provider spans every Provider that builds `LibvirtMachine`s in its
/// namespace, and a CAPI Machine in it gets a `libvirt://` providerID.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_libvirt_cluster_spans_its_hosts() {
    let Some(_capi) = Capi::start() else { return };
    let ns = banlieue_testenv::namespace("capi-libvirt").await;
    let client = ns.client.clone();
    let _operator = Operator::start_with(client.clone(), &ns.name, Duration::from_secs(10));
    let host = |name: &str, zones: &str| {
        let mut p = sim_provider(&ns.name, name, zones);
        p["spec"]["settings"]["machineKind"] = json!("LibvirtMachine");
        p
    };
    for object in [
        host("kvm01", "rack-1"),
        host("kvm02", "rack-2"),
        // Builds VSphereMachines: not part of a LibvirtCluster.
        sim_provider(&ns.name, "vc1", "zone-a"),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "c1-bootstrap"},
               "stringData": {"value": "#cloud-config\n", "format": "cloud-config"}}),
        json!({"apiVersion": format!("{INFRA}/v1alpha1"), "kind": "LibvirtCluster", "metadata": {"name": "c1"},
               "spec": {"controlPlaneEndpoint": {"host": "192.0.2.30", "port": 6443}}}),
        json!({"apiVersion": CAPI, "kind": "Cluster", "metadata": {"name": "c1"},
               "spec": {"infrastructureRef": {"apiGroup": INFRA, "kind": "LibvirtCluster", "name": "c1"}}}),
        json!({"apiVersion": format!("{INFRA}/v1alpha1"), "kind": "LibvirtMachine", "metadata": {"name": "edge-1"},
               "spec": {"image": {"path": "/var/lib/libvirt/images/ubuntu-2404.qcow2"},
                        "storagePool": "default", "cpus": 2, "memoryMiB": 2048}}),
        json!({"apiVersion": CAPI, "kind": "Machine", "metadata": {"name": "edge-1"},
               "spec": {"clusterName": "c1", "bootstrap": {"dataSecretName": "c1-bootstrap"},
                        "failureDomain": "kvm02/rack-2",
                        "infrastructureRef": {"apiGroup": INFRA, "kind": "LibvirtMachine", "name": "edge-1"}}}),
    ] {
        apply(&client, &ns.name, &object).await.unwrap();
    }
    let clusters = dynamic(
        &client,
        &ns.name,
        &json!({"apiVersion": CAPI, "kind": "Cluster"}),
    );
    wait_for(&clusters, "c1", WAIT, |c| {
        c.data["status"]["initialization"]["infrastructureProvisioned"] == json!(true)
            && names(&c.data["status"]["failureDomains"]) == set(&["kvm01/rack-1", "kvm02/rack-2"])
    })
    .await;
    let machines = dynamic(
        &client,
        &ns.name,
        &json!({"apiVersion": CAPI, "kind": "Machine"}),
    );
    let machine = wait_for(&machines, "edge-1", WAIT, |m| {
        m.data["status"]["initialization"]["infrastructureProvisioned"] == json!(true)
            && m.data["status"]["failureDomain"] == json!("kvm02/rack-2")
    })
    .await;
    assert!(
        machine.data["spec"]["providerID"]
            .as_str()
            .unwrap()
            .starts_with("libvirt://")
    );
    clusters
        .delete("c1", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&clusters, "c1", WAIT).await;
}
