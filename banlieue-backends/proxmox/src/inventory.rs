//! Provider inventory: one failure domain per online cluster node, with the storages
//! (that take VM images) and bridges it can reach.

use std::collections::{BTreeMap, BTreeSet};

use banlieue_sdk::backend::{Architecture, FailureDomainInventory, Inventory};
use serde_json::Value;

use crate::client::{Form, PveClient, PveError, encode};

/// The zone label every failure domain carries (`= node name`).
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// The label naming the Proxmox cluster.
pub const CLUSTER_LABEL: &str = "banlieue.io/proxmox-cluster";
/// The location key naming the node (read by the VirtualMachine builder as `targetNode`).
pub const NODE_LOCATION: &str = "node";

/// `Proxmox VE 9.0.10 (release 9.0)` from `GET /version`.
pub fn version_string(version: &Value) -> String {
    let v = version
        .get("version")
        .and_then(Value::as_str)
        .unwrap_or("unknown");
    match version.get("release").and_then(Value::as_str) {
        Some(release) => format!("Proxmox VE {v} (release {release})"),
        None => format!("Proxmox VE {v}"),
    }
}

/// The cluster's name from `GET /cluster/status`, and whether it is quorate. A
/// standalone node has no `cluster` entry: its name is the node's.
pub fn cluster_of(status: &Value) -> (Option<String>, bool) {
    let entries = status.as_array().map(Vec::as_slice).unwrap_or_default();
    let cluster = entries
        .iter()
        .find(|e| e.get("type").and_then(Value::as_str) == Some("cluster"));
    match cluster {
        Some(c) => (
            c.get("name").and_then(Value::as_str).map(str::to_string),
            c.get("quorate").and_then(Value::as_i64).unwrap_or(1) == 1,
        ),
        None => (None, true),
    }
}

/// Online node names from `GET /nodes`, sorted.
pub fn online_nodes(nodes: &Value) -> Vec<String> {
    let mut names: Vec<String> = nodes
        .as_array()
        .into_iter()
        .flatten()
        .filter(|n| n.get("status").and_then(Value::as_str) == Some("online"))
        .filter_map(|n| n.get("node").and_then(Value::as_str).map(str::to_string))
        .collect();
    names.sort();
    names
}

/// Active storages taking VM images, from `GET /nodes/{node}/storage`.
pub fn image_storages(storages: &Value) -> BTreeSet<String> {
    storages
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s.get("active").and_then(Value::as_i64).unwrap_or(1) == 1)
        .filter(|s| s.get("enabled").and_then(Value::as_i64).unwrap_or(1) == 1)
        .filter(|s| {
            s.get("content")
                .and_then(Value::as_str)
                .is_some_and(|c| c.split(',').any(|c| c.trim() == "images"))
        })
        .filter_map(|s| s.get("storage").and_then(Value::as_str).map(str::to_string))
        .collect()
}

/// Bridges (Linux and OVS) from `GET /nodes/{node}/network`.
pub fn bridges(network: &Value) -> BTreeSet<String> {
    network
        .as_array()
        .into_iter()
        .flatten()
        .filter(|i| {
            matches!(
                i.get("type").and_then(Value::as_str),
                Some("bridge" | "OVSBridge")
            )
        })
        .filter_map(|i| i.get("iface").and_then(Value::as_str).map(str::to_string))
        .collect()
}

/// CPU vendor IDs of x86-64 processors (CPUID leaf 0, spaces trimmed: Zhaoxin's is
/// `  Shanghai  `), as `/proc/cpuinfo`'s `vendor_id` and so PVE's `cpuinfo.vendor`
/// give them: only x86 hosts have one of these.
const X86_VENDORS: [&str; 5] = [
    "GenuineIntel",
    "AuthenticAMD",
    "HygonGenuine",
    "CentaurHauls",
    "Shanghai",
];

/// The node's architecture from `GET /nodes/{node}/status`: its running kernel's
/// `current-kernel.machine` (`uname -m`, PVE 8.1 and later) when it names one, else an
/// x86 CPU vendor in `cpuinfo.vendor` (older PVE sends no `current-kernel`; fakepve
/// sends `machine: fake` and `vendor: GenuineIntel`). Proxmox VE itself is released
/// for amd64 only, but a port or a fork may run elsewhere: what the node says is what
/// counts, and a node that says nothing usable reports none (no VM is placed there).
pub fn node_architecture(status: &Value) -> Option<Architecture> {
    let machine = status
        .pointer("/current-kernel/machine")
        .and_then(Value::as_str)
        .and_then(Architecture::from_machine);
    machine.or_else(|| {
        status
            .pointer("/cpuinfo/vendor")
            .and_then(Value::as_str)
            .filter(|v| X86_VENDORS.contains(&v.trim()))
            .map(|_| Architecture::Amd64)
    })
}

/// One node's failure domain.
pub fn failure_domain(
    node: &str,
    cluster: &str,
    storages: BTreeSet<String>,
    bridges: BTreeSet<String>,
    vlans: &BTreeSet<String>,
    architecture: Option<Architecture>,
) -> FailureDomainInventory {
    let mut resources = BTreeMap::from([
        ("storage".to_string(), storages),
        ("bridge".to_string(), bridges),
    ]);
    if !vlans.is_empty() {
        resources.insert("vlan".to_string(), vlans.clone());
    }
    FailureDomainInventory {
        name: node.to_string(),
        labels: BTreeMap::from([
            (ZONE_LABEL.to_string(), node.to_string()),
            (CLUSTER_LABEL.to_string(), cluster.to_string()),
        ]),
        location: BTreeMap::from([(NODE_LOCATION.to_string(), node.to_string())]),
        resources,
        features: BTreeSet::new(),
        architecture,
    }
}

/// Reads the whole inventory (1 + 2 + 3 × nodes requests).
pub async fn read(
    client: &PveClient,
    cluster_override: Option<&str>,
    vlans: &BTreeSet<String>,
) -> Result<Inventory, PveError> {
    let none = Form::new();
    let version = version_string(&client.get("/version", &none).await?);
    let (cluster, _quorate) = cluster_of(&client.get("/cluster/status", &none).await?);
    let nodes = online_nodes(&client.get("/nodes", &none).await?);
    let cluster = cluster_override
        .map(str::to_string)
        .or(cluster)
        .or_else(|| nodes.first().cloned())
        .unwrap_or_default();
    let mut failure_domains = Vec::with_capacity(nodes.len());
    for node in &nodes {
        let storages = client
            .get(
                &format!("/nodes/{}/storage", encode(node)),
                &Form::new().set("enabled", 1).set("content", "images"),
            )
            .await?;
        let network = client
            .get(
                &format!("/nodes/{}/network", encode(node)),
                &Form::new().set("type", "any_bridge"),
            )
            .await?;
        let status = client
            .get(&format!("/nodes/{}/status", encode(node)), &none)
            .await?;
        failure_domains.push(failure_domain(
            node,
            &cluster,
            image_storages(&storages),
            bridges(&network),
            vlans,
            node_architecture(&status),
        ));
    }
    Ok(Inventory {
        version,
        failure_domains,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn golden(name: &str) -> Value {
        let path = format!("{}/tests/golden/{name}", env!("CARGO_MANIFEST_DIR"));
        crate::client::parse(200, "OK", &std::fs::read(path).unwrap()).unwrap()
    }

    #[test]
    fn reads_fakepves_answers() {
        assert_eq!(
            version_string(&golden("version.json")),
            "Proxmox VE 9.0.10 (release 9.0)"
        );
        assert_eq!(
            cluster_of(&golden("cluster_status.json")),
            (Some("fakecluster".into()), true)
        );
        assert_eq!(online_nodes(&golden("nodes.json")), ["pve1", "pve2"]);
        assert_eq!(
            image_storages(&golden("node_storage.json")),
            BTreeSet::from(["fast".into(), "local-lvm".into()])
        );
        assert_eq!(
            bridges(&golden("node_network.json")),
            BTreeSet::from(["vmbr0".into()])
        );
        // fakepve's kernel is `fake`; its CPU vendor is Intel's.
        assert_eq!(
            node_architecture(&golden("node_status.json")),
            Some(Architecture::Amd64)
        );
    }

    #[test]
    fn a_nodes_architecture_is_what_it_says_or_none() {
        use serde_json::json;
        let status = |machine: Option<&str>, vendor: Option<&str>| {
            let mut s = json!({"cpuinfo": {"model": "x", "cpus": 8}});
            if let Some(m) = machine {
                s["current-kernel"] = json!({"sysname": "Linux", "machine": m});
            }
            if let Some(v) = vendor {
                s["cpuinfo"]["vendor"] = json!(v);
            }
            s
        };
        use Architecture::{Amd64, Arm64};
        let table = [
            // PVE 8.1+ on an Intel host, as it answers.
            (Some("x86_64"), Some("GenuineIntel"), Some(Amd64)),
            (Some("aarch64"), None, Some(Arm64)),
            // The kernel wins over a vendor that contradicts it.
            (Some("aarch64"), Some("GenuineIntel"), Some(Arm64)),
            // PVE before 8.1: no current-kernel, the vendor tells x86.
            (None, Some("AuthenticAMD"), Some(Amd64)),
            (Some("fake"), Some("GenuineIntel"), Some(Amd64)),
            // Nothing usable: none, never a guess.
            (None, None, None),
            (Some("riscv64"), None, None),
            (None, Some("ARM"), None),
        ];
        for (machine, vendor, want) in table {
            assert_eq!(
                node_architecture(&status(machine, vendor)),
                want,
                "{machine:?} {vendor:?}"
            );
        }
    }

    #[test]
    fn a_node_is_a_failure_domain() {
        let fd = failure_domain(
            "pve1",
            "lab",
            BTreeSet::from(["local-lvm".into()]),
            BTreeSet::from(["vmbr0".into()]),
            &BTreeSet::from(["10".into()]),
            Some(Architecture::Amd64),
        );
        assert_eq!(fd.name, "pve1");
        assert_eq!(fd.architecture, Some(Architecture::Amd64));
        assert_eq!(fd.labels[ZONE_LABEL], "pve1");
        assert_eq!(fd.labels[CLUSTER_LABEL], "lab");
        assert_eq!(fd.location[NODE_LOCATION], "pve1");
        assert!(fd.resources["storage"].contains("local-lvm"));
        assert!(fd.resources["bridge"].contains("vmbr0"));
        assert!(fd.resources["vlan"].contains("10"));
        let no_vlans = failure_domain(
            "pve1",
            "lab",
            BTreeSet::new(),
            BTreeSet::new(),
            &BTreeSet::new(),
            None,
        );
        assert!(!no_vlans.resources.contains_key("vlan"));
    }
}
