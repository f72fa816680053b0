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

pub mod calibrate;
pub mod faults;
pub mod manifest;
pub mod options;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use candle_core::{Device as CDevice, Tensor};
use kvprobe_reference::{GraphInput, GraphOptions, LayerKv, Model, PositionInput};
use kvprobe_schema::{
    CacheDirection, CacheEdgeDescription, CacheKind, DType, DeviceDescription, EdgeLayout,
    GroupDescription, GroupKind, InputRole, IoDescription, Layout, ModelShape, NamedQuant,
    QuantInfo, SimManifest, SCHEMA_VERSION,
};

use crate::driver::theta_from_inv_freq;
use crate::layout::{self, StreamShape};
use crate::quant::{self, dequantize, quant_for_range, quant_unsigned, widen};
use crate::ring::{padded_entry_size, RingSet};
use crate::{Buffer, Device, Error, Result, RunOutput};

pub use faults::{Fault, FaultKind, Scope};
pub use options::{CacheHeads, CacheQuant, RopeTheta, SimFlags, SimOptions, SimWeights};

/// Every quant info of the emulated compile (one per edge class; both groups were calibrated
/// together, so they share them).
#[derive(Debug, Clone, PartialEq)]
pub struct SimQuant {
    pub embeddings: QuantInfo,
    pub mask: QuantInfo,
    pub pe: QuantInfo,
    pub position_ids: QuantInfo,
    pub logits: QuantInfo,
    /// Indexed by cache_id (K of layer l = 2l, V = 2l + 1).
    pub cache: Vec<QuantInfo>,
}

const EMB_BITS: u32 = 16;
const MASK_BITS: u32 = 8;
const PE_BITS: u32 = 8;
const LOGIT_BITS: u32 = 16;

impl SimQuant {
    fn float(n_layers: usize) -> SimQuant {
        SimQuant {
            embeddings: QuantInfo::IDENTITY,
            mask: QuantInfo::IDENTITY,
            pe: QuantInfo::IDENTITY,
            position_ids: QuantInfo::IDENTITY,
            logits: QuantInfo::IDENTITY,
            cache: vec![QuantInfo::IDENTITY; 2 * n_layers],
        }
    }

    fn calibrated(r: &calibrate::Ranges, cache_bits: u32, margin: f32) -> SimQuant {
        let mut cache = Vec::with_capacity(2 * r.k.len());
        for l in 0..r.k.len() {
            for (lo, hi) in [r.k[l], r.v[l]] {
                let (lo, hi) = widen(lo, hi, margin);
                cache.push(quant_for_range(lo, hi, cache_bits));
            }
        }
        let (llo, lhi) = widen(r.logits.0, r.logits.1, margin);
        SimQuant {
            // the whole table is known at compile time: no margin needed
            embeddings: quant_for_range(r.embeddings.0, r.embeddings.1, EMB_BITS),
            // 1/0 signal: 1.0 → 255 (prior art §1.2)
            mask: quant_unsigned(1.0, MASK_BITS),
            pe: quant_for_range(-1.0, 1.0, PE_BITS),
            // integer positions: scale 1, zp 0 = HailoRT's identity shortcut (exact)
            position_ids: QuantInfo::IDENTITY,
            logits: quant_for_range(llo, lhi, LOGIT_BITS),
            cache,
        }
    }

    fn named(&self) -> Vec<NamedQuant> {
        let mut v = vec![
            NamedQuant {
                name: "embeddings".into(),
                quant: self.embeddings,
            },
            NamedQuant {
                name: "attention_mask".into(),
                quant: self.mask,
            },
            NamedQuant {
                name: "pe".into(),
                quant: self.pe,
            },
            NamedQuant {
                name: "position_ids".into(),
                quant: self.position_ids,
            },
            NamedQuant {
                name: "logits".into(),
                quant: self.logits,
            },
        ];
        for (id, q) in self.cache.iter().enumerate() {
            v.push(NamedQuant {
                name: cache_quant_name(id as u32),
                quant: *q,
            });
        }
        v
    }

    fn from_named(list: &[NamedQuant], n_layers: usize, path: &Path) -> Result<SimQuant> {
        let get = |name: &str| {
            list.iter().find(|n| n.name == name).map(|n| n.quant).ok_or_else(|| Error::Manifest {
                path: path.to_path_buf(),
                detail: format!("has no quant info `{name}`; it does not match this model (write a new one)"),
            })
        };
        let mut cache = Vec::with_capacity(2 * n_layers);
        for id in 0..2 * n_layers as u32 {
            cache.push(get(&cache_quant_name(id))?);
        }
        if list.len() != 5 + 2 * n_layers {
            return Err(Error::Manifest {
                path: path.to_path_buf(),
                detail: format!(
                    "lists {} quant infos, this model needs {}; it was made for another model",
                    list.len(),
                    5 + 2 * n_layers
                ),
            });
        }
        Ok(SimQuant {
            embeddings: get("embeddings")?,
            mask: get("attention_mask")?,
            pe: get("pe")?,
            position_ids: get("position_ids")?,
            logits: get("logits")?,
            cache,
        })
    }
}

fn cache_quant_name(id: u32) -> String {
    format!(
        "cache/{}{}",
        if id.is_multiple_of(2) { "k" } else { "v" },
        id / 2
    )
}

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
    // scratch
    stream: Vec<u8>,
    block: Vec<u8>,
}

impl SimDevice {
    /// Build the emulator for `model`. With `opts.manifest`, geometry, quant infos and faults come
    /// from that manifest (after checking it was made for these weights).
    pub fn new(model: Arc<Model>, opts: SimOptions) -> Result<SimDevice> {
        let mut opts = opts;
        let cfg = model.config().clone();
        let n_layers = cfg.n_layers;
        let mut from_manifest: Option<(SimManifest, std::path::PathBuf)> = None;
        let identity = manifest::model_identity(&model)?;
        if let Some(path) = opts.manifest.clone() {
            let m = manifest::read(&path)?;
            if m.device != "hailo-sim" {
                return Err(Error::Manifest {
                    path: path.clone(),
                    detail: format!("written by the `{}` emulator, not the Hailo emulator (--sim); use it with --device {}", m.device, m.device),
                });
            }
            manifest::check_model(&m, &identity, &path)?;
            let bad = |what: &str| Error::Manifest {
                path: path.clone(),
                detail: format!("unknown {what}; write a new manifest"),
            };
            opts.cache_len = m.cache_len;
            opts.prefill_len = m.prefill_len;
            opts.cache_quant =
                CacheQuant::parse(&m.cache_quant).ok_or_else(|| bad("cache_quant"))?;
            opts.cache_heads =
                CacheHeads::parse(&m.cache_heads).ok_or_else(|| bad("cache_heads"))?;
            opts.weights = SimWeights::parse(&m.weights).ok_or_else(|| bad("weights"))?;
            opts.taps = m.taps;
            opts.rope_theta = RopeTheta::parse(&m.rope_theta).ok_or_else(|| bad("rope_theta"))?;
            opts.faults = m.faults.clone();
            from_manifest = Some((m, path));
        }
        opts.check_geometry()?;
        let (l, p) = (opts.cache_len, opts.prefill_len);

        let heads = match opts.cache_heads {
            CacheHeads::Unexpanded => cfg.n_kv_heads,
            CacheHeads::Expanded => cfg.n_heads,
        };
        let features = heads * cfg.head_dim;
        let elem_bytes = opts.cache_quant.elem_bytes();
        let entry_size = features * elem_bytes;

        // faults
        let mut faults = Vec::with_capacity(opts.faults.len());
        for text in &opts.faults {
            faults.push(faults::parse(text)?);
        }
        let head_dim = cfg.head_dim;
        let shape_for = move |n: usize| StreamShape {
            tokens: n,
            features,
            elem_bytes,
            head_dim,
        };
        let cx = faults::FaultContext {
            n_layers,
            n_heads: cfg.n_heads,
            n_kv_heads: cfg.n_kv_heads,
            entry_size,
            rope_theta: model.rope_inv_freq().map(|_| opts.rope_theta),
            layout_noop: Box::new(move |f: &Fault| match f.kind {
                FaultKind::TbtReadLayout(lay) => layout::equals_token_major(lay, shape_for(l - 1)),
                FaultKind::PrefillWriteLayout(lay) => layout::equals_token_major(lay, shape_for(p)),
                _ => false,
            }),
        };
        for f in &faults {
            faults::validate(f, &cx)?;
            if let FaultKind::TbtReadLayout(lay) | FaultKind::PrefillWriteLayout(lay) = f.kind {
                layout::check_supported(lay, features)?;
            }
        }

        let graph_model = match opts.weights {
            SimWeights::F32 => model.clone(),
            SimWeights::Int8 => Arc::new(model.with_int8_weights()?),
        };

        let quant = match (&from_manifest, opts.cache_quant) {
            (Some((m, path)), _) => SimQuant::from_named(&m.quant, n_layers, path)?,
            (None, CacheQuant::Float) => SimQuant::float(n_layers),
            (None, cq) => {
                // in-memory weights are identified by their configuration only: never cached
                let sha = model.source().exists().then_some(identity.sha256.as_str());
                let ranges = calibrate::measure_cached(&graph_model, 96, sha, opts.weights.name())?;
                let bits = if cq == CacheQuant::U16 { 16 } else { 8 };
                SimQuant::calibrated(&ranges, bits, opts.calibration_margin)
            }
        };

        let mut rings = RingSet::new(l)?;
        for id in 0..2 * n_layers as u32 {
            rings.add(id, entry_size)?;
        }

        // The theta table the compile ships: the graph's convention unless a fault says otherwise.
        let table_convention = faults
            .iter()
            .find_map(|f| match f.kind {
                FaultKind::RopeTheta(t) => Some(t),
                _ => None,
            })
            .unwrap_or(opts.rope_theta);
        let theta = model
            .rope_inv_freq()
            .map(|f| table_convention.table(&theta_from_inv_freq(&f)));
        let model_name = opts
            .model_name
            .clone()
            .unwrap_or_else(|| scope_name(model.source()));
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
            },
            faults,
            quant,
            rings,
            pending: Vec::new(),
            manifest: SimManifest {
                device: "hailo-sim".into(),
                schema_version: SCHEMA_VERSION,
                model: identity,
                cache_len: l,
                prefill_len: p,
                cache_quant: opts.cache_quant.name().into(),
                cache_heads: opts.cache_heads.name().into(),
                weights: opts.weights.name().into(),
                taps: opts.taps,
                rope_theta: opts.rope_theta.name().into(),
                layouts: Vec::new(),
                calibration_prompts: Vec::new(),
                quant: Vec::new(),
                faults: opts.faults.clone(),
            },
            opts,
            theta,
            features,
            elem_bytes,
            head_dim,
            stream: Vec::new(),
            block: Vec::new(),
        };
        dev.desc.groups = vec![
            dev.describe_group(GroupKind::Prefill),
            dev.describe_group(GroupKind::Tbt),
        ];
        dev.manifest.layouts = dev.layouts();
        dev.manifest.quant = dev.quant.named();
        dev.manifest.calibration_prompts = if dev.opts.cache_quant == CacheQuant::Float {
            Vec::new()
        } else {
            calibrate::CALIBRATION_PROMPTS
                .iter()
                .map(|s| s.to_string())
                .collect()
        };
        if let Some((m, path)) = &from_manifest {
            if m.layouts != dev.manifest.layouts {
                return Err(Error::Manifest {
                    path: path.clone(),
                    detail: "its layouts do not follow from its faults; it was edited or written by another version, write a new one".into(),
                });
            }
            dev.manifest.calibration_prompts = m.calibration_prompts.clone();
        }
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
        let table = crate::EmbeddingTable::from_tensor(self.model.embedding_table(), input)?;
        crate::Driver::new(&self.desc, table)
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
    /// Features per cache entry and bytes per element.
    pub fn entry_format(&self) -> (usize, usize) {
        (self.features, self.elem_bytes)
    }

    fn geom(&self, g: GroupKind) -> GroupGeom {
        let (l, p) = (self.desc.cache_len, self.desc.prefill_len);
        match g {
            GroupKind::Prefill => GroupGeom {
                rows: p,
                input_len: l - p,
            },
            GroupKind::Tbt => GroupGeom {
                rows: 1,
                input_len: l - 1,
            },
        }
    }

    fn find_fault(&self, g: GroupKind, pred: impl Fn(&FaultKind) -> bool) -> Option<&Fault> {
        self.faults
            .iter()
            .find(|f| pred(&f.kind) && f.scope.has_group(g))
    }

    fn edge_fault(
        &self,
        layer: usize,
        kind: CacheKind,
        pred: impl Fn(&FaultKind) -> bool,
    ) -> Option<&Fault> {
        self.faults
            .iter()
            .find(|f| pred(&f.kind) && f.scope.has_edge(kind, layer))
    }

    /// Layout of one (group, edge, direction); healthy = token-major (contract §7.5).
    fn layout_of(
        &self,
        g: GroupKind,
        layer: usize,
        kind: CacheKind,
        dir: CacheDirection,
    ) -> Layout {
        let f = match (g, dir) {
            (GroupKind::Tbt, CacheDirection::Input) => {
                self.edge_fault(layer, kind, |k| matches!(k, FaultKind::TbtReadLayout(_)))
            }
            (GroupKind::Prefill, CacheDirection::Output) => self.edge_fault(layer, kind, |k| {
                matches!(k, FaultKind::PrefillWriteLayout(_))
            }),
            _ => None,
        };
        match f.map(|f| &f.kind) {
            Some(FaultKind::TbtReadLayout(l)) | Some(FaultKind::PrefillWriteLayout(l)) => *l,
            _ => Layout::TokenMajor,
        }
    }

    fn layouts(&self) -> Vec<EdgeLayout> {
        let mut v = Vec::new();
        for g in [GroupKind::Prefill, GroupKind::Tbt] {
            for layer in 0..self.desc.shape.n_layers {
                for kind in [CacheKind::K, CacheKind::V] {
                    for dir in [CacheDirection::Input, CacheDirection::Output] {
                        v.push(EdgeLayout {
                            group: g,
                            cache_id: cache_id(layer, kind),
                            direction: if dir == CacheDirection::Input {
                                "input"
                            } else {
                                "output"
                            }
                            .into(),
                            layout: self.layout_of(g, layer, kind, dir),
                        });
                    }
                }
            }
        }
        v
    }

    /// The quant info a reader of (group, edge) dequantises with: the cache_id's, with the
    /// `tbt-cache-scale` factor on tbt inputs (declared so in describe, like a real HEF would).
    fn reader_quant(&self, g: GroupKind, layer: usize, kind: CacheKind) -> QuantInfo {
        let mut q = self.quant.cache[cache_id(layer, kind) as usize];
        if g == GroupKind::Tbt {
            if let Some(FaultKind::TbtCacheScale(s)) = self
                .edge_fault(layer, kind, |k| matches!(k, FaultKind::TbtCacheScale(_)))
                .map(|f| &f.kind)
            {
                q.scale *= *s;
                q.min *= *s;
                q.max *= *s;
            }
        }
        q
    }

    fn float(&self) -> bool {
        self.opts.cache_quant == CacheQuant::Float
    }

    fn describe_group(&self, g: GroupKind) -> GroupDescription {
        let geom = self.geom(g);
        let t = geom.rows;
        let s = &self.desc.shape;
        let name = format!("{}__{}", self.desc.model_name, g.suffix());
        let float = self.float();
        let io = |suffix: &str,
                  role: Option<InputRole>,
                  shape: [usize; 3],
                  host: DType,
                  dev: DType,
                  q: QuantInfo| IoDescription {
            name: format!("{name}/{suffix}"),
            role,
            shape,
            host_dtype: host,
            device_dtype: dev,
            quant: q,
        };
        let emb_t = if float { DType::F32 } else { DType::U16 };
        let mut inputs = vec![
            io(
                "input_layer1",
                Some(InputRole::Embeddings),
                [1, t, s.hidden_size],
                emb_t,
                emb_t,
                self.quant.embeddings,
            ),
            io(
                "input_layer2",
                Some(InputRole::AttentionMask),
                [1, t, s.n_heads * self.desc.cache_len],
                DType::U8,
                DType::U8,
                self.quant.mask,
            ),
        ];
        let pe_dev = if float { DType::F32 } else { DType::U8 };
        if let Some(theta) = &self.theta {
            let d = theta.len();
            // input_layer3..6 in the prior art's order (k_cos, q_cos, k_sin, q_sin); roles say which
            for (sfx, role, heads) in [
                ("input_layer3", InputRole::PeKCos, s.n_kv_heads),
                ("input_layer4", InputRole::PeQCos, s.n_heads),
                ("input_layer5", InputRole::PeKSin, s.n_kv_heads),
                ("input_layer6", InputRole::PeQSin, s.n_heads),
            ] {
                inputs.push(io(
                    sfx,
                    Some(role),
                    [1, t, heads * d],
                    DType::F32,
                    pe_dev,
                    self.quant.pe,
                ));
            }
        } else {
            let pdev = if float { DType::F32 } else { DType::U16 };
            inputs.push(io(
                "input_layer3",
                Some(InputRole::PositionIds),
                [1, t, 1],
                DType::F32,
                pdev,
                self.quant.position_ids,
            ));
        }
        let logit_dev = if float { DType::F32 } else { DType::U16 };
        let outputs = vec![io(
            "logits",
            None,
            [1, 1, s.vocab_size],
            DType::F32,
            logit_dev,
            self.quant.logits,
        )];
        let entry = self.features * self.elem_bytes;
        let mut cache_edges = Vec::new();
        for layer in 0..s.n_layers {
            for kind in [CacheKind::K, CacheKind::V] {
                for (dir, len) in [
                    (CacheDirection::Input, geom.input_len),
                    (CacheDirection::Output, self.desc.cache_len - geom.input_len),
                ] {
                    let quant = if dir == CacheDirection::Input {
                        self.reader_quant(g, layer, kind)
                    } else {
                        self.quant.cache[cache_id(layer, kind) as usize]
                    };
                    cache_edges.push(CacheEdgeDescription {
                        cache_id: cache_id(layer, kind),
                        direction: dir,
                        entry_size: entry,
                        padded_entry_size: padded_entry_size(entry),
                        length: len,
                        data_bytes: self.elem_bytes,
                        quant,
                        // A real HEF would declare NHWC here whatever the core streams (F9 was
                        // silent): layout faults are not revealed.
                        format: Some("NHWC".into()),
                        layer: Some(layer),
                        kind: Some(kind),
                    });
                }
            }
        }
        let taps = if self.opts.taps {
            (0..2 * s.n_layers as u32).collect()
        } else {
            Vec::new()
        };
        GroupDescription {
            name,
            kind: g,
            rows: t,
            inputs,
            outputs,
            cache_edges,
            taps,
        }
    }

    fn input<'a>(&self, inputs: &'a [(String, Buffer)], d: &IoDescription) -> Result<&'a Buffer> {
        let b = inputs
            .iter()
            .find(|(n, _)| *n == d.name)
            .map(|(_, b)| b)
            .ok_or_else(|| Error::InvalidArgument(format!("missing input `{}`", d.name)))?;
        if b.dtype() != d.host_dtype || b.len() != d.elements() {
            return Err(Error::InvalidArgument(format!(
                "input `{}` needs {} {:?} values, got {} {:?}",
                d.name,
                d.elements(),
                d.host_dtype,
                b.len(),
                b.dtype()
            )));
        }
        Ok(b)
    }

    /// Host float → what the graph sees after HailoRT's input quantisation (contract §4).
    fn through_input_quant(&self, xs: &[f32], q: &QuantInfo, bits: u32, device: DType) -> Vec<f32> {
        let mut v = xs.to_vec();
        if device != DType::F32 {
            quant::fake_quantize_in_place(&mut v, q, bits);
        }
        v
    }

    fn positions(
        &self,
        g: GroupKind,
        gd: &GroupDescription,
        inputs: &[(String, Buffer)],
        t: usize,
    ) -> Result<PositionInput> {
        let shift = match self
            .find_fault(g, |k| matches!(k, FaultKind::TbtPosition(_)))
            .map(|f| &f.kind)
        {
            Some(FaultKind::TbtPosition(n)) if g == GroupKind::Tbt => *n,
            _ => 0,
        };
        let by_role = |role: InputRole| gd.inputs.iter().find(|i| i.role == Some(role));
        if let Some(theta) = &self.theta {
            let get = |role: InputRole| -> Result<Vec<f32>> {
                let d = by_role(role).ok_or_else(|| Error::Device("pe input missing".into()))?;
                match self.input(inputs, d)? {
                    Buffer::F32(v) => {
                        Ok(self.through_input_quant(v, &d.quant, PE_BITS, d.device_dtype))
                    }
                    _ => Err(Error::InvalidArgument(format!(
                        "input `{}` must be float32",
                        d.name
                    ))),
                }
            };
            let (mut qc, mut qs) = (get(InputRole::PeQCos)?, get(InputRole::PeQSin)?);
            let (mut kc, mut ks) = (get(InputRole::PeKCos)?, get(InputRole::PeKSin)?);
            if shift != 0 {
                // the graph's positional wiring is `shift` positions off: rotate (cos, sin) by θ·shift
                for (c, s) in [(&mut qc, &mut qs), (&mut kc, &mut ks)] {
                    let d = theta.len();
                    for i in 0..c.len() {
                        let a = theta[i % d] as f64 * shift as f64;
                        let (ca, sa) = (a.cos() as f32, a.sin() as f32);
                        let (x, y) = (c[i], s[i]);
                        c[i] = x * ca - y * sa;
                        s[i] = y * ca + x * sa;
                    }
                }
            }
            if self.opts.rope_theta == RopeTheta::SignFolded {
                // This graph swaps the halves without a sign, trusting the table's folded first
                // half; the reference graph rotates half with the sign, so its sine is the
                // graph's with the first half of each head negated.
                let d = theta.len();
                for s in [&mut qs, &mut ks] {
                    for (i, x) in s.iter_mut().enumerate() {
                        if i % d < d / 2 {
                            *x = -*x;
                        }
                    }
                }
            }
            Ok(PositionInput::Rope {
                q_cos: qc,
                q_sin: qs,
                k_cos: kc,
                k_sin: ks,
            })
        } else {
            let d = by_role(InputRole::PositionIds)
                .ok_or_else(|| Error::Device("position-ids input missing".into()))?;
            let v = match self.input(inputs, d)? {
                Buffer::F32(v) => v,
                _ => {
                    return Err(Error::InvalidArgument(format!(
                        "input `{}` must be float32",
                        d.name
                    )))
                }
            };
            let mut ids: Vec<f32> = v
                .iter()
                .map(|&x| quant::quantize_value(x, &d.quant))
                .collect();
            ids.iter_mut()
                .for_each(|x| *x = (*x + shift as f32).max(0.0));
            debug_assert_eq!(ids.len(), t);
            Ok(PositionInput::Ids(ids))
        }
    }

    /// The graph's boolean mask `[T][NH][L]` from the raw uint8 input (dequantised through the
    /// group's mask quant info; allowed = value ≥ 0.5), with the mask faults applied.
    fn mask(
        &self,
        g: GroupKind,
        gd: &GroupDescription,
        inputs: &[(String, Buffer)],
        geom: GroupGeom,
    ) -> Result<Vec<bool>> {
        let d = gd
            .inputs
            .iter()
            .find(|i| i.role == Some(InputRole::AttentionMask))
            .ok_or_else(|| Error::Device("mask input missing".into()))?;
        let raw = match self.input(inputs, d)? {
            Buffer::U8(v) => v,
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "input `{}` must be uint8",
                    d.name
                )))
            }
        };
        let (t, nh, kv) = (geom.rows, self.desc.shape.n_heads, self.desc.cache_len);
        let allowed: Vec<bool> = raw
            .iter()
            .map(|&c| dequantize(c as f32, &d.quant) >= 0.5)
            .collect();
        let mut m = allowed.clone();
        if self
            .find_fault(g, |k| *k == FaultKind::MaskRepeat)
            .is_some()
        {
            // F4: head 0's row widened element-wise (AABB) where heads need tiling (ABAB)
            for r in 0..t {
                for h in 0..nh {
                    for k in 0..kv {
                        m[(r * nh + h) * kv + k] = allowed[r * nh * kv + (h * kv + k) / nh];
                    }
                }
            }
        }
        if self
            .find_fault(g, |k| *k == FaultKind::MaskLeftValid)
            .is_some()
        {
            // the graph expects valid cache entries on the left: past key c takes column W−1−c
            let w = geom.input_len;
            let src = m.clone();
            for r in 0..t {
                for h in 0..nh {
                    let o = (r * nh + h) * kv;
                    for c in 0..w {
                        m[o + c] = src[o + w - 1 - c];
                    }
                }
            }
        }
        Ok(m)
    }

    /// Read one cache edge's window as the graph sees it: `[in][features]` floats.
    fn read_edge(
        &mut self,
        g: GroupKind,
        layer: usize,
        kind: CacheKind,
        n_in: usize,
    ) -> Result<Vec<f32>> {
        let swap = g == GroupKind::Tbt
            && self
                .edge_fault(layer, kind, |k| *k == FaultKind::KvSwap)
                .is_some();
        let phys = cache_id(layer, if swap { other(kind) } else { kind });
        let mut stream = std::mem::take(&mut self.stream);
        let mut block = std::mem::take(&mut self.block);
        self.rings.read_window(phys, n_in, &mut stream)?;
        let shape = StreamShape {
            tokens: n_in,
            features: self.features,
            elem_bytes: self.elem_bytes,
            head_dim: self.head_dim,
        };
        let lay = self.layout_of(g, layer, kind, CacheDirection::Input);
        layout::decode(lay, shape, &stream, &mut block);
        let q = self.reader_quant(g, layer, kind);
        let out: Vec<f32> = match self.opts.cache_quant {
            CacheQuant::U8 => block.iter().map(|&c| dequantize(c as f32, &q)).collect(),
            CacheQuant::U16 => block
                .chunks_exact(2)
                .map(|c| dequantize(u16::from_le_bytes([c[0], c[1]]) as f32, &q))
                .collect(),
            // float edges: the declared scale still multiplies (the scale fault declares F)
            CacheQuant::Float => block
                .chunks_exact(4)
                .map(|c| dequantize(f32::from_le_bytes([c[0], c[1], c[2], c[3]]), &q))
                .collect(),
        };
        self.stream = stream;
        self.block = block;
        Ok(out)
    }

    /// Write one cache edge's new rows (`[T][features]` floats) through the writer's quant and layout.
    fn write_edge(
        &mut self,
        g: GroupKind,
        layer: usize,
        kind: CacheKind,
        n_in: usize,
        rows: &[f32],
    ) -> Result<()> {
        let swap = g == GroupKind::Tbt
            && self
                .edge_fault(layer, kind, |k| *k == FaultKind::KvSwap)
                .is_some();
        let phys = cache_id(layer, if swap { other(kind) } else { kind });
        let q = self.quant.cache[cache_id(layer, kind) as usize];
        let mut block = std::mem::take(&mut self.block);
        let mut stream = std::mem::take(&mut self.stream);
        block.clear();
        match self.opts.cache_quant {
            CacheQuant::U8 => block.extend(rows.iter().map(|&x| quant::quantize_u8(x, &q))),
            CacheQuant::U16 => {
                for &x in rows {
                    block.extend_from_slice(&quant::quantize_u16(x, &q).to_le_bytes());
                }
            }
            CacheQuant::Float => {
                for &x in rows {
                    block.extend_from_slice(&x.to_le_bytes());
                }
            }
        }
        let tokens = rows.len() / self.features;
        let shape = StreamShape {
            tokens,
            features: self.features,
            elem_bytes: self.elem_bytes,
            head_dim: self.head_dim,
        };
        let lay = self.layout_of(g, layer, kind, CacheDirection::Output);
        layout::encode(lay, shape, &block, &mut stream);
        let trunc = self.faults.iter().find(|f| {
            matches!(f.kind, FaultKind::TruncateEntry(_))
                && f.scope.has_group(g)
                && f.scope.has_edge(kind, layer)
        });
        if let Some(Fault {
            kind: FaultKind::TruncateEntry(n),
            ..
        }) = trunc
        {
            let e = shape.entry_bytes();
            for entry in stream.chunks_exact_mut(e) {
                entry[*n..].fill(0);
            }
        }
        let res = self.rings.write_window(phys, n_in, &stream);
        self.block = block;
        self.stream = stream;
        res
    }

    /// `[n_kv, T, hd]` → `[T][features]`, expanded with HF repeat_kv (query head q uses KV head
    /// q / n_rep) when the cache holds expanded heads.
    fn entries_from_heads(&self, t: &Tensor) -> Result<Vec<f32>> {
        let (h, rows, hd) = t.dims3()?;
        let v: Vec<f32> = t.flatten_all()?.to_vec1()?;
        let heads = self.features / hd;
        let rep = heads / h;
        let mut out = Vec::with_capacity(rows * self.features);
        for r in 0..rows {
            for qh in 0..heads {
                let kh = qh / rep;
                let o = (kh * rows + r) * hd;
                out.extend_from_slice(&v[o..o + hd]);
            }
        }
        Ok(out)
    }

    fn heads_tensor(&self, floats: Vec<f32>, n: usize) -> Result<Tensor> {
        let hd = self.desc.shape.head_dim;
        let h = self.features / hd;
        Ok(Tensor::from_vec(floats, (n, h, hd), &CDevice::Cpu)?
            .transpose(0, 1)?
            .contiguous()?)
    }
}

/// Rows of one batched tbt graph run (bounds the `[rows, vocab]` logits buffer).
const BATCH_ROWS: usize = 64;

/// What the graph read, per cache_id (`RunOutput::taps`).
type Taps = BTreeMap<u32, Vec<f32>>;

/// One run's inputs as the graph sees them.
struct Decoded {
    hidden: Vec<f32>,
    positions: PositionInput,
    mask: Vec<bool>,
}

impl SimDevice {
    fn group_of(&self, g: GroupKind) -> Result<(GroupDescription, GroupGeom)> {
        let gd = self
            .desc
            .group(g)
            .cloned()
            .ok_or_else(|| Error::Device(format!("no group {}", g.suffix())))?;
        Ok((gd, self.geom(g)))
    }

    /// Check the input names and decode embeddings, positions and mask (with the mask faults).
    fn decode_inputs(
        &self,
        g: GroupKind,
        gd: &GroupDescription,
        inputs: &[(String, Buffer)],
        geom: GroupGeom,
    ) -> Result<Decoded> {
        if let Some((name, _)) = inputs
            .iter()
            .find(|(n, _)| !gd.inputs.iter().any(|i| &i.name == n))
        {
            return Err(Error::InvalidArgument(format!(
                "group `{}` has no input `{name}`",
                gd.name
            )));
        }
        // embeddings: raw uint16 rows dequantised by the graph (contract §2.11)
        let ed = gd
            .inputs
            .iter()
            .find(|i| i.role == Some(InputRole::Embeddings))
            .ok_or_else(|| Error::Device("embeddings input missing".into()))?;
        let hidden: Vec<f32> = match self.input(inputs, ed)? {
            Buffer::U16(v) => v.iter().map(|&c| dequantize(c as f32, &ed.quant)).collect(),
            Buffer::F32(v) => v.clone(),
            Buffer::U8(_) => {
                return Err(Error::InvalidArgument("embeddings must be uint16".into()))
            }
        };
        let positions = self.positions(g, gd, inputs, geom.rows)?;
        let mask = self.mask(g, gd, inputs, geom)?;
        Ok(Decoded {
            hidden,
            positions,
            mask,
        })
    }

    /// All layers' past read up front: read and write windows are disjoint (contract §1.5).
    fn read_past(&mut self, g: GroupKind, geom: GroupGeom) -> Result<(Vec<LayerKv>, Taps)> {
        let n_layers = self.desc.shape.n_layers;
        let mut past = Vec::with_capacity(n_layers);
        let mut taps = BTreeMap::new();
        for layer in 0..n_layers {
            let k = self.read_edge(g, layer, CacheKind::K, geom.input_len)?;
            let v = self.read_edge(g, layer, CacheKind::V, geom.input_len)?;
            if self.opts.taps {
                taps.insert(cache_id(layer, CacheKind::K), k.clone());
                taps.insert(cache_id(layer, CacheKind::V), v.clone());
            }
            past.push(LayerKv {
                k: self.heads_tensor(k, geom.input_len)?,
                v: self.heads_tensor(v, geom.input_len)?,
            });
        }
        Ok((past, taps))
    }

    fn graph_options(&self, g: GroupKind) -> GraphOptions {
        let attn_scale = self
            .faults
            .iter()
            .find_map(|f| match (f.kind.clone(), g) {
                (FaultKind::TbtAttnScale(x), GroupKind::Tbt)
                | (FaultKind::PrefillAttnScale(x), GroupKind::Prefill) => Some(x),
                _ => None,
            })
            .unwrap_or(1.0);
        GraphOptions {
            attn_scale,
            shared_softmax: self
                .find_fault(g, |k| *k == FaultKind::SharedSoftmax)
                .is_some(),
            gqa_block_order: self.find_fault(g, |k| *k == FaultKind::GqaBlock).is_some(),
        }
    }

    /// Write every layer's new K/V rows through the writers.
    fn write_new(&mut self, g: GroupKind, geom: GroupGeom, new_kv: &[LayerKv]) -> Result<()> {
        for (layer, kv) in new_kv.iter().enumerate() {
            let k = self.entries_from_heads(&kv.k)?;
            let v = self.entries_from_heads(&kv.v)?;
            self.write_edge(g, layer, CacheKind::K, geom.input_len, &k)?;
            self.write_edge(g, layer, CacheKind::V, geom.input_len, &v)?;
        }
        Ok(())
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

    /// N single-row tbt runs over the same past as one `[N]`-row graph input: row r keeps its
    /// own mask over the W past columns and sees only its own new column.
    fn batched_input(
        &self,
        rows: &[Decoded],
        past: &[LayerKv],
        geom: GroupGeom,
        g: GroupKind,
    ) -> Result<GraphInput> {
        let n = rows.len();
        let (nh, w) = (self.desc.shape.n_heads, geom.input_len);
        let kv = self.desc.cache_len; // W + 1 columns per single-run mask row
        let cols = w + n;
        let mut mask = vec![false; n * nh * cols];
        for (r, d) in rows.iter().enumerate() {
            for h in 0..nh {
                let src = &d.mask[h * kv..(h + 1) * kv];
                let dst = &mut mask[(r * nh + h) * cols..(r * nh + h + 1) * cols];
                dst[..w].copy_from_slice(&src[..w]);
                dst[w + r] = src[w];
            }
        }
        let mut hidden = Vec::with_capacity(n * self.desc.shape.hidden_size);
        for d in rows {
            hidden.extend_from_slice(&d.hidden);
        }
        let positions = match &rows[0].positions {
            PositionInput::Ids(_) => {
                let mut ids = Vec::with_capacity(n);
                for d in rows {
                    if let PositionInput::Ids(v) = &d.positions {
                        ids.extend_from_slice(v);
                    }
                }
                PositionInput::Ids(ids)
            }
            PositionInput::Rope { .. } => {
                let (mut qc, mut qs, mut kc, mut ks) =
                    (Vec::new(), Vec::new(), Vec::new(), Vec::new());
                for d in rows {
                    if let PositionInput::Rope {
                        q_cos,
                        q_sin,
                        k_cos,
                        k_sin,
                    } = &d.positions
                    {
                        qc.extend_from_slice(q_cos);
                        qs.extend_from_slice(q_sin);
                        kc.extend_from_slice(k_cos);
                        ks.extend_from_slice(k_sin);
                    }
                }
                PositionInput::Rope {
                    q_cos: qc,
                    q_sin: qs,
                    k_cos: kc,
                    k_sin: ks,
                }
            }
        };
        Ok(GraphInput {
            hidden: Tensor::from_vec(hidden, (n, self.desc.shape.hidden_size), &CDevice::Cpu)?,
            positions,
            past: past.to_vec(),
            mask,
            graph: self.graph_options(g),
            last_only: false,
        })
    }
}

/// Group prefix from a model path: the file stem, lower case, `[a-z0-9_]` only.
pub(crate) fn scope_name(path: &Path) -> String {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().to_lowercase())
        .unwrap_or_default();
    let s: String = stem
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if s.is_empty() || s.chars().all(|c| c == '_') {
        "model".into()
    } else {
        s
    }
}

impl Device for SimDevice {
    fn describe(&self) -> &DeviceDescription {
        &self.desc
    }

    fn run(&mut self, g: GroupKind, inputs: &[(String, Buffer)]) -> Result<RunOutput> {
        let (gd, geom) = self.group_of(g)?;
        let d = self.decode_inputs(g, &gd, inputs, geom)?;
        let (past, taps) = self.read_past(g, geom)?;
        let out = self.model.run_graph(&GraphInput {
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
        })?;
        self.write_new(g, geom, &out.new_kv)?;
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
