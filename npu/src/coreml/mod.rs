//! `ane-sim`: a CPU emulator of an LLM converted to Core ML for the Apple Neural Engine, the
//! second device family behind [`Device`] (issue 9, docs/design.md "Stateful devices").
//!
//! What it models (one rule per line, each documented in docs/design.md):
//! - K and V are Core ML states, one pair per layer, `[kv_heads, max_ctx, head_dim]` fp16,
//!   updated inside the graph (slice_update at the rows' absolute positions). The host never
//!   copies them, but may read and write them: [`Device::cache_buffers`] /
//!   [`Device::write_cache_buffer`] (little-endian fp16 bytes in that order, cache ids `2l` (K)
//!   and `2l + 1` (V)).
//! - One graph with a flexible query length `1..=max_query`; described as two groups of the same
//!   graph: `Prefill` (up to `max_query` rows) and `Tbt` (1 row).
//! - Inputs: `inputs_embeds` `[1, q, hidden]` f32 (rounded to fp16), `position_ids` `[1, 1, q]`
//!   absolute positions, `causal_mask` `[1, 1, q, max_ctx]` fp16 additive (0 attends, −inf
//!   blocks). No ring and no wrap: a position at or past `max_ctx` is an error.
//! - `init_cache(0)` starts a new request: `make_state()`, fresh zero states. Any other offset is
//!   refused (there is no read offset). `update_cache_offset` is refused for the same reason: the
//!   stateful driver never calls it.
//! - Everything computes in fp16 (`graph`).

mod describe;
pub mod faults;
mod fp16;
mod graph;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use half::f16;
use kvprobe_reference::{Model, ModelConfig};
use kvprobe_schema::{DeviceDescription, GroupKind, ModelIdentity, SimManifest};

pub use faults::AneFault;

/// The ANE emulator in the device table.
pub const FAMILY: Family = Family {
    name: "ane-sim",
    flag: "--device ane-sim",
    about: "a Core ML / Apple Neural Engine stateful KV cache, fp16",
    capabilities: Capabilities {
        ring_offset: false,
        stateful: true,
        taps: false,
        read_cache: true,
        write_cache: true,
    },
    faults: faults::TABLE,
    implemented: true,
};
use graph::{Graph, LayerState, RunSpec};

use crate::contract::Family;
use crate::{Buffer, Capabilities, Device, Error, Result, RunOutput};

/// Input names of the converted model.
pub const EMBEDDINGS: &str = "inputs_embeds";
pub const POSITION_IDS: &str = "position_ids";
pub const CAUSAL_MASK: &str = "causal_mask";

#[derive(Debug, Clone, PartialEq)]
pub struct AneOptions {
    /// Context length: positions `0..max_ctx`.
    pub max_ctx: usize,
    /// Largest query length of one run (prefill chunk).
    pub max_query: usize,
    /// `--fault` arguments as given.
    pub faults: Vec<String>,
    /// Group name prefix; default: the model file stem.
    pub model_name: Option<String>,
    /// Reproduce a previous run from its manifest.
    pub manifest: Option<std::path::PathBuf>,
    /// With `manifest`: `faults` replace the manifest's (a hypothesis replayed on the device the
    /// manifest describes, as the Hailo emulator's `faults_replace_manifest`); else the
    /// manifest's faults are the run's.
    pub faults_replace_manifest: bool,
}

impl Default for AneOptions {
    fn default() -> Self {
        AneOptions {
            max_ctx: 128,
            max_query: 64,
            faults: Vec::new(),
            model_name: None,
            manifest: None,
            faults_replace_manifest: false,
        }
    }
}

pub struct AneDevice {
    graph: Graph,
    desc: DeviceDescription,
    faults: Vec<AneFault>,
    states: Vec<LayerState>,
    /// Position 0 of the current request in the state (always 0 unless `ane-stale-state`).
    base: usize,
    /// Slots written since the states were made (the state's fill level).
    filled: usize,
    manifest: SimManifest,
    /// `ane-state-race`: the generator, seeded per process, advanced per call.
    race: u64,
}

/// With `opts.manifest`: check it is an ane-sim manifest for these weights and take the
/// context, query length and (unless `opts.faults_replace_manifest`) faults from it; the
/// manifest's path when there is one.
fn apply_manifest(opts: &mut AneOptions, identity: &ModelIdentity) -> Result<Option<PathBuf>> {
    let Some(path) = opts.manifest.clone() else {
        return Ok(None);
    };
    let m = crate::contract::manifest::read(&path)?;
    if m.device != "ane-sim" {
        return Err(Error::Manifest {
            path,
            detail: format!(
                "written by the `{}` emulator, not ane-sim; use it with --sim, or write a new manifest with --device ane-sim",
                m.device
            ),
        });
    }
    crate::contract::manifest::check_model(&m, identity, &path)?;
    opts.max_ctx = m.cache_len;
    opts.max_query = m.prefill_len;
    if !opts.faults_replace_manifest {
        opts.faults = m.faults.clone();
    }
    Ok(Some(path))
}

/// The context and query length refused against each other and the model, named as the
/// flags, or as the manifest's keys when a manifest set them (it named flags the user never
/// passed, issue 38).
fn check_options(opts: &AneOptions, cfg: &ModelConfig, manifest: Option<&Path>) -> Result<()> {
    let (ctx, query) = match manifest {
        Some(_) => ("cache_len", "prefill_len"),
        None => ("--max-ctx", "--max-query"),
    };
    let (l, q) = (opts.max_ctx, opts.max_query);
    let problem = if q == 0 || l < 2 {
        Some((
            format!("{ctx}/{query}"),
            format!("{l} and {q} must be at least 2 and 1"),
        ))
    } else if q >= l {
        Some((
            query.to_string(),
            format!(
                "{q} does not fit below the context ({ctx} {l}); use at most {}",
                l - 1
            ),
        ))
    } else if l > cfg.max_position {
        Some((
            ctx.to_string(),
            format!(
                "{l} is beyond the model's context of {} positions; use at most {}",
                cfg.max_position, cfg.max_position
            ),
        ))
    } else {
        None
    };
    match (problem, manifest) {
        (None, _) => Ok(()),
        (Some((key, detail)), Some(path)) => Err(Error::Manifest {
            path: path.to_path_buf(),
            detail: format!("{key} {detail}; write a new manifest"),
        }),
        (Some((flag, detail)), None) => Err(Error::BadOption { flag, detail }),
    }
}

/// `ane-state-wrap=N` needs N < max_ctx, `ane-query-truncate=N` needs N < max_query: else the
/// device holds what it declares and the fault changes nothing.
fn check_capacity_faults(opts: &AneOptions, faults: &[AneFault]) -> Result<()> {
    for (text, f) in opts.faults.iter().zip(faults) {
        let (n, limit, flag) = match *f {
            AneFault::StateWrap(n) => (n, opts.max_ctx, "--max-ctx"),
            AneFault::QueryTruncate(n) => (n, opts.max_query, "--max-query"),
            _ => continue,
        };
        if n >= limit {
            return Err(Error::NoOpFault {
                fault: text.clone(),
                why: format!("the device declares {flag} {limit}; use N below it"),
            });
        }
    }
    Ok(())
}

/// The first weight with a value fp16 cannot hold (it would become ±inf in the fp16 graph). The
/// linear weights and the table are read a tile at a time from the reference's storage.
fn beyond_fp16(e: &kvprobe_reference::export::LlamaExport) -> Result<Option<String>> {
    const LIMIT: f32 = 65504.0;
    let too_big = |t: &candle_core::Tensor| -> Result<bool> {
        Ok(t.abs()?.max_all()?.to_scalar::<f32>()? > LIMIT)
    };
    if e.embed.max_abs()? > LIMIT {
        return Ok(Some("embed".into()));
    }
    let mut small: Vec<(String, &candle_core::Tensor)> = vec![("final_norm".into(), &e.final_norm)];
    let mut linears = vec![("lm_head".to_string(), &e.lm_head)];
    for (i, l) in e.layers.iter().enumerate() {
        for (n, lin) in [
            ("q", &l.q),
            ("k", &l.k),
            ("v", &l.v),
            ("o", &l.o),
            ("gate", &l.gate),
            ("up", &l.up),
            ("down", &l.down),
        ] {
            linears.push((format!("layer {i} {n}"), lin));
            if let Some(b) = &lin.b {
                small.push((format!("layer {i} {n} bias"), b));
            }
        }
        small.push((format!("layer {i} attn_norm"), &l.attn_norm));
        small.push((format!("layer {i} mlp_norm"), &l.mlp_norm));
    }
    for (name, lin) in linears {
        if lin.max_abs()? > LIMIT {
            return Ok(Some(name));
        }
    }
    for (name, t) in small {
        if too_big(t)? {
            return Ok(Some(name));
        }
    }
    Ok(None)
}

impl AneDevice {
    pub fn new(model: Arc<Model>, opts: AneOptions) -> Result<AneDevice> {
        let mut opts = opts;
        let identity = crate::contract::manifest::model_identity(&model)?;
        let manifest = apply_manifest(&mut opts, &identity)?;
        let cfg = model.config().clone();
        check_options(&opts, &cfg, manifest.as_deref())?;
        let export = model.llama_export()?.ok_or_else(|| Error::BadOption {
            flag: "--device ane-sim".into(),
            detail: format!(
                "{}: ane-sim emulates Llama-family models (RMSNorm, RoPE, SwiGLU); this is {}; use --sim for it",
                model.source().display(),
                cfg.architecture
            ),
        })?;
        if let Some(name) = beyond_fp16(&export)? {
            return Err(Error::BadOption {
                flag: "--device ane-sim".into(),
                detail: format!(
                    "{}: weight `{name}` holds values beyond fp16's range (|w| > 65504), which the ANE's fp16 weights cannot hold (a bf16 or f32 checkpoint); use --sim for it",
                    model.source().display()
                ),
            });
        }
        let mut faults = Vec::new();
        for f in &opts.faults {
            faults.push(faults::parse(f)?);
        }
        let items: Vec<_> = opts
            .faults
            .iter()
            .zip(&faults)
            .map(|(t, f)| (t.as_str(), f, None))
            .collect();
        crate::contract::faults::refuse_conflicts(&items)?;
        check_capacity_faults(&opts, &faults)?;
        let graph = Graph::new(&export, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim)?;
        let (ctx, qmax) = (opts.max_ctx, opts.max_query);
        let name = opts
            .model_name
            .clone()
            .unwrap_or_else(|| crate::contract::manifest::scope_name(model.source()));
        let desc = describe::description(name, &cfg, ctx, qmax);
        let manifest = SimManifest {
            schema_version: kvprobe_schema::SCHEMA_VERSION,
            device: "ane-sim".into(),
            model: identity,
            cache_len: ctx,
            prefill_len: qmax,
            cache_quant: "fp16".into(),
            cache_heads: "un-expanded".into(),
            weights: "fp16".into(),
            taps: false,
            // RoPE is computed in-graph from position ids (HF rotate-half): no table ships
            rope_theta: "plain".into(),
            layouts: Vec::new(),
            calibration_prompts: Vec::new(),
            quant: Vec::new(),
            faults: opts.faults.clone(),
        };
        let states = graph.empty_state(ctx);
        Ok(AneDevice {
            graph,
            desc,
            faults,
            states,
            base: 0,
            filled: 0,
            manifest,
            race: crate::race::process_seed(),
        })
    }

    pub fn manifest(&self) -> &SimManifest {
        &self.manifest
    }
    pub fn write_manifest(&self, path: &Path) -> Result<()> {
        crate::contract::manifest::write(&self.manifest, path)
    }
    pub fn faults(&self) -> &[AneFault] {
        &self.faults
    }
    pub fn max_ctx(&self) -> usize {
        self.desc.cache_len
    }

    fn state_len(&self) -> usize {
        self.graph.n_kv_heads * self.desc.cache_len * self.graph.head_dim
    }

    fn state_of(&self, cache_id: u32) -> Result<&Vec<f16>> {
        let l = cache_id as usize / 2;
        let s = self.states.get(l).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "cache id {cache_id} is not a state of this device (0..{})",
                2 * self.states.len()
            ))
        })?;
        Ok(if cache_id.is_multiple_of(2) {
            &s.k
        } else {
            &s.v
        })
    }
}

fn input<'a>(inputs: &'a [(String, Buffer)], name: &str) -> Result<&'a Buffer> {
    inputs
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, b)| b)
        .ok_or_else(|| Error::InvalidArgument(format!("input `{name}` is missing")))
}

impl Device for AneDevice {
    fn describe(&self) -> &DeviceDescription {
        &self.desc
    }

    fn versions(&self) -> Vec<(String, String)> {
        vec![(
            "emulator".into(),
            format!(
                "kvprobe-npu {} (Core ML stateful fp16 emulator)",
                env!("CARGO_PKG_VERSION")
            ),
        )]
    }

    fn capabilities(&self) -> Capabilities {
        FAMILY.capabilities
    }

    fn run(&mut self, group: GroupKind, inputs: &[(String, Buffer)]) -> Result<RunOutput> {
        let rows_max = self
            .desc
            .group(group)
            .map(|g| g.rows)
            .ok_or_else(|| Error::InvalidArgument("unknown group".into()))?;
        let ctx = self.desc.cache_len;
        let hidden = self.graph.hidden;
        let Buffer::F32(pos) = input(inputs, POSITION_IDS)? else {
            return Err(Error::InvalidArgument(format!(
                "`{POSITION_IDS}` must be float32"
            )));
        };
        let mut q = pos.len();
        if q == 0 || q > rows_max {
            return Err(Error::InvalidArgument(format!(
                "query length {q} is outside the graph's 1..={rows_max}"
            )));
        }
        let Buffer::F32(emb) = input(inputs, EMBEDDINGS)? else {
            return Err(Error::InvalidArgument(format!(
                "`{EMBEDDINGS}` must be float32"
            )));
        };
        let Buffer::U16(mask_bits) = input(inputs, CAUSAL_MASK)? else {
            return Err(Error::InvalidArgument(format!(
                "`{CAUSAL_MASK}` must be fp16 bits"
            )));
        };
        if emb.len() != q * hidden || mask_bits.len() != q * ctx {
            return Err(Error::InvalidArgument(format!(
                "inputs for {q} rows need {} embedding values and {} mask values, got {} and {}",
                q * hidden,
                q * ctx,
                emb.len(),
                mask_bits.len()
            )));
        }
        // ane-query-truncate: a chunk longer than the graph keeps its first rows, silently
        if let Some(n) = self.faults.iter().find_map(|f| match f {
            AneFault::QueryTruncate(n) => Some(*n),
            _ => None,
        }) {
            q = q.min(n);
        }
        let (pos, emb, mask_bits) = (&pos[..q], &emb[..q * hidden], &mask_bits[..q * ctx]);
        // the request's positions, moved by the state's base (0 unless ane-stale-state)
        let mut positions = Vec::with_capacity(q);
        for &p in pos {
            if !(p >= 0.0 && p.fract() == 0.0) {
                return Err(Error::InvalidArgument(format!(
                    "position id {p} is not a whole non-negative number"
                )));
            }
            let p = p as usize + self.base;
            if p >= ctx {
                return Err(Error::ContextFull { max_ctx: ctx });
            }
            positions.push(p);
        }
        let mask01 = self.faults.contains(&AneFault::Mask01);
        let mut mask = vec![f16::NEG_INFINITY; q * ctx];
        for i in 0..q {
            let host = &mask_bits[i * ctx..(i + 1) * ctx];
            let row = &mut mask[i * ctx..(i + 1) * ctx];
            // the base's old context stays visible: the stale request continues after it
            for m in row.iter_mut().take(self.base) {
                *m = f16::ZERO;
            }
            for (j, &b) in host.iter().enumerate().take(ctx - self.base) {
                row[j + self.base] = f16::from_bits(b);
            }
            if mask01 {
                // blocked (negative) becomes +1, allowed stays 0: the 0/1 confusion
                for m in row.iter_mut() {
                    *m = if m.to_f32() < 0.0 {
                        f16::ONE
                    } else {
                        f16::ZERO
                    };
                }
            }
        }
        let mut emb = emb.to_vec();
        if self.faults.contains(&AneFault::MaskFp32Min) && group == GroupKind::Prefill {
            pad_call(&mut emb, &mut positions, &mut mask, rows_max, hidden, ctx);
        }
        let race_seed = (self.faults.contains(&AneFault::StateRace) && q > graph::RACE_FREE_ROWS)
            .then(|| crate::race::splitmix64(&mut self.race));
        let logits = self.graph.run(
            &mut self.states,
            &RunSpec {
                embeddings: &emb,
                positions: &positions,
                mask: &mask,
                max_ctx: ctx,
                faults: &self.faults,
                scale_after_qk: self.faults.iter().find_map(|f| match f {
                    AneFault::ScaleAfterQk(g) => Some(*g),
                    _ => None,
                }),
                norm_fp16: self.faults.iter().find_map(|f| match f {
                    AneFault::NormFp16(g) => Some(*g),
                    _ => None,
                }),
                real_rows: q,
                race_seed,
            },
        )?;
        positions.truncate(q);
        if let Some(&last) = positions.iter().max() {
            self.filled = self.filled.max(last + 1);
        }
        Ok(RunOutput {
            logits,
            taps: BTreeMap::new(),
        })
    }

    fn init_cache(&mut self, read_offset: u32) -> Result<()> {
        if read_offset != 0 {
            return Err(Error::InvalidArgument(format!(
                "init_cache({read_offset}): a stateful device has no read offset; a new request is init_cache(0)"
            )));
        }
        if self.faults.contains(&AneFault::StaleState) {
            // the app keeps the old MLState and its length
            self.base = self.filled;
        } else {
            self.states = self.graph.empty_state(self.desc.cache_len);
            self.base = 0;
            self.filled = 0;
        }
        Ok(())
    }

    fn update_cache_offset(&mut self, delta: i32) -> Result<()> {
        Err(Error::InvalidArgument(format!(
            "update_cache_offset({delta}): a stateful device has no read offset; positions are absolute inputs"
        )))
    }

    fn cache_buffers(&mut self) -> Result<BTreeMap<u32, Vec<u8>>> {
        let mut out = BTreeMap::new();
        for id in 0..2 * self.states.len() as u32 {
            let s = self.state_of(id)?;
            out.insert(id, s.iter().flat_map(|x| x.to_le_bytes()).collect());
        }
        Ok(out)
    }

    fn write_cache_buffer(&mut self, cache_id: u32, bytes: &[u8]) -> Result<()> {
        let want = self.state_len() * 2;
        self.state_of(cache_id)?;
        if bytes.len() != want {
            return Err(Error::InvalidArgument(format!(
                "state {cache_id} takes exactly {want} bytes (kv_heads × max_ctx × head_dim fp16), got {}",
                bytes.len()
            )));
        }
        let vals: Vec<f16> = bytes
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]))
            .collect();
        let l = cache_id as usize / 2;
        if cache_id.is_multiple_of(2) {
            self.states[l].k = vals;
        } else {
            self.states[l].v = vals;
        }
        Ok(())
    }
}

/// `ane-mask-fp32-min`: the call padded to the compiled `rows` with zero-embedding rows at the
/// positions after its last row, whose mask row allows nothing: the fp32 minimum, −inf in fp16.
fn pad_call(
    emb: &mut Vec<f32>,
    positions: &mut Vec<usize>,
    mask: &mut Vec<f16>,
    rows: usize,
    hidden: usize,
    ctx: usize,
) {
    let sentinel = f16::from_f32(f32::MIN);
    let next = positions.iter().max().map_or(0, |&p| p + 1);
    for k in 0..rows.saturating_sub(positions.len()) {
        emb.extend(std::iter::repeat_n(0.0, hidden));
        positions.push(next + k);
        mask.extend(std::iter::repeat_n(sentinel, ctx));
    }
}

pub use crate::mask::additive_fp16 as mask_value;
