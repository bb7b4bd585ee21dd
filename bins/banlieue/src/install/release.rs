//! The clusterctl release assets: `infrastructure-components.yaml` (the install's
//! objects), `metadata.yaml` (release series to contract) and the
//! `cluster-template*.yaml` flavors (kept as YAML under `deploy/templates/`).

use serde_json::{Value, json};

use super::{Options, components, to_yaml};

/// The Cluster API contract banlieue implements.
pub const CONTRACT: &str = "v1beta2";

/// The cluster template flavors: `(flavor, template)`. `clusterctl generate cluster
/// --flavor <flavor>` reads `cluster-template-<flavor>.yaml`.
pub const FLAVORS: [(&str, &str); 5] = [
    (
        "vsphere",
        include_str!("../../../../deploy/templates/cluster-template-vsphere.yaml"),
    ),
    (
        "proxmox",
        include_str!("../../../../deploy/templates/cluster-template-proxmox.yaml"),
    ),
    (
        "libvirt",
        include_str!("../../../../deploy/templates/cluster-template-libvirt.yaml"),
    ),
    (
        "cloud-hypervisor",
        include_str!("../../../../deploy/templates/cluster-template-cloud-hypervisor.yaml"),
    ),
    (
        "sim",
        include_str!("../../../../deploy/templates/cluster-template-sim.yaml"),
    ),
];

/// The flavor `cluster-template.yaml` (no `--flavor`) is.
pub const DEFAULT_FLAVOR: &str = "vsphere";

/// `major.minor` of a `major.minor.patch[-pre]` version.
fn major_minor(version: &str) -> Option<(u64, u64)> {
    let mut parts = version.trim_start_matches('v').split(['.', '-', '+']);
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// clusterctl's `metadata.yaml` for `version`: one release series per minor up to
/// `version`'s (every banlieue release so far serves contract v1beta2), newest first.
pub fn metadata(version: &str) -> anyhow::Result<Value> {
    let (major, minor) = major_minor(version)
        .ok_or_else(|| anyhow::anyhow!("{version:?} is not a semantic version"))?;
    let first = if major == 0 { 1 } else { 0 };
    let series: Vec<Value> = (first..=minor)
        .rev()
        .map(|minor| json!({"major": major, "minor": minor, "contract": CONTRACT}))
        .collect();
    Ok(json!({
        "apiVersion": "clusterctl.cluster.x-k8s.io/v1alpha3",
        "kind": "Metadata",
        "releaseSeries": series,
    }))
}

/// Every release asset as `(file name, contents)`.
pub fn assets(options: &Options, version: &str) -> anyhow::Result<Vec<(String, String)>> {
    let mut files = vec![
        (
            "infrastructure-components.yaml".to_owned(),
            to_yaml(&components(options))?,
        ),
        (
            "metadata.yaml".to_owned(),
            serde_saphyr::to_string(&metadata(version)?)?,
        ),
    ];
    for (flavor, template) in FLAVORS {
        files.push((
            format!("cluster-template-{flavor}.yaml"),
            template.to_owned(),
        ));
        if flavor == DEFAULT_FLAVOR {
            files.push(("cluster-template.yaml".to_owned(), template.to_owned()));
        }
    }
    Ok(files)
}
