//! Names and label values banlieue derives from object names, always within
//! Kubernetes' limits: an object name may be 253 characters, a label value only 63,
//! and a derived name (`<vm>-bootstrap`) must still be a valid name.
//!
//! What fits is used as is (so short names stay readable and selectable); what does
//! not is cut and given a hash suffix of the whole, so two long names that share a
//! prefix still differ.

/// Kubernetes' limit on a label value.
pub const MAX_LABEL_VALUE: usize = 63;
/// Kubernetes' limit on a DNS-subdomain object name (Secrets, VirtualMachines, …).
pub const MAX_NAME: usize = 253;

/// `value` as a label value: itself when it is one, else a prefix and a hash.
pub fn label_value(value: &str) -> String {
    if value.len() <= MAX_LABEL_VALUE && is_label_value(value) {
        return value.to_owned();
    }
    shortened(value, MAX_LABEL_VALUE)
}

/// The name of the Secret holding a VM's bootstrap data: `<vm>-bootstrap`, shortened
/// with a hash when that would be longer than a name may be.
pub fn bootstrap_secret_name(vm: &str) -> String {
    suffixed_name(vm, "-bootstrap")
}

/// `<base><suffix>` as an object name: `base` is shortened with a hash when the whole
/// would be longer than a name may be (e.g. IP address claims `<machine>-ip-<n>`).
pub fn suffixed_name(base: &str, suffix: &str) -> String {
    let name = format!("{base}{suffix}");
    if name.len() <= MAX_NAME {
        return name;
    }
    format!("{}{suffix}", shortened(base, MAX_NAME - suffix.len()))
}

/// At most `max` characters: an alphanumeric-ended prefix of `value`'s allowed
/// characters, `-`, and 10 hex digits of a hash of all of `value`.
fn shortened(value: &str, max: usize) -> String {
    const HASH: usize = 10;
    let keep = max - HASH - 1;
    let prefix: String = value
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .take(keep)
        .collect();
    let prefix = prefix.trim_start_matches(|c: char| !c.is_ascii_alphanumeric());
    let prefix = prefix.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    let hash = format!("{:016x}", fnv1a(value));
    if prefix.is_empty() {
        hash[..HASH].to_owned()
    } else {
        format!("{prefix}-{}", &hash[..HASH])
    }
}

/// Whether `value` is a valid label value (empty, or alphanumeric at both ends with
/// `-`, `_`, `.` and alphanumerics between), length aside.
fn is_label_value(value: &str) -> bool {
    let ends_ok = |c: Option<char>| c.is_none_or(|c| c.is_ascii_alphanumeric());
    ends_ok(value.chars().next())
        && ends_ok(value.chars().last())
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// FNV-1a, 64 bits: stable across versions and platforms (a label written by one
/// release must be found by the next), and no dependency for ten hex digits.
fn fnv1a(value: &str) -> u64 {
    value.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn short_names_are_kept_as_they_are() {
        for name in ["web-0", "a", "a.b_c-d", &"x".repeat(63)] {
            assert_eq!(label_value(name), name);
        }
        assert_eq!(bootstrap_secret_name("web-0"), "web-0-bootstrap");
    }

    #[test]
    fn long_names_get_a_prefix_and_a_stable_hash() {
        let long = format!("{}-tail", "a".repeat(70));
        let value = label_value(&long);
        assert_eq!(value.len(), 63);
        assert!(value.starts_with(&"a".repeat(52)));
        // Stable across releases: this exact value is what older objects carry.
        assert_eq!(value, label_value(&long));
        assert_eq!(
            &value[52..],
            &format!("-{}", &format!("{:016x}", fnv1a(&long))[..10])
        );
    }

    #[test]
    fn names_that_differ_only_at_the_end_get_different_values() {
        let a = format!("{}a", "x".repeat(100));
        let b = format!("{}b", "x".repeat(100));
        assert_ne!(label_value(&a), label_value(&b));
        assert_ne!(
            bootstrap_secret_name(&"y".repeat(253)),
            bootstrap_secret_name(&format!("{}z", "y".repeat(252)))
        );
    }

    #[test]
    fn a_prefix_cut_on_a_dot_or_dash_ends_alphanumeric() {
        let name = format!("{}.-{}", "a".repeat(50), "b".repeat(40));
        let value = label_value(&name);
        assert!(is_label_value(&value), "{value}");
    }

    proptest! {
        #[test]
        fn every_derived_label_value_is_valid(name in "[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?") {
            let value = label_value(&name);
            prop_assert!(value.len() <= MAX_LABEL_VALUE);
            prop_assert!(is_label_value(&value), "{}", value);
        }

        #[test]
        fn every_bootstrap_secret_name_is_a_name(name in "[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?") {
            let secret = bootstrap_secret_name(&name);
            prop_assert!(secret.len() <= MAX_NAME);
            prop_assert!(secret.ends_with("-bootstrap"));
            prop_assert!(secret.chars().next().is_some_and(|c| c.is_ascii_alphanumeric()));
        }
    }
}
