//! `kvprobe inspect model.hef`: offline HEF reader and contract lint (no HailoRT needed).
//! Exit codes (issue 6): 0 clean (warnings allowed), 1 any error-level lint, 2 unreadable input.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;
use kvprobe_npu::hef::{self, describe, pairing, Hef, Lint};
use kvprobe_reference::Model;
use kvprobe_schema::ModelIdentity;

use super::common;

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The compiled model (.hef).
    pub hef: PathBuf,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
    /// Check that the HEF belongs to this model (Hugging Face folder or .gguf).
    #[arg(long, value_name = "DIR|FILE.gguf")]
    pub model: Option<PathBuf>,
    /// Write the embedded resources (hailo-config.json, tokenizer.json, ...) into this folder
    /// (new or empty; see --force).
    #[arg(long, value_name = "DIR")]
    pub extract: Option<PathBuf>,
    /// With --extract: write into a non-empty folder, replacing files of the resources' names
    /// (never through a link) and keeping every other file.
    #[arg(long, requires = "extract")]
    pub force: bool,
    /// Write a sim manifest mirroring this HEF's geometry, quant infos and declared layouts.
    #[arg(long, value_name = "FILE")]
    pub emit_sim: Option<PathBuf>,
}

/// What an inspection found.
pub struct Outcome {
    pub hef: Hef,
    pub lints: Vec<Lint>,
    pub pairing: Vec<Lint>,
    pub extracted: Vec<PathBuf>,
}

impl Outcome {
    pub fn errors(&self) -> usize {
        self.inspection().errors()
    }
    fn inspection(&self) -> hef::summary::Inspection<'_> {
        hef::summary::Inspection {
            hef: &self.hef,
            lints: &self.lints,
            pairing: &self.pairing,
            extracted: &self.extracted,
        }
    }
}

/// Reads, lints, optionally pairs/extracts/emits. Errors are unreadable input (exit 2).
pub fn inspect(args: &InspectArgs) -> anyhow::Result<Outcome> {
    if let Some(path) = &args.emit_sim {
        common::check_out_file(path, "--emit-sim")?;
    }
    let hef = Hef::open(&args.hef).map_err(|e| match e {
        hef::HefError::Read { .. } => anyhow::Error::from(e),
        other => anyhow::Error::from(other).context(args.hef.display().to_string()),
    })?;
    let lints = hef::lint(&hef);
    let model = match &args.model {
        Some(p) => Some(Model::load(p).with_context(|| format!("--model {}", p.display()))?),
        None => None,
    };
    let pairing = model
        .as_ref()
        .map(|m| pairing::pair(&hef, m))
        .unwrap_or_default();
    let extracted = match &args.extract {
        Some(dir) => {
            // an interrupt waits for the extraction (and its temporary files) to finish
            let _writing = kvprobe_reports::interrupt::Writing::begin()?;
            hef.extract(dir, args.force)?
        }
        None => Vec::new(),
    };
    if let Some(path) = &args.emit_sim {
        // a manifest cannot hold a NaN or infinite scale (JSON writes it as null) and the
        // emulator would dequantise with it: nothing is written (issue 38)
        if let Some(l) = lints.iter().find(|l| l.id == "quant-scale") {
            anyhow::bail!(
                "--emit-sim {}: no manifest from this HEF: {}; {}",
                path.display(),
                l.message,
                l.fix
            );
        }
        let identity = match &model {
            Some(m) => kvprobe_npu::sim::manifest::model_identity(m)?,
            None => ModelIdentity {
                path: String::new(),
                sha256: String::new(),
                architecture: String::new(),
            },
        };
        let manifest = describe::to_sim_manifest(&hef, identity)?;
        common::write_atomic(path, "--emit-sim", |f| {
            serde_json::to_writer_pretty(&mut *f, &manifest)?;
            f.write_all(b"\n")?;
            Ok(())
        })?;
    }
    Ok(Outcome {
        hef,
        lints,
        pairing,
        extracted,
    })
}

pub fn main(args: InspectArgs) -> ExitCode {
    match inspect(&args) {
        Ok(outcome) => {
            let printed = if args.json {
                print_json(&outcome)
            } else {
                print_text(&outcome)
            };
            if let Err(e) = printed {
                return common::report_error(&e);
            }
            if outcome.errors() > 0 {
                ExitCode::from(common::EXIT_FAULT_FOUND)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => common::report_error(&e),
    }
}

/// For `cli::run`: same work, exit status folded into the result.
pub fn run(args: InspectArgs) -> anyhow::Result<()> {
    let outcome = inspect(&args)?;
    if args.json {
        print_json(&outcome)?
    } else {
        print_text(&outcome)?
    }
    match outcome.errors() {
        0 => Ok(()),
        n => Err(common::usage(format!(
            "{}: {n} error-level lint(s)",
            args.hef.display()
        ))),
    }
}

fn print_json(o: &Outcome) -> anyhow::Result<()> {
    let description = describe::to_device_description(&o.hef).ok();
    let doc = serde_json::json!({
        "hef": o.hef,
        "lints": o.lints,
        "pairing": o.pairing,
        "errors": o.errors(),
        "device": description,
        "extracted": o.extracted,
    });
    let text = serde_json::to_string_pretty(&doc)?;
    common::print_stdout(format!("{text}\n").as_bytes())
}

fn print_text(o: &Outcome) -> anyhow::Result<()> {
    let text = hef::summary::text(&o.inspection());
    common::print_stdout(text.as_bytes())
}
