//! A fake Cloud Hypervisor VMM for banlieue's tests (see the README): the REST API's
//! state machine on a unix socket, with every request and response checked against
//! the official OpenAPI document.
#![warn(missing_docs)]

pub mod openapi;
pub mod server;
pub mod vmm;

pub use openapi::Spec;
pub use server::{Options, main_with_args};
