//! [`Backend::ensure`](banlieue_sdk::backend::Backend::ensure) for Proxmox: clone, configure, seed and power a VM.

use super::ops::Outcome;
use super::*;

impl ProxmoxBackend {
    pub(super) async fn ensure_machine(
        &self,
        request: &MachineRequest,
    ) -> Result<MachineObservation, BackendError> {
        let spec = spec_of(request)?;
        let identity = &request.identity;
        if identity.uid.is_empty() {
            return Err(BackendError::terminal(
                "InvalidRequest",
                "the machine identity has an empty uid",
            ));
        }
        let resources = self.resources().await?;
        let found = self.find(identity, &resources).await?;
        if let (None, Some(provider_id)) = (&found, &identity.provider_id) {
            return Err(BackendError::machine_missing(
                provider_id,
                self.client.endpoint(),
            ));
        }
        let Some(found) = found else {
            // Not there: a clone may be in flight (or just failed, or just finished).
            let cloning = matches!(self.tasks.get(&identity.uid), Some((OpKind::Clone, _)));
            match self.poll(&identity.uid).await {
                Ok(Some((kind, upid))) => {
                    return Ok(MachineObservation {
                        pending: Some(self.pending(&identity.uid, kind, Some(&upid))),
                        ..Default::default()
                    });
                }
                Ok(None) if cloning => {
                    // The clone finished after the listing above was taken (a clone to
                    // another node moves there as it ends, so the listing's node no
                    // longer has it): look again with a fresh listing, never clone twice.
                    debug!(uid = %identity.uid, "proxmox: clone finished since the listing; looking again");
                    return Ok(MachineObservation {
                        pending: Some(self.pending(&identity.uid, OpKind::Clone, None)),
                        ..Default::default()
                    });
                }
                Ok(None) => {}
                Err(e) => {
                    self.failed_clones.record(&identity.uid, &e);
                    return Err(e);
                }
            }
            // A failed clone is reported for a while before the next attempt.
            if let Some(error) = self
                .failed_clones
                .still_failing(&identity.uid, self.settings.pacing.failed_clone_backoff)
            {
                return Err(error);
            }
            return self.start_clone(request, spec, &resources).await;
        };
        let mut found = found;
        let known_config = found.config.take();
        let backend_ref = Some(format!("{}/{}", found.node, found.vmid));
        let observation = |pending: Option<Pending>| MachineObservation {
            failure_domain: Some(found.node.clone()),
            backend_ref: backend_ref.clone(),
            pending,
            ..Default::default()
        };
        if found.lock.as_deref() == Some("clone") {
            let task = self.tasks.get(&identity.uid).map(|(_, upid)| upid);
            return Ok(observation(Some(self.pending(
                &identity.uid,
                OpKind::Clone,
                task.as_ref(),
            ))));
        }
        if found.lock.is_none() && matches!(self.tasks.get(&identity.uid), Some((OpKind::Clone, _)))
        {
            // PVE holds the clone lock until the clone is done: listed unlocked, it is.
            self.tasks.forget(&identity.uid);
        }
        let finished = match self.poll_outcome(&identity.uid).await? {
            Outcome::Running(kind, upid) => {
                return Ok(observation(Some(self.pending(
                    &identity.uid,
                    kind,
                    Some(&upid),
                ))));
            }
            Outcome::Succeeded(kind) => Some(kind),
            Outcome::Idle | Outcome::Lost => None,
        };
        let path = vm_path(&found.node, found.vmid);
        // Adopting and configuring read the config; a configured VM's comes with its
        // pending changes below.
        let current = match known_config {
            Some(config) => config,
            None if found.adopted || !found.configured => self
                .client
                .get(&format!("{path}/config"), &Form::new())
                .await
                .map_err(pve)?,
            None => Value::Null,
        };
        if found.adopted {
            self.client
                .put(
                    &format!("{path}/config"),
                    &config::adoption(identity, &current),
                )
                .await
                .map_err(pve)?;
            info!(uid = %identity.uid, vmid = found.vmid, node = %found.node, "proxmox: adopted (retagged with the new UID)");
            return Ok(observation(Some(Pending {
                operation: "Adopting".into(),
                task: None,
                retry_after: Duration::from_millis(100),
            })));
        }
        if !found.configured {
            if let Some(lock) = &found.lock {
                return Err(BackendError::transient(
                    "VMLocked",
                    format!("VM {} is locked ({lock})", found.vmid),
                ));
            }
            // Checked before the clone too; again here for a spec edited since.
            self.check_new_disks(spec, &current).await?;
            let seed = match &request.bootstrap {
                Some(bootstrap) => {
                    match self
                        .ensure_seed(
                            request,
                            spec,
                            bootstrap,
                            &found,
                            &current,
                            finished == Some(OpKind::UploadSeed),
                        )
                        .await?
                    {
                        Ok(drive) => Some(drive),
                        Err(upid) => {
                            return Ok(observation(Some(self.pending(
                                &identity.uid,
                                OpKind::UploadSeed,
                                Some(&upid),
                            ))));
                        }
                    }
                }
                None => None,
            };
            let form = config::machine_config(
                spec,
                identity,
                request.bootstrap.as_ref(),
                seed.as_ref(),
                &current,
            );
            self.client
                .put(&format!("{path}/config"), &form)
                .await
                .map_err(pve)?;
            info!(uid = %identity.uid, vmid = found.vmid, node = %found.node, "proxmox: configured");
            if let Some(resize) = config::disk_resize(spec, &current) {
                let data = self
                    .client
                    .put(&format!("{path}/resize"), &resize)
                    .await
                    .map_err(pve)?;
                if data.is_string() {
                    let upid = self.remember(&identity.uid, OpKind::Resize, &data)?;
                    return Ok(observation(Some(self.pending(
                        &identity.uid,
                        OpKind::Resize,
                        Some(&upid),
                    ))));
                }
            }
            return Ok(observation(Some(Pending {
                operation: "Configuring".into(),
                task: None,
                retry_after: Duration::from_millis(100),
            })));
        }
        let power = match finished {
            // Our start or resume just finished: the VM runs, no need to ask.
            Some(OpKind::Start | OpKind::Resume) => PowerState::PoweredOn,
            _ => power_of(
                &self
                    .client
                    .get(&format!("{path}/status/current"), &Form::new())
                    .await
                    .map_err(pve)?,
            ),
        };
        // What it runs with and what its next start uses, from one read: spec changes
        // are the controller's to hand over (`apply_changes`), never applied here.
        let read = changes::read_pending(
            &self
                .client
                .get(&format!("{path}/pending"), &Form::new())
                .await
                .map_err(pve)?,
        );
        let provider_id = config::smbios_uuid(&read.current).map(|u| format!("proxmox://{u}"));
        let (resources, next_boot) = changes::read_back(&read, &disk_names(spec));
        let want = spec.power_state;
        let action = match (want, power) {
            (PowerState::PoweredOn, PowerState::PoweredOff) => {
                Some((OpKind::Start, "start", Form::new()))
            }
            (PowerState::PoweredOn, PowerState::Suspended) => {
                Some((OpKind::Resume, "resume", Form::new()))
            }
            (PowerState::PoweredOff, PowerState::PoweredOn | PowerState::Suspended) => Some((
                OpKind::Shutdown,
                "shutdown",
                Form::new()
                    .set("timeout", self.settings.shutdown_seconds())
                    .set("forceStop", 1),
            )),
            (PowerState::Suspended, PowerState::PoweredOn) => {
                Some((OpKind::Suspend, "suspend", Form::new()))
            }
            (PowerState::Suspended, PowerState::PoweredOff) => {
                Some((OpKind::Start, "start", Form::new()))
            }
            _ => None,
        };
        if let Some((kind, verb, form)) = action {
            if let Some(lock) = &found.lock {
                return Err(BackendError::transient(
                    "VMLocked",
                    format!("VM {} is locked ({lock})", found.vmid),
                ));
            }
            let data = self
                .client
                .post(&format!("{path}/status/{verb}"), &form)
                .await
                .map_err(pve)?;
            let upid = self.remember(&identity.uid, kind, &data)?;
            return Ok(MachineObservation {
                provider_id,
                power_state: Some(power),
                resources: Some(resources),
                next_boot,
                ..observation(Some(self.pending(&identity.uid, kind, Some(&upid))))
            });
        }
        let addresses = if power == PowerState::PoweredOn {
            self.addresses(&found, &config::vm_name(identity)).await
        } else {
            Vec::new()
        };
        if !read.waiting.is_empty() {
            debug!(uid = %identity.uid, keys = ?read.waiting, "proxmox: config changes wait for the next start");
        }
        Ok(MachineObservation {
            provider_id,
            power_state: Some(power),
            addresses,
            resources: Some(resources),
            next_boot,
            ..observation(None)
        })
    }
}
