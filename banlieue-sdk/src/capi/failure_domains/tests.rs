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
