//! The `Backend` trait: what a hypervisor adapter implements, and the registry
//! that maps a Provider's class to one.
//!
//! Backends are adapters, not controllers: they receive plain values (a resolved
//! [`Connection`], a [`MachineRequest`]) and return observations. They never talk to
//! the Kubernetes API. Every call must be idempotent and must not wait for long
//! operations: start them, return [`Pending`], and let the controller come back.
//!
//! ```
//! use std::sync::Arc;
//! use banlieue_sdk::async_trait;
//! use banlieue_sdk::api::common::{PowerState, ProviderClass};
//! use banlieue_sdk::backend::*;
//!
//! /// A backend that "creates" machines instantly and forgets them.
//! struct Instant;
//!
//! #[async_trait]
//! impl Backend for Instant {
//!     async fn check(&self) -> Result<Inventory, BackendError> {
//!         Ok(Inventory { version: "instant 1".into(), failure_domains: vec![] })
//!     }
//!     async fn find_image(&self, _: &ImageSourceSet) -> Result<ImageLookup, BackendError> {
//!         Ok(ImageLookup::Available { resolved: "instant".into() })
//!     }
//!     async fn ensure(&self, req: &MachineRequest) -> Result<MachineObservation, BackendError> {
//!         Ok(MachineObservation {
//!             provider_id: Some(format!("instant://{}", req.identity.uid)),
//!             power_state: Some(req.spec.power_state()),
//!             ..Default::default()
//!         })
//!     }
//!     async fn observe(&self, _: &MachineIdentity) -> Result<Option<MachineObservation>, BackendError> {
//!         Ok(None)
//!     }
//!     async fn delete(&self, _: &MachineIdentity) -> Result<Deletion, BackendError> {
//!         Ok(Deletion::Gone)
//!     }
//! }
//!
//! struct InstantFactory;
//! impl BackendFactory for InstantFactory {
//!     fn connect(&self, _: &Connection) -> Result<Arc<dyn Backend>, BackendError> {
//!         Ok(Arc::new(Instant))
//!     }
//! }
//!
//! let mut registry = BackendRegistry::default();
//! registry.register(ProviderClass::Sim, Arc::new(InstantFactory));
//! assert!(registry.get(ProviderClass::Sim).is_some());
//! ```

pub mod capabilities;
pub mod concurrency;
mod disks;
mod error;
mod registry;
mod secret;
pub mod settings;
mod types;

use async_trait::async_trait;

pub use capabilities::{BackendCapabilities, DiskTransferFormat, ImageSourceKind, Wants};
pub use disks::{DiskFormat, DiskTransfer, OS_DISK, StagedDisk};
pub use error::{BACKEND_VM_MISSING, BackendError, ErrorClass};
pub use registry::{BackendFactory, BackendRegistry};
pub use secret::SecretValue;
pub use types::*;

/// One connected backend instance (one vCenter session, one Proxmox client, one
/// libvirt connection). Created per Provider by a [`BackendFactory`] and reused
/// across reconciles; it renews its own session when it expires.
#[async_trait]
pub trait Backend: Send + Sync {
    /// Connects (or re-uses the session) and describes the backend: version and
    /// failure domains with what each can reach.
    async fn check(&self) -> Result<Inventory, BackendError>;

    /// Looks for an image on this backend, given every source a VMImage names.
    async fn find_image(&self, sources: &ImageSourceSet) -> Result<ImageLookup, BackendError>;

    /// Makes the machine exist and match the request: creates it if no machine
    /// carries `identity.uid`, else reconciles power. Idempotent; never waits for a
    /// long task (returns [`Pending`] instead).
    ///
    /// When `identity.provider_id` is set, the machine is looked for by it first and
    /// adopted when found under another UID (retagged where the backend keeps the
    /// UID). When neither finds it, nothing is created:
    /// [`BackendError::machine_missing`].
    async fn ensure(&self, request: &MachineRequest) -> Result<MachineObservation, BackendError>;

    /// Reads the machine's current state; `None` when no machine carries the UID (or,
    /// when set, the provider ID).
    async fn observe(
        &self,
        identity: &MachineIdentity,
    ) -> Result<Option<MachineObservation>, BackendError>;

    /// Deletes the machine carrying the UID, or the provider ID when set (powering it
    /// off first if needed).
    /// Deleting a machine that does not exist is `Ok(Deletion::Gone)`.
    async fn delete(&self, identity: &MachineIdentity) -> Result<Deletion, BackendError>;

    /// The machines this backend made for an object of `kind` (e.g. `LibvirtMachine`)
    /// named `identity.name` in `identity.namespace`, whatever UID they carry: what a
    /// restored object, whose UID is new and whose `spec.providerID` may be lost, is
    /// matched against before anything is created. Backends record the namespace,
    /// kind and name on every machine they make (or derive its name from them) so it
    /// can be found. Never called for a machine with a provider ID.
    ///
    /// The controller decides, not the backend: none, or only the machine carrying
    /// `identity.uid`, and [`Backend::ensure`] goes on as usual; exactly one not
    /// [`deleting`](MadeFor::deleting) whose recorded UID and provider ID no live
    /// object holds is adopted, through [`Backend::ensure`] with its provider ID
    /// (retagged there like a moved machine); anything else (several, one being
    /// deleted, one another live object holds) waits, `Ready=False RestorePending`,
    /// naming them, for a human. Read-only and idempotent.
    ///
    /// The default finds nothing: a backend that records no such identity never
    /// adopts a restored object's VM (it creates another). Every in-tree backend
    /// implements it.
    async fn made_for(
        &self,
        kind: &str,
        identity: &MachineIdentity,
    ) -> Result<Vec<MadeFor>, BackendError> {
        let _ = (kind, identity);
        Ok(Vec::new())
    }

    /// Applies the named `fields` of `request.spec` to the machine, which exists (it is
    /// found by `request.identity` as [`Backend::ensure`] finds it), and returns it as
    /// it is after, its [`resources`](MachineObservation::resources) read back.
    ///
    /// The controller decides, from this backend's change table
    /// ([`BackendCapabilities::changes`]) and the machine's power state, which fields it
    /// hands over ([`crate::changes::assess`]): on a running machine the `Live` ones (to
    /// apply to the running guest) and the `NextBoot` ones (to write into the
    /// configuration its next boot uses); on a powered-off machine every one that is
    /// not `Never`. It never hands over a field the table does not list. Idempotent;
    /// a long operation is returned as [`Pending`] as in `ensure`. A change the
    /// hypervisor refuses is an error naming the field, never a silent success: the
    /// controller reports a change applied only once it reads it back.
    ///
    /// The default refuses every change (terminal `ChangeUnsupported`): a backend
    /// whose table lists nothing is never asked.
    async fn apply_changes(
        &self,
        request: &MachineRequest,
        fields: &[MachineField],
    ) -> Result<MachineObservation, BackendError> {
        let names: Vec<&str> = fields.iter().map(|f| f.as_str()).collect();
        Err(BackendError::terminal(
            "ChangeUnsupported",
            format!(
                "this backend applies no change to a machine that exists ({} of {})",
                names.join(", "),
                request.identity.name
            ),
        ))
    }

    /// Its disk export and import, when it has them (`migration.strategy: CopyDisk`
    /// needs them on both sides; without, such a move is refused before anything is
    /// touched).
    fn disk_transfer(&self) -> Option<&dyn DiskTransfer> {
        None
    }

    /// What this backend can do for real: firmware, bootstrap formats, power states,
    /// image source kinds, disk transfer formats. The Provider publishes it (narrowed
    /// by its `capabilities.*` settings) and nothing that asks for more is placed
    /// here. The default, [`BackendCapabilities::conservative`], claims only what
    /// every backend does; declare more only where a test exercises it.
    fn capabilities(&self) -> BackendCapabilities {
        BackendCapabilities::conservative()
    }

    /// How many machines one Provider of this backend creates at once when its
    /// `maxConcurrentCreates` setting does not say; `None`, no cap. The rest wait,
    /// `Ready=False` with reason `CreateQueued`. A create lasts from the first
    /// [`Backend::ensure`] of a machine without a provider ID until it reports one
    /// (the VM exists), fails terminally, or the machine is deleted.
    fn default_max_concurrent_creates(&self) -> Option<usize> {
        None
    }
}
