//! Placement and the clone: template, datacenter, cluster, resource pool, folder,
//! datastore, linked-clone snapshot, and the clone's config.

use banlieue_sdk::api::common::Firmware;
use banlieue_sdk::api::infra::vsphere::{CloneMode, VSphereMachineSpec};
use banlieue_sdk::backend::{BackendError, MachineObservation, MachineRequest};
use tracing::info;

use super::{OpKind, VSphereBackend, vim};
use crate::client::methods::{self, CloneSpec, ConfigSpec, RelocateSpec};
use crate::client::{MoRef, PropertySpec};
use crate::{guestinfo, inventory};

impl VSphereBackend {
    /// A template by inventory path (`/DC0/vm/templates/ubuntu`) or by name.
    pub(super) async fn resolve_template(
        &self,
        template: &str,
    ) -> Result<Option<MoRef>, BackendError> {
        if template.starts_with('/') {
            return self.client.find_by_path(template).await.map_err(vim);
        }
        let root = self
            .client
            .content()
            .await
            .map_err(vim)?
            .root_folder
            .clone();
        let vms = self
            .client
            .retrieve_all(
                &root,
                &["VirtualMachine"],
                &[PropertySpec {
                    kind: "VirtualMachine",
                    paths: &["name"],
                }],
            )
            .await
            .map_err(vim)?;
        Ok(vms
            .into_iter()
            .find(|o| o.text("name") == Some(template))
            .map(|o| o.obj))
    }

    /// A resource pool or folder given as an absolute inventory path, or relative to
    /// `base`.
    pub(super) async fn resolve_path(
        &self,
        path: &str,
        base: &str,
        what: &str,
    ) -> Result<MoRef, BackendError> {
        let full = if path.starts_with('/') {
            path.to_string()
        } else {
            format!("{base}/{path}")
        };
        self.client
            .find_by_path(&full)
            .await
            .map_err(vim)?
            .ok_or_else(|| {
                BackendError::terminal(
                    format!("{what}NotFound"),
                    format!("no {what} at inventory path {full:?}"),
                )
            })
    }

    pub(super) async fn start_clone(
        &self,
        request: &MachineRequest,
        spec: &VSphereMachineSpec,
    ) -> Result<MachineObservation, BackendError> {
        let identity = &request.identity;
        if let Some(policy) = &spec.storage_policy_name {
            return Err(BackendError::terminal(
                "StoragePolicyUnsupported",
                format!(
                    "storagePolicyName {policy:?}: storage policies are not supported yet; name a datastore"
                ),
            ));
        }
        let template = self
            .resolve_template(&spec.template)
            .await?
            .ok_or_else(|| {
                BackendError::terminal(
                    "TemplateNotFound",
                    format!(
                        "no template {:?} on {}",
                        spec.template,
                        self.client.endpoint()
                    ),
                )
            })?;
        let topology = self.topology(false).await?;
        let from_fd = request
            .failure_domain
            .as_deref()
            .and_then(inventory::parse_failure_domain);
        let dc_name = spec
            .datacenter
            .clone()
            .or_else(|| from_fd.map(|(dc, _)| dc.to_string()))
            .or_else(|| self.settings.datacenter.clone())
            .or_else(|| {
                (topology.datacenters.len() == 1)
                    .then(|| topology.datacenters.keys().next().cloned())
                    .flatten()
            })
            .ok_or_else(|| {
                BackendError::terminal(
                    "NoPlacement",
                    "the machine names no datacenter, it has no failure domain, and the vCenter has several datacenters",
                )
            })?;
        let dc_name = dc_name.trim_start_matches('/').to_string();
        let dc = topology.datacenters.get(&dc_name).ok_or_else(|| {
            BackendError::terminal("DatacenterNotFound", format!("no datacenter {dc_name:?}"))
        })?;
        let cluster_name = spec
            .cluster
            .clone()
            .or_else(|| from_fd.map(|(_, c)| c.to_string()))
            .or_else(|| {
                let mut in_dc = topology.clusters.iter().filter(|c| c.datacenter == dc_name);
                match (in_dc.next(), in_dc.next()) {
                    (Some(only), None) => Some(only.name.clone()),
                    _ => None,
                }
            })
            .ok_or_else(|| {
                BackendError::terminal(
                    "NoPlacement",
                    format!("the machine names no cluster and datacenter {dc_name:?} has several"),
                )
            })?;
        let cluster = topology.cluster(&dc_name, &cluster_name).ok_or_else(|| {
            BackendError::terminal(
                "ClusterNotFound",
                format!("no compute cluster {cluster_name:?} in datacenter {dc_name:?}"),
            )
        })?;
        let pool = match &spec.resource_pool {
            Some(p) => {
                self.resolve_path(
                    p,
                    &format!("/{dc_name}/host/{cluster_name}/Resources"),
                    "ResourcePool",
                )
                .await?
            }
            None => cluster.resource_pool.clone().ok_or_else(|| {
                BackendError::terminal(
                    "ResourcePoolNotFound",
                    format!("cluster {cluster_name:?} has no resource pool"),
                )
            })?,
        };
        let folder = match &spec.folder {
            Some(f) => {
                self.resolve_path(f, &format!("/{dc_name}/vm"), "Folder")
                    .await?
            }
            None => dc.vm_folder.clone().ok_or_else(|| {
                BackendError::terminal(
                    "FolderNotFound",
                    format!("datacenter {dc_name:?} has no VM folder"),
                )
            })?,
        };
        let datastore = match &spec.datastore {
            Some(name) => Some(match cluster.datastores.get(name) {
                Some(ds) => ds.clone(),
                None => {
                    self.resolve_path(name, &format!("/{dc_name}/datastore"), "Datastore")
                        .await?
                }
            }),
            None => None,
        };
        let (snapshot, disk_move_type) = if spec.clone_mode == CloneMode::LinkedClone {
            let snap = self
                .client
                .properties(&template, &["snapshot.currentSnapshot"])
                .await
                .map_err(vim)?
                .and_then(|o| o.moref("snapshot.currentSnapshot"))
                .ok_or_else(|| {
                    BackendError::terminal(
                        "LinkedCloneNeedsSnapshot",
                        format!(
                            "template {:?} has no snapshot to link clones to",
                            spec.template
                        ),
                    )
                })?;
            (Some(snap), Some("createNewChildDiskBacking".to_string()))
        } else {
            (None, None)
        };
        let fd = inventory::failure_domain_name(&dc_name, &cluster_name);
        let clone = CloneSpec {
            location: RelocateSpec {
                datastore,
                disk_move_type,
                pool: Some(pool),
                ..Default::default()
            },
            template: false,
            config: Some(ConfigSpec {
                instance_uuid: Some(identity.uid.clone()),
                annotation: Some(format!(
                    "Managed by banlieue: {}/{} (uid {})",
                    identity.namespace, identity.name, identity.uid
                )),
                num_cpus: Some(spec.num_cpus),
                num_cores_per_socket: spec.num_cores_per_socket,
                memory_mib: Some(spec.memory_mib),
                extra_config: guestinfo::clone_keys(identity, &fd),
                device_change: Vec::new(),
                firmware: spec.firmware.map(|f| match f {
                    Firmware::Bios => "bios".to_string(),
                    _ => "efi".to_string(),
                }),
            }),
            power_on: false,
            snapshot,
        };
        let task = self
            .start(
                &identity.uid,
                OpKind::Clone,
                &methods::clone_vm_task(&template, &folder, &identity.name, &clone),
            )
            .await?;
        info!(uid = %identity.uid, template = %spec.template, failure_domain = %fd, "vsphere: cloning");
        Ok(MachineObservation {
            failure_domain: Some(fd),
            pending: Some(self.pending(OpKind::Clone, Some(&task))),
            ..Default::default()
        })
    }
}
