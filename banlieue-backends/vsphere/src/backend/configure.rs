//! The configuring reconfigure: device edits (port groups, standard or distributed;
//! disk grow; additional disks, unless the machine was created on imported ones) and
//! guestinfo (bootstrap data, metadata, network).

use banlieue_sdk::api::infra::vsphere::VSphereMachineSpec;
use banlieue_sdk::backend::{BackendError, MachineRequest};

use super::vm::Vm;
use super::{VSphereBackend, vim};
use crate::client::methods::ConfigSpec;
use crate::devices::{self, NetworkBacking, WantedNic};
use crate::netconfig::{self, GuestNic};
use crate::{guestinfo, inventory};

impl VSphereBackend {
    /// The configuring reconfigure: device edits (network devices onto the machine's
    /// port groups, the first disk grown to `diskGiB`, additional disks), the hot-add
    /// flags the clone did not take ([`super::clone::hot_add_fix`]) and the
    /// guestinfo keys (bootstrap data, metadata with the network config: the bootstrap
    /// data's, else one made from static IPAM and the devices' MACs).
    pub(super) async fn configure_spec(
        &self,
        vm: &Vm,
        spec: &VSphereMachineSpec,
        request: &MachineRequest,
    ) -> Result<ConfigSpec, BackendError> {
        let mut changes = Vec::new();
        let mut macs: Vec<Option<String>> = Vec::new();
        let mut extra_config = Vec::new();
        // Imported disks were all attached when the machine was created.
        let add_disks = !request.disks_imported && !spec.additional_disks.is_empty();
        if !(spec.network.is_empty() && spec.disk_gib.is_none() && !add_disks) {
            let devices = self
                .client
                .properties(&vm.moref, &["config.hardware.device"])
                .await
                .map_err(vim)?
                .and_then(|o| o.prop("config.hardware.device").map(devices::devices))
                .unwrap_or_default();
            if !spec.network.is_empty() {
                let mut wanted = Vec::new();
                for nic in &spec.network {
                    wanted.push(WantedNic {
                        backing: self
                            .network_backing(
                                vm.extra
                                    .get(guestinfo::FAILURE_DOMAIN_KEY)
                                    .map(String::as_str),
                                &nic.network_name,
                            )
                            .await?,
                        mac_address: nic.mac_address.clone(),
                    });
                }
                let edits = devices::nic_edits(&devices, &wanted)?;
                macs = edits
                    .iter()
                    .map(|e| e.device.text_at(&["macAddress"]).map(str::to_string))
                    .collect();
                changes.extend(edits);
            }
            if let Some(gib) = spec.disk_gib {
                changes.extend(devices::disk_grow(&devices, gib));
            }
            if add_disks {
                let adds = devices::disk_adds(&devices, &spec.additional_disks)?;
                let names = devices::added_disk_locations(&adds, &spec.additional_disks);
                extra_config.push((
                    guestinfo::DISK_NAMES_KEY.to_string(),
                    guestinfo::disk_names_value(&names),
                ));
                changes.extend(adds);
            }
        }
        // Checked before the clone too; again here, for a spec or bootstrap data
        // changed since.
        netconfig::check_mtu(&spec.network, request.bootstrap.as_ref())?;
        let nics: Vec<GuestNic<'_>> = spec
            .network
            .iter()
            .zip(
                macs.iter()
                    .map(Option::as_deref)
                    .chain(std::iter::repeat(None)),
            )
            .map(|(n, mac)| GuestNic {
                mac,
                mtu: n.mtu,
                ipam: &n.ipam,
            })
            .collect();
        let network = netconfig::network_config(&nics)?;
        extra_config.extend(guestinfo::bootstrap_keys(
            request.instance_id(),
            &vm.name,
            request.bootstrap.as_ref(),
            network.as_deref(),
        ));
        let mut config = ConfigSpec {
            device_change: changes,
            extra_config,
            ..Default::default()
        };
        super::clone::hot_add_fix(vm, spec, &mut config);
        Ok(config)
    }

    /// A port group by name (among the networks of the cluster of failure domain
    /// `home`, else any cluster's) or inventory path, as a NIC backing.
    pub(super) async fn network_backing(
        &self,
        home: Option<&str>,
        name: &str,
    ) -> Result<NetworkBacking, BackendError> {
        let network = if name.starts_with('/') {
            self.client.find_by_path(name).await.map_err(vim)?
        } else {
            let topology = self.topology(false).await?;
            let home = home
                .and_then(inventory::parse_failure_domain)
                .and_then(|(dc, c)| topology.cluster(dc, c));
            home.and_then(|c| c.networks.get(name))
                .or_else(|| topology.clusters.iter().find_map(|c| c.networks.get(name)))
                .cloned()
        };
        let network = network.ok_or_else(|| {
            BackendError::terminal("NetworkNotFound", format!("no port group {name}"))
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
                format!("distributed port group {name} has no key or switch"),
            )),
        }
    }
}
