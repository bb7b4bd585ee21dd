//! The [`Backend`] and [`BackendFactory`] for libvirt.

use std::sync::Arc;

use banlieue_sdk::api::resources::MachineField;
use banlieue_sdk::async_trait;
use banlieue_sdk::backend::{
    Backend, BackendError, BackendFactory, Connection, Deletion, DiskTransfer, ImageLookup,
    ImageSourceSet, Inventory, MachineIdentity, MachineObservation, MachineRequest, MadeFor,
};

use crate::client::{Client, blocking};
use crate::{inventory, machine, reconfigure};

/// One libvirt host (one connection), shared by every machine of its Provider.
#[derive(Debug)]
pub struct LibvirtBackend {
    client: Arc<Client>,
}

impl LibvirtBackend {
    /// A backend for the connection; connects on first use.
    pub fn new(connection: &Connection) -> Result<Self, BackendError> {
        Ok(Self {
            client: Arc::new(Client::new(connection)?),
        })
    }

    pub(crate) fn client(&self) -> &Arc<Client> {
        &self.client
    }
}

#[async_trait]
impl Backend for LibvirtBackend {
    /// [`crate::capabilities`]: what this backend does for real.
    fn capabilities(&self) -> banlieue_sdk::backend::BackendCapabilities {
        crate::capabilities()
    }

    /// `maxConcurrentCreates` when the Provider does not set it: 8 (each create copies or overlays a disk with qemu-img on the host).
    fn default_max_concurrent_creates(&self) -> Option<usize> {
        Some(8)
    }

    async fn check(&self) -> Result<Inventory, BackendError> {
        blocking(&self.client, inventory::check).await
    }

    async fn find_image(&self, sources: &ImageSourceSet) -> Result<ImageLookup, BackendError> {
        let sources = sources.clone();
        blocking(&self.client, move |c| inventory::find_image(c, &sources)).await
    }

    async fn ensure(&self, request: &MachineRequest) -> Result<MachineObservation, BackendError> {
        let request = request.clone();
        blocking(&self.client, move |c| machine::ensure(c, &request)).await
    }

    /// The domain named `<namespace>.<name>` when banlieue's metadata is on it: a
    /// domain's name is unique on its host and derived from the object's namespace and
    /// name, so machines made before namespace and name were asked for are found too.
    /// Applies the named fields with `reconfigure::apply` and reads the domain back.
    async fn apply_changes(
        &self,
        request: &MachineRequest,
        fields: &[MachineField],
    ) -> Result<MachineObservation, BackendError> {
        let request = request.clone();
        let fields = fields.to_vec();
        blocking(&self.client, move |c| {
            reconfigure::apply(c, &request, &fields)
        })
        .await
    }

    async fn made_for(
        &self,
        kind: &str,
        identity: &MachineIdentity,
    ) -> Result<Vec<MadeFor>, BackendError> {
        if kind != "LibvirtMachine" {
            return Ok(Vec::new());
        }
        let identity = identity.clone();
        blocking(&self.client, move |c| machine::made_for(c, &identity)).await
    }

    async fn observe(
        &self,
        identity: &MachineIdentity,
    ) -> Result<Option<MachineObservation>, BackendError> {
        let identity = identity.clone();
        blocking(&self.client, move |c| machine::observe(c, &identity)).await
    }

    async fn delete(&self, identity: &MachineIdentity) -> Result<Deletion, BackendError> {
        let identity = identity.clone();
        blocking(&self.client, move |c| machine::delete(c, &identity)).await
    }

    /// Export and import over libvirt streams ([`crate::disks`]).
    fn disk_transfer(&self) -> Option<&dyn DiskTransfer> {
        Some(self)
    }
}

/// Creates [`LibvirtBackend`]s for libvirt Providers.
#[derive(Clone, Debug, Default)]
pub struct LibvirtFactory;

impl LibvirtFactory {
    /// A factory.
    pub fn new() -> Self {
        Self
    }
}

impl BackendFactory for LibvirtFactory {
    fn connect(&self, connection: &Connection) -> Result<Arc<dyn Backend>, BackendError> {
        Ok(Arc::new(LibvirtBackend::new(connection)?))
    }
}
