//! Property tests tying each Rust type to the schema it publishes: objects generated
//! from a CRD's own OpenAPI schema deserialize into the Rust type, survive a JSON
//! round trip unchanged, and serialize back into something the schema describes
//! (no field the schema lacks, no enum value it does not list).

use banlieue_sdk::api::infra::{
    cloud_hypervisor as ch, libvirt as lv, proxmox as px, vsphere as vs,
};
use banlieue_sdk::api::{Provider, VMClass, VMImage, VirtualMachine};
use kube::{CustomResourceExt, Resource};
use proptest::prelude::*;
use serde::{Serialize, de::DeserializeOwned};
use serde_json::{Map, Value, json};

const MAX_DEPTH: usize = 12;

/// A strategy for values matching `schema` (a structural CRD schema as JSON).
fn value_for(schema: &Value, depth: usize) -> BoxedStrategy<Value> {
    if let Some(options) = schema.get("enum").and_then(Value::as_array) {
        return proptest::sample::select(options.clone()).boxed();
    }
    if schema.get("x-kubernetes-int-or-string") == Some(&json!(true)) {
        return prop_oneof![
            Just(json!("1")),
            Just(json!("500m")),
            Just(json!("4Gi")),
            Just(json!("20"))
        ]
        .boxed();
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("object") => object_for(schema, depth),
        Some("array") => {
            let items = schema
                .get("items")
                .cloned()
                .unwrap_or(json!({"type": "string"}));
            let min = schema.get("minItems").and_then(Value::as_u64).unwrap_or(0) as usize;
            let max = schema
                .get("maxItems")
                .and_then(Value::as_u64)
                .map_or(3, |m| (m as usize).min(3))
                .max(min);
            let max = if depth >= MAX_DEPTH { min } else { max };
            proptest::collection::vec(value_for(&items, depth + 1), min..=max)
                .prop_map(Value::Array)
                .boxed()
        }
        Some("string") => string_for(schema),
        Some("integer") => {
            let min = schema
                .get("minimum")
                .and_then(Value::as_f64)
                .unwrap_or(-1_000.0) as i64;
            let max = schema
                .get("maximum")
                .and_then(Value::as_f64)
                .unwrap_or(1_000_000.0) as i64;
            let min = if schema
                .get("format")
                .and_then(Value::as_str)
                .is_some_and(|f| f.starts_with('u'))
            {
                min.max(0)
            } else {
                min
            };
            (min..=max.max(min)).prop_map(|n| json!(n)).boxed()
        }
        Some("number") => (0.0f64..1e6).prop_map(|n| json!(n)).boxed(),
        Some("boolean") => any::<bool>().prop_map(Value::Bool).boxed(),
        _ => Just(json!({})).boxed(),
    }
}

fn string_for(schema: &Value) -> BoxedStrategy<Value> {
    match schema.get("format").and_then(Value::as_str) {
        Some("date-time") => prop_oneof![
            Just(json!("2026-11-29T17:22:07Z")),
            Just(json!("1999-01-01T00:00:00Z"))
        ]
        .boxed(),
        _ if schema.get("pattern").is_some() => {
            // A pattern is the whole string's (anchored), as the API server reads it.
            let pattern = schema["pattern"].as_str().expect("pattern is a string");
            let inner = pattern.trim_start_matches('^').trim_end_matches('$');
            let max = schema
                .get("maxLength")
                .and_then(Value::as_u64)
                .unwrap_or(64) as usize;
            proptest::string::string_regex(inner)
                .expect("a pattern proptest can generate from")
                .prop_filter("within maxLength", move |s| s.len() <= max)
                .prop_map(Value::String)
                .boxed()
        }
        _ => {
            let min = schema.get("minLength").and_then(Value::as_u64).unwrap_or(0) as usize;
            let max = schema
                .get("maxLength")
                .and_then(Value::as_u64)
                .map_or(12, |m| (m as usize).min(12))
                .max(min);
            proptest::string::string_regex(&format!("[a-z0-9./:-]{{{min},{max}}}"))
                .expect("regex")
                .prop_map(Value::String)
                .boxed()
        }
    }
}

fn object_for(schema: &Value, depth: usize) -> BoxedStrategy<Value> {
    if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
        let required: Vec<&str> = schema
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut fields: Vec<BoxedStrategy<Option<(String, Value)>>> = Vec::new();
        for (name, property) in properties {
            let name = name.clone();
            let value = value_for(property, depth + 1);
            if required.contains(&name.as_str()) {
                fields.push(value.prop_map(move |v| Some((name.clone(), v))).boxed());
            } else if depth < MAX_DEPTH {
                fields
                    .push(proptest::option::of(value.prop_map(move |v| (name.clone(), v))).boxed());
            }
        }
        return fields
            .prop_map(|entries| Value::Object(entries.into_iter().flatten().collect::<Map<_, _>>()))
            .boxed();
    }
    if let Some(values) = schema.get("additionalProperties").filter(|v| v.is_object()) {
        let values = values.clone();
        return proptest::collection::btree_map(
            "[a-z][a-z0-9.-]{0,8}",
            value_for(&values, depth + 1),
            0..3,
        )
        .prop_map(|m| Value::Object(m.into_iter().collect()))
        .boxed();
    }
    Just(json!({})).boxed()
}

/// Every key and enum value in `value` is described by `schema`.
fn conforms(value: &Value, schema: &Value, path: &str) -> Result<(), String> {
    if let Some(options) = schema.get("enum").and_then(Value::as_array)
        && !options.contains(value)
    {
        return Err(format!(
            "{path}: {value} is not in the schema's enum {options:?}"
        ));
    }
    match value {
        Value::Object(map) => {
            let properties = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties");
            let preserve = schema.get("x-kubernetes-preserve-unknown-fields") == Some(&json!(true));
            for (key, child) in map {
                match (properties.and_then(|p| p.get(key)), additional) {
                    (Some(property), _) => conforms(child, property, &format!("{path}.{key}"))?,
                    (None, Some(additional)) if additional.is_object() => {
                        conforms(child, additional, &format!("{path}.{key}"))?
                    }
                    _ if preserve || (properties.is_none() && additional.is_none()) => {}
                    _ => {
                        return Err(format!(
                            "{path}.{key}: the type writes a field the schema lacks"
                        ));
                    }
                }
            }
            Ok(())
        }
        Value::Array(items) => {
            let item_schema = schema.get("items").cloned().unwrap_or(json!({}));
            items
                .iter()
                .enumerate()
                .try_for_each(|(i, item)| conforms(item, &item_schema, &format!("{path}[{i}]")))
        }
        _ => Ok(()),
    }
}

fn schema_of<K: CustomResourceExt>() -> Value {
    let crd = serde_json::to_value(K::crd()).expect("CRD as JSON");
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

fn objects_of<K>() -> impl Strategy<Value = Value>
where
    K: CustomResourceExt + Resource<DynamicType = ()>,
{
    let schema = schema_of::<K>();
    let mut without_metadata = schema.clone();
    without_metadata["properties"]
        .as_object_mut()
        .expect("properties")
        .remove("metadata");
    value_for(&without_metadata, 0).prop_map(|mut object| {
        object["apiVersion"] = json!(K::api_version(&()));
        object["kind"] = json!(K::kind(&()));
        object["metadata"] = json!({"name": "generated", "namespace": "default"});
        object
    })
}

fn round_trips<K>(object: Value) -> Result<(), TestCaseError>
where
    K: CustomResourceExt
        + Resource<DynamicType = ()>
        + Serialize
        + DeserializeOwned
        + PartialEq
        + std::fmt::Debug,
{
    let typed: K = serde_json::from_value(object.clone()).map_err(|e| {
        TestCaseError::fail(format!(
            "schema-valid {} does not deserialize: {e}\n{object:#}",
            K::kind(&())
        ))
    })?;
    let json = serde_json::to_value(&typed).expect("serialize");
    let again: K = serde_json::from_value(json.clone()).expect("deserialize what we serialized");
    prop_assert_eq!(&typed, &again);
    let schema = schema_of::<K>();
    for part in ["spec", "status"] {
        if let Some(value) = json.get(part) {
            let path = format!("{}.{part}", K::kind(&()));
            conforms(value, &schema["properties"][part], &path).map_err(TestCaseError::fail)?;
        }
    }
    Ok(())
}

macro_rules! roundtrip_tests {
    ($($test:ident: $kind:ty),+ $(,)?) => {
        proptest! {
            #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
            $(
                #[test]
                fn $test(object in objects_of::<$kind>()) {
                    round_trips::<$kind>(object)?;
                }
            )+
        }
    };
}

roundtrip_tests! {
    provider: Provider,
    vm_class: VMClass,
    vm_image: VMImage,
    virtual_machine: VirtualMachine,
    vsphere_machine: vs::VSphereMachine,
    vsphere_machine_template: vs::VSphereMachineTemplate,
    vsphere_cluster: vs::VSphereCluster,
    vsphere_cluster_template: vs::VSphereClusterTemplate,
    proxmox_machine: px::ProxmoxMachine,
    proxmox_machine_template: px::ProxmoxMachineTemplate,
    proxmox_cluster: px::ProxmoxCluster,
    proxmox_cluster_template: px::ProxmoxClusterTemplate,
    libvirt_machine: lv::LibvirtMachine,
    libvirt_machine_template: lv::LibvirtMachineTemplate,
    libvirt_cluster: lv::LibvirtCluster,
    libvirt_cluster_template: lv::LibvirtClusterTemplate,
    cloud_hypervisor_machine: ch::CloudHypervisorMachine,
    cloud_hypervisor_machine_template: ch::CloudHypervisorMachineTemplate,
    cloud_hypervisor_cluster: ch::CloudHypervisorCluster,
    cloud_hypervisor_cluster_template: ch::CloudHypervisorClusterTemplate,
}

/// The generator covers every kind `crds::all()` serves.
#[test]
fn every_kind_has_a_roundtrip_property() {
    assert_eq!(banlieue_sdk::crds::all().len(), 20);
}
