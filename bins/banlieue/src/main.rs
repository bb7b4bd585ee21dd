//! `banlieue`: the operator and its CLI.

mod cli;
mod install;
mod runtime;

use clap::Parser;

/// glibc's malloc spent a fifth of the operator's CPU at N = 10,000; with jemalloc the
/// allocator's share fell to 3 %, at no cost in RSS (docs/adr/0022-jemalloc.md).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> anyhow::Result<()> {
    // kube talks TLS through rustls with ring; install it as the process-wide
    // provider before anything builds a TLS config.
    rustls::crypto::ring::default_provider()
        .install_default()
        .map_err(|_| anyhow::anyhow!("a rustls crypto provider was already installed"))?;
    let args = cli::Cli::parse();
    match args.command {
        cli::Command::Run(cmd) => cmd.run(),
        cli::Command::Crds(cmd) => cmd.run(),
        cli::Command::Bootstrap(cmd) => cmd.run(),
        cli::Command::Completion(cmd) => cmd.run(),
        cli::Command::Man(cmd) => cmd.run(),
    }
}
