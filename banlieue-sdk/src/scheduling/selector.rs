//! Label selector matching (`matchLabels` and `matchExpressions`), as the apiserver does.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// Whether `labels` satisfy `selector`. An empty selector matches everything; an
/// unknown operator matches nothing (admission refuses one: the CRD schema makes
/// `operator` an enum of these four, see `api::common::LabelSelectorSchema`).
pub fn matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let labels_match = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let expressions_match = selector.match_expressions.iter().flatten().all(|e| {
        let values = e.values.as_deref().unwrap_or_default();
        match e.operator.as_str() {
            "In" => labels.get(&e.key).is_some_and(|v| values.contains(v)),
            "NotIn" => labels.get(&e.key).is_none_or(|v| !values.contains(v)),
            "Exists" => labels.contains_key(&e.key),
            "DoesNotExist" => !labels.contains_key(&e.key),
            _ => false,
        }
    });
    labels_match && expressions_match
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn expr(key: &str, op: &str, values: &[&str]) -> LabelSelector {
        LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: key.into(),
                operator: op.into(),
                values: Some(values.iter().map(|v| v.to_string()).collect()),
            }]),
            ..Default::default()
        }
    }

    #[test]
    fn table() {
        let zone_a = labels(&[("zone", "a"), ("env", "prod")]);
        let cases = [
            (LabelSelector::default(), true),
            (
                LabelSelector {
                    match_labels: Some(labels(&[("zone", "a")])),
                    ..Default::default()
                },
                true,
            ),
            (
                LabelSelector {
                    match_labels: Some(labels(&[("zone", "b")])),
                    ..Default::default()
                },
                false,
            ),
            (expr("zone", "In", &["a", "b"]), true),
            (expr("zone", "In", &["c"]), false),
            (expr("zone", "NotIn", &["c"]), true),
            (expr("rack", "NotIn", &["c"]), true),
            (expr("zone", "NotIn", &["a"]), false),
            (expr("env", "Exists", &[]), true),
            (expr("rack", "Exists", &[]), false),
            (expr("rack", "DoesNotExist", &[]), true),
            (expr("zone", "Gt", &["1"]), false),
        ];
        for (i, (selector, want)) in cases.iter().enumerate() {
            assert_eq!(matches(selector, &zone_a), *want, "case {i}: {selector:?}");
        }
    }
}
