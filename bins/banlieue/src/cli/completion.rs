//! `banlieue completion <shell>`.

use clap::{Args, CommandFactory};
use clap_complete::Shell;

/// Options of `banlieue completion`.
#[derive(Args, Debug)]
pub struct CompletionCommand {
    /// The shell to generate for.
    shell: Shell,
}

impl CompletionCommand {
    pub fn run(self) {
        let mut cmd = super::Cli::command();
        clap_complete::generate(self.shell, &mut cmd, "banlieue", &mut std::io::stdout());
    }
}
