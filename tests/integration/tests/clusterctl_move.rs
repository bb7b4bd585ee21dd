//! `clusterctl move` for real, between two management clusters, with Machines on four
//! real backends: vcsim (vSphere), fakepve (Proxmox VE), the rig's libvirtd + QEMU and
//! the Cloud Hypervisor fake (the sim cannot follow a move: its machines live in one
//! operator process).
//!
//! Each management cluster is a real kube-apiserver + etcd with the real CAPI v1.14
//! manager and banlieue's controllers. `clusterctl move` copies every object with a
//! **new UID** and no status; the target's banlieue must find each backend VM by the
//! `spec.providerID` that travelled in the spec, adopt it and rebuild the status —
//! never create a second VM. The source side deletes its objects with
//! `clusterctl.cluster.x-k8s.io/delete-for-move`: the VMs must survive that.
//!
//! What a real cluster has that these don't is faked as little as the move needs:
//! `clusterctl move` refuses to move Machines without `status.nodeRef`, which CAPI sets
//! from a Node with the Machine's providerID in the workload cluster. The workload
//! cluster here is the source control plane itself (each Cluster's
//! `<name>-kubeconfig` Secret points at it), and the test registers one Node per
//! Machine, as a kubelet would. The CRDs carry the label `clusterctl init` puts on them
//! (`clusterctl.cluster.x-k8s.io`), which is how `move` discovers what to copy.
//!
//! A standalone VirtualMachine (no Cluster) on vcsim moves along, the way the docs say:
//! its CRD labelled `clusterctl.cluster.x-k8s.io/move-hierarchy`, the VM annotated
//! `cluster.x-k8s.io/paused` on the source and unpaused on the target.
//!
//! The target's operator is killed once while it adopts, and started again.
//!
//! A second test moves the shape of issue 37's seed: Machines banlieue placed itself
//! (no `spec.failureDomain`) across two vCenters in one VSphereCluster, adopted on the
//! target before the failure domains are published again; then scale-down and Cluster
//! deletion on the target leave no VM on either vCenter.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use banlieue_backend_cloud_hypervisor::ChFactory;
use banlieue_backend_libvirt::LibvirtFactory;
use banlieue_backend_proxmox::ProxmoxFactory;
use banlieue_backend_vsphere::VSphereFactory;
use banlieue_integration_tests::capi::Capi;
use banlieue_integration_tests::cloud_hypervisor::{ChRig, Guest};
use banlieue_integration_tests::crashable::CrashableOperator;
use banlieue_integration_tests::fakepve::FakePve;
use banlieue_integration_tests::libvirt::{LibvirtRig, POOL};
use banlieue_integration_tests::vcsim::Vcsim;
use banlieue_integration_tests::{apply, gvk_of};
use banlieue_sdk::api::common::ProviderClass;
use banlieue_sdk::backend::BackendRegistry;
use banlieue_testenv::{ControlPlane, ControlPlaneConfig};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};

const FAKE_VMM: &str = env!("CARGO_BIN_EXE_fake-ch-vmm");
const WAIT: Duration = Duration::from_secs(300);
const CAPI: &str = "cluster.x-k8s.io/v1beta2";
const INFRA: &str = "infrastructure.banlieue.io";
const INFRA_VERSION: &str = "infrastructure.banlieue.io/v1alpha1";
/// The label `clusterctl init` puts on every CRD it installs; `move` discovers by it.
const CLUSTERCTL_LABEL: &str = "clusterctl.cluster.x-k8s.io";
const MOVE_LABEL: &str = "clusterctl.cluster.x-k8s.io/move";

/// One workload Cluster per backend: its name, InfraCluster and InfraMachine kinds, the
/// Provider its machines run on, and its Machines (the first is the control plane).
struct Backend {
    cluster: &'static str,
    infra_cluster: &'static str,
    infra_machine: &'static str,
    provider: &'static str,
    machines: &'static [&'static str],
}

const BACKENDS: [Backend; 4] = [
    Backend {
        cluster: "vs",
        infra_cluster: "VSphereCluster",
        infra_machine: "VSphereMachine",
        provider: "vc",
        machines: &["vs-cp", "vs-w1"],
    },
    Backend {
        cluster: "px",
        infra_cluster: "ProxmoxCluster",
        infra_machine: "ProxmoxMachine",
        provider: "pve",
        machines: &["px-cp", "px-w1"],
    },
    Backend {
        cluster: "lv",
        infra_cluster: "LibvirtCluster",
        infra_machine: "LibvirtMachine",
        provider: "host",
        machines: &["lv-cp"],
    },
    Backend {
        cluster: "ch",
        infra_cluster: "CloudHypervisorCluster",
        infra_machine: "CloudHypervisorMachine",
        provider: "ch",
        machines: &["ch-cp"],
    },
];

fn registry() -> BackendRegistry {
    let mut registry = BackendRegistry::default();
    registry.register(ProviderClass::Vsphere, Arc::new(VSphereFactory::new()));
    registry.register(ProviderClass::Proxmox, Arc::new(ProxmoxFactory::new()));
    registry.register(ProviderClass::Libvirt, Arc::new(LibvirtFactory::new()));
    registry.register(ProviderClass::CloudHypervisor, Arc::new(ChFactory::new()));
    registry
}

fn api(client: &kube::Client, ns: &str, api_version: &str, kind: &str) -> Api<DynamicObject> {
    let gvk = gvk_of(&json!({"apiVersion": api_version, "kind": kind}));
    let plural = format!("{}s", kind.to_lowercase());
    Api::namespaced_with(
        client.clone(),
        ns,
        &ApiResource::from_gvk_with_plural(&gvk, &plural),
    )
}

/// Labels CAPI's and banlieue's CRDs as `clusterctl init` would.
async fn label_crds_as_clusterctl_init_does(client: &kube::Client) {
    let crds: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition"),
            "customresourcedefinitions",
        ),
    );
    for crd in crds.list(&ListParams::default()).await.unwrap() {
        let group = crd.data["spec"]["group"].as_str().unwrap_or_default();
        if group.ends_with("cluster.x-k8s.io") || group.ends_with("banlieue.io") {
            let name = crd.metadata.name.clone().unwrap_or_default();
            crds.patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {CLUSTERCTL_LABEL: ""}}})),
            )
            .await
            .unwrap();
        }
    }
}

/// The control plane's admin kubeconfig with its files inlined (CAPI reads a workload
/// cluster's kubeconfig from a Secret, not from disk).
fn inlined_kubeconfig(control_plane: &ControlPlane) -> String {
    use base64::Engine as _;
    let text = std::fs::read_to_string(control_plane.kubeconfig_path()).unwrap();
    let mut out = String::new();
    for line in text.lines() {
        let inlined = ["certificate-authority", "client-certificate", "client-key"]
            .into_iter()
            .find_map(|key| {
                let rest = line.trim_start().strip_prefix(&format!("{key}: "))?;
                let path: String = serde_json::from_str(rest).ok()?;
                let data = std::fs::read(path).ok()?;
                let indent = &line[..line.len() - line.trim_start().len()];
                Some(format!(
                    "{indent}{key}-data: {}",
                    base64::engine::general_purpose::STANDARD.encode(data)
                ))
            });
        out.push_str(&inlined.unwrap_or_else(|| line.to_owned()));
        out.push('\n');
    }
    out
}

/// What each backend holds, counted on the backend itself.
#[derive(Debug, PartialEq, Eq)]
struct Census {
    /// vcsim's non-template VMs: name → BIOS UUID.
    vsphere: BTreeMap<String, String>,
    /// fakepve's non-template VMs: vmid → smbios1.
    proxmox: BTreeMap<String, String>,
    /// libvirt domains: name → UUID.
    libvirt: BTreeMap<String, String>,
    /// Cloud Hypervisor machine directories (named after the creating UID) with a record.
    cloud_hypervisor: Vec<String>,
}

/// Calls that create a VM, counted on each backend.
#[derive(Debug, Default, PartialEq, Eq, Clone, Copy)]
struct Creates {
    vsphere_clones: u64,
    proxmox_clones: usize,
    /// banlieue's volumes in the pool now (libvirt counts no calls).
    libvirt_volumes: usize,
    cloud_hypervisor_vm_creates: usize,
}

struct Backends {
    vc: Vcsim,
    pve: FakePve,
    lv: LibvirtRig,
    ch: ChRig,
}

impl Census {
    /// VMs on vSphere, Proxmox, libvirt and Cloud Hypervisor, in that order.
    fn counts(&self) -> [usize; 4] {
        [
            self.vsphere.len(),
            self.proxmox.len(),
            self.libvirt.len(),
            self.cloud_hypervisor.len(),
        ]
    }
}

impl Backends {
    fn census(&self) -> Census {
        Census {
            vsphere: self
                .vc
                .vms()
                .into_iter()
                .filter(|v| v["template"] != true)
                .map(|v| {
                    (
                        v["name"].as_str().unwrap_or_default().to_owned(),
                        v["biosUUID"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect(),
            proxmox: self
                .pve
                .machines()
                .into_iter()
                .map(|v| {
                    (
                        v["vmid"].to_string(),
                        v["config"]["smbios1"]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned(),
                    )
                })
                .collect(),
            libvirt: self
                .lv
                .domains()
                .into_iter()
                .map(|(name, uuid, _)| (name, uuid))
                .collect(),
            cloud_hypervisor: std::fs::read_dir(&self.ch.state_dir)
                .map(|dirs| {
                    let mut names: Vec<String> = dirs
                        .flatten()
                        .filter(|d| d.path().join("state.json").exists())
                        .map(|d| d.file_name().to_string_lossy().into_owned())
                        .collect();
                    names.sort();
                    names
                })
                .unwrap_or_default(),
        }
    }

    fn creates(&self) -> Creates {
        let (requests, _) = self.pve.requests(0);
        Creates {
            vsphere_clones: self.vc.calls("CloneVM_Task"),
            proxmox_clones: requests
                .iter()
                .filter(|(method, path)| method == "POST" && path.ends_with("/clone"))
                .count(),
            libvirt_volumes: self
                .lv
                .volumes()
                .into_iter()
                .filter(|v| v.starts_with("bnl-"))
                .count(),
            cloud_hypervisor_vm_creates: self
                .ch
                .exchanges()
                .into_iter()
                .filter(|e| e["path"].as_str() == Some("/api/v1/vm.create"))
                .count(),
        }
    }
}

fn machine_count() -> usize {
    BACKENDS.iter().map(|b| b.machines.len()).sum()
}

/// Everything the workload Clusters need on the source, for every backend.
fn fixtures(b: &Backends, workload_kubeconfig: &str) -> Vec<Value> {
    let mut objects = vec![
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "vc-credentials"},
               "stringData": {"username": b.vc.ready.username, "password": b.vc.ready.password}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "vc"},
               "spec": {"class": "vsphere",
                        "connection": {"endpoint": format!("{}/sdk", b.vc.ready.endpoint),
                                       "credentialsRef": {"name": "vc-credentials"},
                                       "caBundle": {"inline": b.vc.ready.ca_pem}},
                        "capabilities": {
                            "storageClasses": [{"name": "fast", "target": {"datastore": "LocalDS_0"}}],
                            "networkClasses": [{"name": "lan", "target": {"portGroup": "VM Network"}}]},
                        "settings": {"taskPollInterval": "100ms", "shutdownTimeout": "2s"}}}),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "pve-credentials"},
               "stringData": {"tokenID": b.pve.ready.token_id, "tokenSecret": b.pve.ready.token_secret}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "pve"},
               "spec": {"class": "proxmox",
                        "connection": {"endpoint": b.pve.ready.endpoint,
                                       "credentialsRef": {"name": "pve-credentials"},
                                       "caBundle": {"inline": b.pve.ready.ca_pem}},
                        "settings": {"taskPollInterval": "200ms", "shutdownTimeout": "5"}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "host"},
               "spec": {"class": "libvirt", "connection": {"endpoint": b.lv.uri},
                        "settings": {"domainType": "qemu", "pollInterval": "1s",
                                     "shutdownTimeout": "5s", "failureDomain": "rig-host"}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "ch"},
               "spec": {"class": "cloud-hypervisor", "connection": {"endpoint": b.ch.endpoint()},
                        "settings": b.ch.settings()}}),
    ];
    for backend in &BACKENDS {
        let cluster = backend.cluster;
        objects.extend([
            // A bootstrap provider's Secret would be owned by its Machine; this one
            // travels by the move label.
            json!({"apiVersion": "v1", "kind": "Secret",
                   "metadata": {"name": format!("{cluster}-bootstrap"), "labels": {MOVE_LABEL: ""}},
                   "stringData": {"value": "#cloud-config\n", "format": "cloud-config"}}),
            json!({"apiVersion": "v1", "kind": "Secret", "type": "cluster.x-k8s.io/secret",
                   "metadata": {"name": format!("{cluster}-kubeconfig"),
                                "labels": {"cluster.x-k8s.io/cluster-name": cluster}},
                   "stringData": {"value": workload_kubeconfig}}),
            json!({"apiVersion": INFRA_VERSION, "kind": backend.infra_cluster, "metadata": {"name": cluster},
                   "spec": {"providerRefs": [{"name": backend.provider}],
                            "controlPlaneEndpoint": {"host": "192.0.2.40", "port": 6443}}}),
            json!({"apiVersion": CAPI, "kind": "Cluster", "metadata": {"name": cluster},
                   "spec": {"infrastructureRef": {"apiGroup": INFRA, "kind": backend.infra_cluster, "name": cluster}}}),
        ]);
        for (i, machine) in backend.machines.iter().enumerate() {
            let mut labels = json!({"cluster.x-k8s.io/cluster-name": cluster});
            if i == 0 {
                labels["cluster.x-k8s.io/control-plane"] = json!("");
            }
            let spec = match backend.infra_machine {
                "VSphereMachine" => {
                    json!({"template": b.vc.ready.template, "numCPUs": 1, "memoryMiB": 1024,
                                           "network": [{"networkName": "VM Network"}]})
                }
                "ProxmoxMachine" => {
                    json!({"templateID": b.pve.ready.template_id, "cores": 1, "memoryMiB": 512})
                }
                "LibvirtMachine" => {
                    json!({"image": {"volume": {"pool": POOL, "name": banlieue_integration_tests::libvirt::IMAGE_VOLUME}},
                                           "storagePool": POOL, "cpus": 1, "memoryMiB": 256, "firmware": "bios"})
                }
                _ => json!({"image": b.ch.image, "cpus": 1, "memoryMiB": 512}),
            };
            let mut spec = spec;
            spec["providerRef"] = json!({"name": backend.provider});
            objects.push(
                json!({"apiVersion": INFRA_VERSION, "kind": backend.infra_machine,
                                "metadata": {"name": machine}, "spec": spec}),
            );
            let mut machine_spec = json!({"clusterName": cluster,
                "bootstrap": {"dataSecretName": format!("{cluster}-bootstrap")},
                "infrastructureRef": {"apiGroup": INFRA, "kind": backend.infra_machine, "name": machine}});
            if backend.infra_machine == "VSphereMachine" {
                // vcsim's datacenter has two clusters: CAPI's failure domain picks one.
                machine_spec["failureDomain"] = json!("vc/DC0/DC0_C0");
            }
            objects.push(json!({"apiVersion": CAPI, "kind": "Machine",
                "metadata": {"name": machine, "labels": labels,
                             // No pods run on these Nodes: nothing to drain or detach.
                             "annotations": {"machine.cluster.x-k8s.io/exclude-node-draining": "",
                                             "machine.cluster.x-k8s.io/exclude-wait-for-node-volume-detach": ""}},
                "spec": machine_spec}));
        }
    }
    objects
}

/// The standalone VirtualMachine that moves along (no CAPI Cluster), and its catalog.
const SOLO: &str = "solo";

/// VMClass and VMImage are cluster-scoped: installed on both management clusters.
fn catalog(b: &Backends, ns: &str) -> [Value; 2] {
    [
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": format!("{ns}-small")},
               "spec": {"cpus": 1, "memoryMiB": 1024, "disk": {"sizeGiB": 16, "storageClass": "fast"}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": format!("{ns}-ubuntu")},
               "spec": {"os": {"family": "linux", "distribution": "ubuntu", "version": "24.04"},
                        "sources": {"vsphere": {"template": b.vc.ready.template}}}}),
    ]
}

fn solo_vm(ns: &str) -> Value {
    json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": SOLO},
           "spec": {"classRef": {"name": format!("{ns}-small")}, "imageRef": {"name": format!("{ns}-ubuntu")},
                    "placement": {"providerRef": {"name": "vc"}},
                    "networks": [{"name": "eth0", "networkClass": "lan"}]}})
}

/// The VirtualMachine's `Ready` and `status.providerID`.
async fn solo_state(client: &kube::Client, ns: &str) -> Option<(bool, Option<String>)> {
    let vms: Api<banlieue_sdk::api::VirtualMachine> = Api::namespaced(client.clone(), ns);
    let vm = vms.get_opt(SOLO).await.unwrap()?;
    let status = vm.status.unwrap_or_default();
    Some((
        banlieue_sdk::conditions::is_true(&status.conditions, "Ready"),
        status.provider_id,
    ))
}

/// Polls until every Machine has a providerID, registering a Node for each (as its
/// kubelet would) and nudging the Machine so CAPI looks again; returns name →
/// providerID once every Machine has its `status.nodeRef`.
async fn provision_with_nodes(
    client: &kube::Client,
    workload: &kube::Client,
    ns: &str,
    capi: &Capi,
    expected: usize,
) -> BTreeMap<String, String> {
    let machines = api(client, ns, CAPI, "Machine");
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(workload.clone());
    let deadline = Instant::now() + WAIT;
    loop {
        let list = machines.list(&ListParams::default()).await.unwrap();
        let mut done = BTreeMap::new();
        for m in &list {
            let name = m.metadata.name.clone().unwrap_or_default();
            let Some(provider_id) = m.data["spec"]["providerID"].as_str() else {
                continue;
            };
            if m.data["status"]["nodeRef"]["name"].is_string() {
                done.insert(name.clone(), provider_id.to_owned());
                continue;
            }
            let node = format!("{ns}-{name}");
            if nodes.get_opt(&node).await.unwrap().is_none() {
                nodes
                    .create(
                        &Default::default(),
                        &serde_json::from_value(json!({"metadata": {"name": node},
                                                       "spec": {"providerID": provider_id}}))
                        .unwrap(),
                    )
                    .await
                    .unwrap();
            }
            machines
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"annotations": {
                        "test.banlieue.io/nudge": format!("{:?}", Instant::now())}}})),
                )
                .await
                .unwrap();
        }
        if list.items.len() == expected && done.len() == expected {
            return done;
        }
        assert!(
            Instant::now() < deadline,
            "Machines not provisioned with a nodeRef within {WAIT:?}: {:#?}\nCAPI log:\n{}",
            list.items
                .iter()
                .map(|m| (m.metadata.name.clone(), m.data["status"].clone()))
                .collect::<Vec<_>>(),
            capi.log_tail(30)
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The infra machines of every kind on `client`, as name → (uid, providerID, Ready).
async fn infra_machines(
    client: &kube::Client,
    ns: &str,
) -> BTreeMap<String, (String, Option<String>, bool)> {
    let mut out = BTreeMap::new();
    for backend in &BACKENDS {
        let list = api(client, ns, INFRA_VERSION, backend.infra_machine)
            .list(&ListParams::default())
            .await
            .unwrap();
        for m in list {
            let ready = m.data["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            out.insert(
                m.metadata.name.clone().unwrap_or_default(),
                (
                    m.metadata.uid.clone().unwrap_or_default(),
                    m.data["spec"]["providerID"].as_str().map(str::to_owned),
                    ready,
                ),
            );
        }
    }
    out
}

fn clusterctl_move(capi: &Capi, from: &ControlPlane, to: &ControlPlane, ns: &str) -> String {
    let out = std::process::Command::new(capi.clusterctl())
        .args(["move", "-v", "2", "--namespace", ns])
        .arg("--kubeconfig")
        .arg(from.kubeconfig_path())
        .arg("--to-kubeconfig")
        .arg(to.kubeconfig_path())
        .env("CLUSTERCTL_DISABLE_VERSIONCHECK", "true")
        .env("HOME", from.dir())
        .output()
        .expect("running clusterctl");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "clusterctl move failed:\n{log}");
    log
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clusterctl_move_adopts_every_vm_and_creates_none() {
    let Some(source_capi) = Capi::start() else {
        return;
    };
    let (Some(vc), Some(pve), Some(lv)) = (Vcsim::start(), FakePve::start(), LibvirtRig::start())
    else {
        return;
    };
    let backends = Backends {
        vc,
        pve,
        lv,
        ch: ChRig::new(FAKE_VMM, Guest::Exit),
    };
    // vcsim comes with VMs of its own.
    let initial = backends.census();
    let source = banlieue_testenv::shared();
    let target: &'static ControlPlane = Box::leak(Box::new(
        ControlPlane::start(ControlPlaneConfig::from_env().banlieue_api())
            .expect("the target control plane"),
    ));
    let Some(target_capi) = Capi::start_on(target) else {
        return;
    };
    let source_client = source.client().await;
    let target_client = target.client().await;
    label_crds_as_clusterctl_init_does(&source_client).await;
    label_crds_as_clusterctl_init_does(&target_client).await;

    let ns = banlieue_testenv::namespace("move").await;
    let mut source_operator = Some(CrashableOperator::start(
        source.kube_config(),
        &ns.name,
        registry(),
        Duration::from_secs(5),
    ));
    let mut target_operator = Some(CrashableOperator::start(
        target.kube_config(),
        &ns.name,
        registry(),
        Duration::from_secs(5),
    ));
    let workload = inlined_kubeconfig(source);
    for object in fixtures(&backends, &workload)
        .into_iter()
        .chain(catalog(&backends, &ns.name))
        .chain([solo_vm(&ns.name)])
    {
        apply(&source_client, &ns.name, &object)
            .await
            .unwrap_or_else(|e| panic!("apply {}: {e}", object["metadata"]["name"]));
    }
    for object in catalog(&backends, &ns.name) {
        apply(&target_client, &ns.name, &object).await.unwrap();
    }
    // Standalone VirtualMachines move as the docs say: the CRD labelled
    // move-hierarchy (each VM moves with what it owns), the VM paused around the move.
    let crds: Api<DynamicObject> = Api::all_with(
        source_client.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition"),
            "customresourcedefinitions",
        ),
    );
    crds.patch(
        "virtualmachines.banlieue.io",
        &PatchParams::default(),
        &Patch::Merge(
            json!({"metadata": {"labels": {"clusterctl.cluster.x-k8s.io/move-hierarchy": ""}}}),
        ),
    )
    .await
    .unwrap();
    let vms_source = api(
        &source_client,
        &ns.name,
        "banlieue.io/v1alpha1",
        "VirtualMachine",
    );
    let vms_target = api(
        &target_client,
        &ns.name,
        "banlieue.io/v1alpha1",
        "VirtualMachine",
    );

    // Provisioned on the source: one VM per Machine on each backend.
    let provider_ids = provision_with_nodes(
        &source_client,
        &source_client,
        &ns.name,
        source_capi,
        machine_count(),
    )
    .await;
    let deadline = Instant::now() + WAIT;
    let solo_provider_id = loop {
        if let Some((true, Some(id))) = solo_state(&source_client, &ns.name).await {
            break id;
        }
        assert!(
            Instant::now() < deadline,
            "the standalone VM did not become Ready"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let pause = |on: bool| json!({"metadata": {"annotations": {"cluster.x-k8s.io/paused": if on { Some("") } else { None }}}});
    vms_source
        .patch(SOLO, &PatchParams::default(), &Patch::Merge(pause(true)))
        .await
        .unwrap();
    let before = backends.census();
    let creates_before = backends.creates();
    eprintln!("before the move: {provider_ids:#?}\ncensus {before:#?}\ncreates {creates_before:?}");
    // One VM per Machine (and the standalone VM) on each backend.
    let made: Vec<usize> = before
        .counts()
        .iter()
        .zip(initial.counts())
        .map(|(now, was)| now - was)
        .collect();
    assert_eq!(
        made,
        [3, 2, 1, 1],
        "vSphere, Proxmox, libvirt, CH: {before:#?}"
    );
    let source_infra = infra_machines(&source_client, &ns.name).await;

    let log = clusterctl_move(source_capi, source, target, &ns.name);
    eprintln!("clusterctl move:\n{log}");
    let moved_at = Instant::now();

    // Kill the target's operator while it adopts (once an infra machine has a
    // status again), then start it again.
    let deadline = moved_at + WAIT;
    let ready_at_kill = loop {
        let now = infra_machines(&target_client, &ns.name).await;
        let ready = now.values().filter(|(_, _, ready)| *ready).count();
        if ready > 0 || Instant::now() > deadline {
            break ready;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    target_operator.take().expect("running").kill();
    eprintln!(
        "killed the target's operator {:?} after the move, {ready_at_kill} of {} infra machines Ready",
        moved_at.elapsed(),
        machine_count()
    );
    let census_at_kill = backends.census();
    target_operator = Some(CrashableOperator::start(
        target.kube_config(),
        &ns.name,
        registry(),
        Duration::from_secs(5),
    ));
    vms_target
        .patch(SOLO, &PatchParams::default(), &Patch::Merge(pause(false)))
        .await
        .unwrap();

    // On the target: every infra machine Ready under its new UID with the same
    // providerID, and every Machine provisioned with a nodeRef again.
    let deadline = Instant::now() + WAIT;
    let target_infra = loop {
        let now = infra_machines(&target_client, &ns.name).await;
        if now.len() == machine_count() + 1 && now.values().all(|(_, _, ready)| *ready) {
            break now;
        }
        assert!(
            Instant::now() < deadline,
            "not every infra machine became Ready on the target: {now:#?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    for (name, (uid, provider_id, _)) in &target_infra {
        let (old_uid, old_provider_id, _) = &source_infra[name];
        assert_ne!(uid, old_uid, "{name}: clusterctl move gives a new UID");
        assert_eq!(
            provider_id, old_provider_id,
            "{name}: the providerID travels"
        );
        let expected = match name.as_str() {
            SOLO => Some(&solo_provider_id),
            machine => provider_ids.get(machine),
        };
        assert_eq!(provider_id.as_ref(), expected, "{name}");
    }
    let deadline = Instant::now() + WAIT;
    loop {
        if solo_state(&target_client, &ns.name).await
            == Some((true, Some(solo_provider_id.clone())))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the standalone VM is not Ready on the target with its providerID: {:?}",
            solo_state(&target_client, &ns.name).await
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        vms_source.get_opt(SOLO).await.unwrap().is_none(),
        "the standalone VM left the source"
    );
    let target_provider_ids = provision_with_nodes(
        &target_client,
        &source_client,
        &ns.name,
        &target_capi,
        machine_count(),
    )
    .await;
    assert_eq!(target_provider_ids, provider_ids);

    // The source let go without touching a VM; the target created none.
    let left = infra_machines(&source_client, &ns.name).await;
    if !left.is_empty() {
        let objects = api(&source_client, &ns.name, INFRA_VERSION, "VSphereMachine")
            .list(&ListParams::default())
            .await
            .unwrap();
        panic!(
            "the source still has infra machines: {left:#?}\n{:#?}",
            objects
                .items
                .iter()
                .map(|o| &o.metadata)
                .collect::<Vec<_>>()
        );
    }
    let after = backends.census();
    let creates_after = backends.creates();
    eprintln!("after the move: census {after:#?}\ncreates {creates_after:?}");
    assert_eq!(
        census_at_kill, before,
        "a VM appeared or vanished during the move"
    );
    assert_eq!(after.vsphere, before.vsphere, "vSphere VMs changed");
    assert_eq!(after.libvirt, before.libvirt, "libvirt domains changed");
    assert_eq!(after.cloud_hypervisor, before.cloud_hypervisor);
    assert_eq!(after.proxmox, before.proxmox, "Proxmox VMs changed");
    assert_eq!(
        creates_after, creates_before,
        "a create call during or after the move"
    );
    // vSphere and Proxmox keep the owner's UID on the VM: both were retagged.
    for vm in backends.vc.vms().into_iter().filter(|v| {
        v["template"] != true
            && !initial
                .vsphere
                .contains_key(v["name"].as_str().unwrap_or_default())
    }) {
        let name = vm["name"].as_str().unwrap_or_default();
        let Some((uid, _, _)) = target_infra
            .iter()
            .find(|(machine, _)| machine.as_str() == name)
            .map(|(_, v)| v)
        else {
            panic!("vcsim VM {name} belongs to no machine");
        };
        assert_eq!(
            vm["instanceUUID"]
                .as_str()
                .map(str::to_ascii_lowercase)
                .as_deref(),
            Some(uid.as_str()),
            "{vm}"
        );
    }
    for vm in backends.pve.machines() {
        let tags = vm["config"]["tags"].as_str().unwrap_or_default().to_owned();
        assert!(
            target_infra
                .values()
                .any(|(uid, _, _)| tags.contains(&format!("banlieue-{uid}"))),
            "proxmox VM not retagged with its new owner: {vm}"
        );
    }

    // Deleting the Clusters and the VirtualMachine on the target deletes every VM.
    vms_target
        .delete(SOLO, &DeleteParams::default())
        .await
        .unwrap();
    for backend in &BACKENDS {
        api(&target_client, &ns.name, CAPI, "Cluster")
            .delete(backend.cluster, &DeleteParams::default())
            .await
            .unwrap();
    }
    let deadline = Instant::now() + WAIT;
    loop {
        let census = backends.census();
        if census == initial {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "VMs left after deleting the Clusters on the target: {census:#?}\n{:#?}",
            infra_machines(&target_client, &ns.name).await
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Deleting removed the libvirt volumes; the other counts only grow.
    let creates_end = backends.creates();
    assert_eq!(creates_end.libvirt_volumes, 0, "libvirt volumes left");
    // The adopted Proxmox VMs' seed ISOs were named after the old UIDs: gone too.
    let seeds: Vec<String> = backends
        .pve
        .isos()
        .into_values()
        .flatten()
        .filter(|iso| iso.contains("banlieue-"))
        .collect();
    assert!(seeds.is_empty(), "seed ISOs left on Proxmox: {seeds:?}");
    assert_eq!(
        creates_end,
        Creates {
            libvirt_volumes: 0,
            ..creates_before
        },
        "a create call while deleting"
    );
    eprintln!(
        "clusterctl move: {} Machines on 4 backends and a standalone VM adopted in {:?}, 0 creates",
        machine_count(),
        moved_at.elapsed()
    );
    backends.ch.assert_conformant();
    drop(target_operator.take());
    drop(source_operator.take());
}

/// The two vCenters of the seed-shaped move: `(Provider, vcsim)`.
fn vcenters<'a>(a: &'a Vcsim, b: &'a Vcsim) -> [(&'static str, &'a Vcsim); 2] {
    [("vcenter-a", a), ("vcenter-b", b)]
}

/// The seed's shape on vSphere: a VSphereCluster spanning two vCenters (two vcsims,
/// Providers `vcenter-a` and `vcenter-b`), a control-plane Machine and a
/// MachineDeployment of 3 whose Machines carry no `spec.failureDomain` (nor their
/// VSphereMachines a `spec.providerRef`): banlieue places them. A second cluster on
/// `vcenter-a` alone has a control-plane Machine and a MachineDeployment of 2 (the
/// seed's own single-vCenter case).
fn seed_fixtures(a: &Vcsim, b: &Vcsim, workload_kubeconfig: &str) -> Vec<Value> {
    let mut objects = vec![];
    for (provider, vc) in vcenters(a, b) {
        objects.extend([
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": format!("{provider}-credentials")},
                   "stringData": {"username": vc.ready.username, "password": vc.ready.password}}),
            json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": provider},
                   "spec": {"class": "vsphere",
                            "connection": {"endpoint": format!("{}/sdk", vc.ready.endpoint),
                                           "credentialsRef": {"name": format!("{provider}-credentials")},
                                           "caBundle": {"inline": vc.ready.ca_pem}},
                            "settings": {"taskPollInterval": "100ms", "shutdownTimeout": "2s"}}}),
        ]);
    }
    let spec = json!({"template": a.ready.template, "numCPUs": 1, "memoryMiB": 1024,
                      "network": [{"networkName": "VM Network"}]});
    // No pods run on these Nodes: nothing to drain or detach.
    let annotations = json!({"machine.cluster.x-k8s.io/exclude-node-draining": "",
                             "machine.cluster.x-k8s.io/exclude-wait-for-node-volume-detach": ""});
    for (cluster, providers, replicas) in [
        (
            "seed",
            json!([{"name": "vcenter-a"}, {"name": "vcenter-b"}]),
            3,
        ),
        ("one", json!([{"name": "vcenter-a"}]), 2),
    ] {
        let md = format!("{cluster}-md");
        let md_labels = json!({"cluster.x-k8s.io/deployment-name": md});
        objects.extend([
            json!({"apiVersion": "v1", "kind": "Secret",
                   "metadata": {"name": format!("{cluster}-bootstrap"), "labels": {MOVE_LABEL: ""}},
                   "stringData": {"value": "#cloud-config\n", "format": "cloud-config"}}),
            json!({"apiVersion": "v1", "kind": "Secret", "type": "cluster.x-k8s.io/secret",
                   "metadata": {"name": format!("{cluster}-kubeconfig"),
                                "labels": {"cluster.x-k8s.io/cluster-name": cluster}},
                   "stringData": {"value": workload_kubeconfig}}),
            json!({"apiVersion": INFRA_VERSION, "kind": "VSphereCluster", "metadata": {"name": cluster},
                   "spec": {"providerRefs": providers,
                            "controlPlaneEndpoint": {"host": "192.0.2.41", "port": 6443}}}),
            json!({"apiVersion": CAPI, "kind": "Cluster", "metadata": {"name": cluster},
                   "spec": {"infrastructureRef": {"apiGroup": INFRA, "kind": "VSphereCluster", "name": cluster}}}),
            json!({"apiVersion": INFRA_VERSION, "kind": "VSphereMachineTemplate", "metadata": {"name": md},
                   "spec": {"template": {"spec": spec}}}),
            json!({"apiVersion": CAPI, "kind": "MachineDeployment",
                   "metadata": {"name": md,
                                "annotations": {"machineset.cluster.x-k8s.io/skip-preflight-checks": "All"}},
                   "spec": {"clusterName": cluster, "replicas": replicas,
                            "selector": {"matchLabels": md_labels},
                            "template": {"metadata": {"labels": md_labels, "annotations": annotations},
                                         "spec": {"clusterName": cluster,
                                                  "bootstrap": {"dataSecretName": format!("{cluster}-bootstrap")},
                                                  "infrastructureRef": {"apiGroup": INFRA, "kind": "VSphereMachineTemplate", "name": md}}}}}),
        ]);
    }
    // A control-plane Machine in each cluster (`clusterctl move` wants the control
    // plane initialized, which CAPI reads from a control-plane Machine's Node).
    for cluster in ["seed", "one"] {
        let cp = format!("{cluster}-cp");
        objects.extend([
            json!({"apiVersion": INFRA_VERSION, "kind": "VSphereMachine", "metadata": {"name": cp},
                   "spec": spec}),
            json!({"apiVersion": CAPI, "kind": "Machine",
                   "metadata": {"name": cp,
                                "labels": {"cluster.x-k8s.io/cluster-name": cluster,
                                           "cluster.x-k8s.io/control-plane": ""},
                                "annotations": annotations},
                   "spec": {"clusterName": cluster,
                            "bootstrap": {"dataSecretName": format!("{cluster}-bootstrap")},
                            "infrastructureRef": {"apiGroup": INFRA, "kind": "VSphereMachine", "name": cp}}}),
        ]);
    }
    objects
}

/// banlieue's VMs on each vCenter (the templates and vcsim's own VMs left out): Provider
/// → BIOS UUID → (VM name, the failure domain the VM records).
type SeedCensus = BTreeMap<&'static str, BTreeMap<String, (String, String)>>;

/// [`SeedCensus`] of both vCenters.
fn seed_census(a: &Vcsim, b: &Vcsim) -> SeedCensus {
    vcenters(a, b)
        .into_iter()
        .map(|(provider, vc)| {
            let vms = vc
                .vms()
                .into_iter()
                .filter(|v| v["template"] != true && v["extraConfig"]["banlieue.uid"].is_string())
                .map(|v| {
                    (
                        v["biosUUID"].as_str().unwrap_or_default().to_owned(),
                        (
                            v["name"].as_str().unwrap_or_default().to_owned(),
                            v["extraConfig"]["banlieue.failureDomain"]
                                .as_str()
                                .unwrap_or_default()
                                .to_owned(),
                        ),
                    )
                })
                .collect();
            (provider, vms)
        })
        .collect()
}

/// VMs on each vCenter, as counted in `census`.
fn per_vcenter(census: &SeedCensus) -> Vec<usize> {
    census.values().map(BTreeMap::len).collect()
}

/// Each VSphereMachine: name → (providerID, status.failureDomain, Ready, the Ready
/// reason and message).
type SeedMachines = BTreeMap<String, (Option<String>, Option<String>, bool, String)>;

/// Each VSphereMachine on `client`, as [`SeedMachines`].
async fn seed_machines(client: &kube::Client, ns: &str) -> SeedMachines {
    api(client, ns, INFRA_VERSION, "VSphereMachine")
        .list(&ListParams::default())
        .await
        .unwrap()
        .into_iter()
        .map(|m| {
            let ready = m.data["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == "Ready")
                .cloned()
                .unwrap_or_default();
            (
                m.metadata.name.clone().unwrap_or_default(),
                (
                    m.data["spec"]["providerID"].as_str().map(str::to_owned),
                    m.data["status"]["failureDomain"]
                        .as_str()
                        .map(str::to_owned),
                    ready["status"] == "True",
                    format!("{} {}", ready["reason"], ready["message"]),
                ),
            )
        })
        .collect()
}

/// Every machine's `status.failureDomain` is `<provider>/<the VM's failure domain>`,
/// naming the vCenter its VM is really on; `Err` says which is not.
fn placed_where_their_vms_are(machines: &SeedMachines, census: &SeedCensus) -> Result<(), String> {
    for (name, (provider_id, failure_domain, _, _)) in machines {
        let bios = provider_id
            .as_deref()
            .and_then(|id| id.strip_prefix("vsphere://"))
            .ok_or(format!("{name} has no providerID"))?;
        let on: Vec<String> = census
            .iter()
            .filter_map(|(provider, vms)| vms.get(bios).map(|(_, fd)| format!("{provider}/{fd}")))
            .collect();
        if on.len() != 1 || failure_domain.as_ref() != Some(&on[0]) {
            return Err(format!(
                "{name}: status.failureDomain {failure_domain:?}, its VM is at {on:?}"
            ));
        }
    }
    Ok(())
}

/// `clusterctl move` of the seed's shape (issue 37): Machines banlieue placed itself
/// across two vCenters are adopted on the target before its VSphereCluster has
/// published failure domains again; each reports the Provider its VM is really on, and
/// scaling down and deleting the Cluster on the target deletes every VM, each on its own
/// vCenter.
///
/// The race is provoked, not waited for: the target's operator starts only after the
/// move, with every VSphereCluster publishing nothing (a `failureDomainSelector` that
/// matches no domain, as after a move before the first reconcile), until every machine
/// has been adopted; then the selector goes and the domains are published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clusterctl_move_of_unplaced_machines_across_two_vcenters() {
    let Some(source_capi) = Capi::start() else {
        return;
    };
    let (Some(a), Some(b)) = (Vcsim::start(), Vcsim::start()) else {
        return;
    };
    assert_eq!(
        a.ready.template, b.ready.template,
        "one template path on both"
    );
    let source = banlieue_testenv::shared();
    let target: &'static ControlPlane = Box::leak(Box::new(
        ControlPlane::start(ControlPlaneConfig::from_env().banlieue_api())
            .expect("the target control plane"),
    ));
    let Some(target_capi) = Capi::start_on(target) else {
        return;
    };
    let source_client = source.client().await;
    let target_client = target.client().await;
    label_crds_as_clusterctl_init_does(&source_client).await;
    label_crds_as_clusterctl_init_does(&target_client).await;
    let ns = banlieue_testenv::namespace("move-seed").await;
    let registry = || {
        let mut registry = BackendRegistry::default();
        registry.register(ProviderClass::Vsphere, Arc::new(VSphereFactory::new()));
        registry
    };
    let source_operator = CrashableOperator::start(
        source.kube_config(),
        &ns.name,
        registry(),
        Duration::from_secs(5),
    );
    for object in seed_fixtures(&a, &b, &inlined_kubeconfig(source)) {
        apply(&source_client, &ns.name, &object)
            .await
            .unwrap_or_else(|e| panic!("apply {}: {e}", object["metadata"]["name"]));
    }
    const MACHINES: usize = 7;
    let provider_ids = provision_with_nodes(
        &source_client,
        &source_client,
        &ns.name,
        source_capi,
        MACHINES,
    )
    .await;
    let before = seed_census(&a, &b);
    let clones_before = a.calls("CloneVM_Task") + b.calls("CloneVM_Task");
    eprintln!("before the move: {provider_ids:#?}\n{before:#?}");
    assert_eq!(
        per_vcenter(&before).iter().sum::<usize>(),
        MACHINES,
        "one VM per Machine: {before:#?}"
    );
    assert!(
        per_vcenter(&before).iter().all(|n| *n > 0),
        "the seed cluster's machines spread over both vCenters: {before:#?}"
    );
    let source_machines = seed_machines(&source_client, &ns.name).await;
    placed_where_their_vms_are(&source_machines, &before)
        .unwrap_or_else(|e| panic!("on the source: {e}\n{source_machines:#?}"));

    let log = clusterctl_move(source_capi, source, target, &ns.name);
    eprintln!("clusterctl move:\n{log}");
    let clusters = api(&target_client, &ns.name, INFRA_VERSION, "VSphereCluster");
    for cluster in ["seed", "one"] {
        let moved = clusters.get(cluster).await.unwrap();
        assert!(
            moved.data["status"]["failureDomains"]
                .as_array()
                .is_none_or(Vec::is_empty),
            "clusterctl move recreates the VSphereCluster without status: {moved:?}"
        );
        clusters
            .patch(
                cluster,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"failureDomainSelector": {
                    "matchLabels": {"banlieue.io/provider": "not-yet"}}}})),
            )
            .await
            .unwrap();
    }
    let moved_at = Instant::now();
    let target_operator = CrashableOperator::start(
        target.kube_config(),
        &ns.name,
        registry(),
        Duration::from_secs(5),
    );

    // Adopted while nothing is published: every machine Ready, where its VM is.
    let wait_adopted = |phase: &'static str| {
        let (target_client, ns, a, b) = (&target_client, &ns.name, &a, &b);
        async move {
            let deadline = Instant::now() + WAIT;
            loop {
                let now = seed_machines(target_client, ns).await;
                let census = seed_census(a, b);
                let placed = placed_where_their_vms_are(&now, &census);
                if now.len() == MACHINES && now.values().all(|m| m.2) && placed.is_ok() {
                    return now;
                }
                assert!(
                    Instant::now() < deadline,
                    "{phase}: not every machine adopted where its VM is: {placed:?}\n{now:#?}\n{census:#?}"
                );
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    };
    let unpublished = wait_adopted("before the domains are published").await;
    eprintln!(
        "adopted before the domains were published, in {:?}: {unpublished:#?}",
        moved_at.elapsed()
    );
    for cluster in ["seed", "one"] {
        clusters
            .patch(
                cluster,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"failureDomainSelector": null}})),
            )
            .await
            .unwrap();
        let deadline = Instant::now() + WAIT;
        while clusters.get(cluster).await.unwrap().data["status"]["failureDomains"]
            .as_array()
            .is_none_or(Vec::is_empty)
        {
            assert!(
                Instant::now() < deadline,
                "{cluster} publishes no failure domain"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // A resync after publication changes nothing: still where each VM is.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let published = wait_adopted("after the domains are published").await;
    assert_eq!(
        published
            .iter()
            .map(|(n, m)| (n.clone(), m.1.clone()))
            .collect::<Vec<_>>(),
        unpublished
            .iter()
            .map(|(n, m)| (n.clone(), m.1.clone()))
            .collect::<Vec<_>>(),
        "publication moved a reported failure domain"
    );
    let target_provider_ids = provision_with_nodes(
        &target_client,
        &source_client,
        &ns.name,
        &target_capi,
        MACHINES,
    )
    .await;
    assert_eq!(target_provider_ids, provider_ids);
    let after_move = seed_census(&a, &b);
    assert_eq!(after_move, before, "the move made or lost a VM");
    assert_eq!(
        a.calls("CloneVM_Task") + b.calls("CloneVM_Task"),
        clones_before,
        "a clone during or after the move"
    );

    // Scale down on the target: the two VMs gone are the deleted machines', each from
    // its own vCenter.
    let deployments = api(&target_client, &ns.name, CAPI, "MachineDeployment");
    deployments
        .patch(
            "seed-md",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 1}})),
        )
        .await
        .unwrap();
    let deadline = Instant::now() + WAIT;
    let scaled = loop {
        let machines = seed_machines(&target_client, &ns.name).await;
        let census = seed_census(&a, &b);
        if machines.len() == MACHINES - 2
            && per_vcenter(&census).iter().sum::<usize>() == MACHINES - 2
        {
            break (machines, census);
        }
        assert!(
            Instant::now() < deadline,
            "scaling seed-md down to 1 did not delete 2 machines and their VMs: {machines:#?}\n{census:#?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let (kept, after_scale) = scaled;
    for (provider, vms) in &after_scale {
        for (bios, vm) in vms {
            assert_eq!(before[provider].get(bios), Some(vm), "{provider}: {bios}");
            assert!(
                kept.values()
                    .any(|m| m.0.as_deref() == Some(&format!("vsphere://{bios}"))),
                "{provider}: VM {vm:?} outlived its machine"
            );
        }
    }

    // Deleting the Clusters on the target deletes every VM.
    for cluster in ["seed", "one"] {
        api(&target_client, &ns.name, CAPI, "Cluster")
            .delete(cluster, &DeleteParams::default())
            .await
            .unwrap();
    }
    let deadline = Instant::now() + WAIT;
    let after_delete = loop {
        let census = seed_census(&a, &b);
        let machines = seed_machines(&target_client, &ns.name).await;
        if per_vcenter(&census).iter().sum::<usize>() == 0 && machines.is_empty() {
            break census;
        }
        assert!(
            Instant::now() < deadline,
            "VMs or machines left after deleting the Clusters on the target: {census:#?}\n{machines:#?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    eprintln!(
        "seed move: VMs per vCenter (vcenter-a, vcenter-b): before the move {:?}, after {:?}, after scale-down {:?}, after Cluster deletion {:?}; clones during the move {}",
        per_vcenter(&before),
        per_vcenter(&after_move),
        per_vcenter(&after_scale),
        per_vcenter(&after_delete),
        a.calls("CloneVM_Task") + b.calls("CloneVM_Task") - clones_before,
    );
    drop(target_operator);
    drop(source_operator);
}
