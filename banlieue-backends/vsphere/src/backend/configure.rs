//! The configuring reconfigure's device edits: port groups (standard or
//! distributed), disk grow, additional disks.

use banlieue_sdk::api::infra::vsphere::VSphereMachineSpec;
use banlieue_sdk::backend::BackendError;

use super::vm::Vm;
use super::{VSphereBackend, vim};
use crate::client::methods;
use crate::devices::{self, NetworkBacking, WantedNic};
use crate::{guestinfo, inventory};

impl VSphereBackend {
    /// Device edits for the configuring reconfigure: network devices onto the
    /// machine's port groups, the first disk grown to `diskGiB`.
    pub(super) async fn device_changes(
        &self,
        vm: &Vm,
        spec: &VSphereMachineSpec,
    ) -> Result<Vec<methods::DeviceChange>, BackendError> {
        if spec.network.is_empty() && spec.disk_gib.is_none() && spec.additional_disks.is_empty() {
            return Ok(Vec::new());
        }
        let devices = self
            .client
            .properties(&vm.moref, &["config.hardware.device"])
            .await
            .map_err(vim)?
            .and_then(|o| o.prop("config.hardware.device").map(devices::devices))
            .unwrap_or_default();
        let mut changes = Vec::new();
        if !spec.network.is_empty() {
            let mut wanted = Vec::new();
            for nic in &spec.network {
                wanted.push(WantedNic {
                    backing: self.network_backing(vm, &nic.network_name).await?,
                    mac_address: nic.mac_address.clone(),
                });
            }
            changes.extend(devices::nic_edits(&devices, &wanted)?);
        }
        if let Some(gib) = spec.disk_gib {
            changes.extend(devices::disk_grow(&devices, gib));
        }
        changes.extend(devices::disk_adds(&devices, &spec.additional_disks)?);
        Ok(changes)
    }

    /// A port group by name (among the networks of the VM's cluster, else any
    /// cluster's) or inventory path, as a NIC backing.
    pub(super) async fn network_backing(
        &self,
        vm: &Vm,
        name: &str,
    ) -> Result<NetworkBacking, BackendError> {
        let network = if name.starts_with('/') {
            self.client.find_by_path(name).await.map_err(vim)?
        } else {
            let topology = self.topology(false).await?;
            let home = vm
                .extra
                .get(guestinfo::FAILURE_DOMAIN_KEY)
                .and_then(|fd| inventory::parse_failure_domain(fd))
                .and_then(|(dc, c)| topology.cluster(dc, c));
            home.and_then(|c| c.networks.get(name))
                .or_else(|| topology.clusters.iter().find_map(|c| c.networks.get(name)))
                .cloned()
        };
        let network = network.ok_or_else(|| {
            BackendError::terminal("NetworkNotFound", format!("no port group {name:?}"))
        })?;
        if network.kind != "DistributedVirtualPortgroup" {
            return Ok(NetworkBacking::Standard {
                name: name.rsplit('/').next().unwrap_or(name).to_string(),
                network,
            });
        }
        let pg = self
            .client
            .properties(&network, &["key", "config.distributedVirtualSwitch"])
            .await
            .map_err(vim)?;
        let key = pg.as_ref().and_then(|o| o.text("key")).map(str::to_string);
        let dvs = pg
            .as_ref()
            .and_then(|o| o.moref("config.distributedVirtualSwitch"));
        let uuid = match &dvs {
            Some(dvs) => self
                .client
                .properties(dvs, &["uuid"])
                .await
                .map_err(vim)?
                .and_then(|o| o.text("uuid").map(str::to_string)),
            None => None,
        };
        match (key, uuid) {
            (Some(portgroup_key), Some(switch_uuid)) => Ok(NetworkBacking::Distributed {
                switch_uuid,
                portgroup_key,
            }),
            _ => Err(BackendError::transient(
                "NetworkNotFound",
                format!("distributed port group {name:?} has no key or switch"),
            )),
        }
    }
}
