//! A small OpenAPI 3.0 validator, enough for Cloud Hypervisor's document: operations
//! by path and method, request bodies, declared responses, and the JSON Schema subset
//! the document uses (`$ref`, `type`, `properties`, `required`, `items`,
//! `additionalProperties`, `enum`, `minimum`, `maximum`, integer `format`s).
//!
//! It is strict where the document is silent: an object property the schema does not
//! name is a violation (unless `additionalProperties` allows it), because a field the
//! spec does not know is exactly the drift these tests exist to catch.

use serde_json::Value;

/// The prefix every operation path is served under (`servers[0].url`).
pub const BASE: &str = "/api/v1";

/// A parsed OpenAPI document.
#[derive(Clone, Debug)]
pub struct Spec {
    doc: Value,
}

/// The Cloud Hypervisor document bundled with this crate.
pub const BUNDLED: &str = include_str!("../cloud-hypervisor.yaml");

impl Spec {
    /// The bundled Cloud Hypervisor document.
    pub fn bundled() -> Self {
        Self::parse(BUNDLED).unwrap_or_else(|e| panic!("the bundled OpenAPI document: {e}"))
    }

    /// Parses a YAML (or JSON) OpenAPI document.
    pub fn parse(text: &str) -> Result<Self, String> {
        let doc: Value = serde_saphyr::from_str(text).map_err(|e| e.to_string())?;
        if doc.get("openapi").and_then(Value::as_str).is_none() || !doc["paths"].is_object() {
            return Err("not an OpenAPI 3 document (no openapi or paths)".into());
        }
        let spec = Self { doc };
        // A keyword this validator does not implement would be silently ignored, and
        // the fake would pass bodies the document rejects: refuse such a document.
        let unsupported = spec.unsupported_keywords();
        if !unsupported.is_empty() {
            return Err(format!(
                "the document uses schema keywords this validator does not implement: {unsupported:?}"
            ));
        }
        let broken = spec.broken_refs();
        if !broken.is_empty() {
            return Err(format!("unresolvable $refs: {broken:?}"));
        }
        Ok(spec)
    }

    /// Schema keywords used anywhere in `components.schemas` or in operation bodies
    /// that [`Spec::validate`] does not implement (annotations such as `description`
    /// are fine).
    pub fn unsupported_keywords(&self) -> std::collections::BTreeSet<String> {
        const KNOWN: &[&str] = &[
            "$ref",
            "type",
            "properties",
            "required",
            "items",
            "additionalProperties",
            "enum",
            "minimum",
            "maximum",
            "minLength",
            "maxLength",
            "format",
            "nullable",
            // Annotations: no effect on validity.
            "description",
            "default",
            "deprecated",
            "readOnly",
            "writeOnly",
            "example",
            "title",
        ];
        let mut found = std::collections::BTreeSet::new();
        let mut schemas: Vec<&Value> = Vec::new();
        if let Some(all) = self.doc["components"]["schemas"].as_object() {
            schemas.extend(all.values());
        }
        for item in self.doc["paths"]
            .as_object()
            .into_iter()
            .flat_map(|p| p.values())
        {
            for op in item.as_object().into_iter().flat_map(|o| o.values()) {
                for content in [&op["requestBody"]["content"]].into_iter().chain(
                    op["responses"]
                        .as_object()
                        .into_iter()
                        .flat_map(|r| r.values())
                        .map(|r| &r["content"]),
                ) {
                    if let Some(media) = content.as_object() {
                        schemas.extend(media.values().map(|m| &m["schema"]));
                    }
                }
            }
        }
        while let Some(schema) = schemas.pop() {
            let Some(object) = schema.as_object() else {
                continue;
            };
            for (key, value) in object {
                if !KNOWN.contains(&key.as_str()) {
                    found.insert(key.clone());
                }
                match key.as_str() {
                    "properties" => {
                        schemas.extend(value.as_object().into_iter().flat_map(|p| p.values()))
                    }
                    "items" | "additionalProperties" => schemas.push(value),
                    _ => {}
                }
            }
        }
        found
    }

    /// Every `$ref` in the document that does not resolve.
    pub fn broken_refs(&self) -> Vec<String> {
        let mut broken = Vec::new();
        let mut stack = vec![&self.doc];
        while let Some(value) = stack.pop() {
            match value {
                Value::Object(map) => {
                    if let Some(r) = map.get("$ref").and_then(Value::as_str)
                        && self.resolve(r).is_none()
                    {
                        broken.push(r.to_owned());
                    }
                    stack.extend(map.values());
                }
                Value::Array(items) => stack.extend(items),
                _ => {}
            }
        }
        broken
    }

    /// `info.version`.
    pub fn version(&self) -> &str {
        self.doc["info"]["version"].as_str().unwrap_or("?")
    }

    /// The operation object for `method` on `path` (with or without [`BASE`]).
    pub fn operation(&self, method: &str, path: &str) -> Option<&Value> {
        let path = path.strip_prefix(BASE).unwrap_or(path);
        self.doc["paths"]
            .get(path)?
            .get(method.to_ascii_lowercase())
    }

    /// Violations of one request: unknown operation, missing or unexpected body,
    /// wrong content type, body not matching the schema.
    pub fn check_request(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: &[u8],
    ) -> Vec<String> {
        let mut errors = Vec::new();
        let Some(op) = self.operation(method, path) else {
            errors.push(format!(
                "{method} {path}: no such operation in the OpenAPI document"
            ));
            return errors;
        };
        let declared = op.get("requestBody");
        match declared {
            None if !body.is_empty() => errors.push(format!(
                "{method} {path}: the operation takes no request body, got {} bytes",
                body.len()
            )),
            None => {}
            Some(rb) if body.is_empty() && rb["required"].as_bool().unwrap_or(false) => {
                errors.push(format!("{method} {path}: the request body is required"))
            }
            Some(_) if body.is_empty() => {}
            Some(rb) => {
                let media = content_type
                    .unwrap_or("")
                    .split(';')
                    .next()
                    .unwrap_or("")
                    .trim();
                match rb["content"].get(media) {
                    None => errors.push(format!(
                        "{method} {path}: content type {media:?} is not declared"
                    )),
                    Some(content) => {
                        self.check_json(&content["schema"], body, "request", &mut errors)
                    }
                }
            }
        }
        errors
    }

    /// Violations of one response. Success statuses must be declared, with a body
    /// exactly when the document gives one. Error statuses need not be declared
    /// (OpenAPI responses are not exhaustive, and CH's document leaves most out), but
    /// their body must be Cloud Hypervisor's error format: a JSON array of strings.
    pub fn check_response(
        &self,
        method: &str,
        path: &str,
        status: u16,
        body: &[u8],
    ) -> Vec<String> {
        let mut errors = Vec::new();
        let Some(op) = self.operation(method, path) else {
            // The request was already reported; a 404 for it is the right answer.
            return errors;
        };
        let declared = op["responses"]
            .get(status.to_string())
            .or_else(|| op["responses"].get("default"));
        if !(200..300).contains(&status) {
            if !body.is_empty() {
                match serde_json::from_slice::<Value>(body) {
                    Ok(Value::Array(items)) if items.iter().all(Value::is_string) => {}
                    _ => errors.push(format!(
                        "{method} {path} → {status}: an error body must be a JSON array of strings"
                    )),
                }
            }
            return errors;
        }
        let Some(declared) = declared else {
            errors.push(format!(
                "{method} {path} → {status}: status not declared by the OpenAPI document"
            ));
            return errors;
        };
        match declared["content"].get("application/json") {
            None if !body.is_empty() => errors.push(format!(
                "{method} {path} → {status}: the document declares no body, got {} bytes",
                body.len()
            )),
            None => {}
            Some(_) if body.is_empty() => errors.push(format!(
                "{method} {path} → {status}: the document declares a body, got none"
            )),
            Some(content) => self.check_json(&content["schema"], body, "response", &mut errors),
        }
        errors
    }

    fn check_json(&self, schema: &Value, body: &[u8], what: &str, errors: &mut Vec<String>) {
        match serde_json::from_slice::<Value>(body) {
            Err(e) => errors.push(format!("{what} body is not JSON: {e}")),
            Ok(value) => self.validate(schema, &value, what, errors),
        }
    }

    /// Validates `value` against `schema`, pushing one message per violation, each
    /// naming the JSON path (`at`).
    pub fn validate(&self, schema: &Value, value: &Value, at: &str, errors: &mut Vec<String>) {
        if let Some(reference) = schema.get("$ref").and_then(Value::as_str) {
            match self.resolve(reference) {
                Some(target) => self.validate(target, value, at, errors),
                None => errors.push(format!("{at}: unresolvable $ref {reference}")),
            }
            return;
        }
        if value.is_null() && schema["nullable"].as_bool() == Some(true) {
            return;
        }
        if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
            && !allowed.contains(value)
        {
            errors.push(format!("{at}: {value} is not one of {allowed:?}"));
        }
        let ty = schema.get("type").and_then(Value::as_str);
        match ty {
            Some("object") => self.validate_object(schema, value, at, errors),
            Some("array") => match value.as_array() {
                None => errors.push(format!("{at}: expected an array, got {value}")),
                Some(items) => {
                    for (i, item) in items.iter().enumerate() {
                        self.validate(&schema["items"], item, &format!("{at}[{i}]"), errors);
                    }
                }
            },
            Some("string") => match value.as_str() {
                None => errors.push(format!("{at}: expected a string, got {value}")),
                Some(text) => {
                    let len = text.chars().count() as u64;
                    if let Some(min) = schema.get("minLength").and_then(Value::as_u64)
                        && len < min
                    {
                        errors.push(format!("{at}: {text:?} is shorter than {min}"));
                    }
                    if let Some(max) = schema.get("maxLength").and_then(Value::as_u64)
                        && len > max
                    {
                        errors.push(format!("{at}: {text:?} is longer than {max}"));
                    }
                }
            },
            Some("boolean") if !value.is_boolean() => {
                errors.push(format!("{at}: expected a boolean, got {value}"))
            }
            Some("number") if !value.is_number() => {
                errors.push(format!("{at}: expected a number, got {value}"))
            }
            Some("integer") => validate_integer(schema, value, at, errors),
            Some("boolean" | "number") | None => {}
            Some(other) => errors.push(format!("{at}: the schema has unknown type {other:?}")),
        }
        if ty == Some("number") {
            check_bounds(schema, value.as_f64(), at, errors);
        }
    }

    fn validate_object(&self, schema: &Value, value: &Value, at: &str, errors: &mut Vec<String>) {
        let Some(object) = value.as_object() else {
            errors.push(format!("{at}: expected an object, got {value}"));
            return;
        };
        for name in schema["required"].as_array().into_iter().flatten() {
            if let Some(name) = name.as_str()
                && !object.contains_key(name)
            {
                errors.push(format!("{at}: required property {name:?} is missing"));
            }
        }
        let properties = schema.get("properties").and_then(Value::as_object);
        for (name, item) in object {
            let path = format!("{at}.{name}");
            match properties.and_then(|p| p.get(name)) {
                Some(property) => self.validate(property, item, &path, errors),
                None => match schema.get("additionalProperties") {
                    Some(Value::Bool(true)) => {}
                    Some(extra) if extra.is_object() => self.validate(extra, item, &path, errors),
                    // An untyped object (`type: object` only) takes anything: CH uses
                    // it for Rust enums it cannot describe.
                    _ if properties.is_none() => {}
                    _ => errors.push(format!("{path}: property not in the schema")),
                },
            }
        }
    }

    fn resolve(&self, reference: &str) -> Option<&Value> {
        let pointer = reference.strip_prefix('#')?;
        self.doc.pointer(pointer)
    }
}

fn validate_integer(schema: &Value, value: &Value, at: &str, errors: &mut Vec<String>) {
    let Some(n) = value
        .as_i64()
        .map(i128::from)
        .or(value.as_u64().map(i128::from))
    else {
        errors.push(format!("{at}: expected an integer, got {value}"));
        return;
    };
    let range: Option<(i128, i128)> = match schema.get("format").and_then(Value::as_str) {
        Some("int8") => Some((i8::MIN.into(), i8::MAX.into())),
        Some("int16") => Some((i16::MIN.into(), i16::MAX.into())),
        Some("int32") => Some((i32::MIN.into(), i32::MAX.into())),
        Some("int64") => Some((i64::MIN.into(), i64::MAX.into())),
        Some("uint8") => Some((0, u8::MAX.into())),
        Some("uint16") => Some((0, u16::MAX.into())),
        Some("uint32") => Some((0, u32::MAX.into())),
        Some("uint64") => Some((0, u64::MAX.into())),
        _ => None,
    };
    if let Some((lo, hi)) = range
        && !(lo..=hi).contains(&n)
    {
        errors.push(format!(
            "{at}: {n} is out of range for format {}",
            schema["format"]
        ));
    }
    check_bounds(schema, Some(n as f64), at, errors);
}

fn check_bounds(schema: &Value, n: Option<f64>, at: &str, errors: &mut Vec<String>) {
    let Some(n) = n else { return };
    if let Some(min) = schema.get("minimum").and_then(Value::as_f64)
        && n < min
    {
        errors.push(format!("{at}: {n} is below the minimum {min}"));
    }
    if let Some(max) = schema.get("maximum").and_then(Value::as_f64)
        && n > max
    {
        errors.push(format!("{at}: {n} is above the maximum {max}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(body: Value) -> Vec<String> {
        Spec::bundled().check_request(
            "PUT",
            "/api/v1/vm.create",
            Some("application/json"),
            body.to_string().as_bytes(),
        )
    }

    #[test]
    fn loads_the_bundled_document() {
        let spec = Spec::bundled();
        assert_eq!(spec.version(), "0.3.0");
        assert!(spec.operation("PUT", "/api/v1/vm.create").is_some());
        assert!(spec.operation("GET", "/api/v1/vm.create").is_none());
        assert!(spec.operation("GET", "/vmm.ping").is_some());
    }

    #[test]
    fn refuses_documents_it_cannot_check_fully() {
        assert!(Spec::bundled().unsupported_keywords().is_empty());
        assert!(Spec::bundled().broken_refs().is_empty());
        let one_of = BUNDLED.replace(
            "    VmState:\n      type: string",
            "    VmState:\n      oneOf: [{type: string}]\n      type: string",
        );
        assert_ne!(one_of, BUNDLED);
        let e = Spec::parse(&one_of).unwrap_err();
        assert!(e.contains("oneOf"), "{e}");
        let dangling = BUNDLED.replacen(
            "#/components/schemas/VmState",
            "#/components/schemas/Nope",
            1,
        );
        let e = Spec::parse(&dangling).unwrap_err();
        assert!(e.contains("Nope"), "{e}");
    }

    #[test]
    fn a_good_config_passes() {
        let errors = request(json!({
            "payload": {"kernel": "/k", "cmdline": "console=ttyS0"},
            "cpus": {"boot_vcpus": 2, "max_vcpus": 2},
            "memory": {"size": 1073741824u64},
            "disks": [{"path": "/d.raw", "image_type": "Raw"}],
            "net": [{"mac": "52:54:00:00:00:01", "tap": "tap0"}],
            "serial": {"mode": "File", "file": "/s.log"},
            "console": {"mode": "Off"}
        }));
        assert_eq!(errors, Vec::<String>::new());
    }

    #[test]
    fn bad_bodies_fail() {
        // Missing the required payload.
        let e = request(json!({"cpus": {"boot_vcpus": 1, "max_vcpus": 1}}));
        assert!(
            e.iter().any(|e| e.contains("\"payload\" is missing")),
            "{e:?}"
        );
        // Wrong type, below minimum, bad enum, unknown property, out-of-range format.
        let e = request(json!({
            "payload": {"kernel": 5},
            "cpus": {"boot_vcpus": 0, "max_vcpus": "two"},
            "disks": [{"path": "/d", "image_type": "Iso", "pci_device_id": 300}],
            "console": {"mode": "Off", "colour": "red"},
            "memory": {"size": 1.5}
        }));
        for needle in [
            "request.payload.kernel: expected a string",
            "request.cpus.boot_vcpus: 0 is below the minimum 1",
            "request.cpus.max_vcpus: expected an integer",
            "request.disks[0].image_type: \"Iso\" is not one of",
            "request.disks[0].pci_device_id: 300 is out of range",
            "request.console.colour: property not in the schema",
            "request.memory.size: expected an integer",
        ] {
            assert!(
                e.iter().any(|e| e.contains(needle)),
                "{needle} not in {e:#?}"
            );
        }
        // minLength (VmMemoryZoneUpdateData.id).
        let mut e = Vec::new();
        let spec = Spec::bundled();
        let schema = json!({"$ref": "#/components/schemas/VmMemoryZoneUpdateData"});
        spec.validate(
            &schema,
            &json!({"id": "", "host_numa_node": 0}),
            "zone",
            &mut e,
        );
        assert!(
            e.iter()
                .any(|e| e.contains("zone.id: \"\" is shorter than 1")),
            "{e:?}"
        );
        // Not JSON, no body, wrong content type, body where none is taken.
        let spec = Spec::bundled();
        assert!(
            !spec
                .check_request("PUT", "/api/v1/vm.create", Some("application/json"), b"{")
                .is_empty()
        );
        assert!(
            !spec
                .check_request("PUT", "/api/v1/vm.create", None, b"")
                .is_empty()
        );
        assert!(
            !spec
                .check_request("PUT", "/api/v1/vm.create", Some("text/plain"), b"{}")
                .is_empty()
        );
        assert!(
            !spec
                .check_request("PUT", "/api/v1/vm.boot", Some("application/json"), b"{}")
                .is_empty()
        );
        assert!(
            !spec
                .check_request("POST", "/api/v1/vm.boot", None, b"")
                .is_empty()
        );
        assert!(
            !spec
                .check_request("PUT", "/api/v1/vm.nothing", None, b"")
                .is_empty()
        );
    }

    #[test]
    fn responses_are_checked() {
        let spec = Spec::bundled();
        let info = json!({"config": {"payload": {"kernel": "/k"}}, "state": "Running"});
        assert!(
            spec.check_response("GET", "/api/v1/vm.info", 200, info.to_string().as_bytes())
                .is_empty()
        );
        let bad = json!({"config": {"payload": {}}, "state": "Booting"});
        let e = spec.check_response("GET", "/api/v1/vm.info", 200, bad.to_string().as_bytes());
        assert!(
            e.iter().any(|e| e.contains("\"Booting\" is not one of")),
            "{e:?}"
        );
        assert!(
            !spec
                .check_response("GET", "/api/v1/vm.info", 200, b"")
                .is_empty()
        );
        assert!(
            !spec
                .check_response("PUT", "/api/v1/vm.boot", 204, b"{}")
                .is_empty()
        );
        assert!(
            !spec
                .check_response("PUT", "/api/v1/vm.boot", 201, b"")
                .is_empty()
        );
        let ping = json!({"version": "v48.0"});
        assert!(
            spec.check_response("GET", "/api/v1/vmm.ping", 200, ping.to_string().as_bytes())
                .is_empty()
        );
        let e = spec.check_response("GET", "/api/v1/vmm.ping", 200, b"{\"pid\": 1}");
        assert!(
            e.iter().any(|e| e.contains("\"version\" is missing")),
            "{e:?}"
        );
        // Errors: any status, CH's error format.
        assert!(
            spec.check_response("PUT", "/api/v1/vm.create", 409, b"[\"VmAlreadyCreated\"]")
                .is_empty()
        );
        assert!(
            !spec
                .check_response("PUT", "/api/v1/vm.create", 400, b"{\"error\": 1}")
                .is_empty()
        );
    }
}
