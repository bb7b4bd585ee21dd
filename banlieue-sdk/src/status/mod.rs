//! Status computation: pure functions from what a controller observed to the status
//! it should write. Each starts from the previous status, so unchanged inputs give
//! an identical status (and the controller skips the write).

pub mod cluster;
pub mod machine;
pub mod provider;
pub mod virtual_machine;
