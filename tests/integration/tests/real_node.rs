//! The real node rig end to end: a single-node cluster (kubelet, containerd, runc,
//! kube-proxy, the controller manager and the scheduler) in namespaces this test
//! creates. The Node goes Ready, a locked-down Pod runs the locally built pause image
//! with its projected ServiceAccount token, the garbage collector deletes dependents,
//! and stopping the rig leaves nothing behind.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use banlieue_integration_tests::node_rig::{self, NODE_NAME, NodeRig, PAUSE_IMAGE};
use k8s_openapi::api::authentication::v1::TokenReview;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(120);

/// Polls `check` every 250 ms until it returns `Some`, or panics after `timeout` with
/// `what`, the last observation and the rig's logs.
async fn eventually<T, F, Fut>(rig: &NodeRig, what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let started = Instant::now();
    loop {
        match check().await {
            Ok(value) => return value,
            Err(last) if started.elapsed() > timeout => {
                panic!("{what}: not in {timeout:?} ({last})\n{}", rig.logs())
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_node_runs_a_locked_down_pod_and_leaves_nothing_behind() {
    let Some(rig) = NodeRig::start().await else {
        return;
    };
    let t = rig.timings;
    eprintln!(
        "node rig: build.sh {:.1?}, started (apiserver answering) {:.1?}, Node Ready {:.1?}",
        t.build, t.started, t.node_ready
    );
    let client = rig.client().await;

    // The pause image, again, as the test's own image (it is the sandbox image too).
    let pause = node_rig::pause_dir().expect("the pause image");
    let imported = Instant::now();
    rig.import_image(&pause.join("pause.tar"))
        .expect("importing the pause image");
    eprintln!("node rig: image import {:.1?}", imported.elapsed());

    // The default ServiceAccount comes from the controller manager.
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    eventually(&rig, "ServiceAccount default/default", WAIT, || {
        let accounts = accounts.clone();
        async move {
            match accounts.get_opt("default").await {
                Ok(Some(_)) => Ok(()),
                Ok(None) => Err("absent".into()),
                Err(e) => Err(e.to_string()),
            }
        }
    })
    .await;

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "locked-down"},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "securityContext": {
                "runAsNonRoot": true,
                "runAsUser": 65532,
                "runAsGroup": 65532,
                "seccompProfile": {"type": "RuntimeDefault"}
            },
            "containers": [{
                "name": "pause",
                "image": PAUSE_IMAGE,
                "imagePullPolicy": "Never",
                "securityContext": {
                    "runAsNonRoot": true,
                    "runAsUser": 65532,
                    "readOnlyRootFilesystem": true,
                    "allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]},
                    "seccompProfile": {"type": "RuntimeDefault"}
                }
            }]
        }
    }))
    .expect("pod");
    let created = Instant::now();
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("creating the Pod");
    let running = eventually(&rig, "Pod locked-down Running and Ready", WAIT, || {
        let pods = pods.clone();
        async move {
            let pod = pods.get("locked-down").await.map_err(|e| e.to_string())?;
            let status = pod.status.clone().unwrap_or_default();
            let ready = status
                .conditions
                .as_ref()
                .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
                .is_some_and(|c| c.status == "True");
            if status.phase.as_deref() == Some("Running") && ready {
                Ok(pod)
            } else {
                Err(format!("phase {:?}, status {:?}", status.phase, status))
            }
        }
    })
    .await;
    eprintln!(
        "node rig: Pod create to Running and Ready {:.1?}",
        created.elapsed()
    );
    let spec = running.spec.as_ref().expect("spec");
    assert_eq!(
        spec.node_name.as_deref(),
        Some(NODE_NAME),
        "scheduled onto the rig's node"
    );
    let status = running.status.as_ref().expect("status");
    assert!(
        status
            .pod_ip
            .as_deref()
            .is_some_and(|ip| ip.starts_with("10.244.0.")),
        "a Pod IP from the CNI bridge: {:?}",
        status.pod_ip
    );
    // ServiceAccount token projection: the admission plugin added the projected volume
    // and the kubelet mounted it (the Pod would not run otherwise).
    let token_volume = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name.starts_with("kube-api-access-"))
        .expect("the kube-api-access-* volume");
    let sources = token_volume
        .projected
        .as_ref()
        .and_then(|p| p.sources.as_ref())
        .expect("a projected volume");
    assert!(
        sources.iter().any(|s| s.service_account_token.is_some()),
        "the projected volume has a ServiceAccount token: {sources:?}"
    );
    let container = &spec.containers[0];
    assert!(
        container
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.name == token_volume.name
                && m.mount_path == "/var/run/secrets/kubernetes.io/serviceaccount"),
        "the token is mounted: {:?}",
        container.volume_mounts
    );
    // On the node: the kubelet wrote the token the API server issued into the volume
    // (a tmpfs mounted in the rig's mount namespace).
    let pod_uid = running.metadata.uid.as_deref().expect("uid");
    let token_path = rig.path_in_rig(&rig.state_dir().join(format!(
        "kubelet/pods/{pod_uid}/volumes/kubernetes.io~projected/{}/token",
        token_volume.name
    )));
    let token = std::fs::read_to_string(&token_path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", token_path.display()));
    assert_eq!(token.split('.').count(), 3, "a JWT: {token}");
    // And the API server takes it: the Pod's identity is its ServiceAccount.
    let review: TokenReview = serde_json::from_value(json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
        "spec": {"token": token.trim()}
    }))
    .expect("review");
    let reviewed = Api::<TokenReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .expect("a TokenReview");
    let reviewed = reviewed.status.expect("review status");
    assert_eq!(reviewed.authenticated, Some(true), "{reviewed:?}");
    assert_eq!(
        reviewed.user.and_then(|u| u.username).as_deref(),
        Some("system:serviceaccount:default:default")
    );
    let container_status = &status.container_statuses.as_ref().expect("statuses")[0];
    assert!(
        container_status
            .state
            .as_ref()
            .is_some_and(|s| s.running.is_some()),
        "the container runs: {container_status:?}"
    );
    // The security context, as the kernel applies it to the container's process.
    let container_id = container_status
        .container_id
        .as_deref()
        .expect("container ID");
    let pids = rig.container_pids(container_id);
    assert_eq!(
        pids.len(),
        1,
        "one process in container {container_id}: {pids:?}"
    );
    let proc_status = std::fs::read_to_string(format!("/proc/{}/status", pids[0])).expect("status");
    let field = |name: &str| {
        proc_status
            .lines()
            .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_owned()))
            .unwrap_or_else(|| panic!("no {name} in {proc_status}"))
    };
    assert_eq!(field("Name:"), "pause");
    assert_eq!(
        field("Uid:").split_whitespace().collect::<Vec<_>>(),
        ["65532"; 4],
        "runAsUser"
    );
    assert_eq!(field("NoNewPrivs:"), "1", "allowPrivilegeEscalation: false");
    for caps in ["CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"] {
        assert_eq!(
            field(caps),
            "0000000000000000",
            "capabilities drop ALL: {caps}"
        );
    }
    assert_eq!(
        field("Seccomp:"),
        "2",
        "seccompProfile RuntimeDefault (filter mode)"
    );
    let mounts =
        std::fs::read_to_string(format!("/proc/{}/mountinfo", pids[0])).expect("mountinfo");
    let root = mounts
        .lines()
        .find(|l| l.split_whitespace().nth(4) == Some("/"))
        .expect("the container's root mount");
    assert!(
        root.split_whitespace()
            .nth(5)
            .is_some_and(|options| options.split(',').any(|o| o == "ro")),
        "readOnlyRootFilesystem: {root}"
    );

    // Garbage collection: a ConfigMap owned by another goes when its owner goes.
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let owner = config_maps
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: kube::api::ObjectMeta {
                    name: Some("owner".into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .expect("creating the owner");
    config_maps
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: kube::api::ObjectMeta {
                    name: Some("dependent".into()),
                    owner_references: Some(vec![OwnerReference {
                        api_version: "v1".into(),
                        kind: "ConfigMap".into(),
                        name: "owner".into(),
                        uid: owner.metadata.uid.clone().expect("uid"),
                        ..Default::default()
                    }]),
                    ..Default::default()
                },
                data: Some(BTreeMap::from([("k".into(), "v".into())])),
                ..Default::default()
            },
        )
        .await
        .expect("creating the dependent");
    config_maps
        .delete("owner", &DeleteParams::default())
        .await
        .expect("deleting the owner");
    let collected = Instant::now();
    eventually(
        &rig,
        "the dependent ConfigMap garbage-collected",
        WAIT,
        || {
            let config_maps = config_maps.clone();
            async move {
                match config_maps.get_opt("dependent").await {
                    Ok(None) => Ok(()),
                    Ok(Some(_)) => Err("still there".into()),
                    Err(e) => Err(e.to_string()),
                }
            }
        },
    )
    .await;
    eprintln!("node rig: garbage collection {:.1?}", collected.elapsed());

    // The Pod stops like a Pod: SIGTERM to pause, which exits 0.
    pods.delete("locked-down", &DeleteParams::default())
        .await
        .expect("deleting the Pod");
    let deleted = Instant::now();
    eventually(&rig, "Pod locked-down gone", WAIT, || {
        let pods = pods.clone();
        async move {
            match pods.get_opt("locked-down").await {
                Ok(None) => Ok(()),
                Ok(Some(_)) => Err("still there".into()),
                Err(e) => Err(e.to_string()),
            }
        }
    })
    .await;
    eprintln!("node rig: Pod deletion {:.1?}", deleted.elapsed());

    // A second Pod that stays running: teardown must take running containers too.
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "left-running"},
            "spec": {"containers": [{"name": "pause", "image": PAUSE_IMAGE,
                                     "imagePullPolicy": "IfNotPresent"}]}
        }))
        .expect("pod"),
    )
    .await
    .expect("creating the second Pod");
    eventually(&rig, "Pod left-running Running", WAIT, || {
        let pods = pods.clone();
        async move {
            let pod = pods.get("left-running").await.map_err(|e| e.to_string())?;
            let phase = pod.status.and_then(|s| s.phase);
            if phase.as_deref() == Some("Running") {
                Ok(())
            } else {
                Err(format!("phase {phase:?}"))
            }
        }
    })
    .await;

    drop(client);
    // Teardown checks these are gone; they must be the rig's own, not this process's.
    assert_eq!(rig.namespaces().len(), 3, "{:?}", rig.namespaces());
    for ns in ["pid", "net", "mnt"] {
        let ours = std::fs::read_link(format!("/proc/self/ns/{ns}")).expect("ns");
        assert!(
            !rig.namespaces()
                .contains(&ours.to_string_lossy().into_owned()),
            "the rig has its own {ns} namespace"
        );
    }
    let dir = rig.state_dir().parent().expect("rig dir").to_owned();
    let stopping = Instant::now();
    let left = rig.stop();
    eprintln!("node rig: stop and checks {:.1?}", stopping.elapsed());
    assert!(left.is_empty(), "the rig left behind: {left:#?}");
    assert!(!dir.exists(), "{} removed", dir.display());
}
