//! The vCenter's topology (datacenters, compute clusters, their datastores and
//! networks) read in one property-collector call, and the Provider inventory made
//! from it: one failure domain per datacenter × compute cluster.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use banlieue_sdk::backend::{Architecture, FailureDomainInventory, Inventory};

use crate::client::{MoRef, ObjectContent, PropertySpec, VimClient, VimError};

/// Label: the datacenter (a region, in Kubernetes topology terms).
pub const REGION_LABEL: &str = "topology.kubernetes.io/region";
/// Label: the compute cluster (a zone).
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// A datacenter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Datacenter {
    /// Its name.
    pub name: String,
    /// Its reference.
    pub moref: MoRef,
    /// Its root VM folder.
    pub vm_folder: Option<MoRef>,
    /// Its inventory path below the root folder: its name, after the folders it is
    /// in (`folder/DC0`). The datastore file interface's `dcPath`.
    pub path: String,
}

/// A compute cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cluster {
    /// Its name.
    pub name: String,
    /// Its reference.
    pub moref: MoRef,
    /// The datacenter's name.
    pub datacenter: String,
    /// Its root resource pool.
    pub resource_pool: Option<MoRef>,
    /// Names of the datastores its hosts mount.
    pub datastores: BTreeMap<String, MoRef>,
    /// Names of the networks (port groups) its hosts reach.
    pub networks: BTreeMap<String, MoRef>,
    /// Its hosts' architecture, when they all report the same one
    /// ([`esx_architecture`]).
    pub architecture: Option<Architecture>,
}

/// What [`read`] finds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Topology {
    /// Datacenters, by name.
    pub datacenters: BTreeMap<String, Datacenter>,
    /// Compute clusters, in datacenter then name order.
    pub clusters: Vec<Cluster>,
}

/// The name of the failure domain for a datacenter and cluster.
pub fn failure_domain_name(datacenter: &str, cluster: &str) -> String {
    format!("{datacenter}/{cluster}")
}

/// Splits a failure domain name made by [`failure_domain_name`].
pub fn parse_failure_domain(name: &str) -> Option<(&str, &str)> {
    name.split_once('/')
        .filter(|(dc, c)| !dc.is_empty() && !c.is_empty())
}

/// The architecture of an ESXi host from its product's `osType`: `vmnix-x86` (ESXi on
/// x86-64, every release) is amd64, `vmnix-arm64` (ESXi on Arm) arm64, anything else
/// none. The vSphere API documents these values for `AboutInfo.osType`, and vcsim
/// answers `vmnix-x86` as ESXi does; the CPU package's vendor and model name describe
/// the processor rather than the hypervisor's architecture, so they are not read.
pub fn esx_architecture(os_type: &str) -> Option<Architecture> {
    match os_type {
        "vmnix-x86" => Some(Architecture::Amd64),
        "vmnix-arm64" => Some(Architecture::Arm64),
        _ => None,
    }
}

/// A cluster's architecture: its hosts' when every one reports the same, else none
/// (no host, a host whose product says nothing usable, or hosts that disagree: a VM
/// could land, or be moved by DRS, on any of them).
pub fn cluster_architecture(
    hosts: impl IntoIterator<Item = Option<Architecture>>,
) -> Option<Architecture> {
    let mut found = None;
    for host in hosts {
        match (found, host) {
            (_, None) => return None,
            (None, Some(a)) => found = Some(a),
            (Some(seen), Some(a)) if seen != a => return None,
            _ => {}
        }
    }
    found
}

pub(crate) const PROPS: &[PropertySpec<'static>] = &[
    PropertySpec {
        kind: "Datacenter",
        paths: &["name", "parent", "vmFolder"],
    },
    PropertySpec {
        kind: "Folder",
        paths: &["name", "parent"],
    },
    PropertySpec {
        kind: "ClusterComputeResource",
        paths: &[
            "name",
            "parent",
            "resourcePool",
            "datastore",
            "network",
            "host",
        ],
    },
    PropertySpec {
        kind: "HostSystem",
        paths: &["summary.config.product.osType"],
    },
    PropertySpec {
        kind: "Datastore",
        paths: &["name"],
    },
    PropertySpec {
        kind: "Network",
        paths: &["name"],
    },
];

/// Reads the topology below the root folder.
pub async fn read(client: &VimClient) -> Result<Topology, VimError> {
    let root = client.content().await?.root_folder.clone();
    let objects = client
        .retrieve_all(
            &root,
            &[
                "Datacenter",
                "Folder",
                "ClusterComputeResource",
                "Datastore",
                "Network",
                "HostSystem",
            ],
            PROPS,
        )
        .await?;
    Ok(build(&objects))
}

/// Builds the topology from the objects [`read`] retrieves.
pub fn build(objects: &[ObjectContent]) -> Topology {
    let by_ref: HashMap<&MoRef, &ObjectContent> = objects.iter().map(|o| (&o.obj, o)).collect();
    let name = |r: &MoRef| {
        by_ref
            .get(r)
            .and_then(|o| o.text("name"))
            .map(str::to_string)
    };
    // The datacenter above an object: follow `parent` until one is found.
    let datacenter_of = |o: &ObjectContent| {
        let mut at = o.moref("parent");
        for _ in 0..64 {
            let r = at?;
            if r.kind == "Datacenter" {
                return name(&r);
            }
            at = by_ref.get(&r).and_then(|p| p.moref("parent"));
        }
        None
    };
    // The folders between the root folder (which has no parent) and an object.
    let folders_above = |o: &ObjectContent| {
        let mut names = Vec::new();
        let mut at = o.moref("parent");
        for _ in 0..64 {
            let Some(folder) = at.as_ref().and_then(|r| by_ref.get(r)) else {
                break;
            };
            if folder.obj.kind != "Folder" || folder.moref("parent").is_none() {
                break;
            }
            names.push(folder.text("name").unwrap_or_default().to_string());
            at = folder.moref("parent");
        }
        names.reverse();
        names
    };
    let mut topology = Topology::default();
    for o in objects.iter().filter(|o| o.obj.kind == "Datacenter") {
        let Some(n) = o.text("name") else { continue };
        let mut path = folders_above(o);
        path.push(n.to_string());
        topology.datacenters.insert(
            n.to_string(),
            Datacenter {
                name: n.to_string(),
                moref: o.obj.clone(),
                vm_folder: o.moref("vmFolder"),
                path: path.join("/"),
            },
        );
    }
    for o in objects
        .iter()
        .filter(|o| o.obj.kind == "ClusterComputeResource")
    {
        let (Some(n), Some(dc)) = (o.text("name"), datacenter_of(o)) else {
            continue;
        };
        let named = |refs: Vec<MoRef>| {
            refs.into_iter()
                .filter_map(|r| Some((name(&r)?, r)))
                .collect::<BTreeMap<_, _>>()
        };
        topology.clusters.push(Cluster {
            name: n.to_string(),
            moref: o.obj.clone(),
            datacenter: dc,
            resource_pool: o.moref("resourcePool"),
            datastores: named(o.morefs("datastore")),
            networks: named(o.morefs("network")),
            architecture: cluster_architecture(o.morefs("host").iter().map(|h| {
                by_ref
                    .get(h)
                    .and_then(|host| host.text("summary.config.product.osType"))
                    .and_then(esx_architecture)
            })),
        });
    }
    topology
        .clusters
        .sort_by(|a, b| (&a.datacenter, &a.name).cmp(&(&b.datacenter, &b.name)));
    topology
}

/// Whether `value` is a valid Kubernetes label value.
fn label_value(value: &str) -> bool {
    value.len() <= 63
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && value
            .chars()
            .next()
            .is_none_or(|c| c.is_ascii_alphanumeric())
        && value
            .chars()
            .last()
            .is_none_or(|c| c.is_ascii_alphanumeric())
}

impl Topology {
    /// The Provider inventory: one failure domain per datacenter × cluster, labelled
    /// with region = datacenter and zone = cluster (when they are valid label values),
    /// located by `datacenter` and `cluster`, with the names of its `datastore`s and
    /// `portGroup`s.
    pub fn inventory(&self, version: &str) -> Inventory {
        let failure_domains = self
            .clusters
            .iter()
            .map(|c| {
                let mut labels = BTreeMap::new();
                if label_value(&c.datacenter) {
                    labels.insert(REGION_LABEL.to_string(), c.datacenter.clone());
                }
                if label_value(&c.name) {
                    labels.insert(ZONE_LABEL.to_string(), c.name.clone());
                }
                FailureDomainInventory {
                    name: failure_domain_name(&c.datacenter, &c.name),
                    labels,
                    location: BTreeMap::from([
                        ("datacenter".to_string(), c.datacenter.clone()),
                        ("cluster".to_string(), c.name.clone()),
                    ]),
                    resources: BTreeMap::from([
                        (
                            "datastore".to_string(),
                            c.datastores.keys().cloned().collect::<BTreeSet<_>>(),
                        ),
                        (
                            "portGroup".to_string(),
                            c.networks.keys().cloned().collect::<BTreeSet<_>>(),
                        ),
                    ]),
                    features: BTreeSet::new(),
                    architecture: c.architecture,
                }
            })
            .collect();
        Inventory {
            version: version.to_string(),
            failure_domains,
        }
    }

    /// The datacenter whose clusters mount the datastore `datastore`.
    pub fn datacenter_of_datastore(&self, datastore: &MoRef) -> Option<&Datacenter> {
        let cluster = self
            .clusters
            .iter()
            .find(|c| c.datastores.values().any(|d| d == datastore))?;
        self.datacenters.get(&cluster.datacenter)
    }

    /// The cluster named `cluster` in datacenter `datacenter`.
    pub fn cluster(&self, datacenter: &str, cluster: &str) -> Option<&Cluster> {
        self.clusters
            .iter()
            .find(|c| c.datacenter == datacenter && c.name == cluster)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_domain_names_round_trip() {
        let n = failure_domain_name("DC0", "DC0_C1");
        assert_eq!(parse_failure_domain(&n), Some(("DC0", "DC0_C1")));
        assert_eq!(parse_failure_domain("nodc"), None);
    }

    #[test]
    fn a_clusters_architecture_is_its_hosts_when_they_agree() {
        use Architecture::{Amd64, Arm64};
        assert_eq!(esx_architecture("vmnix-x86"), Some(Amd64));
        assert_eq!(esx_architecture("vmnix-arm64"), Some(Arm64));
        assert_eq!(esx_architecture("linux-x86"), None);
        assert_eq!(esx_architecture(""), None);
        let table: [(&[Option<Architecture>], Option<Architecture>); 6] = [
            (&[Some(Amd64), Some(Amd64)], Some(Amd64)),
            (&[Some(Arm64)], Some(Arm64)),
            (&[], None),
            (&[Some(Amd64), Some(Arm64)], None),
            (&[Some(Amd64), None], None),
            (&[None, Some(Amd64)], None),
        ];
        for (hosts, want) in table {
            assert_eq!(
                cluster_architecture(hosts.iter().copied()),
                want,
                "{hosts:?}"
            );
        }
    }

    #[test]
    fn label_values() {
        assert!(label_value("DC0_C0"));
        assert!(!label_value("a/b"));
        assert!(!label_value("-a"));
    }
}
