//! Starting the clone of a template (picking a VMID).

use super::*;

impl ProxmoxBackend {
    pub(super) async fn start_clone(
        &self,
        request: &MachineRequest,
        spec: &ProxmoxMachineSpec,
        resources: &[Value],
    ) -> Result<MachineObservation, BackendError> {
        let template = resources
            .iter()
            .find(|r| r.get("vmid").and_then(as_u32) == Some(spec.template_id));
        let source_node = match (&spec.source_node, template) {
            (Some(node), _) => node.clone(),
            (None, Some(t)) => t
                .get("node")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            (None, None) => {
                return Err(BackendError::terminal(
                    "TemplateNotFound",
                    format!(
                        "no VM {} (the template) on {}",
                        spec.template_id,
                        self.client.endpoint()
                    ),
                ));
            }
        };
        if !spec.additional_disks.is_empty() {
            // The clone gets the template's drives (and, unless the spec names a
            // storage, its boot disk's storage, where disks naming none go): with the
            // template's config the check sees the disks the configuration will add.
            let template = self
                .client
                .get(
                    &format!("{}/config", vm_path(&source_node, spec.template_id)),
                    &Form::new(),
                )
                .await
                .map_err(pve)?;
            self.check_new_disks(spec, &template).await?;
        }
        let target = spec
            .target_node
            .clone()
            .or_else(|| request.failure_domain.clone())
            .filter(|t| *t != source_node);
        let identity = &request.identity;
        let base = Form::new()
            .set("name", config::vm_name(identity))
            .set("description", config::description(identity))
            .set("full", if spec.full_clone { 1 } else { 0 })
            .set_opt("target", target.as_deref())
            .set_opt(
                "storage",
                spec.storage.as_deref().filter(|_| spec.full_clone),
            )
            .set_opt("pool", spec.pool.as_deref());
        let path = format!("{}/clone", vm_path(&source_node, spec.template_id));
        let used: BTreeSet<u32> = resources
            .iter()
            .filter_map(|r| r.get("vmid").and_then(as_u32))
            .collect();

        // One allocation at a time per Provider; other writers are handled by retrying.
        let _guard = self.allocation.lock().await;
        let mut picker = VmidPicker::new(spec.vm_id_range.as_ref(), used);
        for _ in 0..MAX_ATTEMPTS {
            let suggested = if picker.has_range() {
                None
            } else {
                let next = self
                    .client
                    .get("/cluster/nextid", &Form::new())
                    .await
                    .map_err(pve)?;
                as_u32(&next)
            };
            let Some(vmid) = picker.next(suggested) else {
                return Err(BackendError::terminal(
                    "VMIDRangeExhausted",
                    match &spec.vm_id_range {
                        Some(r) => {
                            format!("every VMID of vmIDRange {}-{} is in use", r.start, r.end)
                        }
                        None => "every VMID is in use".to_owned(),
                    },
                ));
            };
            let form = base.clone().set("newid", vmid);
            match self.client.post(&path, &form).await {
                Ok(data) => {
                    let upid = self.remember(&identity.uid, OpKind::Clone, &data)?;
                    info!(uid = %identity.uid, vmid, node = %source_node, target = ?target, "proxmox: cloning");
                    return Ok(MachineObservation {
                        failure_domain: Some(target.unwrap_or(source_node)),
                        backend_ref: None,
                        pending: Some(self.pending(&identity.uid, OpKind::Clone, Some(&upid))),
                        ..Default::default()
                    });
                }
                Err(e) if e.is_vmid_taken() => {
                    debug!(
                        vmid,
                        "proxmox: VMID taken by a concurrent clone; trying the next"
                    );
                }
                Err(e) => return Err(pve(e)),
            }
        }
        Err(BackendError::transient(
            "VMIDConflict",
            format!("{MAX_ATTEMPTS} VMIDs in a row were taken by concurrent clones"),
        ))
    }
}
