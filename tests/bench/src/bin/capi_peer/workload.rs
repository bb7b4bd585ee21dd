//! The one Cluster API workload both sides get: a Cluster, MachineDeployments totalling N
//! Machines whose bootstrap data Secret already exists, and what each provider needs to
//! serve them (banlieue: a `sim` Provider with no latency behind a VSphereCluster; the
//! peer: a DevCluster and DevMachineTemplate with the `inMemory` backend and every
//! provisioning delay set to zero).

use serde_json::{Value, json};

use crate::Side;

/// Cluster API's API version.
pub const CAPI: &str = "cluster.x-k8s.io/v1beta2";
/// The Cluster's name.
pub const CLUSTER: &str = "bench";
/// The bootstrap data Secret every Machine names.
const BOOTSTRAP: &str = "bench-bootstrap";
/// The Kubernetes version the Machines carry (CAPD's nodes report it; banlieue ignores it).
const VERSION: &str = "v1.33.0";

/// The infrastructure group and the kinds of the infra cluster and machine template.
fn kinds(side: Side) -> (&'static str, &'static str, &'static str) {
    match side {
        Side::Banlieue => (
            "infrastructure.banlieue.io",
            "VSphereCluster",
            "VSphereMachineTemplate",
        ),
        Side::Peer => (
            "infrastructure.cluster.x-k8s.io",
            "DevCluster",
            "DevMachineTemplate",
        ),
    }
}

/// Replicas per MachineDeployment: `n` split into deployments of at most `per_md`.
pub fn deployments(n: usize, per_md: usize) -> Vec<usize> {
    let per_md = per_md.max(1);
    let mut left = n;
    let mut out = Vec::new();
    while left > 0 {
        let take = left.min(per_md);
        out.push(take);
        left -= take;
    }
    out
}

/// Every object of the workload, in apply order (dependencies first), for `namespace`.
pub fn objects(side: Side, namespace: &str, n: usize, per_md: usize) -> Vec<Value> {
    let (group, cluster_kind, template_kind) = kinds(side);
    let mut objects = vec![json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": BOOTSTRAP},
        "stringData": {"value": "#cloud-config\n", "format": "cloud-config"}})];
    match side {
        Side::Banlieue => objects.extend([
            json!({"apiVersion": "banlieue.io/v1alpha1", "kind": "Provider", "metadata": {"name": "sim"},
                   "spec": {"class": "sim", "connection": {"endpoint": format!("sim://{namespace}")},
                            "settings": {"machineKind": "VSphereMachine", "failureDomains": "zone-a", "latency": "0s"}}}),
            json!({"apiVersion": format!("{group}/v1alpha1"), "kind": cluster_kind, "metadata": {"name": CLUSTER},
                   "spec": {"providerRefs": [{"name": "sim"}],
                            // Documentation address (RFC 5737): a value, never dialled.
                            "controlPlaneEndpoint": {"host": "192.0.2.10", "port": 6443}}}),
            json!({"apiVersion": format!("{group}/v1alpha1"), "kind": template_kind, "metadata": {"name": "workers"},
                   "spec": {"template": {"spec": {"template": "ubuntu-2404", "numCPUs": 2, "memoryMiB": 4096, "diskGiB": 20}}}}),
        ]),
        Side::Peer => {
            let zero = json!({"provisioning": {"startupDuration": "0s"}});
            objects.extend([
                // Its reconciler writes an annotation into a map it does not create (a
                // nil-map panic without one; CAPI's own templates always carry some).
                json!({"apiVersion": format!("{group}/v1beta2"), "kind": cluster_kind,
                       "metadata": {"name": CLUSTER, "annotations": {"banlieue.io/bench": "capi-peer"}},
                       "spec": {"backend": {"inMemory": {}}}}),
                json!({"apiVersion": format!("{group}/v1beta2"), "kind": template_kind, "metadata": {"name": "workers"},
                       "spec": {"template": {"spec": {"backend": {"inMemory": {
                           "vm": zero, "node": zero, "apiServer": zero, "etcd": zero}}}}}}),
            ]);
        }
    }
    objects.push(
        json!({"apiVersion": CAPI, "kind": "Cluster", "metadata": {"name": CLUSTER},
        "spec": {"infrastructureRef": {"apiGroup": group, "kind": cluster_kind, "name": CLUSTER}}}),
    );
    for (i, replicas) in deployments(n, per_md).into_iter().enumerate() {
        let name = format!("workers-{i}");
        let labels = json!({"cluster.x-k8s.io/deployment-name": name});
        objects.push(json!({"apiVersion": CAPI, "kind": "MachineDeployment",
            "metadata": {"name": name,
                         // No control plane here: the checks would wait for one.
                         "annotations": {"machineset.cluster.x-k8s.io/skip-preflight-checks": "All"}},
            "spec": {"clusterName": CLUSTER, "replicas": replicas,
                     "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"clusterName": CLUSTER, "version": VERSION,
                                           "bootstrap": {"dataSecretName": BOOTSTRAP},
                                           "infrastructureRef": {"apiGroup": group, "kind": template_kind, "name": "workers"}}}}}));
    }
    objects
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deployments_total_n() {
        for (n, per, want) in [
            (100, 100, vec![100]),
            (1000, 100, vec![100; 10]),
            (250, 100, vec![100, 100, 50]),
            (0, 100, vec![]),
            (5, 0, vec![1; 5]),
        ] {
            assert_eq!(deployments(n, per), want, "n={n} per={per}");
        }
    }

    #[test]
    fn both_sides_get_the_same_capi_objects() {
        let capi_kinds = |side| -> Vec<(String, Value)> {
            objects(side, "ns", 250, 100)
                .into_iter()
                .filter(|o| o["apiVersion"] == CAPI)
                .map(|o| {
                    (
                        o["kind"].as_str().unwrap().to_owned(),
                        o["spec"]["replicas"].clone(),
                    )
                })
                .collect()
        };
        let ours = capi_kinds(Side::Banlieue);
        assert_eq!(ours, capi_kinds(Side::Peer));
        assert_eq!(ours.len(), 4, "a Cluster and three MachineDeployments");
    }
}
