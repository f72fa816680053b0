//! `colmap`: the single-key column-to-token map (Finding 9, prior art §2.5 and §3.3).
//!
//! Query = the device's prefill argmax at position n, fed identically to both sides. Device row j:
//! the first tbt step with `SingleKey(j)` minus the `SelfOnly` step (the driver restores the read
//! offset and host state between trials). Reference column p: the single-key step on key p minus
//! the self-only step, from the prompt's KV state (`step_many`, one batched pass). The cosine
//! matrix `[window entry × prompt position]` is read against the ring arithmetic's expected map.

use kvprobe_npu::MaskMode;
use kvprobe_reference::KeySet;
use kvprobe_schema::{ColmapFinding, ColmapRow, ColumnMatch};

use crate::metrics::cosine_of_diffs;
use crate::session::{Geometry, Session};
use crate::thresholds::{COLMAP_CLEAN_MARGIN, COLMAP_EMPTY_SPREAD, COLMAP_MATCH};
use crate::Result;

#[derive(Debug, Clone, Copy)]
pub struct ColmapOptions {
    /// Windows up to this many entries are covered whole; larger ones (real HEFs use L = 2048)
    /// cover the written entries plus `extra_empty` never-written ones.
    pub full_window_max: usize,
    pub extra_empty: usize,
}

impl Default for ColmapOptions {
    fn default() -> Self {
        ColmapOptions {
            full_window_max: 64,
            extra_empty: 4,
        }
    }
}

/// Window entries a run covers.
pub fn covered_entries(g: &Geometry, opts: &ColmapOptions) -> Vec<usize> {
    let w = g.tbt_window();
    if w <= opts.full_window_max {
        return (0..w).collect();
    }
    let first_written = w.saturating_sub(g.prompt_len);
    (first_written.saturating_sub(opts.extra_empty)..w).collect()
}

/// Reference logits for the colmap: `[self-only, key 0, …, key n−1]` at the query position.
pub fn reference_rows(s: &mut Session, query: u32) -> Result<Vec<Vec<f32>>> {
    let prompt = s.prompt_ref()?;
    let n = s.ids.len();
    let mut sets = vec![KeySet::None];
    sets.extend((0..n).map(|p| KeySet::Subset(vec![p])));
    Ok(s.model.step_many(&prompt.state, query, n, &sets)?)
}

pub fn run(s: &mut Session, opts: &ColmapOptions) -> Result<ColmapFinding> {
    s.require_tbt("colmap")?;
    let g = s.geometry();
    let n = g.prompt_len;
    let entries = covered_entries(&g, opts);
    s.progress.phase("colmap", entries.len() as u64 + 2);
    s.clear_rings()?;
    let first = s.first_step()?;
    s.progress.inc(1);
    let q = first.query;
    // One batched run: self-only first, then every covered single key (independent trials).
    let mut modes = vec![MaskMode::SelfOnly];
    modes.extend(entries.iter().map(|&j| MaskMode::SingleKey(j)));
    let mut outs = s.driver.trial_steps(s.dev, q, &modes)?.into_iter();
    let dev_self = outs
        .next()
        .ok_or_else(|| crate::Error::Device("the batched trial run returned no output".into()))?
        .logits;
    let dev_rows: Vec<Vec<f32>> = outs.map(|o| o.logits).collect();
    s.progress.inc(entries.len() as u64 + 1);
    let refs = reference_rows(s, q)?;
    let (ref_self, ref_keys) = refs
        .split_first()
        .ok_or_else(|| crate::Error::Candle("empty step_many".into()))?;
    let matrix: Vec<Vec<f32>> = dev_rows
        .iter()
        .map(|d| {
            ref_keys
                .iter()
                .map(|r| cosine_of_diffs(d, &dev_self, r, ref_self) as f32)
                .collect()
        })
        .collect();
    let tok = s.model.tokenizer();
    let position_tokens = s.ids.iter().map(|&t| tok.token_piece(t)).collect();
    let expected: Vec<Option<usize>> = entries
        .iter()
        .map(|&j| g.first_window_position(j))
        .collect();
    let rows = classify_rows(&entries, &expected, &matrix);
    let (diagonal_strength, best_off_diagonal) = diagonal_stats(&expected, &matrix);
    let (best_shift, best_shift_score) = best_shift(&g, &entries, &matrix);
    let best_permutation_score = best_assignment_mean(&matrix);
    let never: Vec<bool> = entries
        .iter()
        .map(|&j| g.first_window_never_written(j))
        .collect();
    let (empty_rows_identical, empty_rows_spread) = empty_spread(&never, &dev_rows, &dev_self);
    Ok(ColmapFinding {
        query_token: q,
        query_position: n,
        clean_rows: rows
            .iter()
            .filter(|r| r.class == ColumnMatch::Clean)
            .count(),
        mixture_rows: rows
            .iter()
            .filter(|r| r.class == ColumnMatch::Mixture)
            .count(),
        covered_all: entries.len() == g.tbt_window(),
        entries,
        positions: (0..n).collect(),
        position_tokens,
        matrix,
        rows,
        diagonal_strength,
        best_off_diagonal,
        best_shift,
        best_shift_score,
        best_permutation_score,
        empty_rows_identical,
        empty_rows_spread,
    })
}

fn classify_rows(entries: &[usize], expected: &[Option<usize>], m: &[Vec<f32>]) -> Vec<ColmapRow> {
    entries
        .iter()
        .zip(expected)
        .zip(m)
        .map(|((&entry, &expected_position), row)| {
            let mut best = (None, f64::NEG_INFINITY);
            let mut second = f64::NEG_INFINITY;
            for (p, &c) in row.iter().enumerate() {
                let c = c as f64;
                if c > best.1 {
                    second = best.1;
                    best = (Some(p), c);
                } else if c > second {
                    second = c;
                }
            }
            let second = if second.is_finite() { second } else { 0.0 };
            let best_cosine = if best.1.is_finite() { best.1 } else { 0.0 };
            let class = if best_cosine < COLMAP_MATCH {
                ColumnMatch::None
            } else if best_cosine - second >= COLMAP_CLEAN_MARGIN {
                ColumnMatch::Clean
            } else {
                ColumnMatch::Mixture
            };
            ColmapRow {
                entry,
                expected_position,
                best_position: best.0,
                best_cosine,
                second_cosine: second,
                class,
            }
        })
        .collect()
}

/// Mean cosine at the expected cells and mean best cosine away from them, over written entries.
fn diagonal_stats(expected: &[Option<usize>], m: &[Vec<f32>]) -> (f64, f64) {
    let (mut diag, mut off, mut k) = (0f64, 0f64, 0usize);
    for (e, row) in expected.iter().zip(m) {
        if let Some(p) = *e {
            diag += row[p] as f64;
            let best_off = row
                .iter()
                .enumerate()
                .filter(|&(q, _)| q != p)
                .map(|(_, &c)| c as f64)
                .fold(f64::NEG_INFINITY, f64::max);
            off += if best_off.is_finite() { best_off } else { 0.0 };
            k += 1;
        }
    }
    if k == 0 {
        return (0.0, 0.0);
    }
    (diag / k as f64, off / k as f64)
}

/// The entry shift s (entry j holds the position the ring puts at column j + s) with the best
/// mean matched cosine over at least half the prompt.
fn best_shift(g: &Geometry, entries: &[usize], m: &[Vec<f32>]) -> (i64, f64) {
    let n = g.prompt_len as i64;
    let need = ((n + 1) / 2).max(1) as usize;
    let mut best = (0i64, f64::NEG_INFINITY);
    for s in -(n - 1).max(0)..=(n - 1).max(0) {
        let (mut sum, mut k) = (0f64, 0usize);
        for (row, &j) in m.iter().zip(entries) {
            let p = (g.prompt_len + 1 + j) as i64 + s - g.cache_len as i64;
            if p >= 0 && p < n {
                sum += row[p as usize] as f64;
                k += 1;
            }
        }
        if k >= need.min(entries.len()) && k > 0 {
            let score = sum / k as f64;
            // prefer the smallest |s| on ties
            if score > best.1 + 1e-12 || ((score - best.1).abs() <= 1e-12 && s.abs() < best.0.abs())
            {
                best = (s, score);
            }
        }
    }
    if best.1.is_finite() {
        best
    } else {
        (0, 0.0)
    }
}

/// Mean cell of the best one-to-one assignment of rows to positions (Hungarian method, maximising).
pub fn best_assignment_mean(m: &[Vec<f32>]) -> f64 {
    let rows = m.len();
    let cols = m.first().map_or(0, Vec::len);
    if rows == 0 || cols == 0 {
        return 0.0;
    }
    // The solver needs rows ≤ cols: transpose otherwise.
    let (a, r, c): (Vec<Vec<f64>>, usize, usize) = if rows <= cols {
        (
            m.iter()
                .map(|row| row.iter().map(|&x| -(x as f64)).collect())
                .collect(),
            rows,
            cols,
        )
    } else {
        (
            (0..cols)
                .map(|j| (0..rows).map(|i| -(m[i][j] as f64)).collect())
                .collect(),
            cols,
            rows,
        )
    };
    let assign = hungarian(&a, r, c);
    let total: f64 = assign.iter().enumerate().map(|(i, &j)| -a[i][j]).sum();
    total / r as f64
}

/// Minimum-cost assignment of every row to a distinct column (`r ≤ c`), shortest augmenting
/// paths with potentials, O(r²·c). Returns the column of each row.
fn hungarian(a: &[Vec<f64>], r: usize, c: usize) -> Vec<usize> {
    let inf = f64::INFINITY;
    let mut u = vec![0f64; r + 1];
    let mut v = vec![0f64; c + 1];
    let mut p = vec![0usize; c + 1]; // p[j] = row (1-based) matched to column j
    let mut way = vec![0usize; c + 1];
    for i in 1..=r {
        p[0] = i;
        let mut j0 = 0usize;
        let mut minv = vec![inf; c + 1];
        let mut used = vec![false; c + 1];
        loop {
            used[j0] = true;
            let i0 = p[j0];
            let mut delta = inf;
            let mut j1 = 0usize;
            for j in 1..=c {
                if !used[j] {
                    let cur = a[i0 - 1][j - 1] - u[i0] - v[j];
                    if cur < minv[j] {
                        minv[j] = cur;
                        way[j] = j0;
                    }
                    if minv[j] < delta {
                        delta = minv[j];
                        j1 = j;
                    }
                }
            }
            for j in 0..=c {
                if used[j] {
                    u[p[j]] += delta;
                    v[j] -= delta;
                } else {
                    minv[j] -= delta;
                }
            }
            j0 = j1;
            if p[j0] == 0 {
                break;
            }
        }
        loop {
            let j1 = way[j0];
            p[j0] = p[j1];
            j0 = j1;
            if j0 == 0 {
                break;
            }
        }
    }
    let mut ans = vec![0usize; r];
    for j in 1..=c {
        if p[j] > 0 {
            ans[p[j] - 1] = j - 1;
        }
    }
    ans
}

/// Whether the device rows of never-written entries are identical (token-local fault or
/// healthy: the same zero bytes give the same key) or differ (layout mixing spreads real data).
fn empty_spread(
    never_written: &[bool],
    dev_rows: &[Vec<f32>],
    dev_self: &[f32],
) -> (Option<bool>, Option<f64>) {
    let empty: Vec<&Vec<f32>> = never_written
        .iter()
        .zip(dev_rows)
        .filter(|(&e, _)| e)
        .map(|(_, r)| r)
        .collect();
    if empty.len() < 2 {
        return (None, None);
    }
    let mut spread = 0f64;
    for i in 0..empty.len() {
        for k in i + 1..empty.len() {
            let same = empty[i] == empty[k];
            let d = if same {
                0.0
            } else {
                1.0 - cosine_of_diffs(empty[i], dev_self, empty[k], dev_self)
            };
            spread = spread.max(d.max(0.0));
        }
    }
    (Some(spread <= COLMAP_EMPTY_SPREAD), Some(spread))
}

/// `kvprobe colmap`.
pub struct ColmapProbe;

impl crate::probe::Probe for ColmapProbe {
    fn name(&self) -> &'static str {
        "colmap"
    }

    fn about(&self) -> &'static str {
        "Single-key column-to-token map of the first tbt window"
    }

    fn run(
        &self,
        s: &mut crate::session::Session,
        _opts: &crate::probe::ProbeOptions,
        into: &mut kvprobe_schema::ProbeFindings,
    ) -> Result<()> {
        into.colmap = Some(run(s, &ColmapOptions::default())?);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hungarian_finds_the_permutation() {
        // the best assignment is the anti-diagonal (0.9 each); greedy row-by-row would take 0.95
        let m = vec![vec![0.95f32, 0.9], vec![0.9, 0.1]];
        assert!((best_assignment_mean(&m) - 0.9).abs() < 1e-6);
        let m = vec![vec![0.1f32, 0.2, 0.9], vec![0.8, 0.1, 0.1]];
        assert!((best_assignment_mean(&m) - 0.85).abs() < 1e-6);
        // more rows than columns
        let m = vec![vec![0.5f32], vec![0.7], vec![0.1]];
        assert!((best_assignment_mean(&m) - 0.7).abs() < 1e-6);
    }

    #[test]
    fn shift_and_diagonal_on_a_hand_map() {
        // L = 6, n = 3: window 5 entries, cols 2,3,4 hold positions 0,1,2.
        let g = Geometry {
            cache_len: 6,
            prefill_len: 4,
            prompt_len: 3,
        };
        let entries: Vec<usize> = (0..5).collect();
        let expected: Vec<Option<usize>> = entries
            .iter()
            .map(|&j| g.first_window_position(j))
            .collect();
        assert_eq!(expected, vec![None, None, Some(0), Some(1), Some(2)]);
        // a map shifted by one entry: entry j holds the position expected at j + 1
        let mut m = vec![vec![0f32; 3]; 5];
        m[1][0] = 1.0;
        m[2][1] = 1.0;
        m[3][2] = 1.0;
        assert_eq!(best_shift(&g, &entries, &m), (1, 1.0));
        let (d, _) = diagonal_stats(&expected, &m);
        assert_eq!(d, 0.0);
        let rows = classify_rows(&entries, &expected, &m);
        assert_eq!(rows[1].class, ColumnMatch::Clean);
        assert_eq!(rows[4].class, ColumnMatch::None);
    }
}
