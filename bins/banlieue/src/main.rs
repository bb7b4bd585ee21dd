//! `banlieue`: the operator and its CLI.

mod cli;

use clap::Parser;

fn main() -> anyhow::Result<()> {
    let args = cli::Cli::parse();
    match args.command {
        cli::Command::Crds(cmd) => cmd.run(),
        cli::Command::Completion(cmd) => {
            cmd.run();
            Ok(())
        }
    }
}
