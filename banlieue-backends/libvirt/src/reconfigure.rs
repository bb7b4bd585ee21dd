//! Applying a change to a running domain: the steps [`crate::changes::plan`] decided,
//! carried out through libvirt, then the domain read back.

use banlieue_sdk::api::resources::MachineField;
use banlieue_sdk::backend::{BackendError, MachineObservation, MachineRequest};
use virt::connect::Connect;
use virt::domain::Domain;

use crate::changes::{Step, dimm_xml, plan, rewrite_persistent};
use crate::client::Client;
use crate::error::classify;
use crate::lookup::{check_uid, find, keyed, provider_id, spec_of};
use crate::machine::observe_domain;
use crate::read_back::ReadBack;

fn field_of(step: &Step) -> &'static str {
    match step {
        Step::Vcpus { .. } => "cpus",
        Step::Memory { .. } | Step::AttachMemory { .. } => "memoryMiB",
        Step::Redefine { .. } => "cpus/memoryMiB/coresPerSocket",
        Step::BlockResize { .. } | Step::VolumeResize { .. } => "disk size",
        Step::AttachInterface { .. } => "networks",
    }
}

fn run(conn: &Connect, dom: &Domain, step: &Step) -> Result<(), BackendError> {
    use virt::sys;
    let doing = format!("{}: {step:?}", field_of(step));
    let scope = |live: bool| {
        if live {
            sys::VIR_DOMAIN_DEVICE_MODIFY_LIVE
        } else {
            sys::VIR_DOMAIN_DEVICE_MODIFY_CONFIG
        }
    };
    let result = match step {
        Step::Vcpus {
            count,
            live,
            maximum,
        } => {
            let mut flags = if *live {
                sys::VIR_DOMAIN_VCPU_LIVE
            } else {
                sys::VIR_DOMAIN_VCPU_CONFIG
            };
            if *maximum {
                flags |= sys::VIR_DOMAIN_VCPU_MAXIMUM;
            }
            dom.set_vcpus_flags(*count, flags)
        }
        Step::Memory { kib, maximum } => {
            let mut flags = sys::VIR_DOMAIN_MEM_CONFIG;
            if *maximum {
                flags |= sys::VIR_DOMAIN_MEM_MAXIMUM;
            }
            dom.set_memory_flags(*kib, flags)
        }
        Step::BlockResize { target, bytes } => {
            dom.block_resize(target, *bytes, sys::VIR_DOMAIN_BLOCK_RESIZE_BYTES)
        }
        Step::VolumeResize { volume, bytes } => {
            let vol = conn
                .lookup_storage_pool_by_name(&volume.pool)
                .and_then(|p| p.lookup_storage_vol_by_name(&volume.name));
            vol.and_then(|v| v.resize(*bytes, 0))
        }
        Step::AttachInterface { xml, live } => dom.attach_device_flags(xml, scope(*live)),
        Step::AttachMemory { kib } => dom.attach_device_flags(&dimm_xml(*kib), scope(true)),
        Step::Redefine {
            vcpus,
            memory,
            cores,
        } => {
            let xml = dom
                .xml_desc(sys::VIR_DOMAIN_XML_INACTIVE)
                .map_err(|e| classify("reading the domain's persistent definition", &e))?;
            let xml = rewrite_persistent(&xml, *vcpus, *memory, *cores)
                .map_err(|e| BackendError::transient("DomainUnreadable", e))?;
            conn.define_domain_xml(&xml).map(|_| ())
        }
    };
    result.map_err(|e| classify(&doing, &e))?;
    tracing::info!(step = ?step, "applied a change to a libvirt domain");
    Ok(())
}

/// Applies `fields` of the request's spec to its domain and reads it back.
pub fn apply(
    client: &Client,
    request: &MachineRequest,
    fields: &[MachineField],
) -> Result<MachineObservation, BackendError> {
    let spec = spec_of(request)?;
    let id = &keyed(&request.identity)?;
    check_uid(&id.uid)?;
    let conn = client.conn()?;
    let Some(dom) = find(&conn, &id.uid)? else {
        return Err(BackendError::machine_missing(
            &request
                .identity
                .provider_id
                .clone()
                .unwrap_or_else(|| provider_id(&id.uid)),
            format!("libvirt host {}", conn.hostname().unwrap_or_default()),
        ));
    };
    let read = ReadBack::read(&conn, &dom)?;
    for step in plan(&id.uid, spec, &read.current(), fields)? {
        run(&conn, &dom, &step)?;
    }
    observe_domain(client, &conn, &dom, id)
}
