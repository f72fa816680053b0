//! Arrays, CSV tables and heatmaps of the stale, causality and splits probes (issue 10). The
//! arrays are pure functions of the findings, so `.npy`, CSV and SVG always agree with
//! results.json.

use std::fmt::Write;

use kvprobe_schema::{CausalityFinding, SplitsFinding, StaleFinding};
use ndarray::Array2;

use crate::charts::heatmap::{self, Heatmap, Scale};
use crate::error::{Error, Result};

pub const STALE_NPY: &str = "stale.npy";
pub const CAUSALITY_NPY: &str = "causality.npy";
pub const CAUSALITY_FIRST_NPY: &str = "causality_first_layer.npy";
pub const SPLITS_NPY: &str = "splits.npy";
pub const STALE_SVG: &str = "stale.svg";
pub const CAUSALITY_SVG: &str = "causality.svg";
pub const SPLITS_SVG: &str = "splits.svg";

/// `[steps, L]`: NaN where the slot holds a valid entry at that step (a prompt token or one the
/// steps already wrote: nothing was poisoned there), else how far the step's logits moved
/// (1 − cosine to the clean run) in a slot located as leaking at that step, 0 in the other
/// poisoned slots.
pub fn stale_matrix(f: &StaleFinding, cache_len: usize) -> Array2<f32> {
    let mut m = Array2::from_elem((f.steps.len(), cache_len), f32::NAN);
    for (k, st) in f.steps.iter().enumerate() {
        for slot in f
            .never_written_slots
            .iter()
            .chain(&f.previously_written_slots)
        {
            // the steps before this one (and this one) overwrote slots n .. position
            let first_pos = st.position - st.step;
            let written = (first_pos..=st.position).any(|p| p % cache_len.max(1) == *slot);
            if *slot < cache_len && !written {
                m[[k, *slot]] = 0.0;
            }
        }
        for l in f.leaks.iter().filter(|l| l.step == st.step) {
            if l.slot < cache_len {
                m[[k, l.slot]] = (1.0 - st.cosine_to_clean).clamp(0.0, 2.0) as f32;
            }
        }
    }
    m
}

fn rectangular(name: &str, m: &[Vec<f32>], rows: usize, cols: usize) -> Result<Array2<f32>> {
    if m.len() != rows || m.iter().any(|r| r.len() != cols) {
        return Err(Error::BadArray {
            name: name.into(),
            reason: format!("matrix is not [{rows}][{cols}]; the finding is malformed"),
        });
    }
    Array2::from_shape_vec((rows, cols), m.iter().flatten().copied().collect()).map_err(|e| {
        Error::BadArray {
            name: name.into(),
            reason: e.to_string(),
        }
    })
}

/// `[slots, perturbed]`: relative change of each slot's cache entries (all layers).
pub fn causality_matrix(f: &CausalityFinding) -> Result<Array2<f32>> {
    rectangular("causality", &f.matrix, f.slots.len(), f.perturbed.len())
}

/// `[slots, perturbed]`: the same over the first layer only.
pub fn causality_first_layer(f: &CausalityFinding) -> Result<Array2<f32>> {
    rectangular(
        "causality_first_layer",
        &f.first_layer_matrix,
        f.slots.len(),
        f.perturbed.len(),
    )
}

/// `[split rows, prompt positions]`: cosine to the reference of the decode step at each
/// position (NaN where not decoded: before the split, prefilled; past a bounded decode).
pub fn splits_matrix(f: &SplitsFinding) -> Array2<f32> {
    let mut m = Array2::from_elem((f.rows.len(), f.prompt_len), f32::NAN);
    for (i, r) in f.rows.iter().enumerate() {
        for (j, c) in r.decode_cosines.iter().enumerate() {
            if r.split + j < f.prompt_len {
                m[[i, r.split + j]] = *c as f32;
            }
        }
    }
    m
}

fn num(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.6}")
    } else {
        String::new()
    }
}

/// stale.csv: one row per step, with the slots located as leaking at that step.
pub fn stale_csv(f: &StaleFinding) -> String {
    let mut s = String::from("step,position,cosine_to_clean,max_abs_diff,moved,leaking_slots\n");
    for st in &f.steps {
        let slots: Vec<String> = f
            .leaks
            .iter()
            .filter(|l| l.step == st.step)
            .map(|l| l.slot.to_string())
            .collect();
        let _ = writeln!(
            s,
            "{},{},{},{},{},{}",
            st.step,
            st.position,
            num(st.cosine_to_clean),
            num(st.max_abs_diff),
            st.moved,
            slots.join(" ")
        );
    }
    s
}

/// causality.csv: one row per (slot, perturbed position) cell.
pub fn causality_csv(f: &CausalityFinding) -> String {
    let mut s = String::from("slot,position,perturbed,change,first_layer_change\n");
    for (i, slot) in f.slots.iter().enumerate() {
        let pos = f
            .slot_positions
            .get(i)
            .copied()
            .flatten()
            .map_or(String::new(), |p| p.to_string());
        for (k, p) in f.perturbed.iter().enumerate() {
            let all = f.matrix.get(i).and_then(|r| r.get(k)).copied();
            let first = f.first_layer_matrix.get(i).and_then(|r| r.get(k)).copied();
            let _ = writeln!(
                s,
                "{slot},{pos},{p},{},{}",
                all.map_or(String::new(), |v| num(v as f64)),
                first.map_or(String::new(), |v| num(v as f64))
            );
        }
    }
    s
}

/// splits.csv: one row per split point.
pub fn splits_csv(f: &SplitsFinding) -> String {
    let mut s = String::from(
        "split,prefill_continue_cosine,decode_final_cosine,decode_min_cosine,failing\n",
    );
    for r in &f.rows {
        let min = r.decode_cosines.iter().copied().fold(f64::NAN, f64::min);
        let _ = writeln!(
            s,
            "{},{},{},{},{}",
            r.split,
            r.prefill_continue
                .as_ref()
                .map_or(String::new(), |c| num(c.cosine)),
            num(r.decode_final.cosine),
            num(min),
            f.failing_splits.contains(&r.split)
        );
    }
    s
}

fn to_f64(m: &Array2<f32>) -> Vec<Vec<f64>> {
    m.outer_iter()
        .map(|r| r.iter().map(|v| *v as f64).collect())
        .collect()
}

fn pooled_note(notes: &mut Vec<String>, rows: usize, cols: usize) {
    if rows > heatmap::MAX_CELLS || cols > heatmap::MAX_CELLS {
        notes.push(format!(
            "{rows} × {cols} cells shown pooled; labels name a block's first row/column"
        ));
    }
}

pub fn stale_chart(f: &StaleFinding, cache_len: usize) -> Result<String> {
    let m = stale_matrix(f, cache_len);
    let marked = m
        .outer_iter()
        .enumerate()
        .map(|(k, row)| {
            (0..row.len())
                .map(|slot| f.leaks.iter().any(|l| l.step == k && l.slot == slot))
                .collect()
        })
        .collect();
    let mut notes = vec![format!(
        "poisoned slots hold |value| {:.3}; blank = a valid entry (not poisoned); shade = 1 − cosine of the step's logits to the clean run, in the slots located as leaking",
        f.poison_magnitude
    )];
    pooled_note(&mut notes, m.nrows(), m.ncols());
    heatmap::render(&Heatmap {
        title: "stale: which poisoned ring slot moves which tbt step".into(),
        notes,
        values: to_f64(&m),
        marked,
        mark_label: Some("leaking slot".into()),
        row_labels: f
            .steps
            .iter()
            .map(|s| format!("step {} (pos {})", s.step, s.position))
            .collect(),
        col_labels: (0..cache_len).map(|s| s.to_string()).collect(),
        row_class: None,
        x_title: "ring slot".into(),
        y_title: "tbt step".into(),
        scale: Scale::Fraction,
        scale_label: "1 − cosine to clean".into(),
        nan_label: "valid entry, not poisoned".into(),
        square: false,
    })
}

pub fn causality_chart(f: &CausalityFinding) -> Result<String> {
    let m = causality_matrix(f)?;
    let marked = f
        .slot_positions
        .iter()
        .map(|pos| {
            f.perturbed
                .iter()
                .map(|p| pos.is_some_and(|i| i < *p))
                .collect()
        })
        .collect();
    let mut notes = vec![
        "outlined = above the causal diagonal (the slot's position precedes the perturbed one): must stay 0".into(),
        format!(
            "{} leak cells ({} in the first layer), {} stray, {} padding-row cells (expected: padding rows attend to every column); shade clipped at 1",
            f.leak_cells, f.first_layer_leak_cells, f.stray_cells, f.padding_cells
        ),
    ];
    pooled_note(&mut notes, m.nrows(), m.ncols());
    heatmap::render(&Heatmap {
        title: "causality: change of each slot's cache entries when one prompt token is replaced"
            .into(),
        notes,
        values: to_f64(&m),
        marked,
        mark_label: Some("must not change".into()),
        row_labels: f
            .slots
            .iter()
            .zip(&f.slot_positions)
            .map(|(s, p)| match p {
                Some(p) => format!("slot {s} (p {p})"),
                None => format!("slot {s} (no token)"),
            })
            .collect(),
        col_labels: f.perturbed.iter().map(|p| p.to_string()).collect(),
        row_class: None,
        x_title: "perturbed prompt position".into(),
        y_title: "ring slot (prompt position it holds)".into(),
        scale: Scale::Fraction,
        scale_label: "relative change".into(),
        nan_label: "no data".into(),
        square: false,
    })
}

pub fn splits_chart(f: &SplitsFinding) -> Result<String> {
    let m = splits_matrix(f);
    let marked = f
        .rows
        .iter()
        .map(|r| {
            let failing = f.failing_splits.contains(&r.split);
            (0..f.prompt_len).map(|j| failing && j == r.split).collect()
        })
        .collect();
    let mut notes = vec![format!(
        "row k: prefill the first k tokens, decode the rest one tbt step at a time (k = 0: pure decode); whole prefill {:.4}, prefill-continue min {:.4}",
        f.whole_prefill.cosine, f.prefill_continue_min
    )];
    pooled_note(&mut notes, m.nrows(), m.ncols());
    heatmap::render(&Heatmap {
        title: "splits: decode cosine to the reference per split point and position".into(),
        notes,
        values: to_f64(&m),
        marked,
        mark_label: Some("failing split".into()),
        row_labels: f
            .rows
            .iter()
            .map(|r| format!("split {}", r.split))
            .collect(),
        col_labels: (0..f.prompt_len).map(|p| p.to_string()).collect(),
        row_class: None,
        x_title: "prompt position decoded".into(),
        y_title: "split point".into(),
        scale: Scale::Diverging,
        scale_label: "cosine".into(),
        nan_label: "prefilled (or not decoded)".into(),
        square: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvprobe_schema::test_findings::{comparison, splits, stale};
    use kvprobe_schema::{SplitRow, StaleStep};

    #[test]
    fn splits_matrix_by_hand() {
        let row = |split, d: Vec<f64>| SplitRow {
            split,
            prefill_continue: None,
            decode_final: comparison(*d.last().unwrap()),
            decode_cosines: d,
        };
        let rows = vec![row(0, vec![0.1, 0.2, 0.3]), row(2, vec![0.9])];
        let f = splits(3, rows, 0.1, 0.9, 1.0);
        let m = splits_matrix(&f);
        assert_eq!(m.shape(), &[2, 3]);
        assert_eq!(m.row(0).to_vec(), vec![0.1, 0.2, 0.3]);
        assert!(m[[1, 0]].is_nan() && m[[1, 1]].is_nan());
        assert_eq!(m[[1, 2]], 0.9);
    }

    #[test]
    fn stale_matrix_by_hand() {
        // L = 4, prompt of 2 in slots 0, 1; steps at positions 2 and 3 write slots 2 and 3;
        // slot 3 leaks at step 0 with cosine 0.25 to the clean run
        let step = |k: usize, c: f64| StaleStep {
            step: k,
            position: 2 + k,
            cosine_to_clean: c,
            max_abs_diff: 1.0,
            moved: c < 1.0,
        };
        let f = stale(vec![2, 3], vec![step(0, 0.25), step(1, 1.0)], &[3]);
        let m = stale_matrix(&f, 4);
        assert!(m.row(0).iter().take(3).all(|v| v.is_nan()));
        assert_eq!(m[[0, 3]], 0.75);
        assert!(m.row(1).iter().all(|v| v.is_nan()));
        assert!(stale_csv(&f).contains("\n0,2,0.250000,1.000000,true,3\n"));
    }
}
