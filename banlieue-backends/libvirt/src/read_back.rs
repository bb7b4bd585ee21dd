//! Reading a domain back: its live and persistent shapes (CPUs, memory, topology,
//! disks, interfaces) and its volumes' capacities, as the resources it runs with and
//! those its next boot uses ([`ReadBack`]).

use banlieue_sdk::api::resources::MachineResources;
use banlieue_sdk::backend::BackendError;
use virt::connect::Connect;
use virt::domain::Domain;

use crate::changes::{Current, DomainShape, parse_shape, resources};
use crate::domain::VolumeRef;
use crate::error::{classify, is_not_found};

fn shape_of(dom: &Domain, flags: u32) -> Result<DomainShape, BackendError> {
    let xml = dom
        .xml_desc(flags)
        .map_err(|e| classify("reading the domain", &e))?;
    parse_shape(&xml).map_err(|e| BackendError::transient("DomainUnreadable", e))
}

/// A volume's capacity in bytes (libvirt re-reads the image's header), `None` when
/// the volume is gone.
fn capacity(conn: &Connect, volume: &VolumeRef) -> Result<Option<u64>, BackendError> {
    let pool = match conn.lookup_storage_pool_by_name(&volume.pool) {
        Ok(p) => p,
        Err(e) if is_not_found(&e) => return Ok(None),
        Err(e) => return Err(classify("looking up a disk's pool", &e)),
    };
    let vol = match pool.lookup_storage_vol_by_name(&volume.name) {
        Ok(v) => v,
        Err(e) if is_not_found(&e) => return Ok(None),
        Err(e) => return Err(classify("looking up a disk's volume", &e)),
    };
    vol.info()
        .map(|i| Some(i.capacity))
        .map_err(|e| classify(&format!("reading the size of {}", volume.name), &e))
}

/// The live and persistent shapes of `dom` and its volumes' capacities.
pub(crate) struct ReadBack {
    active: bool,
    live: DomainShape,
    config: DomainShape,
    capacities: Vec<(VolumeRef, Option<u64>)>,
}

impl ReadBack {
    pub(crate) fn read(conn: &Connect, dom: &Domain) -> Result<Self, BackendError> {
        let active = dom.is_active().unwrap_or(false);
        let live = shape_of(dom, 0)?;
        let config = if active {
            shape_of(dom, virt::sys::VIR_DOMAIN_XML_INACTIVE)?
        } else {
            live.clone()
        };
        let mut capacities = Vec::new();
        for (_, volume) in live.disks.iter().chain(&config.disks) {
            if !capacities.iter().any(|(v, _)| v == volume) {
                capacities.push((volume.clone(), capacity(conn, volume)?));
            }
        }
        Ok(Self {
            active,
            live,
            config,
            capacities,
        })
    }

    /// What [`crate::changes::plan`] decides from.
    pub(crate) fn current(&self) -> Current<'_> {
        Current {
            active: self.active,
            live: &self.live,
            config: &self.config,
            capacities: &self.capacities,
        }
    }

    fn capacity(&self, volume: &VolumeRef) -> Option<u64> {
        self.capacities
            .iter()
            .find(|(v, _)| v == volume)
            .and_then(|(_, c)| *c)
    }

    /// What the domain runs with, and what its next boot uses when that differs (a
    /// change written to the persistent definition only). The firmware is the
    /// persistent definition's: libvirt fills in the loader it picked in the live XML,
    /// which says nothing about what was asked.
    pub(crate) fn resources(&self, uid: &str) -> (MachineResources, Option<MachineResources>) {
        let capacity = |v: &VolumeRef| self.capacity(v);
        let mut running = resources(uid, &self.live, capacity);
        running.firmware = Some(self.config.firmware);
        let next = resources(uid, &self.config, capacity);
        let next_boot = (self.active && next != running).then_some(next);
        (running, next_boot)
    }
}
