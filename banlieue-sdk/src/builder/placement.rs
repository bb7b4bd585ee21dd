//! The placement record: where an infrastructure machine built for a VM was placed,
//! written on the machine itself and read back from it alone.
//!
//! The machine is the record because it is what the backend acts on and what survives
//! the operator (a restart, `clusterctl move`, a restore): `spec.providerRef` names the
//! Provider and the [`FAILURE_DOMAIN_ANNOTATION`] the failure domain. The VM's
//! `status.placement` is the scheduler's decision as users read it; outside a move the
//! two agree by construction (both are written from one [`Target`]). The
//! [`PROVIDER_LABEL`] is written for selectors (`kubectl get -l`) and never read back:
//! past 63 characters it is a prefix and a hash, not a name. CAPI-owned machines are
//! not built here; their record is their Machine's `spec.failureDomain`.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{FAILURE_DOMAIN_ANNOTATION, PROVIDER_LABEL, label_value};
use crate::api::common::LocalObjectReference;
use crate::scheduling::Target;

/// Where a machine built for a VM was placed, as the machine records it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlacementRecord {
    /// The Provider's name (`spec.providerRef.name`).
    pub provider: String,
    /// The failure domain, when the Provider has them.
    pub failure_domain: Option<String>,
}

impl PlacementRecord {
    /// The record a machine placed at `target` carries.
    pub fn of(target: &Target) -> Self {
        Self {
            provider: target.provider.clone(),
            failure_domain: target.failure_domain.clone(),
        }
    }

    /// Reads the record from a machine's `spec.providerRef` and metadata; `None` when
    /// it names no Provider (not built by banlieue's VM controller, or edited).
    pub fn read(provider_ref: Option<&LocalObjectReference>, meta: &ObjectMeta) -> Option<Self> {
        let provider = provider_ref.filter(|r| !r.name.is_empty())?.name.clone();
        Some(Self {
            provider,
            failure_domain: Self::failure_domain(meta),
        })
    }

    /// Only the failure domain a machine records (the machine controller's view: it
    /// resolves the Provider from `spec.providerRef` itself).
    pub fn failure_domain(meta: &ObjectMeta) -> Option<String> {
        meta.annotations
            .as_ref()?
            .get(FAILURE_DOMAIN_ANNOTATION)
            .filter(|fd| !fd.is_empty())
            .cloned()
    }

    /// `spec.providerRef` for the machine.
    pub fn provider_ref(&self) -> LocalObjectReference {
        LocalObjectReference::new(self.provider.clone())
    }

    /// Writes the metadata half of the record: the failure-domain annotation, and the
    /// Provider label for selectors.
    pub fn write(
        &self,
        labels: &mut BTreeMap<String, String>,
        annotations: &mut BTreeMap<String, String>,
    ) {
        labels.insert(PROVIDER_LABEL.into(), label_value(&self.provider));
        match &self.failure_domain {
            Some(fd) => annotations.insert(FAILURE_DOMAIN_ANNOTATION.into(), fd.clone()),
            None => annotations.remove(FAILURE_DOMAIN_ANNOTATION),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn written(record: &PlacementRecord) -> (LocalObjectReference, ObjectMeta) {
        let (mut labels, mut annotations) = (BTreeMap::new(), BTreeMap::new());
        record.write(&mut labels, &mut annotations);
        let meta = ObjectMeta {
            labels: Some(labels),
            annotations: (!annotations.is_empty()).then_some(annotations),
            ..Default::default()
        };
        (record.provider_ref(), meta)
    }

    #[test]
    fn a_machine_without_a_provider_ref_records_nothing_and_the_label_is_not_read() {
        let (_, meta) = written(&PlacementRecord {
            provider: "vc-a".into(),
            failure_domain: Some("rack-1".into()),
        });
        assert_eq!(PlacementRecord::read(None, &meta), None);
        let empty = LocalObjectReference::new(String::new());
        assert_eq!(PlacementRecord::read(Some(&empty), &meta), None);
    }

    #[test]
    fn no_failure_domain_is_no_annotation() {
        let record = PlacementRecord {
            provider: "pve".into(),
            failure_domain: None,
        };
        let (reference, meta) = written(&record);
        assert_eq!(meta.annotations, None);
        assert_eq!(PlacementRecord::read(Some(&reference), &meta), Some(record));
    }

    proptest! {
        /// What is written is read back whole, even for a Provider name the label
        /// can only shorten.
        #[test]
        fn what_is_written_is_read_back(
            provider in "[a-z0-9]([-a-z0-9]{0,200}[a-z0-9])?",
            failure_domain in proptest::option::of("[a-z0-9]([-a-z0-9.]{0,80}[a-z0-9])?"),
        ) {
            let record = PlacementRecord { provider, failure_domain };
            let (reference, meta) = written(&record);
            prop_assert_eq!(PlacementRecord::read(Some(&reference), &meta), Some(record));
        }
    }
}
