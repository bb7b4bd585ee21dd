use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::*;
use crate::api::common::ProviderClass;
use crate::api::provider::{Connection, ProviderSpec};
use crate::backend::Pending;

fn provider_with(paused: bool, deleting: bool) -> Provider {
    let mut p = Provider::new(
        "pve",
        ProviderSpec {
            class: ProviderClass::Proxmox,
            connection: Connection {
                endpoint: "https://pve:8006".into(),
                ..Default::default()
            },
            capabilities: Default::default(),
            failure_domains: vec![],
            settings: BTreeMap::new(),
            paused,
        },
    );
    if deleting {
        p.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    }
    p
}

#[test]
fn a_machine_about_to_move_or_importing_its_disks_waits() {
    assert_eq!(held(true, Some("pve/vm")), Some(Stop::Quiet), "move first");
    assert_eq!(
        held(false, Some("vc/vm")),
        Some(Stop::Waiting {
            reason: "ImportingDisks",
            message: "its disks are being copied from vc/vm".into(),
            retry: Retry::AwaitChange,
        })
    );
    assert_eq!(held(false, None), None);
}

#[test]
fn a_missing_provider_names_what_was_looked_for() {
    let waiting = |message: &str| {
        Err(Stop::Waiting {
            reason: "ProviderNotFound",
            message: message.into(),
            retry: Retry::Backoff,
        })
    };
    let table = [
        (
            Some("fd-provider"),
            Some("ref"),
            "Provider fd-provider not found",
        ),
        (None, Some("ref"), "Provider ref not found"),
        (
            None,
            None,
            "spec.providerRef is not set (a Cluster API machine gets its Provider from its failure domain once a Machine owns it)",
        ),
    ];
    for (placed_on, referenced, message) in table {
        assert_eq!(
            provider(placed_on, referenced, None, false),
            waiting(message),
            "{placed_on:?} {referenced:?}"
        );
    }
}

#[test]
fn a_paused_or_departing_provider_builds_nothing_new() {
    let paused = provider_with(true, true);
    assert_eq!(
        provider(None, Some("pve"), Some(&paused), true),
        Err(Stop::Paused("the Provider is paused")),
        "paused wins"
    );
    let deleting = provider_with(false, true);
    assert_eq!(
        provider(None, Some("pve"), Some(&deleting), false),
        Err(Stop::Waiting {
            reason: "ProviderDeleting",
            message: "Provider pve is being deleted: nothing new is created on it".into(),
            retry: Retry::AwaitChange,
        })
    );
    assert_eq!(
        provider(None, Some("pve"), Some(&deleting), true),
        Ok(&deleting),
        "a machine already there is reconciled until it is deleted"
    );
    let serving = provider_with(false, false);
    assert_eq!(
        provider(Some("pve"), None, Some(&serving), false),
        Ok(&serving)
    );
}

fn observation(pending: Option<Duration>, power: Option<PowerState>) -> MachineObservation {
    MachineObservation {
        next_boot: None,
        resources: None,
        provider_id: Some("proxmox://pve/100".into()),
        power_state: power,
        addresses: vec![],
        failure_domain: None,
        backend_ref: None,
        pending: pending.map(|retry_after| Pending {
            operation: "Cloning".into(),
            task: None,
            retry_after,
        }),
    }
}

#[test]
fn the_backends_answer_sets_when_to_look_again() {
    let on = PowerState::PoweredOn;
    let next = |retry, announce| Next { retry, announce };
    let cloning = observation(Some(Duration::from_secs(3)), None);
    let booting = observation(None, Some(PowerState::PoweredOff));
    let running = observation(None, Some(on));
    let busy = BackendError::transient("Busy", "try later").retry_after(Duration::from_secs(7));
    let flaky = BackendError::transient("Unreachable", "no route");
    let broken = BackendError::terminal("TemplateNotFound", "no template 9000");
    let table = [
        (
            Ok(&cloning),
            false,
            next(Retry::After(Duration::from_secs(3)), false),
        ),
        (
            Ok(&booting),
            false,
            next(Retry::After(UNSETTLED_RECHECK), false),
        ),
        (Ok(&running), false, next(Retry::SyncPeriod, false)),
        (
            Err(&busy),
            false,
            next(Retry::After(Duration::from_secs(7)), false),
        ),
        (Err(&flaky), false, next(Retry::Backoff, false)),
        (Err(&broken), false, next(Retry::SyncPeriod, true)),
        (Err(&broken), true, next(Retry::SyncPeriod, false)),
    ];
    for (answer, announced, expected) in table {
        assert_eq!(
            after_ensure(answer, on, announced),
            expected,
            "{answer:?} announced {announced}"
        );
    }
}

#[test]
fn the_bootstrap_secret_is_read_before_placement_only_where_its_format_decides_and_never_once_made()
{
    use BootstrapRead::{BeforeEnsure, BeforePlacement, Never};
    // (provider ID, Ready, the format decides placement, read)
    let cases = [
        (false, false, false, BeforeEnsure),
        (false, false, true, BeforePlacement),
        (false, true, false, BeforeEnsure),
        (false, true, true, BeforePlacement),
        (true, false, false, BeforeEnsure),
        (true, false, true, BeforeEnsure),
        (true, true, false, Never),
        (true, true, true, Never),
    ];
    for (id, ready, decides, read) in cases {
        assert_eq!(
            bootstrap_read(id, ready, || decides),
            read,
            "provider ID {id}, ready {ready}, format decides {decides}"
        );
    }
}

#[test]
fn a_made_machine_does_not_ask_whether_the_format_decides_placement() {
    // The question scans every Provider in the namespace: not paid once the VM exists.
    for ready in [false, true] {
        bootstrap_read(true, ready, || panic!("asked, ready {ready}"));
    }
}

#[test]
fn only_a_restart_policy_with_a_change_waiting_for_a_power_cycle_powers_off() {
    use crate::api::resources::{
        ChangeMode, ChangePolicy, MachineField, PendingChange, ResourcesStatus,
    };
    let waiting = |waits_for| ResourcesStatus {
        pending: vec![PendingChange {
            field: MachineField::MemoryMib,
            running: "2048".into(),
            desired: "1024".into(),
            waits_for,
        }],
        ..Default::default()
    };
    let on = PowerState::PoweredOn;
    let power_off = waiting(ChangeMode::PowerOff);
    // (policy, desired power, recorded, change failed, powers off)
    let cases = [
        (ChangePolicy::Restart, on, Some(&power_off), false, true),
        (
            ChangePolicy::Restart,
            on,
            Some(&waiting(ChangeMode::NextBoot)),
            false,
            true,
        ),
        (ChangePolicy::Wait, on, Some(&power_off), false, false),
        (
            ChangePolicy::Restart,
            PowerState::PoweredOff,
            Some(&power_off),
            false,
            false,
        ),
        (
            ChangePolicy::Restart,
            on,
            Some(&waiting(ChangeMode::Never)),
            false,
            false,
        ),
        (ChangePolicy::Restart, on, None, false, false),
        (ChangePolicy::Restart, on, Some(&power_off), true, false),
    ];
    for (policy, desired, recorded, failed, off) in cases {
        let got = restart_to_apply(policy, desired, recorded, failed);
        assert_eq!(
            got.is_some(),
            off,
            "{policy:?} {desired:?} {recorded:?} {failed}"
        );
    }
    let said = restart_to_apply(ChangePolicy::Restart, on, Some(&power_off), false).unwrap();
    assert!(said.contains("memoryMiB 2048 → 1024"), "{said}");
}
