//! Which backend serves which Provider class.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::api::common::ProviderClass;

use super::{Backend, BackendError, Connection};

/// Creates connected [`Backend`]s for Providers of one class.
pub trait BackendFactory: Send + Sync {
    /// A backend for this connection. Cheap: real network I/O waits for the first
    /// call. Errors here are configuration errors (bad endpoint, unusable CA bundle).
    fn connect(&self, connection: &Connection) -> Result<Arc<dyn Backend>, BackendError>;
}

/// Maps a Provider's `spec.class` to the factory that serves it. The binary
/// registers the backends compiled in; embedders register their own.
#[derive(Clone, Default)]
pub struct BackendRegistry {
    factories: BTreeMap<ProviderClass, Arc<dyn BackendFactory>>,
}

impl BackendRegistry {
    /// Serves `class` with `factory`, replacing any earlier registration.
    pub fn register(
        &mut self,
        class: ProviderClass,
        factory: Arc<dyn BackendFactory>,
    ) -> &mut Self {
        self.factories.insert(class, factory);
        self
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
