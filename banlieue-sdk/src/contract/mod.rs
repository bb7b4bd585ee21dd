//! The Cluster API contract layer: read any infrastructure machine, cluster or
//! machine template uniformly.

mod cluster;
mod machine;

pub use cluster::{InfraClusterRead, InfraTemplateRead};
pub use machine::{InfraMachine, InfraMachineKind, InfraMachineRead};
