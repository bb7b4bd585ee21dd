//! Finding a machine's domain again: the identity its domain and volumes carry (the
//! UID it was made for, or the UUID its provider ID names), and the domain's state.
//! Shared by the lifecycle ([`crate::machine`]), changes ([`crate::reconfigure`]) and
//! disk transfer ([`crate::disks`]).

use banlieue_sdk::api::common::PowerState;
use banlieue_sdk::api::infra::libvirt::LibvirtMachineSpec;
use banlieue_sdk::backend::{BackendError, MachineIdentity, MachineRequest};
use virt::connect::Connect;
use virt::domain::{Domain, DomainState};

use crate::error::{classify, is_not_found};

/// `libvirt://<domain UUID>` (the UUID is the UID of the infra object that created it).
pub fn provider_id(uid: &str) -> String {
    format!("libvirt://{uid}")
}

/// The identity the domain and its volumes carry. A domain's UUID cannot change, so
/// once `spec.providerID` is set its UUID is the key: a moved or restored object (new
/// UID, same providerID) finds the same domain and volumes. Before that, the UID.
pub(crate) fn keyed(id: &MachineIdentity) -> Result<MachineIdentity, BackendError> {
    Ok(match id.provider_id_for("libvirt")? {
        Some(uuid) => MachineIdentity {
            uid: uuid,
            ..id.clone()
        },
        None => id.clone(),
    })
}

/// libvirt wants a UUID; Kubernetes UIDs are UUIDs.
pub(crate) fn check_uid(uid: &str) -> Result<(), BackendError> {
    let ok = uid.len() == 36
        && uid.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit(),
        });
    if ok {
        Ok(())
    } else {
        Err(BackendError::terminal(
            "InvalidUID",
            format!(
                "the machine's UID {uid} is not a UUID, which libvirt needs as the domain UUID"
            ),
        ))
    }
}

pub(crate) fn spec_of(request: &MachineRequest) -> Result<&LibvirtMachineSpec, BackendError> {
    request.spec_as::<LibvirtMachineSpec>()
}

pub(crate) fn find(conn: &Connect, uid: &str) -> Result<Option<Domain>, BackendError> {
    match conn.lookup_domain_by_uuid_string(uid) {
        Ok(d) => Ok(Some(d)),
        Err(e) if is_not_found(&e) => Ok(None),
        Err(e) => Err(classify("looking up the domain", &e)),
    }
}

/// The domain's state now.
pub(crate) fn state(dom: &Domain) -> Result<DomainState, BackendError> {
    let (state, _) = dom
        .state()
        .map_err(|e| classify("reading the domain's state", &e))?;
    Ok(Result::<DomainState, _>::from(state).unwrap_or(DomainState::NoState))
}

pub(crate) fn power_state(state: DomainState) -> Option<PowerState> {
    match state {
        DomainState::Running | DomainState::Blocked | DomainState::Shutdown => {
            Some(PowerState::PoweredOn)
        }
        DomainState::Paused | DomainState::PMSuspended => Some(PowerState::Suspended),
        DomainState::Shutoff | DomainState::Crashed => Some(PowerState::PoweredOff),
        DomainState::NoState => None,
    }
}
