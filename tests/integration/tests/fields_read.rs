//! No field accepted and ignored (issue 38, item 5): every field of every CRD's
//! `spec` is read by some code path that acts on it, or is listed below as
//! informational or not yet honoured, with the reason.
//!
//! "Read" is found in the source, not at run time: a field access (`.field`) or a
//! destructuring (`{ field` / `field,` in a pattern) of its Rust name in the code that
//! acts on that kind, production code only (everything from a file's `#[cfg(test)]`
//! on is left out):
//! - an infra machine kind: its backend's crate, and the SDK's backend, controllers
//!   and Cluster API modules (not the builder, which writes these fields from a
//!   VirtualMachine's and reads the VirtualMachine's fields of the same names);
//! - every other kind: the SDK (not its `api` module, which declares them), the
//!   runtime, the backends (a VMImage's per-class source is read by its backend) and
//!   the binaries.
//!
//! So a field copied from a VMClass into a VSphereMachine and read by no backend
//! fails here at the VSphereMachine.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use banlieue_sdk::crds;
use serde_json::Value;

/// Fields no code reads on purpose, or not yet, by CRD kind and path under `spec`,
/// with why. Each entry must still be unread (a stale entry fails the test too).
///
/// Entries that say "not honoured yet" are gaps, listed so they are visible and
/// cannot grow silently: each is to be applied or refused before anything is made.
const NOT_READ: &[(&str, &str, &str)] = &[
    (
        "CloudHypervisorCluster",
        "controlPlaneEndpoint.port",
        CAPI_ENDPOINT,
    ),
    ("LibvirtCluster", "controlPlaneEndpoint.port", CAPI_ENDPOINT),
    ("ProxmoxCluster", "controlPlaneEndpoint.port", CAPI_ENDPOINT),
    ("VSphereCluster", "controlPlaneEndpoint.port", CAPI_ENDPOINT),
    (
        "VMImage",
        "os.family",
        "informational: describes the image to people (kubectl get, the book's examples); no backend needs it",
    ),
    (
        "VirtualMachine",
        "migration.stopSourceFirst",
        "a statement, not a switch: admission requires true, and CopyDisk always stops the source before copying",
    ),
];

const CAPI_ENDPOINT: &str = "Cluster API's contract field: the control plane provider sets it and Cluster API reads it; banlieue only carries it";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the workspace")
}

/// Every leaf under `schema`, as `a.b[].c`.
fn leaves(schema: &Value, path: &str, out: &mut Vec<String>) {
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (name, sub) in props {
            let next = if path.is_empty() {
                name.clone()
            } else {
                format!("{path}.{name}")
            };
            leaves(sub, &next, out);
        }
    } else if let Some(items) = schema.get("items") {
        leaves(items, &format!("{path}[]"), out);
    } else if !path.is_empty() {
        out.push(path.to_owned());
    }
}

/// The Rust name of a JSON field (`memoryMiB` → `memory_mib`, `providerID` →
/// `provider_id`, `maxCPUs` → `max_cpus`).
fn rust_name(json: &str) -> String {
    let mut s = json.to_owned();
    for (from, to) in [
        ("MiB", "Mib"),
        ("GiB", "Gib"),
        ("CPUs", "Cpus"),
        ("UUID", "Uuid"),
        ("IDs", "Ids"),
        ("ID", "Id"),
        ("MTU", "Mtu"),
        ("IP", "Ip"),
        ("CA", "Ca"),
        ("TLS", "Tls"),
        ("URL", "Url"),
    ] {
        s = s.replace(from, to);
    }
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    match out.as_str() {
        "type" => "type_".into(),
        _ => out,
    }
}

/// The production source of every `.rs` file under `dirs` (minus `skip`), each cut at
/// its `#[cfg(test)]`.
fn sources(dirs: &[PathBuf], skip: &[PathBuf]) -> String {
    fn walk(dir: &Path, skip: &[PathBuf], out: &mut String) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if skip.iter().any(|s| path.starts_with(s)) {
                continue;
            }
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if path.is_dir() {
                if name != "tests" {
                    walk(&path, skip, out);
                }
            } else if name.ends_with(".rs") && !name.ends_with("tests.rs") {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let production = text.split("#[cfg(test)]").next().unwrap_or("");
                out.push_str(production);
                out.push('\n');
            }
        }
    }
    let mut out = String::new();
    for dir in dirs {
        walk(dir, skip, &mut out);
    }
    out
}

fn is_read(source: &str, field: &str) -> bool {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut found = false;
    for (at, _) in source.match_indices(field) {
        let before = source[..at].chars().next_back();
        let after = source[at + field.len()..].chars().next();
        if after.is_some_and(ident) || before.is_some_and(ident) {
            continue;
        }
        let rest = source[at + field.len()..].trim_start();
        // A field access, or a pattern binding it (`{ field,` / `{ field }` /
        // `field: binding` inside a pattern is not told apart from a literal's
        // `field: value`, so only the first two count).
        let access = before == Some('.');
        let pattern = source[..at].trim_end().ends_with('{')
            && (rest.starts_with(',') || rest.starts_with('}'))
            || source[..at].trim_end().ends_with(',') && rest.starts_with(',');
        if access || pattern {
            found = true;
            break;
        }
    }
    found
}

#[test]
fn every_spec_field_is_read_or_listed_with_a_reason() {
    let root = workspace();
    let sdk = root.join("banlieue-sdk/src");
    let backend_dir = |kind: &str| -> Option<PathBuf> {
        let dir = match kind {
            "VSphereMachine" => "vsphere",
            "ProxmoxMachine" => "proxmox",
            "LibvirtMachine" => "libvirt",
            "CloudHypervisorMachine" => "cloud-hypervisor",
            _ => return None,
        };
        Some(root.join("banlieue-backends").join(dir).join("src"))
    };
    let general = sources(
        &[
            sdk.clone(),
            root.join("banlieue-runtime/src"),
            root.join("banlieue-backends"),
            root.join("bins"),
        ],
        &[sdk.join("api")],
    );
    let mut per_kind: BTreeMap<String, String> = BTreeMap::new();
    let mut unread: BTreeSet<(String, String)> = BTreeSet::new();
    let mut checked = 0;
    for crd in crds::all() {
        let kind = crd.spec.names.kind.clone();
        if kind.ends_with("Template") {
            continue; // a template's spec is the machine's or cluster's, checked there
        }
        let version = &crd.spec.versions[0];
        let schema = serde_json::to_value(
            version
                .schema
                .as_ref()
                .and_then(|s| s.open_api_v3_schema.as_ref())
                .expect("a schema"),
        )
        .unwrap();
        let Some(spec) = schema.pointer("/properties/spec") else {
            continue;
        };
        let mut fields = Vec::new();
        leaves(spec, "", &mut fields);
        let source = match backend_dir(&kind) {
            Some(dir) => per_kind
                .entry(kind.clone())
                .or_insert_with(|| {
                    sources(
                        &[
                            dir,
                            root.join("banlieue-backends/kit/src"),
                            root.join("banlieue-backends/nocloud/src"),
                            sdk.join("backend"),
                            sdk.join("controllers"),
                            sdk.join("capi"),
                        ],
                        &[],
                    )
                })
                .clone(),
            None => general.clone(),
        };
        for path in fields {
            checked += 1;
            let last = path.rsplit('.').next().unwrap().trim_end_matches("[]");
            if !is_read(&source, &rust_name(last)) {
                unread.insert((kind.clone(), path));
            }
        }
    }
    let listed: BTreeSet<(String, String)> = NOT_READ
        .iter()
        .map(|(k, p, _)| (k.to_string(), p.to_string()))
        .collect();
    let silent: Vec<_> = unread.difference(&listed).collect();
    let stale: Vec<_> = listed.difference(&unread).collect();
    assert!(
        checked > 100,
        "walked {checked} fields: the walk found too few"
    );
    assert!(
        silent.is_empty() && stale.is_empty(),
        "of {checked} spec fields, read by no code path and not listed in NOT_READ \
         (apply them, refuse them before anything is made, or list them with the reason):\n{}\n\
         listed in NOT_READ but read now (remove the entry):\n{}",
        silent
            .iter()
            .map(|(k, p)| format!("  {k} spec.{p}"))
            .collect::<Vec<_>>()
            .join("\n"),
        stale
            .iter()
            .map(|(k, p)| format!("  {k} spec.{p}"))
            .collect::<Vec<_>>()
            .join("\n"),
    );
}

#[test]
fn rust_names_follow_serde_renames() {
    for (json, rust) in [
        ("memoryMiB", "memory_mib"),
        ("providerID", "provider_id"),
        ("maxCPUs", "max_cpus"),
        ("vmIDRange", "vm_id_range"),
        ("sizeGiB", "size_gib"),
        ("macAddress", "mac_address"),
        ("cpus", "cpus"),
        ("type", "type_"),
    ] {
        assert_eq!(rust_name(json), rust, "{json}");
    }
    assert!(is_read("let x = spec.memory_mib;", "memory_mib"));
    assert!(is_read("let Spec { memory_mib, .. } = spec;", "memory_mib"));
    assert!(!is_read("Spec { memory_mib: 5 }", "memory_mib"));
    assert!(!is_read("let x = spec.memory_mib_max;", "memory_mib"));
}
