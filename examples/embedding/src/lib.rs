//! The embedding operator's own pieces, as a library so its tests reach them: the
//! `lab` backend ([`lab::Lab`]) and the `LabMachine` kind ([`machine::LabMachine`]).
//! `main.rs` is the operator around them.

pub mod lab;
pub mod machine;

/// The backend class this operator serves.
pub const CLASS: &str = "lab";
