//! [`OnnxDevice`]: a GenAI folder behind the [`Device`] contract, as the generic stateful driver
//! sees it (mod.rs). Each run maps the driver's rows to GenAI's inputs (host.rs), rewinds the
//! past to the run's first position when the driver stepped back, runs the graph and keeps the
//! presents as the next past.

use std::collections::BTreeMap;

use kvprobe_reference::Model;
use kvprobe_schema::{
    CacheDirection, CacheEdgeDescription, CacheKind, DType, DeviceDescription, GroupDescription,
    GroupKind, InputRole, IoDescription, ModelShape, QuantInfo, RuntimeKind,
};

use super::config::GenaiConfig;
use super::{host, OnnxOptions, CAPABILITIES, FAMILY};
use crate::{Buffer, Capabilities, Device, Error, Result, RunOutput};

/// Names of the driver-side inputs in the description. The embeddings row input carries the
/// rows the generic driver reads from the reference's table; the device turns them back into
/// `input_ids` (host::TokenLookup).
pub const ROWS: &str = "input_ids (as embedding rows)";
pub const POSITIONS: &str = "position_ids";
pub const MASK: &str = "attention_mask (as fp16 rows)";

pub struct OnnxDevice {
    desc: DeviceDescription,
    cfg: GenaiConfig,
    lookup: host::TokenLookup,
    #[cfg(feature = "onnx")]
    rt: super::runtime::Runtime,
    /// Per cache id (2l K, 2l+1 V): `[H, past_len, D]` f32, GenAI's past.
    past: Vec<Vec<f32>>,
    past_len: usize,
}

fn io(
    name: &str,
    role: Option<InputRole>,
    shape: [usize; 3],
    host: DType,
    dev: DType,
) -> IoDescription {
    IoDescription {
        name: name.into(),
        role,
        shape,
        host_dtype: host,
        device_dtype: dev,
        quant: QuantInfo::IDENTITY,
    }
}

#[cfg_attr(not(feature = "onnx"), allow(dead_code))]
fn description(name: String, cfg: &GenaiConfig, ctx: usize) -> DeviceDescription {
    let entry = cfg.n_kv_heads * cfg.head_size * 2;
    let edges: Vec<CacheEdgeDescription> = (0..cfg.n_layers)
        .flat_map(|l| {
            [(2 * l as u32, CacheKind::K), (2 * l as u32 + 1, CacheKind::V)].map(|(id, kind)| {
                CacheEdgeDescription {
                    cache_id: id,
                    direction: CacheDirection::Input,
                    entry_size: entry,
                    padded_entry_size: entry,
                    length: ctx,
                    data_bytes: 2,
                    quant: QuantInfo::IDENTITY,
                    // the past is f32 [1, H, S, D]; cache_buffers shows it as the stateful
                    // contract's fp16 [kv_heads, max_ctx, head_dim]
                    format: Some("past/present [1, H, S, D] f32, shown as [kv_heads, max_ctx, head_dim] fp16".into()),
                    layer: Some(l),
                    kind: Some(kind),
                }
            })
        })
        .collect();
    let group = |kind: GroupKind, rows: usize| GroupDescription {
        name: format!("{name}__q{rows}"),
        kind,
        rows,
        inputs: vec![
            io(
                ROWS,
                Some(InputRole::Embeddings),
                [1, rows, cfg.hidden_size],
                DType::F32,
                DType::F32,
            ),
            io(
                POSITIONS,
                Some(InputRole::PositionIds),
                [1, 1, rows],
                DType::F32,
                DType::F32,
            ),
            io(
                MASK,
                Some(InputRole::AttentionMask),
                [1, rows, ctx],
                DType::F16,
                DType::F16,
            ),
        ],
        outputs: vec![io(
            "logits",
            None,
            [1, 1, cfg.vocab_size],
            DType::F32,
            DType::F32,
        )],
        cache_edges: edges.clone(),
        taps: Vec::new(),
    };
    // GenAI's default decoder runs the whole prompt in one run: one prefill group of ctx − 1 rows
    let groups = vec![group(GroupKind::Prefill, ctx - 1), group(GroupKind::Tbt, 1)];
    DeviceDescription {
        backend: FAMILY.name.into(),
        runtime: RuntimeKind::HostCache,
        model_name: name,
        cache_len: ctx,
        prefill_len: ctx - 1,
        shape: ModelShape {
            vocab_size: cfg.vocab_size,
            hidden_size: cfg.hidden_size,
            n_layers: cfg.n_layers,
            n_heads: cfg.n_heads,
            n_kv_heads: cfg.n_kv_heads,
            head_dim: cfg.head_size,
            rope_theta: None,
        },
        groups,
    }
}

impl OnnxDevice {
    /// Opens `opts.dir` for the reference `model` (whose embedding rows the driver will send).
    #[cfg(feature = "onnx")]
    pub fn open(model: &Model, opts: &OnnxOptions) -> Result<OnnxDevice> {
        let cfg = GenaiConfig::load(&opts.dir)?;
        if cfg.sliding_window {
            return Err(Error::Io {
                path: cfg.path.clone(),
                detail: "decoder.sliding_window (the windowed NPU cache) is not driven yet; kvprobe runs GenAI's default decoder".into(),
            });
        }
        let ctx = match opts.max_ctx {
            Some(n) if n < 2 || n > cfg.max_length => {
                return Err(Error::BadOption {
                    flag: format!("--max-ctx {n}"),
                    detail: format!(
                        "must be 2..={} (search.max_length of {})",
                        cfg.max_length,
                        cfg.path.display()
                    ),
                })
            }
            Some(n) => n,
            None => cfg.max_length.min(128),
        };
        let (rows, hidden) = model.embedding_dims();
        if rows != cfg.vocab_size || hidden != cfg.hidden_size {
            return Err(Error::Io {
                path: cfg.path.clone(),
                detail: format!(
                    "vocab {} × hidden {} but the reference model {} has {rows} × {hidden}; pass the --model this folder was exported from",
                    cfg.vocab_size,
                    cfg.hidden_size,
                    model.source().display()
                ),
            });
        }
        let lookup = host::TokenLookup::new(model.embedding_rows(0, rows)?, hidden)?;
        let rt = super::runtime::Runtime::open(&opts.dir, &cfg, opts)?;
        let name = opts
            .dir
            .file_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into());
        Ok(OnnxDevice {
            desc: description(name, &cfg, ctx),
            past: vec![Vec::new(); 2 * cfg.n_layers],
            past_len: 0,
            cfg,
            lookup,
            rt,
        })
    }

    /// A build without the feature says so before anything else (no flag fixes that; exit 3).
    #[cfg(not(feature = "onnx"))]
    pub fn open(_model: &Model, _opts: &OnnxOptions) -> Result<OnnxDevice> {
        Err(no_feature())
    }

    pub fn config(&self) -> &GenaiConfig {
        &self.cfg
    }

    /// Positions the device holds K/V for (GenAI's current sequence length).
    pub fn past_len(&self) -> usize {
        self.past_len
    }

    /// The graph's input names (as ONNX Runtime lists them).
    #[cfg(feature = "onnx")]
    pub fn graph_inputs(&self) -> &[String] {
        self.rt.inputs()
    }

    fn take<'a>(inputs: &'a [(String, Buffer)], name: &str) -> Result<&'a Buffer> {
        inputs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, b)| b)
            .ok_or_else(|| Error::InvalidArgument(format!("missing input `{name}`")))
    }

    /// GenAI's inputs for one run from the driver's buffers: (ids, attention_mask, first position).
    fn genai_inputs(&mut self, inputs: &[(String, Buffer)]) -> Result<(Vec<u32>, Vec<i64>, usize)> {
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
        let q = ids.len();
        let first = pos.first().copied().unwrap_or(-1.0);
        let consecutive =
            pos.len() == q && pos.iter().enumerate().all(|(i, &p)| p == first + i as f32);
        if !consecutive || first < 0.0 {
            return Err(Error::InvalidArgument(format!(
                "position ids {pos:?} are not consecutive from the request's length; GenAI sets them itself"
            )));
        }
        let first = first as usize;
        if first > self.past_len {
            return Err(Error::InvalidArgument(format!(
                "a run at position {first} over a past of {} positions; GenAI can only append or rewind",
                self.past_len
            )));
        }
        let rows = host::rows_from_additive(mask, q)?;
        let attention = host::attention_mask_from_rows(&rows, first)?;
        Ok((ids, attention, first))
    }

    fn shape(&self) -> (usize, usize, usize) {
        (self.cfg.n_kv_heads, self.desc.cache_len, self.cfg.head_size)
    }
}

#[cfg(not(feature = "onnx"))]
fn no_feature() -> Error {
    Error::Device("--onnx: built without ONNX Runtime support: rebuild with --features onnx".into())
}

impl Device for OnnxDevice {
    fn describe(&self) -> &DeviceDescription {
        &self.desc
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    fn run(&mut self, _group: GroupKind, inputs: &[(String, Buffer)]) -> Result<RunOutput> {
        let (ids, mask, first) = self.genai_inputs(inputs)?;
        let (h, _, d) = self.shape();
        if first < self.past_len {
            // the driver stepped back: GenAI's RewindTo(first)
            for c in &mut self.past {
                *c = host::rewind(c, h, self.past_len, d, first);
            }
            self.past_len = first;
        }
        let total = host::present_length(self.past_len, ids.len());
        if total > self.desc.cache_len {
            return Err(Error::ContextFull {
                max_ctx: self.desc.cache_len,
            });
        }
        let positions = host::position_ids(total, ids.len());
        #[cfg(feature = "onnx")]
        {
            let (logits, presents) =
                self.rt
                    .run(&ids, &mask, &positions, &self.past, self.past_len)?;
            self.past = presents;
            self.past_len = total;
            Ok(RunOutput {
                logits,
                taps: BTreeMap::new(),
            })
        }
        #[cfg(not(feature = "onnx"))]
        {
            let _ = (mask, positions);
            Err(no_feature())
        }
    }

    fn init_cache(&mut self, read_offset: u32) -> Result<()> {
        if read_offset != 0 {
            return Err(Error::InvalidArgument(format!(
                "init_cache({read_offset}): a GenAI request starts at 0 (there is no ring offset)"
            )));
        }
        self.past.iter_mut().for_each(Vec::clear);
        self.past_len = 0;
        Ok(())
    }

    fn update_cache_offset(&mut self, delta: i32) -> Result<()> {
        Err(Error::InvalidArgument(format!(
            "update_cache_offset({delta}): a GenAI decoder has no ring offset"
        )))
    }

    fn cache_buffers(&mut self) -> Result<BTreeMap<u32, Vec<u8>>> {
        let (h, ctx, d) = self.shape();
        let n = self.past_len;
        Ok(self
            .past
            .iter()
            .enumerate()
            .map(|(id, past)| {
                let mut st = vec![0u8; h * ctx * d * 2];
                for hh in 0..h {
                    for t in 0..n {
                        for c in 0..d {
                            let x = half::f16::from_f32(past[(hh * n + t) * d + c]);
                            let o = ((hh * ctx + t) * d + c) * 2;
                            st[o..o + 2].copy_from_slice(&x.to_le_bytes());
                        }
                    }
                }
                (id as u32, st)
            })
            .collect())
    }

    fn write_cache_buffer(&mut self, cache_id: u32, bytes: &[u8]) -> Result<()> {
        let (h, ctx, d) = self.shape();
        let n = self.past_len;
        if bytes.len() != h * ctx * d * 2 {
            return Err(Error::InvalidArgument(format!(
                "cache {cache_id}: {} bytes, the state is {h}×{ctx}×{d} fp16 = {} bytes",
                bytes.len(),
                h * ctx * d * 2
            )));
        }
        let past = self
            .past
            .get_mut(cache_id as usize)
            .ok_or_else(|| Error::InvalidArgument(format!("no cache {cache_id}")))?;
        // the first past_len positions are the request's past; the rest is not part of it
        for hh in 0..h {
            for t in 0..n {
                for c in 0..d {
                    let o = ((hh * ctx + t) * d + c) * 2;
                    past[(hh * n + t) * d + c] =
                        half::f16::from_le_bytes([bytes[o], bytes[o + 1]]).to_f32();
                }
            }
        }
        Ok(())
    }
}
