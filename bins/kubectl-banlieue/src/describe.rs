//! `kubectl banlieue describe`: the VM in a few lines, why it is (not) Ready, the chain
//! link by link, its conditions, and how to reach it.

use std::fmt::Write;

use banlieue_sdk::api::common::Condition;
use banlieue_sdk::api::infra::MachineAddressType;
use kube::ResourceExt;

use crate::access::{self, Hint};
use crate::diagnose::{self, Facts, State};
use crate::table;

/// The whole report for `facts`.
pub fn render(facts: &Facts<'_>) -> String {
    let vm = facts.vm;
    let status = vm.status.as_ref();
    let diagnosis = diagnose::diagnose(facts);
    let mut out = String::new();
    let field = |out: &mut String, name: &str, value: &str| {
        let _ = writeln!(out, "{:<14}{value}", format!("{name}:"));
    };
    field(&mut out, "Name", &vm.name_any());
    field(&mut out, "Namespace", &vm.namespace().unwrap_or_default());
    field(&mut out, "Class", &vm.spec.class_ref.name);
    field(&mut out, "Image", &vm.spec.image_ref.name);
    if let Some(p) = status.and_then(|s| s.placement.as_ref()) {
        let class = p.provider_class.map(table::class_name).unwrap_or("?");
        let fd = p
            .failure_domain
            .as_deref()
            .map(|fd| format!(", failure domain {fd}"))
            .unwrap_or_default();
        field(
            &mut out,
            "Placement",
            &format!("Provider {} ({class}){fd}", p.provider),
        );
    }
    if let Some(r) = status.and_then(|s| s.infrastructure_ref.as_ref()) {
        field(&mut out, "Machine", &format!("{} {}", r.kind, r.name));
    }
    let observed = status
        .and_then(|s| s.power_state)
        .map_or("unknown".to_owned(), |p| format!("{p:?}"));
    field(
        &mut out,
        "Power",
        &format!("{observed} (wanted {:?})", vm.spec.power_state),
    );
    let addresses = status.map(|s| s.addresses.as_slice()).unwrap_or_default();
    if !addresses.is_empty() {
        let list: Vec<String> = addresses
            .iter()
            .map(|a| format!("{} {}", address_type(&a.type_), a.address))
            .collect();
        field(&mut out, "Addresses", &list.join(", "));
    }
    if let Some(id) = status.and_then(|s| s.provider_id.as_deref()) {
        field(&mut out, "ProviderID", id);
    }

    out.push('\n');
    if diagnosis.ready {
        out.push_str("Ready: True\n");
    } else {
        let _ = writeln!(out, "Ready: False ({})", or_dash(&diagnosis.ready_reason));
        match diagnosis.culprit() {
            Some(link) => {
                let _ = writeln!(
                    out,
                    "Why: {} is not OK: {}{}",
                    link.subject,
                    link.reason,
                    if link.message.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", link.message)
                    }
                );
                if let Some(hint) = &link.hint {
                    let _ = writeln!(out, "Hint: {hint}");
                }
            }
            None => out.push_str(
                "Why: every link looks OK; the status may lag behind (the operator re-reconciles shortly)\n",
            ),
        }
    }

    out.push_str("\nChain:\n");
    let width = diagnosis
        .links
        .iter()
        .map(|l| l.subject.chars().count())
        .max()
        .unwrap_or(0);
    for link in &diagnosis.links {
        let mark = match link.state {
            State::Ok => "ok ",
            State::NotOk => "NOT",
        };
        let detail = match (link.reason.is_empty(), link.message.is_empty()) {
            (true, _) => link.message.clone(),
            (false, true) => link.reason.clone(),
            (false, false) => format!("{}: {}", link.reason, link.message),
        };
        let _ = writeln!(out, "  {mark}  {:<width$}  {detail}", link.subject);
        if let (State::NotOk, Some(hint)) = (link.state, &link.hint) {
            let _ = writeln!(out, "       {:<width$}  hint: {hint}", "");
        }
    }

    let conditions = status.map(|s| s.conditions.as_slice()).unwrap_or_default();
    if !conditions.is_empty() {
        out.push_str("\nConditions:\n");
        out.push_str(&conditions_table(conditions));
    }

    let backend_ref = facts
        .machine
        .and_then(|m| m.status.as_ref())
        .and_then(|s| s.backend_ref.as_deref());
    let hints: Vec<Hint> = facts
        .provider
        .and_then(|p| access::console(p, backend_ref))
        .into_iter()
        .chain(access::ssh(addresses))
        .collect();
    out.push_str("\nAccess:\n");
    if hints.is_empty() {
        out.push_str("  none known: no address reported, and the backend offers no console banlieue can point at\n");
    }
    for hint in hints {
        let _ = writeln!(out, "  {:<8} {}", format!("{}:", hint.kind), hint.how);
        if let Some(note) = hint.note {
            let _ = writeln!(out, "  {:<8} ({note})", "");
        }
    }
    out
}

fn conditions_table(conditions: &[Condition]) -> String {
    let width = |f: fn(&Condition) -> &str, title: &str| {
        conditions
            .iter()
            .map(|c| f(c).len())
            .chain([title.len()])
            .max()
            .unwrap_or(0)
    };
    let (t, s, r) = (
        width(|c| &c.type_, "TYPE"),
        width(|c| &c.status, "STATUS"),
        width(|c| &c.reason, "REASON"),
    );
    let mut out = format!(
        "  {:<t$}   {:<s$}   {:<r$}   MESSAGE\n",
        "TYPE", "STATUS", "REASON"
    );
    for c in conditions {
        let _ = writeln!(
            out,
            "  {:<t$}   {:<s$}   {:<r$}   {}",
            c.type_, c.status, c.reason, c.message
        );
    }
    out
}

fn address_type(t: &MachineAddressType) -> &'static str {
    match t {
        MachineAddressType::Hostname => "Hostname",
        MachineAddressType::ExternalIp => "ExternalIP",
        MachineAddressType::InternalIp => "InternalIP",
        MachineAddressType::ExternalDns => "ExternalDNS",
        MachineAddressType::InternalDns => "InternalDNS",
    }
}

fn or_dash(s: &str) -> &str {
    if s.is_empty() { "-" } else { s }
}
