//! banlieue's backend for Proxmox VE: a lean typed client for PVE's `/api2/json` REST
//! API on reqwest (rustls with the ring provider) behind banlieue-sdk's
//! [`Backend`](banlieue_sdk::backend::Backend) trait.
//!
//! # Connection
//!
//! `Provider.spec.connection.endpoint` is the API's base URL, e.g.
//! `https://pve1.example:8006` (a trailing `/api2/json` is accepted). TLS is verified
//! against `caBundle` when given, else the system's roots; `insecureSkipTLSVerify`
//! turns verification off (labs only). The credentials Secret holds either
//!
//! - `tokenID` (`user@realm!name`) and `tokenSecret`: sent as
//!   `Authorization: PVEAPIToken=<tokenID>=<tokenSecret>` (recommended), or
//! - `username` (`user@realm`) and `password`: a ticket from `POST /access/ticket`,
//!   sent as the `PVEAuthCookie` cookie with the `CSRFPreventionToken` header on
//!   writes, renewed after 90 minutes (PVE's tickets expire after 2 hours) and
//!   whenever PVE answers 401.
//!
//! The operator keeps one backend per Provider, so one client and one ticket serve
//! every machine of that Provider. Credentials are [`SecretValue`]s and never appear
//! in logs, errors or `Debug` output.
//!
//! [`SecretValue`]: banlieue_sdk::backend::SecretValue
//!
//! # Machines
//!
//! `ensure` never waits for a task: it starts one, returns
//! [`Pending`](banlieue_sdk::backend::Pending) with the UPID, and polls
//! `GET /nodes/{node}/tasks/{upid}/status` on the next call. A machine goes through:
//!
//! 1. **Clone** the template (`POST /nodes/{source}/qemu/{templateID}/clone`, full or
//!    linked, `target` = `targetNode` or the failure domain, `storage`, `pool`), with
//!    the VM's `name` and a `description` carrying `banlieue.io/uid: <uid>`. The VMID
//!    comes from `vmIDRange` or `/cluster/nextid`; a clone that finds its VMID taken
//!    retries with the next (see [`vmid`]).
//! 2. **Configure** once (`PUT …/config`): sockets, cores, memory, `agent: 1`,
//!    firmware, `smbios1: uuid=<uid>` (so `providerID` = `proxmox://<uid>` is stable),
//!    `netN` (bridge, VLAN `tag`, model, MTU, MAC), `ipconfigN` / `nameserver` from
//!    IPAM, `sshkeys` from the bootstrap cloud-config, additional disks, and the tags
//!    `banlieue;banlieue-<uid>`. The UID tag marks the VM configured. Then the boot
//!    disk is grown (`PUT …/resize`) when `diskGiB` is larger.
//! 3. **Power**: `status/start`, `status/shutdown` (with `shutdownTimeout` and
//!    `forceStop`), `status/suspend`, `status/resume`.
//! 4. **Observe**: power from `status/current`; addresses from the guest agent
//!    (`agent/network-get-interfaces`, loopback and link-local left out) plus the
//!    VM name as `Hostname`.
//!
//! `delete` stops a running VM, then destroys it with `purge=1` and
//! `destroy-unreferenced-disks=1`.
//!
//! **Crash safety.** A VM is found by its UID tag in `/cluster/resources`, else by
//! name plus the UID line in its description (a clone not yet configured), so a
//! restart never clones twice; a clone in flight shows as PVE's `clone` lock.
//!
//! **Errors.** PVE's envelope message and per-field `errors` become the error
//! message. 401 → terminal `Unauthorized`, 403 → `Forbidden`, 400 → `InvalidRequest`;
//! `VM is locked` and config-lock timeouts → transient `VMLocked`; lost quorum →
//! transient `NoQuorum`; other 5xx → transient `ServerError`; no connection →
//! transient `Unreachable`. A failed clone, resize or start task → terminal
//! `CloneFailed` / `ResizeFailed` / `StartFailed` with the task's exit status.
//!
//! # Inventory
//!
//! `check` reports `Proxmox VE <version> (release <r>)` and one failure domain per
//! online node, named after the node, with labels `topology.kubernetes.io/zone=<node>`
//! and `banlieue.io/proxmox-cluster=<cluster>`, location `node=<node>`, and resources
//! `storage` (active storages taking VM images on that node), `bridge` (its Linux and
//! OVS bridges) and, when the `vlans` setting lists any, `vlan`.
//!
//! # Settings
//!
//! | key | value | default | meaning |
//! |---|---|---|---|
//! | `taskPollInterval` | `500ms`, `2s`, ... (at most 300s) | `2s` | how soon to look at a running task again |
//! | `shutdownTimeout` | seconds | `120` | a shutdown's timeout before PVE stops the VM |
//! | `failedCloneBackoff` | duration, at most 3600s | `60s` | how long a failed clone is reported before it is tried again |
//! | `cluster` | text | PVE's cluster name, else the first node's | the `banlieue.io/proxmox-cluster` label |
//! | `vlans` | comma list of VLAN tags | none | published as resource `vlan` on every node (PVE cannot list the VLANs a bridge carries) |
//!
//! Other keys are ignored. Not yet supported: a NoCloud seed with the full bootstrap
//! user data (PVE's API cannot upload snippets; it needs an ISO upload), CAPI IPAM
//! pool addresses, `sources.proxmox.volume` images.
#![warn(missing_docs)]

mod backend;
pub mod client;
pub mod config;
pub mod drift;
pub mod inventory;
pub mod seed;
pub mod settings;
pub mod tasks;
pub mod vmid;

use banlieue_sdk::api::common::ProviderClass;

pub use backend::{IMAGE_SOURCE_UNSUPPORTED, ProxmoxBackend, ProxmoxFactory, RESTART_PENDING};

/// The `Provider.spec.class` this backend serves.
pub const CLASS: ProviderClass = ProviderClass::Proxmox;

#[cfg(test)]
mod tests {
    #[test]
    fn serves_its_class() {
        assert_eq!(super::CLASS.as_str(), "proxmox");
    }
}
