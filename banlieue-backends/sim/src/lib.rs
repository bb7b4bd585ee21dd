//! banlieue's backend for banlieue's in-process simulator (latency and fault injection, every infra kind).
//!
//! A hypervisor adapter behind banlieue-sdk's `Backend` trait: it receives plain
//! request values and returns observations, and never talks to the Kubernetes API.
//! The adapter itself lands with issue #3; this crate fixes its place in the workspace
//! and its dependency rule (banlieue-sdk only).
#![warn(missing_docs)]

use banlieue_sdk::api::common::ProviderClass;

/// The `Provider.spec.class` this backend serves.
pub const CLASS: ProviderClass = ProviderClass::Sim;

#[cfg(test)]
mod tests {
    #[test]
    fn serves_its_class() {
        assert_eq!(super::CLASS.as_str(), "sim");
    }
}
