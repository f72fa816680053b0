//! `layout --infer`: the cache layout solved from the ring bytes instead of chosen from the named
//! layouts (issue 10 item 1; contract §7.2, §7.4).
//!
//! After a prefill of the prompt, each cache edge's ring is decoded with its declared writer
//! quant info and searched for the strided map ([`map`]) and slot shift that put the prompt's
//! reference K/V (after RoPE) where the bytes are ([`solve`]). An edge is *explained* when its
//! best map finds at least [`THRESHOLD`] of the prompt's elements within [`TOLERANCE_STEPS`]
//! quantisation steps of the reference; otherwise it is reported unexplained, with the closest
//! map for the record.

pub mod map;
pub mod solve;

use std::collections::BTreeMap;

use kvprobe_npu::quant::{dequantize, is_identity};
use kvprobe_schema::{InferredCache, LayoutInferFinding};

use crate::cache_io;
use crate::rings::{cache_infos, reference_entries, CacheInfo};
use crate::session::Session;
use crate::{Error, Result};
use map::{candidates, StridedMap};
use solve::{solve, EdgeData, SolveOptions};

/// An element is explained within this many quantisation steps of the reference.
pub const TOLERANCE_STEPS: f64 = 1.5;
/// Fraction of the prompt's elements the best map must explain. Emulated healthy edges explain
/// 0.97-1.0 with float weights and 0.85-0.91 with int8 weights (SmolLM2, every layer); a map
/// that is right on half of the digits (e.g. the right order over half the features) explains
/// 0.5-0.6, and the best map over a random permutation or noise explains 0.02-0.2 (chance
/// agreement within the tolerance). 0.75 sits between a noisy right map and a half-right one.
pub const THRESHOLD: f64 = 0.75;
/// Caches up to this length are searched at every slot shift; longer ones within
/// ±max(2P, [`MIN_SHIFT_SPAN`]).
const FULL_SHIFT_SEARCH_MAX: usize = 512;
const MIN_SHIFT_SPAN: i64 = 64;
/// An edge solved at the shifts of earlier edges is accepted at this fraction; below it, the
/// edge gets the full shift search.
const PRIOR_SHIFT_ACCEPT: f64 = 0.9;
/// Columns of the stored slot heatmap (longer rings are binned).
const MAX_HEAT_COLUMNS: usize = 256;
/// Bins of the stored per-entry-column profile.
const MAX_COLUMN_BINS: usize = 64;

pub fn run(s: &mut Session) -> Result<LayoutInferFinding> {
    let g = s.geometry();
    let infos = cache_infos(s.describe())?;
    s.progress.phase("layout --infer", infos.len() as u64 + 1);
    let prompt = s.prompt_ref()?;
    // One prefill run: every layer's K/V then come from a graph that read no cache, so a layout
    // or offset fault shows as bytes in another order or place, never as later chunks computed
    // from a corrupted context (which no map of the reference could explain).
    let used = g.prompt_len.min(g.prefill_len);
    let ids = s.ids[..used].to_vec();
    s.prefill(&ids)?;
    let rings = cache_io::read(s.dev, "after one prefill chunk (layout --infer)")?;
    s.progress.inc(1);
    let nh = s.model.config().n_heads;
    let head_dim = s.describe().shape.head_dim;
    let shifts = shift_range(g.cache_len, g.prefill_len);
    let mut cands: BTreeMap<(usize, usize), Vec<StridedMap>> = BTreeMap::new();
    let mut caches = Vec::with_capacity(infos.len());
    let mut window = 0;
    let mut features = 0;
    let mut n_cands = 0;
    let mut found_shifts: Vec<i64> = Vec::new();
    for info in &infos {
        let bytes = rings.get(&info.cache_id).ok_or_else(|| {
            Error::Device(format!(
                "cache_buffers() has no ring for cache {}",
                info.cache_id
            ))
        })?;
        let ring = decode_ring(info, bytes, g.cache_len)?;
        // causal: the first `used` positions of the prompt's K/V are those of the prefix
        let mut reference = reference_entries(&prompt.state, info, nh)?;
        reference.truncate(used * info.features);
        let win = info.prefill_out_len.max(1);
        let list = cands
            .entry((win, info.features))
            .or_insert_with(|| candidates(win, info.features));
        (window, features, n_cands) = (win, info.features, list.len());
        let d = EdgeData {
            ring: &ring,
            reference: &reference,
            prompt_len: used,
            chunk: g.prefill_len,
            window: win,
            cache_len: g.cache_len,
            features: info.features,
            tolerance: tolerance(info, &reference),
        };
        // The read offset is one register shared by every cache (contract §1.6): the shifts
        // found so far are tried first, the whole range only when they explain too little.
        let opts = SolveOptions::default();
        let prior = (!found_shifts.is_empty())
            .then(|| solve(&d, list, &found_shifts, &opts))
            .filter(|s| s.best.fraction >= PRIOR_SHIFT_ACCEPT);
        let sol = match prior {
            Some(s) => s,
            None => solve(&d, list, &shifts, &opts),
        };
        if !found_shifts.contains(&sol.best.shift) && sol.best.fraction >= THRESHOLD {
            found_shifts.push(sol.best.shift);
        }
        caches.push(edge_result(info, sol, head_dim));
        s.progress.inc(1);
    }
    let mut f = summarise(caches, window, features, n_cands, shifts.len());
    f.prompt_tokens = used;
    Ok(f)
}

/// Slot shifts searched for a ring of `l` entries and prefill length `p`.
pub fn shift_range(l: usize, p: usize) -> Vec<i64> {
    let l = l as i64;
    if l as usize <= FULL_SHIFT_SEARCH_MAX {
        (-(l / 2)..l - l / 2).collect()
    } else {
        let span = (2 * p as i64).max(MIN_SHIFT_SPAN).min(l / 2);
        (-span..=span).collect()
    }
}

/// `L × C` dequantised elements: the first `E` bytes of every slot, as the writer quantised them
/// (uint8, little-endian uint16, or float32 for float edges).
pub fn decode_ring(info: &CacheInfo, bytes: &[u8], l: usize) -> Result<Vec<f32>> {
    let (e, ep, b) = (info.entry_size, info.padded_entry_size, info.elem_bytes);
    if bytes.len() < l * ep || e > ep || !matches!(b, 1 | 2 | 4) {
        return Err(Error::Device(format!(
            "cache {}: ring of {} bytes with {}-byte elements does not hold {l} slots of {ep} bytes",
            info.cache_id,
            bytes.len(),
            b
        )));
    }
    let q = info.writer_quant();
    let mut out = Vec::with_capacity(l * info.features);
    for slot in 0..l {
        let entry = &bytes[slot * ep..slot * ep + e];
        for el in entry.chunks_exact(b) {
            let code = match b {
                1 => el[0] as f32,
                2 => u16::from_le_bytes([el[0], el[1]]) as f32,
                _ => f32::from_le_bytes([el[0], el[1], el[2], el[3]]),
            };
            out.push(dequantize(code, &q));
        }
    }
    Ok(out)
}

/// Absolute tolerance: [`TOLERANCE_STEPS`] steps of the writer's quantisation, counted at 8-bit
/// resolution at the finest: a 16-bit edge's own step is far below the error the other quantised
/// edges (uint16 embeddings, uint8 mask) already put into K/V, and a float edge has no step. The
/// 8-bit step is that of the declared range, or of the reference's range for a float edge.
pub fn tolerance(info: &CacheInfo, reference: &[f32]) -> f32 {
    let q = info.writer_quant();
    let declared = q.max - q.min;
    let step = if info.elem_bytes != 4 && !is_identity(&q) && declared.is_finite() && declared > 0.0
    {
        (q.scale.abs()).max(declared / 255.0)
    } else {
        let (lo, hi) = reference
            .iter()
            .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &x| {
                (a.min(x), b.max(x))
            });
        ((hi - lo) / 255.0).max(f32::EPSILON)
    };
    TOLERANCE_STEPS as f32 * step
}

pub use kvprobe_schema::edge_name;

fn edge_result(info: &CacheInfo, sol: solve::Solution, head_dim: usize) -> InferredCache {
    let b = &sol.best;
    let runner = sol.runner_up.as_ref();
    InferredCache {
        cache_id: info.cache_id,
        layer: Some(info.layer),
        kind: Some(info.kind),
        explained: b.fraction >= THRESHOLD,
        fraction_explained: b.fraction,
        residual_cosine: b.cosine,
        shift: b.shift,
        formula: b.map.formula(),
        description: b.map.description(head_dim),
        digits: b.map.digits(),
        tile: b.map.tile,
        named: b.map.named(head_dim),
        runner_up: runner.map(|r| format!("{} at shift {:+}", r.map.formula(), r.shift)),
        runner_up_fraction: runner.map_or(0.0, |r| r.fraction),
        slot_fraction: bin(&sol.slot_fraction, MAX_HEAT_COLUMNS),
        column_fraction: bin(&sol.column_fraction, MAX_COLUMN_BINS),
    }
}

/// At most `max` bins: the mean of the bin's members that hold prompt elements, −1 when none
/// does.
fn bin(v: &[f32], max: usize) -> Vec<f32> {
    if v.len() <= max {
        return v.to_vec();
    }
    let per = v.len().div_ceil(max);
    v.chunks(per)
        .map(|c| {
            let valid: Vec<f32> = c.iter().copied().filter(|x| *x >= 0.0).collect();
            if valid.is_empty() {
                -1.0
            } else {
                valid.iter().sum::<f32>() / valid.len() as f32
            }
        })
        .collect()
}

fn summarise(
    caches: Vec<InferredCache>,
    window: usize,
    features: usize,
    candidates: usize,
    shifts: usize,
) -> LayoutInferFinding {
    let mut counts: Vec<((String, i64), usize)> = Vec::new();
    for c in caches.iter().filter(|c| c.explained) {
        let key = (c.formula.clone(), c.shift);
        match counts.iter_mut().find(|(k, _)| *k == key) {
            Some((_, n)) => *n += 1,
            None => counts.push((key, 1)),
        }
    }
    // ties go to the edge met first (K0 before V0 before K1 ...)
    let top = counts.iter().map(|(_, n)| *n).max().unwrap_or(0);
    let majority = counts
        .iter()
        .find(|(_, n)| *n == top)
        .map(|(k, _)| k.clone());
    let description = majority.as_ref().and_then(|(f, s)| {
        caches
            .iter()
            .find(|c| c.formula == *f && c.shift == *s)
            .map(|c| c.description.clone())
    });
    let outlier_edges = caches
        .iter()
        .filter(|c| {
            !c.explained
                || majority
                    .as_ref()
                    .is_some_and(|(f, s)| c.formula != *f || c.shift != *s)
        })
        .map(|c| edge_name(c.layer, c.kind, c.cache_id))
        .collect();
    LayoutInferFinding {
        prompt_tokens: 0,
        unexplained: caches.iter().filter(|c| !c.explained).count(),
        caches,
        window,
        features,
        candidates,
        shifts_searched: shifts,
        tolerance_steps: TOLERANCE_STEPS,
        threshold: THRESHOLD,
        writer_description: description,
        writer_shift: majority.as_ref().map(|(_, s)| *s),
        writer_formula: majority.map(|(f, _)| f),
        outlier_edges,
    }
}

/// One line for a report or a verdict's evidence.
pub fn evidence(f: &LayoutInferFinding) -> String {
    f.evidence()
}

/// `kvprobe layout --infer`.
pub struct LayoutInferProbe;

impl crate::probe::Probe for LayoutInferProbe {
    fn name(&self) -> &'static str {
        "layout --infer"
    }

    fn about(&self) -> &'static str {
        "Solve the layout from the ring bytes (any strided map, per cache edge) instead of trying the named layouts"
    }

    fn flag_of(&self) -> Option<(&'static str, &'static str)> {
        Some(("layout", "infer"))
    }

    fn run(
        &self,
        s: &mut crate::session::Session,
        _opts: &crate::probe::ProbeOptions,
        into: &mut kvprobe_schema::ProbeFindings,
    ) -> Result<()> {
        into.layout_infer = Some(run(s)?);
        Ok(())
    }
}
