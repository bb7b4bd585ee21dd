//! The plumbing banlieue's backends share, so that a backend crate holds only what is
//! particular to its hypervisor. It depends on `banlieue-sdk` alone and has no
//! Kubernetes code; an out-of-tree backend may use it as the built-in ones do.
//!
//! - [`tls`] (feature `tls`): the rustls client configuration for a Provider's
//!   connection (its CA bundle, the system's roots, or no verification when asked).
//! - [`endpoint`]: an HTTPS endpoint normalised to its base URL.
//! - [`error_chain`]: an error with its causes, for messages.
//! - [`tasks`]: the task book, the operation in flight per machine, and what failed.
//! - [`settings`]: reading `spec.settings` into one `InvalidSettings` error.
//! - [`nocloud`]: a NIC's IPAM as a NoCloud seed's network interface.
//! - [`qemu_img`]: `qemu-img convert` and `rebase -u` with classified errors.
//! - [`rounds`]: one listing request shared by the callers of a short window.
//! - [`recent`]: answers that change rarely, reused for a while.
#![warn(missing_docs)]

pub mod endpoint;
pub mod error_chain;
pub mod nocloud;
pub mod qemu_img;
pub mod recent;
pub mod rounds;
pub mod settings;
pub mod tasks;
#[cfg(feature = "tls")]
pub mod tls;
