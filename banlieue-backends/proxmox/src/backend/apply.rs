//! [`Backend::apply_changes`](banlieue_sdk::backend::Backend::apply_changes) for
//! Proxmox: the config writes of [`crate::changes`], then the VM read back.

use banlieue_sdk::api::resources::MachineField;

use super::ops::Outcome;
use super::*;

/// How long a disk grow's task is waited for before the call returns it in flight
/// (the next `ensure` polls it): PVE grows a disk in about a second, and a grow that
/// returned in flight would show the machine `Ready=False ResizingDisk` meanwhile.
const RESIZE_WAIT: Duration = Duration::from_secs(10);

/// The first wait before looking at a resize task.
const RESIZE_FIRST_POLL: Duration = Duration::from_millis(50);

/// `error`, its message saying which fields were being changed.
fn naming(fields: &[MachineField], error: BackendError) -> BackendError {
    let names: Vec<&str> = fields.iter().map(|f| f.as_str()).collect();
    BackendError {
        message: format!("changing {}: {}", names.join(", "), error.message),
        ..error
    }
}

impl ProxmoxBackend {
    pub(super) async fn apply_machine_changes(
        &self,
        request: &MachineRequest,
        fields: &[MachineField],
    ) -> Result<MachineObservation, BackendError> {
        let spec = spec_of(request)?;
        if let Some(error) = changes::unsupported(fields) {
            return Err(error);
        }
        let identity = &request.identity;
        let listing = self.resources().await?;
        let Some(found) = self.find(identity, &listing).await? else {
            return Err(match &identity.provider_id {
                Some(id) => BackendError::machine_missing(id, self.client.endpoint()),
                None => BackendError::transient(
                    "VMNotFound",
                    format!(
                        "no VM carries UID {} on {}: nothing changed",
                        identity.uid,
                        self.client.endpoint()
                    ),
                ),
            });
        };
        if !found.configured || found.adopted {
            // `ensure` configures (or retags) it first; changes come after.
            return Err(BackendError::transient(
                "NotConfigured",
                format!("VM {} is not configured yet: nothing changed", found.vmid),
            ));
        }
        if let Some(lock) = &found.lock {
            return Err(BackendError::transient(
                "VMLocked",
                format!("VM {} is locked ({lock}): nothing changed", found.vmid),
            ));
        }
        let path = vm_path(&found.node, found.vmid);
        let power = power_of(
            &self
                .client
                .get(&format!("{path}/status/current"), &Form::new())
                .await
                .map_err(pve)?,
        );
        let pending = || async {
            self.client
                .get(&format!("{path}/pending"), &Form::new())
                .await
                .map(|data| changes::read_pending(&data))
                .map_err(pve)
        };
        let mut read = pending().await?;
        if fields.contains(&MachineField::DataDisks) {
            // A disk PVE would allocate, refused before the write that allocates it.
            self.check_new_disks(spec, &read.effective)
                .await
                .map_err(|e| naming(fields, e))?;
        }
        let form = changes::config_form(spec, &read, fields, power != PowerState::PoweredOff);
        let grows = changes::grow_forms(spec, &read.current, fields);
        if !form.is_empty() {
            self.client
                .put(&format!("{path}/config"), &form)
                .await
                .map_err(|e| naming(fields, pve(e)))?;
            info!(uid = %identity.uid, vmid = found.vmid, config = ?form, ?power, "proxmox: config changes written");
        }
        let observation = MachineObservation {
            failure_domain: Some(found.node.clone()),
            backend_ref: Some(format!("{}/{}", found.node, found.vmid)),
            power_state: Some(power),
            ..Default::default()
        };
        for grow in &grows {
            let data = self
                .client
                .put(&format!("{path}/resize"), grow)
                .await
                .map_err(|e| naming(fields, pve(e)))?;
            info!(uid = %identity.uid, vmid = found.vmid, disk = ?grow.get("disk"), size = ?grow.get("size"), "proxmox: growing a disk");
            if data.is_string() {
                let upid = self.remember(&identity.uid, OpKind::Resize, &data)?;
                if !self
                    .resized(&identity.uid)
                    .await
                    .map_err(|e| naming(fields, e))?
                {
                    return Ok(MachineObservation {
                        pending: Some(self.pending(&identity.uid, OpKind::Resize, Some(&upid))),
                        ..observation
                    });
                }
            }
        }
        if !form.is_empty() || !grows.is_empty() {
            read = pending().await?;
        }
        let (resources, next_boot) = changes::read_back(&read, &disk_names(spec));
        let addresses = if power == PowerState::PoweredOn {
            self.addresses(&found, &config::vm_name(identity)).await
        } else {
            Vec::new()
        };
        Ok(MachineObservation {
            provider_id: config::smbios_uuid(&read.current).map(|u| format!("proxmox://{u}")),
            addresses,
            resources: Some(resources),
            next_boot,
            ..observation
        })
    }

    /// Waits up to [`RESIZE_WAIT`] for `uid`'s resize task: `true` once it is done,
    /// `false` while it still runs; a failed one is its error.
    async fn resized(&self, uid: &str) -> Result<bool, BackendError> {
        let started = tokio::time::Instant::now();
        let mut step = RESIZE_FIRST_POLL;
        loop {
            tokio::time::sleep(step).await;
            match self.poll_outcome(uid).await? {
                Outcome::Running(..) if started.elapsed() < RESIZE_WAIT => {}
                Outcome::Running(..) => return Ok(false),
                // Done, or PVE lost the task: the read-back says what the disk is.
                Outcome::Succeeded(_) | Outcome::Idle | Outcome::Lost => return Ok(true),
            }
            step = (step * 2).min(self.settings.pacing.task_poll_interval);
        }
    }
}
