//! `kubectl banlieue get`: one row per VirtualMachine, rendered as kubectl renders
//! tables (upper-case headers, columns padded with three spaces, `<none>` for empty).

use banlieue_sdk::api::VirtualMachine;
use banlieue_sdk::api::common::{PowerState, ProviderClass};
use banlieue_sdk::conditions::{self, types};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::age;

const NONE: &str = "<none>";

/// One VirtualMachine as the table shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// The Provider it is placed on.
    pub provider: String,
    /// The Provider's backend class (`vsphere`, `proxmox`, ...).
    pub backend: String,
    /// The failure domain inside the Provider.
    pub failure_domain: String,
    /// Observed power state.
    pub power: String,
    /// `True`, `False` or `Unknown`.
    pub ready: String,
    /// The most specific reason: the first failing link rather than `Ready`'s summary.
    pub reason: String,
    /// Every address, comma-separated.
    pub addresses: String,
    /// Age, as kubectl prints it.
    pub age: String,
}

impl Row {
    /// The row for `vm`, its age counted to `now`.
    pub fn of(vm: &VirtualMachine, now: Timestamp) -> Self {
        let status = vm.status.as_ref();
        let placement = status.and_then(|s| s.placement.as_ref());
        let ready = status.and_then(|s| conditions::get(&s.conditions, types::READY));
        let addresses: Vec<&str> = status
            .map(|s| s.addresses.iter().map(|a| a.address.as_str()).collect())
            .unwrap_or_default();
        Self {
            namespace: vm.namespace().unwrap_or_default(),
            name: vm.name_any(),
            provider: or_none(placement.map(|p| p.provider.as_str())),
            backend: or_none(placement.and_then(|p| p.provider_class).map(class_name)),
            failure_domain: or_none(placement.and_then(|p| p.failure_domain.as_deref())),
            power: or_none(status.and_then(|s| s.power_state).map(PowerState::as_str)),
            ready: ready.map_or("Unknown", |c| c.status.as_str()).to_owned(),
            reason: or_none(reason(vm)),
            addresses: if addresses.is_empty() {
                NONE.into()
            } else {
                addresses.join(",")
            },
            age: vm
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| age::human(now.as_second() - t.0.as_second()))
                .unwrap_or_else(|| NONE.into()),
        }
    }
}

/// Why `vm` is (not) Ready, most specific first: a VM that is not Ready because it is
/// not scheduled because its class is missing says `ClassNotFound`, not `NotScheduled`.
pub fn reason(vm: &VirtualMachine) -> Option<&str> {
    let conditions = &vm.status.as_ref()?.conditions;
    let ready = conditions::get(conditions, types::READY)?;
    if ready.status == "True" {
        return Some(ready.reason.as_str());
    }
    let failing = |type_: &str| conditions::get(conditions, type_).filter(|c| c.status != "True");
    let migrating = conditions::get(conditions, types::MIGRATING).filter(|c| c.status == "True");
    failing(types::SCHEDULED)
        .or(migrating)
        .or_else(|| failing(types::INFRASTRUCTURE_READY))
        .or_else(|| failing(types::POWER_STATE))
        .or(Some(ready))
        .map(|c| c.reason.as_str())
}

/// A backend class as users write it in `Provider.spec.class`.
pub fn class_name(class: ProviderClass) -> &'static str {
    class.as_str()
}

fn or_none(value: Option<&str>) -> String {
    value.filter(|v| !v.is_empty()).unwrap_or(NONE).to_owned()
}

/// The table; with `namespaces`, a NAMESPACE column first (as `kubectl get -A`).
pub fn render(rows: &[Row], namespaces: bool) -> String {
    let mut header = vec![
        "NAME",
        "PROVIDER",
        "BACKEND",
        "FAILURE-DOMAIN",
        "POWER",
        "READY",
        "REASON",
        "ADDRESSES",
        "AGE",
    ];
    if namespaces {
        header.insert(0, "NAMESPACE");
    }
    let cells: Vec<Vec<&str>> = rows
        .iter()
        .map(|r| {
            let mut line = vec![
                r.name.as_str(),
                &r.provider,
                &r.backend,
                &r.failure_domain,
                &r.power,
                &r.ready,
                &r.reason,
                &r.addresses,
                &r.age,
            ];
            if namespaces {
                line.insert(0, &r.namespace);
            }
            line
        })
        .collect();
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            cells
                .iter()
                .map(|line| line[i].chars().count())
                .chain([header[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for line in std::iter::once(&header).chain(&cells) {
        let last = line.len() - 1;
        for (i, cell) in line.iter().enumerate() {
            out.push_str(cell);
            if i < last {
                let pad = widths[i] - cell.chars().count() + 3;
                out.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vm(status: serde_json::Value) -> VirtualMachine {
        serde_json::from_value(json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "VirtualMachine",
            "metadata": {"name": "web-1", "namespace": "lab", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"classRef": {"name": "small"}, "imageRef": {"name": "debian"}},
            "status": status,
        }))
        .unwrap()
    }

    fn condition(type_: &str, status: &str, reason: &str) -> serde_json::Value {
        json!({"type": type_, "status": status, "reason": reason, "message": "",
               "lastTransitionTime": "2026-01-01T00:00:00Z"})
    }

    fn now() -> Timestamp {
        "2026-01-01T00:05:30Z".parse().unwrap()
    }

    #[test]
    fn a_ready_vm_shows_its_placement_power_and_addresses() {
        let vm = vm(json!({
            "placement": {"provider": "pve", "providerClass": "proxmox", "failureDomain": "node-1"},
            "powerState": "PoweredOn",
            "addresses": [{"type": "InternalIP", "address": "10.0.0.9"}, {"type": "Hostname", "address": "web-1"}],
            "conditions": [condition("Ready", "True", "Ready")],
        }));
        assert_eq!(
            Row::of(&vm, now()),
            Row {
                namespace: "lab".into(),
                name: "web-1".into(),
                provider: "pve".into(),
                backend: "proxmox".into(),
                failure_domain: "node-1".into(),
                power: "PoweredOn".into(),
                ready: "True".into(),
                reason: "Ready".into(),
                addresses: "10.0.0.9,web-1".into(),
                age: "5m30s".into(),
            }
        );
    }

    #[test]
    fn the_reason_is_the_first_failing_link_not_the_summary() {
        let cases = [
            (
                vec![
                    condition("Scheduled", "False", "ClassNotFound"),
                    condition("InfrastructureReady", "False", "WaitingForInfrastructure"),
                    condition("Ready", "False", "NotScheduled"),
                ],
                "ClassNotFound",
            ),
            (
                vec![
                    condition("Scheduled", "True", "Scheduled"),
                    condition("InfrastructureReady", "False", "TerminalFailure"),
                    condition("PowerState", "False", "Converging"),
                    condition("Ready", "False", "InfrastructureNotReady"),
                ],
                "TerminalFailure",
            ),
            (
                vec![
                    condition("Scheduled", "True", "Scheduled"),
                    condition("Migrating", "True", "RemovingOldMachine"),
                    condition("InfrastructureReady", "False", "WaitingForInfrastructure"),
                    condition("Ready", "False", "Migrating"),
                ],
                "RemovingOldMachine",
            ),
            (
                vec![
                    condition("Scheduled", "True", "Scheduled"),
                    condition("Migrating", "False", "Completed"),
                    condition("InfrastructureReady", "True", "Ready"),
                    condition("PowerState", "False", "Converging"),
                    condition("Ready", "False", "PowerStateConverging"),
                ],
                "Converging",
            ),
            (vec![condition("Ready", "False", "Deleting")], "Deleting"),
        ];
        for (conditions, want) in cases {
            let vm = vm(json!({"conditions": conditions}));
            assert_eq!(reason(&vm), Some(want), "{conditions:?}");
        }
    }

    #[test]
    fn a_fresh_vm_shows_none_and_unknown() {
        let row = Row::of(&vm(json!({})), now());
        assert_eq!(
            (
                row.provider.as_str(),
                row.ready.as_str(),
                row.reason.as_str()
            ),
            ("<none>", "Unknown", "<none>")
        );
    }

    #[test]
    fn columns_are_aligned_and_namespaces_optional() {
        let ready = Row::of(
            &vm(
                json!({"placement": {"provider": "sim", "providerClass": "sim"},
                       "conditions": [condition("Ready", "True", "Ready")]}),
            ),
            now(),
        );
        let mut long = ready.clone();
        long.name = "a-much-longer-name".into();
        let table = render(&[ready, long], false);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(
            lines[0].starts_with("NAME                 PROVIDER   BACKEND   "),
            "{table}"
        );
        let column = lines[0].find("PROVIDER").unwrap();
        assert!(
            lines
                .iter()
                .all(|l| l[column..].starts_with("sim") || l[column..].starts_with("PROVIDER")),
            "{table}"
        );
        assert!(lines[1].ends_with("5m30s"), "{table}");
        assert!(render(&[], true).starts_with("NAMESPACE   NAME   "));
    }
}
