//! `infrastructure.banlieue.io/v1alpha1`: the Cluster API InfraMachine and
//! InfraCluster kinds of every backend, and their templates.
//!
//! Every kind here follows the CAPI v1beta2 contract: machines carry
//! `spec.providerID`, `status.initialization.provisioned`, `status.addresses` and
//! `status.failureDomain` (never `spec.failureDomain`); clusters carry
//! `spec.controlPlaneEndpoint` and `status.failureDomains` as a list.

mod contract;
pub(crate) mod kinds;
mod machine;

pub mod cloud_hypervisor;
pub mod libvirt;
pub mod proxmox;
pub mod vsphere;

pub use contract::*;
pub use machine::MachineDisk;
