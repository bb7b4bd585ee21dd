//! An upgrade on a real node: banlieue installed from an earlier commit's image and
//! install (`tests/testbin/upgrade`), 20 VirtualMachines Ready on a vCenter outside the
//! cluster (vcsim in the rig's network namespace), then this checkout's CRDs and
//! install applied over it (the image `make image` built). The rollout finishes, no VM
//! leaves Ready, the new leader makes no call that changes a VM and no second clone.

#[allow(dead_code)] // the helpers the clusterctl e2e uses too
#[path = "in_cluster/vsphere.rs"]
mod vsphere;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use banlieue_integration_tests::in_cluster::{
    assert_logs_not_forbidden, create_namespace, is_pod_ready,
};
use banlieue_integration_tests::node_rig::{NODE_IP, NodeRig, banlieue_image};
use banlieue_integration_tests::vcsim::Vcsim;
use banlieue_integration_tests::{apply, load_manifests};
use banlieue_sdk::api::VirtualMachine;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};

use vsphere::wait;

const NAMESPACE: &str = "banlieue-system";
const VMS: usize = 20;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// What `tests/testbin/upgrade/build.sh` made (it builds on first use): the earlier
/// image's archive, its reference and its install; `None` after a loud skip, a panic
/// under CI and make.
fn earlier() -> Option<(PathBuf, String, PathBuf)> {
    let script = repo_root().join("tests/testbin/upgrade/build.sh");
    let out = Command::new(&script)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running {}: {e}", script.display()))
        .and_then(|out| {
            if out.status.success() {
                Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
            } else {
                Err(format!("{} failed ({})", script.display(), out.status))
            }
        });
    match out {
        Ok(dir) => {
            let reference = std::fs::read_to_string(dir.join("ref")).unwrap();
            Some((
                dir.join("banlieue.oci.tar"),
                reference.trim().to_owned(),
                dir.join("deploy"),
            ))
        }
        Err(why) if banlieue_testenv::rigs_required() => {
            panic!("the earlier image is required under CI and make: {why}")
        }
        Err(why) => {
            eprintln!("SKIPPED: no earlier image to upgrade from: {why}");
            None
        }
    }
}

/// Applies `deploy/crds` then `deploy/operator` from `deploy`, the Deployment's image
/// set to `image` when given.
async fn install(client: &kube::Client, deploy: &Path, image: Option<&str>) -> Option<i64> {
    let mut generation = None;
    for dir in ["crds", "operator"] {
        for (file, mut object) in load_manifests(&deploy.join(dir)) {
            let deployment = object["kind"] == "Deployment";
            if let (true, Some(image)) = (deployment, image) {
                object["spec"]["template"]["spec"]["containers"][0]["image"] = json!(image);
            }
            let applied = apply(client, NAMESPACE, &object).await.unwrap_or_else(|e| {
                panic!("applying {} from {}: {e}", object["kind"], file.display())
            });
            if deployment {
                generation = applied.metadata.generation;
            }
        }
    }
    generation
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_from_an_earlier_image_changes_nothing() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let Some(archive) = banlieue_image() else {
        return;
    };
    let Some((old_archive, old_image, old_deploy)) = earlier() else {
        return;
    };
    let Some(rig) = NodeRig::start().await else {
        return;
    };
    for image in [&old_archive, &archive] {
        rig.import_image(image)
            .unwrap_or_else(|e| panic!("importing {}: {e}", image.display()));
    }
    let client = rig.client().await;

    // The earlier release, as installed then.
    let applied = Instant::now();
    install(&client, &old_deploy, Some(&old_image)).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let running_image = async |pods: &Api<Pod>| -> Option<String> {
        let list = pods
            .list(&ListParams::default().labels("control-plane=banlieue-controller-manager"))
            .await
            .ok()?;
        let ready: Vec<&Pod> = list
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| is_pod_ready(p))
            .collect();
        (ready.len() == 1).then(|| ready[0].spec.as_ref().unwrap().containers[0].image.clone())?
    };
    let first = wait(
        "the earlier operator's Pod Ready",
        Duration::from_secs(180),
        async || running_image(&pods).await,
    )
    .await;
    assert_eq!(first, old_image);
    eprintln!(
        "upgrade: {old_image} Ready {:?} after apply",
        applied.elapsed()
    );

    let Some(vc) = Vcsim::start_in_network_namespace(&rig.network_namespace(), NODE_IP, &[]) else {
        return;
    };
    let ns = "upgrade";
    create_namespace(&client, ns).await;
    vsphere::provider(&client, ns, &vc).await;
    for i in 0..VMS {
        apply(&client, ns, &vsphere::vm(&format!("up-{i:02}")))
            .await
            .unwrap();
    }
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), ns);
    let created = Instant::now();
    wait(
        "20 VMs Ready on the earlier release",
        Duration::from_secs(240),
        async || {
            let list = vms.list(&ListParams::default()).await.ok()?;
            (list.items.iter().filter(|v| vsphere::is_ready(v)).count() == VMS).then_some(())
        },
    )
    .await;
    eprintln!(
        "upgrade: {VMS} VMs Ready {:?} after create, on {old_image}",
        created.elapsed()
    );

    // This checkout's CRDs and install over it, as `clusterctl upgrade` applies them.
    let rolled = vsphere::rollout_changes_nothing(&client, ns, &vc, 1, async || {
        install(&client, &repo_root().join("deploy"), None)
            .await
            .expect("deploy/operator has the Deployment")
    })
    .await;
    let now = running_image(&pods).await;
    let new_image: Value = load_manifests(&repo_root().join("deploy/operator"))
        .into_iter()
        .find(|(_, o)| o["kind"] == "Deployment")
        .map(|(_, o)| o["spec"]["template"]["spec"]["containers"][0]["image"].clone())
        .unwrap();
    assert_eq!(
        now.as_deref(),
        new_image.as_str(),
        "the new image is not what runs"
    );
    eprintln!("upgrade: {old_image} -> {new_image} in {rolled:?}");

    assert_logs_not_forbidden(&pods, "manager").await;
    drop(vc);
    let leftovers = rig.stop();
    assert!(
        leftovers.is_empty(),
        "the rig left things behind: {leftovers:?}"
    );
}
