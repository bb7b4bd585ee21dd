//! banlieue's simulated backend: an in-memory hypervisor with configurable latency and
//! fault injection that serves every infrastructure kind.
//!
//! The `sim` Provider class is to banlieue what the in-memory provider is to Cluster
//! API: a backend with no hypervisor behind it, for demos, scale benchmarks (10,000
//! machines), CAPI contract tests, chaos tests and users' CI. It implements banlieue-sdk's
//! [`Backend`](banlieue_sdk::backend::Backend) trait exactly like the real backends:
//! it receives plain request values, returns observations, never blocks on a long
//! operation and never talks to the Kubernetes API.
//!
//! # Behaviour
//!
//! - **Worlds.** [`SimFactory`] keeps one simulated hypervisor per distinct
//!   `spec.connection.endpoint` (`sim://lab-a`, `sim://lab-b`, ...). Machines live in
//!   the factory, not in the backend instance, so they survive the operator
//!   reconnecting (it does when a Provider's connection or settings change), and two
//!   endpoints never see each other's machines. Providers that share an endpoint share
//!   its machines; each applies its own settings to its own calls.
//! - **Identity.** Machines are keyed by `identity.uid`: `ensure` twice never makes two.
//!   A request whose `identity.provider_id` is set and whose UID no machine carries (a
//!   moved or restored object) adopts the machine with that provider ID, re-keyed to
//!   the new UID; when none has it, `ensure` fails with terminal `BackendVMMissing` and
//!   creates nothing. A world lives in the process: after a restart of the operator
//!   that hosts it, its machines are gone and say so.
//!   A machine gets a provider ID in the scheme its infrastructure kind requires
//!   (`vsphere://`, `proxmox://`, `libvirt://`, `cloud-hypervisor://`) followed by a
//!   version-4-shaped UUID that is deterministic per endpoint and creation order, and a
//!   backend handle shaped like the real one (`vm-1042`, `sim-a/142`, `ns_name`,
//!   `/run/banlieue/sim/<uuid>.sock`).
//! - **Time.** `ensure` starts an operation and returns at once with
//!   [`Pending`](banlieue_sdk::backend::Pending) (`Creating`, then `PoweringOn`,
//!   `PoweringOff`, `Suspending`, `Resuming`; `Deleting` for `delete`), a task ID
//!   (`sim-task-N`) and `retry_after` = the time left (at least 50 ms). A later call
//!   after that time finds the operation done. Each operation takes `latency`:
//!   creating a powered-on machine takes `2 × latency` (create, then power on). A
//!   power change asked for while an operation is in flight is queued behind it.
//!   Deleting cancels operations in flight. Time is [`tokio::time::Instant`], so tests
//!   can use tokio's paused clock. With `latency: 0s` every call completes at once.
//! - **Placement.** In `request.failure_domain` when given (it must be one of the
//!   simulator's, else terminal `UnknownFailureDomain`), otherwise in the failure
//!   domain holding the fewest machines (the first listed on ties).
//! - **Addresses.** Each machine holds an `InternalIP` from `10.0.0.0/8` (never
//!   `.0`/`.255`) for its whole life, unique among the machines of its world; freed
//!   addresses are reused only once all 16 million fresh ones are used. Observations
//!   report it and a `Hostname` (= `identity.name`) only while the machine is powered on.
//! - **Bootstrap data** is stored, never logged. [`SimMachineInfo`] tells whether it
//!   arrived and in which format; [`SimFactory::bootstrap_data`] hands it to tests
//!   that check delivery, still wrapped in `SecretValue`.
//! - **Images.** `find_image` finds an image iff it names a `sim` source; it resolves
//!   to `sim:<name>`. Machine specs' own image fields are not checked.
//! - **Faults.** Each call (`check`, `find_image`, `ensure`, `observe`, `delete`)
//!   draws from a seeded generator: with probability `failureRate` it is hit by a
//!   fault of a kind drawn uniformly from `failureKinds`. `transient` and `terminal`
//!   faults fail the call with reason `SimulatedFault` before it changes anything;
//!   `slow` lets it succeed but makes the operation it starts take 10 × `latency`.
//!   `failureCalls` limits faults to some calls (the others neither fail nor draw).
//!   Each backend instance has its own generator, restarted by every `connect`, so a
//!   single-threaded sequence of calls is reproducible for a given `seed`.
//! - **Capacity.** Creating a machine while the world holds `capacity` machines
//!   (counting those being created or deleted) fails with terminal
//!   `InsufficientCapacity`.
//!
//! # Settings
//!
//! Read from `Provider.spec.settings` (they arrive in `Connection.settings`). A bad
//! value, or an unknown key, fails `connect` with a terminal `InvalidSettings` error
//! that names every bad key and what it accepts. Credentials, CA bundle and TLS
//! settings are ignored.
//!
//! | key | value | default | meaning |
//! |---|---|---|---|
//! | `latency` | duration: `0`, or numbers with units `ns`, `us`, `ms`, `s`, `m`, `h` (`200ms`, `2s`, `1m30s`); at most `24h` | `0s` | how long each create, power change and delete takes |
//! | `failureRate` | number from `0` to `1` | `0` | probability that a call is hit by a fault |
//! | `failureKinds` | comma list of `transient`, `terminal`, `slow` | `transient` | the kinds a fault is drawn from, uniformly |
//! | `failureCalls` | comma list of `check`, `findImage`, `ensure`, `observe`, `delete`, `applyChanges` | all of them | the calls faults can hit (e.g. `ensure` alone keeps the Provider Ready while machines fail) |
//! | `recordCalls` | `true` or `false` | `false` | record every call with its time and machine, for [`SimFactory::calls`] (tests of retry spacing) |
//! | `seed` | unsigned 64-bit integer | a hash of the endpoint | seed of the fault generator |
//! | `capacity` | non-negative integer | unlimited | most machines the world holds |
//! | `failureDomains` | comma list of label values (at most 100) | `sim-a,sim-b` | the failure domains `check` reports and machines are placed in |
//! | `resources.<key>` | comma list | `default` | the values of resource `<key>` in every failure domain |
//! | `resources.<key>.<domain>` | comma list | `resources.<key>` | the same, for one failure domain |
//! | `features` | comma list | none | features of every failure domain |
//! | `features.<domain>` | comma list | `features` | features of one failure domain (replaces `features`) |
//! | `architecture` | `amd64`, `arm64` or `none` | `amd64` | the architecture every failure domain's hosts report (`none`: report none, as a backend that does not know; no image is placed there) |
//! | `architecture.<domain>` | `amd64`, `arm64` or `none` | `architecture` | the same, for one failure domain |
//! | `version` | text | `banlieue-sim <crate version>` | the version `check` reports |
//! | `machineKind` | text | none | read by the operator to choose the infrastructure kind it builds for this Provider; the simulator serves every kind and ignores it |
//!
//! Each failure domain `check` reports carries the label
//! `topology.kubernetes.io/zone=<name>`, the location `host=<name>`, and one entry in
//! `resources` for each of the keys capability mappings use ([`RESOURCE_KEYS`]:
//! `datastore`, `datastoreCluster`, `storagePolicy`, `portGroup`,
//! `distributedPortGroup`, `storage`, `bridge`, `vlan`, `pool`, `network`, `directory`),
//! valued `{default}` unless a `resources.*` setting says otherwise. A storage or
//! network class is offered by a failure domain when every `target` key/value of its
//! mapping is among these, so classes that map to `default` work everywhere, and
//! per-domain `resources.<key>.<domain>` settings let a test offer a class in only
//! some domains.
//!
//! # Example Provider
//!
//! ```yaml
//! apiVersion: banlieue.io/v1alpha1
//! kind: Provider
//! metadata:
//!   name: lab
//!   namespace: demo
//! spec:
//!   class: sim
//!   connection:
//!     endpoint: sim://lab-a
//!   capabilities:
//!     storageClasses:
//!       - name: fast
//!         target: {datastore: ssd}
//!       - name: standard
//!         target: {datastore: default}
//!     networkClasses:
//!       - name: frontend
//!         target: {portGroup: default}
//!   settings:
//!     latency: 500ms
//!     failureRate: "0.02"
//!     failureKinds: transient,slow
//!     seed: "7"
//!     capacity: "10000"
//!     failureDomains: zone-a,zone-b,zone-c
//!     resources.datastore: default
//!     resources.datastore.zone-a: default,ssd  # class "fast" only in zone-a
//!     features: nestedVirtualization
//!     machineKind: VSphereMachine
//! ```
//!
//! # Inspecting a simulated hypervisor from tests
//!
//! Keep a clone of the [`SimFactory`] you register with the operator; it sees every
//! world's machines ([`SimFactory::machines`], [`SimFactory::machine`]), counters
//! ([`SimFactory::stats`]) and bootstrap data ([`SimFactory::bootstrap_data`]), and can
//! cause drift ([`SimFactory::remove_machine`], [`SimFactory::set_power_state`]).
//! Give each test its own endpoint to keep tests apart. The simulator reads
//! [`tokio::time::Instant`], so under a paused clock (`#[tokio::test(start_paused =
//! true)]`, `tokio::time::advance`) call these from inside that runtime, as the
//! backend is.
//!
//! ```
//! use std::sync::Arc;
//! use banlieue_sdk::api::common::{PowerState, ProviderClass};
//! use banlieue_sdk::backend::{BackendFactory, BackendRegistry, Connection, MachineIdentity};
//! use banlieue_backend_sim::SimFactory;
//!
//! let sim = SimFactory::new();
//! let mut registry = BackendRegistry::default();
//! registry.register(ProviderClass::Sim, Arc::new(sim.clone()));
//!
//! // ... the operator connects a Provider and reconciles; here, by hand:
//! let connection = Connection {
//!     class: ProviderClass::Sim,
//!     endpoint: "sim://doc".into(),
//!     credentials: Default::default(),
//!     ca_bundle: None,
//!     insecure_skip_tls_verify: false,
//!     settings: [("failureDomains".to_string(), "zone-a".to_string())].into(),
//! };
//! let backend = registry.get(ProviderClass::Sim).unwrap().connect(&connection).unwrap();
//! let spec = serde_json::from_value(serde_json::json!({
//!     "template": "ubuntu", "numCPUs": 2, "memoryMiB": 4096,
//! })).unwrap();
//! let request = banlieue_sdk::backend::MachineRequest {
//!     identity: MachineIdentity { uid: "u-1".into(), namespace: "demo".into(), name: "web-0".into(), provider_id: None },
//!     spec: banlieue_sdk::backend::MachineSpec::VSphere(spec),
//!     failure_domain: None,
//!     bootstrap: None,
//!     instance_id: None,
//!     disks_imported: false,
//! };
//! let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
//! let observation = runtime.block_on(backend.ensure(&request)).unwrap();
//! assert!(observation.settled_at(PowerState::PoweredOn)); // latency 0s: done at once
//!
//! let machines = sim.machines("sim://doc");
//! assert_eq!(machines.len(), 1);
//! assert!(machines[0].provider_id.starts_with("vsphere://"));
//! assert_eq!(machines[0].failure_domain, "zone-a");
//! assert_eq!(sim.stats("sim://doc").ensure, 1);
//! ```
#![warn(missing_docs)]

mod addresses;
mod backend;
mod factory;
mod machine;
mod settings;
mod stats;
mod world;

use banlieue_sdk::api::common::ProviderClass;
use banlieue_sdk::backend::{
    BackendCapabilities, ChangeMode, ChangeRule, ImageSourceKind, MachineField,
};

pub use backend::{SLOW_FACTOR, SimBackend};
pub use factory::SimFactory;
pub use machine::{MIN_RETRY_AFTER, SimMachineInfo};
pub use settings::{
    DEFAULT_FAILURE_DOMAINS, DEFAULT_RESOURCE, FAULT_CALLS, FaultKind, MAX_FAILURE_DOMAINS,
    MAX_LATENCY, RESOURCE_KEYS, SimFailureDomain, SimSettings, ZONE_LABEL, default_version,
    parse_duration,
};
pub use stats::{SimCall, SimStats};

/// The `Provider.spec.class` this backend serves.
pub const CLASS: ProviderClass = ProviderClass::Sim;

/// What the simulator does (published in the Provider's
/// `status.backendCapabilities`; the book's capability matrix is generated from it):
/// everything, instantly; narrow it with the Provider's `capabilities.*` settings to
/// play a backend that cannot.
///
/// Its change table uses every mode, so that the demo, the scale benchmark and the
/// controller's tests meet each: CPUs and memory grow live and shrink only while
/// powered off, disks grow and are added or removed live (never shrunk), network
/// devices are taken at the next boot, the CPU topology only while off, and the
/// firmware never changes.
pub fn capabilities() -> BackendCapabilities {
    use banlieue_sdk::api::common::{BootstrapFormat as B, Firmware as F, PowerState as P};
    BackendCapabilities {
        changes: change_table(),
        firmware: vec![F::Bios, F::Efi, F::EfiSecure],
        bootstrap_formats: vec![B::CloudConfig, B::Ignition],
        power_states: vec![P::PoweredOn, P::PoweredOff, P::Suspended],
        image_sources: vec![ImageSourceKind::Name],
        disk_export: vec![],
        disk_import: vec![],
    }
}

/// The simulator's change table (see [`capabilities`]).
pub fn change_table() -> Vec<ChangeRule> {
    use ChangeMode::*;
    use MachineField as M;
    vec![
        ChangeRule::grow_shrink(M::Cpus, Live, PowerOff),
        ChangeRule::both(M::CoresPerSocket, PowerOff),
        ChangeRule::grow_shrink(M::MemoryMib, Live, PowerOff),
        ChangeRule::grow_shrink(M::OsDiskSize, Live, Never),
        ChangeRule::grow_shrink(M::DataDiskSize, Live, Never),
        ChangeRule::both(M::DataDisks, Live),
        ChangeRule::both(M::Networks, NextBoot),
        ChangeRule::both(M::Firmware, Never),
    ]
}

#[cfg(test)]
mod tests {
    #[test]
    fn serves_its_class() {
        assert_eq!(super::CLASS.as_str(), "sim");
    }
}
