//! The NoCloud seed ISO on a storage: choosing the storage, uploading, attaching and deleting it.

use super::*;

impl ProxmoxBackend {
    /// The storage seeds go to on `node`: `seedStorage`, else the first active
    /// storage with `iso` content there (as found in the last minute).
    pub(super) async fn seed_storage(&self, node: &str) -> Result<String, BackendError> {
        if let Some(storage) = &self.settings.seed_storage {
            return Ok(storage.clone());
        }
        if let Some(storage) = self.seed_storages.get(node) {
            return Ok(storage);
        }
        let data = self
            .client
            .get(
                &format!("/nodes/{}/storage", encode(node)),
                &Form::new().set("content", "iso").set("enabled", 1),
            )
            .await
            .map_err(pve)?;
        let mut names: Vec<&str> = data
            .as_array()
            .into_iter()
            .flatten()
            .filter(|s| s.get("active").and_then(Value::as_i64).unwrap_or(1) == 1)
            .filter_map(|s| s.get("storage").and_then(Value::as_str))
            .collect();
        names.sort_unstable();
        let chosen = names.first().map(|s| s.to_string());
        if let Some(storage) = &chosen {
            self.seed_storages.put(node, storage);
        }
        chosen.ok_or_else(|| {
            BackendError::terminal(
                "NoSeedStorage",
                format!(
                    "no active storage with 'iso' content on node {node} for the NoCloud seed; \
                     enable 'iso' content on one or set the seedStorage setting"
                ),
            )
        })
    }

    /// True when the ISO volume `volid` is on `storage` (seen from `node`).
    pub(super) async fn iso_exists(
        &self,
        node: &str,
        storage: &str,
        volid: &str,
    ) -> Result<bool, BackendError> {
        let data = self
            .client
            .get(
                &format!(
                    "/nodes/{}/storage/{}/content",
                    encode(node),
                    encode(storage)
                ),
                &Form::new().set("content", "iso"),
            )
            .await
            .map_err(pve)?;
        Ok(data
            .as_array()
            .into_iter()
            .flatten()
            .any(|v| v.get("volid").and_then(Value::as_str) == Some(volid)))
    }

    /// The seed drive for an unconfigured VM, once the seed is on the storage;
    /// `Err(Pending)` while it is being uploaded.
    pub(super) async fn ensure_seed(
        &self,
        request: &MachineRequest,
        spec: &ProxmoxMachineSpec,
        bootstrap: &banlieue_sdk::backend::BootstrapData,
        found: &Found,
        current: &Value,
        uploaded: bool,
    ) -> Result<Result<config::SeedDrive, Upid>, BackendError> {
        let uid = &request.identity.uid;
        let macs = config::macs(spec, uid, current);
        // Built first: an unsupported format fails before anything is uploaded.
        let files = seed::files(
            &request.identity,
            request.instance_id(),
            spec,
            bootstrap,
            &macs,
        )?;
        let storage = match seed::attached(current, uid) {
            Some((storage, _)) => storage,
            None => self.seed_storage(&found.node).await?,
        };
        let volid = seed::volid(&storage, uid);
        let key = seed::slot(current, uid).ok_or_else(|| {
            BackendError::terminal(
                "NoFreeDriveSlot",
                format!(
                    "VM {} has no free IDE or SATA slot for the NoCloud seed",
                    found.vmid
                ),
            )
        })?;
        // An upload of ours that just finished put it there.
        if uploaded || self.iso_exists(&found.node, &storage, &volid).await? {
            return Ok(Ok(config::SeedDrive { key, volid }));
        }
        let image = seed::image(&files)?;
        let data = self
            .client
            .upload(
                &format!(
                    "/nodes/{}/storage/{}/upload",
                    encode(&found.node),
                    encode(&storage)
                ),
                &Form::new().set("content", "iso"),
                "filename",
                &seed::file_name(uid),
                &image,
            )
            .await
            .map_err(pve)
            // The storage may have gone: choose again next time.
            .inspect_err(|_| self.seed_storages.forget(&found.node))?;
        info!(uid = %uid, vmid = found.vmid, storage = %storage, bytes = image.len(), "proxmox: uploading the NoCloud seed");
        if data.is_string() {
            return Ok(Err(self.remember(uid, OpKind::UploadSeed, &data)?));
        }
        Ok(Ok(config::SeedDrive { key, volid }))
    }

    /// Deletes the machine's seed volume if it is still on its storage: `Some` while
    /// that is in progress.
    pub(super) async fn delete_seed(
        &self,
        identity: &MachineIdentity,
        found: &Found,
    ) -> Result<Option<Deletion>, BackendError> {
        let path = vm_path(&found.node, found.vmid);
        let current = match self
            .client
            .get(&format!("{path}/config"), &Form::new())
            .await
        {
            Ok(c) => c,
            Err(e) if e.is_missing_vm() => return Ok(None),
            Err(e) => return Err(pve(e)),
        };
        let attached =
            seed::attached(&current, &identity.uid).or_else(|| seed::attached_any(&current));
        let (storage, volid) = match attached {
            Some(found) => found,
            // Not attached: an upload that was not followed by the config write.
            None => match self.seed_storage(&found.node).await {
                Ok(s) => {
                    let volid = seed::volid(&s, &identity.uid);
                    (s, volid)
                }
                Err(_) => return Ok(None),
            },
        };
        if !self.iso_exists(&found.node, &storage, &volid).await? {
            return Ok(None);
        }
        let data = self
            .client
            .delete(
                &format!(
                    "/nodes/{}/storage/{}/content/{}",
                    encode(&found.node),
                    encode(&storage),
                    encode(&volid)
                ),
                &Form::new(),
            )
            .await
            .map_err(pve)?;
        info!(uid = %identity.uid, volid = %volid, "proxmox: deleting the NoCloud seed");
        if data.is_string() {
            self.remember(&identity.uid, OpKind::DeleteSeed, &data)?;
        }
        Ok(Some(Deletion::InProgress {
            retry_after: self.next_poll(&identity.uid),
        }))
    }
}
