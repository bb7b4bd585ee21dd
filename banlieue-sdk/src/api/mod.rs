//! The API of both groups as Rust types.
//!
//! - `banlieue.io/v1alpha1`: [`Provider`], [`VMClass`], [`VMImage`], [`VirtualMachine`].
//! - `infrastructure.banlieue.io/v1alpha1`: see [`infra`].

// Clippy reads several `printcolumn(type_ = "string", ...)` in one `#[kube(...)]` as
// duplicated attributes; they are distinct columns.
#![allow(clippy::duplicated_attributes)]

pub mod common;
pub mod infra;
pub mod provider;
mod provider_class;
pub mod resources;
pub mod virtual_machine;
pub mod vm_class;
pub mod vm_image;

pub use provider::{Provider, ProviderSpec, ProviderStatus};
pub use virtual_machine::{VirtualMachine, VirtualMachineSpec, VirtualMachineStatus};
pub use vm_class::{ClassUpdatePolicy, VMClass, VMClassSpec};
pub use vm_image::{VMImage, VMImageSpec, VMImageStatus};

/// The user-facing API group.
pub const GROUP: &str = "banlieue.io";
/// The Cluster API infrastructure group.
pub const INFRA_GROUP: &str = "infrastructure.banlieue.io";
/// The only version of both groups.
pub const VERSION: &str = "v1alpha1";
