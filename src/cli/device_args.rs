//! Arguments every probe subcommand shares: the model, the device (emulator or HEF), the prompt,
//! and the output options.

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use kvprobe_npu::sim::options::{SimFlags, SimOptions};
use kvprobe_npu::sim::SimDevice;
use kvprobe_reference::Model;

use super::common::{resolve_model, usage, DeviceError};

/// The prompt used when neither --prompt nor --ids is given.
pub const DEFAULT_PROMPT: &str =
    "Once upon a time there was a little girl who lived in a small house near the woods.";

#[derive(Debug, Clone, Args)]
pub struct DeviceArgs {
    /// Hugging Face model folder or .gguf file [default: the SmolLM2 fetched by scripts/fetch-model.sh]
    #[arg(long, value_name = "PATH")]
    pub model: Option<PathBuf>,

    /// Use the HailoRT KV-cache emulator as the device.
    #[arg(long, conflicts_with = "hef")]
    pub sim: bool,
    /// Compiled model for the Hailo-10H (needs a build with --features hailo).
    #[arg(long, value_name = "FILE")]
    pub hef: Option<PathBuf>,

    /// Emulator: cache length L.
    #[arg(long, value_name = "L", requires = "sim")]
    pub cache_len: Option<usize>,
    /// Emulator: prefill rows P.
    #[arg(long, value_name = "P", requires = "sim")]
    pub prefill_len: Option<usize>,
    /// Emulator fault NAME[=VALUE][@SCOPE] (repeatable; see `kvprobe inspect --faults`).
    #[arg(long = "fault", value_name = "FAULT", requires = "sim")]
    pub faults: Vec<String>,
    /// Emulator: `none` makes every edge float; `edges` (default) quantises like a compiled HEF.
    #[arg(long, value_name = "none|edges", requires = "sim")]
    pub sim_quant: Option<String>,
    /// Emulator: cache edge bits, 8 (default) or 16.
    #[arg(long, value_name = "BITS", requires = "sim")]
    pub sim_cache_bits: Option<u32>,
    /// Emulator: cache entries `un-expanded` (default, KV heads) or `expanded` (all heads).
    #[arg(long, value_name = "MODE", requires = "sim")]
    pub sim_cache: Option<String>,
    /// Emulator: `f32` (default) or `int8` per-channel weights.
    #[arg(long, value_name = "W", requires = "sim")]
    pub sim_weights: Option<String>,
    /// Emulator: expose what the tbt graph read from the cache (debug taps).
    #[arg(long, requires = "sim")]
    pub sim_taps: bool,
    /// Emulator: reproduce a previous run from its manifest.
    #[arg(long, value_name = "FILE", requires = "sim")]
    pub sim_manifest: Option<PathBuf>,

    /// Prompt text (tokenised with the model's tokenizer and its BOS default).
    #[arg(long, conflicts_with = "ids")]
    pub prompt: Option<String>,
    /// Token ids instead of a prompt, comma separated.
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub ids: Option<Vec<u32>>,
    /// Generated tokens for greedy (the one from prefill included).
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub steps: usize,

    /// Write artefacts (results.json, CSV, NPY, SVG, report.html) into DIR.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Allow --out to replace an existing non-empty folder.
    #[arg(long)]
    pub force: bool,
    /// Print one JSON object (the results) on stdout instead of the summary.
    #[arg(long)]
    pub json: bool,
}

/// What a run drives.
pub enum Backend {
    Sim(Box<SimDevice>),
}

impl DeviceArgs {
    pub fn load_model(&self) -> anyhow::Result<(PathBuf, Arc<Model>)> {
        let path = resolve_model(self.model.as_deref())?;
        let model = Model::load(&path).map_err(|e| usage(e.to_string()))?;
        Ok((path, Arc::new(model)))
    }

    pub fn open_device(&self, model: &Arc<Model>) -> anyhow::Result<Backend> {
        if let Some(hef) = &self.hef {
            return Err(DeviceError(format!(
                "{}: built without HailoRT support: rebuild with --features hailo",
                hef.display()
            ))
            .into());
        }
        if !self.sim {
            return Err(usage("no device: pass --sim (the emulator) or --hef FILE"));
        }
        let flags = SimFlags {
            cache_len: self.cache_len,
            prefill_len: self.prefill_len,
            faults: self.faults.clone(),
            sim_quant: self.sim_quant.clone(),
            sim_cache_bits: self.sim_cache_bits,
            sim_cache: self.sim_cache.clone(),
            sim_weights: self.sim_weights.clone(),
            sim_taps: self.sim_taps,
            sim_manifest: self.sim_manifest.clone(),
        };
        let opts = SimOptions::from_flags(&flags).map_err(npu_error)?;
        let dev = SimDevice::new(model.clone(), opts).map_err(npu_error)?;
        Ok(Backend::Sim(Box::new(dev)))
    }

    /// Prompt token ids: --ids, else --prompt (or the default prompt) through the tokenizer.
    pub fn prompt_ids(&self, model: &Model) -> anyhow::Result<(String, Vec<u32>)> {
        if let Some(ids) = &self.ids {
            if ids.is_empty() {
                return Err(usage("--ids is empty; give at least one token id"));
            }
            let text = model.tokenizer().decode(ids).unwrap_or_default();
            return Ok((text, ids.clone()));
        }
        let text = self
            .prompt
            .clone()
            .unwrap_or_else(|| DEFAULT_PROMPT.to_string());
        if text.is_empty() {
            return Err(usage("--prompt is empty; give some text or --ids"));
        }
        let ids = model
            .encode(&text, None)
            .map_err(|e| usage(e.to_string()))?;
        Ok((text, ids))
    }
}

/// An npu error as the CLI reports it (device failures are exit 3, everything else 2).
pub fn npu_error(e: kvprobe_npu::Error) -> anyhow::Error {
    if e.exit_code() == 3 {
        DeviceError(e.to_string()).into()
    } else {
        usage(e.to_string())
    }
}

/// A probes error, same mapping.
pub fn probe_error(e: kvprobe_probes::Error) -> anyhow::Error {
    if e.exit_code() == 3 {
        DeviceError(e.to_string()).into()
    } else {
        usage(e.to_string())
    }
}
