//! [`Backend::delete`](banlieue_sdk::backend::Backend::delete) for Proxmox: stop, destroy and clean up a VM.

use super::ops::Outcome;
use super::*;

impl ProxmoxBackend {
    pub(super) async fn delete_machine(
        &self,
        identity: &MachineIdentity,
    ) -> Result<Deletion, BackendError> {
        // Our destroy in flight says best whether the VM is gone: no listing, and no
        // search by SMBIOS UUID through every VM's config for one that is not there.
        if matches!(self.tasks.get(&identity.uid), Some((OpKind::Destroy, _))) {
            match self.poll_outcome(&identity.uid).await? {
                Outcome::Succeeded(_) => return Ok(Deletion::Gone),
                Outcome::Running(..) => {
                    return Ok(Deletion::InProgress {
                        retry_after: self.next_poll(&identity.uid),
                    });
                }
                Outcome::Idle | Outcome::Lost => {}
            }
        }
        let resources = self.resources().await?;
        let found = self.find(identity, &resources).await?;
        let (mut stopped, mut seed_deleted) = (false, false);
        let running = match self.poll_outcome(&identity.uid).await {
            Ok(Outcome::Running(kind, upid)) => Some((kind, upid)),
            Ok(outcome) => {
                stopped = matches!(outcome, Outcome::Succeeded(OpKind::Stop));
                seed_deleted = matches!(outcome, Outcome::Succeeded(OpKind::DeleteSeed));
                None
            }
            // A failed clone or power task does not block deletion.
            Err(e) if found.is_none() || !e.is_transient() => None,
            Err(e) => return Err(e),
        };
        let Some(found) = found else {
            return Ok(match running {
                Some(_) => Deletion::InProgress {
                    retry_after: self.next_poll(&identity.uid),
                },
                None => Deletion::Gone,
            });
        };
        if running.is_some() || found.lock.as_deref() == Some("clone") {
            return Ok(Deletion::InProgress {
                retry_after: self.next_poll(&identity.uid),
            });
        }
        if let Some(lock) = &found.lock {
            return Err(BackendError::transient(
                "VMLocked",
                format!("VM {} is locked ({lock})", found.vmid),
            ));
        }
        let path = vm_path(&found.node, found.vmid);
        // Our stop just finished: the VM is stopped, no need to ask.
        let powered = !stopped && {
            match self
                .client
                .get(&format!("{path}/status/current"), &Form::new())
                .await
            {
                Ok(s) => s.get("status").and_then(Value::as_str) == Some("running"),
                Err(e) if e.is_missing_vm() => return Ok(Deletion::Gone),
                Err(e) => return Err(pve(e)),
            }
        };
        let (kind, data) = if powered {
            let data = self
                .client
                .post(&format!("{path}/status/stop"), &Form::new())
                .await
                .map_err(pve)?;
            (OpKind::Stop, data)
        } else {
            // ISO volumes are not the VM's own disks: PVE's purge leaves them.
            // (Unless our deletion of it just finished.)
            if !seed_deleted && let Some(progress) = self.delete_seed(identity, &found).await? {
                return Ok(progress);
            }
            let query = Form::new()
                .set("purge", 1)
                .set("destroy-unreferenced-disks", 1);
            match self.client.delete(&path, &query).await {
                Ok(data) => (OpKind::Destroy, data),
                Err(e) if e.is_missing_vm() => return Ok(Deletion::Gone),
                Err(e) => return Err(pve(e)),
            }
        };
        self.remember(&identity.uid, kind, &data)?;
        info!(uid = %identity.uid, vmid = found.vmid, operation = kind.operation(), "proxmox: deleting");
        Ok(Deletion::InProgress {
            retry_after: self.next_poll(&identity.uid),
        })
    }
}
