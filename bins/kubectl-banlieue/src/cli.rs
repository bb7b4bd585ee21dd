//! The command line, shaped like kubectl's: `kubectl banlieue get|describe ...`.

use clap::{Args, Parser, Subcommand};

use crate::fetch::Connection;

/// banlieue VirtualMachines, readably: what runs where, and why a VM is not Ready.
#[derive(Debug, Parser)]
#[command(name = "kubectl-banlieue", bin_name = "kubectl banlieue", version)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// A table of VirtualMachines: Provider, backend, failure domain, power, Ready and
    /// why, addresses, age.
    Get(Get),
    /// Why a VirtualMachine is (not) Ready: the chain from the VM to its class, image
    /// and Provider, to the infrastructure machine and the backend, and how to reach it.
    Describe(Describe),
}

/// Connection and namespace flags, as kubectl spells them.
#[derive(Debug, Args)]
pub struct Target {
    /// The namespace (default: the kubeconfig context's).
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    /// The kubeconfig context to use (default: the current one).
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// The kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long, global = true)]
    pub kubeconfig: Option<String>,
}

impl Target {
    /// As a [`Connection`].
    pub fn connection(&self) -> Connection {
        Connection {
            kubeconfig: self.kubeconfig.clone(),
            context: self.context.clone(),
            namespace: self.namespace.clone(),
        }
    }
}

/// `get [NAME]`.
#[derive(Debug, Args)]
pub struct Get {
    /// Only this VirtualMachine.
    pub name: Option<String>,
    /// Every namespace.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub target: Target,
}

/// `describe NAME`.
#[derive(Debug, Args)]
pub struct Describe {
    /// The VirtualMachine.
    pub name: String,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub target: Target,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kubectl_style_flags() {
        let cli = Cli::try_parse_from(["kubectl-banlieue", "get", "-A"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Get(Get {
                all_namespaces: true,
                name: None,
                ..
            })
        ));
        let cli = Cli::try_parse_from([
            "kubectl-banlieue",
            "describe",
            "web-1",
            "-n",
            "lab",
            "--context",
            "kind",
        ])
        .unwrap();
        let Command::Describe(d) = cli.command else {
            panic!("describe")
        };
        assert_eq!(
            (
                d.name.as_str(),
                d.target.namespace.as_deref(),
                d.target.context.as_deref()
            ),
            ("web-1", Some("lab"), Some("kind"))
        );
        assert!(
            Cli::try_parse_from(["kubectl-banlieue", "describe"]).is_err(),
            "NAME is required"
        );
    }
}
