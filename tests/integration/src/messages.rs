//! Checks that what banlieue tells users reads as prose: no condition message and no
//! Event note may carry Rust debug formatting (`Some(..)`, `None`, `Ok(..)`, struct
//! syntax, escaped quotes). [`Operator`](crate::operator::Operator) runs
//! [`assert_prose`] on its namespace when it is dropped, so every suite that starts
//! the operator checks every message its scenarios produced.

use banlieue_sdk::api::infra::{
    cloud_hypervisor::{CloudHypervisorCluster, CloudHypervisorMachine},
    libvirt::{LibvirtCluster, LibvirtMachine},
    proxmox::{ProxmoxCluster, ProxmoxMachine},
    vsphere::{VSphereCluster, VSphereMachine},
};
use banlieue_sdk::api::{Provider, VirtualMachine};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::{Client, Resource};
use serde_json::Value;

/// The debug pattern `text` shows, if any.
pub fn debug_text(text: &str) -> Option<&'static str> {
    const PATTERNS: [(&str, &str); 5] = [
        ("Some(", "Some("),
        ("Ok(", "Ok("),
        ("Err(", "Err("),
        ("\\\"", "an escaped quote"),
        ("\\n", "an escaped newline"),
    ];
    for (needle, name) in PATTERNS {
        if text
            .match_indices(needle)
            .any(|(at, _)| !preceded_by_word(text, at))
        {
            return Some(name);
        }
    }
    if word_at(text, "None").any(|rest| !rest.starts_with(" of ")) {
        return Some("None");
    }
    if struct_syntax(text) {
        return Some("a struct's debug form (`Name { field: .. }`)");
    }
    None
}

/// True when the match at `at` is inside a longer word (`DataSome(` is not `Some(`).
fn preceded_by_word(text: &str, at: usize) -> bool {
    text[..at]
        .chars()
        .next_back()
        .is_some_and(|c| c.is_alphanumeric() || c == '_')
}

/// What follows each whole-word occurrence of `word`.
fn word_at<'a>(text: &'a str, word: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    text.match_indices(word).filter_map(move |(at, _)| {
        let after = &text[at + word.len()..];
        let whole = !preceded_by_word(text, at)
            && !after
                .chars()
                .next()
                .is_some_and(|c| c.is_alphanumeric() || c == '_');
        whole.then_some(after)
    })
}

/// `Name { field: ` — a capitalised word, ` { `, a snake_case field and a colon.
fn struct_syntax(text: &str) -> bool {
    text.match_indices(" { ").any(|(at, _)| {
        let before = text[..at].rsplit(' ').next().unwrap_or_default();
        let after = &text[at + 3..];
        let field: String = after
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        before.chars().next().is_some_and(char::is_uppercase)
            && !field.is_empty()
            && after[field.len()..].starts_with(": ")
    })
}

fn resource<K: Resource<DynamicType = ()>>() -> ApiResource {
    ApiResource::erase::<K>(&())
}

/// Every condition message of every banlieue object in `namespace` and every Event
/// note there that shows Rust debug formatting, as `<where>: <pattern> in <text>`.
pub async fn debug_texts(client: &Client, namespace: &str) -> Vec<String> {
    let kinds = [
        resource::<VirtualMachine>(),
        resource::<Provider>(),
        resource::<LibvirtMachine>(),
        resource::<VSphereMachine>(),
        resource::<ProxmoxMachine>(),
        resource::<CloudHypervisorMachine>(),
        resource::<LibvirtCluster>(),
        resource::<VSphereCluster>(),
        resource::<ProxmoxCluster>(),
        resource::<CloudHypervisorCluster>(),
    ];
    let mut found = Vec::new();
    for kind in &kinds {
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, kind);
        let Ok(list) = api.list(&ListParams::default()).await else {
            continue;
        };
        for object in list {
            let name = object.metadata.name.clone().unwrap_or_default();
            let conditions = object
                .data
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            for condition in conditions {
                let message = condition["message"].as_str().unwrap_or_default();
                if let Some(pattern) = debug_text(message) {
                    found.push(format!(
                        "{} {name} condition {}: {pattern} in {message:?}",
                        kind.kind, condition["type"]
                    ));
                }
            }
        }
    }
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    if let Ok(list) = events.list(&ListParams::default()).await {
        for event in list {
            let note = event.note.clone().unwrap_or_default();
            if let Some(pattern) = debug_text(&note) {
                let about = event
                    .regarding
                    .as_ref()
                    .map(|r| {
                        format!(
                            "{} {}",
                            r.kind.clone().unwrap_or_default(),
                            r.name.clone().unwrap_or_default()
                        )
                    })
                    .unwrap_or_default();
                found.push(format!(
                    "Event {} about {about}: {pattern} in {note:?}",
                    event.reason.unwrap_or_default()
                ));
            }
        }
    }
    found
}

/// Panics listing every message in `namespace` that shows Rust debug formatting.
pub async fn assert_prose(client: &Client, namespace: &str) {
    let found = debug_texts(client, namespace).await;
    assert!(
        found.is_empty(),
        "messages for users show Rust debug formatting:\n  {}",
        found.join("\n  ")
    );
}

#[cfg(test)]
mod tests {
    use super::debug_text;

    #[test]
    fn debug_forms_are_caught_and_prose_is_not() {
        for bad in [
            "want PoweredOn, observed Some(PoweredOff)",
            "observed None",
            "Err(Timeout)",
            "every VMID of vmIDRange Some(VmIdRange { start: 100, end: 200 }) is in use",
            "the image LibvirtImageSource { volume: None } is not on this host",
            "bootstrap Secret \\\"ud\\\" not found",
        ] {
            assert!(debug_text(bad).is_some(), "{bad}");
        }
        for good in [
            "",
            "VMClass small not found",
            "none of its 2 Providers is Ready",
            "None of the failure domains exists",
            "bootstrap Secret \"ud\" not found",
            "task UPID:pve:0001 (Ok)",
            "want PoweredOn, observed PoweredOff",
            "selector { app: web } matches nothing",
        ] {
            assert_eq!(debug_text(good), None, "{good}");
        }
    }
}
