use super::*;
use crate::api::common::LabelSelector;
use proptest::prelude::*;

fn domain(name: &str, zone: &str) -> DiscoveredFailureDomain {
    DiscoveredFailureDomain {
        name: name.into(),
        labels: BTreeMap::from([("topology.kubernetes.io/zone".into(), zone.into())]),
        location: BTreeMap::from([("datacenter".into(), "dc1".into())]),
        ..Default::default()
    }
}

fn selector(key: &str, value: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(BTreeMap::from([(key.into(), value.into())])),
        ..Default::default()
    }
}

#[test]
fn aggregates_several_providers_with_qualified_names_and_attributes() {
    let vc1 = [domain("c1", "a"), domain("c2", "b")];
    let vc2 = [domain("c1", "c")];
    let (list, left_out) = aggregate(
        &[
            ProviderDomains {
                provider: "vc2",
                domains: &vc2,
            },
            ProviderDomains {
                provider: "vc1",
                domains: &vc1,
            },
        ],
        Selection::default(),
    );
    assert_eq!(left_out, 0);
    let names: Vec<_> = list.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["vc1/c1", "vc1/c2", "vc2/c1"]);
    assert!(list.iter().all(|d| d.control_plane == Some(true)));
    let a = &list[2].attributes;
    assert_eq!(a[PROVIDER_ATTRIBUTE], "vc2");
    assert_eq!(a[FAILURE_DOMAIN_ATTRIBUTE], "c1");
    assert_eq!(a["topology.kubernetes.io/zone"], "c");
    assert_eq!(a["datacenter"], "dc1");
}

#[test]
fn selectors_filter_published_and_control_plane_domains() {
    let vc1 = [domain("c1", "a"), domain("c2", "b"), domain("c3", "c")];
    let publish = LabelSelector {
        match_expressions: Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
                key: "topology.kubernetes.io/zone".into(),
                operator: "In".into(),
                values: Some(vec!["a".into(), "b".into()]),
            },
        ]),
        ..Default::default()
    };
    let control_plane = selector("topology.kubernetes.io/zone", "a");
    let (list, _) = aggregate(
        &[ProviderDomains {
            provider: "vc1",
            domains: &vc1,
        }],
        Selection {
            publish: Some(&publish),
            control_plane: Some(&control_plane),
        },
    );
    let got: Vec<_> = list
        .iter()
        .map(|d| (d.name.as_str(), d.control_plane))
        .collect();
    assert_eq!(got, [("vc1/c1", Some(true)), ("vc1/c2", Some(false))]);
    // The provider is selectable too.
    let only_vc2 = selector(PROVIDER_ATTRIBUTE, "vc2");
    let (none, _) = aggregate(
        &[ProviderDomains {
            provider: "vc1",
            domains: &vc1,
        }],
        Selection {
            publish: Some(&only_vc2),
            control_plane: None,
        },
    );
    assert!(none.is_empty());
}

#[test]
fn placement_table() {
    let two = ["vc1".to_string(), "vc2".to_string()];
    let one = ["vc1".to_string()];
    let placed = |provider: &str, fd: Option<&str>, reported: Option<&str>| Placement {
        provider: provider.into(),
        failure_domain: fd.map(Into::into),
        reported: reported.map(Into::into),
    };
    assert_eq!(
        place(Some("vc2/c1"), None, &two),
        Ok(placed("vc2", Some("c1"), Some("vc2/c1")))
    );
    assert_eq!(
        place(Some("vc2/c1"), Some("vc2"), &two),
        Ok(placed("vc2", Some("c1"), Some("vc2/c1")))
    );
    assert_eq!(
        place(Some("vc2/c1"), Some("vc1"), &two).unwrap_err().reason,
        "FailureDomainMismatch"
    );
    assert_eq!(
        place(Some("zone-a"), None, &two).unwrap_err().reason,
        "UnknownFailureDomain"
    );
    assert_eq!(
        place(None, Some("vc2"), &two),
        Ok(placed("vc2", None, None))
    );
    assert_eq!(place(None, None, &one), Ok(placed("vc1", None, None)));
    assert_eq!(
        place(None, None, &two).unwrap_err().reason,
        "NoFailureDomain"
    );
    assert_eq!(place(None, None, &[]).unwrap_err().reason, "NoProvider");
}

#[test]
fn at_most_one_hundred_are_published() {
    let many: Vec<_> = (0..130).map(|i| domain(&format!("h{i:03}"), "a")).collect();
    let (list, left_out) = aggregate(
        &[ProviderDomains {
            provider: "p",
            domains: &many,
        }],
        Selection::default(),
    );
    assert_eq!((list.len(), left_out), (MAX_FAILURE_DOMAINS, 30));
}

proptest! {
    /// Every published name splits back into the Provider and domain it came from,
    /// and names are unique.
    #[test]
    fn names_round_trip(
        providers in proptest::collection::btree_set("[a-z][a-z0-9-]{0,20}", 1..4),
        domains in proptest::collection::btree_set("[A-Za-z0-9/_. -]{1,30}", 1..6),
    ) {
        let discovered: Vec<_> = domains.iter().map(|d| domain(d, "z")).collect();
        let inputs: Vec<_> = providers.iter().map(|p| ProviderDomains { provider: p, domains: &discovered }).collect();
        let (list, _) = aggregate(&inputs, Selection::default());
        prop_assert_eq!(list.len(), providers.len() * domains.len());
        for fd in &list {
            let (p, d) = split_name(&fd.name).unwrap();
            prop_assert_eq!(p, fd.attributes[PROVIDER_ATTRIBUTE].as_str());
            prop_assert_eq!(d, fd.attributes[FAILURE_DOMAIN_ATTRIBUTE].as_str());
            let placement = place(Some(&fd.name), None, &[]).unwrap();
            prop_assert_eq!(placement.provider, p);
            prop_assert_eq!(placement.failure_domain.as_deref(), Some(d));
        }
    }
}

#[test]
fn spread_fills_the_emptiest_domain_first() {
    let c = ["p/a".to_string(), "p/b".to_string(), "p/c".to_string()];
    assert_eq!(spread(&c, &[]), Some("p/a"));
    assert_eq!(spread(&c, &["p/a"]), Some("p/b"));
    assert_eq!(spread(&c, &["p/a", "p/b"]), Some("p/c"));
    assert_eq!(spread(&c, &["p/a", "p/b", "p/c", "p/b"]), Some("p/a"));
    assert_eq!(spread(&[], &["p/a"]), None);
}

proptest! {
    /// Placing machines one after another never leaves two domains more than one
    /// machine apart.
    #[test]
    fn spread_is_even(n in 1usize..6, machines in 0usize..40) {
        let candidates: Vec<String> = (0..n).map(|i| format!("p/{i}")).collect();
        let mut taken: Vec<String> = vec![];
        for _ in 0..machines {
            let refs: Vec<&str> = taken.iter().map(String::as_str).collect();
            let next = spread(&candidates, &refs).unwrap().to_owned();
            taken.push(next);
        }
        let counts: Vec<usize> = candidates.iter().map(|c| taken.iter().filter(|t| *t == c).count()).collect();
        prop_assert!(counts.iter().max().unwrap() - counts.iter().min().unwrap() <= 1);
    }
}

/// The cluster of the seed's shape: two vCenters in one VSphereCluster.
fn two() -> Vec<String> {
    vec!["vcenter-a".into(), "vcenter-b".into()]
}

fn providers_of(cluster: &[String]) -> impl Fn(&str) -> bool + '_ {
    move |p| cluster.iter().any(|c| c == p)
}

fn placed(provider: &str, fd: Option<&str>, reported: Option<&str>) -> Decision {
    Decision::Placed(Placement {
        provider: provider.into(),
        failure_domain: fd.map(Into::into),
        reported: reported.map(Into::into),
    })
}

#[test]
fn decide_table() {
    let two = two();
    let one = vec!["vcenter-a".to_string()];
    let unpublished = |providers| ClusterView {
        providers,
        published: false,
    };
    let published = |providers| ClusterView {
        providers,
        published: true,
    };
    let new = Known::default();
    let adopted = Known {
        has_vm: true,
        ..Known::default()
    };
    let cases: Vec<(&str, Known<'_>, ClusterView<'_>, Decision)> = vec![
        // CAPI placed it: its name, whatever else is known.
        (
            "CAPI's choice",
            Known {
                machine_failure_domain: Some("vcenter-b/DC0/DC0_C1"),
                recorded: Some("DC0/DC0_C0"),
                has_vm: true,
                ..Known::default()
            },
            unpublished(&two),
            placed("vcenter-b", Some("DC0/DC0_C1"), Some("vcenter-b/DC0/DC0_C1")),
        ),
        (
            "its own providerRef",
            Known {
                provider_ref: Some("vcenter-b"),
                recorded: Some("DC0/DC0_C0"),
                ..adopted
            },
            unpublished(&two),
            placed("vcenter-b", None, None),
        ),
        // Domains not yet published (just created, or just moved).
        (
            "new, one Provider, nothing published: its Provider, recorded once it lands",
            new,
            unpublished(&one),
            placed("vcenter-a", None, None),
        ),
        (
            "adopted, one Provider, nothing published",
            adopted,
            unpublished(&one),
            placed("vcenter-a", None, None),
        ),
        (
            "adopted, two Providers, nothing published: look for its VM",
            adopted,
            unpublished(&two),
            Decision::Locate(two.clone()),
        ),
        // Published.
        (
            "new, published: the emptiest domain",
            new,
            published(&two),
            Decision::Choose,
        ),
        (
            "new, one Provider, published: the emptiest domain",
            new,
            published(&one),
            Decision::Choose,
        ),
        (
            "adopted, published: where its VM is, never the emptiest domain",
            adopted,
            published(&two),
            Decision::Locate(two.clone()),
        ),
        // Recorded names read back.
        (
            "recorded, qualified",
            Known {
                recorded: Some("vcenter-b/DC0/DC0_C1"),
                ..adopted
            },
            published(&two),
            placed("vcenter-b", Some("DC0/DC0_C1"), Some("vcenter-b/DC0/DC0_C1")),
        ),
        (
            "recorded bare (DC0 is no Provider), one Provider",
            Known {
                recorded: Some("DC0/DC0_C0"),
                ..adopted
            },
            published(&one),
            placed("vcenter-a", None, None),
        ),
        (
            "recorded bare, two Providers: look for its VM",
            Known {
                recorded: Some("DC0/DC0_C0"),
                ..adopted
            },
            published(&two),
            Decision::Locate(two.clone()),
        ),
        (
            "recorded bare without a slash, no provider ID yet",
            Known {
                recorded: Some("rig-host"),
                ..new
            },
            published(&two),
            Decision::Locate(two.clone()),
        ),
        (
            "no Provider at all",
            adopted,
            unpublished(&[]),
            Decision::Wait(Unplaced {
                reason: "NoProvider",
                message: "no spec.providerRef, no Machine.spec.failureDomain, and the cluster's InfraCluster names no Provider".into(),
            }),
        ),
    ];
    for (what, known, cluster, want) in cases {
        assert_eq!(
            decide(known, cluster, providers_of(cluster.providers)),
            want,
            "{what}"
        );
    }
    let Decision::Wait(waiting) = decide(new, unpublished(&two), providers_of(&two)) else {
        panic!("a new machine of a two-Provider cluster waits for the failure domains");
    };
    assert_eq!(waiting.reason, "WaitingForFailureDomains");
    assert!(waiting.message.contains("status.failureDomains"));
}

#[test]
fn a_bare_backend_name_is_never_a_provider() {
    let two = two();
    assert_eq!(
        resolve_recorded("vcenter-a/DC0/DC0_C0", providers_of(&two)),
        Some(("vcenter-a", "DC0/DC0_C0"))
    );
    assert_eq!(resolve_recorded("DC0/DC0_C0", providers_of(&two)), None);
    assert_eq!(resolve_recorded("rig-host", providers_of(&two)), None);
    // A Provider that is gone names no Provider either: its VM is looked for.
    assert_eq!(
        resolve_recorded("vcenter-c/DC0/DC0_C0", providers_of(&two)),
        None
    );
}

#[test]
fn located_is_where_the_vm_is() {
    let at = |p: &str, fd: &str| (p.to_string(), Some(fd.to_string()));
    assert_eq!(
        located(&[at("vcenter-b", "DC0/DC0_C1")], &["vcenter-a".into()]),
        Ok(Placement {
            provider: "vcenter-b".into(),
            failure_domain: Some("DC0/DC0_C1".into()),
            reported: Some("vcenter-b/DC0/DC0_C1".into()),
        })
    );
    // Two Providers on one vCenter both see it: the same one every time.
    let both = [at("vcenter-b", "DC0/DC0_C1"), at("vcenter-a", "DC0/DC0_C1")];
    assert_eq!(located(&both, &[]).unwrap().provider, "vcenter-a");
    assert_eq!(
        located(&[("pve".into(), None)], &[]).unwrap().reported,
        None,
        "a backend without failure domains reports none"
    );
    assert_eq!(located(&[], &[]).unwrap_err().reason, "BackendVMNotFound");
    let unreachable = located(&[], &["vcenter-a".into()]).unwrap_err();
    assert_eq!(unreachable.reason, "ProviderNotReady");
    assert!(unreachable.message.contains("vcenter-a"));
}

#[test]
fn reported_is_always_qualified() {
    let on = |reported: Option<&str>| Placement {
        provider: "vcenter-a".into(),
        failure_domain: None,
        reported: reported.map(Into::into),
    };
    assert_eq!(
        reported(&on(None), Some("DC0/DC0_C0")).as_deref(),
        Some("vcenter-a/DC0/DC0_C0")
    );
    assert_eq!(
        reported(&on(Some("vcenter-a/DC0/DC0_C1")), Some("DC0/DC0_C1")).as_deref(),
        Some("vcenter-a/DC0/DC0_C1")
    );
    assert_eq!(reported(&on(None), None), None);
}

proptest! {
    /// Whatever a machine records, whatever its cluster: a machine whose VM exists is
    /// never spread to the emptiest domain, and every placement it gets names one of
    /// the cluster's Providers (or its own providerRef) and reads back as itself.
    #[test]
    fn decide_never_invents_a_provider(
        providers in proptest::collection::btree_set("[a-z][a-z0-9-]{0,8}", 0..4),
        recorded in proptest::option::of(prop_oneof![
            "[A-Z][A-Za-z0-9_]{0,5}/[A-Za-z0-9_]{1,6}",
            "[a-z][a-z0-9-]{0,8}/[A-Z][A-Za-z0-9_]{0,5}/[A-Za-z0-9_]{1,6}",
            "[a-z][a-z0-9-]{0,8}",
        ]),
        has_vm in any::<bool>(),
        published in any::<bool>(),
    ) {
        let providers: Vec<String> = providers.into_iter().collect();
        let known = Known { recorded: recorded.as_deref(), has_vm, ..Known::default() };
        let decision = decide(known, ClusterView { providers: &providers, published }, providers_of(&providers));
        if has_vm {
            prop_assert_ne!(&decision, &Decision::Choose);
        }
        if let Decision::Placed(placement) = &decision {
            prop_assert!(providers.contains(&placement.provider), "{placement:?}");
            if let Some(name) = &placement.reported {
                prop_assert_eq!(
                    resolve_recorded(name, providers_of(&providers)),
                    Some((placement.provider.as_str(), placement.failure_domain.as_deref().unwrap_or_default()))
                );
            }
            let observed = reported(placement, Some("DC0/DC0_C0")).unwrap();
            prop_assert!(resolve_recorded(&observed, providers_of(&providers)).is_some());
        }
    }
}
