//! Which backend serves which Provider class.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::api::common::ProviderClass;
use crate::contract::{KindTable, MachineKind};

use super::{Backend, BackendError, Connection};

/// Creates connected [`Backend`]s for Providers of one class.
pub trait BackendFactory: Send + Sync {
    /// A backend for this connection. Cheap: real network I/O waits for the first
    /// call. Errors here are configuration errors (bad endpoint, unusable CA bundle).
    fn connect(&self, connection: &Connection) -> Result<Arc<dyn Backend>, BackendError>;
}

/// Maps a Provider's `spec.class` to the factory that serves it, and holds the kind
/// table: which infrastructure machine kinds the controllers run for, and which class
/// builds each. The binary registers the backends compiled in; embedders register
/// their own, with a kind of their own ([`BackendRegistry::register_kind`]).
#[derive(Clone, Default)]
pub struct BackendRegistry {
    factories: BTreeMap<ProviderClass, Arc<dyn BackendFactory>>,
    kinds: KindTable,
}

impl BackendRegistry {
    /// Serves `class` with `factory`, replacing any earlier registration. For one of
    /// banlieue's own classes this also registers the kinds it builds (its own; all
    /// four for `sim`); a class of your own needs [`BackendRegistry::register_kind`].
    pub fn register(
        &mut self,
        class: ProviderClass,
        factory: Arc<dyn BackendFactory>,
    ) -> &mut Self {
        self.factories.insert(class, factory);
        self.kinds.register_built_in(class);
        self
    }

    /// Registers machine kind `K` as the one Providers of `class` build: the
    /// controllers then run for it.
    pub fn register_kind<K: MachineKind>(&mut self, class: ProviderClass) -> &mut Self {
        self.kinds.register::<K>(Some(class));
        self
    }

    /// The kind table.
    pub fn kinds(&self) -> &KindTable {
        &self.kinds
    }

    /// The factory for `class`, if one is registered.
    pub fn get(&self, class: ProviderClass) -> Option<&Arc<dyn BackendFactory>> {
        self.factories.get(&class)
    }

    /// The registered classes.
    pub fn classes(&self) -> impl Iterator<Item = ProviderClass> + '_ {
        self.factories.keys().copied()
    }
}

impl std::fmt::Debug for BackendRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.factories.keys()).finish()
    }
}
