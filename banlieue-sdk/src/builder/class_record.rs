//! The class record: which VMClass, as it was then, an infrastructure machine built for
//! a VM was built from, written on the machine itself ([`CLASS_ANNOTATION`]).
//!
//! A VMClass can be edited in place. Whether the VMs made from it follow is the
//! class's `updatePolicy`: with `Keep` (the default) each VM's machine goes on being
//! built from the class as its record says, so an edit resizes nothing; with `Apply`
//! it is built from the class as it is now, and the change machinery applies the
//! difference. The record is on the machine, not in the VM's status, because it must be
//! written with the hardware it describes, in the same apply (a status write that
//! fails after the machine was rebuilt would leave the two apart), and because the
//! machine is what survives a restore.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::api::{VMClass, VMClassSpec};

/// Annotation on infra machines built for a VM: the [`ClassRecord`] (JSON) of the
/// class the machine's hardware was built from.
pub const CLASS_ANNOTATION: &str = "banlieue.io/class";

/// The class a machine was built from: its name, its generation and its spec then.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClassRecord {
    /// The VMClass's name.
    pub name: String,
    /// Its `metadata.generation` then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// Its spec then: what the machine is built from while the class's `updatePolicy`
    /// is `Keep` and the class has been edited since.
    pub spec: VMClassSpec,
}

impl ClassRecord {
    /// The record of `class` as it is now.
    pub fn of(class: &VMClass) -> Self {
        Self {
            name: class.metadata.name.clone().unwrap_or_default(),
            generation: class.metadata.generation,
            spec: class.spec.clone(),
        }
    }

    /// The record a machine's annotations hold: `None` when they hold none (a machine
    /// built by an older banlieue), `Some(Err(why))` when it does not parse (edited by
    /// hand).
    pub fn read(annotations: &BTreeMap<String, String>) -> Option<Result<Self, String>> {
        let value = annotations.get(CLASS_ANNOTATION)?;
        Some(
            serde_json::from_str(value)
                .map_err(|e| format!("annotation {CLASS_ANNOTATION} does not parse: {e}")),
        )
    }

    /// Writes the record into `meta`'s annotations.
    pub fn write(&self, meta: &mut ObjectMeta) {
        let value = serde_json::to_string(self).expect("a class record serializes");
        meta.annotations
            .get_or_insert_default()
            .insert(CLASS_ANNOTATION.into(), value);
    }

    /// The fields of the class spec that differ between this record and `now`, for
    /// humans, in field order by name: `cpus 2 → 4`, `disk.sizeGiB 10 → 20`,
    /// `maxCPUs none → 8`. `updatePolicy` is left out: it says what an edit does, it
    /// is not one.
    pub fn changed_fields(&self, now: &VMClassSpec) -> Vec<String> {
        let (was, is) = (leaves(&self.spec), leaves(now));
        let mut names: Vec<&String> = was.keys().chain(is.keys()).collect();
        names.sort();
        names.dedup();
        names
            .into_iter()
            .filter(|name| name.as_str() != "updatePolicy")
            .filter_map(|name| {
                let (a, b) = (was.get(name), is.get(name));
                (a != b).then(|| {
                    let show = |v: Option<&String>| v.cloned().unwrap_or_else(|| "none".into());
                    format!("{name} {} → {}", show(a), show(b))
                })
            })
            .collect()
    }
}

/// Every leaf of `spec` as `path → value` (`disk.sizeGiB → 10`; a list is one leaf,
/// `[a, b]`).
fn leaves(spec: &VMClassSpec) -> BTreeMap<String, String> {
    fn walk(value: &Value, path: String, out: &mut BTreeMap<String, String>) {
        match value {
            Value::Object(map) => {
                for (key, value) in map {
                    let next = if path.is_empty() {
                        key.clone()
                    } else {
                        format!("{path}.{key}")
                    };
                    walk(value, next, out);
                }
            }
            Value::Null => {}
            other => {
                out.insert(path, show(other));
            }
        }
    }
    fn show(value: &Value) -> String {
        match value {
            Value::String(s) => s.clone(),
            Value::Array(items) => format!(
                "[{}]",
                items.iter().map(show).collect::<Vec<_>>().join(", ")
            ),
            other => other.to_string(),
        }
    }
    let mut out = BTreeMap::new();
    walk(
        &serde_json::to_value(spec).unwrap_or_default(),
        String::new(),
        &mut out,
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ClassUpdatePolicy;
    use crate::api::vm_class::OsDisk;

    fn spec(cpus: u32, memory: u64) -> VMClassSpec {
        VMClassSpec {
            cpus,
            max_cpus: None,
            cores_per_socket: None,
            memory_mib: memory,
            max_memory_mib: None,
            firmware: Default::default(),
            disk: OsDisk {
                size_gib: 10,
                provisioning: Default::default(),
                storage_class: None,
            },
            required_features: vec![],
            update_policy: Default::default(),
        }
    }

    fn record(spec: VMClassSpec) -> ClassRecord {
        ClassRecord {
            name: "small".into(),
            generation: Some(1),
            spec,
        }
    }

    #[test]
    fn it_is_written_and_read_back_from_the_annotations() {
        let r = record(spec(2, 1024));
        let mut meta = ObjectMeta::default();
        r.write(&mut meta);
        let annotations = meta.annotations.unwrap();
        assert_eq!(ClassRecord::read(&annotations), Some(Ok(r)));
        assert_eq!(ClassRecord::read(&BTreeMap::new()), None, "no record");
        let edited = BTreeMap::from([(CLASS_ANNOTATION.to_string(), "{".to_string())]);
        let why = ClassRecord::read(&edited).unwrap().unwrap_err();
        assert!(why.contains(CLASS_ANNOTATION), "{why}");
    }

    #[test]
    fn changed_fields_name_each_difference_but_the_policy() {
        let r = record(spec(2, 1024));
        assert!(r.changed_fields(&spec(2, 1024)).is_empty());
        let mut now = spec(4, 2048);
        now.max_cpus = Some(8);
        now.disk.size_gib = 20;
        now.required_features = vec!["gpu".into(), "nested".into()];
        now.update_policy = ClassUpdatePolicy::Apply;
        assert_eq!(
            r.changed_fields(&now),
            [
                "cpus 2 → 4",
                "disk.sizeGiB 10 → 20",
                "maxCPUs none → 8",
                "memoryMiB 1024 → 2048",
                "requiredFeatures none → [gpu, nested]",
            ]
        );
        let mut only_policy = spec(2, 1024);
        only_policy.update_policy = ClassUpdatePolicy::Apply;
        assert!(r.changed_fields(&only_policy).is_empty());
    }
}
