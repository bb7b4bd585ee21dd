use std::collections::BTreeMap;
use std::time::Duration;

use super::*;
use crate::api::common::ProviderClass;
use crate::api::provider::{Connection, ProviderSpec};
use crate::contract::{InfraMachineKind, KindTable};

static KINDS: std::sync::LazyLock<KindTable> = std::sync::LazyLock::new(KindTable::built_in);

fn provider(name: &str, class: ProviderClass) -> Provider {
    let mut p = Provider::new(
        name,
        ProviderSpec {
            class,
            connection: Connection {
                endpoint: "sim://x".into(),
                ..Default::default()
            },
            capabilities: Default::default(),
            failure_domains: vec![],
            settings: BTreeMap::new(),
            paused: false,
        },
    );
    p.metadata.namespace = Some("ns".into());
    p
}

fn target(provider: &str, class: ProviderClass) -> Target {
    Target {
        provider: provider.into(),
        class,
        failure_domain: None,
        topology: BTreeMap::new(),
    }
}

fn machine(kind: InfraMachineKind, provider: &str) -> Existing {
    Existing::sample(kind, "vm", Some(provider), false)
}

/// A VM whose inputs all exist, placed on `pve` (Proxmox), with no machine yet.
fn facts<'a>(existing: &'a [Existing], providers: &'a [Provider]) -> Facts<'a> {
    Facts {
        synced: true,
        held: false,
        settling: None,
        class: ("small", true),
        image: ("ubuntu", true),
        existing,
        decision: Some(Ok(target("pve", ProviderClass::Proxmox))),
        providers,
        copying: false,
        kinds: &KINDS,
    }
}

fn providers() -> Vec<Provider> {
    vec![
        provider("pve", ProviderClass::Proxmox),
        provider("vc", ProviderClass::Vsphere),
    ]
}

fn unschedulable(reason: &'static str, message: &str) -> Placement<'static> {
    Placement::Unschedulable {
        reason,
        message: message.into(),
    }
}

#[test]
fn a_vm_with_everything_is_built_where_it_is_placed() {
    let providers = providers();
    let plan = placement(facts(&[], &providers));
    assert_eq!(
        plan,
        Placement::Build {
            target: target("pve", ProviderClass::Proxmox),
            provider: &providers[0],
            stale: vec![],
        }
    );
}

#[test]
fn nothing_happens_before_the_caches_sync_or_while_held() {
    let providers = providers();
    let unsynced = Facts {
        synced: false,
        held: true,
        ..facts(&[], &providers)
    };
    assert_eq!(placement(unsynced), Placement::Requeue(UNSYNCED_RETRY));
    let held = Facts {
        held: true,
        class: ("small", false),
        ..facts(&[], &providers)
    };
    assert_eq!(placement(held), Placement::AwaitChange);
}

#[test]
fn missing_inputs_are_reported_once_the_vm_has_settled() {
    let providers = providers();
    let table: [((bool, bool), Option<Duration>, Placement<'static>); 5] = [
        (
            (false, true),
            None,
            unschedulable("ClassNotFound", "VMClass small not found"),
        ),
        (
            (true, false),
            None,
            unschedulable("ImageNotFound", "VMImage ubuntu not found"),
        ),
        (
            (false, false),
            None,
            unschedulable("ClassNotFound", "VMClass small not found"),
        ),
        (
            (false, true),
            Some(Duration::from_secs(1)),
            Placement::Requeue(Duration::from_secs(1)),
        ),
        (
            (true, false),
            Some(Duration::from_secs(1)),
            Placement::Requeue(Duration::from_secs(1)),
        ),
    ];
    for ((class, image), settling, expected) in table {
        let f = Facts {
            class: ("small", class),
            image: ("ubuntu", image),
            settling,
            decision: None,
            ..facts(&[], &providers)
        };
        assert_eq!(
            placement(f),
            expected,
            "class {class} image {image} settling {settling:?}"
        );
    }
}

#[test]
fn a_running_machine_is_kept_and_named_while_an_input_is_missing() {
    let providers = providers();
    let existing = [
        Existing::sample(InfraMachineKind::Proxmox, "old", Some("pve"), true),
        machine(InfraMachineKind::Proxmox, "pve"),
    ];
    let f = Facts {
        image: ("ubuntu", false),
        decision: None,
        ..facts(&existing, &providers)
    };
    assert_eq!(
        placement(f),
        Placement::PowerOnly {
            machine: 1,
            reason: "ImageNotFound",
            message: "VMImage ubuntu not found; its ProxmoxMachine vm is kept as it is and only \
                      spec.powerState is applied to it until it exists again (recreate it, or \
                      point the VM at another one)"
                .into(),
        },
        "the machine kept (and powered as asked) is the one not being deleted"
    );
    // Mid-move (two live machines) nothing is touched: the move owns their power.
    let moving = [
        machine(InfraMachineKind::Proxmox, "pve"),
        machine(InfraMachineKind::VSphere, "vc"),
    ];
    let f = Facts {
        class: ("small", false),
        decision: None,
        ..facts(&moving, &providers)
    };
    assert_eq!(
        placement(f),
        unschedulable(
            "ClassNotFound",
            "VMClass small not found; its ProxmoxMachine vm is kept as it is, and changes to the VM wait until it exists again"
        ),
    );
}

#[test]
fn a_scheduler_refusal_is_reported_once_settled() {
    let providers = providers();
    let refused = || {
        Some(Err((
            "NoFeasibleProvider",
            "no Provider has class fast".to_owned(),
        )))
    };
    let settled = Facts {
        decision: refused(),
        ..facts(&[], &providers)
    };
    assert_eq!(
        placement(settled),
        unschedulable("NoFeasibleProvider", "no Provider has class fast")
    );
    let young = Facts {
        decision: refused(),
        settling: Some(Duration::from_secs(1)),
        ..facts(&[], &providers)
    };
    assert_eq!(placement(young), Placement::Requeue(Duration::from_secs(1)));
}

#[test]
fn a_placement_on_a_vanished_provider_waits_for_the_cache() {
    let providers = vec![provider("vc", ProviderClass::Vsphere)];
    assert_eq!(
        placement(facts(&[], &providers)),
        Placement::Requeue(VANISHED_PROVIDER_RETRY)
    );
}

#[test]
fn machines_elsewhere_are_removed_first_on_recreate() {
    let providers = providers();
    let table = [
        // Another Provider.
        (vec![machine(InfraMachineKind::VSphere, "vc")], vec![0]),
        // The right Provider, the wrong kind (its class changed).
        (vec![machine(InfraMachineKind::Libvirt, "pve")], vec![0]),
        // One stays, one goes.
        (
            vec![
                machine(InfraMachineKind::Proxmox, "pve"),
                machine(InfraMachineKind::VSphere, "vc"),
            ],
            vec![1],
        ),
    ];
    for (existing, stale) in table {
        let from = existing[stale[0]].provider.clone().unwrap();
        assert_eq!(
            placement(facts(&existing, &providers)),
            Placement::Recreate {
                target: target("pve", ProviderClass::Proxmox),
                provider: &providers[0],
                stale: stale.clone(),
                message: format!(
                    "{from} -> pve (Recreate: the old machine is deleted first, the new one is made from the image)"
                ),
            },
            "{existing:?}"
        );
    }
}

#[test]
fn copy_disk_builds_the_target_and_names_what_it_copies_from() {
    let providers = providers();
    let existing = [
        machine(InfraMachineKind::VSphere, "vc"),
        machine(InfraMachineKind::Proxmox, "pve"),
    ];
    let f = Facts {
        copying: true,
        ..facts(&existing, &providers)
    };
    assert_eq!(
        placement(f),
        Placement::Build {
            target: target("pve", ProviderClass::Proxmox),
            provider: &providers[0],
            stale: vec![0],
        }
    );
}

#[test]
fn a_machine_that_already_is_what_was_built_is_not_applied() {
    let current = machine(InfraMachineKind::Proxmox, "pve");
    assert_eq!(super::machine(Some(&current), |_| true), Machine::Unchanged);
    assert_eq!(
        super::machine(Some(&current), |_| false),
        Machine::Apply { first: false }
    );
    assert_eq!(
        super::machine(None, |_| true),
        Machine::Apply { first: true }
    );
}

#[test]
fn missing_bootstrap_data_is_looked_for_sooner_than_wrong_data() {
    let sync = Duration::from_secs(600);
    assert_eq!(
        bootstrap_retry(crate::controllers::bootstrap::NOT_FOUND, sync),
        Duration::from_secs(10)
    );
    assert_eq!(bootstrap_retry("BootstrapDataInvalid", sync), sync);
}

mod class_edits {
    use super::super::*;
    use crate::api::vm_class::OsDisk;

    fn spec(cpus: u32, policy: ClassUpdatePolicy) -> VMClassSpec {
        VMClassSpec {
            cpus,
            max_cpus: None,
            cores_per_socket: None,
            memory_mib: 1024,
            max_memory_mib: None,
            firmware: Default::default(),
            disk: OsDisk {
                size_gib: 10,
                provisioning: Default::default(),
                storage_class: None,
            },
            required_features: vec![],
            update_policy: policy,
        }
    }

    fn record(name: &str, generation: i64, cpus: u32, policy: ClassUpdatePolicy) -> ClassRecord {
        ClassRecord {
            name: name.into(),
            generation: Some(generation),
            spec: spec(cpus, policy),
        }
    }

    #[test]
    fn a_class_edit_reaches_the_machine_only_when_the_class_says_so() {
        use ClassUpdatePolicy::*;
        // (the class now, what the machine records, kept (else current))
        type Case = (ClassRecord, Option<ClassRecord>, bool, &'static str);
        let cases: Vec<Case> = vec![
            (record("small", 1, 2, Keep), None, false, "no machine yet"),
            (
                record("small", 1, 2, Keep),
                Some(record("small", 1, 2, Keep)),
                false,
                "unchanged",
            ),
            (
                record("small", 2, 4, Keep),
                Some(record("small", 1, 2, Keep)),
                true,
                "edited, Keep: the machine keeps what it was built with",
            ),
            (
                record("small", 2, 4, Apply),
                Some(record("small", 1, 2, Keep)),
                false,
                "edited, Apply: the edit flows",
            ),
            (
                record("large", 1, 4, Keep),
                Some(record("small", 1, 2, Keep)),
                false,
                "the VM pointed at another class: it takes it",
            ),
            (
                record("small", 3, 2, Keep),
                Some(record("small", 1, 2, Apply)),
                false,
                "only the policy changed: nothing to keep",
            ),
            (
                record("small", 4, 2, Keep),
                Some(record("small", 2, 4, Keep)),
                true,
                "edited back and forth: what differs from the record",
            ),
        ];
        for (now, recorded, kept, why) in cases {
            let decided = class_use(&now, recorded.as_ref());
            assert_eq!(matches!(decided, ClassUse::Kept { .. }), kept, "{why}");
            let (built, on_class) = (decided.spec(&now), decided.report(&now).0);
            assert_eq!(on_class, !kept, "{why}");
            if kept {
                let recorded = recorded.unwrap();
                assert_eq!(built, &recorded.spec, "{why}");
                assert_eq!(decided.record(&now), &recorded, "the record stays: {why}");
            } else {
                assert_eq!(built, &now.spec, "{why}");
                assert_eq!(decided.record(&now), &now, "{why}");
            }
        }
    }

    #[test]
    fn a_kept_class_says_what_moved_and_what_to_do() {
        use ClassUpdatePolicy::*;
        let now = record("small", 3, 4, Keep);
        let decided = class_use(&now, Some(&record("small", 1, 2, Keep)));
        let (current, message) = decided.report(&now);
        assert!(!current);
        assert_eq!(
            message,
            "VMClass small changed since this VM's machine was built (generation 1 → 3: \
             cpus 2 → 4); the VM keeps what it was built with, as the class's updatePolicy \
             is Keep: set updatePolicy: Apply on the class to apply the edit to its VMs, or \
             point the VM at another class"
        );
        let (current, message) = ClassUse::Current.report(&now);
        assert!(current);
        assert_eq!(message, "built from VMClass small as it is (generation 3)");
    }
}
