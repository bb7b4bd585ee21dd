//! Cluster API, seen from an infrastructure provider: the parts of CAPI's own objects
//! banlieue reads ([`objects`]), and the pure decisions the contract asks of us —
//! who owns an infra object and whether it is paused ([`metadata`]), which failure
//! domains an InfraCluster publishes ([`failure_domains`]), and what a machine
//! template offers the autoscaler ([`capacity`]).
//!
//! Nothing here talks to the API server; the controllers do, and stay thin.

pub mod capacity;
pub mod failure_domains;
pub mod ipam;
pub mod metadata;
pub mod objects;

/// CAPI's API group.
pub const GROUP: &str = "cluster.x-k8s.io";
/// The CAPI contract version banlieue implements.
pub const VERSION: &str = "v1beta2";
