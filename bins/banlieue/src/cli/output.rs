//! Writing a subcommand's output to stdout.

use anyhow::Context as _;

/// Prints to stdout; a closed pipe (`| head`) is not an error.
pub fn print_stdout(bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write as _;
    match std::io::stdout().lock().write_all(bytes) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("writing to stdout"),
    }
}
