//! The conformance suite of banlieue's [`Backend`] trait: what every backend must do,
//! run against a real test target (a simulator, a real hypervisor in a lab). The five
//! in-tree backends run it in `make test` (`tests/integration/tests/conformance.rs`),
//! and so does `examples/embedding`; an out-of-tree backend runs it against its own
//! lab by implementing [`Target`].
//!
//! It drives the backend directly, as the controllers do (call, and come back when it
//! answers `Pending` or a transient error), with no Kubernetes in between. In order:
//!
//! 0. **inventory**: `check` reports failure domains, each with its hosts'
//!    architecture (the scheduler places no VM where none is reported);
//! 1. **create**: `ensure` until the machine exists and runs;
//! 2. **ensure again**: the same provider ID, one machine ([`Backend::made_for`]);
//! 3. **found after a restart**: a new connection ([`Target::connect`]) finds it by UID;
//! 4. **adopted under a new UID**: by its provider ID, as after `clusterctl move` or a
//!    restore, and retagged (where the backend records UIDs);
//! 5. **a missing provider ID**: a terminal `machine_missing`, nothing created;
//! 6. **power**: off, then on;
//! 7. **each row of the change table** ([`BackendCapabilities::changes`]): the spec
//!    edited so that the field grows (and shrinks, where the row allows it); a `Live`
//!    change must read back applied at once, a `NextBoot` or `PowerOff` one must read
//!    back unchanged until a power cycle and applied after it;
//! 8. **an outage** ([`Target::outage`]): a transient error, never a terminal one, and
//!    nothing lost or doubled once it ends;
//! 9. **delete**, **delete again** and **delete of a machine never made**: `Gone`.
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use banlieue_sdk::async_trait;
//! # use banlieue_sdk::backend::*;
//! /// Your backend's factory, the Provider connection of your lab, and a machine spec
//! /// that is valid there.
//! struct Lab<F> {
//!     factory: F,
//!     connection: Connection,
//!     spec: MachineSpec,
//! }
//!
//! #[async_trait]
//! impl<F: BackendFactory + Send + Sync> banlieue_conformance::Target for Lab<F> {
//!     fn name(&self) -> String {
//!         "my hypervisor lab".into()
//!     }
//!     async fn connect(&self) -> Result<Arc<dyn Backend>, BackendError> {
//!         self.factory.connect(&self.connection)
//!     }
//!     fn request(&self, identity: MachineIdentity) -> MachineRequest {
//!         MachineRequest {
//!             identity,
//!             spec: self.spec.clone(),
//!             failure_domain: None,
//!             bootstrap: None,
//!             instance_id: None,
//!             disks_imported: false,
//!         }
//!     }
//! }
//!
//! async fn conformance<F: BackendFactory + Send + Sync>(lab: Lab<F>) {
//!     banlieue_conformance::run(&lab).await.assert_passed();
//! }
//! ```
#![warn(missing_docs)]

mod driver;
mod edit;
mod report;
mod suite;

use std::sync::Arc;
use std::time::Duration;

use banlieue_sdk::api::resources::{MachineField, MachineResources};
use banlieue_sdk::async_trait;
use banlieue_sdk::backend::{Backend, BackendError, MachineIdentity, MachineRequest, MachineSpec};

#[doc(inline)]
pub use banlieue_sdk::backend::BackendCapabilities;
pub use edit::{DATA_DISK, MEMORY_STEP_MIB, edit, missing_provider_id};
pub use report::{Check, Outcome, Report};
pub use suite::run;

/// A backend's test target: how the suite connects to it and what machine it makes
/// there.
#[async_trait]
pub trait Target: Send + Sync {
    /// A name for the report, e.g. `vsphere on vcsim`.
    fn name(&self) -> String;

    /// A backend connected to the target, as the operator connects to a Provider.
    /// Called again for the checks that model an operator restart (and during an
    /// outage, where it may fail).
    async fn connect(&self) -> Result<Arc<dyn Backend>, BackendError>;

    /// A machine to make: a valid spec of the backend's kind, powered on, for
    /// `identity` (the suite chooses UIDs and names). Bootstrap data as the target
    /// needs it.
    fn request(&self, identity: MachineIdentity) -> MachineRequest;

    /// Edits `spec` so that `field` grows (or shrinks), given what the machine runs with;
    /// `Err` says why it cannot be expressed (then the row is reported not exercised).
    /// The default, [`edit()`], knows the in-tree kinds.
    fn edit(
        &self,
        spec: &mut MachineSpec,
        running: &MachineResources,
        field: MachineField,
        grow: bool,
    ) -> Result<(), String> {
        edit::edit(spec, running, field, grow)
    }

    /// Starts an outage of the target (its API unreachable or failing as when it is
    /// down), which lasts until [`Outage::end`]. `Err` says why this target cannot
    /// make one (then the check is reported not exercised).
    async fn outage(&self) -> Result<Box<dyn Outage>, String> {
        Err("this target cannot make an outage".to_owned())
    }

    /// A provider ID of the backend's scheme that names no machine on the target. The
    /// default changes the last hexadecimal digit of `existing`.
    fn missing_provider_id(&self, existing: &str) -> String {
        edit::missing_provider_id(existing)
    }

    /// How long one operation (a create, a power change, a change, a delete) may take
    /// before the check fails.
    fn patience(&self) -> Duration {
        Duration::from_secs(180)
    }
}

/// An outage a [`Target`] started.
#[async_trait]
pub trait Outage: Send {
    /// Ends it: the target answers again as before.
    async fn end(self: Box<Self>);
}
