//! A Provider's `spec.settings` checked as a whole: the keys the operator reads itself
//! ([`OPERATOR_KEYS`]), their values, and — for a backend that declares the keys it
//! reads — every other key. A misspelt key must not be ignored: `capabilities.secureboot:
//! "false"` left unread keeps advertising `efi-secure`, and the user believes it off.
//!
//! The operator checks its own keys ([`check_operator_settings`], in the Provider's
//! status); a backend checks the rest when it parses its settings
//! ([`unknown_keys`], used by `banlieue-kit`'s reader), so both end in one
//! `Ready=False InvalidSettings` condition and one Event naming the key and what is
//! allowed, and no VM is placed on the Provider until it is fixed.

use std::collections::BTreeMap;

use super::capabilities::{IGNITION_SETTING, SECURE_BOOT_SETTING, SUSPEND_SETTING};
use super::concurrency::{MAX_CONCURRENT_CREATES_SETTING, max_concurrent_creates};

/// The settings the operator reads itself, whatever the backend: a backend that
/// checks for unknown keys accepts these.
pub const OPERATOR_KEYS: [&str; 4] = [
    MAX_CONCURRENT_CREATES_SETTING,
    SECURE_BOOT_SETTING,
    SUSPEND_SETTING,
    IGNITION_SETTING,
];

/// The prefix of the operator's capability settings.
const CAPABILITIES_PREFIX: &str = "capabilities.";

/// What is wrong with the operator's own settings of a Provider, one phrase per
/// problem: a bad `maxConcurrentCreates`, and a `capabilities.*` key the operator does
/// not know (the values of the known ones are checked where they narrow the
/// capabilities, [`BackendCapabilities::narrowed`](super::BackendCapabilities::narrowed)).
pub fn check_operator_settings(settings: &BTreeMap<String, String>) -> Vec<String> {
    let mut problems = Vec::new();
    if let Err(bad) = max_concurrent_creates(settings, None) {
        problems.push(format!("settings.{bad}"));
    }
    for key in settings.keys() {
        if key.starts_with(CAPABILITIES_PREFIX) && !OPERATOR_KEYS.contains(&key.as_str()) {
            problems.push(unknown_key_message(
                key,
                &[SECURE_BOOT_SETTING, SUSPEND_SETTING, IGNITION_SETTING],
                "the operator reads",
            ));
        }
    }
    problems
}

/// The keys of `settings` that neither the backend (`backend_keys`) nor the operator
/// reads, one message each naming the key, the closest known key when one is near,
/// and the keys that are read.
pub fn unknown_keys(
    settings: &BTreeMap<String, String>,
    backend: &str,
    backend_keys: &[&str],
) -> Vec<String> {
    let known: Vec<&str> = backend_keys.iter().copied().chain(OPERATOR_KEYS).collect();
    settings
        .keys()
        // `capabilities.*` keys are the operator's to judge (check_operator_settings):
        // reporting them here too would say the same thing twice.
        .filter(|k| !known.contains(&k.as_str()) && !k.starts_with(CAPABILITIES_PREFIX))
        .map(|k| {
            unknown_key_message(
                k,
                &known,
                &format!("the {backend} backend and the operator read"),
            )
        })
        .collect()
}

fn unknown_key_message(key: &str, known: &[&str], who: &str) -> String {
    let hint = closest(key, known)
        .map(|c| format!(" (did you mean {c}?)"))
        .unwrap_or_default();
    format!(
        "settings.{key} is not a setting{hint}: {who} {}",
        known.join(", ")
    )
}

/// The candidate closest to `input` when it is a likely misspelling of it: the same
/// letters in another case, or at most a third of its length (and at most 3) edits
/// away.
///
/// ```
/// use banlieue_sdk::backend::settings::closest;
/// assert_eq!(closest("capabilities.secureboot", &["capabilities.secureBoot"]), Some("capabilities.secureBoot"));
/// assert_eq!(closest("vsphre", &["vsphere", "proxmox"]), Some("vsphere"));
/// assert_eq!(closest("zzz", &["vsphere", "proxmox"]), None);
/// ```
pub fn closest<'a>(input: &str, candidates: &[&'a str]) -> Option<&'a str> {
    let lower = input.to_lowercase();
    let limit = (input.chars().count() / 3).clamp(1, 3);
    candidates
        .iter()
        .map(|c| (edit_distance(&lower, &c.to_lowercase()), *c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Levenshtein distance over chars.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (diagonal + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(above + 1);
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn bad_caps_on_creates_are_problems_that_say_what_is_allowed() {
        for bad in ["-1", "abc", "1e9", "", "18446744073709551616", "100001"] {
            let problems = check_operator_settings(&settings(&[("maxConcurrentCreates", bad)]));
            assert_eq!(problems.len(), 1, "{bad:?}: {problems:?}");
            assert!(
                problems[0].contains("maxConcurrentCreates")
                    && problems[0].contains("from 0 (no cap) to 100000"),
                "{bad:?}: {}",
                problems[0]
            );
        }
        for good in ["0", "1", " 20 ", "100000"] {
            assert!(
                check_operator_settings(&settings(&[("maxConcurrentCreates", good)])).is_empty(),
                "{good:?}"
            );
        }
    }

    #[test]
    fn a_misspelt_capability_key_is_named_with_the_right_one() {
        let problems = check_operator_settings(&settings(&[("capabilities.secureboot", "false")]));
        assert_eq!(problems.len(), 1);
        assert!(
            problems[0].contains("settings.capabilities.secureboot is not a setting")
                && problems[0].contains("did you mean capabilities.secureBoot?"),
            "{}",
            problems[0]
        );
        assert!(
            check_operator_settings(&settings(&[
                ("capabilities.secureBoot", "false"),
                ("capabilities.suspend", "true"),
                ("capabilities.ignition", "false"),
            ]))
            .is_empty()
        );
    }

    #[test]
    fn unknown_backend_keys_are_named_and_known_ones_pass() {
        let given = settings(&[
            ("shutdownTimout", "5"),
            ("shutdownTimeout", "5"),
            ("maxConcurrentCreates", "3"),
            ("capabilities.secureboot", "false"),
            ("wholly-unknown", "x"),
        ]);
        let problems = unknown_keys(&given, "vsphere", &["shutdownTimeout", "datacenter"]);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(
            problems[0].contains(
                "settings.shutdownTimout is not a setting (did you mean shutdownTimeout?)"
            )
        );
        assert!(problems[0].contains("the vsphere backend and the operator read shutdownTimeout, datacenter, maxConcurrentCreates"));
        assert!(problems[1].starts_with("settings.wholly-unknown is not a setting:"));
    }

    #[test]
    fn closest_takes_near_misses_only() {
        assert_eq!(closest("Sim", &["vsphere", "sim"]), Some("sim"));
        assert_eq!(closest("vsphre", &["vsphere", "sim"]), Some("vsphere"));
        assert_eq!(
            closest("cloudhypervisor", &["cloud-hypervisor"]),
            Some("cloud-hypervisor")
        );
        assert_eq!(
            closest("hyperv", &["vsphere", "proxmox", "libvirt", "sim"]),
            None
        );
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("", "abc"), 3);
    }
}
