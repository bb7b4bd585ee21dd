//! Finding VMs: the cluster's resources, and the VM carrying a machine's UID.

use super::*;

impl ProxmoxBackend {
    /// The cluster's VMs, listed after this call began: one `GET /cluster/resources`
    /// for all the reconciles of a round ([`SharedRead`]).
    pub(super) async fn resources(&self) -> Result<Arc<Vec<Value>>, BackendError> {
        self.listing
            .read(|| async {
                let data = self
                    .client
                    .get("/cluster/resources", &Form::new().set("type", "vm"))
                    .await
                    .map_err(pve)?;
                Ok(data
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|r| r.get("type").and_then(Value::as_str) == Some("qemu"))
                    .collect())
            })
            .await
    }

    /// The VM carrying the UID: by its tag, else (not yet configured) by name and
    /// the UID line of its description, else (a moved or restored object, whose UID is
    /// new) by the SMBIOS UUID `spec.providerID` names.
    pub(super) async fn find(
        &self,
        identity: &MachineIdentity,
        resources: &[Value],
    ) -> Result<Option<Found>, BackendError> {
        let uid = &identity.uid;
        let parse = |r: &Value, configured| {
            Some(Found {
                node: r.get("node")?.as_str()?.to_string(),
                vmid: as_u32(r.get("vmid")?)?,
                lock: r.get("lock").and_then(Value::as_str).map(str::to_string),
                configured,
                adopted: false,
                config: None,
            })
        };
        let not_template = |r: &&Value| r.get("template").and_then(Value::as_i64).unwrap_or(0) != 1;
        if let Some(found) = resources
            .iter()
            .filter(not_template)
            .find(|r| config::has_uid_tag(r.get("tags").and_then(Value::as_str), uid))
            .and_then(|r| parse(r, true))
        {
            return Ok(Some(found));
        }
        let name = config::vm_name(identity);
        let marker = config::uid_marker(uid);
        for r in resources.iter().filter(not_template) {
            if r.get("name").and_then(Value::as_str) != Some(name.as_str()) {
                continue;
            }
            let Some(mut found) = parse(r, false) else {
                continue;
            };
            match self
                .client
                .get(
                    &format!("{}/config", vm_path(&found.node, found.vmid)),
                    &Form::new(),
                )
                .await
            {
                Ok(cfg)
                    if cfg
                        .get("description")
                        .and_then(Value::as_str)
                        .is_some_and(|d| d.contains(&marker)) =>
                {
                    found.config = Some(cfg);
                    return Ok(Some(found));
                }
                Ok(_) => {}
                Err(e) if e.is_missing_vm() => {}
                Err(e) => return Err(pve(e)),
            }
        }
        match identity.provider_id_for("proxmox")? {
            Some(uuid) => self.find_by_smbios_uuid(&uuid, &name, resources).await,
            None => Ok(None),
        }
    }

    /// The VMs named [`config::vm_name`] whose description records that banlieue made
    /// them for `identity`'s namespace and name ([`config::made_for_marker`]), with the
    /// UID it records. A VM locked for a destroy, or whose config is already gone, is
    /// being deleted.
    pub(super) async fn made_for_machine(
        &self,
        identity: &MachineIdentity,
        resources: &[Value],
    ) -> Result<Vec<MadeFor>, BackendError> {
        let name = config::vm_name(identity);
        let marker = config::made_for_marker(identity);
        let mut found = Vec::new();
        for r in resources
            .iter()
            .filter(|r| r.get("template").and_then(Value::as_i64).unwrap_or(0) != 1)
            .filter(|r| r.get("name").and_then(Value::as_str) == Some(name.as_str()))
        {
            let (Some(node), Some(vmid)) = (
                r.get("node").and_then(Value::as_str),
                r.get("vmid").and_then(as_u32),
            ) else {
                continue;
            };
            let cfg = match self
                .client
                .get(&format!("{}/config", vm_path(node, vmid)), &Form::new())
                .await
            {
                Ok(cfg) => cfg,
                Err(e) if e.is_missing_vm() => continue,
                Err(e) => return Err(pve(e)),
            };
            let description = cfg.get("description").and_then(Value::as_str);
            if !description.is_some_and(|d| d.contains(&marker)) {
                continue;
            }
            let Some(uuid) = config::smbios_uuid(&cfg) else {
                continue;
            };
            let lock = r
                .get("lock")
                .and_then(Value::as_str)
                .or_else(|| cfg.get("lock").and_then(Value::as_str));
            found.push(MadeFor {
                provider_id: format!("proxmox://{uuid}"),
                uid: description.and_then(config::recorded_uid),
                backend_ref: format!("{node}/{vmid}"),
                deleting: lock == Some("destroyed"),
            });
        }
        Ok(found)
    }

    /// The VM whose SMBIOS UUID is `uuid`. `/cluster/resources` does not show it, so
    /// configs are read: VMs named `name` first (a move keeps the object's name).
    pub(super) async fn find_by_smbios_uuid(
        &self,
        uuid: &str,
        name: &str,
        resources: &[Value],
    ) -> Result<Option<Found>, BackendError> {
        let mut candidates: Vec<&Value> = resources
            .iter()
            .filter(|r| r.get("template").and_then(Value::as_i64).unwrap_or(0) != 1)
            .collect();
        candidates.sort_by_key(|r| r.get("name").and_then(Value::as_str) != Some(name));
        for r in candidates {
            let (Some(node), Some(vmid)) = (
                r.get("node").and_then(Value::as_str),
                r.get("vmid").and_then(as_u32),
            ) else {
                continue;
            };
            match self
                .client
                .get(&format!("{}/config", vm_path(node, vmid)), &Form::new())
                .await
            {
                Ok(cfg) if config::smbios_uuid(&cfg).as_deref() == Some(uuid) => {
                    return Ok(Some(Found {
                        node: node.to_string(),
                        vmid,
                        lock: r.get("lock").and_then(Value::as_str).map(str::to_string),
                        configured: true,
                        adopted: true,
                        config: Some(cfg),
                    }));
                }
                Ok(_) => {}
                Err(e) if e.is_missing_vm() => {}
                Err(e) => return Err(pve(e)),
            }
        }
        Ok(None)
    }
}
