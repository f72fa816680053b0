//! Arguments every probe subcommand shares: the model, the device (emulator or HEF), the prompt,
//! and the output options.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Args;
use kvprobe_npu::ane::{AneDevice, AneOptions};
use kvprobe_npu::onnx::OnnxDevice;
use kvprobe_npu::openvino::OvDevice;
use kvprobe_npu::sim::options::{SimFlags, SimOptions};
use kvprobe_npu::sim::SimDevice;
use kvprobe_npu::{families, Device};
use kvprobe_reference::{Model, TextTokenizer};
use kvprobe_schema::{DeviceDescription, SimManifest};

use super::choice_values::{
    cache_bits_values, cache_values, ep_values, quant_values, rope_theta_values, weight_values,
};
use super::common::{resolve_model, usage, DeviceError};

/// The prompt used when neither --prompt nor --ids is given.
pub const DEFAULT_PROMPT: &str =
    "Once upon a time there was a little girl who lived in a small house near the woods.";

#[derive(Debug, Clone, Args)]
pub struct DeviceArgs {
    /// Hugging Face model folder or .gguf file [default with --sim: the SmolLM2 fetched by
    /// scripts/fetch-model.sh; required with --hef]
    #[arg(help_heading = "Model and prompt", long, value_name = "PATH")]
    pub model: Option<PathBuf>,

    /// Use the HailoRT KV-cache emulator as the device.
    #[arg(help_heading = "Device", long, conflicts_with = "hef")]
    pub sim: bool,
    /// Another emulated device: `ane-sim` (a Core ML / Apple Neural Engine stateful KV cache, fp16).
    #[arg(help_heading = "Device", long, value_name = "NAME", conflicts_with_all = ["sim", "hef"])]
    pub device: Option<String>,
    /// ane-sim, --onnx: context length (state positions) max_ctx [default: 128; --onnx:
    /// min(128, search.max_length)].
    #[arg(
        help_heading = "ANE emulator (--device ane-sim)",
        long,
        value_name = "N"
    )]
    pub max_ctx: Option<usize>,
    /// ane-sim: largest query length of one run (prefill chunk) [default: min(64, max_ctx − 1)].
    #[arg(
        help_heading = "ANE emulator (--device ane-sim)",
        long,
        value_name = "Q",
        requires = "device"
    )]
    pub max_query: Option<usize>,
    /// Compiled model for the Hailo-10H (needs a build with --features hailo, and --model: the
    /// model it was compiled from). L, P and the tokenizer come from the HEF.
    #[arg(help_heading = "Device", long, value_name = "FILE")]
    pub hef: Option<PathBuf>,
    /// An ONNX Runtime GenAI model folder (model.onnx, genai_config.json, tokenizer.json) run by
    /// ONNX Runtime (a build with --features onnx; scripts/fetch-onnxruntime.sh fetches the
    /// library). --model is the model it was exported from.
    #[arg(help_heading = "Device", long, value_name = "DIR", conflicts_with_all = ["sim", "hef", "device"])]
    pub onnx: Option<PathBuf>,
    /// --onnx: execution provider, cpu (default), qnn, openvino, vitisai or coreml.
    #[arg(help_heading = "ONNX Runtime (--onnx)", value_parser = ep_values(), ignore_case = true, long, requires = "onnx")]
    pub ep: Option<String>,
    /// --onnx: execution provider option KEY=VALUE, repeatable, passed as is (after the folder's
    /// genai_config.json provider_options).
    #[arg(
        help_heading = "ONNX Runtime (--onnx)",
        long = "ep-option",
        value_name = "KEY=VALUE",
        requires = "onnx"
    )]
    pub ep_options: Vec<String>,
    /// A stateful OpenVINO IR folder (openvino_model.xml/.bin: input_ids, attention_mask,
    /// position_ids, beam_idx in, logits out, the K/V in states) run by OpenVINO (a build with
    /// --features openvino; scripts/fetch-openvino.sh fetches the libraries). --model is the
    /// model it was exported from.
    #[arg(help_heading = "Device", long, value_name = "DIR", conflicts_with_all = ["sim", "hef", "device", "onnx"])]
    pub openvino: Option<PathBuf>,
    /// --openvino: the plugin, CPU (default), NPU (the NPU plugin's NPUW LLM pipeline, its
    /// partitions on the CPU unless --ov-config NPUW_DEVICES says otherwise) or GPU.
    #[arg(
        help_heading = "OpenVINO (--openvino)",
        long,
        value_name = "DEVICE",
        requires = "openvino"
    )]
    pub ov_device: Option<String>,
    /// --openvino: a device property KEY=VALUE, repeatable, after the pipeline's own keys.
    #[arg(
        help_heading = "OpenVINO (--openvino)",
        long = "ov-config",
        value_name = "KEY=VALUE",
        requires = "openvino"
    )]
    pub ov_config: Vec<String>,
    /// --ep qnn: nodes QNN cannot compile run on the CPU EP; every output says "partial NPU".
    #[arg(help_heading = "ONNX Runtime (--onnx)", long, requires = "onnx")]
    pub allow_cpu_fallback: bool,

    /// Emulator: cache length L.
    #[arg(
        help_heading = "Hailo emulator (--sim)",
        long,
        value_name = "L",
        requires = "sim"
    )]
    pub cache_len: Option<usize>,
    /// Emulator: prefill rows P.
    #[arg(
        help_heading = "Hailo emulator (--sim)",
        long,
        value_name = "P",
        requires = "sim"
    )]
    pub prefill_len: Option<usize>,
    /// Emulator fault NAME[=VALUE][@SCOPE], repeatable; SCOPE: prefill, tbt, k, v, layer=N (the fault table is in the README).
    #[arg(
        help_heading = "Emulators (--sim, --device ane-sim)",
        long = "fault",
        value_name = "FAULT"
    )]
    pub faults: Vec<String>,
    /// Emulator: `none` makes every edge float; `edges` (default) quantises like a compiled HEF.
    #[arg(help_heading = "Hailo emulator (--sim)", value_parser = quant_values(), long, requires = "sim")]
    pub sim_quant: Option<String>,
    /// Emulator: cache edge bits, 8 (default) or 16.
    #[arg(
        help_heading = "Hailo emulator (--sim)",
        long,
        value_name = "BITS",
        value_parser = cache_bits_values(),
        requires = "sim"
    )]
    pub sim_cache_bits: Option<u32>,
    /// Emulator: cache entries `un-expanded` (default, KV heads) or `expanded` (all heads).
    #[arg(help_heading = "Hailo emulator (--sim)", value_parser = cache_values(), long, requires = "sim")]
    pub sim_cache: Option<String>,
    /// Emulator: `f32` (default) or `int8` per-channel weights.
    #[arg(help_heading = "Hailo emulator (--sim)", value_parser = weight_values(), long, requires = "sim")]
    pub sim_weights: Option<String>,
    /// Emulator: expose what the tbt graph read from the cache (debug taps).
    #[arg(help_heading = "Hailo emulator (--sim)", long, requires = "sim")]
    pub sim_taps: bool,
    /// Emulator: RoPE sign convention of the graph and its theta table, `plain` (default, both
    /// halves positive) or `sign-folded` (first half negated, HailoRT's fallback).
    #[arg(help_heading = "Hailo emulator (--sim)", value_parser = rope_theta_values(), long, requires = "sim")]
    pub sim_rope_theta: Option<String>,
    /// Emulator: reproduce a previous run from its manifest (--sim: with --fault, those faults
    /// instead of the manifest's).
    #[arg(
        help_heading = "Emulators (--sim, --device ane-sim)",
        long,
        value_name = "FILE"
    )]
    pub sim_manifest: Option<PathBuf>,

    /// Prompt text (tokenised with the model's tokenizer and its BOS default).
    #[arg(help_heading = "Model and prompt", long, conflicts_with = "ids")]
    pub prompt: Option<String>,
    /// Token ids instead of a prompt, comma separated.
    #[arg(help_heading = "Model and prompt", long, value_delimiter = ',', num_args = 1..)]
    pub ids: Option<Vec<u32>>,
    /// Generated tokens for greedy (the one from prefill included).
    #[arg(
        help_heading = "Model and prompt",
        long,
        value_name = "N",
        default_value_t = 16
    )]
    pub steps: usize,

    /// Write artefacts (results.json, CSV, NPY, SVG, report.html) into DIR.
    #[arg(help_heading = "Output", long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Allow --out to replace an existing non-empty folder.
    #[arg(help_heading = "Output", long)]
    pub force: bool,
    /// Print one JSON object (the results) on stdout instead of the summary.
    #[arg(help_heading = "Output", long)]
    pub json: bool,

    /// diagnose, test/research switch: hide every named-fault rule; only the stale, causality
    /// and splits probes decide, and the verdict carries their stage (docs/diagnosis.md).
    #[arg(long, hide = true)]
    pub stage_only: bool,

    /// diagnose, test/research switch (leave-one-family-out): the replays' hypothesis set
    /// leaves out this fault (repeatable), as if the emulator's grammar had no such fault.
    #[arg(long = "leave-out", hide = true, value_name = "FAULT")]
    pub leave_out: Vec<String>,

    /// diagnose, test/research switch: run every request on the device, even one whose runs
    /// since its reset repeat an earlier request's (by default a device whose state is host
    /// memory answers those from the earlier runs once the repeat and back-to-back checks found
    /// it bit-identical; docs/qnn.md "Shared runs").
    #[arg(long, hide = true)]
    pub no_shared_runs: bool,

    /// diagnose: also run layout --infer, stale, causality and splits when a rule already
    /// settled the verdict (more evidence and heatmaps for a bug report, about 6 s more on
    /// SmolLM2; the verdict is unchanged).
    #[arg(help_heading = "Output", long)]
    pub all_probes: bool,
}

/// What a run drives.
pub enum Backend {
    Sim(Box<SimDevice>),
    /// `--device ane-sim`: the stateful Core ML / ANE emulator (issue 9).
    Ane(Box<AneDevice>),
    /// `--onnx DIR`: an ONNX Runtime GenAI folder run by ONNX Runtime (issue 22).
    Onnx(Box<OnnxDevice>),
    /// `--openvino DIR`: a stateful OpenVINO IR on a plugin (issue 37).
    OpenVino(Box<OvDevice>),
    /// A Hailo-10H through HailoRT, opened from `--hef` after the pairing check (issue 6).
    #[cfg(feature = "hailo")]
    Hailo(Box<HailoRun>),
}

/// The HailoRT device and what the run needs from its HEF.
#[cfg(feature = "hailo")]
pub struct HailoRun {
    pub device: kvprobe_npu::hailo::HailoDevice,
    pub hef: PathBuf,
    /// The HEF's `tokenizer.json`, the one the genai server encodes prompts with (contract
    /// §2.11); `None` when the HEF embeds none (`inspect` flags that as `resource-missing`).
    pub tokenizer: Option<TextTokenizer>,
}

/// How prompt text becomes token ids.
pub enum PromptTokenizer<'a> {
    /// The model's tokenizer with the model's BOS default (the emulator).
    Model,
    /// As the genai server does (contract §2.11): this tokenizer, never a BOS.
    Server(&'a TextTokenizer),
}

impl Backend {
    pub fn device(&mut self) -> &mut dyn Device {
        match self {
            Backend::Sim(s) => s.as_mut(),
            Backend::Ane(a) => a.as_mut(),
            Backend::Onnx(o) => o.as_mut(),
            Backend::OpenVino(o) => o.as_mut(),
            #[cfg(feature = "hailo")]
            Backend::Hailo(h) => &mut h.device,
        }
    }

    pub fn describe(&self) -> &DeviceDescription {
        match self {
            Backend::Sim(s) => s.describe(),
            Backend::Ane(a) => a.describe(),
            Backend::Onnx(o) => o.describe(),
            Backend::OpenVino(o) => o.describe(),
            #[cfg(feature = "hailo")]
            Backend::Hailo(h) => h.device.describe(),
        }
    }

    /// The emulator's manifest (what reproduces the run); a real device has none.
    pub fn sim_manifest(&self) -> Option<&SimManifest> {
        match self {
            Backend::Sim(s) => Some(s.manifest()),
            Backend::Ane(a) => Some(a.manifest()),
            Backend::Onnx(_) | Backend::OpenVino(_) => None,
            #[cfg(feature = "hailo")]
            Backend::Hailo(_) => None,
        }
    }

    pub fn hef_path(&self) -> Option<&Path> {
        match self {
            Backend::Sim(_) | Backend::Ane(_) | Backend::Onnx(_) | Backend::OpenVino(_) => None,
            #[cfg(feature = "hailo")]
            Backend::Hailo(h) => Some(&h.hef),
        }
    }

    /// With a HEF the prompt is encoded like the server encodes it: the HEF's tokenizer (else
    /// the model's, which the pairing check compares it with) and no BOS.
    pub fn prompt_tokenizer<'a>(&'a self, model: &'a Model) -> PromptTokenizer<'a> {
        match self {
            // --onnx: the folder's tokenizer.json is the model's (scripts/export-onnx.py copies it)
            Backend::Sim(_) | Backend::Ane(_) | Backend::Onnx(_) | Backend::OpenVino(_) => {
                let _ = model;
                PromptTokenizer::Model
            }
            #[cfg(feature = "hailo")]
            Backend::Hailo(h) => {
                PromptTokenizer::Server(h.tokenizer.as_ref().unwrap_or(model.tokenizer()))
            }
        }
    }
}

impl DeviceArgs {
    /// Device flag checks that need neither the model nor a device, in the order a user should
    /// hear them: a build without HailoRT says so first (no flag fixes that; exit 3, issue 6),
    /// then `--hef` without `--model` (exit 2), then no device at all (exit 2).
    pub fn check_device_flags(&self) -> anyhow::Result<()> {
        super::unused_flags::check(&super::unused_flags::Given {
            onnx: self.onnx.is_some(),
            sim: self.sim,
            device: self.device.is_some(),
            ep: self.ep.as_deref(),
            ep_option: self.ep_options.first().map(String::as_str),
            cache_len: self.cache_len,
            prefill_len: self.prefill_len,
            sim_manifest: self.sim_manifest.as_deref(),
        })?;
        if let Some(n) = self.max_ctx {
            if self.device.is_none() && self.onnx.is_none() && self.openvino.is_none() {
                return Err(usage(format!(
                    "--max-ctx {n}: only for --device ane-sim, --onnx DIR or --openvino DIR"
                )));
            }
        }
        if self.openvino.is_some() {
            // the host side's faults (npu/src/openvino/faults.rs); the plugins stay real
            for f in &self.faults {
                kvprobe_npu::openvino::faults::parse(f).map_err(|e| {
                    let e = kvprobe_npu::families::place_fault(&kvprobe_npu::openvino::FAMILY, e);
                    usage(format!(
                        "{e}; --openvino takes only its host side's faults (the plugins themselves are real)"
                    ))
                })?;
            }
            return Ok(());
        }
        if self.onnx.is_some() {
            // the host-driver faults of the windowed cache (npu/src/onnx/faults.rs); the model
            // and ONNX Runtime stay healthy
            for f in &self.faults {
                kvprobe_npu::onnx::faults::parse(f).map_err(|e| {
                    let e = kvprobe_npu::families::place_fault(&kvprobe_npu::onnx::FAMILY, e);
                    usage(format!(
                        "{e}; --onnx takes only the host-driver faults of the windowed cache (the runtime itself is real)"
                    ))
                })?;
            }
            return Ok(());
        }
        if !self.sim && self.device.is_none() {
            if let Some(f) = self.faults.first() {
                return Err(usage(format!(
                    "--fault {f}: faults need an emulator; add --sim or --device ane-sim"
                )));
            }
            if let Some(m) = &self.sim_manifest {
                return Err(usage(format!(
                    "--sim-manifest {}: a manifest needs an emulator; add --sim or --device ane-sim",
                    m.display()
                )));
            }
        }
        if let Some(hef) = &self.hef {
            #[cfg(not(feature = "hailo"))]
            return Err(DeviceError(format!(
                "{}: built without HailoRT support: rebuild with --features hailo",
                hef.display()
            ))
            .into());
            #[cfg(feature = "hailo")]
            if self.model.is_none() {
                return Err(usage(format!(
                    "{}: --hef needs --model PATH, the model the HEF was compiled from (no default model is assumed for a HEF)",
                    hef.display()
                )));
            }
        } else if let Some(d) = &self.device {
            match families::by_device(d) {
                None => {
                    return Err(usage(format!(
                        "--device {d}: unknown device; use {}, --sim (the Hailo emulator), --hef FILE, --onnx DIR or --openvino DIR",
                        families::device_choices()
                    )))
                }
                Some(f) if !f.implemented => {
                    return Err(usage(
                        kvprobe_npu::Error::NotImplemented {
                            family: f.flag,
                            what: f.about.to_string(),
                        }
                        .to_string(),
                    ))
                }
                Some(_) => {}
            }
        } else if !self.sim {
            return Err(usage(
                "no device: pass --sim (the Hailo emulator), --device ane-sim, --hef FILE, --onnx DIR or --openvino DIR",
            ));
        }
        Ok(())
    }

    /// The files and folders the run reads (model, HEF, ONNX folder, manifest): `--force` never
    /// replaces a folder that holds one of them.
    pub fn input_paths(&self) -> Vec<PathBuf> {
        let model = resolve_model(self.model.as_deref()).ok();
        [
            model,
            self.hef.clone(),
            self.onnx.clone(),
            self.sim_manifest.clone(),
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    pub fn load_model(&self) -> anyhow::Result<(PathBuf, Arc<Model>)> {
        let path = resolve_model(self.model.as_deref())?;
        let model = Model::load(&path).map_err(|e| usage(e.to_string()))?;
        Ok((path, Arc::new(model)))
    }

    pub fn open_device(&self, model: &Arc<Model>) -> anyhow::Result<Backend> {
        self.check_device_flags()?;
        #[cfg(feature = "hailo")]
        if let Some(hef) = &self.hef {
            return open_hailo(hef, model);
        }
        if let Some(dir) = &self.onnx {
            return self.open_onnx(dir, model);
        }
        if let Some(dir) = &self.openvino {
            return self.open_openvino(dir, model);
        }
        if self.device.is_some() {
            let max_ctx = self.max_ctx.unwrap_or(128);
            let opts = AneOptions {
                max_ctx,
                max_query: self
                    .max_query
                    .unwrap_or_else(|| 64.min(max_ctx.saturating_sub(1))),
                faults: self.faults.clone(),
                model_name: None,
                manifest: self.sim_manifest.clone(),
                // as on the Hailo emulator: `--fault` beside a manifest is the run's hypothesis
                faults_replace_manifest: !self.faults.is_empty(),
            };
            // the device table let only runnable `--device` families through: ane-sim
            let dev = AneDevice::new(model.clone(), opts)
                .map_err(|e| npu_error(families::place_fault(&kvprobe_npu::ane::FAMILY, e)))?;
            return Ok(Backend::Ane(Box::new(dev)));
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
            sim_rope_theta: self.sim_rope_theta.clone(),
            sim_manifest: self.sim_manifest.clone(),
        };
        let opts = SimOptions::from_flags(&flags).map_err(npu_error)?;
        let dev = SimDevice::new(model.clone(), opts)
            .map_err(|e| npu_error(families::place_fault(&kvprobe_npu::sim::FAMILY, e)))?;
        Ok(Backend::Sim(Box::new(dev)))
    }

    /// Prompt token ids: --ids, else --prompt (or the default prompt) through the tokenizer.
    pub fn prompt_ids(
        &self,
        model: &Model,
        how: PromptTokenizer,
    ) -> anyhow::Result<(String, Vec<u32>)> {
        let tokenizer = match how {
            PromptTokenizer::Model => model.tokenizer(),
            PromptTokenizer::Server(t) => t,
        };
        if let Some(ids) = &self.ids {
            if ids.is_empty() {
                return Err(usage("--ids is empty; give at least one token id"));
            }
            let text = tokenizer.decode(ids).unwrap_or_default();
            return Ok((text, ids.clone()));
        }
        let text = self
            .prompt
            .clone()
            .unwrap_or_else(|| DEFAULT_PROMPT.to_string());
        if text.is_empty() {
            return Err(usage("--prompt is empty; give some text or --ids"));
        }
        let ids = match how {
            PromptTokenizer::Model => model.encode(&text, None),
            PromptTokenizer::Server(t) => t.encode(&text, false),
        }
        .map_err(|e| usage(e.to_string()))?;
        Ok((text, ids))
    }
}

/// `--hef`: the pairing check, then the device (both inside `open_paired`), then the HEF's
/// tokenizer.
#[cfg(feature = "hailo")]
fn open_hailo(hef: &Path, model: &Model) -> anyhow::Result<Backend> {
    let device = kvprobe_npu::hailo::open_paired(hef, model).map_err(hailo_error)?;
    let tokenizer = hef_tokenizer(hef)?;
    Ok(Backend::Hailo(Box::new(HailoRun {
        device,
        hef: hef.to_path_buf(),
        tokenizer,
    })))
}

/// The HEF's embedded `tokenizer.json`, if any.
#[cfg(feature = "hailo")]
fn hef_tokenizer(hef_path: &Path) -> anyhow::Result<Option<TextTokenizer>> {
    use std::io::Write;
    let hef = kvprobe_npu::hef::Hef::open(hef_path).map_err(|e| usage(e.to_string()))?;
    let Some(bytes) = hef.resource("tokenizer.json") else {
        return Ok(None);
    };
    // `TextTokenizer` loads from a path and the HEF holds bytes: go through a temporary file,
    // then name the HEF in any later tokenizer error.
    let cannot = |e: std::io::Error| {
        usage(format!(
            "{}: cannot stage the embedded tokenizer.json in a temporary file ({e}); check TMPDIR",
            hef_path.display()
        ))
    };
    let mut tmp = tempfile::NamedTempFile::new().map_err(cannot)?;
    tmp.write_all(bytes).map_err(cannot)?;
    tmp.flush().map_err(cannot)?;
    let tokenizer = TextTokenizer::from_file(tmp.path())
        .map_err(|e| {
            usage(format!(
                "{}: embedded tokenizer.json: {e}",
                hef_path.display()
            ))
        })?
        .with_source(hef_path);
    Ok(Some(tokenizer))
}

/// A HailoRT backend error: device failures (a HailoRT status, whose message points at
/// `hailortcli logs`, or a build without the shim) are exit 3; HEF and pairing problems exit 2.
#[cfg(feature = "hailo")]
pub fn hailo_error(e: kvprobe_npu::hailo::HailoError) -> anyhow::Error {
    if e.is_device_error() {
        DeviceError(e.to_string()).into()
    } else {
        usage(e.to_string())
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
