//! The ClusterRole aggregation controller's job, which kube-controller-manager would do:
//! the test control plane runs no controller manager.

use std::collections::BTreeMap;

use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

/// The ClusterRole aggregation controller's job (kube-controller-manager is not
/// running): every ClusterRole with an `aggregationRule` gets the union of the rules
/// of the ClusterRoles its `matchLabels` selectors select.
pub(super) async fn aggregate_once(client: &kube::Client) -> Result<(), String> {
    let api = Api::<ClusterRole>::all(client.clone());
    let roles = api
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("capi rig: listing ClusterRoles: {e}"))?
        .items;
    for role in &roles {
        let Some(rule) = &role.aggregation_rule else {
            continue;
        };
        let selectors: Vec<BTreeMap<String, String>> = rule
            .cluster_role_selectors
            .iter()
            .flatten()
            .map(|s| s.match_labels.clone().unwrap_or_default())
            .collect();
        let mut rules = Vec::new();
        for source in &roles {
            let labels = source.metadata.labels.clone().unwrap_or_default();
            let selected = selectors
                .iter()
                .any(|s| !s.is_empty() && s.iter().all(|(k, v)| labels.get(k) == Some(v)));
            if selected && source.metadata.name != role.metadata.name {
                for r in source.rules.iter().flatten() {
                    if !rules.contains(r) {
                        rules.push(r.clone());
                    }
                }
            }
        }
        if role.rules.as_ref().unwrap_or(&Vec::new()) != &rules {
            let name = role.metadata.name.clone().unwrap_or_default();
            api.patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"rules": rules})),
            )
            .await
            .map_err(|e| format!("capi rig: aggregating {name}: {e}"))?;
        }
    }
    Ok(())
}

/// Keeps aggregating for as long as the process runs. It polls (every 500 ms) instead
/// of watching: a watch left open at exit would hold the apiserver's graceful shutdown
/// for the harness's whole stop timeout.
pub(super) async fn aggregate_forever(client: kube::Client) {
    loop {
        if let Err(e) = aggregate_once(&client).await {
            eprintln!("{e}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}
