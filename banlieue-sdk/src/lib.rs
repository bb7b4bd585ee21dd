//! banlieue's SDK.
#![warn(missing_docs)]

pub mod api;
pub mod crds;
