use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use k8s_openapi::jiff::Timestamp;
use proptest::prelude::*;

use super::*;
use crate::api::common::{LocalObjectReference, ProviderClass};
use crate::api::provider::{Capabilities, ClassMapping, Connection, ProviderSpec, ProviderStatus};
use crate::api::virtual_machine::{
    AntiAffinityTerm, NetworkInterface, Placement, PlacementBasis, VirtualMachineSpec,
    VirtualMachineStatus,
};
use crate::api::vm_class::OsDisk;
use crate::api::vm_image::{
    Architecture, ImageAvailability, ImageSources, OsFamily, OsInfo, SimImageSource, VMImageSpec,
    VMImageStatus,
};

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn ready() -> Vec<Condition> {
    vec![Condition {
        type_: "Ready".into(),
        status: "True".into(),
        reason: "Ready".into(),
        message: String::new(),
        observed_generation: None,
        last_transition_time: Time(Timestamp::UNIX_EPOCH),
    }]
}

fn fd(name: &str, zone: &str) -> DiscoveredFailureDomain {
    DiscoveredFailureDomain {
        name: name.into(),
        labels: labels(&[("zone", zone)]),
        storage_classes: vec!["fast".into()],
        network_classes: vec!["frontend".into()],
        architecture: Some(Architecture::Amd64),
        ..Default::default()
    }
}

fn provider(name: &str, class: ProviderClass, domains: Vec<DiscoveredFailureDomain>) -> Provider {
    let mut p = Provider::new(
        name,
        ProviderSpec {
            class,
            connection: Connection {
                endpoint: "sim://x".into(),
                ..Default::default()
            },
            capabilities: Capabilities {
                storage_classes: vec![ClassMapping {
                    name: "fast".into(),
                    target: labels(&[("pool", "default")]),
                }],
                network_classes: vec![ClassMapping {
                    name: "frontend".into(),
                    target: labels(&[("network", "default")]),
                }],
                features: vec![],
            },
            failure_domains: vec![],
            settings: BTreeMap::new(),
            paused: false,
        },
    );
    p.metadata.namespace = Some("ns".into());
    p.metadata.labels = Some(labels(&[("region", "east")]));
    p.status = Some(ProviderStatus {
        conditions: ready(),
        failure_domains: domains,
        ..Default::default()
    });
    p
}

fn image() -> VMImage {
    VMImage::new(
        "img",
        VMImageSpec {
            os: OsInfo {
                family: OsFamily::Linux,
                distribution: "debian".into(),
                version: "13".into(),
            },
            architecture: Default::default(),
            bootstrap_formats: vec![],
            sources: ImageSources {
                sim: Some(SimImageSource {
                    name: "debian".into(),
                }),
                ..Default::default()
            },
        },
    )
}

/// The image as its controller reports it once it found it on every one of `providers`.
fn image_on(providers: &[Provider]) -> VMImage {
    let mut image = image();
    image.status = Some(VMImageStatus {
        providers: providers
            .iter()
            .map(|p| ImageAvailability {
                namespace: p.metadata.namespace.clone().unwrap_or_default(),
                name: p.metadata.name.clone().unwrap_or_default(),
                available: true,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    });
    image
}

fn class() -> VMClassSpec {
    VMClassSpec {
        cpus: 1,
        cores_per_socket: None,
        memory_mib: 512,
        firmware: Default::default(),
        disk: OsDisk {
            size_gib: 1,
            provisioning: Default::default(),
            storage_class: Some("fast".into()),
        },
        required_features: vec![],
        max_cpus: None,
        max_memory_mib: None,
        update_policy: Default::default(),
    }
}

fn vm(name: &str, placement: Placement) -> VirtualMachine {
    let mut vm = VirtualMachine::new(
        name,
        VirtualMachineSpec {
            change_policy: Default::default(),
            class_ref: LocalObjectReference::new("c"),
            image_ref: LocalObjectReference::new("img"),
            placement,
            power_state: Default::default(),
            bootstrap: None,
            networks: vec![NetworkInterface {
                name: "eth0".into(),
                network_class: "frontend".into(),
                ..Default::default()
            }],
            disks: vec![],
            migration: Default::default(),
        },
    );
    vm.metadata.namespace = Some("ns".into());
    vm.metadata.labels = Some(labels(&[("app", "web")]));
    vm
}

/// `vm` placed at `target`, decided from the spec it has now.
fn placed(mut vm: VirtualMachine, target: &Target) -> VirtualMachine {
    let mut placement = target.to_status(None);
    placement.basis = Some(PlacementBasis::of(&vm.spec));
    vm.status = Some(VirtualMachineStatus {
        placement: Some(placement),
        ..Default::default()
    });
    vm
}

/// What `vm`'s status says its placement was decided from.
fn basis_of(vm: &VirtualMachine) -> Basis<'_> {
    match vm
        .status
        .as_ref()
        .and_then(|s| s.placement.as_ref())
        .and_then(|p| p.basis.as_ref())
    {
        Some(basis) => Basis::Recorded(basis),
        None => Basis::Unrecorded,
    }
}

const KEEP: Decision = Decision::Keep { drift: None };

fn sim(name: &str) -> Provider {
    provider(name, ProviderClass::Sim, vec![fd("a", "za"), fd("b", "zb")])
}

fn decide(vm: &VirtualMachine, providers: &[Provider], siblings: &[VirtualMachine]) -> Decision {
    decide_with(vm, &image_on(providers), providers, siblings)
}

fn decide_with(
    vm: &VirtualMachine,
    image: &VMImage,
    providers: &[Provider],
    siblings: &[VirtualMachine],
) -> Decision {
    let class = class();
    let siblings: Vec<Sibling<'_>> = siblings.iter().map(Sibling::of).collect();
    schedule(&Input {
        vm,
        class: &class,
        image,
        providers,
        current: vm.status.as_ref().and_then(|s| s.placement.as_ref()),
        basis: basis_of(vm),
        siblings: &siblings,
        loads: None,
    })
}

fn target_of(decision: Decision) -> Target {
    match decision {
        Decision::Place(t) => t,
        other => panic!("expected a placement, got {other:?}"),
    }
}

#[test]
fn explicit_provider_and_spread_over_domains() {
    let providers = [sim("p1"), sim("p2")];
    let placement = Placement {
        provider_ref: Some(LocalObjectReference::new("p2")),
        ..Default::default()
    };
    let first = target_of(decide(&vm("v1", placement.clone()), &providers, &[]));
    assert_eq!(
        (first.provider.as_str(), first.failure_domain.as_deref()),
        ("p2", Some("a"))
    );
    let siblings = [placed(vm("v1", placement.clone()), &first)];
    let second = target_of(decide(&vm("v2", placement), &providers, &siblings));
    assert_eq!(
        second.failure_domain.as_deref(),
        Some("b"),
        "the emptier domain wins"
    );
    assert_eq!(
        second
            .topology
            .get(PROVIDER_TOPOLOGY_KEY)
            .map(String::as_str),
        Some("p2")
    );
}

#[test]
fn unschedulable_reasons() {
    let providers = [sim("p1")];
    let missing = Placement {
        provider_ref: Some(LocalObjectReference::new("nope")),
        ..Default::default()
    };
    assert!(matches!(
        decide(&vm("v", missing), &providers, &[]),
        Decision::Unschedulable {
            reason: "ProviderNotFound",
            ..
        }
    ));

    let mut not_ready = sim("p1");
    not_ready.status.as_mut().unwrap().conditions.clear();
    match decide(&vm("v", Placement::default()), &[not_ready], &[]) {
        Decision::Unschedulable { reason, message } => {
            assert_eq!(reason, "NoFeasibleProvider");
            assert!(message.contains("p1: not Ready"), "{message}");
        }
        other => panic!("{other:?}"),
    }

    let vsphere = provider("vc", ProviderClass::Vsphere, vec![fd("a", "za")]);
    match decide(&vm("v", Placement::default()), &[vsphere], &[]) {
        Decision::Unschedulable { message, .. } => {
            assert!(message.contains("image has no vsphere source"), "{message}")
        }
        other => panic!("{other:?}"),
    }

    // Placed only where the image controller found the image: not where it reported it
    // missing, nor where it has not looked yet.
    let v = vm("v", Placement::default());
    let mut missing_there = image_on(&providers);
    missing_there.status.as_mut().unwrap().providers[0].available = false;
    for (image, expected) in [
        (missing_there, "p1: image not available there"),
        (image(), "p1: image not yet checked there"),
    ] {
        match decide_with(&v, &image, &providers, &[]) {
            Decision::Unschedulable { reason, message } => {
                assert_eq!(reason, "NoFeasibleProvider");
                assert!(message.contains(expected), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }

    let mut no_network = vm("v", Placement::default());
    no_network.spec.networks[0].network_class = "backend".into();
    match decide(&no_network, &providers, &[]) {
        Decision::Unschedulable { message, .. } => assert!(
            message.contains("network class backend not offered"),
            "{message}"
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn selectors_filter_providers_and_domains() {
    let mut west = sim("west");
    west.metadata.labels = Some(labels(&[("region", "west")]));
    let providers = [sim("east"), west];
    let placement = Placement {
        provider_selector: Some(LabelSelector {
            match_labels: Some(labels(&[("region", "west")])),
            ..Default::default()
        }),
        failure_domain_selector: Some(LabelSelector {
            match_labels: Some(labels(&[("zone", "zb")])),
            ..Default::default()
        }),
        ..Default::default()
    };
    let target = target_of(decide(&vm("v", placement), &providers, &[]));
    assert_eq!(
        (target.provider.as_str(), target.failure_domain.as_deref()),
        ("west", Some("b"))
    );
}

#[test]
fn required_anti_affinity_spreads_and_then_blocks() {
    let providers = [sim("p1")];
    let placement = Placement {
        anti_affinity: vec![AntiAffinityTerm {
            label_selector: LabelSelector {
                match_labels: Some(labels(&[("app", "web")])),
                ..Default::default()
            },
            topology_key: "zone".into(),
            mode: AffinityMode::Required,
        }],
        ..Default::default()
    };
    let t1 = target_of(decide(&vm("v1", placement.clone()), &providers, &[]));
    let s1 = placed(vm("v1", placement.clone()), &t1);
    let t2 = target_of(decide(
        &vm("v2", placement.clone()),
        &providers,
        std::slice::from_ref(&s1),
    ));
    assert_ne!(t1.failure_domain, t2.failure_domain);
    let s2 = placed(vm("v2", placement.clone()), &t2);
    assert!(matches!(
        decide(&vm("v3", placement.clone()), &providers, &[s1.clone(), s2]),
        Decision::Unschedulable { .. }
    ));
    // The VM never conflicts with itself.
    assert_eq!(decide(&s1, &providers, std::slice::from_ref(&s1)), KEEP);
}

#[test]
fn placement_is_sticky_until_it_stops_matching() {
    let providers = [sim("p1"), sim("p2")];
    let target = target_of(decide(&vm("v", Placement::default()), &providers, &[]));
    let placed_vm = placed(vm("v", Placement::default()), &target);
    // A new, emptier Provider does not attract it; neither does its Provider going down.
    let mut down = sim(&target.provider);
    down.status.as_mut().unwrap().conditions.clear();
    assert_eq!(decide(&placed_vm, &[down, sim("p0")], &[]), KEEP);
    // Changing providerRef moves it.
    let mut moved = placed_vm.clone();
    moved.spec.placement.provider_ref = Some(LocalObjectReference::new("p2"));
    assert_eq!(target_of(decide(&moved, &providers, &[])).provider, "p2");
    // Its Provider disappearing does not: it is bound there, and says so.
    match decide(&placed_vm, &[sim("other")], &[]) {
        Decision::Unschedulable { reason, message } => {
            assert_eq!(reason, "ProviderNotFound");
            assert!(message.contains("change spec.placement"), "{message}");
        }
        other => panic!("a bound VM was moved: {other:?}"),
    }
}

#[test]
fn a_placement_read_back_from_its_machine_is_kept() {
    let providers = [sim("p1"), sim("p2")];
    let placement = Placement {
        provider_ref: Some(LocalObjectReference::new("p2")),
        ..Default::default()
    };
    let target = target_of(decide(&vm("v", placement.clone()), &providers, &[]));
    let recovered = placement_of_machine(&providers, "p2", target.failure_domain.as_deref())
        .expect("p2 exists");
    assert_eq!(
        recovered,
        target.to_status(None),
        "same topology as decided"
    );
    // The recovered placement keeps the VM where its machine is, even when the
    // scheduler would now choose the other domain.
    let siblings = [placed(vm("other", placement.clone()), &target)];
    let (class, image) = (class(), image_on(&providers));
    let siblings: Vec<Sibling<'_>> = siblings.iter().map(Sibling::of).collect();
    let fresh = vm("v", placement);
    let input = |current| Input {
        vm: &fresh,
        class: &class,
        image: &image,
        providers: &providers,
        current,
        basis: Basis::Unrecorded,
        siblings: &siblings,
        loads: None,
    };
    assert_eq!(schedule(&input(Some(&recovered))), KEEP);
    assert_ne!(
        target_of(schedule(&input(None))).failure_domain,
        target.failure_domain,
        "without it, spreading would move the VM"
    );
    // A machine on a failure domain the Provider no longer lists keeps no topology
    // beyond what it names; a vanished Provider gives nothing.
    let gone = placement_of_machine(&providers, "p1", Some("zz")).expect("p1 exists");
    assert!(gone.topology.is_empty());
    assert_eq!(placement_of_machine(&providers, "p9", None), None);
}

fn arb_providers() -> impl Strategy<Value = Vec<Provider>> {
    proptest::collection::vec((0u8..4, any::<bool>(), 0usize..3), 1..5).prop_map(|specs| {
        specs
            .into_iter()
            .enumerate()
            .map(|(i, (region, ready_flag, domains))| {
                let mut p = sim(&format!("p{i}"));
                p.metadata.labels = Some(labels(&[(
                    "region",
                    ["east", "west", "north", "south"][region as usize],
                )]));
                let status = p.status.as_mut().unwrap();
                if !ready_flag {
                    status.conditions.clear();
                }
                status.failure_domains.truncate(domains);
                p
            })
            .collect()
    })
}

proptest! {
    /// Same input, same answer; and whatever is chosen satisfies the placement.
    #[test]
    fn deterministic_and_feasible(providers in arb_providers(), region in 0u8..4, count in 0usize..6) {
        let region = ["east", "west", "north", "south"][region as usize];
        let placement = Placement {
            provider_selector: Some(LabelSelector { match_labels: Some(labels(&[("region", region)])), ..Default::default() }),
            ..Default::default()
        };
        let mut siblings = Vec::new();
        for i in 0..count {
            let v = vm(&format!("v{i}"), placement.clone());
            let decision = decide(&v, &providers, &siblings);
            prop_assert_eq!(&decision, &decide(&v, &providers, &siblings));
            if let Decision::Place(t) = decision {
                let p = providers.iter().find(|p| p.metadata.name.as_deref() == Some(t.provider.as_str())).unwrap();
                prop_assert_eq!(p.metadata.labels.as_ref().unwrap().get("region").map(String::as_str), Some(region));
                prop_assert!(conditions::is_true(&p.status.as_ref().unwrap().conditions, "Ready"));
                let placed_vm = placed(v.clone(), &t);
                prop_assert_eq!(decide(&placed_vm, &providers, &siblings), KEEP, "sticky once placed");
                siblings.push(placed_vm);
            }
        }
    }
}

#[test]
fn loads_count_placed_siblings_but_the_vm_itself() {
    let target = |fd: &str| Target {
        provider: "p1".into(),
        class: ProviderClass::Sim,
        failure_domain: Some(fd.into()),
        topology: BTreeMap::new(),
    };
    let vms = [
        placed(vm("a", Placement::default()), &target("a")),
        placed(vm("b", Placement::default()), &target("a")),
        placed(vm("me", Placement::default()), &target("b")),
        vm("unplaced", Placement::default()),
    ];
    let siblings: Vec<Sibling<'_>> = vms.iter().map(Sibling::of).collect();
    let loads = Loads::of(&siblings, "me");
    assert_eq!(loads.get("p1", Some("a")), 2);
    assert_eq!(loads.get("p1", Some("b")), 0);
    assert_eq!(loads.get("p1", None), 0);
    assert_eq!(loads.get("p2", Some("a")), 0);
}

proptest! {
    /// Spread read from counts kept apart (siblings passed only for anti-affinity, as
    /// the VM controller does) decides exactly as counting the siblings themselves.
    #[test]
    fn counted_loads_decide_as_siblings_do(
        providers in arb_providers(),
        placed_on in proptest::collection::vec((0usize..5, 0usize..3), 0..8),
        region in 0u8..5,
        shy in proptest::option::of(any::<bool>()),
    ) {
        let placement = Placement {
            provider_selector: (region < 4).then(|| LabelSelector {
                match_labels: Some(labels(&[("region", ["east", "west", "north", "south"][region as usize])])),
                ..Default::default()
            }),
            anti_affinity: shy.map(|required| AntiAffinityTerm {
                label_selector: LabelSelector::default(),
                topology_key: "zone".into(),
                mode: if required { AffinityMode::Required } else { AffinityMode::Preferred },
            }).into_iter().collect(),
            ..Default::default()
        };
        // Siblings placed anywhere, feasible or not.
        let siblings: Vec<VirtualMachine> = placed_on
            .iter()
            .enumerate()
            .filter_map(|(i, &(p, d))| {
                let provider = providers.get(p % providers.len())?;
                let (domain, topology) = domains_of(provider).into_iter().nth(d)?;
                let target = Target {
                    provider: provider.metadata.name.clone().unwrap_or_default(),
                    class: provider.spec.class,
                    failure_domain: domain.map(|d| d.name.clone()),
                    topology,
                };
                Some(placed(vm(&format!("s{i}"), placement.clone()), &target))
            })
            .collect();
        let v = vm("v", placement);
        let (class, image) = (class(), image_on(&providers));
        let all: Vec<Sibling<'_>> = siblings.iter().map(Sibling::of).collect();
        let loads = Loads::of(&all, "v");
        let needed: &[Sibling<'_>] = if v.spec.placement.anti_affinity.is_empty() { &[] } else { &all };
        let counted = schedule(&Input {
            vm: &v, class: &class, image: &image, providers: &providers, current: None,
            basis: Basis::Unrecorded, siblings: needed, loads: Some(&loads),
        });
        prop_assert_eq!(counted, decide(&v, &providers, &siblings));
    }
}

mod capability_checks {
    use super::*;
    use crate::api::common::{BootstrapFormat, Firmware, PowerState};
    use crate::api::provider::{BackendCapabilities, ImageSourceKind};
    use crate::api::virtual_machine::Bootstrap;
    use crate::backend::capabilities::{ALL_BOOTSTRAP_FORMATS, ALL_FIRMWARE, ALL_POWER_STATES};

    fn caps(
        firmware: &[Firmware],
        bootstrap: &[BootstrapFormat],
        power: &[PowerState],
    ) -> BackendCapabilities {
        BackendCapabilities {
            firmware: firmware.to_vec(),
            bootstrap_formats: bootstrap.to_vec(),
            power_states: power.to_vec(),
            image_sources: vec![ImageSourceKind::Name],
            ..Default::default()
        }
    }

    fn everything() -> BackendCapabilities {
        caps(&ALL_FIRMWARE, &ALL_BOOTSTRAP_FORMATS, &ALL_POWER_STATES)
    }

    fn with_caps(name: &str, caps: Option<BackendCapabilities>) -> Provider {
        let mut p = sim(name);
        p.status.as_mut().unwrap().backend_capabilities = caps;
        p
    }

    fn asking(
        firmware: Firmware,
        bootstrap: Option<BootstrapFormat>,
        power: PowerState,
    ) -> (VirtualMachine, VMClassSpec) {
        let mut v = vm("v", Placement::default());
        v.spec.power_state = power;
        v.spec.bootstrap = bootstrap.map(|format| Bootstrap {
            format,
            user_data: Some(Default::default()),
            network_config: None,
        });
        let mut c = class();
        c.firmware = firmware;
        (v, c)
    }

    fn run(
        vm: &VirtualMachine,
        class: &VMClassSpec,
        image: &VMImage,
        providers: &[Provider],
    ) -> Decision {
        schedule(&Input {
            vm,
            class,
            image,
            providers,
            current: vm.status.as_ref().and_then(|s| s.placement.as_ref()),
            basis: basis_of(vm),
            siblings: &[],
            loads: None,
        })
    }

    fn all_formats(mut image: VMImage) -> VMImage {
        image.spec.bootstrap_formats = ALL_BOOTSTRAP_FORMATS.to_vec();
        image
    }

    /// One Provider: what it publishes, what the VM asks, and the answer (the Provider
    /// chosen, or the reason and the phrases the message must hold).
    #[test]
    fn a_provider_serves_only_what_it_publishes() {
        use BootstrapFormat::*;
        use Firmware::*;
        use PowerState::*;
        type Case<'a> = (
            Option<BackendCapabilities>,
            (Firmware, Option<BootstrapFormat>, PowerState),
            Result<(), (&'a str, &'a [&'a str])>,
        );
        let cases: Vec<Case<'_>> = vec![
            (
                Some(everything()),
                (EfiSecure, Some(Ignition), Suspended),
                Ok(()),
            ),
            (None, (Efi, Some(CloudConfig), PoweredOff), Ok(())),
            (None, (Bios, None, PoweredOn), Ok(())),
            (
                None,
                (EfiSecure, Some(Ignition), PoweredOn),
                Err((
                    CAPABILITIES_MISSING,
                    &["p: cannot boot efi-secure; cannot deliver ignition"],
                )),
            ),
            (
                Some(caps(
                    &[Bios, Efi],
                    &[CloudConfig, Ignition],
                    &[PoweredOn, PoweredOff],
                )),
                (Efi, Some(Ignition), Suspended),
                Err((CAPABILITIES_MISSING, &["p: cannot be Suspended"])),
            ),
            (
                Some(caps(&[Efi], &[CloudConfig], &ALL_POWER_STATES)),
                (Bios, None, PoweredOn),
                Err((CAPABILITIES_MISSING, &["p: cannot boot bios"])),
            ),
            (
                Some(BackendCapabilities {
                    image_sources: vec![ImageSourceKind::Template],
                    ..everything()
                }),
                (Efi, None, PoweredOn),
                Err((
                    CAPABILITIES_MISSING,
                    &["p: cannot boot an image from a name"],
                )),
            ),
        ];
        for (published, (firmware, bootstrap, power), want) in cases {
            let providers = [with_caps("p", published.clone())];
            let (v, c) = asking(firmware, bootstrap, power);
            let image = all_formats(image_on(&providers));
            let got = run(&v, &c, &image, &providers);
            let case = format!("{published:?} asked {firmware:?} {bootstrap:?} {power:?}");
            match (got, want) {
                (Decision::Place(t), Ok(())) => assert_eq!(t.provider, "p", "{case}"),
                (Decision::Unschedulable { reason, message }, Err((want_reason, phrases))) => {
                    assert_eq!(reason, want_reason, "{case}: {message}");
                    for phrase in phrases {
                        assert!(
                            message.contains(phrase),
                            "{case}: {message:?} lacks {phrase:?}"
                        );
                    }
                }
                (got, want) => panic!("{case}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn a_selector_places_on_the_provider_that_can_and_says_why_not_the_others() {
        let providers = [
            with_caps("plain", None),
            with_caps("secure", Some(everything())),
        ];
        let (v, c) = asking(
            Firmware::EfiSecure,
            Some(BootstrapFormat::Ignition),
            PowerState::PoweredOn,
        );
        let image = all_formats(image_on(&providers));
        assert_eq!(
            target_of(run(&v, &c, &image, &providers)).provider,
            "secure"
        );

        // Without the capable one: named per Provider, with a reason that says so.
        let only_plain = [with_caps("plain", None), {
            let mut p = with_caps("down", Some(everything()));
            p.status.as_mut().unwrap().conditions.clear();
            p
        }];
        let image = all_formats(image_on(&only_plain));
        match run(&v, &c, &image, &only_plain) {
            Decision::Unschedulable { reason, message } => {
                assert_eq!(reason, "NoFeasibleProvider", "one is only not Ready");
                assert!(
                    message.contains("plain: cannot boot efi-secure; cannot deliver ignition")
                        && message.contains("down: not Ready"),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_image_that_declares_only_cloud_config_takes_no_ignition() {
        let providers = [with_caps("p", Some(everything()))];
        let (v, c) = asking(
            Firmware::Efi,
            Some(BootstrapFormat::Ignition),
            PowerState::PoweredOn,
        );
        let mut image = image_on(&providers);
        image.spec.bootstrap_formats = vec![BootstrapFormat::CloudConfig];
        match run(&v, &c, &image, &providers) {
            Decision::Unschedulable { reason, message } => {
                assert_eq!(reason, "BootstrapFormatUnsupported");
                assert!(
                    message.contains("[cloud-config]") && message.contains("ignition"),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
        // Declaring none is not checked; declaring ignition is fine.
        image.spec.bootstrap_formats = vec![];
        assert!(matches!(
            run(&v, &c, &image, &providers),
            Decision::Place(_)
        ));
        image.spec.bootstrap_formats = vec![BootstrapFormat::Ignition];
        assert!(matches!(
            run(&v, &c, &image, &providers),
            Decision::Place(_)
        ));
    }

    #[test]
    fn a_placed_vm_asking_to_suspend_where_it_cannot_stays_and_says_so() {
        let providers = [with_caps("p", None), with_caps("q", Some(everything()))];
        let image = all_formats(image_on(&providers));
        let (v, c) = asking(Firmware::EfiSecure, None, PowerState::PoweredOn);
        let mut v = placed(
            v,
            &Target {
                provider: "p".into(),
                class: ProviderClass::Sim,
                failure_domain: Some("a".into()),
                topology: BTreeMap::new(),
            },
        );
        // Placed before the Provider lost efi-secure: kept, and the loss reported.
        match run(&v, &c, &image, &providers) {
            Decision::Keep { drift: Some(drift) } => {
                assert_eq!(drift.reason, CAPABILITIES_CHANGED);
                assert!(drift.message.contains("efi-secure"), "{}", drift.message);
            }
            other => panic!("{other:?}"),
        }
        v.spec.power_state = PowerState::Suspended;
        match run(&v, &c, &image, &providers) {
            Decision::Unschedulable { reason, message } => {
                assert_eq!(reason, CAPABILITIES_MISSING);
                assert!(message.starts_with("p: cannot be Suspended"), "{message}");
            }
            other => panic!("never moved to q: {other:?}"),
        }
    }

    fn arb_caps() -> impl Strategy<Value = BackendCapabilities> {
        (
            proptest::sample::subsequence(ALL_FIRMWARE.to_vec(), 0..=3),
            proptest::sample::subsequence(ALL_BOOTSTRAP_FORMATS.to_vec(), 0..=2),
            proptest::sample::subsequence(ALL_POWER_STATES.to_vec(), 0..=3),
        )
            .prop_map(|(f, b, p)| caps(&f, &b, &p))
    }

    proptest! {
        /// Placed exactly where nothing asked is missing; otherwise every missing thing
        /// of every Provider is named.
        #[test]
        fn placed_only_where_everything_asked_is_published(
            published in proptest::collection::vec(arb_caps(), 1..4),
            firmware in proptest::sample::select(ALL_FIRMWARE.to_vec()),
            bootstrap in proptest::option::of(proptest::sample::select(ALL_BOOTSTRAP_FORMATS.to_vec())),
            power in proptest::sample::select(ALL_POWER_STATES.to_vec()),
        ) {
            let providers: Vec<Provider> = published
                .iter()
                .enumerate()
                .map(|(i, c)| with_caps(&format!("p{i}"), Some(c.clone())))
                .collect();
            let (v, c) = asking(firmware, bootstrap, power);
            let image = all_formats(image_on(&providers));
            let wants = crate::backend::Wants {
                firmware: Some(firmware),
                bootstrap,
                power_state: power,
                image_source: Some(ImageSourceKind::Name),
                grow_live: vec![],
            };
            let able: Vec<String> = published
                .iter()
                .enumerate()
                .filter(|(_, c)| c.missing(&wants).is_empty())
                .map(|(i, _)| format!("p{i}"))
                .collect();
            match run(&v, &c, &image, &providers) {
                Decision::Place(t) => prop_assert!(able.contains(&t.provider)),
                Decision::Unschedulable { reason, message } => {
                    prop_assert!(able.is_empty());
                    prop_assert_eq!(reason, CAPABILITIES_MISSING);
                    for (i, c) in published.iter().enumerate() {
                        let line = format!("p{i}: {}", c.missing(&wants).join("; "));
                        prop_assert!(message.contains(&line), "{} lacks {}", message, line);
                    }
                }
                Decision::Keep { .. } => prop_assert!(false, "never placed"),
            }
        }
    }
}

/// A placed VM is bound: what other objects do never moves it, its own spec can.
mod binding_rules {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn selector(pairs: &[(&str, &str)]) -> Option<LabelSelector> {
        Some(LabelSelector {
            match_labels: Some(labels(pairs)),
            ..Default::default()
        })
    }

    fn zone_in(zones: &[&str]) -> Option<LabelSelector> {
        Some(LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "zone".into(),
                operator: "In".into(),
                values: Some(zones.iter().map(|z| z.to_string()).collect()),
            }]),
            ..Default::default()
        })
    }

    /// Two Providers of region east; `v` (selecting region east, zone za) placed on p1/a.
    fn world() -> (Vec<Provider>, VirtualMachine) {
        let providers = vec![sim("p1"), sim("p2")];
        let placement = Placement {
            provider_selector: selector(&[("region", "east")]),
            failure_domain_selector: zone_in(&["za"]),
            ..Default::default()
        };
        let v = vm("v", placement);
        let target = target_of(decide(&v, &providers, &[]));
        assert_eq!(
            (target.provider.as_str(), target.failure_domain.as_deref()),
            ("p1", Some("a"))
        );
        (providers.clone(), placed(v, &target))
    }

    fn drift(decision: Decision) -> Drift {
        match decision {
            Decision::Keep { drift: Some(drift) } => drift,
            other => panic!("expected a kept VM with a drift, got {other:?}"),
        }
    }

    fn moved_to(decision: Decision) -> String {
        match decision {
            Decision::Place(t) => {
                format!("{}/{}", t.provider, t.failure_domain.unwrap_or_default())
            }
            other => panic!("expected a move, got {other:?}"),
        }
    }

    #[test]
    fn a_change_elsewhere_is_reported_and_moves_nothing() {
        let (providers, v) = world();
        type Edit = fn(&mut Vec<Provider>);
        let table: [(&str, Edit, &str, &str); 7] = [
            (
                "the Provider relabelled",
                |p| p[0].metadata.labels = Some(labels(&[("region", "west")])),
                PROVIDER_LABELS_CHANGED,
                "no longer matches spec.placement.providerSelector",
            ),
            (
                "the failure domain's labels changed",
                |p| p[0].status.as_mut().unwrap().failure_domains[0] = fd("a", "zx"),
                FAILURE_DOMAIN_CHANGED,
                "failure domain a of Provider p1 no longer matches",
            ),
            (
                "the failure domain no longer reported",
                |p| {
                    p[0].status
                        .as_mut()
                        .unwrap()
                        .failure_domains
                        .remove(0)
                        .name
                        .clear()
                },
                FAILURE_DOMAIN_CHANGED,
                "no longer reports failure domain a",
            ),
            (
                "a storage class no longer offered",
                |p| {
                    p[0].status.as_mut().unwrap().failure_domains[0]
                        .storage_classes
                        .clear()
                },
                CAPABILITIES_CHANGED,
                "storage class fast not offered",
            ),
            (
                "a network class unmapped",
                |p| {
                    p[0].status.as_mut().unwrap().failure_domains[0]
                        .network_classes
                        .clear()
                },
                CAPABILITIES_CHANGED,
                "network class frontend not offered",
            ),
            (
                "the backend no longer publishing a firmware",
                |p| {
                    p[0].status.as_mut().unwrap().backend_capabilities =
                        Some(crate::api::provider::BackendCapabilities {
                            power_states: vec![crate::api::common::PowerState::PoweredOn],
                            ..Default::default()
                        })
                },
                CAPABILITIES_CHANGED,
                "cannot boot",
            ),
            (
                "the Provider being deleted",
                |p| p[0].metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH)),
                PROVIDER_DELETING,
                "Provider p1 is being deleted",
            ),
        ];
        for (case, edit, reason, text) in table {
            let mut edited = providers.clone();
            edit(&mut edited);
            let d = drift(decide(&v, &edited, &[]));
            assert_eq!(d.reason, reason, "{case}: {}", d.message);
            assert!(d.message.contains(text), "{case}: {}", d.message);
            assert!(
                d.message.contains("Nothing is moved") && d.message.contains("its own spec"),
                "{case}: says what holds and how to move it: {}",
                d.message
            );
        }
        // Untouched: no drift at all.
        assert_eq!(decide(&v, &providers, &[]), KEEP);
    }

    #[test]
    fn a_provider_that_is_down_reports_no_drift() {
        let (mut providers, v) = world();
        let status = providers[0].status.as_mut().unwrap();
        status.conditions.clear();
        status.failure_domains.clear();
        status.backend_capabilities = None;
        assert_eq!(decide(&v, &providers, &[]), KEEP);
    }

    #[test]
    fn the_vms_own_spec_can_move_it() {
        let (providers, v) = world();
        let mut by_ref = v.clone();
        by_ref.spec.placement.provider_selector = None;
        by_ref.spec.placement.provider_ref = Some(LocalObjectReference::new("p2"));
        assert_eq!(moved_to(decide(&by_ref, &providers, &[])), "p2/a");

        let mut other_zone = v.clone();
        other_zone.spec.placement.failure_domain_selector = zone_in(&["zb"]);
        assert_eq!(moved_to(decide(&other_zone, &providers, &[])), "p1/b");

        // A new class the Provider cannot serve (a feature only p2 has).
        let mut featured = providers.clone();
        for domain in &mut featured[1].status.as_mut().unwrap().failure_domains {
            domain.features = vec!["gpu".into()];
        }
        let mut new_class = v.clone();
        new_class.spec.class_ref = LocalObjectReference::new("gpu");
        let mut gpu = class();
        gpu.required_features = vec!["gpu".into()];
        let siblings: Vec<Sibling<'_>> = Vec::new();
        let image = image_on(&featured);
        let run = |vm: &VirtualMachine, class: &VMClassSpec| {
            schedule(&Input {
                vm,
                class,
                image: &image,
                providers: &featured,
                current: vm.status.as_ref().and_then(|s| s.placement.as_ref()),
                basis: basis_of(vm),
                siblings: &siblings,
                loads: None,
            })
        };
        assert_eq!(moved_to(run(&new_class, &gpu)), "p2/a");
        // A new class it can serve: stays.
        assert_eq!(run(&new_class, &class()), KEEP);
        // The same class needing gpu without a spec change (the class object edited):
        // stays, and says so.
        let d = drift(run(&v, &gpu));
        assert_eq!(d.reason, CAPABILITIES_CHANGED);
        assert!(
            d.message.contains("feature gpu not offered"),
            "{}",
            d.message
        );
    }

    #[test]
    fn a_spec_change_moves_only_for_what_it_changed() {
        let (mut providers, v) = world();
        // The domain drifted; then the owner edits only the providerSelector, to one
        // the Provider still matches: the domain's drift does not move it.
        providers[0].status.as_mut().unwrap().failure_domains[0] = fd("a", "zx");
        let mut edited = v.clone();
        edited.spec.placement.provider_selector = selector(&[("region", "east"), ("app", "x")]);
        providers[0]
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("app".into(), "x".into());
        assert_eq!(
            drift(decide(&edited, &providers, &[])).reason,
            FAILURE_DOMAIN_CHANGED
        );
        // Anti-affinity edits never move a placed VM.
        let mut spread = v.clone();
        spread.spec.placement.anti_affinity = vec![AntiAffinityTerm {
            label_selector: selector(&[("app", "web")]).unwrap(),
            topology_key: "zone".into(),
            mode: AffinityMode::Required,
        }];
        let sibling = placed(
            vm("s", Placement::default()),
            &Target {
                provider: "p1".into(),
                class: ProviderClass::Sim,
                failure_domain: Some("a".into()),
                topology: labels(&[("zone", "zx")]),
            },
        );
        assert!(matches!(
            decide(&spread, &providers, &[sibling]),
            Decision::Keep { .. }
        ));
    }

    #[test]
    fn a_vm_placed_before_bases_were_recorded_is_bound() {
        let (providers, mut v) = world();
        v.status.as_mut().unwrap().placement.as_mut().unwrap().basis = None;
        let mut relabelled = providers.clone();
        relabelled[0].metadata.labels = Some(labels(&[("region", "west")]));
        assert_eq!(
            drift(decide(&v, &relabelled, &[])).reason,
            PROVIDER_LABELS_CHANGED
        );
        // Even its providerRef naming another Provider: it cannot be told from an edit
        // made before the upgrade; it stays and says how to move it.
        v.spec.placement.provider_selector = None;
        v.spec.placement.provider_ref = Some(LocalObjectReference::new("p2"));
        let d = drift(decide(&v, &providers, &[]));
        assert!(
            d.message.contains("change spec.placement again"),
            "{}",
            d.message
        );
    }

    #[test]
    fn a_pending_move_is_checked_again() {
        let (providers, mut v) = world();
        v.spec.placement.provider_selector = None;
        v.spec.placement.provider_ref = Some(LocalObjectReference::new("p2"));
        // Recorded as if already decided from this spec (a copy that failed mid-move
        // wrote it), but the move is still asked for.
        v.status.as_mut().unwrap().placement.as_mut().unwrap().basis =
            Some(PlacementBasis::of(&v.spec));
        let (class, image) = (class(), image_on(&providers));
        let input = |basis| Input {
            vm: &v,
            class: &class,
            image: &image,
            providers: &providers,
            current: v.status.as_ref().and_then(|s| s.placement.as_ref()),
            basis,
            siblings: &[],
            loads: None,
        };
        assert!(matches!(
            schedule(&input(basis_of(&v))),
            Decision::Keep { .. }
        ));
        assert_eq!(moved_to(schedule(&input(Basis::MovePending))), "p2/a");
    }

    #[test]
    fn a_new_image_not_yet_checked_there_waits() {
        let (providers, mut v) = world();
        v.spec.image_ref = LocalObjectReference::new("img2");
        let mut unchecked = image();
        unchecked.metadata.name = Some("img2".into());
        match decide_with(&v, &unchecked, &providers, &[]) {
            Decision::Unschedulable { reason, message } => {
                assert_eq!(reason, "ImageNotYetChecked");
                assert!(message.contains("stays as it is"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        let mut missing = image_on(&providers);
        missing.metadata.name = Some("img2".into());
        missing.status.as_mut().unwrap().providers[0].available = false;
        assert_eq!(moved_to(decide_with(&v, &missing, &providers, &[])), "p2/a");
    }

    #[test]
    fn not_ready_says_why() {
        let mut p = sim("p1");
        p.status.as_mut().unwrap().conditions = vec![Condition {
            type_: "Ready".into(),
            status: "False".into(),
            reason: "Unreachable".into(),
            message: "connection refused".into(),
            observed_generation: None,
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
        }];
        let mut unchecked = sim("p2");
        unchecked.status.as_mut().unwrap().conditions.clear();
        let v = vm("v", Placement::default());
        match decide(&v, &[p, unchecked], &[]) {
            Decision::Unschedulable { message, .. } => assert_eq!(
                message,
                "no Provider fits: p1: not Ready (Unreachable: connection refused); \
                 p2: not Ready (not checked yet: the Provider has no Ready condition)"
            ),
            other => panic!("{other:?}"),
        }
    }

    /// One edit to the Providers, drawn at random.
    #[derive(Clone, Debug)]
    enum Edit {
        Relabel(usize, u8),
        DomainLabels(usize, usize, u8),
        DropDomain(usize, usize),
        DropStorage(usize),
        DropFeatures(usize),
        Capabilities(usize),
        NotReady(usize),
        Pause(usize),
        Delete(usize),
        Add(u8),
    }

    fn edit() -> impl Strategy<Value = Edit> {
        prop_oneof![
            (0usize..3, 0u8..4).prop_map(|(p, r)| Edit::Relabel(p, r)),
            (0usize..3, 0usize..2, 0u8..4).prop_map(|(p, d, z)| Edit::DomainLabels(p, d, z)),
            (0usize..3, 0usize..2).prop_map(|(p, d)| Edit::DropDomain(p, d)),
            (0usize..3).prop_map(Edit::DropStorage),
            (0usize..3).prop_map(Edit::DropFeatures),
            (0usize..3).prop_map(Edit::Capabilities),
            (0usize..3).prop_map(Edit::NotReady),
            (0usize..3).prop_map(Edit::Pause),
            (0usize..3).prop_map(Edit::Delete),
            (0u8..4).prop_map(Edit::Add),
        ]
    }

    const REGIONS: [&str; 4] = ["east", "west", "north", "south"];
    const ZONES: [&str; 4] = ["za", "zb", "zc", "zd"];

    fn apply(providers: &mut Vec<Provider>, edit: &Edit) {
        let n = providers.len();
        match *edit {
            Edit::Relabel(p, r) => {
                providers[p % n].metadata.labels = Some(labels(&[("region", REGIONS[r as usize])]))
            }
            Edit::DomainLabels(p, d, z) => {
                let domains = &mut providers[p % n].status.as_mut().unwrap().failure_domains;
                if let Some(domain) = domains.get_mut(d) {
                    domain.labels = labels(&[("zone", ZONES[z as usize])]);
                }
            }
            Edit::DropDomain(p, d) => {
                let domains = &mut providers[p % n].status.as_mut().unwrap().failure_domains;
                if d < domains.len() {
                    domains.remove(d);
                }
            }
            Edit::DropStorage(p) => {
                for d in &mut providers[p % n].status.as_mut().unwrap().failure_domains {
                    d.storage_classes.clear();
                }
            }
            Edit::DropFeatures(p) => {
                for d in &mut providers[p % n].status.as_mut().unwrap().failure_domains {
                    d.features.clear();
                }
            }
            Edit::Capabilities(p) => {
                providers[p % n]
                    .status
                    .as_mut()
                    .unwrap()
                    .backend_capabilities = Some(Default::default())
            }
            Edit::NotReady(p) => providers[p % n].status.as_mut().unwrap().conditions.clear(),
            Edit::Pause(p) => providers[p % n].spec.paused = true,
            Edit::Delete(p) => {
                providers[p % n].metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH))
            }
            Edit::Add(r) => {
                let mut fresh = sim(&format!("p{}", providers.len()));
                fresh.metadata.labels = Some(labels(&[("region", REGIONS[r as usize])]));
                providers.push(fresh);
            }
        }
    }

    proptest! {
        /// For any edits to Providers, their failure domains and capabilities, with the
        /// VM's spec unchanged, a placed VM is never moved (kept, or reported where it is).
        #[test]
        fn no_change_elsewhere_moves_a_placed_vm(
            region in 0u8..4,
            zones in proptest::collection::vec(0u8..4, 0..3),
            features in any::<bool>(),
            recorded in any::<bool>(),
            edits in proptest::collection::vec(edit(), 1..8),
        ) {
            let mut providers = vec![sim("p0"), sim("p1"), sim("p2")];
            for p in &mut providers {
                p.metadata.labels = Some(labels(&[("region", REGIONS[region as usize])]));
                for d in &mut p.status.as_mut().unwrap().failure_domains {
                    d.features = vec!["gpu".into()];
                }
            }
            let placement = Placement {
                provider_selector: selector(&[("region", REGIONS[region as usize])]),
                failure_domain_selector: (!zones.is_empty()).then(|| {
                    let names: Vec<&str> = zones.iter().map(|z| ZONES[*z as usize]).collect();
                    zone_in(&names)
                }).flatten(),
                ..Default::default()
            };
            let mut c = class();
            if features {
                c.required_features = vec!["gpu".into()];
            }
            let fresh = vm("v", placement);
            let image = image_on(&providers);
            let first = schedule(&Input {
                vm: &fresh, class: &c, image: &image, providers: &providers, current: None,
                basis: Basis::Unrecorded, siblings: &[], loads: None,
            });
            let Decision::Place(target) = first else { return Ok(()) };
            let mut v = placed(fresh, &target);
            if !recorded {
                v.status.as_mut().unwrap().placement.as_mut().unwrap().basis = None;
            }
            for e in &edits {
                apply(&mut providers, e);
            }
            let decision = schedule(&Input {
                vm: &v, class: &c, image: &image, providers: &providers,
                current: v.status.as_ref().and_then(|s| s.placement.as_ref()),
                basis: basis_of(&v), siblings: &[], loads: None,
            });
            prop_assert!(
                !matches!(decision, Decision::Place(_)),
                "moved by {:?}: {:?}", edits, decision
            );
        }
    }
}

/// A VMImage's architecture is honoured: placed only in failure domains whose hosts
/// have it, refused (naming the image's architecture and what each candidate has)
/// everywhere else, and never where the backend does not say.
mod architecture {
    use super::*;

    use Architecture::{Amd64, Arm64};

    /// A sim Provider whose failure domains `a`, `b`, ... (zones `za`, `zb`, ...) have
    /// hosts of the architectures given (`None`: not reported).
    fn with_archs(name: &str, archs: &[Option<Architecture>]) -> Provider {
        let domains = archs
            .iter()
            .enumerate()
            .map(|(i, arch)| {
                let letter = (b'a' + i as u8) as char;
                let mut d = fd(&letter.to_string(), &format!("z{letter}"));
                d.architecture = *arch;
                d
            })
            .collect();
        provider(name, ProviderClass::Sim, domains)
    }

    fn image_of(arch: Architecture, providers: &[Provider]) -> VMImage {
        let mut image = image_on(providers);
        image.spec.architecture = arch;
        image
    }

    fn down(mut p: Provider) -> Provider {
        p.status.as_mut().unwrap().conditions.clear();
        p
    }

    /// The image's architecture, the Providers, the placement, and the answer: where
    /// it lands, or the reason and phrases the message must hold.
    #[test]
    fn placed_only_where_the_hosts_have_the_images_architecture() {
        type Case<'a> = (
            &'a str,
            Architecture,
            Vec<Provider>,
            Placement,
            Result<&'a str, (&'a str, &'a [&'a str])>,
        );
        let pinned = |name: &str| Placement {
            provider_ref: Some(LocalObjectReference::new(name)),
            ..Default::default()
        };
        let zone = |z: &str| Placement {
            failure_domain_selector: Some(LabelSelector {
                match_labels: Some(labels(&[("zone", z)])),
                ..Default::default()
            }),
            ..Default::default()
        };
        let cases: Vec<Case<'_>> = vec![
            (
                "amd64 on amd64",
                Amd64,
                vec![with_archs("p1", &[Some(Amd64), Some(Amd64)])],
                Placement::default(),
                Ok("p1/a"),
            ),
            (
                "arm64 on amd64 only",
                Arm64,
                vec![with_archs("p1", &[Some(Amd64), Some(Amd64)])],
                Placement::default(),
                Err((
                    ARCHITECTURE_MISMATCH,
                    &[
                        "p1/a: its hosts are amd64, VMImage img is arm64",
                        "p1/b: its hosts are amd64, VMImage img is arm64",
                    ],
                )),
            ),
            (
                "arm64 finds the one arm64 domain",
                Arm64,
                vec![
                    with_archs("p1", &[Some(Amd64)]),
                    with_archs("p2", &[Some(Amd64), Some(Arm64)]),
                ],
                Placement::default(),
                Ok("p2/b"),
            ),
            (
                "explicit providerRef to an amd64 Provider, arm64 elsewhere",
                Arm64,
                vec![
                    with_archs("p1", &[Some(Amd64)]),
                    with_archs("p2", &[Some(Arm64)]),
                ],
                pinned("p1"),
                Err((
                    ARCHITECTURE_MISMATCH,
                    &["no Provider fits: p1/a: its hosts are amd64, VMImage img is arm64"],
                )),
            ),
            (
                "explicit failure domain of the other architecture",
                Arm64,
                vec![with_archs("p1", &[Some(Amd64), Some(Arm64)])],
                zone("za"),
                Err((
                    ARCHITECTURE_MISMATCH,
                    &[
                        "p1/a: its hosts are amd64, VMImage img is arm64",
                        "p1/b: does not match failureDomainSelector",
                    ],
                )),
            ),
            (
                "a domain that reports no architecture fits no image, not even amd64",
                Amd64,
                vec![with_archs("p1", &[None])],
                Placement::default(),
                Err((
                    ARCHITECTURE_MISMATCH,
                    &["p1/a: Provider p1 does not report its hosts' architecture"],
                )),
            ),
            (
                "a Provider that reports no failure domain reports no architecture",
                Amd64,
                vec![with_archs("p1", &[])],
                Placement::default(),
                Err((
                    ARCHITECTURE_MISMATCH,
                    &["p1/-: Provider p1 does not report its hosts' architecture"],
                )),
            ),
            (
                "unreported next to reported: the reported one",
                Amd64,
                vec![with_archs("p1", &[None, Some(Amd64)])],
                Placement::default(),
                Ok("p1/b"),
            ),
            (
                "another reason as well: not only the architecture",
                Arm64,
                vec![
                    with_archs("p1", &[Some(Amd64)]),
                    down(with_archs("p2", &[Some(Arm64)])),
                ],
                Placement::default(),
                Err((
                    "NoFeasibleProvider",
                    &[
                        "p1/a: its hosts are amd64, VMImage img is arm64",
                        "p2: not Ready",
                    ],
                )),
            ),
        ];
        for (case, arch, providers, placement, want) in cases {
            let image = image_of(arch, &providers);
            let got = decide_with(&vm("v", placement), &image, &providers, &[]);
            match (got, want) {
                (Decision::Place(t), Ok(at)) => assert_eq!(
                    format!("{}/{}", t.provider, t.failure_domain.unwrap_or_default()),
                    at,
                    "{case}"
                ),
                (Decision::Unschedulable { reason, message }, Err((want_reason, phrases))) => {
                    assert_eq!(reason, want_reason, "{case}: {message}");
                    for phrase in phrases {
                        assert!(
                            message.contains(phrase),
                            "{case}: {message:?} lacks {phrase:?}"
                        );
                    }
                }
                (got, want) => panic!("{case}: got {got:?}, want {want:?}"),
            }
        }
    }

    /// A placed VM: its architecture is checked again as the rest of what it uses is.
    #[test]
    fn a_placed_vm_is_told_of_a_mismatch_and_moved_only_by_its_own_spec() {
        let providers = vec![
            with_archs("p1", &[Some(Amd64)]),
            with_archs("p2", &[Some(Arm64)]),
        ];
        let amd = image_of(Amd64, &providers);
        let placement = Placement {
            provider_selector: Some(LabelSelector {
                match_labels: Some(labels(&[("region", "east")])),
                ..Default::default()
            }),
            ..Default::default()
        };
        let target = target_of(decide_with(
            &vm("v", placement.clone()),
            &amd,
            &providers,
            &[],
        ));
        assert_eq!(target.provider, "p1");
        let v = placed(vm("v", placement), &target);
        assert_eq!(decide_with(&v, &amd, &providers, &[]), KEEP);

        // The Provider's status written before its backend reported architectures (an
        // upgrade): the machine exists there, nothing to say.
        let mut unreported = providers.clone();
        unreported[0].status.as_mut().unwrap().failure_domains[0].architecture = None;
        assert_eq!(decide_with(&v, &amd, &unreported, &[]), KEEP);

        // The image edited to arm64 under a running VM: kept, and reported.
        let edited = image_of(Arm64, &providers);
        match decide_with(&v, &edited, &providers, &[]) {
            Decision::Keep { drift: Some(d) } => {
                assert_eq!(d.reason, CAPABILITIES_CHANGED);
                assert!(
                    d.message
                        .contains("its hosts are amd64, VMImage img is arm64"),
                    "{}",
                    d.message
                );
            }
            other => panic!("{other:?}"),
        }

        // Its own imageRef changed to an arm64 image: it moves where arm64 runs ...
        let mut new_image = v.clone();
        new_image.spec.image_ref = LocalObjectReference::new("arm");
        let mut arm = image_of(Arm64, &providers);
        arm.metadata.name = Some("arm".into());
        let moved = target_of(decide_with(&new_image, &arm, &providers, &[]));
        assert_eq!(moved.provider, "p2");
        // ... and nowhere when no host of the namespace has it, nor says.
        match decide_with(&new_image, &arm, &unreported[..1], &[]) {
            Decision::Unschedulable { reason, message } => {
                assert_eq!(reason, ARCHITECTURE_MISMATCH, "{message}");
                assert!(message.contains("does not report"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }

    fn arb_arch() -> impl Strategy<Value = Option<Architecture>> {
        proptest::sample::select(vec![None, Some(Amd64), Some(Arm64)])
    }

    proptest! {
        /// Whatever the Providers' hosts: placed exactly in a domain of the image's
        /// architecture when there is one; otherwise refused as an architecture
        /// mismatch naming every domain and what it has.
        #[test]
        fn never_placed_on_another_or_an_unknown_architecture(
            archs in proptest::collection::vec(proptest::collection::vec(arb_arch(), 0..3), 1..4),
            arm in any::<bool>(),
        ) {
            let providers: Vec<Provider> = archs
                .iter()
                .enumerate()
                .map(|(i, a)| with_archs(&format!("p{i}"), a))
                .collect();
            let wanted = if arm { Arm64 } else { Amd64 };
            let image = image_of(wanted, &providers);
            let fits = archs.iter().flatten().any(|a| *a == Some(wanted));
            match decide_with(&vm("v", Placement::default()), &image, &providers, &[]) {
                Decision::Place(t) => {
                    let p = providers.iter().find(|p| p.metadata.name.as_deref() == Some(t.provider.as_str())).unwrap();
                    let domain = p.status.as_ref().unwrap().failure_domains.iter()
                        .find(|d| Some(&d.name) == t.failure_domain.as_ref()).unwrap();
                    prop_assert_eq!(domain.architecture, Some(wanted));
                }
                Decision::Unschedulable { reason, message } => {
                    prop_assert!(!fits, "{}", message);
                    prop_assert_eq!(reason, ARCHITECTURE_MISMATCH);
                    for (i, domains) in archs.iter().enumerate() {
                        if domains.is_empty() {
                            prop_assert!(message.contains(&format!("p{i}/-: Provider p{i} does not report")), "{}", message);
                        }
                        for (j, arch) in domains.iter().enumerate() {
                            let label = format!("p{i}/{}: ", (b'a' + j as u8) as char);
                            let has = match arch {
                                Some(a) => format!("{label}its hosts are {a}, VMImage img is {wanted}"),
                                None => format!("{label}Provider p{i} does not report its hosts' architecture"),
                            };
                            prop_assert!(message.contains(&has), "{} lacks {}", message, has);
                        }
                    }
                }
                Decision::Keep { .. } => prop_assert!(false, "never placed before"),
            }
        }
    }
}
