//! The solver: which strided map and slot shift put the prompt's reference K/V where the ring
//! holds them. Pure: ring values and reference in, the best explanation out.
//!
//! Prefill writes the prompt in chunks of `P` positions, remainder first (contract §2.3): chunk
//! `k` covers positions `a_k … a_k + P − 1` with `a_0 = n − ⌈n/P⌉·P`, and streams its window of
//! `N` entries through the writer's layout into the slots from `a_k + shift` (contract §7.4).
//! Under a hypothesis (map, shift) the prompt element `(p, c)` therefore sits at slot
//! `a_k + shift + ⌊ℓ(t, c)/C⌋` (mod L), element `ℓ(t, c) mod C`, with `t = p − a_k`.
//!
//! Stage 1 ranks every (map, shift) on a fixed sample of prompt elements: first by how many
//! sample elements the ring holds within the tolerance of the reference, then by a cosine with
//! each side centred by the reference's per-feature mean over the prompt (so that a map finding
//! the right feature in the wrong token does not score on the channel profile alone). Counting
//! comes first because it is robust to bytes that are wrong for another reason (zeroed halves
//! of entries), which would swamp any correlation. Stage 2 checks the best few on every prompt
//! element, and the best is the one explaining the largest fraction.

use super::map::StridedMap;

/// One cache edge's bytes (decoded) and reference.
pub struct EdgeData<'a> {
    /// Dequantised ring: `L` slots × `C` elements (the first `E` bytes of each slot).
    pub ring: &'a [f32],
    /// Reference K or V after RoPE, token-major `[n][C]`.
    pub reference: &'a [f32],
    pub prompt_len: usize,
    /// `P`: positions per prefill run.
    pub chunk: usize,
    /// `N`: entries the writer streams per run.
    pub window: usize,
    pub cache_len: usize,
    pub features: usize,
    /// Absolute tolerance for "explained".
    pub tolerance: f32,
}

pub struct SolveOptions {
    /// Prompt elements in the stage-1 sample.
    pub sample: usize,
    /// (map, shift) pairs checked in full.
    pub keep: usize,
}

impl Default for SolveOptions {
    fn default() -> Self {
        SolveOptions {
            sample: 96,
            keep: 16,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Scored {
    pub map: StridedMap,
    pub shift: i64,
    pub fraction: f64,
    pub cosine: f64,
}

#[derive(Debug, Clone)]
pub struct Solution {
    pub best: Scored,
    pub runner_up: Option<Scored>,
    /// Per slot: explained fraction of the prompt elements the best map puts there, −1 if none.
    pub slot_fraction: Vec<f32>,
    /// The same per element column of an entry.
    pub column_fraction: Vec<f32>,
}

/// Prompt element `(p, c)` → `(relative slot a_k + ⌊ℓ/C⌋, element ℓ mod C)`, or `None` when
/// its window row lies outside the writer's window.
fn place(d: &EdgeData, m: &StridedMap, p: usize, c: usize) -> Option<(i64, usize)> {
    let p_len = d.chunk.max(1) as i64;
    let chunks = d.prompt_len.div_ceil(d.chunk.max(1)) as i64;
    let a0 = d.prompt_len as i64 - chunks * p_len;
    let k = (p as i64 - a0) / p_len;
    let t = (p as i64 - a0 - k * p_len) as usize;
    if t >= d.window {
        return None;
    }
    let e = m.position(t, c);
    Some((a0 + k * p_len + (e / d.features) as i64, e % d.features))
}

/// Per-feature mean of the reference over the prompt (the global mean for prompts too short to
/// have a per-feature profile).
fn centres(d: &EdgeData) -> Vec<f32> {
    let (n, c) = (d.prompt_len, d.features);
    if n < 4 {
        let all = d.reference.iter().map(|&x| x as f64).sum::<f64>() / (n * c).max(1) as f64;
        return vec![all as f32; c];
    }
    let mut mu = vec![0f64; c];
    for row in d.reference.chunks_exact(c) {
        for (m, &x) in mu.iter_mut().zip(row) {
            *m += x as f64;
        }
    }
    mu.iter().map(|m| (m / n as f64) as f32).collect()
}

/// A fixed pseudo-random sample of prompt elements covering every position in turn.
fn sample(n: usize, c: usize, size: usize) -> Vec<(usize, usize)> {
    if n * c <= size {
        return (0..n).flat_map(|p| (0..c).map(move |f| (p, f))).collect();
    }
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..size)
        .map(|i| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (i % n, (state >> 33) as usize % c)
        })
        .collect()
}

fn cosine(sxy: f64, sxx: f64, syy: f64) -> f64 {
    if sxx <= 0.0 || syy <= 0.0 {
        0.0
    } else {
        sxy / (sxx * syy).sqrt()
    }
}

/// (explained, total) per ring slot and per element column of an entry.
struct Counts {
    slots: Vec<(u32, u32)>,
    columns: Vec<(u32, u32)>,
}

impl Counts {
    fn fractions(v: &[(u32, u32)]) -> Vec<f32> {
        v.iter()
            .map(|&(h, t)| if t == 0 { -1.0 } else { h as f32 / t as f32 })
            .collect()
    }
}

/// Full check of one hypothesis: (fraction explained, residual cosine, counts).
fn full_check(d: &EdgeData, mu: &[f32], m: &StridedMap, shift: i64) -> (f64, f64, Counts) {
    let l = d.cache_len as i64;
    let c = d.features;
    let mut slots = vec![(0u32, 0u32); d.cache_len];
    let mut columns = vec![(0u32, 0u32); c];
    let (mut hit, mut total) = (0usize, 0usize);
    let (mut sxy, mut sxx, mut syy) = (0f64, 0f64, 0f64);
    for (p, row) in d.reference.chunks_exact(c).take(d.prompt_len).enumerate() {
        for (f, (&y, &centre)) in row.iter().zip(mu).enumerate() {
            let Some((rs, e)) = place(d, m, p, f) else {
                continue;
            };
            let slot = (rs + shift).rem_euclid(l) as usize;
            let x = d.ring[slot * c + e];
            let ok = (x - y).abs() <= d.tolerance;
            total += 1;
            hit += ok as usize;
            slots[slot].0 += ok as u32;
            slots[slot].1 += 1;
            columns[e].0 += ok as u32;
            columns[e].1 += 1;
            let (xc, yc) = ((x - centre) as f64, (y - centre) as f64);
            sxy += xc * yc;
            sxx += xc * xc;
            syy += yc * yc;
        }
    }
    let frac = if total == 0 {
        0.0
    } else {
        hit as f64 / total as f64
    };
    (frac, cosine(sxy, sxx, syy), Counts { slots, columns })
}

/// The (map, shift) that best explains the ring, and the runner-up.
pub fn solve(d: &EdgeData, cands: &[StridedMap], shifts: &[i64], opts: &SolveOptions) -> Solution {
    let l = d.cache_len.max(1);
    let c = d.features;
    let mu = centres(d);
    let pts = sample(d.prompt_len, c, opts.sample);
    let ys: Vec<f64> = pts
        .iter()
        .map(|&(p, f)| (d.reference[p * c + f] - mu[f]) as f64)
        .collect();
    let syy: f64 = ys.iter().map(|y| y * y).sum();
    let shifts_mod: Vec<usize> = shifts
        .iter()
        .map(|s| s.rem_euclid(l as i64) as usize)
        .collect();
    // stage 1: per map, its two best shifts by (sample elements within tolerance, cosine)
    let mut ranked: Vec<(f64, usize, usize)> = Vec::with_capacity(2 * cands.len());
    let mut rel: Vec<(usize, usize, f32, f32, f64)> = Vec::with_capacity(pts.len());
    let tol = d.tolerance;
    for (mi, m) in cands.iter().enumerate() {
        rel.clear();
        for (&(p, f), &y) in pts.iter().zip(&ys) {
            if let Some((rs, e)) = place(d, m, p, f) {
                let raw = d.reference[p * c + f];
                rel.push((rs.rem_euclid(l as i64) as usize, e, mu[f], raw, y));
            }
        }
        let mut top = [(f64::NEG_INFINITY, 0usize); 2];
        for (si, &s) in shifts_mod.iter().enumerate() {
            let (mut sxy, mut sxx, mut hits) = (0f64, 0f64, 0usize);
            for &(rs, e, centre, raw, y) in &rel {
                let mut slot = rs + s;
                if slot >= l {
                    slot -= l;
                }
                let v = d.ring[slot * c + e];
                hits += ((v - raw).abs() <= tol) as usize;
                let x = (v - centre) as f64;
                sxy += x * y;
                sxx += x * x;
            }
            // hits decide (robust to bytes that are wrong for another reason, e.g. zeroed
            // halves of entries); the cosine, in (−1, 1), only orders equal hit counts
            let score = hits as f64 * 4.0 + cosine(sxy, sxx, syy);
            if score > top[0].0 {
                top[1] = top[0];
                top[0] = (score, si);
            } else if score > top[1].0 {
                top[1] = (score, si);
            }
        }
        for (score, si) in top {
            if score.is_finite() {
                ranked.push((score, mi, si));
            }
        }
    }
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    ranked.truncate(opts.keep.max(2));
    // stage 2: every prompt element for the best few
    let mut checked: Vec<(Scored, Counts)> = ranked
        .iter()
        .map(|&(_, mi, si)| {
            let shift = shifts[si];
            let (fraction, cosine, slots) = full_check(d, &mu, &cands[mi], shift);
            (
                Scored {
                    map: cands[mi].clone(),
                    shift,
                    fraction,
                    cosine,
                },
                slots,
            )
        })
        .collect();
    let rank = |m: &StridedMap| cands.iter().position(|x| x == m).unwrap_or(usize::MAX);
    checked.sort_by(|(a, _), (b, _)| {
        b.fraction
            .total_cmp(&a.fraction)
            .then(b.cosine.total_cmp(&a.cosine))
            .then(a.map.complexity().cmp(&b.map.complexity()))
            .then(a.shift.abs().cmp(&b.shift.abs()))
            .then(rank(&a.map).cmp(&rank(&b.map)))
    });
    let mut it = checked.into_iter();
    let (best, counts) = it.next().unwrap_or_else(|| {
        let map = StridedMap::token_major(d.window, c);
        let (fraction, cosine, slots) = full_check(d, &mu, &map, 0);
        (
            Scored {
                map,
                shift: 0,
                fraction,
                cosine,
            },
            slots,
        )
    });
    let runner_up = it.map(|(s, _)| s).next();
    Solution {
        best,
        runner_up,
        slot_fraction: Counts::fractions(&counts.slots),
        column_fraction: Counts::fractions(&counts.columns),
    }
}

#[cfg(test)]
mod tests {
    use super::super::map::candidates;
    use super::*;
    use kvprobe_npu::layout::{encode, StreamShape};
    use kvprobe_schema::Layout;

    /// Reference values with a per-feature profile and per-token variation, like K/V.
    fn reference(n: usize, c: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        let mut next = move || {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        };
        let profile: Vec<f32> = (0..c).map(|_| 4.0 * next()).collect();
        (0..n)
            .flat_map(|_| profile.clone())
            .map(|p| p + next())
            .collect()
    }

    /// Prompt tokens, elements per entry, prefill rows (= window), ring length, head dim.
    #[derive(Clone, Copy)]
    struct Geo {
        n: usize,
        c: usize,
        p: usize,
        l: usize,
        hd: usize,
    }

    /// Ring bytes as the emulator's writer (npu layout::encode) leaves them for an n-token prompt:
    /// chunks of P, remainder first, each window of N = P entries encoded in `layout` and stored
    /// from slot a_k + shift. Padding rows hold −9 (never matches the reference).
    fn write_ring(refs: &[f32], g: Geo, layout: Layout, shift: i64) -> Vec<f32> {
        let Geo { n, c, p, l, hd } = g;
        // values travel as their index into `vals` through byte-free encoding: 4-byte elements
        let chunks = n.div_ceil(p);
        let a0 = n as i64 - (chunks * p) as i64;
        let mut ring = vec![0f32; l * c];
        let shape = StreamShape {
            tokens: p,
            features: c,
            elem_bytes: 4,
            head_dim: hd,
        };
        for k in 0..chunks {
            let ak = a0 + (k * p) as i64;
            let mut block = Vec::with_capacity(p * c * 4);
            for t in 0..p {
                let pos = ak + t as i64;
                for f in 0..c {
                    let v = if pos < 0 {
                        -9.0
                    } else {
                        refs[pos as usize * c + f]
                    };
                    block.extend_from_slice(&v.to_le_bytes());
                }
            }
            let mut stream = Vec::new();
            encode(layout, shape, &block, &mut stream);
            for (i, ch) in stream.chunks_exact(4).enumerate() {
                let slot = (ak + shift + (i / c) as i64).rem_euclid(l as i64) as usize;
                ring[slot * c + i % c] = f32::from_le_bytes([ch[0], ch[1], ch[2], ch[3]]);
            }
        }
        ring
    }

    fn solve_for(ring: &[f32], refs: &[f32], n: usize, c: usize, p: usize, l: usize) -> Solution {
        let d = EdgeData {
            ring,
            reference: refs,
            prompt_len: n,
            chunk: p,
            window: p,
            cache_len: l,
            features: c,
            tolerance: 0.01,
        };
        let shifts: Vec<i64> = (-(l as i64) / 2..(l as i64) / 2).collect();
        solve(&d, &candidates(p, c), &shifts, &SolveOptions::default())
    }

    #[test]
    fn recovers_every_emulator_layout_and_the_shift() {
        // (n, C, P, L, head_dim): one padded chunk; three chunks with a remainder and wrap-around
        // (30, 32, 24, …): tile16 over a 24-token window has a narrower last tile
        for (n, c, p, l, hd) in [
            (13, 32, 32, 64, 16),
            (40, 32, 16, 48, 8),
            (30, 32, 24, 64, 16),
        ] {
            let refs = reference(n, c, 11);
            for layout in Layout::ALL.into_iter().chain(Layout::TEST) {
                for shift in [0i64, 3, -5] {
                    let ring = write_ring(&refs, Geo { n, c, p, l, hd }, layout, shift);
                    let s = solve_for(&ring, &refs, n, c, p, l);
                    let shape = StreamShape {
                        tokens: p,
                        features: c,
                        elem_bytes: 1,
                        head_dim: hd,
                    };
                    let same =
                        s.best.map.table() == kvprobe_npu::layout::position_table(layout, shape);
                    assert!(
                        same && s.best.shift == shift && s.best.fraction == 1.0,
                        "{} shift {shift} n {n}: got {} shift {} fraction {}",
                        layout.name(),
                        s.best.map.formula(),
                        s.best.shift,
                        s.best.fraction
                    );
                }
            }
        }
    }

    #[test]
    fn a_random_permutation_is_not_explained() {
        let (n, c, p, l) = (13, 32, 32, 64);
        let refs = reference(n, c, 5);
        let g = Geo { n, c, p, l, hd: 16 };
        let mut ring = write_ring(&refs, g, Layout::TokenMajor, 0);
        // Fisher-Yates over the whole ring with a fixed seed
        let mut s: u64 = 77;
        for i in (1..ring.len()).rev() {
            s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            ring.swap(i, (s >> 33) as usize % (i + 1));
        }
        let sol = solve_for(&ring, &refs, n, c, p, l);
        assert!(sol.best.fraction < 0.2, "{}", sol.best.fraction);
    }

    #[test]
    fn noise_is_not_explained() {
        let (n, c, p, l) = (13, 32, 32, 64);
        let refs = reference(n, c, 9);
        let mut s: u64 = 5;
        let ring: Vec<f32> = (0..l * c)
            .map(|_| {
                s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 6.0
            })
            .collect();
        let sol = solve_for(&ring, &refs, n, c, p, l);
        assert!(sol.best.fraction < 0.2, "{}", sol.best.fraction);
    }

    #[test]
    fn slot_fraction_marks_the_prompt_slots() {
        // 13 tokens, one chunk of 32: positions 0..12 at slots 0..12 (+2)
        let (n, c, p, l) = (13, 32, 32, 64);
        let refs = reference(n, c, 3);
        let ring = write_ring(&refs, Geo { n, c, p, l, hd: 16 }, Layout::TokenMajor, 2);
        let s = solve_for(&ring, &refs, n, c, p, l);
        assert_eq!(s.best.shift, 2);
        for (slot, f) in s.slot_fraction.iter().enumerate() {
            let want = if (2..15).contains(&slot) { 1.0 } else { -1.0 };
            assert_eq!(*f, want, "slot {slot}");
        }
        let r = s.runner_up.expect("a runner-up");
        // the next best is at most half right (e.g. right on one of two token digits)
        assert!(r.fraction < 0.6, "{} {} {:?}", r.fraction, r.shift, r.map);
    }
}
