//! The per-machine directory under the state directory, and the record in it.
//!
//! ```text
//! <state dir>/<uid>/state.json   this record (written atomically)
//!                  /api.sock     the VMM's API socket
//!                  /disk.raw     the OS disk (disk.qcow2 for qcow2 images)
//!                  /seed.img     the NoCloud seed (FAT, label CIDATA)
//!                  /data-<n>.raw additional disks
//!                  /vmm.log      the VMM's stdout and stderr
//!                  /serial.log   the guest's serial console
//! ```
//!
//! A machine is prepared in `<uid>.partial` and renamed into place, so a directory
//! named after a UID is always complete, and the UID in the name is the tag that makes
//! `ensure` idempotent across operator restarts.
//!
//! Disks imported for a machine not created yet (`CopyDisk`) are written into
//! `<uid>.importing` and renamed to `<uid>.imported` once all are there; `ensure`
//! links them into `<uid>.partial` and removes `<uid>.imported` once the machine is in
//! place.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use banlieue_sdk::api::infra::cloud_hypervisor::CloudHypervisorNetworkInterface;
use banlieue_sdk::backend::BackendError;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What banlieue last asked of a machine's VMM; an exit is a crash only when
/// banlieue wanted it running.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Intent {
    /// Running (or paused): the VMM must be there.
    #[default]
    Run,
    /// Powered off: the VMM may exit (the real one does when the guest powers off).
    Stop,
}

/// An unexpected VMM exit, reported until the restart delay has passed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exit {
    /// The pid that went away.
    pub pid: u32,
    /// When banlieue noticed (ms since the epoch).
    pub noticed_ms: u64,
}

/// `state.json`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// The infra object's UID (also the directory's name).
    pub uid: String,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The UID of the object that owns the machine now, when it was adopted by one
    /// other than the object it was made for (`clusterctl move`, a restore): the
    /// directory and the provider ID keep the first UID, which no object holds any
    /// more. `None`: the object it was made for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The VMM's pid, once one was started.
    pub pid: Option<u32>,
    /// What banlieue last asked.
    pub intent: Intent,
    /// When the ACPI power button was pressed (ms since the epoch), while powering off.
    pub power_button_ms: Option<u64>,
    /// An unexpected exit being reported.
    pub exit: Option<Exit>,
    /// How many times a VMM that died was started again.
    pub restarts: u32,
    /// The `VmConfig` the next `vm.create` sends: what the machine was made with,
    /// with every change applied since (live ones kept for the next boot, and those
    /// that wait for it).
    pub config: Value,
    /// The memory size (bytes) the VM that runs was created with: the base of its
    /// hot-plug room, which `vm.info` no longer shows once memory was added.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub booted_memory: Option<u64>,
    /// The MAC of each interface, in order (for DHCP lease lookups).
    pub macs: Vec<String>,
    /// The interfaces as specified (IPAM), so `observe` reports addresses without a spec.
    #[serde(default)]
    pub interfaces: Vec<CloudHypervisorNetworkInterface>,
    /// The additional disks' names, in order (`data-<n>.raw` is the n-th), so an
    /// export can say which disk each file is.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disk_names: Vec<String>,
}

impl Record {
    /// The UID of the object that owns the machine now.
    pub fn owner_uid(&self) -> &str {
        self.owner.as_deref().unwrap_or(&self.uid)
    }

    /// Records `identity`'s object as the owner (retagging, as the other backends do
    /// when they adopt a machine under a new UID); true when that changed anything.
    pub fn adopt(&mut self, identity: &banlieue_sdk::backend::MachineIdentity) -> bool {
        let owner = (identity.uid != self.uid).then(|| identity.uid.clone());
        let changed = owner != self.owner
            || identity.namespace != self.namespace
            || identity.name != self.name;
        self.owner = owner;
        self.namespace.clone_from(&identity.namespace);
        self.name.clone_from(&identity.name);
        changed
    }
}

/// Milliseconds since the epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// One machine's directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmDir {
    path: PathBuf,
}

fn io(what: &str, path: &Path, e: std::io::Error) -> BackendError {
    BackendError::transient("HostIOError", format!("{what} {}: {e}", path.display()))
}

impl VmDir {
    /// The directory of `uid` under `root`. UIDs are Kubernetes UUIDs; anything
    /// that could escape the root is refused.
    pub fn new(root: &Path, uid: &str) -> Result<Self, BackendError> {
        if uid.is_empty() || !uid.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return Err(BackendError::terminal(
                "InvalidUID",
                format!("{uid:?} is not a UID"),
            ));
        }
        Ok(Self {
            path: root.join(uid),
        })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where the machine is prepared before it is renamed into place.
    pub fn partial(&self) -> PathBuf {
        self.path.with_extension("partial")
    }

    /// Where imported disks wait, complete, for the machine's `ensure`.
    pub fn imported(&self) -> PathBuf {
        self.path.with_extension("imported")
    }

    /// Where an import writes before it is complete.
    pub fn importing(&self) -> PathBuf {
        self.path.with_extension("importing")
    }

    /// The API socket.
    pub fn socket(&self) -> PathBuf {
        self.path.join("api.sock")
    }

    /// The VMM's log.
    pub fn log(&self) -> PathBuf {
        self.path.join("vmm.log")
    }

    /// `state.json`.
    fn record_path(&self) -> PathBuf {
        self.path.join("state.json")
    }

    /// The record, or `None` when the machine does not exist.
    pub fn load(&self) -> Result<Option<Record>, BackendError> {
        let path = self.record_path();
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
                BackendError::terminal("CorruptState", format!("{}: {e}", path.display()))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io("reading", &path, e)),
        }
    }

    /// Writes the record atomically (temporary file, then rename).
    pub fn save(&self, record: &Record) -> Result<(), BackendError> {
        save_in(&self.path, record)
    }

    /// Every machine directory under `root` (complete ones only).
    ///
    /// Only directories named by a UID count: `<uid>.partial` holds a `state.json`
    /// too, from the moment its record is written until it is renamed into place (or
    /// for good, if the operator died in between), and is no machine. Listed, it would
    /// be offered to a restored object (`made_for`) as a machine whose directory does
    /// not exist.
    pub fn all(root: &Path) -> Vec<VmDir> {
        let Ok(entries) = std::fs::read_dir(root) else {
            return Vec::new();
        };
        entries
            .filter_map(Result::ok)
            .filter(|e| {
                e.file_name()
                    .to_str()
                    .is_some_and(|name| Self::new(root, name).is_ok())
            })
            .filter(|e| e.path().join("state.json").is_file())
            .map(|e| VmDir { path: e.path() })
            .collect()
    }
}

/// Writes `state.json` into `dir` atomically.
pub fn save_in(dir: &Path, record: &Record) -> Result<(), BackendError> {
    let path = dir.join("state.json");
    let tmp = dir.join("state.json.tmp");
    let bytes = serde_json::to_vec_pretty(record)
        .map_err(|e| BackendError::terminal("CorruptState", e.to_string()))?;
    std::fs::write(&tmp, bytes).map_err(|e| io("writing", &tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| io("renaming", &path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saves_and_loads() {
        let root = tempfile::tempdir().unwrap();
        let dir = VmDir::new(root.path(), "0a1b-2c").unwrap();
        assert_eq!(dir.load().unwrap(), None);
        std::fs::create_dir(dir.path()).unwrap();
        let record = Record {
            uid: "0a1b-2c".into(),
            pid: Some(42),
            ..Default::default()
        };
        dir.save(&record).unwrap();
        assert_eq!(dir.load().unwrap(), Some(record));
        assert_eq!(VmDir::all(root.path()), vec![dir.clone()]);
        // A machine being prepared (record written, not yet renamed into place) is
        // not one yet.
        std::fs::create_dir(dir.partial()).unwrap();
        save_in(&dir.partial(), &dir.load().unwrap().unwrap()).unwrap();
        assert_eq!(VmDir::all(root.path()), vec![dir.clone()]);
        assert!(VmDir::new(root.path(), "../etc").is_err());
        assert_eq!(dir.partial(), root.path().join("0a1b-2c.partial"));
        assert_eq!(dir.imported(), root.path().join("0a1b-2c.imported"));
    }

    #[test]
    fn an_adopting_object_owns_the_machine_and_the_first_one_owns_it_back() {
        use banlieue_sdk::backend::MachineIdentity;
        let mut record = Record {
            uid: "first".into(),
            namespace: "ns".into(),
            name: "m".into(),
            ..Default::default()
        };
        // (who ensures it, changed, the owner after)
        let cases = [
            (MachineIdentity::new("first", "ns", "m"), false, "first"),
            (MachineIdentity::new("moved", "ns", "m"), true, "moved"),
            (MachineIdentity::new("moved", "ns", "m"), false, "moved"),
            (MachineIdentity::new("moved", "other", "m2"), true, "moved"),
            (MachineIdentity::new("first", "ns", "m"), true, "first"),
        ];
        for (identity, changed, owner) in cases {
            assert_eq!(record.adopt(&identity), changed, "{identity:?}");
            assert_eq!(record.owner_uid(), owner);
            assert_eq!(
                (&*record.namespace, &*record.name),
                (&*identity.namespace, &*identity.name)
            );
        }
        assert_eq!(record.owner, None);
    }
}
