//! The vSphere half of the in-cluster e2e: a vCenter outside the cluster (vcsim in the
//! rig's network namespace, on the node IP, which the Pods reach), a VirtualMachine on
//! it, a Cluster API MachineDeployment of three on it, and two replicas of banlieue
//! handing over while 50 VMs are being provisioned.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use banlieue_integration_tests::apply;
use banlieue_integration_tests::in_cluster::is_pod_ready;
pub use banlieue_integration_tests::in_cluster::wait;
use banlieue_integration_tests::vcsim::Vcsim;
use banlieue_sdk::api::VirtualMachine;
use banlieue_sdk::api::infra::vsphere::VSphereMachine;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use serde_json::{Value, json};

const OPERATOR_NAMESPACE: &str = "banlieue-system";
const DEPLOYMENT: &str = "banlieue-controller-manager";
const LEASE: &str = "banlieue-leader-election";
/// `--leader-elect-lease-duration` as installed.
const LEASE_DURATION: Duration = Duration::from_secs(15);
const CAPI: &str = "cluster.x-k8s.io/v1beta2";
const INFRA: &str = "infrastructure.banlieue.io";

/// The Provider `vc` on `vc`, a class and an image for it.
pub async fn provider(client: &kube::Client, ns: &str, vc: &Vcsim) {
    for object in [
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "vc-credentials"},
               "stringData": {"username": vc.ready.username, "password": vc.ready.password}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "vc"},
               "spec": {"class": "vsphere",
                        "connection": {"endpoint": format!("{}/sdk", vc.ready.endpoint),
                                       "credentialsRef": {"name": "vc-credentials"},
                                       "caBundle": {"inline": vc.ready.ca_pem}},
                        "capabilities": {
                            "storageClasses": [{"name": "fast", "target": {"datastore": "LocalDS_0"}}],
                            "networkClasses": [{"name": "lan", "target": {"portGroup": "VM Network"}}]},
                        "settings": {"taskPollInterval": "100ms", "shutdownTimeout": "2s"}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": "vc-small"},
               "spec": {"cpus": 1, "memoryMiB": 512, "disk": {"sizeGiB": 16, "storageClass": "fast"}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": "ubuntu"},
               "spec": {"os": {"family": "linux", "distribution": "ubuntu", "version": "24.04"},
                        "sources": {"vsphere": {"template": vc.ready.template}}}}),
    ] {
        apply(client, ns, &object)
            .await
            .expect("the vCenter's Provider");
    }
}

/// A VirtualMachine `name` on the vCenter.
pub fn vm(name: &str) -> Value {
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": name},
           "spec": {"classRef": {"name": "vc-small"}, "imageRef": {"name": "ubuntu"},
                    "placement": {"providerRef": {"name": "vc"}},
                    "networks": [{"name": "eth0", "networkClass": "lan"}]}})
}

/// Whether `vm` is Ready.
pub fn is_ready(vm: &VirtualMachine) -> bool {
    vm.status.as_ref().is_some_and(|s| {
        banlieue_sdk::conditions::get(&s.conditions, banlieue_sdk::conditions::types::READY)
            .is_some_and(|c| c.status == "True")
    })
}

/// A VirtualMachine on the vCenter becomes Ready through the operator in its Pod.
pub async fn a_vm_becomes_ready(client: &kube::Client, ns: &str) {
    apply(client, ns, &vm("vc-1")).await.unwrap();
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), ns);
    let created = Instant::now();
    wait(
        "VirtualMachine vc-1 Ready on vcsim",
        Duration::from_secs(120),
        async || vms.get("vc-1").await.ok().filter(is_ready),
    )
    .await;
    eprintln!(
        "in-cluster e2e: a VirtualMachine on vcsim Ready {:?} after create",
        created.elapsed()
    );
}

/// A CAPI Cluster on the vCenter and a MachineDeployment of three: every Machine gets
/// its infrastructure provisioned (a clone in vcsim) and a providerID, through CAPI's
/// manager and banlieue, both in Pods.
pub async fn a_machine_deployment_of_three(client: &kube::Client, ns: &str, vc: &Vcsim) {
    let md_labels = json!({"cluster.x-k8s.io/deployment-name": "workers"});
    for object in [
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "c1-bootstrap"},
               "stringData": {"value": "#cloud-config\nhostname: worker\n", "format": "cloud-config"}}),
        // Nothing listens there; the rig's network namespace drops what is routed out.
        json!({"apiVersion": format!("{INFRA}/v1alpha1"), "kind": "VSphereCluster", "metadata": {"name": "c1"},
               "spec": {"providerRefs": [{"name": "vc"}],
                        "controlPlaneEndpoint": {"host": "192.0.2.10", "port": 6443}}}),
        json!({"apiVersion": CAPI, "kind": "Cluster", "metadata": {"name": "c1"},
               "spec": {"infrastructureRef": {"apiGroup": INFRA, "kind": "VSphereCluster", "name": "c1"}}}),
        json!({"apiVersion": format!("{INFRA}/v1alpha1"), "kind": "VSphereMachineTemplate",
               "metadata": {"name": "workers"},
               "spec": {"template": {"spec": {"template": vc.ready.template, "numCPUs": 1, "memoryMiB": 1024,
                                              "network": [{"networkName": "VM Network"}]}}}}),
        json!({"apiVersion": CAPI, "kind": "MachineDeployment",
               "metadata": {"name": "workers",
                            "annotations": {"machineset.cluster.x-k8s.io/skip-preflight-checks": "All"}},
               "spec": {"clusterName": "c1", "replicas": 3,
                        "selector": {"matchLabels": md_labels},
                        "template": {"metadata": {"labels": md_labels},
                                     "spec": {"clusterName": "c1",
                                              "bootstrap": {"dataSecretName": "c1-bootstrap"},
                                              "infrastructureRef": {"apiGroup": INFRA, "kind": "VSphereMachineTemplate", "name": "workers"}}}}}),
    ] {
        apply(client, ns, &object)
            .await
            .unwrap_or_else(|e| panic!("applying {}: {e}", object["kind"]));
    }
    let resource = ApiResource {
        group: "cluster.x-k8s.io".into(),
        version: "v1beta2".into(),
        api_version: CAPI.into(),
        kind: "Machine".into(),
        plural: "machines".into(),
    };
    let machines: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &resource);
    let started = Instant::now();
    let provisioned = wait(
        "three provisioned Machines of the MachineDeployment",
        Duration::from_secs(180),
        async || {
            let list = machines
                .list(&ListParams::default().labels("cluster.x-k8s.io/deployment-name=workers"))
                .await
                .ok()?;
            let done: Vec<(String, String)> = list
                .items
                .iter()
                .filter(|m| {
                    m.data["status"]["initialization"]["infrastructureProvisioned"] == json!(true)
                })
                .filter_map(|m| {
                    Some((
                        m.name_any(),
                        m.data["spec"]["providerID"].as_str()?.to_owned(),
                    ))
                })
                .collect();
            (done.len() == 3 && list.items.len() == 3).then_some(done)
        },
    )
    .await;
    eprintln!(
        "in-cluster e2e: MachineDeployment of 3 provisioned on vcsim {:?} after create: {provisioned:?}",
        started.elapsed()
    );
    // Each providerID is a clone's BIOS UUID in vcsim.
    let uuids: BTreeSet<String> = vc
        .vms()
        .iter()
        .filter_map(|v| v["biosUUID"].as_str().map(|u| format!("vsphere://{u}")))
        .collect();
    for (machine, provider_id) in &provisioned {
        assert!(
            uuids.contains(provider_id),
            "Machine {machine}'s providerID {provider_id} is no VM in vcsim"
        );
    }
}

/// The Pods of the operator's Deployment that are Ready, by name.
async fn ready_pods(pods: &Api<Pod>) -> Vec<String> {
    let Ok(list) = pods
        .list(&ListParams::default().labels("control-plane=banlieue-controller-manager"))
        .await
    else {
        return Vec::new();
    };
    list.items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(is_pod_ready)
        .map(|p| p.name_any())
        .collect()
}

/// The Pod holding the Lease (identities are `<pod name>_<random>`).
async fn holder(leases: &Api<Lease>) -> Option<String> {
    let identity = leases.get(LEASE).await.ok()?.spec?.holder_identity?;
    Some(
        identity
            .rsplit_once('_')
            .map_or(identity.clone(), |(pod, _)| pod.to_owned()),
    )
}

/// Two replicas; the leader's Pod is deleted while 50 VMs are being provisioned: the
/// standby takes the Lease within the lease duration, every VM becomes Ready, and vcsim
/// holds exactly one VM per infrastructure machine. Returns the takeover time.
pub async fn failover_during_fifty_vms(client: &kube::Client, ns: &str, vc: &Vcsim) -> Duration {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    deployments
        .patch(
            DEPLOYMENT,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"replicas": 2}})),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    let leases: Api<Lease> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    let scaled = Instant::now();
    // The standby is Ready too (and says so): what lets a rolling update finish.
    let replicas = wait("two Ready replicas", Duration::from_secs(120), async || {
        let ready = ready_pods(&pods).await;
        (ready.len() == 2).then_some(ready)
    })
    .await;
    eprintln!(
        "in-cluster e2e: second replica Ready {:?} after scaling: {}",
        scaled.elapsed(),
        describe_pods(&pods).await
    );
    let leader = holder(&leases).await.expect("a holder of the Lease");
    assert!(
        replicas.contains(&leader),
        "{leader} is not one of {replicas:?}"
    );

    // The 50 belong to a ConfigMap, for the garbage collector later.
    let fleet = apply(
        client,
        ns,
        &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "fleet"}}),
    )
    .await
    .unwrap();
    let owner = json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "fleet",
                        "uid": fleet.metadata.uid.clone().unwrap()}]);
    for i in 0..50 {
        let mut object = vm(&format!("fo-{i:02}"));
        object["metadata"]["ownerReferences"] = owner.clone();
        apply(client, ns, &object).await.unwrap();
    }
    let created = Instant::now();
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), ns);
    let count_ready = async || {
        vms.list(&ListParams::default())
            .await
            .map(|l| {
                l.items
                    .iter()
                    .filter(|v| v.name_any().starts_with("fo-") && is_ready(v))
                    .count()
            })
            .unwrap_or(0)
    };
    let at_deletion = wait("10 of 50 VMs Ready", Duration::from_secs(180), async || {
        let ready = count_ready().await;
        (ready >= 10).then_some(ready)
    })
    .await;
    assert!(
        at_deletion < 50,
        "all 50 were Ready before the leader could be deleted: nothing in flight to hand over"
    );
    pods.delete(&leader, &DeleteParams::default())
        .await
        .unwrap();
    let deleted = Instant::now();
    let successor = wait(
        "another replica holding the Lease",
        LEASE_DURATION + Duration::from_secs(30),
        async || holder(&leases).await.filter(|h| *h != leader),
    )
    .await;
    let takeover = deleted.elapsed();
    eprintln!(
        "in-cluster e2e: leader {leader} deleted at {at_deletion}/50 Ready; {successor} took the Lease {takeover:?} later"
    );
    assert!(
        takeover < LEASE_DURATION,
        "the takeover took {takeover:?}, more than the lease duration ({LEASE_DURATION:?})"
    );
    // The released Lease goes to whichever candidate reads it first: the standby, or
    // the Pod the ReplicaSet started in the deleted one's place (it starts in about a
    // second here, the image being on the node).
    let standby = replicas.contains(&successor);
    eprintln!(
        "in-cluster e2e: the new leader is {}",
        if standby {
            "the standby"
        } else {
            "the replacement Pod"
        }
    );
    let pod = pods.get(&successor).await.unwrap();
    assert!(
        pod.metadata.deletion_timestamp.is_none(),
        "the Lease went to a Pod being deleted: {}",
        describe_pods(&pods).await
    );
    wait("all 50 VMs Ready", Duration::from_secs(300), async || {
        (count_ready().await == 50).then_some(())
    })
    .await;
    eprintln!(
        "in-cluster e2e: 50 VMs Ready {:?} after create, across the failover",
        created.elapsed()
    );

    assert_one_clone_per_machine(client, ns, vc).await;
    takeover
}

/// The uids of the VSphereMachines whose names start with `prefix`.
async fn machine_uids(client: &kube::Client, ns: &str, prefix: &str) -> BTreeSet<String> {
    let machines: Api<VSphereMachine> = Api::namespaced(client.clone(), ns);
    machines
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|m| m.name_any().starts_with(prefix))
        .filter_map(|m| m.uid())
        .collect()
}

/// Waits until no vcsim VM carries any of `uids`, nor any VSphereMachine starts with
/// `prefix`.
async fn wait_backend_gone(
    client: &kube::Client,
    ns: &str,
    vc: &Vcsim,
    prefix: &str,
    uids: &BTreeSet<String>,
) {
    wait(
        &format!("the backend VMs of {prefix}* gone"),
        Duration::from_secs(300),
        async || {
            let left = vc
                .vms()
                .iter()
                .filter(|v| {
                    v["extraConfig"]["banlieue.uid"]
                        .as_str()
                        .is_some_and(|u| uids.contains(u))
                })
                .count();
            (left == 0 && machine_uids(client, ns, prefix).await.is_empty()).then_some(())
        },
    )
    .await;
}

/// The real garbage collector (kube-controller-manager's) and banlieue's finalizers:
/// a VM deleted in the foreground goes after its infrastructure machine and its
/// backend VM; deleting the owner of 50 VMs deletes them all, backends included.
pub async fn garbage_collection(client: &kube::Client, ns: &str, vc: &Vcsim) {
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), ns);
    let uids = machine_uids(client, ns, "vc-1").await;
    assert_eq!(uids.len(), 1, "vc-1 has one VSphereMachine");
    let started = Instant::now();
    vms.delete("vc-1", &DeleteParams::foreground())
        .await
        .unwrap();
    wait(
        "vc-1 gone (foreground)",
        Duration::from_secs(120),
        async || vms.get_opt("vc-1").await.ok()?.is_none().then_some(()),
    )
    .await;
    wait_backend_gone(client, ns, vc, "vc-1", &uids).await;
    eprintln!(
        "in-cluster e2e: foreground deletion of a VM took {:?}, backend VM included",
        started.elapsed()
    );

    let uids = machine_uids(client, ns, "fo-").await;
    assert_eq!(uids.len(), 50);
    let configmaps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), ns);
    let started = Instant::now();
    configmaps
        .delete("fleet", &DeleteParams::background())
        .await
        .unwrap();
    wait(
        "the fleet's 50 VMs gone",
        Duration::from_secs(300),
        async || {
            let left = vms
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .iter()
                .filter(|v| v.name_any().starts_with("fo-"))
                .count();
            (left == 0).then_some(())
        },
    )
    .await;
    wait_backend_gone(client, ns, vc, "fo-", &uids).await;
    eprintln!(
        "in-cluster e2e: deleting the owner of 50 VMs removed them and their backend VMs in {:?}",
        started.elapsed()
    );
}

/// vcsim's counts of the methods that change a VM.
fn mutating_calls(vc: &Vcsim) -> BTreeMap<&'static str, u64> {
    [
        "CloneVM_Task",
        "PowerOnVM_Task",
        "PowerOffVM_Task",
        "ReconfigVM_Task",
        "Destroy_Task",
        "CreateVM_Task",
    ]
    .into_iter()
    .map(|m| (m, vc.calls(m)))
    .collect()
}

/// The number of VirtualMachines on the vCenter and those of them not Ready (the
/// simulated backend lives in the leader's memory, so its VMs are left out).
async fn vc_vms_not_ready(vms: &Api<VirtualMachine>) -> Option<(usize, Vec<String>)> {
    let list = vms.list(&ListParams::default()).await.ok()?;
    let on_vc: Vec<&VirtualMachine> = list
        .items
        .iter()
        .filter(|v| {
            v.spec
                .placement
                .provider_ref
                .as_ref()
                .is_some_and(|r| r.name == "vc")
        })
        .collect();
    // Each with the conditions that say why, so a failure names its cause.
    let not_ready = on_vc
        .iter()
        .filter(|v| !is_ready(v))
        .map(|v| {
            let why: Vec<String> = v
                .status
                .as_ref()
                .map(|s| s.conditions.as_slice())
                .unwrap_or_default()
                .iter()
                .filter(|c| c.status != "True")
                .map(|c| format!("{}={} {}: {}", c.type_, c.status, c.reason, c.message))
                .collect();
            format!("{} ({})", v.name_any(), why.join("; "))
        })
        .collect();
    Some((on_vc.len(), not_ready))
}

/// Applies `change` to the operator's Deployment and follows the rolling update to its
/// end (`replicas` updated and Ready): no VirtualMachine on the vCenter leaves Ready
/// meanwhile, a new Pod takes the Lease, and after its first pass over every object the
/// vCenter has seen no call that changes a VM. Returns how long the rollout took.
pub async fn rollout_changes_nothing(
    client: &kube::Client,
    ns: &str,
    vc: &Vcsim,
    replicas: i32,
    change: impl AsyncFnOnce() -> i64,
) -> Duration {
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), ns);
    let (count, not_ready) = vc_vms_not_ready(&vms).await.unwrap();
    assert!(count > 0, "no VM on the vCenter to watch");
    assert!(
        not_ready.is_empty(),
        "not Ready before the update: {not_ready:?}"
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    let old_pods = ready_pods(&pods).await;
    let before = mutating_calls(vc);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    let generation = change().await;
    let started = Instant::now();
    let mut checks = 0;
    loop {
        let (_, not_ready) = vc_vms_not_ready(&vms).await.unwrap_or_default();
        assert!(
            not_ready.is_empty(),
            "left Ready during the rolling update: {not_ready:?}"
        );
        checks += 1;
        let status = deployments
            .get(DEPLOYMENT)
            .await
            .unwrap()
            .status
            .unwrap_or_default();
        if status.observed_generation == Some(generation)
            && status.updated_replicas == Some(replicas)
            && status.ready_replicas == Some(replicas)
            && status.replicas == Some(replicas)
        {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "the rolling update did not finish: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let rolled = started.elapsed();
    let leases: Api<Lease> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    let current = ready_pods(&pods).await;
    assert!(
        current.iter().all(|p| !old_pods.contains(p)),
        "old Pods still Ready: {current:?}"
    );
    let leader = wait("a new Pod leading", Duration::from_secs(60), async || {
        holder(&leases).await.filter(|h| current.contains(h))
    })
    .await;
    // The new leader's first pass over every object.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (_, not_ready) = vc_vms_not_ready(&vms).await.unwrap();
    assert!(
        not_ready.is_empty(),
        "not Ready after the update: {not_ready:?}"
    );
    let after = mutating_calls(vc);
    assert_eq!(before, after, "the new Pods changed VMs on the vCenter");
    assert_one_clone_per_machine(client, ns, vc).await;
    eprintln!(
        "in-cluster e2e: rolling update of {replicas} replica(s) in {rolled:?}, {leader} leads; {count} VMs Ready at each of {checks} checks; no mutating vCenter call ({after:?})"
    );
    rolled
}

/// A rolling update of the two replicas (a new Pod template, as `kubectl rollout
/// restart` makes): it finishes (a standby is Ready) and changes nothing.
pub async fn rolling_update_changes_nothing(client: &kube::Client, ns: &str, vc: &Vcsim) {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    rollout_changes_nothing(client, ns, vc, 2, async || {
        deployments
            .patch(
                DEPLOYMENT,
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"template": {"metadata": {"annotations": {
                    "banlieue.io/restarted-by": "in-cluster-e2e"}}}}})),
            )
            .await
            .unwrap()
            .metadata
            .generation
            .unwrap()
    })
    .await;
}

/// Exactly one vcsim VM per infrastructure machine: none cloned twice, none missing.
pub async fn assert_one_clone_per_machine(client: &kube::Client, ns: &str, vc: &Vcsim) {
    let machines: Api<VSphereMachine> = Api::namespaced(client.clone(), ns);
    let uids: BTreeSet<String> = machines
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter_map(|m| m.uid())
        .collect();
    let mut clones: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for v in vc.vms() {
        if let Some(uid) = v["extraConfig"]["banlieue.uid"].as_str() {
            clones
                .entry(uid.to_owned())
                .or_default()
                .push(v["name"].as_str().unwrap_or("").to_owned());
        }
    }
    let twice: Vec<_> = clones.iter().filter(|(_, v)| v.len() > 1).collect();
    assert!(twice.is_empty(), "cloned more than once: {twice:?}");
    let made: BTreeSet<String> = clones.keys().cloned().collect();
    assert_eq!(
        made, uids,
        "vcsim's banlieue VMs and the VSphereMachines differ"
    );
}

/// The operator's Pods: name, phase, readiness, restarts, age (for failure messages).
async fn describe_pods(pods: &Api<Pod>) -> String {
    let Ok(list) = pods.list(&ListParams::default()).await else {
        return "(cannot list)".into();
    };
    list.items
        .iter()
        .map(|p| {
            let status = p.status.clone().unwrap_or_default();
            let ready = status
                .conditions
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            let restarts: i32 = status
                .container_statuses
                .unwrap_or_default()
                .iter()
                .map(|c| c.restart_count)
                .sum();
            format!(
                "{} phase={:?} ready={ready} restarts={restarts} created={:?} deleting={}",
                p.name_any(),
                status.phase,
                p.metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|t| t.0.to_string()),
                p.metadata.deletion_timestamp.is_some()
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}
