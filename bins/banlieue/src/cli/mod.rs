//! Command-line surface. Each subcommand lives in its own module.

mod bootstrap;
mod completion;
mod crds;
mod run;
mod values;

use clap::{Parser, Subcommand};

/// banlieue: one VirtualMachine API for vSphere, Proxmox VE, libvirt and Cloud
/// Hypervisor, and a Cluster API infrastructure provider.
#[derive(Parser, Debug)]
#[command(name = "banlieue", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the operator: every controller, with the backends compiled in.
    Run(Box<run::RunCommand>),
    /// Print every CustomResourceDefinition (or write one file per CRD).
    Crds(crds::CrdsCommand),
    /// Install banlieue (or print clusterctl's components), render release assets.
    Bootstrap(bootstrap::BootstrapCommand),
    /// Print a shell completion script.
    Completion(completion::CompletionCommand),
}
