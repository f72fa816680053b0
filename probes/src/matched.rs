//! The precision-matched reference (issue 18): the f32 reference model run at the precision the
//! device *declares*, on the device's own tokens, so that a tbt miss can be compared with what
//! that precision alone costs.
//!
//! What is rounded, from the description only (never from the device's outputs):
//! - genai ring (HailoRT): the embeddings input through its quant info, every cache entry through
//!   its ring's reader quant info when it is written (so every later read sees the rounded value,
//!   as a ring holds it), and the logits output through its quant info. The RoPE tables are taken
//!   exact: their 16-bit step is far below the cache's 8-bit one.
//! - stateful (Core ML / ANE): fp16 embeddings, fp16 K/V states and fp16 logits, and the
//!   arithmetic inside the graph the description declares (the ANE emulator: fp16 every op, its
//!   norm form and its fp16 sums, `matched_fp16`); a stateful graph declaring float32 is
//!   computed in float32.
//! - host cache (ONNX Runtime GenAI): the cache through its declared quant info (a windowed uint8
//!   export), else nothing is rounded and no separate run is made.
//!
//! The driving follows the runtime's contract: prefill chunks (remainder first on a ring, from the
//! start on a stateful device), each chunk reading the earlier positions of the read window from
//! the store and its own rows in-graph; then one tbt row per step over the last `L − 1` positions
//! (ring) or every position (stateful).

use std::sync::{Arc, Mutex};

use candle_core::{Device as CDevice, Tensor};
use kvprobe_npu::onnx::window_feed::LogicalFeed;
use kvprobe_reference::{Arithmetic, GraphInput, GraphOptions, Model, OverflowAt, PositionInput};
use kvprobe_schema::{
    CacheDirection, CacheKind, DeclaredWeights, DeviceDescription, GreedyStep, GroupKind,
    MatchedSummary, RuntimeKind,
};

pub use crate::matched_edges::{computes_prefill, models_everything};
use crate::matched_edges::{name, Edges, Round};
pub(crate) use crate::matched_store::Store;
pub use crate::matched_store::{greedy_logits_shared, DriveMemo};
pub use crate::matched_summary::{against_matched, step};
use crate::rings::cache_infos;
use crate::Result;

/// The declared precision of every edge the reference crosses.
#[derive(Debug, Clone)]
pub struct Precision {
    /// Prefill group, tbt group.
    groups: [Edges; 2],
    /// Per layer: K and V, as the ring stores them (the writer's declared quant info: a reader
    /// that declares another one is a fault the matched reference must not copy).
    kv: Vec<[Round; 2]>,
    /// The RoPE θ table (plain convention) when the device takes cos/sin tables as inputs.
    theta: Option<Vec<f32>>,
    /// Ring: a tbt step reads the last `L − 1` positions, a prefill chunk the `prefill_in`
    /// before its first row; stateful: everything.
    pub(crate) ring: bool,
    prefill_in: usize,
    /// The model with the weights the device declares, when they are not the checkpoint's.
    pub(crate) weights: Option<Arc<Model>>,
    /// One line saying what was rounded (results.json and the report).
    pub describe: String,
    /// The arithmetic inside the graph the device declares (fp16: issue 36).
    arithmetic: Arithmetic,
    /// Under fp16, the first op output the matched reference could not hold (every run).
    pub(crate) overflow: Arc<Mutex<Option<OverflowAt>>>,
}

pub(crate) const PREFILL: usize = 0;
pub(crate) const TBT: usize = 1;

impl Precision {
    /// `None` when the device declares an fp32 path everywhere and the checkpoint's weights (the
    /// f32 reference is already precision-matched) or its caches cannot be mapped to layers.
    pub fn of(desc: &DeviceDescription, model: &Model) -> Result<Option<Precision>> {
        let (weights, said) = match &desc.weights {
            DeclaredWeights::Checkpoint => (None, String::new()),
            DeclaredWeights::Int8PerChannel => (
                Some(model.int8_weights()?),
                ", int8 per-channel weights as declared".to_string(),
            ),
            DeclaredWeights::Blocks {
                model: file,
                summary,
            } => (
                Some(model.onnx_declared_weights(file)?),
                format!(", weights as the model file declares them ({summary})"),
            ),
            DeclaredWeights::OpenvinoIr { xml, summary } => (
                Some(model.openvino_weights(xml)?),
                format!(", weights as the IR declares them ({summary})"),
            ),
        };
        let (arithmetic, weights, said) =
            crate::matched_fp16::declared(&desc.arithmetic, model, weights, said)?;
        let Some(mut p) = Precision::of_edges(desc, model, weights.is_some()) else {
            return Ok(None);
        };
        p.describe.push_str(&said);
        p.weights = weights;
        p.arithmetic = arithmetic;
        Ok(Some(p))
    }

    /// The float32 reference through the matched path: no edge, cache or weight rounded.
    pub fn exact(model: &Model) -> Precision {
        let layers = model.config().n_layers;
        Precision::whole(
            Edges::EXACT,
            vec![[Round::Exact; 2]; layers],
            "float32 edges and cache",
        )
    }

    /// The model the matched reference computes with: the declared weights, else `given`.
    pub fn model<'a>(&'a self, given: &'a Model) -> &'a Model {
        self.weights.as_deref().unwrap_or(given)
    }

    /// A device whose every run reads all stored positions (stateful, host cache): `edges` on
    /// both groups, `kv` as stored, f32 arithmetic until `of` sets the declared one.
    fn whole(edges: Edges, kv: Vec<[Round; 2]>, describe: &str) -> Precision {
        Precision {
            groups: [edges; 2],
            kv,
            theta: None,
            ring: false,
            prefill_in: 0,
            weights: None,
            arithmetic: Arithmetic::F32,
            overflow: Arc::default(),
            describe: describe.into(),
        }
    }

    /// The rounding of every declared edge; `None` when there is nothing to round and not
    /// `even_if_exact`.
    fn of_edges(desc: &DeviceDescription, model: &Model, even_if_exact: bool) -> Option<Precision> {
        let n_layers = model.config().n_layers;
        let prefill = desc.group(GroupKind::Prefill)?;
        match desc.runtime {
            RuntimeKind::HostCache => {
                let kv = crate::matched_edges::host_cache_kv(desc, n_layers)?;
                let rounds = !kv.iter().flatten().all(Round::exact);
                (rounds || even_if_exact).then(|| {
                    let said = if rounds {
                        "float32 edges, cache through its declared quant info"
                    } else {
                        "float32 edges and cache"
                    };
                    Precision::whole(Edges::EXACT, kv, said)
                })
            }
            RuntimeKind::Stateful => Some(Precision::whole(
                Edges::FP16,
                vec![[Round::F16; 2]; n_layers],
                "fp16 embeddings, fp16 K/V state and fp16 logits",
            )),
            RuntimeKind::GenaiRing => {
                let pre = Edges::of(prefill);
                let tbt = desc.group(GroupKind::Tbt).map_or(pre, Edges::of);
                let mut kv = vec![[Round::Exact; 2]; n_layers];
                let infos = cache_infos(desc).ok()?;
                for info in &infos {
                    let slot = kv.get_mut(info.layer)?;
                    // 1- and 2-byte entries are integer codes (contract §1.2); 4 bytes float
                    slot[usize::from(info.kind == CacheKind::V)] = match info.elem_bytes {
                        1 | 2 => Round::Quant(info.writer_quant(), 8 * info.elem_bytes as u32),
                        _ => Round::Exact,
                    };
                }
                let prefill_in = prefill
                    .cache_edges
                    .iter()
                    .find(|e| e.direction == CacheDirection::Input)
                    .map_or(desc.cache_len.saturating_sub(desc.prefill_len), |e| {
                        e.length
                    });
                let cache = match infos.first().map(|i| i.elem_bytes) {
                    Some(b @ (1 | 2)) => format!("uint{}", 8 * b),
                    _ => "float32".to_string(),
                };
                let has_pe = pre.pe.iter().any(|r| !r.exact());
                let p = Precision {
                    groups: [pre, tbt],
                    kv,
                    theta: model
                        .rope_inv_freq()
                        .filter(|_| has_pe)
                        .map(|f| kvprobe_npu::driver::theta_from_inv_freq(&f)),
                    ring: true,
                    prefill_in,
                    weights: None,
                    arithmetic: Arithmetic::F32,
                    overflow: Arc::default(),
                    describe: format!(
                        "embeddings {}, RoPE tables {}, cache {cache} through each ring's declared quant info, logits {}",
                        name(&pre.emb),
                        name(&pre.pe[0]),
                        name(&pre.logits)
                    ),
                };
                let all_exact =
                    p.groups.iter().all(Edges::exact) && p.kv.iter().flatten().all(Round::exact);
                (!all_exact || even_if_exact).then_some(p)
            }
        }
    }

    /// The rows' positions as the graph sees them: RoPE tables through the group's pe edges, or
    /// plain position ids.
    fn positions(
        &self,
        model: &Model,
        group: usize,
        rows: std::ops::Range<usize>,
    ) -> PositionInput {
        let Some(theta) = &self.theta else {
            return PositionInput::Ids(rows.map(|x| x as f32).collect());
        };
        let c = model.config();
        let d = theta.len();
        let (mut qc, mut qs, mut kc, mut ks) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for pos in rows {
            // as the genai host builds the tables (float32 angle and values)
            let (mut cos, mut sin) = (vec![0f32; d], vec![0f32; d]);
            kvprobe_npu::rope::cos_sin_row(theta, pos as u64, &mut cos, &mut sin);
            for _ in 0..c.n_heads {
                qc.extend_from_slice(&cos);
                qs.extend_from_slice(&sin);
            }
            for _ in 0..c.n_kv_heads {
                kc.extend_from_slice(&cos);
                ks.extend_from_slice(&sin);
            }
        }
        let pe = self.groups[group].pe;
        for (r, t) in pe.iter().zip([&mut qc, &mut qs, &mut kc, &mut ks]) {
            r.apply(t);
        }
        debug_assert_eq!(qc.len() % d, 0);
        PositionInput::Rope {
            q_cos: qc,
            q_sin: qs,
            k_cos: kc,
            k_sin: ks,
        }
    }
}

/// Logits of the precision-matched reference for greedy steps `0..steps` of `seq` (the prompt of
/// `n` tokens followed by the device's tokens): step 0 is the prefill's last row, step t the tbt
/// row at position `n − 1 + t`.
pub fn greedy_logits(
    model: &Model,
    p: &Precision,
    seq: &[u32],
    n: usize,
    steps: usize,
    cache_len: usize,
    prefill_len: usize,
) -> Result<Vec<Vec<f32>>> {
    let mut out = Vec::with_capacity(steps);
    let geometry = (n, steps, cache_len, prefill_len);
    drive(model, p, seq, geometry, &mut |logits, _, _| {
        out.push(logits);
        Ok(())
    })?;
    Ok(out)
}

/// `[layer][position]` rows `[n_kv · hd]`, as the cache holds them.
pub type LayerRows<'a> = &'a [Vec<Vec<f32>>];
/// What [`drive`] calls after the prefill and each step: (last row's logits, k, v).
pub type OnStep<'a> = dyn FnMut(Vec<f32>, LayerRows, LayerRows) -> Result<()> + 'a;

/// Prefill chunks then tbt rows, as [`greedy_logits`]; `each(last row's logits, k, v)` after the
/// prefill and after every step (kvdiff reads the K/V). `geometry` = (prompt length, steps, cache
/// length, prefill length).
pub fn drive(
    model: &Model,
    p: &Precision,
    seq: &[u32],
    geometry: (usize, usize, usize, usize),
    each: &mut OnStep,
) -> Result<()> {
    drive_from(model, p, seq, geometry, None, each).map(|_| ())
}

/// [`drive`], from step `r` on when `resume` is `(the store after step r − 1, r)`; returns the
/// store after the last step.
pub(crate) fn drive_from(
    model: &Model,
    p: &Precision,
    seq: &[u32],
    (n, steps, cache_len, prefill_len): (usize, usize, usize, usize),
    resume: Option<(Store, usize)>,
    each: &mut OnStep,
) -> Result<Store> {
    let model = p.model(model);
    let (mut store, first) = match resume {
        Some((store, r)) if r >= 1 => (store, r),
        _ => {
            let mut store = Store::new(model);
            let mut last = Vec::new();
            for (a, b, chunk_start) in chunks(n, prefill_len.max(1), p.ring) {
                let from = if p.ring {
                    chunk_start.saturating_sub(p.prefill_in as i64).max(0) as usize
                } else {
                    0
                };
                last = run_rows(model, p, &mut store, (seq, None), a..b, from, PREFILL, 1.0)?;
            }
            each(last, &store.k, &store.v)?;
            (store, 1)
        }
    };
    for t in first..steps {
        let pos = n - 1 + t;
        let from = if p.ring {
            pos.saturating_sub(cache_len - 1)
        } else {
            0
        };
        let logits = run_rows(
            model,
            p,
            &mut store,
            (seq, None),
            pos..pos + 1,
            from,
            TBT,
            1.0,
        )?;
        each(logits, &store.k, &store.v)?;
    }
    Ok(store)
}

/// Prefill chunks as `(first real row, end, chunk start)`: a ring runs the remainder first, its
/// chunk padded at the front (start below the first row, possibly negative); a stateful device
/// runs chunks from the start.
fn chunks(n: usize, pl: usize, ring: bool) -> Vec<(usize, usize, i64)> {
    let mut out = Vec::new();
    let r = if ring { n % pl } else { 0 };
    let mut a = 0;
    if r > 0 {
        out.push((0, r, r as i64 - pl as i64));
        a = r;
    }
    while a < n {
        let b = (a + pl).min(n);
        out.push((a, b, a as i64));
        a = b;
    }
    out
}

/// Rows `rows` of `seq` over the stored positions `from..rows.start` in `group`, the attention
/// scale multiplied by `attn_scale` (1 but for the scale fit, `matched_fit`), under a host's
/// `fed` position ids and visibility instead of `0..t` and causal (`crate::host_feed`); stores
/// their K/V and returns the last row's logits through the logits edge.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_rows(
    model: &Model,
    p: &Precision,
    store: &mut Store,
    (seq, fed): (&[u32], Option<&LogicalFeed>),
    rows: std::ops::Range<usize>,
    from: usize,
    group: usize,
    attn_scale: f32,
) -> Result<Vec<f32>> {
    let (mut logits, _) = run_graph_rows(
        model,
        p,
        store,
        seq,
        rows,
        from,
        (true, attn_scale, fed, None),
        group,
    )?;
    p.groups[group].logits.apply(&mut logits);
    Ok(logits)
}

/// One self-only row of `seq`'s last token over the whole `store`, at the position and under the
/// blocked columns `self_only` gives, through the logits edge (`crate::selfonly_fit`).
pub(crate) fn run_self_only(
    model: &Model,
    p: &Precision,
    store: &mut Store,
    seq: &[u32],
    self_only: (kvprobe_reference::Blocked, usize),
) -> Result<Vec<f32>> {
    let a = seq.len() - 1;
    let spec = (true, 1.0, None, Some(self_only));
    let (mut logits, _) = run_graph_rows(model, p, store, seq, a..a + 1, 0, spec, TBT)?;
    p.groups[TBT].logits.apply(&mut logits);
    Ok(logits)
}

/// One graph run of rows `rows` of `seq` over the stored positions `from..rows.start` (causal
/// inside the chunk), the attention scale multiplied by `attn_scale`; stores the rows' K/V.
/// Returns the raw logits (`last_only`: the last row's) and their row count.
#[allow(clippy::too_many_arguments)]
fn run_graph_rows(
    model: &Model,
    p: &Precision,
    store: &mut Store,
    seq: &[u32],
    rows: std::ops::Range<usize>,
    from: usize,
    (last_only, attn_scale, fed, self_only): (
        bool,
        f32,
        Option<&LogicalFeed>,
        Option<(kvprobe_reference::Blocked, usize)>,
    ),
    group: usize,
) -> Result<(Vec<f32>, usize)> {
    let (a, b) = (rows.start, rows.end);
    let t = b - a;
    let nh = model.config().n_heads;
    let mut hidden: Vec<f32> = model.embed(&seq[a..b])?.flatten_all()?.to_vec1()?;
    p.groups[group].emb.apply(&mut hidden);
    let w = a - from;
    let cols = w + t;
    let mut mask = vec![false; t * nh * cols];
    for i in 0..t {
        for h in 0..nh {
            let row = &mut mask[(i * nh + h) * cols..(i * nh + h + 1) * cols];
            for (j, m) in row.iter_mut().enumerate() {
                // a mask hypothesis' self-only row: only itself allowed, the rest enter as
                // `blocked` says
                *m = match (self_only, fed) {
                    (Some(_), _) => j == w + i,
                    (None, Some(f)) => f.sees(a + i, from + j),
                    (None, None) => j <= w + i,
                };
            }
        }
    }
    let positions = match (self_only, fed) {
        // a self-only row over a device's state: its own position, not its column's
        (Some((_, pos)), _) => p.positions(model, group, pos..pos + t),
        (None, Some(f)) => {
            PositionInput::Ids(f.positions[a..b].iter().map(|&x| x as f32).collect())
        }
        (None, None) => p.positions(model, group, a..b),
    };
    let hidden_size = model.config().hidden_size;
    let out = model.run_graph(&GraphInput {
        hidden: Tensor::from_vec(hidden, (t, hidden_size), &CDevice::Cpu)?,
        positions,
        past: store.past(from, a)?,
        mask,
        graph: GraphOptions {
            arithmetic: p.arithmetic,
            attn_scale,
            blocked: self_only.map(|(b, _)| b),
            ..GraphOptions::default()
        },
        last_only,
    })?;
    if let (Some(o), Ok(mut first)) = (out.overflow, p.overflow.lock()) {
        first.get_or_insert(o);
    }
    store.push(&out.new_kv, &p.kv)?;
    let vocab = model.config().vocab_size;
    let n = out.rows;
    let logits = if last_only {
        out.logits[(n - 1) * vocab..n * vocab].to_vec()
    } else {
        out.logits
    };
    Ok((logits, n))
}

/// Fills each step's three-way comparison and near-tie flag from the device's and the f32
/// reference's logits (`reference[step]`), running the precision-matched reference when the device
/// declares one. Without it the band is the f32 noise floor, so only exact ties count.
pub fn three_way(
    (model, memo): (&Model, &DriveMemo),
    desc: &DeviceDescription,
    seq: &[u32],
    n: usize,
    device: &[Vec<f32>],
    reference: &[&[f32]],
    steps: &mut [GreedyStep],
) -> Result<Option<MatchedSummary>> {
    let positions: Vec<usize> = (0..device.len()).map(|i| n - 1 + i).collect();
    three_way_at(
        (model, memo),
        desc,
        seq,
        n,
        &positions,
        device,
        reference,
        steps,
    )
}

/// [`three_way`] for logits compared at some positions only (`positions[i]` ≥ `n − 1`, rising):
/// the matched reference runs the prompt of `n` tokens, then every later token of `seq` one row
/// at a time up to the last compared position (a chat's later turns fed as single rows: a
/// stateful device's K/V rounding does not depend on how many rows a run had).
#[allow(clippy::too_many_arguments)]
pub fn three_way_at(
    (model, memo): (&Model, &DriveMemo),
    desc: &DeviceDescription,
    seq: &[u32],
    n: usize,
    positions: &[usize],
    device: &[Vec<f32>],
    reference: &[&[f32]],
    steps: &mut [GreedyStep],
) -> Result<Option<MatchedSummary>> {
    let precision = Precision::of(desc, model)?;
    let rows = positions.last().map_or(0, |&last| last + 2 - n);
    let geometry = (n, rows, desc.cache_len, desc.prefill_len);
    let matched = match &precision {
        Some(p) => Some(greedy_logits_shared((memo, model), p, seq, geometry)?),
        None => None,
    };
    for (i, st) in steps.iter_mut().enumerate() {
        let r = reference[i];
        let floor = F32_BAND * r.iter().fold(0f32, |a, x| a.max(x.abs())) as f64;
        let band = match &matched {
            Some(m) => {
                let step = step(&m[positions[i] + 1 - n], r, &device[i]);
                st.matched = Some(step);
                step.band.max(floor)
            }
            None => floor,
        };
        let c = &st.comparison;
        st.reference_margin = if c.top1_match {
            0.0
        } else {
            (r[c.reference_top1 as usize] - r[c.device_top1 as usize]) as f64
        };
        st.near_tie = !c.top1_match && st.reference_margin <= band;
    }
    Ok(precision.map(|p| {
        let over = p.overflow.lock().ok().and_then(|o| *o);
        let over = over.map(|o| crate::matched_fp16::overflow_text(&o));
        let said = match &over {
            Some(o) => format!("{}; {o}", p.describe),
            None => p.describe,
        };
        crate::matched_summary::summary(said, over, steps)
    }))
}

/// Every row's logits of one prefill chunk of `ids` from position 0 (no past), at the declared
/// precision: row i is the last row of the single-chunk prefix `ids[..=i]`.
pub fn chunk_rows(model: &Model, p: &Precision, ids: &[u32]) -> Result<Vec<Vec<f32>>> {
    let model = p.model(model);
    let mut store = Store::new(model);
    let (logits, rows) = run_graph_rows(
        model,
        p,
        &mut store,
        ids,
        0..ids.len(),
        0,
        (false, 1.0, None, None),
        PREFILL,
    )?;
    let vocab = model.config().vocab_size;
    Ok((0..rows)
        .map(|r| {
            let mut row = logits[r * vocab..(r + 1) * vocab].to_vec();
            p.groups[PREFILL].logits.apply(&mut row);
            row
        })
        .collect())
}

/// Relative logit noise of an f32 computation (op order): the band of a device without a
/// declared lower precision.
const F32_BAND: f64 = 1e-5;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_matched_margin_is_the_matched_gap_to_the_devices_top1() {
        let matched = [0.0, 3.0, 1.0, 2.5];
        let reference = [0.0, 3.0, 1.0, 2.5];
        let agree = step(&matched, &reference, &[0.0, 9.0, 0.0, 0.0]);
        assert_eq!((agree.matched_top1, agree.matched_margin), (1, 0.0));
        let flip = step(&matched, &reference, &[0.0, 0.0, 0.0, 9.0]);
        assert_eq!((flip.matched_top1, flip.matched_margin), (1, 0.5));
    }

    #[test]
    fn ring_prefill_runs_the_remainder_first_padded_at_the_front() {
        // n = 10, P = 4: rows 0..2 in a chunk starting at −2, then 2..6 and 6..10
        assert_eq!(chunks(10, 4, true), vec![(0, 2, -2), (2, 6, 2), (6, 10, 6)]);
        assert_eq!(chunks(8, 4, true), vec![(0, 4, 0), (4, 8, 4)]);
        assert_eq!(chunks(3, 4, true), vec![(0, 3, -1)]);
    }

    #[test]
    fn stateful_prefill_runs_from_the_start() {
        assert_eq!(chunks(10, 4, false), vec![(0, 4, 0), (4, 8, 4), (8, 10, 8)]);
    }
}
