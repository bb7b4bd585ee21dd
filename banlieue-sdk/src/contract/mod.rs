//! The Cluster API contract layer: read any infrastructure machine uniformly.

mod machine;

pub use machine::{InfraMachine, InfraMachineKind, InfraMachineRead};
