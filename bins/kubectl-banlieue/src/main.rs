//! `kubectl-banlieue`: a kubectl plugin over banlieue's SDK. `kubectl banlieue get`
//! lists VirtualMachines readably; `kubectl banlieue describe NAME` explains why one
//! is not Ready and how to reach it. It only reads.

mod access;
mod age;
mod cli;
mod describe;
mod diagnose;
mod fetch;
mod table;

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use k8s_openapi::jiff::Timestamp;

use crate::cli::{Cli, Command};
use crate::diagnose::Facts;
use crate::fetch::Error;

fn main() -> ExitCode {
    let cli = Cli::parse();
    // kube talks TLS through rustls with ring; install it before any TLS config exists.
    if rustls::crypto::ring::default_provider()
        .install_default()
        .is_err()
    {
        eprintln!("error: a rustls crypto provider was already installed");
        return ExitCode::FAILURE;
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(output) => {
            // A closed pipe (`| head`) is not an error worth a message.
            let _ = std::io::stdout().write_all(output.as_bytes());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<String, Error> {
    match cli.command {
        Command::Get(get) => {
            let (client, namespace) = fetch::connect(&get.target.connection()).await?;
            let scope = (!get.all_namespaces).then_some(namespace.as_str());
            let vms = fetch::virtual_machines(&client, scope, get.name.as_deref()).await?;
            if vms.is_empty() {
                eprintln!(
                    "No VirtualMachines found{}.",
                    scope
                        .map(|ns| format!(" in {ns} namespace"))
                        .unwrap_or_default()
                );
                return Ok(String::new());
            }
            let now = Timestamp::now();
            let rows: Vec<table::Row> = vms.iter().map(|vm| table::Row::of(vm, now)).collect();
            Ok(table::render(&rows, get.all_namespaces))
        }
        Command::Describe(describe) => {
            let (client, namespace) = fetch::connect(&describe.target.connection()).await?;
            let vms =
                fetch::virtual_machines(&client, Some(&namespace), Some(&describe.name)).await?;
            let Some(vm) = vms.first() else {
                return Err(Error::NotFound {
                    name: describe.name,
                    namespace,
                });
            };
            let related = fetch::related(&client, vm).await?;
            let facts = Facts {
                vm,
                class: related.class.as_ref(),
                image: related.image.as_ref(),
                provider: related.provider.as_ref(),
                providers: &related.providers,
                machine: related.machine.as_ref(),
            };
            Ok(describe::render(&facts))
        }
    }
}
