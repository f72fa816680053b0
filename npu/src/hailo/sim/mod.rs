//! The HailoRT KV-cache emulator: a [`Device`] whose `<model>__prefill` and `<model>__tbt` groups
//! compute with the reference model's graph ([`Model::run_graph`]) on the same weights, and read and
//! write K/V only through byte rings with HailoRT's geometry (contract §1.9): `L × Ep` bytes per
//! cache_id shared by both groups, one device-wide read offset, read window of `in` entries from
//! `R`, write window of `out` entries from `R + in`, zero-initialised.
//!
//! Edges are quantised like a compiled HEF (uint8 cache by default, uint16 embeddings, uint8 mask,
//! uint8 RoPE inputs, uint16 logits), calibrated on [`calibrate::CALIBRATION_PROMPTS`].
//!
//! A query row whose mask allows nothing: the reference graph gives it a zero attention output (no
//! key contributes, no softmax over an empty set), so the row continues with its residual stream
//! only — finite logits, never NaN (design.md "reference crate API").

mod cache_io;
pub mod calibrate;
mod capacity_faults;
mod compile;
mod compile_quant;
mod describe;
pub mod faults;
mod graph_faults;
mod inputs;
mod memo;
pub mod options;
mod rope_faults;
mod tbt_memo;
pub use crate::contract::manifest;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use candle_core::{Device as CDevice, Tensor};
use kvprobe_reference::{GraphInput, LayerKv, Model};
use kvprobe_schema::{
    CacheKind, DeviceDescription, GroupDescription, GroupKind, InputRole, ModelShape, SimManifest,
};

pub use compile_quant::SimQuant;
use compile_quant::LOGIT_BITS;
use inputs::Decoded;

use crate::contract::Family;
use crate::hailo::ring::RingSet;
use crate::layout::StreamShape;
use crate::quant;
use crate::{Buffer, Capabilities, Device, Error, Result, RunOutput};

pub use faults::{Fault, FaultKind, Scope};

/// The Hailo emulator in the device table.
pub const FAMILY: Family = Family {
    name: "hailo-sim",
    flag: "--sim",
    about: "the HailoRT KV-cache emulator (genai ring, quantised edges, fault injection)",
    capabilities: Capabilities {
        taps: true,
        ..Capabilities::GENAI_RING
    },
    faults: faults::TABLE,
    implemented: true,
};
pub use options::{CacheHeads, CacheQuant, RopeTheta, SimFlags, SimOptions, SimWeights};

fn cache_id(layer: usize, kind: CacheKind) -> u32 {
    2 * layer as u32 + if kind == CacheKind::K { 0 } else { 1 }
}

fn other(kind: CacheKind) -> CacheKind {
    match kind {
        CacheKind::K => CacheKind::V,
        CacheKind::V => CacheKind::K,
    }
}

/// Window lengths of a group (contract §1.3: `L = in + out`; genai: out = P for prefill, 1 for tbt).
#[derive(Debug, Clone, Copy)]
struct GroupGeom {
    rows: usize,
    input_len: usize,
}

pub struct SimDevice {
    model: Arc<Model>,
    desc: DeviceDescription,
    opts: SimOptions,
    faults: Vec<Fault>,
    quant: SimQuant,
    rings: RingSet,
    /// `offset=after-run`: deltas waiting for the next run to finish.
    pending: Vec<i32>,
    manifest: SimManifest,
    theta: Option<Vec<f32>>,
    features: usize,
    elem_bytes: usize,
    head_dim: usize,
    /// `ring-write-race`: the generator, seeded per process, advanced per write.
    race: u64,
    /// Prefill runs remembered by their inputs (probes prefill the same prompt again and again).
    memo: memo::GraphMemo,
    /// Tbt runs remembered layer by layer (a one-layer trial or replay resumes the layer it
    /// changes).
    tbt_memo: tbt_memo::TbtMemo,
    // scratch
    stream: Vec<u8>,
    block: Vec<u8>,
    /// One cache window's floats as the graph reads them (`read_past`).
    floats: Vec<f32>,
}

impl SimDevice {
    /// Build the emulator for `model`. With `opts.manifest`, geometry, quant infos and faults come
    /// from that manifest (after checking it was made for these weights).
    pub fn new(model: Arc<Model>, opts: SimOptions) -> Result<SimDevice> {
        let mut opts = opts;
        let cfg = model.config().clone();
        let n_layers = cfg.n_layers;
        let identity = manifest::model_identity(&model)?;
        let from_manifest = compile::apply_manifest(&mut opts, &identity)?;
        match &from_manifest {
            Some((_, path)) => {
                if let Some(detail) = opts.geometry_problem("cache_len", "prefill_len") {
                    return Err(Error::Manifest {
                        path: path.clone(),
                        detail: format!("{detail}; write a new manifest"),
                    });
                }
            }
            None => opts.check_geometry()?,
        }
        let (l, p) = (opts.cache_len, opts.prefill_len);
        if l > cfg.max_position {
            // a window past the model's context holds positions the model has no encoding for,
            // and the probes' reference runs would allocate for all of them (issue 38)
            let detail = format!(
                "{l} entries pass the model's context of {} positions; use at most {}",
                cfg.max_position, cfg.max_position
            );
            return Err(match from_manifest {
                Some((_, path)) => Error::Manifest {
                    path,
                    detail: format!("cache_len {detail}"),
                },
                None => Error::BadOption {
                    flag: "--cache-len".into(),
                    detail,
                },
            });
        }
        let heads = match opts.cache_heads {
            CacheHeads::Unexpanded => cfg.n_kv_heads,
            CacheHeads::Expanded => cfg.n_heads,
        };
        let shape = StreamShape {
            tokens: 0,
            features: heads * cfg.head_dim,
            elem_bytes: opts.cache_quant.elem_bytes(),
            head_dim: cfg.head_dim,
        };
        let faults = compile::checked_faults(&model, &opts, shape)?;
        let graph_model = match opts.weights {
            SimWeights::F32 => model.clone(),
            SimWeights::Int8 => model.int8_weights()?,
        };
        let quant = compile::quant(&model, &graph_model, &opts, &identity, &from_manifest)?;
        let mut rings = RingSet::new(l)?;
        for id in 0..2 * n_layers as u32 {
            rings.add(id, shape.entry_bytes())?;
        }
        let theta = compile::shipped_theta(&model, &opts, &faults);
        let model_name = opts
            .model_name
            .clone()
            .unwrap_or_else(|| manifest::scope_name(model.source()));
        let mut dev = SimDevice {
            model: graph_model,
            desc: DeviceDescription {
                runtime: kvprobe_schema::RuntimeKind::GenaiRing,
                backend: "emulator".into(),
                model_name,
                cache_len: l,
                prefill_len: p,
                shape: ModelShape {
                    vocab_size: cfg.vocab_size,
                    hidden_size: cfg.hidden_size,
                    n_layers,
                    n_heads: cfg.n_heads,
                    n_kv_heads: cfg.n_kv_heads,
                    head_dim: cfg.head_dim,
                    rope_theta: theta.clone(),
                },
                groups: Vec::new(),
                weights: match opts.weights {
                    SimWeights::F32 => kvprobe_schema::DeclaredWeights::Checkpoint,
                    SimWeights::Int8 => kvprobe_schema::DeclaredWeights::Int8PerChannel,
                },
                arithmetic: kvprobe_schema::DeclaredArithmetic::Float32,
            },
            faults,
            quant,
            rings,
            pending: Vec::new(),
            manifest: compile::manifest_of(&opts, identity),
            opts,
            theta,
            features: shape.features,
            elem_bytes: shape.elem_bytes,
            head_dim: shape.head_dim,
            race: crate::race::process_seed(),
            memo: memo::GraphMemo::default(),
            tbt_memo: tbt_memo::TbtMemo::default(),
            stream: Vec::new(),
            block: Vec::new(),
            floats: Vec::new(),
        };
        dev.desc.groups = vec![
            dev.describe_group(GroupKind::Prefill),
            dev.describe_group(GroupKind::Tbt),
        ];
        dev.finish_manifest(from_manifest.as_ref())?;
        Ok(dev)
    }

    /// A genai [`Driver`](crate::Driver) for this device, with the embedding table quantised
    /// through the prefill embeddings input (what `embeddings.bin` would hold).
    pub fn driver(&self) -> Result<crate::Driver> {
        let input = self
            .desc
            .group(GroupKind::Prefill)
            .and_then(|g| {
                g.inputs
                    .iter()
                    .find(|i| i.role == Some(InputRole::Embeddings))
            })
            .ok_or_else(|| Error::Device("prefill group has no embeddings input".into()))?;
        let table = crate::EmbeddingTable::from_model(&self.model, input)?;
        crate::Driver::new(self, table)
    }

    /// The model the graphs compute with (the int8 copy under `--sim-weights int8`).
    pub fn graph_model(&self) -> &Arc<Model> {
        &self.model
    }

    pub fn options(&self) -> &SimOptions {
        &self.opts
    }
    pub fn faults(&self) -> &[Fault] {
        &self.faults
    }
    pub fn quant(&self) -> &SimQuant {
        &self.quant
    }
    pub fn manifest(&self) -> &SimManifest {
        &self.manifest
    }
    pub fn write_manifest(&self, path: &Path) -> Result<()> {
        manifest::write(&self.manifest, path)
    }
    /// The device-wide read offset `R`.
    pub fn read_offset(&self) -> u32 {
        self.rings.read_offset()
    }
    /// Cache ids of layer `l`: (K, V).
    pub fn cache_ids(layer: usize) -> (u32, u32) {
        (cache_id(layer, CacheKind::K), cache_id(layer, CacheKind::V))
    }
    /// Whether a prefill run whose inputs equal a remembered run's reuses its output (on by
    /// default; the outputs are the same bits either way, `sim_memo` tests it).
    pub fn remember_prefill_runs(&mut self, on: bool) {
        self.memo.set_enabled(on);
    }
    /// Prefill runs answered from memory so far.
    pub fn remembered_runs(&self) -> usize {
        self.memo.hits()
    }
    /// Whether a tbt run whose inputs equal a remembered run's, in whole or on its first layers,
    /// takes its output or starts from its streams at the first layer that differs (on by
    /// default; the same bits either way, `sim_memo` tests it).
    pub fn remember_tbt_runs(&mut self, on: bool) {
        self.tbt_memo.set_enabled(on);
    }
    /// Tbt runs answered whole from memory so far, and tbt runs resumed at a layer.
    pub fn remembered_tbt_runs(&self) -> (usize, usize) {
        self.tbt_memo.hits()
    }
    /// Features per cache entry and bytes per element.
    pub fn entry_format(&self) -> (usize, usize) {
        (self.features, self.elem_bytes)
    }
}

/// Rows of one batched tbt graph run (bounds the `[rows, vocab]` logits buffer).
const BATCH_ROWS: usize = 64;

/// What the graph read, per cache_id (`RunOutput::taps`).
type Taps = BTreeMap<u32, Vec<f32>>;

impl SimDevice {
    fn group_of(&self, g: GroupKind) -> Result<(GroupDescription, GroupGeom)> {
        let gd = self
            .desc
            .group(g)
            .cloned()
            .ok_or_else(|| Error::Device(format!("no group {}", g.suffix())))?;
        Ok((gd, self.geom(g)))
    }

    /// Row `r` of `[rows, vocab]` logits through the logits output quant.
    fn output_logits(&self, all: &[f32], r: usize) -> Vec<f32> {
        let vocab = self.desc.shape.vocab_size;
        let mut logits = all[r * vocab..(r + 1) * vocab].to_vec();
        if !self.float() {
            quant::fake_quantize_in_place(&mut logits, &self.quant.logits, LOGIT_BITS);
        }
        logits
    }
}

impl Device for SimDevice {
    fn describe(&self) -> &DeviceDescription {
        &self.desc
    }

    fn versions(&self) -> Vec<(String, String)> {
        vec![(
            "emulator".into(),
            format!(
                "kvprobe-npu {} (HailoRT genai emulator)",
                env!("CARGO_PKG_VERSION")
            ),
        )]
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            taps: self.opts.taps,
            ..FAMILY.capabilities
        }
    }

    fn run(&mut self, g: GroupKind, inputs: &[(String, Buffer)]) -> Result<RunOutput> {
        let (gd, geom) = self.group_of(g)?;
        let mut d = self.decode_inputs(g, &gd, inputs, geom)?;
        let drop = self.dropped_rows(g, geom);
        let before = (drop > 0).then(|| self.rings.buffers());
        if drop > 0 {
            self.block_dropped(&mut d.mask, geom, drop);
        }
        let (past, taps) = self.read_past(g, geom)?;
        let input = GraphInput {
            hidden: Tensor::from_vec(
                d.hidden,
                (geom.rows, self.desc.shape.hidden_size),
                &CDevice::Cpu,
            )?,
            positions: d.positions,
            past,
            mask: d.mask,
            graph: self.graph_options(g),
            last_only: true,
        };
        let out = match g {
            GroupKind::Prefill => self.memo.run(&self.model, &input)?,
            GroupKind::Tbt => self.tbt_memo.run(&self.model, &input)?,
        };
        self.write_new(g, geom, &out.new_kv)?;
        if let Some(before) = &before {
            self.restore_dropped(before, geom, drop)?;
        }
        let last = out.rows.saturating_sub(1);
        let logits = self.output_logits(&out.logits, last);
        for d in std::mem::take(&mut self.pending) {
            self.rings.update_cache_offset(d);
        }
        Ok(RunOutput { logits, taps })
    }

    /// tbt trials at the current read offset as ONE graph run of N rows: every row reads the same
    /// window, sees its own past columns and only its own new key (the other trials' new columns
    /// are blocked), so one pass over the weights serves all trials. Equal to the looped runs: the
    /// write slot `R − 1` is outside the read window, and the slot keeps the last trial's K/V as
    /// the loop would leave it. Prefill groups, single runs and a pending `offset=after-run` delta
    /// (the loop's later runs would read at another offset) take the loop.
    fn run_batch(
        &mut self,
        g: GroupKind,
        batch: &[Vec<(String, Buffer)>],
    ) -> Result<Vec<RunOutput>> {
        if g != GroupKind::Tbt || batch.len() < 2 || !self.pending.is_empty() {
            return batch.iter().map(|inputs| self.run(g, inputs)).collect();
        }
        let (gd, geom) = self.group_of(g)?;
        let decoded = batch
            .iter()
            .map(|inputs| self.decode_inputs(g, &gd, inputs, geom))
            .collect::<Result<Vec<_>>>()?;
        let (past, taps) = self.read_past(g, geom)?;
        let mut outs = Vec::with_capacity(batch.len());
        let chunks: Vec<&[Decoded]> = decoded.chunks(BATCH_ROWS).collect();
        for (ci, chunk) in chunks.iter().enumerate() {
            let out = self
                .model
                .run_graph(&self.batched_input(chunk, &past, geom, g)?)?;
            if ci + 1 == chunks.len() {
                // the loop's last run is the one whose write stays in the slot
                let last = out.rows - 1;
                let kv: Vec<LayerKv> = out
                    .new_kv
                    .iter()
                    .map(|l| -> Result<LayerKv> {
                        Ok(LayerKv {
                            k: l.k.narrow(1, last, 1)?.contiguous()?,
                            v: l.v.narrow(1, last, 1)?.contiguous()?,
                        })
                    })
                    .collect::<Result<_>>()?;
                self.write_new(g, geom, &kv)?;
            }
            for r in 0..out.rows {
                outs.push(RunOutput {
                    logits: self.output_logits(&out.logits, r),
                    taps: taps.clone(),
                });
            }
        }
        Ok(outs)
    }

    fn init_cache(&mut self, read_offset: u32) -> Result<()> {
        self.pending.clear();
        self.rings.init_cache(read_offset)
    }

    fn update_cache_offset(&mut self, delta: i32) -> Result<()> {
        if self
            .faults
            .iter()
            .any(|f| f.kind == FaultKind::OffsetAfterRun)
        {
            self.pending.push(delta);
        } else {
            self.rings.update_cache_offset(delta);
        }
        Ok(())
    }

    fn cache_buffers(&mut self) -> Result<BTreeMap<u32, Vec<u8>>> {
        Ok(self.rings.buffers())
    }

    fn write_cache_buffer(&mut self, cache_id: u32, bytes: &[u8]) -> Result<()> {
        self.rings.write_buffer(cache_id, bytes)
    }
}
