//! A machine's lifecycle on libvirt: create (volumes, seed, define, start), power,
//! observe, delete. Blocking; called through [`crate::client::blocking`].

use std::time::{Duration, Instant};

use banlieue_sdk::api::common::{DiskProvisioning, PowerState};
use banlieue_sdk::api::infra::libvirt::LibvirtMachineSpec;
use banlieue_sdk::api::infra::{MachineAddress, MachineAddressType};
use banlieue_sdk::backend::{
    BackendError, Deletion, MachineIdentity, MachineObservation, MachineRequest, MadeFor, Pending,
};
use virt::connect::Connect;
use virt::domain::{Domain, DomainState};
use virt::storage_pool::StoragePool;

use crate::client::Client;
use crate::disks::import::imported;
use crate::domain::{
    DomainPlan, METADATA_NS, VolumeRef, data_volume_name, domain_name, domain_xml,
    metadata_element, os_volume_name, parse_defined, seed_volume_name, volume_prefix,
};
use crate::error::{classify, is_not_found};
pub use crate::lookup::provider_id;
use crate::lookup::{check_uid, find, keyed, power_state, spec_of, state};
use crate::read_back::ReadBack;
use crate::{inventory, seed, volumes};

/// The domain named after `id`'s namespace and name, when banlieue made it (its
/// metadata carries a UID): see [`banlieue_sdk::backend::Backend::made_for`]. Deleting a
/// domain is immediate here (destroy, undefine), so none is ever reported deleting.
pub(crate) fn made_for(
    client: &Client,
    id: &MachineIdentity,
) -> Result<Vec<MadeFor>, BackendError> {
    let conn = client.conn()?;
    let name = domain_name(id);
    let dom = match conn.lookup_domain_by_name(&name) {
        Ok(dom) => dom,
        Err(e) if is_not_found(&e) => return Ok(Vec::new()),
        Err(e) => return Err(classify("looking up the domain by name", &e)),
    };
    let xml = dom
        .xml_desc(0)
        .map_err(|e| classify("reading the domain", &e))?;
    let defined = parse_defined(&xml)
        .map_err(|e| BackendError::transient("DomainUnreadable", format!("{name}: {e}")))?;
    let Some(uid) = defined.uid else {
        // Not banlieue's: `create` refuses to touch it (DomainNameTaken).
        return Ok(Vec::new());
    };
    let uuid = dom
        .uuid_string()
        .map_err(|e| classify("reading the domain UUID", &e))?;
    Ok(vec![MadeFor {
        provider_id: provider_id(&uuid),
        uid: Some(uid),
        backend_ref: name,
        deleting: false,
    }])
}

fn pending(operation: &str, after: Duration) -> Option<Pending> {
    Some(Pending {
        operation: operation.into(),
        task: None,
        retry_after: after,
    })
}

/// Makes the machine exist and reach its power state.
pub fn ensure(
    client: &Client,
    request: &MachineRequest,
) -> Result<MachineObservation, BackendError> {
    let spec = spec_of(request)?;
    let id = &keyed(&request.identity)?;
    check_uid(&id.uid)?;
    let conn = client.conn()?;
    match (find(&conn, &id.uid)?, &request.identity.provider_id) {
        (Some(dom), Some(_)) => {
            retag(&dom, &request.identity)?;
            power(client, &conn, &dom, id, spec)
        }
        (Some(dom), None) => power(client, &conn, &dom, id, spec),
        (None, Some(provider_id)) => Err(BackendError::machine_missing(
            provider_id,
            format!("libvirt host {}", conn.hostname().unwrap_or_default()),
        )),
        (None, None) => create(client, &conn, request, spec),
    }
}

/// A domain found by its provider ID for an object whose UID is not in its metadata (a
/// moved or restored object adopting it): the metadata is rewritten to name the new
/// owner, as every backend retags what it adopts, so `made_for` reports the UID a live
/// object holds. One metadata read per `ensure` of an adopted machine; a write once.
fn retag(dom: &Domain, owner: &MachineIdentity) -> Result<(), BackendError> {
    const ELEMENT: i32 = virt::sys::VIR_DOMAIN_METADATA_ELEMENT as i32;
    let current = dom
        .metadata(ELEMENT, Some(METADATA_NS), 0)
        .map_err(|e| classify("reading the domain's metadata", &e))?;
    let parsed = parse_defined(&format!("<domain><metadata>{current}</metadata></domain>"))
        .map_err(|e| BackendError::transient("DomainUnreadable", format!("metadata: {e}")))?;
    if parsed.uid.as_deref() == Some(owner.uid.as_str()) {
        return Ok(());
    }
    let mut flags = virt::sys::VIR_DOMAIN_AFFECT_CONFIG;
    if dom.is_active().unwrap_or(false) {
        flags |= virt::sys::VIR_DOMAIN_AFFECT_LIVE;
    }
    dom.set_metadata(
        ELEMENT,
        Some(&metadata_element(owner)),
        Some("banlieue"),
        Some(METADATA_NS),
        flags,
    )
    .map_err(|e| classify("retagging the domain's metadata", &e))?;
    tracing::info!(uid = %owner.uid, was = ?parsed.uid, "retagged adopted libvirt domain");
    Ok(())
}

fn create(
    client: &Client,
    conn: &Connect,
    request: &MachineRequest,
    spec: &LibvirtMachineSpec,
) -> Result<MachineObservation, BackendError> {
    let id = &request.identity;
    let name = domain_name(id);
    // Before anything is made: a CPU topology libvirt would refuse at define.
    crate::domain::spec_topology(spec)?;
    // A domain of this name with another UUID is someone else's: never touch it.
    if let Ok(other) = conn.lookup_domain_by_name(&name) {
        let other_uuid = other.uuid_string().unwrap_or_default();
        if other_uuid != id.uid {
            return Err(BackendError::terminal(
                "DomainNameTaken",
                format!("a domain named {name} already exists with UUID {other_uuid}"),
            ));
        }
    }
    let pool = volumes::pool(conn, &spec.storage_pool)?;
    // Imported disks are the machine's whole state: never stand an image clone in.
    let (os_disk, data_disks) = if request.disks_imported {
        imported(conn, &id.uid, spec)?
    } else {
        // Before any volume is made: the image must be a file where images may be.
        crate::paths::check_image(
            conn,
            &spec.image,
            client.settings.image_dirs.as_deref(),
            client.endpoint.local,
        )?;
        from_image(conn, &pool, &id.uid, spec)?
    };
    let seed_ref = VolumeRef {
        pool: spec.storage_pool.clone(),
        name: seed_volume_name(&id.uid),
    };
    let files = seed::files(id, request.instance_id(), spec, request.bootstrap.as_ref())?;
    let image_bytes = seed::vfat_image(&files)?;
    volumes::ensure_seed(conn, &pool, &seed_ref.name, &image_bytes)?;
    let plan = DomainPlan {
        name: name.clone(),
        identity: id,
        spec,
        domain_type: client.domain_type(conn)?,
        machine: client.settings.machine.as_deref(),
        os_disk,
        data_disks,
        seed: seed_ref,
    };
    let dom = conn
        .define_domain_xml(&domain_xml(&plan)?)
        .map_err(|e| classify(&format!("defining domain {name}"), &e))?;
    tracing::info!(domain = %name, uid = %id.uid, "defined libvirt domain");
    power(client, conn, &dom, id, spec)
}

/// The OS disk as an overlay on the image and empty additional disks, each created
/// once (by name).
fn from_image(
    conn: &Connect,
    pool: &StoragePool,
    uid: &str,
    spec: &LibvirtMachineSpec,
) -> Result<(VolumeRef, Vec<VolumeRef>), BackendError> {
    let image = volumes::image(conn, &spec.image)?.ok_or_else(|| {
        BackendError::terminal(
            "ImageNotFound",
            format!(
                "the image {} is not on this host",
                match (&spec.image.volume, &spec.image.path) {
                    (Some(v), _) => format!("volume {} in storage pool {}", v.name, v.pool),
                    (None, Some(path)) => path.clone(),
                    (None, None) => "(neither a volume nor a path)".to_owned(),
                }
            ),
        )
    })?;
    let os_disk = VolumeRef {
        pool: spec.storage_pool.clone(),
        name: os_volume_name(uid),
    };
    volumes::ensure_os_disk(pool, &os_disk.name, &image, spec.disk_gib)?;
    let mut data_disks = Vec::new();
    for disk in &spec.additional_disks {
        let pool_name = disk
            .storage
            .clone()
            .unwrap_or_else(|| spec.storage_pool.clone());
        let disk_pool = volumes::pool(conn, &pool_name)?;
        let name = data_volume_name(uid, &disk.name);
        let preallocate = disk.provisioning != DiskProvisioning::Thin;
        volumes::ensure_data_disk(&disk_pool, &name, disk.size_gib, preallocate)?;
        data_disks.push(VolumeRef {
            pool: pool_name,
            name,
        });
    }
    Ok((os_disk, data_disks))
}

fn power(
    client: &Client,
    conn: &Connect,
    dom: &Domain,
    id: &MachineIdentity,
    spec: &LibvirtMachineSpec,
) -> Result<MachineObservation, BackendError> {
    let poll = client.settings.poll_interval;
    let now = state(dom)?;
    let act = |what: &str, r: Result<(), virt::error::Error>| {
        r.map_err(|e| classify(&format!("{what} the domain"), &e))
    };
    let in_flight = match (spec.power_state, now) {
        (PowerState::PoweredOn, DomainState::Shutoff | DomainState::Crashed) => {
            act("starting", dom.create())?;
            tracing::info!(uid = %id.uid, "started libvirt domain");
            pending("PoweringOn", poll)
        }
        (PowerState::PoweredOn, DomainState::Paused | DomainState::PMSuspended) => {
            act("resuming", dom.resume())?;
            pending("PoweringOn", poll)
        }
        // A shutdown in progress finishes first; then the domain is started again.
        (PowerState::PoweredOn, DomainState::Shutdown) => pending("PoweringOff", poll),
        (
            PowerState::PoweredOff,
            DomainState::Running
            | DomainState::Blocked
            | DomainState::Shutdown
            | DomainState::Paused,
        ) => {
            let mut asked = client.shutdowns.lock().unwrap_or_else(|e| e.into_inner());
            let since = *asked.entry(id.uid.clone()).or_insert_with(Instant::now);
            drop(asked);
            if since.elapsed() >= client.settings.shutdown_timeout || now == DomainState::Paused {
                act("destroying", dom.destroy())?;
                tracing::info!(uid = %id.uid, "destroyed libvirt domain after the shutdown timeout");
            } else {
                // Repeated power-button presses are harmless and cover a guest that
                // missed the first one while booting.
                act("shutting down", dom.shutdown())?;
            }
            pending("PoweringOff", poll)
        }
        (PowerState::Suspended, DomainState::Running | DomainState::Blocked) => {
            act("suspending", dom.suspend())?;
            pending("Suspending", poll)
        }
        (PowerState::Suspended, DomainState::Shutoff | DomainState::Crashed) => {
            act(
                "starting (paused)",
                dom.create_with_flags(virt::sys::VIR_DOMAIN_START_PAUSED),
            )?;
            pending("Suspending", poll)
        }
        _ => None,
    };
    if spec.power_state != PowerState::PoweredOff {
        client
            .shutdowns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id.uid);
    }
    let mut observation = observe_domain(client, conn, dom, id)?;
    if in_flight.is_some() {
        observation.pending = in_flight;
    } else if spec.power_state == PowerState::PoweredOn
        && client.settings.wait_for_address
        && observation
            .addresses
            .iter()
            .all(|a| a.type_ == MachineAddressType::Hostname)
        && has_managed_network(dom)
    {
        observation.pending = pending("WaitingForAddress", poll);
    }
    Ok(observation)
}

fn has_managed_network(dom: &Domain) -> bool {
    dom.xml_desc(0)
        .ok()
        .and_then(|xml| parse_defined(&xml).ok())
        .is_some_and(|d| d.interfaces.iter().any(|(_, network)| network.is_some()))
}

fn usable(address: &str) -> bool {
    !(address.starts_with("127.")
        || address == "::1"
        || address.starts_with("169.254.")
        || address.to_ascii_lowercase().starts_with("fe80:"))
}

/// Addresses from DHCP leases of libvirt networks, else from the guest agent.
fn addresses(dom: &Domain) -> Vec<String> {
    let mut out = Vec::new();
    for source in [
        virt::sys::VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE,
        virt::sys::VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT,
    ] {
        // The agent is optional (a guest without qemu-ga answers with an error).
        if let Ok(interfaces) = dom.interface_addresses(source, 0) {
            for iface in interfaces {
                for a in iface.addrs {
                    if usable(&a.addr) && !out.contains(&a.addr) {
                        out.push(a.addr);
                    }
                }
            }
        }
        if !out.is_empty() {
            break;
        }
    }
    out
}

pub(crate) fn observe_domain(
    client: &Client,
    conn: &Connect,
    dom: &Domain,
    id: &MachineIdentity,
) -> Result<MachineObservation, BackendError> {
    let now = state(dom)?;
    let (resources, next_boot) = ReadBack::read(conn, dom)?.resources(&id.uid);
    let mut addrs: Vec<MachineAddress> = Vec::new();
    if dom.is_active().unwrap_or(false) {
        addrs.extend(addresses(dom).into_iter().map(|address| MachineAddress {
            type_: MachineAddressType::InternalIp,
            address,
        }));
    }
    addrs.push(MachineAddress {
        type_: MachineAddressType::Hostname,
        address: id.name.clone(),
    });
    Ok(MachineObservation {
        next_boot,
        resources: Some(resources),
        provider_id: Some(provider_id(&id.uid)),
        power_state: power_state(now),
        addresses: addrs,
        failure_domain: inventory::failure_domain_name(client, conn).ok(),
        backend_ref: dom.name().ok(),
        pending: None,
    })
}

/// The machine as it is now; `None` when no domain has the UID.
pub fn observe(
    client: &Client,
    id: &MachineIdentity,
) -> Result<Option<MachineObservation>, BackendError> {
    let id = &keyed(id)?;
    if check_uid(&id.uid).is_err() {
        return Ok(None);
    }
    let conn = client.conn()?;
    match find(&conn, &id.uid)? {
        Some(dom) => observe_domain(client, &conn, &dom, id).map(Some),
        None => Ok(None),
    }
}

/// Destroys and undefines the domain, then deletes every volume that carries the UID
/// (the domain's own and any a crashed create left behind). Never deletes a volume
/// without the UID prefix, such as the image.
pub fn delete(client: &Client, id: &MachineIdentity) -> Result<Deletion, BackendError> {
    let id = &keyed(id)?;
    if check_uid(&id.uid).is_err() {
        return Ok(Deletion::Gone);
    }
    let conn = client.conn()?;
    let prefix = volume_prefix(&id.uid);
    let mut owned: Vec<(String, String)> = Vec::new();
    if let Some(dom) = find(&conn, &id.uid)? {
        if let Ok(defined) = dom
            .xml_desc(0)
            .map_err(|e| e.to_string())
            .and_then(|x| parse_defined(&x))
        {
            owned.extend(
                defined
                    .volumes
                    .into_iter()
                    .filter(|v| v.name.starts_with(&prefix))
                    .map(|v| (v.pool, v.name)),
            );
        }
        if dom.is_active().unwrap_or(false) {
            match dom.destroy() {
                Ok(()) => {}
                Err(e) if is_not_found(&e) => {}
                Err(e) => {
                    // A domain that stopped meanwhile cannot be destroyed; anything else is real.
                    if dom.is_active().unwrap_or(true) {
                        return Err(classify("destroying the domain", &e));
                    }
                }
            }
        }
        let flags = virt::sys::VIR_DOMAIN_UNDEFINE_MANAGED_SAVE
            | virt::sys::VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA
            | virt::sys::VIR_DOMAIN_UNDEFINE_NVRAM
            | virt::sys::VIR_DOMAIN_UNDEFINE_CHECKPOINTS_METADATA;
        match dom.undefine_flags(flags) {
            Ok(()) => tracing::info!(uid = %id.uid, "undefined libvirt domain"),
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(classify("undefining the domain", &e)),
        }
    }
    client
        .shutdowns
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&id.uid);
    for found in volumes::with_prefix(&conn, &prefix)? {
        if !owned.contains(&found) {
            owned.push(found);
        }
    }
    for (pool, name) in &owned {
        volumes::delete(&conn, pool, name)?;
    }
    Ok(Deletion::Gone)
}
