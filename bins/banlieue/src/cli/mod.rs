//! Command-line surface. Each subcommand lives in its own module.

mod bootstrap;
mod completion;
mod crds;
mod man;
mod output;
mod run;
mod values;

use clap::{Parser, Subcommand};

/// `0.1.0 (git abc1234, dirty)`: the crate version and the revision build.rs found.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (git ",
    env!("BANLIEUE_BUILD_GIT_REV"),
    ")"
);

/// banlieue: one VirtualMachine API for vSphere, Proxmox VE, libvirt and Cloud
/// Hypervisor, and a Cluster API infrastructure provider.
#[derive(Parser, Debug)]
#[command(name = "banlieue", version = VERSION, about, long_about = None)]
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
    /// Write the man pages: banlieue.1 and one page per subcommand.
    Man(man::ManCommand),
}
