//! `kvprobe ref ...`: the float32 reference model on its own (issue 2 "CLI").

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use clap::{Args, Subcommand};
use kvprobe_reference::{ForwardOptions, Model};

use super::common::{print_stdout, resolve_model, usage, write_atomic};

#[derive(Debug, Args)]
pub struct RefArgs {
    #[command(subcommand)]
    pub command: RefCommand,
}

#[derive(Debug, Subcommand)]
pub enum RefCommand {
    /// Greedy continuation of a prompt (with a KV state, like a real decoder).
    Generate(GenerateArgs),
    /// Write float32 logits [T, vocab] of a prompt or of token ids as .npy.
    Logits(LogitsArgs),
    /// Prefill and decode throughput (used by scripts/bench.sh).
    #[command(hide = true)]
    Bench(BenchArgs),
}

#[derive(Debug, Args)]
pub struct ModelArg {
    /// Hugging Face model folder or .gguf file [default: the SmolLM2 fetched by scripts/fetch-model.sh]
    #[arg(long, value_name = "PATH")]
    pub model: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct BosArgs {
    /// Prepend the BOS token (overrides the model's default).
    #[arg(long, overrides_with = "no_bos")]
    pub bos: bool,
    /// Do not prepend the BOS token (overrides the model's default).
    #[arg(long, overrides_with = "bos")]
    pub no_bos: bool,
}

impl BosArgs {
    /// None = the model's default.
    pub fn choice(&self) -> Option<bool> {
        match (self.bos, self.no_bos) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        }
    }
}

#[derive(Debug, Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArg,
    /// Prompt text (special tokens such as <|im_start|> are recognised).
    #[arg(long)]
    pub prompt: String,
    /// Tokens to generate (stops early at the end-of-sequence token or the context limit).
    #[arg(long, default_value_t = 20)]
    pub max_new: usize,
    /// Print one JSON object {prompt_ids, generated_ids, text} instead of the text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub bos: BosArgs,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["prompt", "ids"])))]
pub struct LogitsArgs {
    #[command(flatten)]
    pub model: ModelArg,
    /// Prompt text.
    #[arg(long)]
    pub prompt: Option<String>,
    /// Comma-separated token ids, e.g. 1,2,3.
    #[arg(long)]
    pub ids: Option<String>,
    /// The last query attends only to position K (0-based) and to itself; other rows causal.
    #[arg(long, value_name = "K")]
    pub single_key: Option<usize>,
    /// Output .npy file (float32 [T, vocab]).
    #[arg(long, value_name = "FILE.npy")]
    pub out: PathBuf,
    #[command(flatten)]
    pub bos: BosArgs,
    #[command(flatten)]
    pub genai: GenaiFeedArgs,
    #[command(flatten)]
    pub self_only: SelfOnlyArgs,
}

/// The last id as a self-only step under a mask hypothesis (`diagnose`'s rule `self-only-mask`):
/// the ids before it run causally as a prompt, then the last one allows only itself and every
/// earlier entry enters with its score plus B instead of −inf, with E never-written slots as
/// zero keys. The .npy then holds that one row. The reproducer of a `self-only-mask` verdict.
#[derive(Debug, Args)]
pub struct SelfOnlyArgs {
    /// What a blocked column's score gets instead of −inf (0: the mask not applied; 1: 0 / +1).
    #[arg(long, value_name = "B", allow_hyphen_values = true, conflicts_with_all = ["single_key", "genai_window"])]
    pub self_only_bias: Option<f32>,
    /// Never-written slots the mask also spans (zero keys and values).
    #[arg(long, value_name = "E", requires = "self_only_bias")]
    pub empty_slots: Option<usize>,
}

impl SelfOnlyArgs {
    /// The self-only row of the last id under the hypothesis, when asked for.
    fn row(&self, model: &Model, ids: &[u32]) -> anyhow::Result<Option<Vec<f32>>> {
        let Some(bias) = self.self_only_bias else {
            return Ok(None);
        };
        let Some((&query, prompt)) = ids.split_last().filter(|(_, p)| !p.is_empty()) else {
            return Err(usage(
                "--self-only-bias: pass the prompt's ids and the step's token last (2 ids or more)",
            ));
        };
        let n = prompt.len();
        let state = model.prefix_state(prompt, &(0..n).collect::<Vec<_>>())?;
        let graph = kvprobe_reference::GraphOptions {
            blocked: Some(kvprobe_reference::Blocked {
                bias,
                empty: self.empty_slots.unwrap_or(0),
            }),
            ..Default::default()
        };
        let keys = kvprobe_reference::KeySet::None;
        Ok(Some(model.step_in(&state, query, n, &keys, graph)?))
    }
}

/// Feed the ids as ONNX Runtime GenAI's windowed host does (docs/onnx-genai.md W1–W4): the
/// position ids and mask its windows and token runs give, instead of `0..T` and causal. The
/// reproducer of a `host-feed` verdict.
#[derive(Debug, Args)]
pub struct GenaiFeedArgs {
    /// Window W (`decoder.sliding_window.window_size`).
    #[arg(long, value_name = "W", requires_all = ["genai_context", "pad_token", "prompt_len"], conflicts_with = "single_key")]
    pub genai_window: Option<usize>,
    /// Context C (`model.context_length`, the slots every run attends over).
    #[arg(long, value_name = "C", requires = "genai_window")]
    pub genai_context: Option<usize>,
    /// The config's `pad_token_id`.
    #[arg(long, value_name = "ID", requires = "genai_window")]
    pub pad_token: Option<u32>,
    /// How many of the ids are the prompt (run in windows); the rest are fed one run each.
    #[arg(long, value_name = "N", requires = "genai_window")]
    pub prompt_len: Option<usize>,
    /// Run the host's runs one by one (W rows with their pads, the host's positions, mask and
    /// past slots) and store each prompt window's presents rolled by R (row j's entry in slot
    /// j − R mod W; 0: as written). The reproducer of a `host-writer` verdict; the .npy then
    /// holds one row per greedy step: the prompt's last row, then each later id's.
    #[arg(long, value_name = "R", requires = "genai_window")]
    pub present_roll: Option<usize>,
}

impl GenaiFeedArgs {
    /// The declared window and the prompt's length, checked against `ids`, when asked for.
    fn geom(
        &self,
        ids: &[u32],
    ) -> anyhow::Result<Option<(kvprobe_npu::onnx::window::WindowGeom, usize)>> {
        let (Some(w), Some(c), Some(pad), Some(n)) = (
            self.genai_window,
            self.genai_context,
            self.pad_token,
            self.prompt_len,
        ) else {
            return Ok(None);
        };
        if w < 2 || c < 2 * w || n == 0 || n > ids.len() {
            return Err(usage(format!(
                "--genai-window {w} --genai-context {c} --prompt-len {n}: need W ≥ 2, C ≥ 2W and 1 ≤ N ≤ the {} ids",
                ids.len()
            )));
        }
        let geom = kvprobe_npu::onnx::window::WindowGeom {
            window: w,
            context: c,
            max_length: c,
            pad_value: 0,
            pad_token: pad,
            heads: 1,
            head_dim: 1,
        };
        Ok(Some((geom, n)))
    }

    /// The greedy steps of the host's runs replayed at the slot level with each prompt
    /// window's presents rolled by `--present-roll` (`kvprobe_probes::host_slots`), when asked.
    fn rolled(&self, model: &Model, ids: &[u32]) -> anyhow::Result<Option<Vec<Vec<f32>>>> {
        let Some(r) = self.present_roll else {
            return Ok(None);
        };
        let Some((geom, n)) = self.geom(ids)? else {
            return Ok(None);
        };
        if r >= geom.window {
            return Err(usage(format!(
                "--present-roll {r}: a roll inside a window of {} rows is 0..{}",
                geom.window,
                geom.window - 1
            )));
        }
        let sf = kvprobe_npu::onnx::window_feed::slot_feed(geom, ids, n)
            .map_err(|e| usage(format!("--genai-window: {e}")))?;
        let p = kvprobe_probes::matched::Precision::exact(model);
        Ok(Some(kvprobe_probes::host_slots::replay(model, &p, &sf, r)?))
    }

    /// The feed's `(mask, positions)` for `ids`, when asked for.
    fn feed(&self, ids: &[u32]) -> anyhow::Result<Option<(Vec<bool>, Vec<usize>)>> {
        let Some((geom, n)) = self.geom(ids)? else {
            return Ok(None);
        };
        let feed = kvprobe_npu::onnx::window_feed::logical_feed(geom, ids, n)
            .map_err(|e| usage(format!("--genai-window: {e}")))?
            .ok_or_else(|| usage("--genai-window: GenAI's mask shows a pad slot on these ids; no feed in real tokens"))?;
        let positions = feed.positions.iter().map(|&p| p.max(0) as usize).collect();
        Ok(Some((feed.visible, positions)))
    }
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArg,
    /// Prompt length of the prefill measurement.
    #[arg(long, default_value_t = 128)]
    pub prefill: usize,
    /// Number of single-token decode steps measured after the prefill.
    #[arg(long, default_value_t = 32)]
    pub decode: usize,
}

pub fn run(args: RefArgs) -> anyhow::Result<()> {
    match args.command {
        RefCommand::Generate(a) => generate(a),
        RefCommand::Logits(a) => logits(a),
        RefCommand::Bench(a) => bench(a),
    }
}

fn load(model: &ModelArg) -> anyhow::Result<Model> {
    let path = resolve_model(model.model.as_deref())?;
    // The library error already names the file and the fix.
    Ok(Model::load(&path)?)
}

fn encode(model: &Model, prompt: &str, bos: Option<bool>) -> anyhow::Result<Vec<u32>> {
    let ids = model.encode(prompt, bos)?;
    if ids.is_empty() {
        return Err(usage(
            "--prompt encodes to no tokens; pass a non-empty --prompt (or --bos)",
        ));
    }
    check_context(model, ids.len())?;
    Ok(ids)
}

fn check_context(model: &Model, len: usize) -> anyhow::Result<()> {
    let max = model.config().max_position;
    if len > max {
        return Err(usage(format!(
            "{}: the input has {len} tokens but the model context is {max}; shorten the prompt to at most {max} tokens",
            model.source().display()
        )));
    }
    Ok(())
}

fn parse_ids(s: &str) -> anyhow::Result<Vec<u32>> {
    let ids = s
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| {
            t.parse::<u32>()
                .map_err(|_| usage(format!("--ids: `{t}` is not a token id; pass comma-separated non-negative integers like 1,2,3")))
        })
        .collect::<anyhow::Result<Vec<u32>>>()?;
    if ids.is_empty() {
        return Err(usage(
            "--ids is empty; pass comma-separated token ids like 1,2,3",
        ));
    }
    Ok(ids)
}

fn check_vocab(model: &Model, ids: &[u32]) -> anyhow::Result<()> {
    let vocab = model.config().vocab_size;
    if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
        return Err(usage(format!(
            "--ids: token id {id} is outside the vocabulary of {} (size {vocab}); pass ids below {vocab}",
            model.source().display()
        )));
    }
    Ok(())
}

fn generate(a: GenerateArgs) -> anyhow::Result<()> {
    let model = load(&a.model)?;
    let prompt_ids = encode(&model, &a.prompt, a.bos.choice())?;
    let generated = model.greedy(&prompt_ids, a.max_new)?;
    let text = model.tokenizer().decode(&generated)?;
    if a.json {
        let v = serde_json::json!({
            "prompt_ids": prompt_ids,
            "generated_ids": generated,
            "text": text,
        });
        print_stdout(format!("{v}\n").as_bytes())
    } else {
        print_stdout(format!("{text}\n").as_bytes())
    }
}

fn logits(a: LogitsArgs) -> anyhow::Result<()> {
    // Validate what needs no model first, so a bad flag fails fast.
    let given_ids = a.ids.as_deref().map(parse_ids).transpose()?;
    super::common::check_out_file(&a.out, "--out")?;
    let model = load(&a.model)?;
    let ids = match (given_ids, &a.prompt) {
        (Some(ids), _) => ids,
        (None, Some(p)) => encode(&model, p, a.bos.choice())?,
        (None, None) => return Err(usage("pass --prompt TEXT or --ids 1,2,3")),
    };
    check_vocab(&model, &ids)?;
    check_context(&model, ids.len())?;
    let t = ids.len();
    let mask = match a.single_key {
        Some(k) if k >= t => {
            return Err(usage(format!(
                "--single-key {k} is not a position of the {t}-token input; pass 0..{}",
                t - 1
            )))
        }
        Some(k) => Some(kvprobe_reference::mask::single_key(t, k)),
        None => None,
    };
    if let Some(row) = a.self_only.row(&model, &ids)? {
        let vocab = model.config().vocab_size;
        let arr = ndarray::Array2::from_shape_vec((1, vocab), row)
            .context("logits have an unexpected size")?;
        return write_npy(&a.out, &arr);
    }
    if let Some(rows) = a.genai.rolled(&model, &ids)? {
        let vocab = model.config().vocab_size;
        let arr = ndarray::Array2::from_shape_vec((rows.len(), vocab), rows.concat())
            .context("logits have an unexpected size")?;
        return write_npy(&a.out, &arr);
    }
    let (mask, positions) = match a.genai.feed(&ids)? {
        Some((m, p)) => (Some(m), Some(p)),
        None => (mask, None),
    };
    let out = model.forward(
        &ids,
        &ForwardOptions {
            mask,
            positions,
            ..Default::default()
        },
    )?;
    let arr = ndarray::Array2::from_shape_vec((out.rows, out.vocab), out.logits)
        .context("logits have an unexpected size")?;
    write_npy(&a.out, &arr)
}

fn write_npy(path: &Path, arr: &ndarray::Array2<f32>) -> anyhow::Result<()> {
    use ndarray_npy::WriteNpyExt;
    write_atomic(path, "--out", |f| {
        let w = std::io::BufWriter::new(f);
        arr.write_npy(w).map_err(|e| {
            usage(format!(
                "{}: could not write .npy ({e}); check free space",
                path.display()
            ))
        })
    })
}

fn bench(a: BenchArgs) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let model = load(&a.model)?;
    let load_s = t0.elapsed().as_secs_f64();
    let c = model.config();
    // Deterministic ordinary ids (avoid the control tokens at the start of most vocabularies).
    let base = c.vocab_size.min(1000) as u32 / 2;
    let span = c.vocab_size as u32 - base;
    let n = a.prefill.min(c.max_position.saturating_sub(a.decode + 1));
    let ids: Vec<u32> = (0..n as u32).map(|i| base + (i * 7919) % span).collect();
    check_vocab(&model, &ids)?;

    let t1 = Instant::now();
    let positions: Vec<usize> = (0..n).collect();
    let mut state = model.prefix_state(&ids, &positions)?;
    let prefill_s = t1.elapsed().as_secs_f64();

    let t2 = Instant::now();
    let mut token = ids[n - 1];
    for i in 0..a.decode {
        let logits = model.decode_step(&mut state, token, n + i)?;
        token = kvprobe_reference::generate::argmax(&logits);
    }
    let decode_s = t2.elapsed().as_secs_f64();
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(out, "model {}", model.source().display());
    // what one decode step reads (issue 21: its floor is these bytes / the copy bandwidth)
    let _ = writeln!(out, "weight_bytes {}", model.decode_step_weight_bytes());
    let _ = writeln!(out, "load_s {load_s:.3}");
    let _ = writeln!(out, "prefill_tokens {n}");
    let _ = writeln!(out, "prefill_s {prefill_s:.3}");
    let _ = writeln!(out, "prefill_tokens_per_s {:.1}", n as f64 / prefill_s);
    let _ = writeln!(out, "decode_steps {}", a.decode);
    let _ = writeln!(out, "decode_s {decode_s:.3}");
    let _ = writeln!(
        out,
        "decode_tokens_per_s {:.1}",
        a.decode as f64 / decode_s.max(1e-9)
    );
    print_stdout(out.as_bytes())
}
