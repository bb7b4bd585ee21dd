//! Finding a machine's VM and its task in flight with as few calls as vCenter allows.
//!
//! Each reconcile used to search the inventory (`FindByUuid`) before reading the VM,
//! then read its task apart: three calls where one does. The reference a VM was last
//! seen at (or the one its clone task returned) is kept as a hint: it is read with the
//! task in one `RetrievePropertiesEx`, and believed only when the VM read back still
//! carries the machine's identity. A stale hint costs that one call and is dropped; the
//! search by UUID is always what decides, so a hint can never make a second VM.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use banlieue_kit::recent::Recent;

use banlieue_kit::tasks::TaskKind;
use banlieue_sdk::backend::{BackendError, MachineIdentity, MadeFor};
use tracing::info;

use super::vm::{VM_PATHS, Vm};
use super::{OpKind, VSphereBackend, lock, vim};
use crate::client::methods::{self, TASK_PATHS};
use crate::client::{MoRef, PropertySpec, TaskState};
use crate::guestinfo;

/// How long a template's reference is reused for clones (a template deleted meanwhile
/// fails the clone with `ManagedObjectNotFound`, which drops it).
const TEMPLATE_TTL: Duration = Duration::from_secs(60);

/// What a poll of a machine's task found: the task still running, nothing in flight, or
/// the task's failure, classified.
pub(super) type Polled = Result<Option<(OpKind, MoRef)>, BackendError>;

/// Where each machine's VM was last seen, and which template references were resolved
/// lately: hints, verified on use.
#[derive(Debug)]
pub(super) struct Sightings {
    vms: Mutex<HashMap<String, MoRef>>,
    pub(super) templates: Recent<MoRef>,
}

impl Default for Sightings {
    fn default() -> Self {
        Self {
            vms: Mutex::default(),
            templates: Recent::new(TEMPLATE_TTL),
        }
    }
}

impl Sightings {
    fn vm(&self, uid: &str) -> Option<MoRef> {
        lock(&self.vms).get(uid).cloned()
    }

    pub(super) fn see(&self, uid: &str, vm: &MoRef) {
        lock(&self.vms).insert(uid.to_string(), vm.clone());
    }

    pub(super) fn forget(&self, uid: &str) {
        lock(&self.vms).remove(uid);
    }
}

/// What a VM's [`find_made_for`](VSphereBackend::made_for_machine) reads.
const MADE_FOR_PATHS: &[&str] = &[
    "name",
    "config.uuid",
    "config.instanceUuid",
    "config.annotation",
    "config.extraConfig",
];

/// Whether a VM read with [`MADE_FOR_PATHS`] was made by banlieue for `identity`'s
/// namespace and name: its extraConfig says so, or (VMs made before those keys) its
/// notes do.
fn made_for(identity: &MachineIdentity, vm: &Vm, notes: Option<&str>) -> bool {
    let key = |k: &str| vm.extra.get(k).map(String::as_str);
    match key(guestinfo::NAMESPACE_KEY) {
        Some(namespace) => {
            namespace == identity.namespace
                && key(guestinfo::NAME_KEY) == Some(identity.name.as_str())
                && key(guestinfo::KIND_KEY).is_none_or(|k| k == "VSphereMachine")
        }
        None => notes.is_some_and(|n| n.starts_with(&made_for_notes(identity))),
    }
}

/// How the notes of a VM banlieue made for `identity`'s namespace and name begin
/// ([`super::clone::annotation`] without the UID).
pub(super) fn made_for_notes(identity: &MachineIdentity) -> String {
    format!(
        "Managed by banlieue: {}/{} (uid ",
        identity.namespace, identity.name
    )
}

/// Whether `vm` is the machine's: its BIOS UUID is the one `spec.providerID` names,
/// once that is set; else its instance UUID is the machine's UID.
fn owns(identity: &MachineIdentity, vm: &Vm) -> Result<bool, BackendError> {
    Ok(match identity.provider_id_for("vsphere")? {
        Some(bios) => vm
            .bios_uuid
            .as_deref()
            .is_some_and(|b| b.eq_ignore_ascii_case(&bios)),
        None => vm.instance_uuid.as_deref() == Some(identity.uid.to_ascii_lowercase().as_str()),
    })
}

impl VSphereBackend {
    /// The machine's VM: at the reference it was last seen at when that VM still
    /// carries the machine's identity, else by search ([`Self::search`]).
    pub(super) async fn find(
        &self,
        identity: &MachineIdentity,
    ) -> Result<Option<Vm>, BackendError> {
        if let Some(moref) = self.sightings.vm(&identity.uid) {
            if let Some(o) = self
                .client
                .properties(&moref, VM_PATHS)
                .await
                .map_err(vim)?
            {
                let vm = Vm::from(&o);
                if owns(identity, &vm)? {
                    return Ok(Some(vm));
                }
            }
            self.sightings.forget(&identity.uid);
        }
        let vm = self.search(identity).await?;
        if let Some(vm) = &vm {
            self.sightings.see(&identity.uid, &vm.moref);
        }
        Ok(vm)
    }

    /// The VM whose BIOS UUID is in `spec.providerID` once that is set (it survives a
    /// new UID: `clusterctl move`, restores), else the one whose instance UUID is the UID.
    async fn search(&self, identity: &MachineIdentity) -> Result<Option<Vm>, BackendError> {
        let by_provider_id = match identity.provider_id_for("vsphere")? {
            Some(bios) => self.client.find_vm_by_bios_uuid(&bios).await.map_err(vim)?,
            None => None,
        };
        let moref = match by_provider_id {
            Some(moref) => moref,
            None => match self
                .client
                .find_vm_by_instance_uuid(&identity.uid)
                .await
                .map_err(vim)?
            {
                Some(moref) => moref,
                None => return Ok(None),
            },
        };
        Ok(self
            .client
            .properties(&moref, VM_PATHS)
            .await
            .map_err(vim)?
            .map(|o| Vm::from(&o)))
    }

    /// The VMs named `identity.name` whose notes say banlieue made them for its
    /// namespace and name ([`made_for_notes`]; every banlieue VM's notes have, so VMs
    /// made before this was asked for are found too), with the UID their instance UUID
    /// records: one call for every VM's name, one for the few that match.
    pub(super) async fn made_for_machine(
        &self,
        identity: &MachineIdentity,
    ) -> Result<Vec<MadeFor>, BackendError> {
        let root = self
            .client
            .content()
            .await
            .map_err(vim)?
            .root_folder
            .clone();
        let named: Vec<MoRef> = self
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
            .map_err(vim)?
            .into_iter()
            .filter(|o| o.text("name") == Some(identity.name.as_str()))
            .map(|o| o.obj)
            .collect();
        if named.is_empty() {
            return Ok(Vec::new());
        }
        let read = self
            .client
            .properties_of(
                &named,
                &[PropertySpec {
                    kind: "VirtualMachine",
                    paths: MADE_FOR_PATHS,
                }],
            )
            .await;
        let objects = match read {
            Ok(objects) => objects,
            // One went away between the two calls: the next reconcile looks again.
            Err(e) if e.fault_kind() == Some("ManagedObjectNotFound") => {
                return Err(BackendError::transient(
                    "VMGone",
                    format!("a VM named {} went away while being read", identity.name),
                ));
            }
            Err(e) => return Err(vim(e)),
        };
        let mut found: Vec<MadeFor> = objects
            .iter()
            .filter_map(|o| {
                let vm = Vm::from(o);
                if !made_for(identity, &vm, o.text("config.annotation")) {
                    return None;
                }
                let bios = vm.bios_uuid?;
                let deleting = vm
                    .instance_uuid
                    .as_deref()
                    .is_some_and(|uid| matches!(self.tasks.get(uid), Some((OpKind::Destroy, _))));
                Some(MadeFor {
                    provider_id: format!("vsphere://{bios}"),
                    uid: vm.instance_uuid,
                    backend_ref: format!("{} ({})", vm.moref, vm.name),
                    deleting,
                })
            })
            .collect();
        found.sort_by(|a, b| a.provider_id.cmp(&b.provider_id));
        Ok(found)
    }

    /// [`Self::find`] and [`Self::poll`] at once: one call when the VM has been seen and
    /// a task is in flight, else the two apart.
    pub(super) async fn find_and_poll(
        &self,
        identity: &MachineIdentity,
    ) -> Result<(Option<Vm>, Polled), BackendError> {
        let uid = &identity.uid;
        if let (Some(vm_ref), Some((kind, task))) = (self.sightings.vm(uid), self.tasks.get(uid)) {
            let read = self
                .client
                .properties_of(
                    &[vm_ref.clone(), task.clone()],
                    &[
                        PropertySpec {
                            kind: &vm_ref.kind,
                            paths: VM_PATHS,
                        },
                        PropertySpec {
                            kind: &task.kind,
                            paths: TASK_PATHS,
                        },
                    ],
                )
                .await;
            match read {
                Ok(objects) => {
                    let vm = objects.iter().find(|o| o.obj == vm_ref).map(Vm::from);
                    if let Some(vm) = vm
                        && owns(identity, &vm)?
                    {
                        let state = objects
                            .iter()
                            .find(|o| o.obj == task)
                            .map(methods::decode_task);
                        return Ok((Some(vm), self.settle(uid, kind, task, state)));
                    }
                    // Not the machine's VM (any more): search, without reading it again.
                    self.sightings.forget(uid);
                }
                // The VM (or the task) is gone: read them apart.
                Err(e) if e.fault_kind() == Some("ManagedObjectNotFound") => {}
                Err(e) => return Err(vim(e)),
            }
        }
        let vm = self.find(identity).await?;
        Ok((vm, self.poll(uid).await))
    }

    /// Polls the task in flight for `uid`: `Some` while it runs; a finished task is
    /// forgotten, a failed one returned as an error with vSphere's message.
    pub(super) async fn poll(&self, uid: &str) -> Polled {
        let Some((kind, task)) = self.tasks.get(uid) else {
            return Ok(None);
        };
        let state = self.client.task_state(&task).await.map_err(vim)?;
        self.settle(uid, kind, task, state)
    }

    /// What a task's state means for the machine. A clone or create that succeeded
    /// tells where the new VM is; a destroy that succeeded, that it is nowhere.
    fn settle(&self, uid: &str, kind: OpKind, task: MoRef, state: Option<TaskState>) -> Polled {
        match state {
            Some(TaskState::Running) => Ok(Some((kind, task))),
            Some(TaskState::Succeeded(result)) => {
                self.tasks.forget(uid);
                match (kind, result) {
                    (OpKind::Clone | OpKind::Create, Some(vm)) if vm.kind == "VirtualMachine" => {
                        self.sightings.see(uid, &vm)
                    }
                    (OpKind::Destroy, _) => self.sightings.forget(uid),
                    _ => {}
                }
                Ok(None)
            }
            None => {
                self.tasks.forget(uid);
                Ok(None)
            }
            Some(TaskState::Failed(fault)) => {
                self.tasks.forget(uid);
                info!(uid, task = %task, %fault, "vsphere: task failed");
                let message = format!("{} failed: {fault}", kind.method());
                Err(match (kind, fault.kind.as_str()) {
                    // Someone else's lock or a concurrent change: try again.
                    (_, "TaskInProgress" | "ConcurrentAccess" | "InvalidState") => {
                        BackendError::transient("Busy", message)
                    }
                    // A clone or create from before a restart still running, or a name
                    // (or, creating, the .vmx) taken.
                    (OpKind::Clone, "DuplicateName")
                    | (OpKind::Create, "DuplicateName" | "FileAlreadyExists") => {
                        BackendError::transient(kind.failure_reason(), message)
                    }
                    (OpKind::Clone | OpKind::Create | OpKind::Configure | OpKind::PowerOn, _) => {
                        BackendError::terminal(kind.failure_reason(), message)
                    }
                    _ => BackendError::transient(kind.failure_reason(), message),
                })
            }
        }
    }

    /// Whether the destroy in flight for `uid` has finished: `Some(true)` when vCenter
    /// says it succeeded (the VM is gone, no search needed), `Some(false)` while it
    /// runs, `None` when no destroy is in flight or it failed (the caller looks).
    pub(super) async fn destroyed(&self, uid: &str) -> Result<Option<bool>, BackendError> {
        let Some((OpKind::Destroy, task)) = self.tasks.get(uid) else {
            return Ok(None);
        };
        Ok(match self.client.task_state(&task).await.map_err(vim)? {
            Some(TaskState::Succeeded(_)) => {
                self.tasks.forget(uid);
                self.sightings.forget(uid);
                Some(true)
            }
            Some(TaskState::Running) => Some(false),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use banlieue_sdk::api::common::PowerState;

    fn vm(instance: Option<&str>, bios: Option<&str>) -> Vm {
        Vm {
            moref: MoRef::new("VirtualMachine", "vm-1"),
            name: "m".into(),
            bios_uuid: bios.map(str::to_string),
            instance_uuid: instance.map(str::to_string),
            extra: Default::default(),
            power: PowerState::PoweredOff,
            ips: vec![],
            tools_running: false,
            firmware: None,
            secure_boot: false,
            cpus: 1,
            cores_per_socket: None,
            memory_mib: 512,
            cpu_hot_add: false,
            memory_hot_add: false,
            devices: vec![],
        }
    }

    fn identity(uid: &str, provider_id: Option<&str>) -> MachineIdentity {
        MachineIdentity {
            uid: uid.into(),
            namespace: "ns".into(),
            name: "m".into(),
            provider_id: provider_id.map(str::to_string),
        }
    }

    #[test]
    fn a_hint_is_believed_only_for_the_machines_own_vm() {
        const UID: &str = "7F1C2A5E-0000-4000-8000-000000000001";
        const OTHER: &str = "7f1c2a5e-0000-4000-8000-000000000002";
        const BIOS: &str = "4211aaaa-0000-4000-8000-000000000009";
        let cases = [
            // (the VM's instance UUID, its BIOS UUID, the machine's providerID, owned)
            (Some(UID.to_ascii_lowercase()), None, None, true),
            (Some(OTHER.to_string()), None, None, false),
            (None, Some(BIOS.to_string()), None, false),
            // Moved: a new UID, found by the BIOS UUID its providerID names.
            (
                Some(OTHER.to_string()),
                Some(BIOS.to_uppercase()),
                Some(BIOS),
                true,
            ),
            // providerID names another VM: the instance UUID alone does not do.
            (
                Some(UID.to_ascii_lowercase()),
                Some(OTHER.to_string()),
                Some(BIOS),
                false,
            ),
        ];
        for (instance, bios, provider_id, want) in cases {
            let id = identity(
                UID,
                provider_id.map(|b| format!("vsphere://{b}")).as_deref(),
            );
            let got = owns(&id, &vm(instance.as_deref(), bios.as_deref())).unwrap();
            assert_eq!(got, want, "{instance:?} {bios:?} {provider_id:?}");
        }
    }

    #[test]
    fn a_vm_is_made_for_the_object_its_keys_or_else_its_notes_name() {
        let id = identity("7f1c2a5e-0000-4000-8000-000000000001", None);
        let keyed = |ns: &str, name: &str, kind: Option<&str>| {
            let mut vm = vm(None, None);
            vm.extra.insert(guestinfo::NAMESPACE_KEY.into(), ns.into());
            vm.extra.insert(guestinfo::NAME_KEY.into(), name.into());
            if let Some(kind) = kind {
                vm.extra.insert(guestinfo::KIND_KEY.into(), kind.into());
            }
            vm
        };
        assert!(made_for(
            &id,
            &keyed("ns", "m", Some("VSphereMachine")),
            None
        ));
        assert!(!made_for(&id, &keyed("ns", "m2", None), None));
        assert!(!made_for(&id, &keyed("other", "m", None), None));
        assert!(!made_for(
            &id,
            &keyed("ns", "m", Some("ProxmoxMachine")),
            None
        ));
        // Keys win over notes; without keys (an older VM), the notes decide.
        let notes = "Managed by banlieue: ns/m (uid 7f1c2a5e-0000-4000-8000-000000000009)";
        assert!(!made_for(&id, &keyed("other", "m", None), Some(notes)));
        assert!(made_for(&id, &vm(None, None), Some(notes)));
        assert!(!made_for(
            &id,
            &vm(None, None),
            Some("Managed by banlieue: ns/m2 (uid x)")
        ));
        assert!(!made_for(&id, &vm(None, None), None));
    }

    #[test]
    fn a_malformed_provider_id_is_an_error_not_a_miss() {
        let id = identity("7f1c2a5e-0000-4000-8000-000000000001", Some("proxmox://x"));
        assert_eq!(
            owns(&id, &vm(None, None)).unwrap_err().reason,
            "InvalidProviderID"
        );
    }
}
