//! `banlieue man --out-dir DIR`: the man pages, rendered by clap_mangen from the same
//! definition the parser uses, so they cannot drift from the flags.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::{Args, CommandFactory};

/// Options of `banlieue man`.
#[derive(Args, Debug)]
pub struct ManCommand {
    /// Directory to write the pages into (created if missing).
    #[arg(long, value_name = "DIR")]
    out_dir: PathBuf,
}

impl ManCommand {
    /// Writes `banlieue.1` and `banlieue-<subcommand>[-<subcommand>].1` for every
    /// visible subcommand.
    pub fn run(self) -> anyhow::Result<()> {
        std::fs::create_dir_all(&self.out_dir)
            .with_context(|| format!("creating {}", self.out_dir.display()))?;
        let written = write_pages(super::Cli::command(), &self.out_dir)?;
        eprintln!(
            "wrote {} man pages to {}",
            written.len(),
            self.out_dir.display()
        );
        Ok(())
    }
}

/// Renders one page per command, parents first. Building the command first gives each
/// subcommand its display name (`banlieue-bootstrap-operator`), which names its page.
pub fn write_pages(cmd: clap::Command, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    let mut written = Vec::new();
    let mut pending = vec![cmd];
    while let Some(cmd) = pending.pop() {
        pending.extend(cmd.get_subcommands().filter(|s| !s.is_hide_set()).cloned());
        let path = clap_mangen::Man::new(cmd)
            .generate_to(dir)
            .with_context(|| format!("writing a man page into {}", dir.display()))?;
        written.push(path);
    }
    Ok(written)
}
