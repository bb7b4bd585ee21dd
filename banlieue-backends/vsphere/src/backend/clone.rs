//! Placement and the clone: template, datacenter, cluster, resource pool, folder,
//! datastore, linked-clone snapshot, and the clone's config. Placement is shared
//! with the machines created on imported disks (`create.rs`).

use banlieue_sdk::api::common::Firmware;
use banlieue_sdk::api::infra::vsphere::{CloneMode, VSphereMachineSpec};
use banlieue_sdk::backend::{BackendError, MachineIdentity, MachineObservation, MachineRequest};
use tracing::info;

use super::{OpKind, VSphereBackend, vim};
use crate::client::methods::{self, CloneSpec, ConfigSpec, RelocateSpec};
use crate::client::{MoRef, PropertySpec};
use crate::inventory::{Cluster, Datacenter};
use crate::{devices, guestinfo, inventory};

impl VSphereBackend {
    /// A template by inventory path or name, as resolved in the last minute (clones of
    /// one template come in bursts); [`Self::lookup_template`] when it was not.
    pub(super) async fn resolve_template(
        &self,
        template: &str,
    ) -> Result<Option<MoRef>, BackendError> {
        if let Some(moref) = self.sightings.templates.get(template) {
            return Ok(Some(moref));
        }
        self.lookup_template(template).await
    }

    /// A template by inventory path (`/DC0/vm/templates/ubuntu`) or by name, looked up
    /// now (and remembered for [`Self::resolve_template`]).
    pub(super) async fn lookup_template(
        &self,
        template: &str,
    ) -> Result<Option<MoRef>, BackendError> {
        let found = self.search_template(template).await?;
        match &found {
            Some(moref) => self.sightings.templates.put(template, moref),
            None => self.sightings.templates.forget(template),
        }
        Ok(found)
    }

    async fn search_template(&self, template: &str) -> Result<Option<MoRef>, BackendError> {
        if template.starts_with('/') {
            return self.client.find_by_path(template).await.map_err(vim);
        }
        let root = self
            .client
            .content()
            .await
            .map_err(vim)?
            .root_folder
            .clone();
        let vms = self
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
            .map_err(vim)?;
        Ok(vms
            .into_iter()
            .find(|o| o.text("name") == Some(template))
            .map(|o| o.obj))
    }

    /// A resource pool or folder given as an absolute inventory path, or relative to
    /// `base`.
    pub(super) async fn resolve_path(
        &self,
        path: &str,
        base: &str,
        what: &str,
    ) -> Result<MoRef, BackendError> {
        let full = if path.starts_with('/') {
            path.to_string()
        } else {
            format!("{base}/{path}")
        };
        self.client
            .find_by_path(&full)
            .await
            .map_err(vim)?
            .ok_or_else(|| {
                BackendError::terminal(
                    format!("{what}NotFound"),
                    format!("no {what} at inventory path {full}"),
                )
            })
    }

    /// Where the machine goes: datacenter and compute cluster (the machine's, else its
    /// failure domain's, else the only one), resource pool, VM folder and datastore.
    pub(super) async fn placement(
        &self,
        request: &MachineRequest,
        spec: &VSphereMachineSpec,
    ) -> Result<Placement, BackendError> {
        no_storage_policy(spec)?;
        let topology = self.topology(false).await?;
        let from_fd = request
            .failure_domain
            .as_deref()
            .and_then(inventory::parse_failure_domain);
        let dc_name = spec
            .datacenter
            .clone()
            .or_else(|| from_fd.map(|(dc, _)| dc.to_string()))
            .or_else(|| self.settings.datacenter.clone())
            .or_else(|| {
                (topology.datacenters.len() == 1)
                    .then(|| topology.datacenters.keys().next().cloned())
                    .flatten()
            })
            .ok_or_else(|| {
                BackendError::terminal(
                    "NoPlacement",
                    "the machine names no datacenter, it has no failure domain, and the vCenter has several datacenters",
                )
            })?;
        let dc_name = dc_name.trim_start_matches('/').to_string();
        let dc = topology.datacenters.get(&dc_name).ok_or_else(|| {
            BackendError::terminal("DatacenterNotFound", format!("no datacenter {dc_name}"))
        })?;
        let cluster_name = spec
            .cluster
            .clone()
            .or_else(|| from_fd.map(|(_, c)| c.to_string()))
            .or_else(|| {
                let mut in_dc = topology.clusters.iter().filter(|c| c.datacenter == dc_name);
                match (in_dc.next(), in_dc.next()) {
                    (Some(only), None) => Some(only.name.clone()),
                    _ => None,
                }
            })
            .ok_or_else(|| {
                BackendError::terminal(
                    "NoPlacement",
                    format!("the machine names no cluster and datacenter {dc_name} has several"),
                )
            })?;
        let cluster = topology.cluster(&dc_name, &cluster_name).ok_or_else(|| {
            BackendError::terminal(
                "ClusterNotFound",
                format!("no compute cluster {cluster_name} in datacenter {dc_name}"),
            )
        })?;
        let pool = match &spec.resource_pool {
            Some(p) => {
                self.resolve_path(
                    p,
                    &format!("/{dc_name}/host/{cluster_name}/Resources"),
                    "ResourcePool",
                )
                .await?
            }
            None => cluster.resource_pool.clone().ok_or_else(|| {
                BackendError::terminal(
                    "ResourcePoolNotFound",
                    format!("cluster {cluster_name} has no resource pool"),
                )
            })?,
        };
        let folder = match &spec.folder {
            Some(f) => {
                self.resolve_path(f, &format!("/{dc_name}/vm"), "Folder")
                    .await?
            }
            None => dc.vm_folder.clone().ok_or_else(|| {
                BackendError::terminal(
                    "FolderNotFound",
                    format!("datacenter {dc_name} has no VM folder"),
                )
            })?,
        };
        let datastore = match &spec.datastore {
            Some(name) => Some(self.datastore(cluster, &dc_name, name).await?),
            None => None,
        };
        Ok(Placement {
            failure_domain: inventory::failure_domain_name(&dc_name, &cluster_name),
            datacenter: dc.clone(),
            cluster: cluster.clone(),
            pool,
            folder,
            datastore,
        })
    }

    /// A datastore by name (one the cluster mounts) or inventory path.
    pub(super) async fn datastore(
        &self,
        cluster: &Cluster,
        dc_name: &str,
        name: &str,
    ) -> Result<(String, MoRef), BackendError> {
        // The file interface takes the name; a path ends with it.
        let short = name.rsplit('/').next().unwrap_or(name).to_string();
        Ok(match cluster.datastores.get(name) {
            Some(ds) => (short, ds.clone()),
            None => (
                short,
                self.resolve_path(name, &format!("/{dc_name}/datastore"), "Datastore")
                    .await?,
            ),
        })
    }

    pub(super) async fn start_clone(
        &self,
        request: &MachineRequest,
        spec: &VSphereMachineSpec,
    ) -> Result<MachineObservation, BackendError> {
        let identity = &request.identity;
        no_storage_policy(spec)?;
        crate::netconfig::check_mtu(&spec.network, request.bootstrap.as_ref())?;
        let template = self
            .resolve_template(&spec.template)
            .await?
            .ok_or_else(|| {
                BackendError::terminal(
                    "TemplateNotFound",
                    format!(
                        "no template {} on {}",
                        spec.template,
                        self.client.endpoint()
                    ),
                )
            })?;
        let linked = spec.clone_mode == CloneMode::LinkedClone;
        // What the clone needs of the template, in one read: its snapshot (linked
        // clones) and its network devices (the machine's networks are moved onto them
        // and none is added, so more networks than it has are refused now, before
        // anything is made, not after the clone).
        let mut paths = Vec::new();
        if linked {
            paths.push("snapshot.currentSnapshot");
        }
        // A full clone's OS disk copy is provisioned as asked: its key and datastore.
        if !spec.network.is_empty() || !linked {
            paths.push("config.hardware.device");
        }
        let read = if paths.is_empty() {
            None
        } else {
            self.client
                .properties(&template, &paths)
                .await
                .map_err(vim)?
        };
        if !spec.network.is_empty() {
            let template_devices = read
                .as_ref()
                .and_then(|o| o.prop("config.hardware.device"))
                .map(devices::devices)
                .unwrap_or_default();
            devices::nics_suffice(spec.network.len(), devices::nic_count(&template_devices))?;
        }
        let place = self.placement(request, spec).await?;
        let (snapshot, disk_move_type) = if linked {
            let snap = read
                .as_ref()
                .and_then(|o| o.moref("snapshot.currentSnapshot"))
                .ok_or_else(|| {
                    BackendError::terminal(
                        "LinkedCloneNeedsSnapshot",
                        format!(
                            "template {} has no snapshot to link clones to",
                            spec.template
                        ),
                    )
                })?;
            (Some(snap), Some("createNewChildDiskBacking".to_string()))
        } else {
            (None, None)
        };
        let fd = place.failure_domain.clone();
        let datastore = place.datastore.map(|(_, ds)| ds);
        // A linked clone's disk is a delta on the template's (admission allows only
        // thin there); a full clone's OS disk copy gets the provisioning asked.
        let disks = if linked {
            Vec::new()
        } else {
            let template_devices = read
                .as_ref()
                .and_then(|o| o.prop("config.hardware.device"))
                .map(devices::devices)
                .unwrap_or_default();
            devices::os_disk_locator(
                &template_devices,
                spec.disk_provisioning,
                datastore.as_ref(),
            )?
            .into_iter()
            .collect()
        };
        let clone = CloneSpec {
            location: RelocateSpec {
                datastore,
                disk_move_type,
                pool: Some(place.pool),
                disks,
                ..Default::default()
            },
            template: false,
            config: Some(ConfigSpec {
                instance_uuid: Some(identity.uid.clone()),
                annotation: Some(annotation(identity)),
                num_cpus: Some(spec.num_cpus),
                num_cores_per_socket: spec.num_cores_per_socket,
                memory_mib: Some(spec.memory_mib),
                cpu_hot_add: Some(hot_add(spec).0),
                memory_hot_add: Some(hot_add(spec).1),
                extra_config: guestinfo::clone_keys(identity, &fd),
                firmware: spec.firmware.map(firmware),
                efi_secure_boot: spec.firmware.and_then(secure_boot),
                ..Default::default()
            }),
            power_on: false,
            snapshot,
        };
        let task = self
            .start(
                &identity.uid,
                OpKind::Clone,
                &methods::clone_vm_task(&template, &place.folder, &identity.name, &clone),
            )
            .await
            .inspect_err(|e| {
                // The template went away since it was resolved: look it up next time.
                if e.reason == "ObjectNotFound" {
                    self.sightings.templates.forget(&spec.template);
                }
            })?;
        info!(uid = %identity.uid, template = %spec.template, failure_domain = %fd, "vsphere: cloning");
        Ok(MachineObservation {
            failure_domain: Some(fd),
            pending: Some(self.pending(&identity.uid, OpKind::Clone, Some(&task))),
            ..Default::default()
        })
    }
}

/// Where a machine goes, as [`VSphereBackend::placement`] finds it.
#[derive(Clone, Debug)]
pub(super) struct Placement {
    /// `<datacenter>/<cluster>`.
    pub(super) failure_domain: String,
    pub(super) datacenter: Datacenter,
    pub(super) cluster: Cluster,
    pub(super) pool: MoRef,
    pub(super) folder: MoRef,
    /// The machine's datastore (name, reference), when it names one.
    pub(super) datastore: Option<(String, MoRef)>,
}

/// Storage policies are not supported yet: a terminal error before anything happens.
pub(super) fn no_storage_policy(spec: &VSphereMachineSpec) -> Result<(), BackendError> {
    match &spec.storage_policy_name {
        Some(policy) => Err(BackendError::terminal(
            "StoragePolicyUnsupported",
            format!(
                "storagePolicyName {policy}: storage policies are not supported yet; name a datastore"
            ),
        )),
        None => Ok(()),
    }
}

/// The VM's notes: who owns it. They begin with
/// [`made_for_notes`](super::locate::made_for_notes), which a restored object finds it
/// by: never change that part.
pub(super) fn annotation(identity: &MachineIdentity) -> String {
    format!(
        "{}{})",
        super::locate::made_for_notes(identity),
        identity.uid
    )
}

/// vSphere's spelling of a firmware (`efi-secure` is `efi` with Secure Boot on).
pub(super) fn firmware(f: Firmware) -> String {
    match f {
        Firmware::Bios => "bios".to_string(),
        Firmware::Efi | Firmware::EfiSecure => "efi".to_string(),
    }
}

/// `bootOptions.efiSecureBootEnabled` for a firmware: on for `efi-secure`, off for
/// `efi` (a template with Secure Boot on gives a plain EFI machine), unset for BIOS.
pub(super) fn secure_boot(f: Firmware) -> Option<bool> {
    match f {
        Firmware::Bios => None,
        Firmware::Efi => Some(false),
        Firmware::EfiSecure => Some(true),
    }
}

/// The reconfigure that gives `vm` the firmware (and Secure Boot) `want` asks, when it
/// does not have them: the firmware first (Secure Boot needs `efi` already set), then
/// Secure Boot. `None` when it has them, or nothing is asked.
pub(super) fn firmware_fix(vm: &super::vm::Vm, want: Option<Firmware>) -> Option<ConfigSpec> {
    let want = want?;
    let name = firmware(want);
    if vm.firmware.as_deref() != Some(name.as_str()) {
        return Some(ConfigSpec {
            firmware: Some(name),
            ..Default::default()
        });
    }
    let secure = want == Firmware::EfiSecure;
    (vm.secure_boot != secure && want != Firmware::Bios).then(|| ConfigSpec {
        firmware: Some(name),
        efi_secure_boot: Some(secure),
        ..Default::default()
    })
}

/// The hot-add flags `spec` asks, `(cpuHotAddEnabled, memoryHotAddEnabled)`: on when
/// it asks room to grow (`maxCPUs`, `maxMemoryMiB`), off otherwise (a template's
/// hot-add is not kept: it would let a machine grow live that its spec gives no room,
/// and CPU hot-add turns vNUMA off).
pub(super) fn hot_add(spec: &VSphereMachineSpec) -> (bool, bool) {
    (spec.max_cpus.is_some(), spec.max_memory_mib.is_some())
}

/// Sets in `config` the hot-add flags `spec` asks that `vm` does not have, while it is
/// powered off (vSphere changes them only then): a clone that did not take them
/// (vcsim's clone keeps only `numCPUs` and `memoryMB` of the clone's config) gets them
/// with its configuring reconfigure.
pub(super) fn hot_add_fix(vm: &super::vm::Vm, spec: &VSphereMachineSpec, config: &mut ConfigSpec) {
    if vm.power != banlieue_sdk::api::common::PowerState::PoweredOff {
        return;
    }
    let (cpu, memory) = hot_add(spec);
    config.cpu_hot_add = (vm.cpu_hot_add != cpu).then_some(cpu);
    config.memory_hot_add = (vm.memory_hot_add != memory).then_some(memory);
}

/// Whether `fix` alone gives `vm` the firmware `want` asks (so it can ride with the
/// configuring reconfigure), or a second step must follow it (Secure Boot on a VM
/// that is not EFI yet).
pub(super) fn fix_completes(vm: &super::vm::Vm, fix: &ConfigSpec, want: Option<Firmware>) -> bool {
    let mut after = vm.clone();
    if let Some(f) = &fix.firmware {
        after.firmware = Some(f.clone());
    }
    if let Some(on) = fix.efi_secure_boot {
        after.secure_boot = on;
    }
    firmware_fix(&after, want).is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_notes_say_who_the_vm_was_made_for_as_they_always_did() {
        let identity = |namespace: &str, name: &str| MachineIdentity {
            uid: "7f1c2a5e-0000-4000-8000-000000000001".into(),
            namespace: namespace.into(),
            name: name.into(),
            provider_id: None,
        };
        let notes = annotation(&identity("demo", "web"));
        // Unchanged since the first release: older VMs are found by it.
        assert_eq!(
            notes,
            "Managed by banlieue: demo/web (uid 7f1c2a5e-0000-4000-8000-000000000001)"
        );
        let made_for = |namespace, name| {
            notes.starts_with(&super::super::locate::made_for_notes(&identity(
                namespace, name,
            )))
        };
        assert!(made_for("demo", "web"));
        assert!(!made_for("demo", "we"), "a prefix of the name");
        assert!(!made_for("dem", "o/web"));
    }

    #[test]
    fn a_one_step_fix_rides_with_the_configure_and_a_two_step_one_goes_first() {
        use Firmware::*;
        // (what the VM has, what is asked, whether the first fix completes it)
        let cases = [
            ((Some("bios"), false), Efi, true),
            ((Some("bios"), false), EfiSecure, false),
            ((Some("efi"), false), EfiSecure, true),
            ((Some("efi"), true), Efi, true),
            ((Some("efi"), false), Bios, true),
            // A template with Secure Boot on, asked plain EFI from BIOS: firmware then
            // Secure Boot off.
            ((Some("bios"), true), Efi, false),
        ];
        for ((has, secure), want, completes) in cases {
            let vm = vm(has, secure);
            let fix = firmware_fix(&vm, Some(want)).unwrap();
            assert_eq!(
                fix_completes(&vm, &fix, Some(want)),
                completes,
                "{has:?}/{secure} asked {want:?}"
            );
        }
    }

    fn vm(firmware: Option<&str>, secure_boot: bool) -> super::super::vm::Vm {
        super::super::vm::Vm {
            moref: MoRef::new("VirtualMachine", "vm-1"),
            name: "m".into(),
            bios_uuid: None,
            instance_uuid: None,
            extra: Default::default(),
            power: banlieue_sdk::api::common::PowerState::PoweredOff,
            ips: vec![],
            tools_running: false,
            firmware: firmware.map(str::to_string),
            secure_boot,
            cpus: 1,
            cores_per_socket: None,
            memory_mib: 512,
            cpu_hot_add: false,
            memory_hot_add: false,
            devices: vec![],
        }
    }

    #[test]
    fn hot_add_is_set_as_the_spec_asks_only_while_off_and_only_when_it_differs() {
        let spec = |max_cpus: Option<u32>, max_memory_mib: Option<u64>| VSphereMachineSpec {
            max_cpus,
            max_memory_mib,
            ..serde_json::from_value(serde_json::json!({
                "template": "t", "numCPUs": 1, "memoryMiB": 512
            }))
            .unwrap()
        };
        // (VM has cpu, memory hot-add; asks maxCPUs, maxMemoryMiB; power; the fix)
        type Case = (
            (bool, bool),
            (Option<u32>, Option<u64>),
            banlieue_sdk::api::common::PowerState,
            (Option<bool>, Option<bool>),
        );
        use banlieue_sdk::api::common::PowerState::*;
        let cases: [Case; 5] = [
            (
                (false, false),
                (Some(4), Some(4096)),
                PoweredOff,
                (Some(true), Some(true)),
            ),
            (
                (false, false),
                (Some(4), None),
                PoweredOff,
                (Some(true), None),
            ),
            (
                (true, true),
                (Some(4), Some(4096)),
                PoweredOff,
                (None, None),
            ),
            // A template with hot-add, none asked: turned off.
            (
                (true, true),
                (None, None),
                PoweredOff,
                (Some(false), Some(false)),
            ),
            // Never on a running VM (vSphere would refuse it).
            (
                (false, false),
                (Some(4), Some(4096)),
                PoweredOn,
                (None, None),
            ),
        ];
        for ((cpu, memory), (max_cpus, max_memory), power, want) in cases {
            let mut vm = vm(Some("efi"), false);
            (vm.cpu_hot_add, vm.memory_hot_add, vm.power) = (cpu, memory, power);
            let mut config = ConfigSpec::default();
            hot_add_fix(&vm, &spec(max_cpus, max_memory), &mut config);
            assert_eq!(
                (config.cpu_hot_add, config.memory_hot_add),
                want,
                "{cpu}/{memory} asked {max_cpus:?}/{max_memory:?} {power:?}"
            );
        }
    }

    #[test]
    fn the_firmware_then_secure_boot_converge_in_two_steps() {
        use Firmware::*;
        // (what the VM has, what is asked, the reconfigure: firmware, secure boot)
        type Case = (
            (Option<&'static str>, bool),
            Option<Firmware>,
            Option<(&'static str, Option<bool>)>,
        );
        let cases: [Case; 8] = [
            ((Some("bios"), false), Some(EfiSecure), Some(("efi", None))),
            (
                (Some("efi"), false),
                Some(EfiSecure),
                Some(("efi", Some(true))),
            ),
            ((Some("efi"), true), Some(EfiSecure), None),
            ((Some("efi"), true), Some(Efi), Some(("efi", Some(false)))),
            ((Some("efi"), false), Some(Efi), None),
            ((Some("efi"), false), Some(Bios), Some(("bios", None))),
            ((Some("bios"), false), Some(Bios), None),
            ((None, false), None, None),
        ];
        for ((has, secure), want, fix) in cases {
            let got = firmware_fix(&vm(has, secure), want)
                .map(|c| (c.firmware.unwrap_or_default(), c.efi_secure_boot));
            assert_eq!(
                got,
                fix.map(|(f, s)| (f.to_string(), s)),
                "{has:?}/{secure} asked {want:?}"
            );
        }
    }
}
