//! What `banlieue run` is made of, one job per module.

pub mod backends;
pub mod client;
pub mod diagnostics;
pub mod health;
mod http;
pub mod leader;
pub mod logging;
pub mod manager;
pub mod rate_limit;
pub mod request_metrics;
pub mod shutdown;
