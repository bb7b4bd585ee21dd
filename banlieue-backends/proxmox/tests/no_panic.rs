//! The Proxmox backend's pure parsers never panic, whatever PVE (or a proxy in front
//! of it) answers: the JSON envelope, UPIDs and task states, inventory replies, VM
//! config properties and sizes, form encoding, and `Provider.spec.settings`.

use std::collections::BTreeMap;

use banlieue_backend_proxmox::client::{self, Form};
use banlieue_backend_proxmox::settings::ProxmoxSettings;
use banlieue_backend_proxmox::tasks::{TaskState, Upid, upid_of};
use banlieue_backend_proxmox::{config, inventory};
use banlieue_sdk::backend::MachineIdentity;
use proptest::prelude::*;
use serde_json::Value;

/// Any text, with what PVE's formats are made of mixed in.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "(?s:.{0,40})",
        "UPID:[a-z0-9:]{0,40}",
        "[a-z0-9]+=[^,]{0,10}(,[a-z0-9]+=[^,]{0,10}){0,3}",
        "[0-9]{0,20}[KMGTP]?",
    ]
}

/// Any JSON value, nested a few levels.
fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        text().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::btree_map(
                prop_oneof![
                    text(),
                    proptest::sample::select(vec![
                        "data".to_string(),
                        "errors".to_string(),
                        "message".to_string(),
                        "status".to_string(),
                        "exitstatus".to_string(),
                        "type".to_string(),
                        "node".to_string(),
                        "name".to_string(),
                        "content".to_string(),
                        "smbios1".to_string(),
                        "iface".to_string(),
                        "version".to_string(),
                        "quorate".to_string(),
                    ]),
                ],
                inner,
                0..6,
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn any_reply_parses_or_fails_with_a_classified_error(
        status in prop_oneof![Just(200u16), Just(401), Just(500), Just(501), Just(595), 100u16..600],
        reason in text(),
        body in prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..256),
            json().prop_map(|v| serde_json::to_vec(&v).unwrap()),
        ],
    ) {
        match client::parse(status, &reason, &body) {
            Ok(_) => prop_assert!((200..300).contains(&status)),
            Err(error) => {
                let _ = error.to_string();
                let _ = (error.status(), error.message(), error.is_missing_vm(), error.is_vmid_taken());
                let backend = error.into_backend();
                prop_assert!(!backend.reason.is_empty());
            }
        }
    }

    #[test]
    fn task_replies_never_panic(text in text(), data in json()) {
        if let Some(upid) = Upid::parse(&text) {
            let _ = upid.status_path();
        }
        let _ = TaskState::from_status(&data);
        let _ = upid_of(&data);
        let _ = client::is_lock_message(&text);
    }

    #[test]
    fn inventory_replies_never_panic(data in json()) {
        let _ = inventory::version_string(&data);
        let _ = inventory::cluster_of(&data);
        let _ = inventory::online_nodes(&data);
        let _ = inventory::image_storages(&data);
        let _ = inventory::bridges(&data);
        let _ = config::smbios_uuid(&data);
    }

    #[test]
    fn config_text_never_panics(a in text(), b in text(), uid in text(), name in text()) {
        let _ = config::split_tags(&a);
        let _ = config::has_uid_tag(Some(&a), &uid);
        let _ = config::property(&a, &b);
        let _ = config::parse_size(&a);
        let _ = config::smbios1(Some(&a), &uid);
        let identity = MachineIdentity { uid, namespace: b, name, provider_id: None };
        let vm_name = config::vm_name(&identity);
        prop_assert!(!vm_name.contains(char::is_whitespace), "{vm_name:?}");
        let _ = config::description(&identity);
    }

    #[test]
    fn form_encoding_is_always_url_safe(pairs in proptest::collection::vec((text(), text()), 0..5)) {
        let mut form = Form::new();
        for (k, v) in &pairs {
            form.push(k.clone(), v);
        }
        let encoded = form.encode();
        prop_assert!(
            encoded.bytes().all(|b| b.is_ascii_graphic()),
            "{encoded:?}"
        );
        prop_assert!(client::encode(&pairs.first().map(|p| p.0.clone()).unwrap_or_default())
            .bytes().all(|b| b.is_ascii_graphic() && b != b'&' && b != b'='));
    }

    #[test]
    fn any_settings_parse_or_name_the_bad_key(settings in proptest::collection::btree_map(
        prop_oneof![
            text(),
            proptest::sample::select(vec![
                "taskPollInterval".to_string(),
                "shutdownTimeout".to_string(),
                "failedCloneBackoff".to_string(),
                "vlans".to_string(),
                "cluster".to_string(),
                "seedStorage".to_string(),
            ]),
        ],
        text(),
        0..5,
    )) {
        let settings: BTreeMap<String, String> = settings;
        if let Err(error) = ProxmoxSettings::parse(&settings) {
            prop_assert!(!error.message.is_empty());
        }
    }
}
