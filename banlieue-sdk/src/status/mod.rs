//! Status computation: pure functions from what a controller observed to the status
//! it should write. Each starts from the previous status, so unchanged inputs give
//! an identical status (and the controller skips the write).

/// The `Ready` reason of a terminal backend failure (CAPI's "terminal failure" rule),
/// shared by the infra machine's status and the VirtualMachine's, which mirrors it.
pub const TERMINAL_FAILURE: &str = "TerminalFailure";

pub mod cluster;
pub mod machine;
pub mod provider;
pub mod virtual_machine;
