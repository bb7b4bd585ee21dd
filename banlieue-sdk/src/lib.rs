//! banlieue's SDK: the API of both groups as Rust types, and their CRDs.
//!
//! - [`api`]: `banlieue.io/v1alpha1` ([`api::Provider`], [`api::VMClass`],
//!   [`api::VMImage`], [`api::VirtualMachine`]) and `infrastructure.banlieue.io/v1alpha1`
//!   (the Cluster API InfraMachine and InfraCluster kinds of every backend and their
//!   templates, in [`api::infra`]).
//! - [`crds`]: every CustomResourceDefinition, as objects or YAML.
//! - [`admission`]: the ValidatingAdmissionPolicies installed with them (what a CRD
//!   rule cannot see: a Cluster API machine's hardware is immutable).
//! - [`backend`]: the [`backend::Backend`] trait a hypervisor adapter implements, and
//!   the [`backend::BackendRegistry`] of classes and machine kinds an operator serves.
//! - [`contract`]: the Cluster API contract read uniformly across kinds, and the kind
//!   table: every machine kind declared once ([`contract::MachineKind`]), banlieue's
//!   four and any of your own.
//! - [`changes`]: how a machine that exists takes a change of its spec (which
//!   differences its backend applies now, which wait, for what).
//! - [`builder`], [`scheduling`], [`status`] and [`conditions`]: the pure decisions (the
//!   machine for a placed VM, where a VM goes, what every status and condition says),
//!   functions over values.
//! - [`capi`]: Cluster API's rules as values: failure domains across Providers, the
//!   metadata rules (paused, externally managed, moved), template capacity.
//! - [`scrub`]: the process-wide scrubber that keeps credentials out of logs, conditions
//!   and Events.
//! - `controllers` (feature `controllers`): every controller, to run banlieue inside
//!   another operator; `banlieue-runtime` is the process around them.
//! - [`duration`]: Go-style durations (`90s`, `1m30s`, `500ms`).
//!
//! The validation that the CRD schemas carry (enums, bounds, CEL rules for
//! cross-field invariants and immutable fields) is declared next to each field, so
//! the apiserver rejects invalid objects at admission with the message written here.
//!
//! # Versions
//! Built on kube 5 and k8s-openapi 0.29. Like every library on k8s-openapi, this
//! crate selects no Kubernetes version feature: the final binary does
//! (`k8s-openapi = { version = "0.29", features = ["v1_33"] }`; banlieue supports
//! management clusters from Kubernetes 1.33). The types' schemas use CEL
//! `isCIDR`/`isIP`, available from Kubernetes 1.31.
//!
//! ```
//! use banlieue_sdk::api::{VirtualMachine, VirtualMachineSpec, common::LocalObjectReference};
//!
//! let spec: VirtualMachineSpec = serde_json::from_value(serde_json::json!({
//!     "classRef": {"name": "small"},
//!     "imageRef": {"name": "ubuntu-2404"},
//! })).unwrap();
//! let vm = VirtualMachine::new("hello", spec);
//! assert_eq!(vm.spec.class_ref, LocalObjectReference::new("small"));
//! assert_eq!(banlieue_sdk::crds::all().len(), 20);
//! ```
#![warn(missing_docs)]

pub mod admission;
pub mod api;
pub mod backend;
pub mod builder;
pub mod capi;
pub mod changes;
pub mod conditions;
pub mod contract;
#[cfg(feature = "controllers")]
pub mod controllers;
pub mod crds;
pub mod duration;
pub mod scheduling;
pub mod scrub;
pub mod status;

pub use async_trait::async_trait;
