//! [`Backend::observe`](banlieue_sdk::backend::Backend::observe) for Proxmox.

use super::*;

impl ProxmoxBackend {
    pub(super) async fn observe_machine(
        &self,
        identity: &MachineIdentity,
    ) -> Result<Option<MachineObservation>, BackendError> {
        let resources = self.resources().await?;
        let Some(found) = self.find(identity, &resources).await? else {
            return Ok(None);
        };
        let path = vm_path(&found.node, found.vmid);
        let current = self
            .client
            .get(&format!("{path}/config"), &Form::new())
            .await
            .map_err(pve)?;
        let status = self
            .client
            .get(&format!("{path}/status/current"), &Form::new())
            .await
            .map_err(pve)?;
        let power = power_of(&status);
        let addresses = if power == PowerState::PoweredOn {
            self.addresses(&found, &config::vm_name(identity)).await
        } else {
            Vec::new()
        };
        let pending = self
            .tasks
            .get(&identity.uid)
            .map(|(kind, upid)| self.pending(&identity.uid, kind, Some(&upid)));
        Ok(Some(MachineObservation {
            // Without the spec the additional disks (`scsi1`, ...) cannot be named, and
            // a resource list with other names would read as disks added and removed;
            // `observe` only locates a VM (`ensure` and `apply_changes` read resources).
            next_boot: None,
            resources: None,
            provider_id: config::smbios_uuid(&current).map(|u| format!("proxmox://{u}")),
            power_state: Some(power),
            addresses,
            failure_domain: Some(found.node.clone()),
            backend_ref: Some(format!("{}/{}", found.node, found.vmid)),
            pending,
        }))
    }
}
