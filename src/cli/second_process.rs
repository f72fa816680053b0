//! The `determinism` probe's second OS process: the CLI re-runs itself with the hidden
//! subcommand `determinism-record` on the same device flags, which records the request
//! (`kvprobe_probes::determinism::record`) into a temp file the first process reads. The probes
//! crate sees only the [`SecondProcess`] trait.

use std::path::PathBuf;
use std::process::Command;

use clap::Args;
use kvprobe_probes::determinism::record;
use kvprobe_probes::{NoProgress, SecondProcess, Session};

use super::common::usage;
use super::device_args::{probe_error, DeviceArgs, PromptTokenizer};

/// The hidden subcommand's name.
pub const RECORD: &str = "determinism-record";

/// `kvprobe determinism-record` (hidden): the device flags of the run that started it.
#[derive(Debug, Clone, Args)]
pub struct RecordArgs {
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Where to write the recording.
    #[arg(long)]
    pub record_out: PathBuf,
    /// Steps of the request (the prefill, then tbt steps).
    #[arg(long)]
    pub record_steps: usize,
    /// Tokens fed to the tbt steps, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub record_tokens: Vec<u32>,
}

pub fn run(args: RecordArgs) -> anyhow::Result<()> {
    let d = &args.device;
    let (_, model) = d.load_model()?;
    let early = if d.hef.is_none() {
        Some(d.prompt_ids(&model, PromptTokenizer::Model)?)
    } else {
        None
    };
    let mut backend = d.open_device(&model)?;
    let (_, ids) = match early {
        Some(p) => p,
        None => d.prompt_ids(&model, backend.prompt_tokenizer(&model))?,
    };
    let progress = NoProgress;
    let mut s = Session::new(&model, backend.device(), ids, &progress).map_err(probe_error)?;
    let rec = record(&mut s, args.record_steps, &args.record_tokens).map_err(probe_error)?;
    std::fs::write(&args.record_out, rec.encode()).map_err(|e| {
        usage(format!(
            "{}: cannot write the recording ({e})",
            args.record_out.display()
        ))
    })?;
    Ok(())
}

/// Starts `kvprobe determinism-record` with this process's flags.
pub struct Rerun;

impl SecondProcess for Rerun {
    fn record(&self, steps: usize, tokens: &[u32]) -> kvprobe_probes::Result<Vec<u8>> {
        use kvprobe_probes::Error;
        // as the OS gave them: std::env::args panics on a non-UTF-8 byte (a path)
        let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
        let at = argv
            .iter()
            .position(|a| a == "determinism")
            .ok_or_else(|| {
                Error::Input("the second process needs the `determinism` command line".into())
            })?;
        let exe = std::env::current_exe().map_err(|e| {
            Error::Device(format!("cannot find the kvprobe binary to re-run ({e})"))
        })?;
        let dir = tempfile::tempdir()
            .map_err(|e| Error::Device(format!("no temp dir for the second process ({e})")))?;
        let file = dir.path().join("recording.bin");
        let tokens: Vec<String> = tokens.iter().map(u32::to_string).collect();
        let mut cmd = Command::new(exe);
        cmd.arg(RECORD)
            .args(&argv[at + 1..])
            .arg("--record-out")
            .arg(&file)
            .arg("--record-steps")
            .arg(steps.to_string());
        if !tokens.is_empty() {
            cmd.arg("--record-tokens").arg(tokens.join(","));
        }
        let out = cmd
            .output()
            .map_err(|e| Error::Device(format!("cannot start the second process ({e})")))?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            return Err(Error::Device(format!(
                "the second process failed ({}): {}",
                out.status,
                err.lines().last().unwrap_or("no message")
            )));
        }
        std::fs::read(&file)
            .map_err(|e| Error::Device(format!("the second process wrote no recording ({e})")))
    }
}
