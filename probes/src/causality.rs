//! `causality`: replace one prompt token at position p, prefill again, and see which ring slots'
//! K/V change (issue 10). The device emits only the last row's logits (contract §2.8), so the
//! earlier positions' outputs are observed through what they wrote: position i's cache entries
//! are a function of tokens 0..=i only, so none of them may change for p > i. Any changed cell
//! above the diagonal is a causality leak, named by (position, perturbed position).
//!
//! The first layer's K/V depend on the token and its position alone; a change there at another
//! slot means the perturbed token's bytes were *written* there (writer placement or layout),
//! while a change only in later layers means attention saw the future (a mask bug). No
//! reference is needed: the device is compared with itself, and its runs are deterministic.

use std::collections::BTreeMap;

use kvprobe_schema::{CausalLeak, CausalityFinding};

use crate::cache_io;
use crate::rings::{cache_infos, dequantize_entry, CacheInfo};
use crate::session::Session;
use crate::{metrics::cosine, Result};

/// A cell changed when its relative change exceeds this: device runs are deterministic, so an
/// unaffected entry is bit-identical (0); one flipped code of an int8 entry is ≥ 1e-3.
pub const CHANGE_EPS: f64 = 1e-6;

#[derive(Debug, Clone, Copy)]
pub struct CausalityOptions {
    /// Perturbed positions at most (evenly spread, the last position always included).
    pub max_perturbed: usize,
}

impl Default for CausalityOptions {
    fn default() -> Self {
        CausalityOptions { max_perturbed: 64 }
    }
}

/// Up to `max` positions of `0..n`, evenly spread, always with `n − 1`.
pub fn pick_positions(n: usize, max: usize) -> Vec<usize> {
    if n == 0 || max == 0 {
        return Vec::new();
    }
    if n <= max {
        return (0..n).collect();
    }
    let mut v: Vec<usize> = (0..max).map(|k| (k * (n - 1)) / (max - 1).max(1)).collect();
    v.dedup();
    v
}

/// Entry values of every slot of every cache (dequantised with the writer's quant info).
fn entries(rings: &BTreeMap<u32, Vec<u8>>, infos: &[CacheInfo], l: usize) -> Vec<Vec<Vec<f32>>> {
    let mut buf = Vec::new();
    infos
        .iter()
        .map(|info| {
            let ring = rings.get(&info.cache_id);
            (0..l)
                .map(|s| {
                    let a = s * info.padded_entry_size;
                    match ring.and_then(|r| r.get(a..a + info.entry_size)) {
                        Some(bytes) if info.elem_bytes <= 2 => {
                            dequantize_entry(
                                bytes,
                                info.elem_bytes,
                                &info.writer_quant(),
                                &mut buf,
                            );
                            buf.clone()
                        }
                        Some(bytes) => bytes
                            .chunks_exact(info.elem_bytes)
                            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                            .collect(),
                        None => Vec::new(),
                    }
                })
                .collect()
        })
        .collect()
}

/// ‖a − b‖ / max(‖b‖, tiny): relative change of one entry.
fn rel_change(a: &[f32], b: &[f32]) -> f64 {
    let (mut d, mut nb) = (0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (x as f64, y as f64);
        if x.is_finite() && y.is_finite() {
            d += (x - y) * (x - y);
            nb += y * y;
        } else if x.to_bits() != y.to_bits() {
            d += 1.0;
        }
    }
    d.sqrt() / nb.sqrt().max(1e-6)
}

/// A token different from `t` (half the vocabulary away).
pub fn replacement(t: u32, vocab: usize) -> u32 {
    ((t as usize + vocab / 2 + 1) % vocab.max(2)) as u32
}

/// The prompt's prefill and one prefill per perturbed position, from the same host window.
struct Perturbed {
    /// `[cache][slot]` entries after the prompt's prefill.
    base: Vec<Vec<Vec<f32>>>,
    /// Per perturbed position: `[cache][slot]` relative change.
    changes: Vec<Vec<Vec<f64>>>,
    replacement_tokens: Vec<u32>,
    final_logits_cosine: Vec<f64>,
    /// Per perturbed position: the first layer's entries.
    alt_entries: Vec<Vec<Vec<Vec<f32>>>>,
}

fn perturb(s: &mut Session, perturbed: &[usize], infos: &[CacheInfo]) -> Result<Perturbed> {
    let l = s.geometry().cache_len;
    let vocab = s.model.config().vocab_size;
    // Same host window before every prefill: padding rows must not differ between runs.
    let host0 = s.driver.host_state();
    let ids = s.ids.clone();
    s.clear_rings()?;
    let base_out = s.prefill(&ids)?;
    let base = entries(
        &cache_io::read(s.dev, "after the prompt's prefill (causality probe)")?,
        infos,
        l,
    );
    s.progress.inc(1);
    let mut changes: Vec<Vec<Vec<f64>>> = Vec::with_capacity(perturbed.len());
    let mut replacement_tokens = Vec::with_capacity(perturbed.len());
    let mut final_logits_cosine = Vec::with_capacity(perturbed.len());
    let mut alt_entries: Vec<Vec<Vec<Vec<f32>>>> = Vec::with_capacity(perturbed.len());
    for &p in perturbed {
        let mut alt = ids.clone();
        alt[p] = replacement(ids[p], vocab);
        replacement_tokens.push(alt[p]);
        s.clear_rings()?;
        s.driver.set_host_state(host0.clone());
        let out = s.prefill(&alt)?;
        final_logits_cosine.push(cosine(&out.logits, &base_out.logits));
        let now = entries(
            &cache_io::read(
                s.dev,
                "after a perturbed prompt's prefill (causality probe)",
            )?,
            infos,
            l,
        );
        alt_entries.push(first_layer_only(&now, infos));
        changes.push(
            now.iter()
                .zip(&base)
                .map(|(c_now, c_base)| {
                    c_now
                        .iter()
                        .zip(c_base)
                        .map(|(a, b)| rel_change(a, b))
                        .collect()
                })
                .collect(),
        );
        s.progress.inc(1);
    }
    s.driver.set_host_state(host0);
    Ok(Perturbed {
        base,
        changes,
        replacement_tokens,
        final_logits_cosine,
        alt_entries,
    })
}

/// The slot × perturbed-position matrices and their classified cells.
#[derive(Default)]
struct Cells {
    matrix: Vec<Vec<f32>>,
    first_matrix: Vec<Vec<f32>>,
    leaks: Vec<CausalLeak>,
    leak_cells: usize,
    first_leaks: usize,
    stray: usize,
    padding: usize,
}

/// Position `i` is at slot `i` (the prompt is shorter than the ring).
fn slot_position(slot: usize, n: usize) -> Option<usize> {
    (slot < n).then_some(slot)
}

fn classify(
    changes: &[Vec<Vec<f64>>],
    first_layer: &[bool],
    slots: &[usize],
    perturbed: &[usize],
    padding_slots: &[usize],
    n: usize,
) -> Cells {
    let cell = |k: usize, slot: usize, only_first: bool| -> f64 {
        changes[k]
            .iter()
            .zip(first_layer)
            .filter(|(_, &f)| !only_first || f)
            .map(|(c, _)| c[slot])
            .fold(0.0, f64::max)
    };
    let mut c = Cells::default();
    for &slot in slots {
        let mut row = Vec::with_capacity(perturbed.len());
        let mut frow = Vec::with_capacity(perturbed.len());
        for (k, &p) in perturbed.iter().enumerate() {
            let all = cell(k, slot, false);
            let first = cell(k, slot, true);
            row.push(all as f32);
            frow.push(first as f32);
            match slot_position(slot, n) {
                Some(i) if i < p && all > CHANGE_EPS => {
                    c.leak_cells += 1;
                    c.first_leaks += usize::from(first > CHANGE_EPS);
                    c.leaks.push(CausalLeak {
                        position: i,
                        perturbed: p,
                        change: all,
                        first_layer: first > CHANGE_EPS,
                    });
                }
                // Padding rows attend to every column (all-M1 mask rows, contract §2.5), so
                // their later layers follow the chunk's tokens; their slots stay masked until
                // overwritten. Only a first-layer change there is a misplaced write.
                None if padding_slots.contains(&slot)
                    && first <= CHANGE_EPS
                    && all > CHANGE_EPS =>
                {
                    c.padding += 1
                }
                None if all > CHANGE_EPS => c.stray += 1,
                _ => {}
            }
        }
        c.matrix.push(row);
        c.first_matrix.push(frow);
    }
    c.leaks.sort_by(|a, b| b.change.total_cmp(&a.change));
    c.leaks.truncate(64);
    c
}

pub fn run(s: &mut Session, opts: &CausalityOptions) -> Result<CausalityFinding> {
    let g = s.geometry();
    let l = g.cache_len;
    let n = g.prompt_len;
    let infos = cache_infos(s.describe())?;
    let perturbed = pick_positions(n, opts.max_perturbed);
    s.progress.phase("causality", perturbed.len() as u64 + 1);
    let runs = perturb(s, &perturbed, &infos)?;
    let changes = &runs.changes;
    let first_layer: Vec<bool> = infos.iter().map(|i| i.layer == 0).collect();
    let frozen_tail_columns =
        frozen_tail(changes, &first_layer, &infos, &runs.base, &runs.alt_entries);
    let padding_slots: Vec<usize> = (g.padding_floor()..0)
        .map(|p| p.rem_euclid(l as i64) as usize)
        .filter(|&slot| slot >= n)
        .collect();
    let changed_anywhere = |slot: usize| -> bool {
        changes
            .iter()
            .any(|c| c.iter().any(|cache| cache[slot] > CHANGE_EPS))
    };
    // Rows: slots holding prompt tokens (position i at slot i, n < L) and any other slot that
    // changed; large rings stay small.
    let slots: Vec<usize> = (0..l)
        .filter(|&s| slot_position(s, n).is_some() || changed_anywhere(s))
        .collect();
    let cells = classify(changes, &first_layer, &slots, &perturbed, &padding_slots, n);
    let first_layer_shift = first_layer_shift(&perturbed, changes, &first_layer, l);
    let first_layer_spread = (0..perturbed.len())
        .map(|k| first_layer_slots(&changes[k], &first_layer, l).len())
        .max()
        .unwrap_or(0);
    Ok(CausalityFinding {
        slot_positions: slots.iter().map(|&s| slot_position(s, n)).collect(),
        slots,
        perturbed,
        replacement_tokens: runs.replacement_tokens,
        matrix: cells.matrix,
        first_layer_matrix: cells.first_matrix,
        final_logits_cosine: runs.final_logits_cosine,
        leaks: cells.leaks,
        leak_cells: cells.leak_cells,
        first_layer_leak_cells: cells.first_leaks,
        stray_cells: cells.stray,
        padding_cells: cells.padding,
        first_layer_shift,
        first_layer_spread,
        frozen_tail_columns,
    })
}

/// The first layer's entries of `all` (other caches left empty, to keep the copies small).
fn first_layer_only(all: &[Vec<Vec<f32>>], infos: &[CacheInfo]) -> Vec<Vec<Vec<f32>>> {
    all.iter()
        .zip(infos)
        .map(|(c, i)| if i.layer == 0 { c.clone() } else { Vec::new() })
        .collect()
}

/// Slots whose first-layer entries changed under one perturbation.
fn first_layer_slots(change: &[Vec<f64>], first_layer: &[bool], l: usize) -> Vec<usize> {
    (0..l)
        .filter(|&slot| {
            change
                .iter()
                .zip(first_layer)
                .any(|(c, &f)| f && c[slot] > CHANGE_EPS)
        })
        .collect()
}

/// Trailing entry columns that never changed in any first-layer entry a perturbation changed
/// (max over the first layer's caches). A first-layer K/V entry is a function of its token: a
/// new token changes essentially every element, so a tail that never moves is not written
/// (a truncating writer); a healthy writer leaves none.
fn frozen_tail(
    changes: &[Vec<Vec<f64>>],
    first_layer: &[bool],
    infos: &[CacheInfo],
    base: &[Vec<Vec<f32>>],
    alt: &[Vec<Vec<Vec<f32>>>],
) -> usize {
    let mut worst = 0;
    for (c, info) in infos.iter().enumerate() {
        if !first_layer[c] {
            continue;
        }
        let mut moved = vec![false; info.features];
        let mut seen = false;
        for (k, change) in changes.iter().enumerate() {
            for (slot, &x) in change[c].iter().enumerate() {
                if x <= CHANGE_EPS {
                    continue;
                }
                let (Some(a), Some(b)) = (alt[k][c].get(slot), base[c].get(slot)) else {
                    continue;
                };
                seen = true;
                for (m, (x, y)) in moved.iter_mut().zip(a.iter().zip(b)) {
                    *m |= x.to_bits() != y.to_bits();
                }
            }
        }
        if seen {
            worst = worst.max(moved.iter().rev().take_while(|m| !**m).count());
        }
    }
    worst
}

/// The shift c such that, for every perturbed position p, the first-layer entries changed at
/// exactly slot (p + c) mod L; None when the changes do not follow one shift (or c = 0 is the
/// healthy answer, reported as Some(0)).
fn first_layer_shift(
    perturbed: &[usize],
    changes: &[Vec<Vec<f64>>],
    first_layer: &[bool],
    l: usize,
) -> Option<i64> {
    let mut shift = None;
    for (k, &p) in perturbed.iter().enumerate() {
        let changed: Vec<usize> = (0..l)
            .filter(|&slot| {
                changes[k]
                    .iter()
                    .zip(first_layer)
                    .any(|(c, &f)| f && c[slot] > CHANGE_EPS)
            })
            .collect();
        let [slot] = changed.as_slice() else {
            return None;
        };
        let mut c = *slot as i64 - p as i64;
        if c > l as i64 / 2 {
            c -= l as i64;
        } else if c < -(l as i64) / 2 {
            c += l as i64;
        }
        match shift {
            None => shift = Some(c),
            Some(x) if x != c => return None,
            _ => {}
        }
    }
    shift
}

/// `kvprobe causality`.
pub struct CausalityProbe;

impl crate::probe::Probe for CausalityProbe {
    fn name(&self) -> &'static str {
        "causality"
    }

    fn about(&self) -> &'static str {
        "Replace one prompt token at a time: which earlier positions' cache entries change"
    }

    fn run(
        &self,
        s: &mut crate::session::Session,
        _opts: &crate::probe::ProbeOptions,
        into: &mut kvprobe_schema::ProbeFindings,
    ) -> Result<()> {
        into.causality = Some(run(s, &CausalityOptions::default())?);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_spread_positions() {
        assert_eq!(pick_positions(4, 8), vec![0, 1, 2, 3]);
        assert_eq!(pick_positions(10, 4), vec![0, 3, 6, 9]);
        assert!(pick_positions(0, 4).is_empty());
    }

    #[test]
    fn relative_change_by_hand() {
        assert_eq!(rel_change(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        // ‖(0, 1)‖ / ‖(3, 4)‖ = 1 / 5
        assert!((rel_change(&[3.0, 5.0], &[3.0, 4.0]) - 0.2).abs() < 1e-12);
    }

    #[test]
    fn shift_of_one_slot_moves() {
        // L = 6, perturbed 1 and 3; first-layer change at slots 2 and 4: shift +1
        let mut c1 = vec![vec![0.0; 6]];
        c1[0][2] = 0.5;
        let mut c3 = vec![vec![0.0; 6]];
        c3[0][4] = 0.5;
        let changes = vec![c1, c3.clone()];
        assert_eq!(first_layer_shift(&[1, 3], &changes, &[true], 6), Some(1));
        // a spread (two slots for one token) is no single shift
        let mut spread = c3;
        spread[0][5] = 0.1;
        let changes = vec![changes[0].clone(), spread];
        assert_eq!(first_layer_shift(&[1, 3], &changes, &[true], 6), None);
    }

    fn info(features: usize) -> CacheInfo {
        CacheInfo {
            cache_id: 0,
            layer: 0,
            kind: kvprobe_schema::CacheKind::K,
            role_declared: true,
            entry_size: features,
            padded_entry_size: features,
            elem_bytes: 1,
            features,
            expanded: false,
            prefill_in: None,
            prefill_out: None,
            tbt_in: None,
            tbt_out: None,
            prefill_out_len: 1,
        }
    }

    #[test]
    fn frozen_tail_by_hand() {
        // one cache, L = 2, 4 features; slot 0 base [1, 2, 0, 0]
        let base = vec![vec![vec![1.0, 2.0, 0.0, 0.0], vec![5.0; 4]]];
        let changed = |c: f64| vec![vec![c, 0.0]];
        // the token changes only the first two elements: a 2-column frozen tail
        let alt = vec![vec![vec![vec![3.0, 4.0, 0.0, 0.0], vec![5.0; 4]]]];
        assert_eq!(
            frozen_tail(&[changed(0.5)], &[true], &[info(4)], &base, &alt),
            2
        );
        // another perturbation moves the last element: no frozen tail
        let alt2 = vec![
            alt[0].clone(),
            vec![vec![vec![1.0, 2.0, 0.0, 7.0], vec![5.0; 4]]],
        ];
        let changes = [changed(0.5), changed(0.5)];
        assert_eq!(frozen_tail(&changes, &[true], &[info(4)], &base, &alt2), 0);
        // nothing changed at all: nothing to judge
        assert_eq!(
            frozen_tail(&[changed(0.0)], &[true], &[info(4)], &base, &alt),
            0
        );
    }

    #[test]
    fn spread_counts_first_layer_slots() {
        let change = vec![vec![0.0, 0.3, 0.2], vec![0.9, 0.0, 0.0]];
        assert_eq!(first_layer_slots(&change, &[true, false], 3), vec![1, 2]);
    }

    #[test]
    fn replacement_differs() {
        for t in 0..50 {
            assert_ne!(replacement(t, 50), t);
        }
    }
}
