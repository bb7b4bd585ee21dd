//! The operator's Deployment: one container named `manager` (clusterctl's rule)
//! running `banlieue run` with leader election, probes on the health port, and Cluster
//! API's security context. The root filesystem is read-only: `CopyDisk` stages disks on
//! an `emptyDir` volume.

use serde_json::{Value, json};

use banlieue_runtime::client::{DEFAULT_KUBE_API_BURST, DEFAULT_KUBE_API_QPS};

use super::{CONTROLLER_NAME, DEPLOYMENT_NAME, Options, PROVIDER, PROVIDER_LABEL, labelled};

/// The health port (`/healthz`, `/readyz`).
pub const HEALTH_PORT: u16 = 9440;
/// The metrics port (`/metrics`).
pub const METRICS_PORT: u16 = 8443;
/// The user and group the manager runs as: the image's `nonroot`, the Dockerfile's
/// `USER` (hack/check-dockerfile.sh checks they agree), as Cluster API's managers do.
pub const RUN_AS_ID: u32 = 65532;
/// Where the manager stages `CopyDisk` disks (`--staging-dir`): the mount of the
/// [`STAGING_VOLUME`] `emptyDir`. It has no `sizeLimit`: it must hold the largest VM's
/// disks twice over, which no default can know, and the copy checks the free space
/// itself (the kubelet enforces a `sizeLimit` by eviction, which that check cannot see).
/// The book's "Swapping backends" page (Staging space) shows how to use a PVC instead.
pub const STAGING_DIR: &str = "/var/lib/banlieue/staging";
/// The name of the staging volume.
pub const STAGING_VOLUME: &str = "staging";

/// `banlieue run`'s arguments in the Deployment. It watches every namespace (clusterctl
/// installs providers cluster-wide); the Lease lives in `$POD_NAMESPACE`. The client's
/// rate ceiling is spelled out (the code's defaults, so the two cannot differ) so that
/// whoever tunes it finds the flags in the manifest (docs/adr/0016-kube-api-rate-limits.md).
pub fn manager_args() -> Vec<String> {
    vec![
        "run".to_owned(),
        "--leader-elect".to_owned(),
        format!("--health-addr=:{HEALTH_PORT}"),
        format!("--diagnostics-address=:{METRICS_PORT}"),
        "--log-format=json".to_owned(),
        format!("--staging-dir={STAGING_DIR}"),
        format!("--kube-api-qps={DEFAULT_KUBE_API_QPS}"),
        format!("--kube-api-burst={DEFAULT_KUBE_API_BURST}"),
    ]
}

fn field_env(name: &str, path: &str) -> Value {
    json!({"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}})
}

fn probe(path: &str) -> Value {
    json!({"httpGet": {"path": path, "port": "healthz"}, "initialDelaySeconds": 5, "periodSeconds": 10})
}

/// The Deployment for `options`.
pub fn deployment(options: &Options) -> Value {
    let selector = json!({"control-plane": DEPLOYMENT_NAME, PROVIDER_LABEL: PROVIDER});
    labelled(
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": DEPLOYMENT_NAME, "namespace": options.namespace},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": selector},
                "template": {
                    "metadata": {"labels": selector},
                    "spec": {
                        "serviceAccountName": CONTROLLER_NAME,
                        "terminationGracePeriodSeconds": 10,
                        "securityContext": {
                            "runAsNonRoot": true,
                            "seccompProfile": {"type": "RuntimeDefault"},
                        },
                        "tolerations": [
                            {"effect": "NoSchedule", "key": "node-role.kubernetes.io/control-plane"},
                        ],
                        "containers": [{
                            "name": "manager",
                            "image": options.image,
                            "imagePullPolicy": "IfNotPresent",
                            "args": manager_args(),
                            "env": [
                                field_env("POD_NAMESPACE", "metadata.namespace"),
                                field_env("POD_NAME", "metadata.name"),
                                field_env("POD_UID", "metadata.uid"),
                            ],
                            "ports": [
                                {"containerPort": HEALTH_PORT, "name": "healthz", "protocol": "TCP"},
                                {"containerPort": METRICS_PORT, "name": "metrics", "protocol": "TCP"},
                            ],
                            "livenessProbe": probe("/healthz"),
                            "readinessProbe": probe("/readyz"),
                            "securityContext": {
                                "allowPrivilegeEscalation": false,
                                "privileged": false,
                                "readOnlyRootFilesystem": true,
                                "runAsUser": RUN_AS_ID,
                                "runAsGroup": RUN_AS_ID,
                                "capabilities": {"drop": ["ALL"]},
                            },
                            "volumeMounts": [
                                {"name": STAGING_VOLUME, "mountPath": STAGING_DIR},
                            ],
                        }],
                        "volumes": [
                            {"name": STAGING_VOLUME, "emptyDir": {}},
                        ],
                    },
                },
            },
        }),
        &[("app.kubernetes.io/name", "banlieue")],
    )
}
