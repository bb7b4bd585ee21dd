//! A local Kubernetes control plane (etcd + kube-apiserver) for banlieue's integration
//! tests: the Rust counterpart of controller-runtime's envtest.
//!
//! One control plane is started lazily per test binary and shared by its tests; each test
//! gets its own namespace and builds its own client (every `#[tokio::test]` has its own
//! runtime, and a [`kube::Client`] must not outlive the runtime it was created on):
//!
//! ```no_run
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::api::PostParams;
//!
//! #[tokio::test]
//! async fn creates_a_config_map() {
//!     let ns = banlieue_testenv::namespace("config-map").await;
//!     let config_maps = ns.api::<ConfigMap>();
//!     let mut cm = ConfigMap::default();
//!     cm.metadata.name = Some("example".into());
//!     config_maps.create(&PostParams::default(), &cm).await.unwrap();
//! }
//! ```
//!
//! The control plane has no kube-controller-manager: no garbage collection, namespaces never
//! finish terminating, no ServiceAccount tokens, no pods running. CRDs, server-side apply,
//! CEL validation, finalizers, RBAC, watches and status subresources all work.
//!
//! # Binaries
//! Looked up like envtest: `TEST_ASSET_KUBE_APISERVER` / `TEST_ASSET_ETCD`, then
//! `$KUBEBUILDER_ASSETS/<name>`, then `/usr/local/kubebuilder/bin/<name>`. `make testbin`
//! builds them and the Makefile's test targets set `KUBEBUILDER_ASSETS`. Missing binaries
//! fail the test with that hint, also outside CI (`CI=true`): the tests are never skipped
//! silently.
//!
//! # Environment
//! See [`ControlPlaneConfig::from_env`]; in short `KUBEBUILDER_CONTROLPLANE_START_TIMEOUT`
//! (default 60s), `KUBEBUILDER_ATTACH_CONTROL_PLANE_OUTPUT=true`, `BANLIEUE_TESTENV_KEEP=1`
//! and `BANLIEUE_TESTENV_VERBOSE=1` (prints startup timings).
//!
//! # Teardown
//! At process exit (an `atexit` hook; test binaries end with `std::process::exit`) the
//! apiserver and then etcd get SIGTERM, then SIGKILL after the stop timeout, and the
//! temporary directory is removed. Children run in their own process groups and get
//! SIGKILL from the kernel if the test binary dies without running the hook
//! (`PR_SET_PDEATHSIG`); directories such a run left behind are removed by the next one.

// `Command::pre_exec` (to set PR_SET_PDEATHSIG in the child), `kill(2)` and `atexit(3)` are
// unsafe FFI calls with no safe wrapper in std; each use carries a SAFETY comment.
#![allow(unsafe_code)]

mod binaries;
mod certs;
mod control_plane;
mod crash;
mod error;
mod namespace;
mod process;
mod teardown;
mod workspace_bin;

use std::io::Write as _;
use std::path::Path;
use std::sync::OnceLock;

pub use binaries::Binaries;
pub use control_plane::{ControlPlane, ControlPlaneConfig, FIELD_MANAGER};
pub use crash::Component;
pub use error::Error;
pub use namespace::TestNamespace;
pub use process::tail as log_tail;
pub use workspace_bin::workspace_binary;

static SHARED: OnceLock<Result<ControlPlane, String>> = OnceLock::new();

/// The control plane shared by all tests of this binary, started on first use with every
/// banlieue CRD ([`banlieue_sdk::crds::all`]) installed and established, and the
/// admission policies an install ships ([`ControlPlaneConfig::banlieue_api`]).
///
/// Blocks while starting (seconds); safe to call from sync code and from any Tokio runtime.
/// A failed start is remembered: every later caller panics with the same message instead of
/// trying again.
///
/// # Panics
/// If the control plane cannot start, e.g. because the binaries are missing (run
/// `make testbin`); the message includes the tail of the failing process's log.
pub fn shared() -> &'static ControlPlane {
    let started = SHARED.get_or_init(|| {
        let config = ControlPlaneConfig::from_env().banlieue_api();
        ControlPlane::start(config).map_err(|e| e.to_string())
    });
    match started {
        Ok(control_plane) => control_plane,
        Err(message) => panic!("{message}"),
    }
}

/// The [shared] control plane's admin kubeconfig file.
///
/// # Panics
/// See [`shared`].
pub fn kubeconfig_path() -> &'static Path {
    shared().kubeconfig_path()
}

/// The [shared] control plane's apiserver URL, `https://127.0.0.1:<port>`.
///
/// # Panics
/// See [`shared`].
pub fn server_url() -> &'static str {
    shared().server_url()
}

/// A new admin client for the [shared] control plane, bound to the calling runtime.
///
/// # Panics
/// See [`shared`].
pub async fn client() -> kube::Client {
    shared().client().await
}

/// Creates a fresh namespace `<prefix>-<n>-<random>` on the [shared] control plane.
///
/// # Panics
/// See [`shared`]; also if the namespace cannot be created.
pub async fn namespace(prefix: &str) -> TestNamespace {
    shared().namespace(prefix).await
}

/// Whether a missing real part (a rig, a simulator, a host tool) must fail the test
/// instead of skipping it: under CI (`CI=true`) and under every `make` target, which
/// exports `BANLIEUE_REQUIRE_RIGS=1`. A bare `cargo test` on a machine without a rig
/// skips, saying so loudly.
pub fn rigs_required() -> bool {
    let set = |name: &str| std::env::var(name).is_ok_and(|v| matches!(v.as_str(), "1" | "true"));
    std::env::var("CI").is_ok_and(|v| v == "true") || set("BANLIEUE_REQUIRE_RIGS")
}

/// Prints a harness message to stderr, never panicking (it also runs in the `atexit` hook).
pub(crate) fn note(message: &str) {
    let _ = writeln!(std::io::stderr(), "banlieue-testenv: {message}");
}
