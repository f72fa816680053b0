//! The `kvprobe` command line. One module per subcommand; shared plumbing (exit codes, default
//! model, atomic writes) lives in [`common`]. A new subcommand is a new module plus one variant of
//! [`Command`] and one arm in [`run`].

mod choice_values;
pub mod common;
pub mod device_args;
pub mod inspect;
pub mod interrupt;
pub mod probe_cmd;
pub mod ref_cmd;
pub mod replay;
pub mod report;
mod runtime_devices;
pub mod second_process;
pub mod shell;
mod unused_flags;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "kvprobe",
    version,
    about = "Finds out why an LLM compiled for an NPU generates garbage through its KV-cache"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// The float32 reference model: greedy generation, logits.
    #[command(name = "ref")]
    Ref(ref_cmd::RefArgs),
    /// Read a HEF offline: groups, caches, resources, contract lint (exit 1 on errors).
    Inspect(inspect::InspectArgs),
    /// Re-render report.html from a run folder, or compare two runs (--compare BEFORE AFTER --out DIR).
    Report(report::ReportArgs),
    /// Shell completions on stdout: bash, zsh, fish, elvish or powershell.
    Completions(shell::CompletionsArgs),
    /// The man page (roff) on stdout.
    Man,
    #[command(flatten)]
    Probe(Box<probe_cmd::ProbeCommand>),
    /// `determinism`'s second process (hidden: the CLI starts it itself).
    #[command(name = "determinism-record", hide = true)]
    DeterminismRecord(Box<second_process::RecordArgs>),
}

/// Parse the process arguments, run, and map the outcome to an exit code (design.md: 2 input or
/// usage, 3 device, 1 reserved for "fault diagnosed").
pub fn main() -> ExitCode {
    interrupt::install();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help / --version: not errors.
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // One line, like every other error: clap's message without its usage block.
            let rendered = e.render().to_string();
            let msg: Vec<&str> = rendered
                .lines()
                .take_while(|l| !l.starts_with("Usage:"))
                .collect();
            let msg = msg.join(" ");
            let msg = msg.split_whitespace().collect::<Vec<_>>().join(" ");
            eprintln!("{msg} (see kvprobe --help)");
            return ExitCode::from(common::EXIT_USAGE);
        }
    };
    if let Command::Inspect(args) = cli.command {
        return inspect::main(args);
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => common::report_error(&e),
    }
}

pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Ref(args) => ref_cmd::run(args),
        Command::Inspect(args) => inspect::run(args),
        Command::Report(args) => report::run(args),
        Command::Completions(args) => shell::completions(&args),
        Command::Man => shell::man(),
        Command::Probe(cmd) => probe_cmd::run(*cmd),
        Command::DeterminismRecord(args) => second_process::run(*args),
    }
}
