//! The backend class of a Provider: an open set of DNS labels. banlieue's own
//! backends have the five named classes; an out-of-tree backend registers any other
//! label, and a Provider whose class no registered backend serves says so in its
//! conditions (`BackendNotCompiledIn`) instead of being refused at admission.

use std::collections::BTreeSet;
use std::sync::{Mutex, OnceLock};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The backend a Provider talks to: `vsphere`, `proxmox`, `libvirt`,
/// `cloud-hypervisor`, `sim`, or the class of a backend registered out of tree.
///
/// A small `Copy` value: names are interned once, so classes compare and hash as
/// cheaply as an enum did, and the built-in classes can be matched on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ProviderClass(&'static str);

/// A class name that is not a DNS label (RFC 1123: at most 63 characters of `a-z`,
/// `0-9` and `-`, starting and ending with a letter or digit).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "provider class {0:?} is not a DNS label (lowercase letters, digits and '-', at most 63 characters, starting and ending with a letter or digit)"
)]
pub struct InvalidProviderClass(pub String);

#[allow(non_upper_case_globals)] // named like the enum variants they replace
impl ProviderClass {
    /// VMware vCenter (vSphere Web Services API).
    pub const Vsphere: Self = Self("vsphere");
    /// Proxmox VE (REST API).
    pub const Proxmox: Self = Self("proxmox");
    /// libvirt (QEMU/KVM hosts).
    pub const Libvirt: Self = Self("libvirt");
    /// Cloud Hypervisor hosts.
    pub const CloudHypervisor: Self = Self("cloud-hypervisor");
    /// banlieue's in-process simulator, for demos, tests and benchmarks.
    pub const Sim: Self = Self("sim");
}

impl ProviderClass {
    /// banlieue's own classes, in a stable order.
    pub const ALL: [ProviderClass; 5] = [
        Self::Vsphere,
        Self::Proxmox,
        Self::Libvirt,
        Self::CloudHypervisor,
        Self::Sim,
    ];

    /// The class named `name`, which must be a DNS label.
    pub fn new(name: &str) -> Result<Self, InvalidProviderClass> {
        if let Some(built_in) = Self::ALL.into_iter().find(|c| c.0 == name) {
            return Ok(built_in);
        }
        if !is_dns_label(name) {
            return Err(InvalidProviderClass(name.to_owned()));
        }
        // Each distinct name is leaked once: classes are few (one per backend kind
        // deployed), and a `Copy` class keeps every use as cheap as the enum was.
        static NAMES: OnceLock<Mutex<BTreeSet<&'static str>>> = OnceLock::new();
        let mut names = NAMES
            .get_or_init(Default::default)
            .lock()
            .expect("provider class names");
        if let Some(known) = names.get(name) {
            return Ok(Self(known));
        }
        let leaked: &'static str = Box::leak(name.to_owned().into_boxed_str());
        names.insert(leaked);
        Ok(Self(leaked))
    }

    /// The wire name (`vsphere`, `cloud-hypervisor`, ...).
    pub fn as_str(self) -> &'static str {
        self.0
    }

    /// Whether this is one of banlieue's own classes ([`Self::ALL`]).
    pub fn is_built_in(self) -> bool {
        Self::ALL.contains(&self)
    }

    /// Position in [`Self::ALL`] for built-in classes; others sort after them by name.
    fn rank(self) -> usize {
        Self::ALL
            .iter()
            .position(|c| *c == self)
            .unwrap_or(Self::ALL.len())
    }
}

/// The `rfc1123Label` rule of Kubernetes names.
fn is_dns_label(name: &str) -> bool {
    let bytes = name.as_bytes();
    let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes.iter().all(|b| alnum(b) || *b == b'-')
        && alnum(&bytes[0])
        && alnum(&bytes[bytes.len() - 1])
}

impl PartialOrd for ProviderClass {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ProviderClass {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.rank(), self.0).cmp(&(other.rank(), other.0))
    }
}

impl std::fmt::Display for ProviderClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::str::FromStr for ProviderClass {
    type Err = InvalidProviderClass;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Self::new(name)
    }
}

impl Serialize for ProviderClass {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.0)
    }
}

impl<'de> Deserialize<'de> for ProviderClass {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = std::borrow::Cow::<'de, str>::deserialize(deserializer)?;
        Self::new(&name).map_err(serde::de::Error::custom)
    }
}

/// The admission message for a class that is not a DNS label.
pub const CLASS_RULE_MESSAGE: &str = "class must be a lowercase DNS label (a-z, 0-9 and '-'): banlieue's own classes are vsphere, proxmox, libvirt, cloud-hypervisor and sim; an operator that embeds banlieue may serve others";

impl JsonSchema for ProviderClass {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ProviderClass".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        // The pattern stays (it is the schema clients and generators read), and a CEL
        // rule says the same in words: the apiserver answers a failed pattern with the
        // raw regex, which tells someone who wrote `Sim` nothing; it reports both.
        schemars::json_schema!({
            "type": "string",
            "minLength": 1,
            "maxLength": 63,
            "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
            "x-kubernetes-validations": [{
                "rule": "self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",
                "message": CLASS_RULE_MESSAGE,
            }],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_names_are_the_constants() {
        for class in ProviderClass::ALL {
            assert_eq!(ProviderClass::new(class.as_str()), Ok(class));
            assert!(class.is_built_in());
        }
        assert_eq!(
            serde_json::from_str::<ProviderClass>("\"cloud-hypervisor\"").unwrap(),
            ProviderClass::CloudHypervisor
        );
        assert!(matches!(
            ProviderClass::new("proxmox").unwrap(),
            ProviderClass::Proxmox
        ));
    }

    #[test]
    fn any_dns_label_is_a_class_and_is_interned() {
        let a = ProviderClass::new("hyperv").unwrap();
        let b: ProviderClass = serde_json::from_str("\"hyperv\"").unwrap();
        assert_eq!(a, b);
        assert!(std::ptr::eq(a.as_str(), b.as_str()), "one copy of the name");
        assert!(!a.is_built_in());
        assert_eq!(serde_json::to_string(&a).unwrap(), "\"hyperv\"");
    }

    #[test]
    fn names_that_are_not_dns_labels_are_refused() {
        for bad in ["", "Hyper-V", "-x", "x-", "a_b", "a.b", &"x".repeat(64)] {
            assert_eq!(
                ProviderClass::new(bad),
                Err(InvalidProviderClass(bad.to_owned())),
                "{bad:?}"
            );
            assert!(serde_json::from_str::<ProviderClass>(&format!("{bad:?}")).is_err());
        }
        assert!(ProviderClass::new(&"x".repeat(63)).is_ok());
    }

    #[test]
    fn built_in_classes_sort_first_in_their_order() {
        let mut classes = [
            ProviderClass::new("aaa").unwrap(),
            ProviderClass::Sim,
            ProviderClass::Vsphere,
            ProviderClass::new("zzz").unwrap(),
            ProviderClass::Proxmox,
        ];
        classes.sort();
        let names: Vec<_> = classes.iter().map(|c| c.as_str()).collect();
        assert_eq!(names, ["vsphere", "proxmox", "sim", "aaa", "zzz"]);
    }
}
