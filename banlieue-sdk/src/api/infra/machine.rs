//! Pieces every infrastructure machine spec shares.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use crate::api::common::{DISK_NAME_MSG, DNS_LABEL, DiskProvisioning};

/// The rule that freezes `spec.providerID` once banlieue has set it.
pub(crate) const PROVIDER_ID_IMMUTABLE: &str =
    "!has(oldSelf.providerID) || (has(self.providerID) && self.providerID == oldSelf.providerID)";

/// The message for [`PROVIDER_ID_IMMUTABLE`].
pub(crate) const PROVIDER_ID_IMMUTABLE_MSG: &str = "spec.providerID is immutable once set";

/// An additional disk of an infrastructure machine, on a backend storage target. It
/// only grows, and keeps its provisioning and storage.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(crate::api::common::MACHINE_DISK_STAYS).message(crate::api::common::MACHINE_DISK_STAYS_MSG))]
pub struct MachineDisk {
    /// Disk name, unique in the list: a DNS label, e.g. `data-1`.
    #[x_kube(validation = Rule::new(DNS_LABEL).message(DISK_NAME_MSG))]
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// Size in GiB. It only grows: a disk is never shrunk (that loses data), so a
    /// smaller size is refused.
    #[serde(rename = "sizeGiB")]
    #[schemars(range(min = 1, max = 65536))]
    #[x_kube(validation = Rule::new(crate::api::common::DISK_GROWS).message(crate::api::common::DISK_GROWS_MSG))]
    pub size_gib: u32,
    /// Backend storage target (datastore, Proxmox storage, libvirt pool, directory).
    /// Default: the OS disk's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 255))]
    pub storage: Option<String>,
    /// `thin` (default), `thick` or `eagerZeroed`.
    #[serde(default)]
    pub provisioning: DiskProvisioning,
}
