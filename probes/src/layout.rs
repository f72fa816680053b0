//! `layout`: which memory layout and placement the prefill writer used, from the ring bytes
//! (contract §1.8 `get_cache_buffers`, §7.4, §7.5 "hardware evidence").
//!
//! After a prefill of the prompt, the last chunk's `N = P` entries sit at slots `(n − N …
//! n − 1) mod L` when the offset arithmetic is right. For each candidate layout (token-major,
//! feature-major, f8cr) decoded with the writer's window length `N`, and each slot shift, the
//! decoded entries are correlated (Pearson, so independent of the edge's scale and zero point)
//! with the reference K/V of the same positions. A clean token-major writer scores high at shift 0.

use kvprobe_npu::layout::{check_supported, decode, StreamShape};
use kvprobe_schema::{Layout, LayoutCache, LayoutFinding, LayoutScore};

use crate::cache_io;
use crate::metrics::pearson;
use crate::rings::{cache_infos, codes, reference_entries, CacheInfo};
use crate::session::Session;
use crate::Result;

/// Shifts stored in the finding (the search itself covers the whole ring on small caches).
const STORED_SHIFTS: i64 = 8;
/// Caches up to this length are searched at every slot shift; longer ones at ±`STORED_SHIFTS`·2.
const FULL_SEARCH_MAX: usize = 256;

pub fn run(s: &mut Session) -> Result<LayoutFinding> {
    let g = s.geometry();
    let infos = cache_infos(s.describe())?;
    s.progress.phase("layout", infos.len() as u64 + 1);
    let prompt = s.prompt_ref()?;
    s.prefill_prompt()?;
    let rings = cache_io::read(s.dev, "after the prompt's prefill (layout probe)")?;
    s.progress.inc(1);
    let l = g.cache_len as i64;
    let search: Vec<i64> = if g.cache_len <= FULL_SEARCH_MAX {
        (-(l / 2)..l - l / 2).collect()
    } else {
        (-2 * STORED_SHIFTS..=2 * STORED_SHIFTS).collect()
    };
    let nh = s.model.config().n_heads;
    let mut jobs = Vec::with_capacity(infos.len());
    for info in &infos {
        let ring = rings.get(&info.cache_id).ok_or_else(|| {
            crate::Error::Device(format!(
                "cache_buffers() has no ring for cache {}",
                info.cache_id
            ))
        })?;
        jobs.push((info, ring, reference_entries(&prompt.state, info, nh)?));
    }
    // each ring is scored on its own (every layout at every shift: seconds per model on one core)
    let mut caches: Vec<LayoutCache> = {
        use rayon::prelude::*;
        jobs.par_iter()
            .map(|(info, ring, reference)| {
                score_cache(info, ring, reference, g.prompt_len, g.cache_len, &search)
            })
            .collect()
    };
    s.progress.inc(caches.len() as u64);
    let mut shifts: Vec<i64> = (-STORED_SHIFTS..=STORED_SHIFTS).collect();
    for c in &caches {
        if !shifts.contains(&c.best_shift) {
            shifts.push(c.best_shift);
        }
    }
    shifts.sort_unstable();
    for c in &mut caches {
        c.scores.retain(|x| shifts.contains(&x.shift));
    }
    let writer_layout =
        majority(caches.iter().map(|c| c.best_layout)).unwrap_or(Layout::TokenMajor);
    let writer_shift = majority(caches.iter().map(|c| c.best_shift)).unwrap_or(0);
    let writer_score =
        caches.iter().map(|c| c.best_score).sum::<f64>() / caches.len().max(1) as f64;
    Ok(LayoutFinding {
        caches,
        shifts,
        writer_layout,
        writer_shift,
        writer_score,
    })
}

/// Scores of one ring under every layout and shift.
pub fn score_cache(
    info: &CacheInfo,
    ring: &[u8],
    reference: &[f32],
    n: usize,
    l: usize,
    shifts: &[i64],
) -> LayoutCache {
    let f = info.features;
    let e = info.entry_size;
    let ep = info.padded_entry_size;
    let win = info.prefill_out_len.min(l);
    let shape = StreamShape {
        tokens: win,
        features: f,
        elem_bytes: info.elem_bytes,
        head_dim: f,
    };
    let mut scores = Vec::new();
    let mut stream = Vec::with_capacity(win * e);
    let mut block = Vec::new();
    let mut vals = Vec::new();
    for layout in Layout::ALL {
        if check_supported(layout, f).is_err() {
            continue;
        }
        for &shift in shifts {
            let start = (n as i64 - win as i64 + shift).rem_euclid(l as i64) as usize;
            stream.clear();
            for i in 0..win {
                let slot = (start + i) % l;
                let o = slot * ep;
                match ring.get(o..o + e) {
                    Some(b) => stream.extend_from_slice(b),
                    None => stream.extend(std::iter::repeat_n(0u8, e)),
                }
            }
            decode(layout, shape, &stream, &mut block);
            let (mut sum, mut k) = (0f64, 0usize);
            for i in 0..win {
                let p = n as i64 - win as i64 + i as i64;
                if p < 0 {
                    continue;
                }
                let p = p as usize;
                codes(&block[i * e..(i + 1) * e], info.elem_bytes, &mut vals);
                sum += pearson(&vals, &reference[p * f..(p + 1) * f]);
                k += 1;
            }
            scores.push(LayoutScore {
                layout,
                shift,
                score: if k > 0 { sum / k as f64 } else { 0.0 },
            });
        }
    }
    let best = scores
        .iter()
        .max_by(|a, b| {
            a.score
                .total_cmp(&b.score)
                .then(b.shift.abs().cmp(&a.shift.abs()))
        })
        .cloned()
        .unwrap_or(LayoutScore {
            layout: Layout::TokenMajor,
            shift: 0,
            score: 0.0,
        });
    let token_major_score = scores
        .iter()
        .find(|x| x.layout == Layout::TokenMajor && x.shift == 0)
        .map_or(0.0, |x| x.score);
    LayoutCache {
        cache_id: info.cache_id,
        layer: Some(info.layer),
        kind: Some(info.kind),
        scores,
        best_layout: best.layout,
        best_shift: best.shift,
        best_score: best.score,
        token_major_score,
    }
}

fn majority<T: PartialEq + Copy>(it: impl Iterator<Item = T>) -> Option<T> {
    let mut counts: Vec<(T, usize)> = Vec::new();
    for x in it {
        match counts.iter_mut().find(|(y, _)| *y == x) {
            Some((_, c)) => *c += 1,
            None => counts.push((x, 1)),
        }
    }
    counts.into_iter().max_by_key(|&(_, c)| c).map(|(x, _)| x)
}

/// `kvprobe layout`.
pub struct LayoutProbe;

impl crate::probe::Probe for LayoutProbe {
    fn name(&self) -> &'static str {
        "layout"
    }

    fn about(&self) -> &'static str {
        "Which layout and placement the prefill writer used, from the ring bytes"
    }

    fn run(
        &self,
        s: &mut crate::session::Session,
        _opts: &crate::probe::ProbeOptions,
        into: &mut kvprobe_schema::ProbeFindings,
    ) -> Result<()> {
        into.layout = Some(run(s)?);
        Ok(())
    }
}
