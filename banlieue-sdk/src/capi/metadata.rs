//! Who owns an infrastructure object and whether banlieue may act on it: pure
//! functions over `metadata` (and the owning Cluster, once read).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::GROUP;
use super::objects::Cluster;

/// Label CAPI sets on the objects of a cluster.
pub const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";
/// Annotation that pauses reconciliation of one object.
pub const PAUSED_ANNOTATION: &str = "cluster.x-k8s.io/paused";
/// Annotation marking an InfraCluster as managed by another system.
pub const MANAGED_BY_ANNOTATION: &str = "cluster.x-k8s.io/managed-by";
/// Annotation `clusterctl move` puts on source objects it is about to delete: the
/// infrastructure behind them lives on and must not be torn down.
pub const DELETE_FOR_MOVE_ANNOTATION: &str = "clusterctl.cluster.x-k8s.io/delete-for-move";
/// Label asking `clusterctl move` to carry an object no Cluster owns.
pub const MOVE_LABEL: &str = "clusterctl.cluster.x-k8s.io/move";

/// The name of the owner of `kind` in CAPI's group, if any (any owner reference, not
/// only the controller one: since CAPI 1.13 a Cluster's reference to its
/// InfraCluster is not a controller reference).
pub fn capi_owner<'m>(meta: &'m ObjectMeta, kind: &str) -> Option<&'m str> {
    meta.owner_references.iter().flatten().find_map(|o| {
        let group = o.api_version.split_once('/').map_or("", |(g, _)| g);
        (group == GROUP && o.kind == kind).then_some(o.name.as_str())
    })
}

/// The CAPI Cluster an object belongs to: its `cluster-name` label, else an owning
/// Cluster.
pub fn cluster_name(meta: &ObjectMeta) -> Option<&str> {
    meta.labels
        .as_ref()
        .and_then(|l| l.get(CLUSTER_NAME_LABEL))
        .map(String::as_str)
        .filter(|n| !n.is_empty())
        .or_else(|| capi_owner(meta, "Cluster"))
}

/// True when the object takes part in Cluster API (so the contract's waiting and
/// pausing rules apply): it has a Machine or Cluster owner or a cluster-name label.
pub fn is_capi_managed(meta: &ObjectMeta) -> bool {
    cluster_name(meta).is_some() || capi_owner(meta, "Machine").is_some()
}

fn has_annotation(meta: &ObjectMeta, key: &str) -> bool {
    meta.annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(key))
}

/// Why reconciliation is paused, if it is: the object's own annotation or its
/// Cluster's `spec.paused`.
pub fn paused(meta: &ObjectMeta, cluster: Option<&Cluster>) -> Option<&'static str> {
    if has_annotation(meta, PAUSED_ANNOTATION) {
        return Some("annotated cluster.x-k8s.io/paused");
    }
    if let Some(cluster) = cluster {
        if cluster.spec.paused == Some(true) {
            return Some("the Cluster is paused (spec.paused)");
        }
        if has_annotation(&cluster.metadata, PAUSED_ANNOTATION) {
            return Some("the Cluster is annotated cluster.x-k8s.io/paused");
        }
    }
    None
}

/// True when another system manages this InfraCluster.
pub fn externally_managed(meta: &ObjectMeta) -> bool {
    has_annotation(meta, MANAGED_BY_ANNOTATION)
}

/// True when `clusterctl move` is deleting this object only to recreate it elsewhere.
pub fn deleted_for_move(meta: &ObjectMeta) -> bool {
    has_annotation(meta, DELETE_FOR_MOVE_ANNOTATION)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use std::collections::BTreeMap;

    fn owner(api_version: &str, kind: &str, name: &str) -> OwnerReference {
        OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            ..Default::default()
        }
    }

    fn meta(
        owners: Vec<OwnerReference>,
        labels: &[(&str, &str)],
        annotations: &[&str],
    ) -> ObjectMeta {
        ObjectMeta {
            owner_references: Some(owners),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            annotations: Some(
                annotations
                    .iter()
                    .map(|k| (k.to_string(), String::new()))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn owners_are_found_by_group_and_kind_whatever_the_version() {
        let m = meta(
            vec![
                owner("banlieue.io/v1alpha1", "Machine", "not-capi"),
                owner("cluster.x-k8s.io/v1beta1", "Machine", "m1"),
            ],
            &[],
            &[],
        );
        assert_eq!(capi_owner(&m, "Machine"), Some("m1"));
        assert_eq!(capi_owner(&m, "Cluster"), None);
        assert!(is_capi_managed(&m));
        assert!(!is_capi_managed(&meta(
            vec![owner("banlieue.io/v1alpha1", "VirtualMachine", "vm")],
            &[],
            &[]
        )));
    }

    #[test]
    fn cluster_name_prefers_the_label_then_the_owner() {
        let labelled = meta(
            vec![owner("cluster.x-k8s.io/v1beta2", "Cluster", "owner")],
            &[(CLUSTER_NAME_LABEL, "label")],
            &[],
        );
        assert_eq!(cluster_name(&labelled), Some("label"));
        let owned = meta(
            vec![owner("cluster.x-k8s.io/v1beta2", "Cluster", "owner")],
            &[(CLUSTER_NAME_LABEL, "")],
            &[],
        );
        assert_eq!(cluster_name(&owned), Some("owner"));
        assert_eq!(cluster_name(&ObjectMeta::default()), None);
    }

    #[test]
    fn pause_comes_from_the_object_or_its_cluster() {
        let cluster = |paused: Option<bool>, annotated: bool| Cluster {
            metadata: ObjectMeta {
                annotations: annotated
                    .then(|| BTreeMap::from([(PAUSED_ANNOTATION.to_string(), "true".to_string())])),
                ..Default::default()
            },
            spec: super::super::objects::ClusterSpec {
                paused,
                infrastructure_ref: None,
            },
        };
        let plain = ObjectMeta::default();
        let annotated = meta(vec![], &[], &[PAUSED_ANNOTATION]);
        let table = [
            (&plain, None, false),
            (&plain, Some(cluster(None, false)), false),
            (&plain, Some(cluster(Some(false), false)), false),
            (&plain, Some(cluster(Some(true), false)), true),
            (&plain, Some(cluster(None, true)), true),
            (&annotated, None, true),
            (&annotated, Some(cluster(Some(false), false)), true),
        ];
        for (meta, cluster, expected) in table {
            assert_eq!(
                paused(meta, cluster.as_ref()).is_some(),
                expected,
                "{meta:?} {cluster:?}"
            );
        }
    }

    #[test]
    fn managed_by_and_move_annotations() {
        assert!(externally_managed(&meta(
            vec![],
            &[],
            &[MANAGED_BY_ANNOTATION]
        )));
        assert!(!externally_managed(&ObjectMeta::default()));
        assert!(deleted_for_move(&meta(
            vec![],
            &[],
            &[DELETE_FOR_MOVE_ANNOTATION]
        )));
    }
}
