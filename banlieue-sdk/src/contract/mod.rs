//! The Cluster API contract layer: read any infrastructure machine, cluster or
//! machine template uniformly, and the kind table every machine kind is declared in.

mod cluster;
mod kind;
mod machine;

pub use cluster::{InfraClusterRead, InfraTemplateRead};
pub use kind::{KindEntry, KindTable, MachineKind};
pub use machine::{InfraMachine, InfraMachineKind, InfraMachineRead};
