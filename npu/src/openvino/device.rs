//! [`OvDevice`]: an OpenVINO stateful LLM IR behind the [`Device`] contract, as the generic
//! stateful driver sees it (mod.rs). Each run maps the driver's rows to openvino.genai's inputs
//! (host.rs) and appends them to the request's states. A run that starts before the request's
//! end (the driver stepped back, or tries several tokens from one state) replays the request up
//! to there on a fresh infer request: the 2026.4 C API can neither trim nor copy a state.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kvprobe_reference::Model;
use kvprobe_schema::{DeviceDescription, DeviceLimit, GroupKind, LimitKind, PastLimit};

#[cfg(feature = "openvino")]
use super::describe::{description, Geometry};
use super::describe::{MASK, POSITIONS, ROWS};
use super::faults::OvFault;
#[cfg(feature = "openvino")]
use super::host;
use super::host::NpuwContract;
use super::{OvOptions, OvTarget, CAPABILITIES};
use crate::token_rows::{attention_mask_from_rows, rows_from_additive, TokenLookup};
use crate::{Buffer, Capabilities, Device, Error, Result, RunOutput};

pub struct OvDevice {
    desc: DeviceDescription,
    lookup: TokenLookup,
    #[cfg(feature = "openvino")]
    rt: super::runtime::Runtime,
    #[cfg_attr(not(feature = "openvino"), allow(dead_code))]
    target: OvTarget,
    /// Every configuration key the plugin was given, in order (provenance).
    config: Vec<(String, String)>,
    npuw: Option<NpuwContract>,
    /// The request's tokens: the prompt (its first `prompt_len`) then one per step.
    history: Vec<u32>,
    prompt_len: usize,
    /// Runs replayed because a run started inside the request (provenance, timing).
    replays: usize,
    /// Continuations NPUW took in pieces (NPUW_LLM_MAX_GENERATION_TOKEN_LEN).
    split_runs: usize,
    /// `--fault`: the host side's bugs (faults.rs).
    #[cfg_attr(not(feature = "openvino"), allow(dead_code))]
    faults: Vec<OvFault>,
    /// Tokens the runtime's state holds: the request's `history` when healthy, more after a
    /// skipped reset (`ov-stale-state`), fewer after a silent slide (`ov-capacity-silent`).
    #[cfg_attr(not(feature = "openvino"), allow(dead_code))]
    held: usize,
    /// `held` when the chat turn being appended started (faults::RunAt).
    #[cfg_attr(not(feature = "openvino"), allow(dead_code))]
    turn_start: Option<usize>,
    /// The context the pipeline holds (NPUW's capacity, `--max-ctx` on CPU); the description's
    /// `cache_len` unless the host believes more (`ov-capacity-silent`).
    capacity: usize,
}

/// The IR file in `dir` (optimum-intel and scripts/export-openvino.sh write openvino_model.xml).
#[cfg_attr(not(feature = "openvino"), allow(dead_code))]
pub fn ir_path(dir: &Path) -> Result<PathBuf> {
    let xml = dir.join("openvino_model.xml");
    for p in [&xml, &xml.with_extension("bin")] {
        if !p.is_file() {
            return Err(Error::Io {
                path: p.clone(),
                detail: "missing; --openvino takes a folder with openvino_model.xml and openvino_model.bin (scripts/export-openvino.sh writes one)".into(),
            });
        }
    }
    Ok(xml)
}

impl OvDevice {
    /// Opens `opts.dir` for the reference `model` (whose embedding rows the driver will send).
    #[cfg(feature = "openvino")]
    pub fn open(model: &Model, opts: &OvOptions) -> Result<OvDevice> {
        let xml = ir_path(&opts.dir)?;
        let (config, npuw, ctx, prefill) = match opts.target {
            OvTarget::Npu => {
                // --max-ctx N splits as NPUW's own defaults do: N − 64 prompt, 64 response
                let (p, r) = match opts.max_ctx {
                    Some(n) if n > host::NPUW_ALIGN => (n - host::NPUW_ALIGN, host::NPUW_ALIGN),
                    Some(n) => {
                        return Err(Error::BadOption {
                            flag: format!("--max-ctx {n}"),
                            detail: format!("NPUW needs more than {} positions (a prompt and a response reserve of 64 each)", host::NPUW_ALIGN),
                        })
                    }
                    None => (host::NPUW_ALIGN, host::NPUW_ALIGN),
                };
                let config = host::npuw_config(p, r, &opts.config);
                let c = NpuwContract::from_config(&config).map_err(|detail| Error::BadOption {
                    flag: "--ov-config".into(),
                    detail,
                })?;
                if c.capacity < 2 {
                    return Err(Error::BadOption {
                        flag: "--ov-config".into(),
                        detail: format!("NPUW would hold {} tokens (NPUW_LLM_MAX_PROMPT_LEN + NPUW_LLM_MIN_RESPONSE_LEN − NPUW_LLM_MAX_GENERATION_TOKEN_LEN); give it at least 2", c.capacity),
                    });
                }
                (config, Some(c), c.capacity, c.capacity - 1)
            }
            _ => {
                let ctx = opts.max_ctx.unwrap_or(128);
                if ctx < 2 {
                    return Err(Error::BadOption {
                        flag: format!("--max-ctx {ctx}"),
                        detail: "must be at least 2".into(),
                    });
                }
                (opts.config.clone(), None, ctx, ctx - 1)
            }
        };
        let lookup = TokenLookup::new(model.embedding_source())?;
        // compressed weights are read before the compile, so a subgraph the reference does
        // not compute is refused first (one line naming the node)
        let declared = kvprobe_reference::openvino_weights::declared(&xml)?;
        if declared.is_some() {
            model.openvino_weights(&xml)?;
        }
        let rt = super::runtime::Runtime::open(&xml, opts.target, &config)?;
        let m = model.config();
        let (rows, hidden) = model.embedding_dims();
        let shape = kvprobe_schema::ModelShape {
            vocab_size: rows,
            hidden_size: hidden,
            n_layers: m.n_layers,
            n_heads: m.n_heads,
            n_kv_heads: m.n_kv_heads,
            head_dim: m.head_dim,
            rope_theta: None,
        };
        let name = opts
            .dir
            .file_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into());
        // ov-capacity-silent: the host believes twice the capacity (the model's positions, not
        // the pipeline's), so the driver goes past it; the documented limit stays (limits())
        let silent = opts.faults.contains(&OvFault::CapacitySilent);
        let geom = Geometry {
            ctx: if silent { 2 * ctx } else { ctx },
            prefill,
            kv_fp16: npuw.is_some(),
            format: match npuw {
                Some(_) => "NPUW static KV-cache model's K/V (fp16), hidden by the pipeline".into(),
                None => {
                    "the CPU plugin's K/V variables (f32), not readable through the C API".into()
                }
            },
        };
        let mut desc = description(name, shape, &geom);
        if let Some(summary) = declared {
            desc.weights = kvprobe_schema::DeclaredWeights::OpenvinoIr { xml, summary };
        }
        Ok(OvDevice {
            desc,
            lookup,
            rt,
            target: opts.target,
            config,
            npuw,
            history: Vec::new(),
            prompt_len: 0,
            replays: 0,
            split_runs: 0,
            faults: opts.faults.clone(),
            held: 0,
            turn_start: None,
            capacity: ctx,
        })
    }

    /// A build without the feature says so before anything else (no flag fixes that; exit 3).
    #[cfg(not(feature = "openvino"))]
    pub fn open(_model: &Model, _opts: &OvOptions) -> Result<OvDevice> {
        Err(Error::Device(
            "--openvino: built without OpenVINO support: rebuild with --features openvino".into(),
        ))
    }

    /// Every configuration key the plugin was given.
    pub fn config(&self) -> &[(String, String)] {
        &self.config
    }

    /// NPUW's derived limits (NPU only).
    pub fn npuw(&self) -> Option<NpuwContract> {
        self.npuw
    }

    pub fn replays(&self) -> usize {
        self.replays
    }

    /// Continuations fed to NPUW in pieces of NPUW_LLM_MAX_GENERATION_TOKEN_LEN tokens.
    pub fn split_runs(&self) -> usize {
        self.split_runs
    }

    fn take<'a>(inputs: &'a [(String, Buffer)], name: &str) -> Result<&'a Buffer> {
        inputs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, b)| b)
            .ok_or_else(|| Error::InvalidArgument(format!("missing input `{name}`")))
    }

    /// (ids, `[1, first + q]` attention_mask, first position) of one run.
    fn genai_inputs(&self, inputs: &[(String, Buffer)]) -> Result<(Vec<u32>, Vec<i64>, usize)> {
        let (Buffer::F32(rows), Buffer::F32(pos), Buffer::U16(mask)) = (
            Self::take(inputs, ROWS)?,
            Self::take(inputs, POSITIONS)?,
            Self::take(inputs, MASK)?,
        ) else {
            return Err(Error::InvalidArgument(
                "input buffers of the wrong types".into(),
            ));
        };
        let ids = self.lookup.ids(rows)?;
        let first = pos.first().copied().unwrap_or(-1.0);
        let consecutive =
            pos.len() == ids.len() && pos.iter().enumerate().all(|(i, &p)| p == first + i as f32);
        if !consecutive || first < 0.0 || first as usize > self.history.len() {
            return Err(Error::InvalidArgument(format!(
                "position ids {pos:?} are not consecutive from inside the request of {} tokens; openvino.genai sets them itself",
                self.history.len()
            )));
        }
        let first = first as usize;
        // openvino.genai feeds all ones; a probe's mask with holes (self-only steps) is passed
        // to the graph's attention_mask as is
        let m = attention_mask_from_rows(&rows_from_additive(mask, ids.len())?, first)?;
        Ok((ids, m, first))
    }

    /// Runs `ids` appended to the request; the prompt when the request is empty.
    #[cfg(feature = "openvino")]
    fn append(&mut self, ids: &[u32], mask: Option<Vec<i64>>) -> Result<Vec<f32>> {
        let total = self.history.len() + ids.len();
        if let Some(c) = self.npuw {
            if self.history.is_empty() && c.refuses_prompt(ids.len()) {
                // openvino.genai's NPU pipeline refuses a prompt past NPUW_LLM_MAX_PROMPT_LEN
                return Err(Error::ContextTooLong {
                    tokens: ids.len(),
                    max_ctx: c.max_prompt + 1,
                });
            }
        }
        let mask = mask.unwrap_or_else(|| host::attention_mask(total));
        if total > self.capacity {
            if self.faults.contains(&OvFault::CapacitySilent) {
                return self.slide(ids);
            }
            return Err(Error::ContextFull {
                max_ctx: self.capacity,
            });
        }
        // a run of several tokens appended to a kept state is a chat turn (faults::RunAt)
        let opens_turn = !self.history.is_empty() && ids.len() > 1 && self.turn_start.is_none();
        if opens_turn {
            self.turn_start = Some(self.held);
        }
        let out = self.append_run(ids, mask);
        if opens_turn {
            self.turn_start = None;
        }
        out
    }

    #[cfg(feature = "openvino")]
    fn append_run(&mut self, ids: &[u32], mask: Vec<i64>) -> Result<Vec<f32>> {
        if let Some(c) = self
            .npuw
            .filter(|c| !self.history.is_empty() && ids.len() > c.max_generation)
        {
            // NPUW's KV-cache model takes at most NPUW_LLM_MAX_GENERATION_TOKEN_LEN tokens a
            // run after the prompt: a longer continuation is fed in pieces of that many
            let before = self.history.len();
            let mut logits = Vec::new();
            for r in c.continuation_pieces(ids.len()) {
                let upto = before + r.end;
                logits = self.append(&ids[r], Some(mask[..upto].to_vec()))?;
            }
            self.split_runs += 1;
            return Ok(logits);
        }
        let at = super::faults::RunAt {
            held: self.held,
            after_prompt: !self.history.is_empty(),
            turn_start: self.turn_start,
        };
        let (pos, mask) = super::faults::feed(&self.faults, at, ids.len(), mask);
        let all = match self.rt.run(ids, mask, pos) {
            // NPUW's own refusal of a step past its KV-cache: a typed refusal at the context it
            // held, which the capacity probe compares with the documented capacity
            Err(Error::Device(e)) if self.npuw.is_some() && e.contains("KV-Cache is full") => {
                if self.faults.contains(&OvFault::CapacitySilent) {
                    return self.slide(ids);
                }
                return Err(Error::ContextFull {
                    max_ctx: self.history.len(),
                });
            }
            r => r?,
        };
        let v = self.desc.shape.vocab_size;
        if all.len() < v || all.len() % v != 0 {
            return Err(Error::Device(format!(
                "logits of {} values are not rows of the reference's {v} tokens; pass the --model this IR was exported from",
                all.len()
            )));
        }
        let logits = all[all.len() - v..].to_vec();
        if self.history.is_empty() {
            self.prompt_len = ids.len();
        }
        self.history.extend_from_slice(ids);
        self.held += ids.len();
        Ok(logits)
    }

    /// `ov-capacity-silent`: a run past the capacity answered on a fresh request fed the
    /// newest half of the context (at most NPUW's prompt limit) as its prompt, positions from 0.
    #[cfg(feature = "openvino")]
    fn slide(&mut self, ids: &[u32]) -> Result<Vec<f32>> {
        let all: Vec<u32> = self.history.iter().chain(ids).copied().collect();
        let keep = (self.capacity / 2)
            .min(self.npuw.map_or(usize::MAX, |c| c.max_prompt))
            .max(ids.len());
        self.rt.reset()?;
        let tail = &all[all.len() - keep..];
        let logits = self.rt.run(
            tail,
            host::attention_mask(keep),
            host::position_ids(keep, keep),
        )?;
        let v = self.desc.shape.vocab_size;
        self.history.extend_from_slice(ids);
        self.held = keep;
        Ok(logits[logits.len().saturating_sub(v)..].to_vec())
    }

    /// A new request on the runtime: a fresh infer request, unless the host forgets to reset
    /// (`ov-stale-state`: the state keeps what it held).
    #[cfg(feature = "openvino")]
    fn reset_runtime(&mut self) -> Result<()> {
        self.turn_start = None;
        if self.faults.contains(&OvFault::StaleState) {
            return Ok(());
        }
        self.held = 0;
        self.rt.reset()
    }

    /// The request cut to its first `n` tokens, rebuilt on a fresh infer request.
    #[cfg(feature = "openvino")]
    fn replay_to(&mut self, n: usize) -> Result<()> {
        let old = std::mem::take(&mut self.history);
        let prompt = self.prompt_len.min(n);
        self.reset_runtime()?;
        self.prompt_len = 0;
        self.replays += 1;
        if prompt > 0 {
            // the replayed runs see the whole request, as they did unless a probe masked them
            self.append(&old[..prompt], None)?;
            for &t in &old[prompt..n] {
                self.append(&[t], None)?;
            }
        }
        Ok(())
    }
}

impl Device for OvDevice {
    fn describe(&self) -> &DeviceDescription {
        &self.desc
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    /// The runtime that ran the IR, the device, and every key it was configured with.
    /// A CPU-plugin run below the reference's precision (its bf16 / u8 defaults), or NPUW's CPU
    /// partitions at the CPU plugin's bf16 / int8-activation defaults, says so in every output.
    fn warnings(&self) -> Vec<String> {
        self.unmodelled_precision()
            .map(|n| format!("OpenVINO precision: {n}"))
            .into_iter()
            .collect()
    }

    fn unmodelled_precision(&self) -> Option<String> {
        #[cfg(feature = "openvino")]
        {
            super::runtime::unmodelled(&self.rt.effective)
        }
        #[cfg(not(feature = "openvino"))]
        None
    }

    fn versions(&self) -> Vec<(String, String)> {
        #[cfg(feature = "openvino")]
        {
            let lib = super::runtime::library_path();
            let mut out = vec![
                ("openvino".into(), super::runtime::loaded_version()),
                (
                    "openvino library".into(),
                    std::fs::canonicalize(&lib)
                        .unwrap_or(lib)
                        .display()
                        .to_string(),
                ),
                (
                    "openvino device name".into(),
                    super::runtime::device_name(self.target),
                ),
                (
                    "openvino device".into(),
                    match self.target {
                        OvTarget::Npu => "NPU plugin, NPUW LLM pipeline with its partitions on NPUW_DEVICES (no NPU hardware unless NPUW_DEVICES names NPU)".to_string(),
                        t => format!("{} plugin", t.name()),
                    },
                ),
            ];
            out.extend(
                self.config
                    .iter()
                    .map(|(k, v)| (format!("openvino config {k}"), v.clone())),
            );
            out.extend(
                self.rt
                    .effective
                    .iter()
                    .map(|(k, v)| (format!("openvino compiled {k}"), v.clone())),
            );
            if let Some(note) = super::runtime::unmodelled(&self.rt.effective) {
                out.push(("openvino precision not modelled".into(), note));
            }
            if let Some(c) = self.npuw {
                out.push((
                    "openvino npuw continuation".into(),
                    format!("a run after the prompt is fed in pieces of at most {} tokens (NPUW_LLM_MAX_GENERATION_TOKEN_LEN)", c.max_generation),
                ));
            }
            out.push((
                "host side".into(),
                format!(
                    "kvprobe-npu {} (openvino.genai's stateful pipeline rules, docs/openvino.md)",
                    env!("CARGO_PKG_VERSION")
                ),
            ));
            out
        }
        #[cfg(not(feature = "openvino"))]
        Vec::new()
    }

    fn limits(&self) -> Vec<DeviceLimit> {
        let mut out = crate::contract::limits::declared(&self.desc, CAPABILITIES.stateful);
        for l in &mut out {
            // the pipeline's own capacity, whatever a faulty host believes
            if l.kind == LimitKind::MaxContext {
                l.value = l.value.min(self.capacity);
            }
        }
        if let Some(c) = self.npuw {
            out.push(crate::contract::limits::limit(
                LimitKind::PromptLen,
                c.max_prompt + 1,
                Some(PastLimit::Refused),
                None,
                "NPUW's static prefill model takes at most NPUW_LLM_MAX_PROMPT_LEN (rounded up to 64) tokens; its KV-cache model is reshaped to that plus NPUW_LLM_MIN_RESPONSE_LEN (rounded up to 64), of which a request holds all but the run's own NPUW_LLM_MAX_GENERATION_TOKEN_LEN rows (npuw/llm_compiled_model.cpp, llm_infer_request.cpp; docs/openvino.md)",
            ));
        }
        out
    }

    fn run(&mut self, _group: GroupKind, inputs: &[(String, Buffer)]) -> Result<RunOutput> {
        let (ids, mask, first) = self.genai_inputs(inputs)?;
        #[cfg(feature = "openvino")]
        {
            if first < self.history.len() {
                self.replay_to(first)?;
            }
            let logits = self.append(&ids, Some(mask))?;
            Ok(RunOutput {
                logits,
                taps: BTreeMap::new(),
            })
        }
        #[cfg(not(feature = "openvino"))]
        {
            let _ = (ids, mask, first);
            Err(Error::Device(
                "--openvino: built without OpenVINO support".into(),
            ))
        }
    }

    fn init_cache(&mut self, read_offset: u32) -> Result<()> {
        if read_offset != 0 {
            return Err(Error::InvalidArgument(format!(
                "init_cache({read_offset}): an OpenVINO request starts at 0 (there is no ring offset)"
            )));
        }
        #[cfg(feature = "openvino")]
        self.reset_runtime()?;
        self.history.clear();
        self.prompt_len = 0;
        Ok(())
    }

    fn update_cache_offset(&mut self, delta: i32) -> Result<()> {
        Err(Error::InvalidArgument(format!(
            "update_cache_offset({delta}): an OpenVINO request has no ring offset"
        )))
    }

    fn cache_buffers(&mut self) -> Result<BTreeMap<u32, Vec<u8>>> {
        Err(Error::Device(no_states()))
    }

    fn write_cache_buffer(&mut self, _cache_id: u32, _bytes: &[u8]) -> Result<()> {
        Err(Error::Device(no_states()))
    }
}

/// Why the states cannot be read or written.
pub fn no_states() -> String {
    "OpenVINO 2026.4's C API has no variable-state calls (query_state/get_state/set_state are C++ only), so kvprobe cannot read or write the K/V states".into()
}
