//! RBAC: the controller's ClusterRole (exactly what the controllers use, no aggregation
//! label), the leader-election Role, and `banlieue-capi-infrastructure`, the only rules
//! Cluster API's manager gets on our kinds.

use serde_json::{Value, json};

use super::{
    AGGREGATE_ROLE_NAME, CONTROLLER_NAME, LEADER_ELECTION_NAME, METRICS_READER_NAME, common_labels,
    labelled,
};

/// Every verb on an object.
const ALL: [&str; 7] = [
    "create", "delete", "get", "list", "patch", "update", "watch",
];
const READ: [&str; 3] = ["get", "list", "watch"];
/// Objects the controllers create and delete themselves. No `update`: every write is a
/// patch (server-side apply, merge and JSON patches).
const OWNED: [&str; 6] = ["create", "delete", "get", "list", "patch", "watch"];
/// Secrets: see the rule's comment for why each verb.
const SECRETS: [&str; 6] = ["create", "delete", "get", "list", "patch", "watch"];
/// Objects users create, whose finalizers and labels the controllers patch.
const WATCHED: [&str; 4] = ["get", "list", "patch", "watch"];

/// `(plural, has a status subresource)` of every CRD of `group`, sorted by plural.
fn resources_of(group: &str) -> Vec<(String, bool)> {
    let mut resources: Vec<(String, bool)> = banlieue_sdk::crds::all()
        .into_iter()
        .filter(|crd| crd.spec.group == group)
        .map(|crd| {
            let status = crd
                .spec
                .versions
                .iter()
                .any(|v| v.subresources.as_ref().is_some_and(|s| s.status.is_some()));
            (crd.spec.names.plural, status)
        })
        .collect();
    resources.sort();
    resources
}

/// Every resource of `group` and the `/status` of those that have one.
fn with_status(group: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (plural, status) in resources_of(group) {
        if status {
            out.push(format!("{plural}/status"));
        }
        out.push(plural);
    }
    out.sort();
    out
}

fn finalizers(group: &str) -> Vec<String> {
    resources_of(group)
        .into_iter()
        .map(|(plural, _)| format!("{plural}/finalizers"))
        .collect()
}

fn rule(groups: &[&str], resources: &[String], verbs: &[&str]) -> Value {
    json!({"apiGroups": groups, "resources": resources, "verbs": verbs})
}

fn names(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// The controller's ClusterRole. No aggregation label: Cluster API gets its rights
/// from [`aggregate_cluster_role`] alone.
pub fn controller_cluster_role() -> Value {
    let core = banlieue_sdk::api::GROUP;
    let infra = banlieue_sdk::api::INFRA_GROUP;
    let plurals = |group: &str| -> Vec<String> {
        resources_of(group)
            .into_iter()
            .map(|(plural, _)| plural)
            .collect()
    };
    let statuses = |group: &str| -> Vec<String> {
        resources_of(group)
            .into_iter()
            .filter(|(_, status)| *status)
            .map(|(plural, _)| format!("{plural}/status"))
            .collect()
    };
    // The infrastructure machines are made (and removed) for VirtualMachines; the
    // clusters and templates are Cluster API's or the user's.
    let (infra_machines, infra_others): (Vec<String>, Vec<String>) = plurals(infra)
        .into_iter()
        .partition(|p| p.ends_with("machines"));
    let mut finalizer_owners = finalizers(core);
    finalizer_owners.extend(finalizers(infra));
    let mut status = statuses(core);
    status.extend(statuses(infra));
    labelled(
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": CONTROLLER_NAME},
            "rules": [
                rule(&[core], &plurals(core), &WATCHED),
                rule(&[infra], &infra_others, &WATCHED),
                rule(&[infra], &infra_machines, &OWNED),
                // Status is written by server-side apply: a patch of the subresource.
                rule(&[core, infra], &status, &["patch"]),
                // Owner references with blockOwnerDeletion need `update` on the owner's
                // finalizers where OwnerReferencesPermissionEnforcement is on.
                rule(&[core, infra], &finalizer_owners, &["update"]),
                rule(&["cluster.x-k8s.io"], &names(&["clusters", "machines"]), &READ),
                // Secrets, verb by verb (docs/book: security.md):
                // - get: only Secrets an object names: a Provider's credentials and
                //   CA, a VirtualMachine's userData/networkConfig, a CAPI Machine's
                //   bootstrap dataSecretName, and the VM's own bootstrap copy;
                // - list, watch: metadata only (PartialObjectMetadata), for the
                //   Provider controller to notice a credentials change; no Secret's
                //   content is ever listed or watched. RBAC cannot tell the two apart;
                // - create: the VM's bootstrap copy `<vm>-bootstrap`, only when absent;
                // - patch: that copy, only while the VM owns it (owner UID checked),
                //   and the `clusterctl.cluster.x-k8s.io/move` label on a Provider's
                //   credentials Secret, which only a patch can add to a user's Secret;
                // - delete: that copy, only while the VM owns it (UID precondition).
                // No update.
                rule(&[""], &names(&["secrets"]), &SECRETS),
                rule(&[""], &names(&["configmaps"]), &READ),
                rule(&["", "events.k8s.io"], &names(&["events"]), &["create", "patch"]),
                // Addresses from Cluster API IPAM pools: claims owned by the machine.
                rule(&["ipam.cluster.x-k8s.io"], &names(&["ipaddressclaims"]), &OWNED),
                rule(&["ipam.cluster.x-k8s.io"], &names(&["ipaddresses"]), &READ),
                // Who may read /metrics (runtime/diagnostics): the caller's token is
                // reviewed, then its access.
                rule(&["authentication.k8s.io"], &names(&["tokenreviews"]), &["create"]),
                rule(&["authorization.k8s.io"], &names(&["subjectaccessreviews"]), &["create"]),
            ],
        }),
        &[],
    )
}

/// `banlieue-metrics-reader`: `get` on `/metrics`, for Prometheus' ServiceAccount (bind
/// it), as kubebuilder's `metrics-reader` role is.
pub fn metrics_reader_cluster_role() -> Value {
    labelled(
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": METRICS_READER_NAME},
            "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}],
        }),
        &[],
    )
}

/// Binds the controller's ClusterRole to its ServiceAccount.
pub fn controller_binding(namespace: &str) -> Value {
    labelled(
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": CONTROLLER_NAME},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": CONTROLLER_NAME},
            "subjects": [{"kind": "ServiceAccount", "name": CONTROLLER_NAME, "namespace": namespace}],
        }),
        &[],
    )
}

/// Leases in the install namespace only (leader election).
pub fn leader_election_role(namespace: &str) -> Value {
    labelled(
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": LEADER_ELECTION_NAME, "namespace": namespace},
            "rules": [rule(&["coordination.k8s.io"], &names(&["leases"]), &ALL)],
        }),
        &[],
    )
}

/// Binds the leader-election Role to the controller's ServiceAccount.
pub fn leader_election_binding(namespace: &str) -> Value {
    labelled(
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": LEADER_ELECTION_NAME, "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": LEADER_ELECTION_NAME},
            "subjects": [{"kind": "ServiceAccount", "name": CONTROLLER_NAME, "namespace": namespace}],
        }),
        &[],
    )
}

/// `banlieue-capi-infrastructure`: exactly get/list/watch/create/update/patch/delete on
/// the `infrastructure.banlieue.io` kinds and their `/status`, aggregated into Cluster
/// API's core manager role and into the kubeadm control plane's (which clones machine
/// templates). Nothing in `banlieue.io`, no Secrets, IPAM, Events or Leases.
pub fn aggregate_cluster_role() -> Value {
    let mut labels = common_labels();
    labels["cluster.x-k8s.io/aggregate-to-manager"] = json!("true");
    labels["kubeadm.controlplane.cluster.x-k8s.io/aggregate-to-manager"] = json!("true");
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": AGGREGATE_ROLE_NAME, "labels": labels},
        "rules": [rule(
            &[banlieue_sdk::api::INFRA_GROUP],
            &with_status(banlieue_sdk::api::INFRA_GROUP),
            &ALL,
        )],
    })
}
