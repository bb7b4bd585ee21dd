//! libvirt errors classified as transient or terminal.

use banlieue_sdk::backend::BackendError;
use virt::error::{Error, ErrorNumber};

/// Whether libvirt answered "no such object" for this error.
pub fn is_not_found(e: &Error) -> bool {
    matches!(
        Result::<ErrorNumber, _>::from(e.code()),
        Ok(ErrorNumber::NoDomain
            | ErrorNumber::NoStorageVolume
            | ErrorNumber::NoStoragePool
            | ErrorNumber::NoNetwork)
    )
}

/// Whether the error means the connection itself is gone (reconnect next time).
pub fn is_connection_lost(e: &Error) -> bool {
    matches!(
        Result::<ErrorNumber, _>::from(e.code()),
        Ok(ErrorNumber::NoConnect | ErrorNumber::InvalidConn | ErrorNumber::Rpc)
    )
}

/// A libvirt error as a [`BackendError`], with `doing` saying what failed.
///
/// Terminal: what a retry cannot fix (bad XML or arguments, unsupported features,
/// a missing pool/network/image, denied access, a name taken by another domain).
/// Transient: connection trouble, timeouts, busy resources, and anything libvirt
/// does not classify (internal and operation failures are often races with the
/// hypervisor, e.g. a domain that just stopped).
pub fn classify(doing: &str, e: &Error) -> BackendError {
    let message = format!("{doing}: {}", e.message());
    let code = Result::<ErrorNumber, _>::from(e.code());
    match code {
        Ok(ErrorNumber::AuthFailed | ErrorNumber::AuthCancelled | ErrorNumber::AccessDenied) => {
            BackendError::terminal("Unauthorized", message)
        }
        Ok(ErrorNumber::NoConnect | ErrorNumber::InvalidConn | ErrorNumber::Rpc) => {
            BackendError::transient("Unreachable", message)
        }
        Ok(
            ErrorNumber::OperationTimeout
            | ErrorNumber::AgentUnresponsive
            | ErrorNumber::ResourceBusy,
        ) => BackendError::transient("Busy", message),
        Ok(ErrorNumber::XmlError | ErrorNumber::XmlDetail | ErrorNumber::InvalidArg) => {
            BackendError::terminal("InvalidSpec", message)
        }
        Ok(
            ErrorNumber::NoSupport
            | ErrorNumber::OperationUnsupported
            | ErrorNumber::ConfigUnsupported,
        ) => BackendError::terminal("Unsupported", message),
        Ok(ErrorNumber::NoStoragePool) => BackendError::terminal("StoragePoolNotFound", message),
        Ok(ErrorNumber::NoNetwork) => BackendError::terminal("NetworkNotFound", message),
        Ok(ErrorNumber::NoStorageVolume) => BackendError::terminal("VolumeNotFound", message),
        Ok(ErrorNumber::DomExist) => BackendError::terminal("DomainNameTaken", message),
        _ => BackendError::transient("LibvirtError", message),
    }
}
