//! Provider status from a backend check.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::provider::{ClassMapping, DiscoveredFailureDomain, ProviderSpec, ProviderStatus};
use crate::backend::settings::check_operator_settings;
use crate::backend::{BackendCapabilities, FailureDomainInventory, Inventory};
use crate::conditions::{self, Desired, Status, types};

/// Why a Provider could not be checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unreachable {
    /// CamelCase reason (`CredentialsNotFound`, `Unauthorized`, `Unreachable`, ...).
    pub reason: String,
    /// What happened; never contains secret values.
    pub message: String,
}

/// The status after a check: `result` is the backend's inventory and what it
/// declares it can do ([`Backend::capabilities`](crate::backend::Backend::capabilities)),
/// published narrowed by the Provider's `capabilities.*` settings.
pub fn compute(
    previous: Option<&ProviderStatus>,
    spec: &ProviderSpec,
    generation: Option<i64>,
    result: Result<(&Inventory, &BackendCapabilities), &Unreachable>,
    now: &Time,
) -> ProviderStatus {
    let mut status = previous.cloned().unwrap_or_default();
    status.observed_generation = generation;
    match result {
        Ok((inventory, capabilities)) => {
            status.version = Some(inventory.version.clone()).filter(|v| !v.is_empty());
            status.failure_domains = failure_domains(spec, inventory);
            let narrowed = capabilities.clone().narrowed(&spec.settings);
            status.backend_capabilities = Some(match &narrowed {
                Ok(c) => c.clone(),
                // A bad setting narrows nothing, and Ready says which one it is.
                Err(_) => capabilities.clone(),
            });
            conditions::set(
                &mut status.conditions,
                Desired::new(types::REACHABLE, Status::True, "Connected"),
                generation,
                now,
            );
            // The settings as a whole: a bad value or a key nobody reads is refused
            // here, before a VM lands on the Provider and waits on it forever.
            let mut invalid = check_operator_settings(&spec.settings);
            if let Err(bad) = &narrowed {
                invalid.insert(0, bad.clone());
            }
            let (ready, reason, message) = if spec.paused {
                (Status::False, "Paused", "spec.paused is set".to_owned())
            } else if !invalid.is_empty() {
                (
                    Status::False,
                    "InvalidSettings",
                    format!(
                        "{}; no VM is placed on this Provider until the settings are fixed",
                        invalid.join("; ")
                    ),
                )
            } else if status.failure_domains.is_empty() && !inventory.failure_domains.is_empty() {
                (
                    Status::False,
                    "NoFailureDomains",
                    no_failure_domains(spec, inventory),
                )
            } else {
                (Status::True, "Ready", String::new())
            };
            conditions::set(
                &mut status.conditions,
                Desired::new(types::READY, ready, reason).message(&message),
                generation,
                now,
            );
        }
        Err(failure) => {
            // Keep the last known inventory: a blip must not make every VM unschedulable-looking.
            conditions::set(
                &mut status.conditions,
                Desired::new(types::REACHABLE, Status::False, &failure.reason)
                    .message(&failure.message),
                generation,
                now,
            );
            conditions::set(
                &mut status.conditions,
                Desired::new(types::READY, Status::False, &failure.reason)
                    .message(&failure.message),
                generation,
                now,
            );
        }
    }
    status
}

/// Which declared failure domains were looked for, and which the backend has.
fn no_failure_domains(spec: &ProviderSpec, inventory: &Inventory) -> String {
    let declared: Vec<String> = spec
        .failure_domains
        .iter()
        .map(|d| {
            if d.location.is_empty() {
                d.name.clone()
            } else {
                let at: Vec<String> = d.location.iter().map(|(k, v)| format!("{k}={v}")).collect();
                format!("{} ({})", d.name, at.join(", "))
            }
        })
        .collect();
    let found: Vec<String> = inventory
        .failure_domains
        .iter()
        .map(|fd| fd.name.clone())
        .collect();
    format!(
        "none of the declared failure domains exists on the backend: declared {}; the backend has {}",
        declared.join(", "),
        found.join(", ")
    )
}

/// Declared failure domains (spec) win over discovered ones by name; each gets the
/// classes whose every target key/value the backend reports there.
fn failure_domains(spec: &ProviderSpec, inventory: &Inventory) -> Vec<DiscoveredFailureDomain> {
    let discovered = |fd: &FailureDomainInventory| DiscoveredFailureDomain {
        name: fd.name.clone(),
        labels: fd.labels.clone(),
        storage_classes: offered(&spec.capabilities.storage_classes, fd),
        network_classes: offered(&spec.capabilities.network_classes, fd),
        features: fd
            .features
            .iter()
            .filter(|f| spec.capabilities.features.contains(f))
            .cloned()
            .collect(),
        location: fd.location.clone(),
        architecture: fd.architecture,
    };
    if spec.failure_domains.is_empty() {
        return inventory.failure_domains.iter().map(discovered).collect();
    }
    spec.failure_domains
        .iter()
        .filter_map(|declared| {
            let found = inventory.failure_domains.iter().find(|fd| {
                fd.name == declared.name
                    || (!declared.location.is_empty()
                        && declared
                            .location
                            .iter()
                            .all(|(k, v)| fd.location.get(k) == Some(v)))
            })?;
            let mut fd = discovered(found);
            fd.name = declared.name.clone();
            fd.labels.extend(declared.labels.clone());
            fd.location.extend(declared.location.clone());
            Some(fd)
        })
        .collect()
}

fn offered(mappings: &[ClassMapping], fd: &FailureDomainInventory) -> Vec<String> {
    mappings
        .iter()
        .filter(|m| {
            m.target
                .iter()
                .all(|(k, v)| fd.resources.get(k).is_some_and(|values| values.contains(v)))
        })
        .map(|m| m.name.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;
    use crate::api::common::ProviderClass;
    use crate::api::provider::{Capabilities, Connection, DeclaredFailureDomain};
    use k8s_openapi::jiff::Timestamp;

    fn conservative() -> BackendCapabilities {
        BackendCapabilities::conservative()
    }

    fn now(s: i64) -> Time {
        Time(Timestamp::from_second(s).unwrap())
    }

    fn spec() -> ProviderSpec {
        ProviderSpec {
            class: ProviderClass::Sim,
            connection: Connection {
                endpoint: "sim://a".into(),
                ..Default::default()
            },
            capabilities: Capabilities {
                storage_classes: vec![ClassMapping {
                    name: "fast".into(),
                    target: BTreeMap::from([("pool".into(), "ssd".into())]),
                }],
                network_classes: vec![ClassMapping {
                    name: "lan".into(),
                    target: BTreeMap::from([("network".into(), "default".into())]),
                }],
                features: vec!["gpu".into()],
            },
            failure_domains: vec![],
            settings: BTreeMap::new(),
            paused: false,
        }
    }

    fn inventory() -> Inventory {
        let fd = |name: &str, pools: &[&str]| FailureDomainInventory {
            name: name.into(),
            resources: BTreeMap::from([
                (
                    "pool".into(),
                    pools.iter().map(|p| p.to_string()).collect::<BTreeSet<_>>(),
                ),
                ("network".into(), BTreeSet::from(["default".to_string()])),
            ]),
            features: BTreeSet::from(["gpu".to_string(), "undeclared".to_string()]),
            ..Default::default()
        };
        let mut a = fd("a", &["ssd"]);
        a.architecture = Some(crate::api::vm_image::Architecture::Arm64);
        Inventory {
            version: "sim 1".into(),
            failure_domains: vec![a, fd("b", &["hdd"])],
        }
    }

    #[test]
    fn classes_are_offered_where_their_targets_exist() {
        let status = compute(
            None,
            &spec(),
            Some(1),
            Ok((&inventory(), &conservative())),
            &now(1),
        );
        let a = &status.failure_domains[0];
        assert_eq!(
            (a.storage_classes.clone(), a.network_classes.clone()),
            (vec!["fast".to_string()], vec!["lan".to_string()])
        );
        assert!(status.failure_domains[1].storage_classes.is_empty());
        assert_eq!(a.features, ["gpu"], "only declared features are published");
        assert_eq!(
            (a.architecture, status.failure_domains[1].architecture),
            (Some(crate::api::vm_image::Architecture::Arm64), None),
            "the architecture as the backend reports it, none when it reports none"
        );
        assert!(conditions::is_true(&status.conditions, "Ready"));
        assert_eq!(status.version.as_deref(), Some("sim 1"));
    }

    #[test]
    fn declared_domains_rename_and_label() {
        let mut spec = spec();
        spec.failure_domains = vec![DeclaredFailureDomain {
            name: "zone-1".into(),
            labels: BTreeMap::from([("zone".into(), "1".into())]),
            location: BTreeMap::new(),
        }];
        let status = compute(
            None,
            &spec,
            Some(1),
            Ok((&inventory(), &conservative())),
            &now(1),
        );
        assert!(status.failure_domains.is_empty());
        assert!(!conditions::is_true(&status.conditions, "Ready"));
        spec.failure_domains[0].name = "a".into();
        let status = compute(
            None,
            &spec,
            Some(1),
            Ok((&inventory(), &conservative())),
            &now(1),
        );
        assert_eq!(
            status.failure_domains[0]
                .labels
                .get("zone")
                .map(String::as_str),
            Some("1")
        );
        assert_eq!(
            status.failure_domains[0].architecture,
            Some(crate::api::vm_image::Architecture::Arm64),
            "a declared domain carries what the backend found there"
        );
    }

    #[test]
    fn no_failure_domains_names_them() {
        let mut spec = spec();
        spec.failure_domains = vec![DeclaredFailureDomain {
            name: "zone-1".into(),
            labels: BTreeMap::new(),
            location: BTreeMap::from([("host".into(), "h9".into())]),
        }];
        let status = compute(
            None,
            &spec,
            Some(1),
            Ok((&inventory(), &conservative())),
            &now(1),
        );
        let ready = conditions::get(&status.conditions, "Ready").unwrap();
        assert_eq!(ready.reason, "NoFailureDomains");
        assert!(
            ready.message.contains("zone-1 (host=h9)")
                && ready.message.contains("the backend has a, b"),
            "{}",
            ready.message
        );
    }

    #[test]
    fn capabilities_are_published_narrowed_by_settings() {
        use crate::api::common::{Firmware, PowerState};
        let mut all = conservative();
        all.firmware.push(Firmware::EfiSecure);
        all.power_states.push(PowerState::Suspended);
        let mut spec = spec();
        spec.settings.insert(
            crate::backend::capabilities::SECURE_BOOT_SETTING.into(),
            "false".into(),
        );
        let status = compute(None, &spec, Some(1), Ok((&inventory(), &all)), &now(1));
        let published = status.backend_capabilities.clone().unwrap();
        assert!(!published.firmware.contains(&Firmware::EfiSecure));
        assert!(published.power_states.contains(&PowerState::Suspended));
        assert!(conditions::is_true(&status.conditions, "Ready"));

        spec.settings.insert(
            crate::backend::capabilities::SUSPEND_SETTING.into(),
            "nope".into(),
        );
        let status = compute(None, &spec, Some(1), Ok((&inventory(), &all)), &now(1));
        let ready = conditions::get(&status.conditions, "Ready").unwrap();
        assert_eq!(ready.reason, "InvalidSettings");
        assert!(
            ready.message.contains("capabilities.suspend"),
            "{}",
            ready.message
        );
    }

    #[test]
    fn settings_wrong_as_a_whole_make_the_provider_not_ready_naming_each_key() {
        let mut spec = spec();
        spec.settings
            .insert("maxConcurrentCreates".into(), "18446744073709551616".into());
        spec.settings
            .insert("capabilities.secureboot".into(), "false".into());
        let status = compute(
            None,
            &spec,
            Some(1),
            Ok((&inventory(), &conservative())),
            &now(1),
        );
        let ready = conditions::get(&status.conditions, "Ready").unwrap();
        assert_eq!(ready.status, "False");
        assert_eq!(ready.reason, "InvalidSettings");
        for part in [
            "settings.maxConcurrentCreates \"18446744073709551616\" is not a whole number from 0 (no cap) to 100000",
            "settings.capabilities.secureboot is not a setting (did you mean capabilities.secureBoot?)",
            "no VM is placed on this Provider until the settings are fixed",
        ] {
            assert!(ready.message.contains(part), "{part}: {}", ready.message);
        }
        // Reachable stays true: the backend answered, the settings are what is wrong.
        assert!(conditions::is_true(&status.conditions, "Reachable"));
    }

    #[test]
    fn unreachable_keeps_inventory_and_is_idempotent() {
        let ok = compute(
            None,
            &spec(),
            Some(1),
            Ok((&inventory(), &conservative())),
            &now(1),
        );
        let failure = Unreachable {
            reason: "Unreachable".into(),
            message: "connection refused".into(),
        };
        let down = compute(Some(&ok), &spec(), Some(1), Err(&failure), &now(2));
        assert_eq!(down.failure_domains, ok.failure_domains);
        assert!(!conditions::is_true(&down.conditions, "Reachable"));
        assert_eq!(
            compute(Some(&down), &spec(), Some(1), Err(&failure), &now(3)),
            down,
            "same input, same status"
        );
    }
}
