//! Spec changes after the first configuration: CPUs, memory and added disks are
//! written with `PUT …/config`, grown disks with `PUT …/resize`. On a running VM PVE
//! keeps what it cannot hot-plug as *pending* (`GET …/pending`) until the next
//! start; the backend reports that as `RestartPending` instead of pretending the
//! VM matches its spec. It never restarts a VM on its own.

use banlieue_sdk::api::infra::proxmox::ProxmoxMachineSpec;
use serde_json::{Map, Value};

use crate::client::Form;
use crate::config::push_new_disks;

/// A VM's config as PVE reports it with its pending changes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PendingConfig {
    /// The config the next start will use (pending values over current ones,
    /// pending deletions removed).
    pub effective: Value,
    /// The config the VM has now (what `GET …/config` would say).
    pub current: Value,
    /// Keys with a change waiting for a restart, sorted.
    pub waiting: Vec<String>,
}

/// Reads `GET …/pending`'s list (`{key, value, pending, delete}`).
pub fn read_pending(data: &Value) -> PendingConfig {
    let mut effective = Map::new();
    let mut current = Map::new();
    let mut waiting = Vec::new();
    for item in data.as_array().into_iter().flatten() {
        let Some(key) = item.get("key").and_then(Value::as_str) else {
            continue;
        };
        if let Some(v) = item.get("value") {
            current.insert(key.to_string(), v.clone());
        }
        let deleted = item.get("delete").and_then(as_u64).unwrap_or(0) > 0;
        if deleted || item.get("pending").is_some() {
            waiting.push(key.to_string());
        }
        if deleted {
            continue;
        }
        if let Some(v) = item.get("pending").or_else(|| item.get("value")) {
            effective.insert(key.to_string(), v.clone());
        }
    }
    waiting.sort();
    PendingConfig {
        effective: Value::Object(effective),
        current: Value::Object(current),
        waiting,
    }
}

fn as_u64(v: &Value) -> Option<u64> {
    v.as_u64()
        .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
}

/// The config keys that differ from the spec (sockets, cores, memory, missing
/// additional disks), given the effective config; empty when nothing does.
/// PVE's defaults (1 socket, 1 core, 512 MiB) stand in for absent keys.
pub fn spec_changes(spec: &ProxmoxMachineSpec, effective: &Value) -> Form {
    let mut form = Form::new();
    let have = |key: &str, default: u64| effective.get(key).and_then(as_u64).unwrap_or(default);
    if have("sockets", 1) != u64::from(spec.sockets) {
        form.push("sockets", spec.sockets);
    }
    if have("cores", 1) != u64::from(spec.cores) {
        form.push("cores", spec.cores);
    }
    if have("memory", 512) != spec.memory_mib {
        form.push("memory", spec.memory_mib);
    }
    push_new_disks(spec, effective, &mut form);
    form
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(extra: Value) -> ProxmoxMachineSpec {
        let mut base = json!({"templateID": 9000, "cores": 2, "sockets": 1, "memoryMiB": 2048});
        for (k, v) in extra.as_object().unwrap() {
            base[k] = v.clone();
        }
        serde_json::from_value(base).unwrap()
    }

    #[test]
    fn pending_values_win_and_are_listed() {
        let data = json!([
            {"key": "cores", "value": 1, "pending": "2"},
            {"key": "memory", "value": "2048"},
            {"key": "scsi0", "value": "local-lvm:vm-101-disk-0,size=4G"},
            {"key": "scsi1", "pending": "local-lvm:5"},
            {"key": "ide3", "value": "none,media=cdrom", "delete": 1}
        ]);
        let read = read_pending(&data);
        assert_eq!(read.waiting, ["cores", "ide3", "scsi1"]);
        assert_eq!(read.effective["cores"], "2");
        assert_eq!(read.effective["scsi1"], "local-lvm:5");
        assert!(read.effective.get("ide3").is_none());
        // What the VM runs on now: values only, deletions not yet done.
        assert_eq!(read.current["cores"], 1);
        assert_eq!(read.current["ide3"], "none,media=cdrom");
        assert!(read.current.get("scsi1").is_none());
        let spec = spec(json!({"additionalDisks": [{"name": "d", "sizeGiB": 5}]}));
        assert!(spec_changes(&spec, &read.effective).is_empty());
    }

    #[test]
    fn changed_cpus_memory_and_new_disks_are_written() {
        let current = json!({"cores": 2, "sockets": 1, "memory": "1024",
                             "scsi0": "local-lvm:vm-101-disk-0,size=4G"});
        let spec = spec(json!({"cores": 4, "memoryMiB": 4096,
            "additionalDisks": [{"name": "data", "sizeGiB": 10}]}));
        assert_eq!(
            spec_changes(&spec, &current).encode(),
            "cores=4&memory=4096&scsi1=local-lvm%3A10"
        );
        let same = super::tests::spec(json!({"memoryMiB": 1024}));
        assert!(spec_changes(&same, &current).is_empty());
        // PVE omits defaults: 512 MiB, one socket, one core.
        let defaults = super::tests::spec(json!({"cores": 1, "memoryMiB": 512}));
        assert!(spec_changes(&defaults, &json!({})).is_empty());
    }
}
