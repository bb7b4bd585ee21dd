//! `clusterctl init --infrastructure banlieue` on a real node, every part in Pods:
//! Cluster API v1.14's core, kubeadm bootstrap and kubeadm control-plane managers and
//! banlieue, each from an image built here (no registry), from a local clusterctl
//! repository (the seeds' `providers:` entries pointed at `file://` URLs). Their
//! webhooks' serving certificates come from the test-only cert-manager stand-in
//! (`cert_stand_in`: cert-manager cannot be built here); everything else is real.
//! Then, through the banlieue that clusterctl installed: a VirtualMachine on the
//! simulated backend and one on a vCenter outside the cluster (vcsim in the rig's
//! network namespace) become Ready, a Cluster API MachineDeployment of three on that
//! vCenter gets provisioned Machines, and with two replicas the leader's Pod is deleted
//! while 50 VMs are provisioned; a rolling update of both replicas leaves every VM
//! Ready and the vCenter untouched; the real garbage collector then removes a VM deleted in
//! the foreground and the 50 with their owner, backend VMs included
//! (`in_cluster/vsphere.rs`). The operator's log has no
//! `forbidden`, and the apiserver's audit log no 403 for any provider over all of it.

#[path = "in_cluster/vsphere.rs"]
mod vsphere;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use banlieue_integration_tests::apply;
use banlieue_integration_tests::capi::rig_dir_or_skip;
use banlieue_integration_tests::cert_stand_in::{self, CertStandIn};
use banlieue_integration_tests::in_cluster::{
    assert_logs_not_forbidden, create_namespace, verbs_used,
};
use banlieue_integration_tests::node_rig::{NODE_IP, NodeRig, banlieue_image};
use banlieue_integration_tests::vcsim::Vcsim;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use serde_json::json;

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The local repository: CAPI's three providers as tests/testbin/capi built them, and
/// banlieue's release (`bootstrap release`); the clusterctl configuration naming them.
fn repository(capi: &Path, dir: &Path) -> PathBuf {
    let repo = dir.join("repo");
    let copied = Command::new("cp")
        .arg("-r")
        .arg(capi.join("repository"))
        .arg(&repo)
        .status()
        .unwrap();
    assert!(copied.success());
    let ours = repo
        .join("infrastructure-banlieue")
        .join(format!("v{VERSION}"));
    let out = Command::new(env!("CARGO_BIN_EXE_banlieue"))
        .args(["bootstrap", "release", "--out-dir"])
        .arg(&ours)
        .args(["--version", VERSION])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let capi_version = std::fs::read_to_string(capi.join("VERSION")).unwrap();
    let capi_version = capi_version.trim();
    let entry = |name: &str, kind: &str, path: PathBuf| {
        format!(
            "  - name: {name}\n    type: {kind}\n    url: file://{}\n",
            path.display()
        )
    };
    let config = dir.join("clusterctl.yaml");
    let providers = [
        entry(
            "cluster-api",
            "CoreProvider",
            repo.join("cluster-api")
                .join(capi_version)
                .join("core-components.yaml"),
        ),
        entry(
            "kubeadm",
            "BootstrapProvider",
            repo.join("bootstrap-kubeadm")
                .join(capi_version)
                .join("bootstrap-components.yaml"),
        ),
        entry(
            "kubeadm",
            "ControlPlaneProvider",
            repo.join("control-plane-kubeadm")
                .join(capi_version)
                .join("control-plane-components.yaml"),
        ),
        entry(
            "banlieue",
            "InfrastructureProvider",
            ours.join("infrastructure-components.yaml"),
        ),
    ];
    std::fs::write(&config, format!("providers:\n{}", providers.concat())).unwrap();
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clusterctl_init_runs_every_provider_in_pods() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let Some(archive) = banlieue_image() else {
        return;
    };
    let Some(capi) = rig_dir_or_skip() else {
        return;
    };
    let Some(rig) = NodeRig::start().await else {
        return;
    };
    eprintln!(
        "clusterctl init: node Ready {:?} after start",
        rig.timings.node_ready
    );
    let mut images = vec![archive];
    for entry in std::fs::read_dir(capi.join("images")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "tar") {
            images.push(path);
        }
    }
    assert_eq!(
        images.len(),
        4,
        "banlieue and CAPI's three managers: {images:?}"
    );
    for image in &images {
        rig.import_image(image)
            .unwrap_or_else(|e| panic!("importing {}: {e}", image.display()));
    }
    let client = rig.client().await;
    cert_stand_in::install_crds(&client).await.unwrap();
    let stand_in = CertStandIn::start(&client).await.unwrap();

    let work = tempfile::tempdir().unwrap();
    let config = repository(&capi, work.path());
    let capi_version = std::fs::read_to_string(capi.join("VERSION")).unwrap();
    let capi_version = capi_version.trim();
    let home = work.path().join("home");
    let started = Instant::now();
    let out = Command::new(capi.join("clusterctl"))
        .args(["init", "--config"])
        .arg(&config)
        .arg("--kubeconfig")
        .arg(rig.kubeconfig_path())
        .args(["--core", &format!("cluster-api:{capi_version}")])
        .args(["--bootstrap", &format!("kubeadm:{capi_version}")])
        .args(["--control-plane", &format!("kubeadm:{capi_version}")])
        .args(["--infrastructure", &format!("banlieue:v{VERSION}")])
        .args(["--wait-providers", "--wait-provider-timeout", "300"])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", &home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("CLUSTERCTL_DISABLE_VERSIONCHECK", "true")
        .env("GOPROXY", "off")
        .output()
        .expect("running clusterctl");
    let init_took = started.elapsed();
    assert!(
        out.status.success(),
        "clusterctl init failed:\n{}\n{}\nrig:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        rig.logs()
    );
    eprintln!(
        "clusterctl init: {init_took:?} to every provider Available\n{}",
        String::from_utf8_lossy(&out.stdout)
    );

    // Every Deployment of every provider is Available, from the images imported here.
    let deployments: Api<Deployment> = Api::all(client.clone());
    let all = deployments.list(&ListParams::default()).await.unwrap();
    let mut names = Vec::new();
    for deployment in &all.items {
        let name = format!(
            "{}/{}",
            deployment.metadata.namespace.as_deref().unwrap_or(""),
            deployment.metadata.name.as_deref().unwrap_or("")
        );
        let available = deployment
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| {
                c.iter()
                    .any(|c| c.type_ == "Available" && c.status == "True")
            });
        assert!(
            available,
            "{name} is not Available: {:?}",
            deployment.status
        );
        names.push(name);
    }
    names.sort();
    assert_eq!(
        names,
        [
            "banlieue-system/banlieue-controller-manager",
            "capi-kubeadm-bootstrap-system/capi-kubeadm-bootstrap-controller-manager",
            "capi-kubeadm-control-plane-system/capi-kubeadm-control-plane-controller-manager",
            "capi-system/capi-controller-manager",
        ]
    );

    // The banlieue clusterctl installed makes a VirtualMachine Ready.
    let ns = "clusterctl-init";
    create_namespace(&client, ns).await;
    for object in [
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "sim"},
               "spec": {"class": "sim", "connection": {"endpoint": "sim://clusterctl-init"}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMClass", "metadata": {"name": "small"},
               "spec": {"cpus": 1, "memoryMiB": 256, "disk": {"sizeGiB": 1}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VMImage", "metadata": {"name": "debian"},
               "spec": {"os": {"family": "linux", "distribution": "debian", "version": "12"}, "sources": {"sim": {"name": "debian-12"}}}}),
        json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine", "metadata": {"name": "web-1"},
               "spec": {"classRef": {"name": "small"}, "imageRef": {"name": "debian"}, "placement": {"providerRef": {"name": "sim"}}}}),
    ] {
        apply(&client, ns, &object).await.unwrap();
    }
    let vms: Api<banlieue_sdk::api::VirtualMachine> = Api::namespaced(client.clone(), ns);
    let created = Instant::now();
    loop {
        let ready = vms.get("web-1").await.ok().and_then(|vm| {
            vm.status.and_then(|s| {
                banlieue_sdk::conditions::get(&s.conditions, banlieue_sdk::conditions::types::READY)
                    .map(|c| c.status == "True")
            })
        });
        if ready == Some(true) {
            break;
        }
        assert!(
            created.elapsed() < Duration::from_secs(120),
            "web-1 is not Ready through the banlieue clusterctl installed"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!(
        "clusterctl init: VirtualMachine Ready {:?} after create",
        created.elapsed()
    );

    // A vCenter outside the cluster, which the Pods reach at the node IP.
    let Some(vc) = Vcsim::start_in_network_namespace(&rig.network_namespace(), NODE_IP, &[]) else {
        return;
    };
    vsphere::provider(&client, ns, &vc).await;
    vsphere::a_vm_becomes_ready(&client, ns).await;
    vsphere::a_machine_deployment_of_three(&client, ns, &vc).await;
    let takeover = vsphere::failover_during_fifty_vms(&client, ns, &vc).await;
    eprintln!("clusterctl init: failover {takeover:?}");
    vsphere::rolling_update_changes_nothing(&client, ns, &vc).await;
    vsphere::garbage_collection(&client, ns, &vc).await;
    drop(vc);

    // Nothing in the operators' logs was refused.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "banlieue-system");
    assert_logs_not_forbidden(&pods, "manager").await;

    // Nothing any provider's ServiceAccount did was refused. (kube-controller-manager's
    // own accounts race namespace deletion, e.g. clusterctl's cert-manager-test: not ours.)
    let provider = |e: &serde_json::Value| {
        e["user"]["username"].as_str().is_some_and(|u| {
            u.starts_with("system:serviceaccount:banlieue-system:")
                || u.starts_with("system:serviceaccount:capi-")
        })
    };
    let events = rig.audit_events();
    let by_providers = events.iter().filter(|e| provider(e)).count();
    assert!(
        by_providers > 0,
        "no audit event of the providers' ServiceAccounts"
    );
    eprintln!("clusterctl init: {by_providers} requests by the providers' ServiceAccounts");
    let refused: Vec<String> = events
        .into_iter()
        .filter(|e| provider(e) && e["responseStatus"]["code"] == 403)
        .map(|e| {
            format!(
                "{} {} {}",
                e["user"]["username"], e["verb"], e["requestURI"]
            )
        })
        .collect();
    assert!(refused.is_empty(), "refused: {refused:#?}");
    // Which of its ClusterRole's grants banlieue used over the whole run.
    let used = verbs_used(
        &rig.audit_events(),
        "system:serviceaccount:banlieue-system:banlieue-controller",
    );
    eprintln!(
        "clusterctl init: banlieue-controller used:\n  {}",
        used.into_iter().collect::<Vec<_>>().join("\n  ")
    );
    // Its watches end before the apiserver does.
    drop(stand_in);
    let leftovers = rig.stop();
    assert!(
        leftovers.is_empty(),
        "the rig left things behind: {leftovers:?}"
    );
}
