//! `kvprobe completions SHELL` and `kvprobe man`: generated from the same clap definition as the
//! parser, so they never list a flag the binary does not take.

use clap::CommandFactory;

#[derive(Debug, clap::Args)]
pub struct CompletionsArgs {
    /// The shell to write completions for (e.g. `kvprobe completions bash > /etc/bash_completion.d/kvprobe`)
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

pub fn completions(args: &CompletionsArgs) -> anyhow::Result<()> {
    let mut cmd = super::Cli::command();
    let mut buf = Vec::new();
    clap_complete::generate(args.shell, &mut cmd, "kvprobe", &mut buf);
    write_stdout(&buf)
}

/// The man page of `kvprobe` (roff on stdout: `kvprobe man > kvprobe.1; man ./kvprobe.1`).
pub fn man() -> anyhow::Result<()> {
    let mut buf = Vec::new();
    clap_mangen::Man::new(super::Cli::command()).render(&mut buf)?;
    write_stdout(&buf)
}

fn write_stdout(bytes: &[u8]) -> anyhow::Result<()> {
    super::common::print_stdout(bytes)
}
