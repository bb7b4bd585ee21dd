//! Flattens a CRD's OpenAPI v3 schema into one row per field, for the reference tables.

use serde_json::{Map, Value};

/// One field of a schema, at its dotted path (`spec.placement.providerRef.name`;
/// `[]` for list items, `*` for map values).
pub struct Field {
    pub path: String,
    pub ty: String,
    pub required: bool,
    pub description: String,
    pub constraints: Vec<String>,
}

/// A CEL rule (`x-kubernetes-validations`) and the field it sits on.
pub struct Rule {
    pub path: String,
    pub rule: String,
    pub message: String,
}

/// Every field under `root` (the `spec` or `status` schema), depth first in the
/// schema's own (alphabetical) property order, plus the CEL rules met on the way.
pub fn flatten(prefix: &str, root: &Value) -> (Vec<Field>, Vec<Rule>) {
    let mut out = (Vec::new(), Vec::new());
    collect_rules(prefix, root, &mut out.1);
    walk_children(prefix, root, &mut out);
    out
}

fn walk_children(path: &str, schema: &Value, out: &mut (Vec<Field>, Vec<Rule>)) {
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        let required = string_list(schema.get("required"));
        for (name, child) in props {
            let child_path = format!("{path}.{name}");
            push(&child_path, child, required.contains(name), out);
        }
    }
    if let Some(items) = schema.get("items") {
        // The item itself is a row only when it is not an object (an object's fields
        // are its rows); its path says "each element".
        let item_path = format!("{path}[]");
        if has_fields(items) {
            collect_rules(&item_path, items, &mut out.1);
            walk_children(&item_path, items, out);
        }
    }
    if let Some(values) = schema.get("additionalProperties").filter(|v| v.is_object()) {
        let value_path = format!("{path}.*");
        if has_fields(values) {
            collect_rules(&value_path, values, &mut out.1);
            walk_children(&value_path, values, out);
        }
    }
}

fn push(path: &str, schema: &Value, required: bool, out: &mut (Vec<Field>, Vec<Rule>)) {
    out.0.push(Field {
        path: path.to_owned(),
        ty: type_of(schema),
        required,
        description: text(schema.get("description")).to_owned(),
        constraints: constraints(schema),
    });
    collect_rules(path, schema, &mut out.1);
    walk_children(path, schema, out);
}

fn has_fields(schema: &Value) -> bool {
    schema.get("properties").is_some()
        || schema.get("items").is_some()
        || schema
            .get("additionalProperties")
            .is_some_and(Value::is_object)
}

/// `string`, `[]object`, `map[string]integer`, `int-or-string`, ...
fn type_of(schema: &Value) -> String {
    if schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
        return "int-or-string".into();
    }
    let base = text(schema.get("type"));
    match base {
        "array" => format!("[]{}", schema.get("items").map(type_of).unwrap_or_default()),
        "object" => match schema.get("additionalProperties") {
            Some(values) if values.is_object() => format!("map[string]{}", type_of(values)),
            _ if schema.get("properties").is_none()
                && schema.get("x-kubernetes-preserve-unknown-fields")
                    == Some(&Value::Bool(true)) =>
            {
                "object (free-form)".into()
            }
            _ => "object".into(),
        },
        "" => "any".into(),
        other => match text(schema.get("format")) {
            "" => other.into(),
            format => format!("{other} ({format})"),
        },
    }
}

fn constraints(schema: &Value) -> Vec<String> {
    let obj = match schema.as_object() {
        Some(obj) => obj,
        None => return Vec::new(),
    };
    let mut out = Vec::new();
    if let Some(values) = obj.get("enum").and_then(Value::as_array) {
        let values: Vec<String> = values.iter().map(|v| format!("`{}`", scalar(v))).collect();
        out.push(format!("one of {}", values.join(", ")));
    }
    // The array's own bounds; its items' bounds are shown with "items".
    bound(obj, "minimum", "exclusiveMinimum", ">", "≥", &mut out);
    bound(obj, "maximum", "exclusiveMaximum", "<", "≤", &mut out);
    for (key, label) in [
        ("minLength", "min length"),
        ("maxLength", "max length"),
        ("minItems", "min items"),
        ("maxItems", "max items"),
        ("minProperties", "min properties"),
        ("maxProperties", "max properties"),
    ] {
        if let Some(n) = obj.get(key) {
            out.push(format!("{label} {}", scalar(n)));
        }
    }
    if let Some(pattern) = obj.get("pattern") {
        out.push(format!("pattern `{}`", scalar(pattern)));
    }
    if let Some(default) = obj.get("default") {
        out.push(format!("default `{}`", scalar(default)));
    }
    if let Some(items) = obj.get("items").and_then(Value::as_object) {
        let inner = constraints(&Value::Object(items.clone()));
        if !inner.is_empty() && items.get("properties").is_none() {
            out.push(format!("items: {}", inner.join(", ")));
        }
    }
    match text(obj.get("x-kubernetes-list-type")) {
        "" | "atomic" => {}
        "map" => out.push(format!(
            "list map, key {}",
            string_list(obj.get("x-kubernetes-list-map-keys"))
                .iter()
                .map(|k| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", ")
        )),
        "set" => out.push("unique items".into()),
        other => out.push(format!("list type `{other}`")),
    }
    out
}

fn bound(
    obj: &Map<String, Value>,
    key: &str,
    exclusive_key: &str,
    strict: &str,
    inclusive: &str,
    out: &mut Vec<String>,
) {
    if let Some(n) = obj.get(key) {
        let op = if obj.get(exclusive_key) == Some(&Value::Bool(true)) {
            strict
        } else {
            inclusive
        };
        out.push(format!("{op} {}", scalar(n)));
    }
}

fn collect_rules(path: &str, schema: &Value, rules: &mut Vec<Rule>) {
    for rule in schema
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        rules.push(Rule {
            path: path.to_owned(),
            rule: text(rule.get("rule")).to_owned(),
            message: match text(rule.get("message")) {
                "" => text(rule.get("messageExpression")).to_owned(),
                message => message.to_owned(),
            },
        });
    }
}

fn text(value: Option<&Value>) -> &str {
    value.and_then(Value::as_str).unwrap_or_default()
}

fn scalar(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        // Bounds are stored as floats (`1.0`); a whole number reads better as one.
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 1e15 => format!("{}", f as i64),
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

fn string_list(value: Option<&Value>) -> Vec<String> {
    value
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn flattens_objects_lists_and_maps_with_their_constraints() {
        let schema = json!({
            "type": "object",
            "required": ["name"],
            "x-kubernetes-validations": [{"rule": "self.a == self.b", "message": "a must equal b"}],
            "properties": {
                "name": {"type": "string", "maxLength": 63, "description": "The name."},
                "mode": {"type": "string", "enum": ["A", "B"], "default": "A"},
                "size": {"type": "integer", "format": "int32", "minimum": 1.0, "maximum": 8},
                "tags": {"type": "array", "items": {"type": "string", "minLength": 1}, "x-kubernetes-list-type": "set"},
                "disks": {"type": "array", "items": {"type": "object", "properties": {"gib": {"type": "integer"}}}},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}}
            }
        });
        let (fields, rules) = flatten("spec", &schema);
        let rows: Vec<(&str, &str, bool, String)> = fields
            .iter()
            .map(|f| {
                (
                    f.path.as_str(),
                    f.ty.as_str(),
                    f.required,
                    f.constraints.join("; "),
                )
            })
            .collect();
        assert_eq!(
            rows,
            vec![
                ("spec.disks", "[]object", false, String::new()),
                ("spec.disks[].gib", "integer", false, String::new()),
                ("spec.labels", "map[string]string", false, String::new()),
                (
                    "spec.mode",
                    "string",
                    false,
                    "one of `A`, `B`; default `A`".into()
                ),
                ("spec.name", "string", true, "max length 63".into()),
                ("spec.size", "integer (int32)", false, "≥ 1; ≤ 8".into()),
                (
                    "spec.tags",
                    "[]string",
                    false,
                    "items: min length 1; unique items".into()
                ),
            ]
        );
        assert_eq!(fields[4].description, "The name.");
        assert_eq!(rules.len(), 1);
        assert_eq!(
            (rules[0].path.as_str(), rules[0].message.as_str()),
            ("spec", "a must equal b")
        );
    }
}
