//! The operator process around `banlieue-sdk`'s controllers, as a library: what
//! `banlieue run` is made of, for any operator that embeds banlieue.
//!
//! - [`run`] with a [`RunConfig`] and a [`BackendRegistry`](banlieue_sdk::backend::BackendRegistry):
//!   the controllers, leader election ([`leader`]), probes ([`health`]), metrics and
//!   diagnostics ([`diagnostics`]), and graceful shutdown ([`shutdown`]).
//! - [`client`]: the kube client with client-side rate limiting ([`rate_limit`]) and
//!   per-request metrics ([`request_metrics`]).
//! - [`logging`]: text or JSON logs.
#![warn(missing_docs)]

pub mod client;
pub mod diagnostics;
mod error;
pub mod health;
mod http;
pub mod leader;
pub mod logging;
pub mod manager;
pub mod rate_limit;
pub mod request_metrics;
pub mod shutdown;

pub use error::{Error, Result};
pub use manager::{RunConfig, run};
