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
    /// Prints the script. It is rendered into memory first: clap_complete panics when
    /// writing fails, and `banlieue completion bash | head` closes the pipe early.
    pub fn run(self) -> anyhow::Result<()> {
        let mut cmd = super::Cli::command();
        let mut script = Vec::new();
        clap_complete::generate(self.shell, &mut cmd, "banlieue", &mut script);
        super::output::print_stdout(&script)
    }
}
