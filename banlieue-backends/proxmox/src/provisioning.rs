//! Data disk provisioning (`additionalDisks[].provisioning`) on Proxmox VE: what each
//! storage gives the disks PVE allocates there ([`storage_gives`]), and the check,
//! made before anything is created, that every new disk asks what its storage gives
//! ([`check`]).
//!
//! PVE has no per-disk provisioning. A drive (`scsiN: <storage>:<GiB>,…`) has no such
//! option, and neither has `POST /nodes/{node}/storage/{storage}/content`; PVE's
//! `preallocation` (`off|metadata|falloc|full`) is an option of a *storage*
//! (`storage.cfg`, read with `GET /storage`), for the file storages. So the storage
//! decides, and banlieue refuses a disk asking anything else instead of making it
//! otherwise:
//!
//! | storage `type` | gives |
//! |---|---|
//! | `dir`, `nfs`, `cifs`, `btrfs`, `glusterfs` (raw or qcow2 files) | by the storage's `preallocation` (PVE's default `metadata`): `off` and `metadata` → `thin` (a sparse file; `metadata` allocates only qcow2's tables, and is `off` for raw), `falloc` → `thick` (`fallocate`: blocks reserved, read as zeros, nothing written), `full` → `eagerZeroed` (zeros written over the whole disk) |
//! | `lvm` | `thick`: an LV is allocated whole when made, and not zeroed (so not `eagerZeroed`) |
//! | `lvmthin`, `rbd` | `thin` |
//! | `zfspool`, `zfs` (ZFS over iSCSI) | `thin` with the storage's `sparse` set, else `thick` (a zvol with its size reserved, not zeroed) |
//!
//! Any other type (`iscsi`, `iscsidirect`, `cephfs`, `pbs`, `esxi` and out-of-tree
//! plugins: most cannot allocate a VM disk at all) gives nothing banlieue can vouch
//! for: every disk there is refused, `thin` included, since `thin` is the default and
//! cannot be told from one asked.

use banlieue_sdk::api::common::DiskProvisioning;
use banlieue_sdk::backend::BackendError;
use serde_json::Value;

use crate::config::NewDisk;

/// The reason of a disk refused here.
pub const DISK_PROVISIONING_UNSUPPORTED: &str = "DiskProvisioningUnsupported";

/// PVE's default `preallocation` of a file storage that sets none.
const DEFAULT_PREALLOCATION: &str = "metadata";

/// The name banlieue's API gives a provisioning.
pub fn name(provisioning: DiskProvisioning) -> &'static str {
    match provisioning {
        DiskProvisioning::Thin => "thin",
        DiskProvisioning::Thick => "thick",
        DiskProvisioning::EagerZeroed => "eagerZeroed",
    }
}

fn truthy(value: Option<&Value>) -> bool {
    match value {
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) => n.as_u64().is_some_and(|n| n != 0),
        Some(Value::String(s)) => matches!(s.as_str(), "1" | "true" | "yes" | "on"),
        _ => false,
    }
}

/// What a storage gives every disk PVE allocates there, from its `GET /storage`
/// entry: the provisioning and how it follows from the storage (for messages), or
/// why banlieue cannot say (see the module's table).
pub fn storage_gives(config: &Value) -> Result<(DiskProvisioning, String), String> {
    let kind = config
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default();
    match kind {
        "dir" | "nfs" | "cifs" | "btrfs" | "glusterfs" => {
            let format = config.get("format").and_then(Value::as_str);
            if let Some(format) = format.filter(|f| !matches!(*f, "raw" | "qcow2")) {
                // PVE preallocates only raw and qcow2 files; other formats are sparse.
                return Ok((
                    DiskProvisioning::Thin,
                    format!("type {kind}, format {format}: never preallocated"),
                ));
            }
            let preallocation = config
                .get("preallocation")
                .and_then(Value::as_str)
                .unwrap_or(DEFAULT_PREALLOCATION);
            let gives = match preallocation {
                "off" | "metadata" => DiskProvisioning::Thin,
                "falloc" => DiskProvisioning::Thick,
                "full" => DiskProvisioning::EagerZeroed,
                other => {
                    return Err(format!(
                        "type {kind} with an unknown preallocation {other:?}"
                    ));
                }
            };
            let set = if config.get("preallocation").is_some() {
                ""
            } else {
                ", PVE's default"
            };
            Ok((
                gives,
                format!("type {kind}, preallocation={preallocation}{set}"),
            ))
        }
        "lvm" => Ok((DiskProvisioning::Thick, "type lvm".into())),
        "lvmthin" | "rbd" => Ok((DiskProvisioning::Thin, format!("type {kind}"))),
        "zfspool" | "zfs" => Ok(if truthy(config.get("sparse")) {
            (DiskProvisioning::Thin, format!("type {kind}, sparse"))
        } else {
            (DiskProvisioning::Thick, format!("type {kind}, not sparse"))
        }),
        "" => Err("no type in PVE's storage config".into()),
        other => Err(format!(
            "type {other}: banlieue does not know how PVE allocates disks there"
        )),
    }
}

/// Where a disk asking `provisioning` can go instead.
fn where_instead(provisioning: DiskProvisioning) -> &'static str {
    match provisioning {
        DiskProvisioning::Thin => {
            "lvmthin, rbd, zfspool with sparse, or dir/nfs/cifs with preallocation off or metadata"
        }
        DiskProvisioning::Thick => {
            "lvm, zfspool without sparse, or dir/nfs/cifs with preallocation=falloc"
        }
        DiskProvisioning::EagerZeroed => "dir/nfs/cifs with preallocation=full",
    }
}

/// Refuses (terminal [`DISK_PROVISIONING_UNSUPPORTED`]) the first of `disks` whose
/// provisioning its storage does not give, or that has no storage, or whose storage
/// `storages` (`GET /storage`) does not list; the message names the field, the disk,
/// the storage and its type. Made before the clone, the configuration or the config
/// write that would allocate the disks, so nothing is made for a refused disk.
pub fn check(disks: &[NewDisk<'_>], storages: &Value) -> Result<(), BackendError> {
    let refuse = |d: &NewDisk<'_>, why: String| {
        Err(BackendError::terminal(
            DISK_PROVISIONING_UNSUPPORTED,
            format!(
                "additionalDisks[{}] ({}): provisioning {}: {why}",
                d.index,
                d.disk.name,
                name(d.disk.provisioning)
            ),
        ))
    };
    for d in disks {
        let Some(storage) = &d.storage else {
            return refuse(
                d,
                "no storage: the disk, spec.storage and the template's boot disk (scsi0) name none"
                    .into(),
            );
        };
        let Some(config) = storages
            .as_array()
            .into_iter()
            .flatten()
            .find(|s| s.get("storage").and_then(Value::as_str) == Some(storage.as_str()))
        else {
            return refuse(
                d,
                format!(
                    "storage {storage} is not in PVE's storage list (it does not exist, or the \
                     token lacks Datastore.AllocateSpace on /storage/{storage})"
                ),
            );
        };
        match storage_gives(config) {
            Ok((gives, _)) if gives == d.disk.provisioning => {}
            Ok((gives, how)) => {
                return refuse(
                    d,
                    format!(
                        "storage {storage} ({how}) gives {} disks, and PVE sets provisioning per \
                         storage, not per disk: ask {}, or use a storage that gives {} ({})",
                        name(gives),
                        name(gives),
                        name(d.disk.provisioning),
                        where_instead(d.disk.provisioning)
                    ),
                );
            }
            Err(why) => {
                return refuse(
                    d,
                    format!(
                        "storage {storage} ({why}), so no provisioning can be promised there; \
                         use a storage that gives {} ({})",
                        name(d.disk.provisioning),
                        where_instead(d.disk.provisioning)
                    ),
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use DiskProvisioning::{EagerZeroed, Thick, Thin};
    use banlieue_sdk::api::infra::proxmox::ProxmoxMachineSpec;
    use serde_json::json;

    #[test]
    fn each_storage_type_gives_one_provisioning() {
        let table: &[(Value, Option<DiskProvisioning>)] = &[
            (json!({"type": "dir"}), Some(Thin)),
            (json!({"type": "dir", "preallocation": "off"}), Some(Thin)),
            (
                json!({"type": "nfs", "preallocation": "metadata"}),
                Some(Thin),
            ),
            (
                json!({"type": "cifs", "preallocation": "falloc"}),
                Some(Thick),
            ),
            (
                json!({"type": "dir", "preallocation": "full"}),
                Some(EagerZeroed),
            ),
            (
                json!({"type": "btrfs", "preallocation": "falloc"}),
                Some(Thick),
            ),
            (
                json!({"type": "glusterfs", "preallocation": "full"}),
                Some(EagerZeroed),
            ),
            (
                json!({"type": "dir", "format": "qcow2", "preallocation": "full"}),
                Some(EagerZeroed),
            ),
            // PVE preallocates only raw and qcow2.
            (
                json!({"type": "dir", "format": "vmdk", "preallocation": "full"}),
                Some(Thin),
            ),
            (json!({"type": "dir", "preallocation": "sometimes"}), None),
            (json!({"type": "lvm"}), Some(Thick)),
            (json!({"type": "lvmthin"}), Some(Thin)),
            (json!({"type": "rbd"}), Some(Thin)),
            (json!({"type": "zfspool"}), Some(Thick)),
            (json!({"type": "zfspool", "sparse": 0}), Some(Thick)),
            (json!({"type": "zfspool", "sparse": 1}), Some(Thin)),
            (json!({"type": "zfs", "sparse": true}), Some(Thin)),
            (json!({"type": "zfspool", "sparse": "1"}), Some(Thin)),
            (json!({"type": "iscsi"}), None),
            (json!({"type": "cephfs"}), None),
            (json!({"type": "pbs"}), None),
            (json!({"type": "someplugin"}), None),
            (json!({}), None),
        ];
        for (config, want) in table {
            assert_eq!(
                storage_gives(config).ok().map(|(p, _)| p),
                *want,
                "{config}"
            );
        }
        assert_eq!(
            storage_gives(&json!({"type": "dir"})).unwrap().1,
            "type dir, preallocation=metadata, PVE's default"
        );
    }

    fn spec(disks: Value) -> ProxmoxMachineSpec {
        serde_json::from_value(json!({"templateID": 9000, "cores": 1, "memoryMiB": 512,
            "additionalDisks": disks}))
        .unwrap()
    }

    fn storages() -> Value {
        json!([
            {"storage": "local", "type": "dir", "content": "iso,images"},
            {"storage": "local-lvm", "type": "lvmthin"},
            {"storage": "thick-lvm", "type": "lvm"},
            {"storage": "zeroed", "type": "nfs", "preallocation": "full"},
            {"storage": "san", "type": "iscsi"},
        ])
    }

    /// The verdict for one disk on `storage` asking `provisioning`: `Ok`, or the
    /// refusal's message.
    fn verdict(
        storage: Option<&str>,
        provisioning: &str,
        boot: Option<&str>,
    ) -> Result<(), String> {
        let mut disk = json!({"name": "data", "sizeGiB": 1, "provisioning": provisioning});
        if let Some(s) = storage {
            disk["storage"] = json!(s);
        }
        let spec = spec(json!([disk]));
        let current = match boot {
            Some(b) => json!({"scsi0": format!("{b}:base-9000-disk-0,size=4G")}),
            None => Value::Null,
        };
        let disks = crate::config::new_disks(&spec, &current);
        check(&disks, &storages()).map_err(|e| {
            assert_eq!(e.reason, DISK_PROVISIONING_UNSUPPORTED);
            assert!(!e.is_transient());
            e.message
        })
    }

    #[test]
    fn a_disk_is_accepted_only_with_what_its_storage_gives() {
        // (the disk's storage, its provisioning, the boot disk's storage, Ok or the
        // refusal's words)
        type Case<'a> = (
            Option<&'a str>,
            &'a str,
            Option<&'a str>,
            Result<(), &'a [&'a str]>,
        );
        let table: &[Case<'_>] = &[
            (Some("local-lvm"), "thin", None, Ok(())),
            (
                Some("local-lvm"),
                "thick",
                None,
                Err(&[
                    "additionalDisks[0] (data): provisioning thick",
                    "storage local-lvm (type lvmthin) gives thin disks",
                    "lvm, zfspool without sparse",
                ]),
            ),
            (Some("thick-lvm"), "thick", None, Ok(())),
            (
                Some("thick-lvm"),
                "eagerZeroed",
                None,
                Err(&[
                    "storage thick-lvm (type lvm) gives thick disks",
                    "preallocation=full",
                ]),
            ),
            (Some("zeroed"), "eagerZeroed", None, Ok(())),
            (
                Some("local"),
                "thick",
                None,
                Err(&[
                    "storage local (type dir, preallocation=metadata, PVE's default) gives thin",
                ]),
            ),
            (Some("local"), "thin", None, Ok(())),
            // Unknown types refuse even the default.
            (
                Some("san"),
                "thin",
                None,
                Err(&["storage san (type iscsi: banlieue does not know"]),
            ),
            (
                Some("gone"),
                "thin",
                None,
                Err(&["storage gone is not in PVE's storage list"]),
            ),
            // No storage of its own: the boot disk's.
            (None, "thin", Some("local-lvm"), Ok(())),
            (None, "thick", Some("thick-lvm"), Ok(())),
            (
                None,
                "thick",
                Some("local-lvm"),
                Err(&["storage local-lvm (type lvmthin)"]),
            ),
            (
                None,
                "thin",
                None,
                Err(&[
                    "no storage: the disk, spec.storage and the template's boot disk (scsi0) name none",
                ]),
            ),
        ];
        for (storage, provisioning, boot, want) in table {
            let got = verdict(*storage, provisioning, *boot);
            match (want, &got) {
                (Ok(()), Ok(())) => {}
                (Err(parts), Err(message)) => {
                    for part in *parts {
                        assert!(
                            message.contains(part),
                            "{storage:?} {provisioning}: {message}"
                        );
                    }
                }
                _ => panic!("{storage:?} {provisioning} on boot {boot:?}: {got:?}"),
            }
        }
    }

    #[test]
    fn disks_the_vm_has_are_not_checked_again() {
        let spec = spec(json!([
            {"name": "a", "sizeGiB": 1, "storage": "local-lvm", "provisioning": "thick"},
            {"name": "b", "sizeGiB": 1, "storage": "thick-lvm", "provisioning": "thick"}
        ]));
        // `a` exists (made before this check, or its storage changed since): only
        // `b`, which the next config write would allocate, is looked at.
        let current = json!({"scsi0": "local-lvm:vm-100-disk-0,size=4G",
                             "scsi1": "local-lvm:vm-100-disk-1,size=1G"});
        let disks = crate::config::new_disks(&spec, &current);
        assert_eq!(disks.len(), 1);
        assert_eq!(disks[0].key, "scsi2");
        assert!(check(&disks, &storages()).is_ok());
        assert!(check(&crate::config::new_disks(&spec, &Value::Null), &storages()).is_err());
    }
}
