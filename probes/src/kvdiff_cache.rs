//! `kvdiff`'s view of a device cache: every layer's K and V as `[layer][position]` rows of
//! `[n_kv · hd]` floats, from whatever the device exposes through `Device::cache_buffers`:
//! - genai ring (HailoRT): position p sits at slot p mod L (the driver's reset starts at offset
//!   0); entries are decoded through the writer's layout (per prefill window) and dequantised
//!   with the writer's declared quant info;
//! - stateful states (Core ML) and host present tensors (ONNX): `[kv_heads, max_ctx, head_dim]`
//!   little-endian fp16 per cache id, position p at index p; GenAI's windowed cache shows its
//!   uint8 codes dequantised in the same view, holding only its newest `C − 1` positions.

use std::collections::BTreeMap;

use kvprobe_npu::layout::{element_position, StreamShape};
use kvprobe_schema::{CacheKind, DeviceDescription, Layout, RuntimeKind};

use crate::rings::{cache_infos, CacheInfo};
use crate::{Error, Result};

/// `[layer][position]` rows `[n_kv · hd]`; an empty row = the position is not in the cache.
pub type Rows = Vec<Vec<Vec<f32>>>;
/// K and V rows borrowed: `(k, v)`, each `[layer][position]`.
pub type KvRef<'a> = (&'a [Vec<Vec<f32>>], &'a [Vec<Vec<f32>>]);

/// How the device's cache is read.
#[derive(Debug, Clone)]
pub enum CacheView {
    Ring {
        infos: Vec<CacheInfo>,
        /// The prefill writer's layout per cache (index into `infos`).
        layouts: Vec<Layout>,
        cache_len: usize,
        prefill_len: usize,
        n_kv: usize,
        n_heads: usize,
        head_dim: usize,
    },
    States {
        /// `(cache_id, layer, kind)`.
        ids: Vec<(u32, usize, CacheKind)>,
        max_ctx: usize,
        n_kv: usize,
        head_dim: usize,
        /// Positions a sliding cache holds (the newest ones): GenAI's windowed cache keeps
        /// `C − 1` past entries (contract §3); `None` = every position up to `max_ctx`.
        held: Option<usize>,
    },
}

/// GenAI's NPU-style windowed cache (contract §3): its edges say so in their format.
pub fn windowed(desc: &DeviceDescription) -> bool {
    desc.runtime == RuntimeKind::HostCache
        && desc
            .groups
            .iter()
            .flat_map(|g| &g.cache_edges)
            .any(|e| e.format.as_deref().is_some_and(|f| f.contains("windowed")))
}

/// The writer layout a cache edge's description names (its format), if it names one of the
/// layouts the contract knows; `None` for "NHWC" and other format codes that say no order.
pub fn declared_layout(info: &CacheInfo, desc: &DeviceDescription) -> Option<Layout> {
    desc.groups
        .iter()
        .flat_map(|g| &g.cache_edges)
        .filter(|e| e.cache_id == info.cache_id)
        .find_map(|e| e.format.as_deref().and_then(Layout::parse))
}

impl CacheView {
    /// The view of `desc`'s caches; ring layouts from the description, token-major where it
    /// names none (the healthy layout, contract §1.2).
    pub fn of(desc: &DeviceDescription) -> Result<CacheView> {
        let s = &desc.shape;
        match desc.runtime {
            RuntimeKind::GenaiRing => {
                let infos = cache_infos(desc)?;
                let layouts = infos
                    .iter()
                    .map(|i| declared_layout(i, desc).unwrap_or(Layout::TokenMajor))
                    .collect();
                Ok(CacheView::Ring {
                    infos,
                    layouts,
                    cache_len: desc.cache_len,
                    prefill_len: desc.prefill_len,
                    n_kv: s.n_kv_heads,
                    n_heads: s.n_heads,
                    head_dim: s.head_dim,
                })
            }
            RuntimeKind::Stateful | RuntimeKind::HostCache => {
                let mut ids: Vec<(u32, usize, CacheKind)> = desc
                    .groups
                    .iter()
                    .flat_map(|g| &g.cache_edges)
                    .map(|e| {
                        let (layer, kind) = e.layer.zip(e.kind).unwrap_or((
                            e.cache_id as usize / 2,
                            if e.cache_id % 2 == 0 {
                                CacheKind::K
                            } else {
                                CacheKind::V
                            },
                        ));
                        (e.cache_id, layer, kind)
                    })
                    .collect();
                ids.sort_by_key(|x| x.0);
                ids.dedup_by_key(|x| x.0);
                if ids.is_empty() {
                    return Err(Error::Device("the device declares no cache edges".into()));
                }
                Ok(CacheView::States {
                    ids,
                    max_ctx: desc.cache_len,
                    n_kv: s.n_kv_heads,
                    head_dim: s.head_dim,
                    held: windowed(desc).then(|| desc.cache_len.saturating_sub(1)),
                })
            }
        }
    }

    /// One line: where the rows come from.
    pub fn source(&self) -> String {
        match self {
            CacheView::Ring { infos, .. } => format!(
                "ring bytes ({} caches, {}-byte elements) through the writer layout, dequantised with each edge's writer quant info",
                infos.len(),
                infos.first().map_or(1, |i| i.elem_bytes)
            ),
            CacheView::States { ids, held, .. } => format!(
                "{} cache states [kv_heads, max_ctx, head_dim] fp16 as cache_buffers() exposes them{}",
                ids.len(),
                if held.is_some() {
                    " (a windowed cache's uint8 codes, dequantised with its declared scales; only its newest C − 1 positions)"
                } else {
                    ""
                }
            ),
        }
    }

    /// One line: the layout used and who named it.
    pub fn layout(&self, desc: &DeviceDescription) -> String {
        match self {
            CacheView::Ring { infos, layouts, .. } => {
                let named = infos.iter().any(|i| declared_layout(i, desc).is_some());
                let first = layouts.first().map_or("token-major", |l| l.name());
                let same = layouts.iter().all(|l| Some(l) == layouts.first());
                format!(
                    "{}{} ({})",
                    first,
                    if same { "" } else { " and others per edge" },
                    if named {
                        "named in the description"
                    } else {
                        "the description names none: token-major, the contract's"
                    }
                )
            }
            CacheView::States { .. } => "state index = position".into(),
        }
    }

    /// Sets one writer layout for every ring edge (a layout `layout --infer` solved).
    pub fn set_layout(&mut self, layout: Layout) {
        if let CacheView::Ring { layouts, .. } = self {
            layouts.iter_mut().for_each(|l| *l = layout);
        }
    }

    /// K and V rows of positions `held` (`[first, last]` inclusive) after the prompt of `n`
    /// tokens was prefilled and tbt rows wrote up to `last`.
    pub fn rows(
        &self,
        buffers: &BTreeMap<u32, Vec<u8>>,
        n_layers: usize,
        n: usize,
        last: usize,
    ) -> Result<(Rows, Rows)> {
        let mut k = vec![vec![Vec::new(); last + 1]; n_layers];
        let mut v = k.clone();
        match self {
            CacheView::Ring {
                infos,
                layouts,
                cache_len,
                prefill_len,
                n_kv,
                n_heads,
                head_dim,
            } => {
                let first = (last + 1).saturating_sub(*cache_len);
                for (info, layout) in infos.iter().zip(layouts) {
                    let bytes = buffers.get(&info.cache_id).ok_or_else(|| {
                        Error::Device(format!(
                            "cache_buffers() has no ring for cache {}",
                            info.cache_id
                        ))
                    })?;
                    let geom = RingGeom {
                        cache_len: *cache_len,
                        prefill_len: *prefill_len,
                        n_kv: *n_kv,
                        rep: if info.expanded { n_heads / n_kv } else { 1 },
                        head_dim: *head_dim,
                    };
                    let dst = if info.kind == CacheKind::K {
                        &mut k
                    } else {
                        &mut v
                    };
                    let Some(layer_rows) = dst.get_mut(info.layer) else {
                        continue;
                    };
                    for (p, row) in layer_rows.iter_mut().enumerate().skip(first) {
                        *row = ring_entry(info, *layout, &geom, bytes, p, n)?;
                    }
                }
            }
            CacheView::States {
                ids,
                max_ctx,
                n_kv,
                head_dim,
                held,
            } => {
                // positions a sliding cache has dropped stay empty rows (not in the cache)
                let first = held.map_or(0, |h| (last + 1).saturating_sub(h));
                for &(id, layer, kind) in ids {
                    let bytes = buffers.get(&id).ok_or_else(|| {
                        Error::Device(format!("cache_buffers() has no state for cache {id}"))
                    })?;
                    let want = n_kv * max_ctx * head_dim * 2;
                    if bytes.len() < want {
                        return Err(Error::Device(format!(
                            "cache {id}: {} bytes, a [{n_kv}, {max_ctx}, {head_dim}] fp16 state is {want}",
                            bytes.len()
                        )));
                    }
                    let dst = if kind == CacheKind::K { &mut k } else { &mut v };
                    let Some(layer_rows) = dst.get_mut(layer) else {
                        continue;
                    };
                    for (p, row) in layer_rows.iter_mut().enumerate().take(last + 1).skip(first) {
                        let mut out = Vec::with_capacity(n_kv * head_dim);
                        for h in 0..*n_kv {
                            let o = (h * max_ctx + p) * head_dim * 2;
                            out.extend(
                                bytes[o..o + head_dim * 2]
                                    .chunks_exact(2)
                                    .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()),
                            );
                        }
                        *row = out;
                    }
                }
            }
        }
        Ok((k, v))
    }
}

struct RingGeom {
    cache_len: usize,
    prefill_len: usize,
    n_kv: usize,
    /// Copies of each KV head in an expanded entry (HF repeat_kv order AABB).
    rep: usize,
    head_dim: usize,
}

/// Position `p`'s `[n_kv · hd]` values. Prompt positions were written by prefill windows of
/// `P` entries (remainder first, padded at the front: window k starts at `r − P + k·P`), each
/// encoded in the writer's layout as one stream; later positions by one-entry tbt writes, for
/// which every layout is token-major.
fn ring_entry(
    info: &CacheInfo,
    layout: Layout,
    g: &RingGeom,
    bytes: &[u8],
    p: usize,
    n: usize,
) -> Result<Vec<f32>> {
    let (l, pl, c, b) = (
        g.cache_len,
        g.prefill_len.max(1),
        info.features,
        info.elem_bytes,
    );
    let (start, t) = if p < n && layout != Layout::TokenMajor {
        let r = (n % pl) as i64;
        let first = if r > 0 { r - pl as i64 } else { 0 };
        let k = (p as i64 - first) / pl as i64;
        let start = first + k * pl as i64;
        (start, (p as i64 - start) as usize)
    } else {
        (p as i64, 0)
    };
    let window = if p < n && layout != Layout::TokenMajor {
        pl
    } else {
        1
    };
    let shape = StreamShape {
        tokens: window,
        features: c,
        elem_bytes: b,
        head_dim: g.head_dim,
    };
    let q = info.writer_quant();
    let mut out = Vec::with_capacity(g.n_kv * g.head_dim);
    for h in 0..g.n_kv {
        for d in 0..g.head_dim {
            // expanded entries repeat each KV head `rep` times: read its first copy
            let col = (h * g.rep) * g.head_dim + d;
            let el = element_position(layout, shape, t, col);
            let slot = (start + (el / c) as i64).rem_euclid(l as i64) as usize;
            let at = slot * info.padded_entry_size + (el % c) * b;
            let code = bytes.get(at..at + b).ok_or_else(|| {
                Error::Device(format!(
                    "cache {}: ring of {} bytes is shorter than {l} slots of {} bytes",
                    info.cache_id,
                    bytes.len(),
                    info.padded_entry_size
                ))
            })?;
            let x = match b {
                1 => code[0] as f32,
                2 => u16::from_le_bytes([code[0], code[1]]) as f32,
                _ => f32::from_le_bytes([code[0], code[1], code[2], code[3]]),
            };
            out.push(if b <= 2 {
                kvprobe_npu::quant::dequantize(x, &q)
            } else {
                x
            });
        }
    }
    Ok(out)
}
