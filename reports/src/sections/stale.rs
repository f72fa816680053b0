//! `stale`: poisoned ring slots that hold no prompt token, and the tbt steps rerun over them;
//! plus a second request after the first. Arrays, CSV and heatmap are pure functions of the
//! finding, so `.npy`, CSV and SVG always agree with results.json.

use std::fmt::Write as _;
use std::path::Path;

use kvprobe_schema::{Results, StaleFinding};
use ndarray::Array2;

use crate::cells::{chart, csv6, yes};
use crate::charts::heatmap::{self, Heatmap, Scale};
use crate::charts::{pooled_note, to_f64};
use crate::error::Result;
use crate::html::{fold, kv_table, table};
use crate::npy::write_npy;
use crate::section::{Chart, ProbeBlock, ProbeSection};
use crate::text::{html, num};

pub const STALE_NPY: &str = "stale.npy";
pub const STALE_SVG: &str = "stale.svg";

pub struct Stale;

impl ProbeSection for Stale {
    fn tables(&self, r: &Results) -> Vec<(String, String)> {
        match &r.probes.stale {
            Some(f) => vec![("stale.csv".to_string(), stale_csv(f))],
            None => Vec::new(),
        }
    }

    fn array_files(&self, r: &Results) -> Vec<String> {
        match r.probes.stale {
            Some(_) => vec![STALE_NPY.to_string()],
            None => Vec::new(),
        }
    }

    fn write_arrays(&self, r: &Results, dir: &Path) -> Result<()> {
        match &r.probes.stale {
            Some(f) => write_npy(
                &dir.join(STALE_NPY),
                &stale_matrix(f, r.provenance.cache_len),
            ),
            None => Ok(()),
        }
    }

    fn reserved_prefixes(&self) -> &'static [&'static str] {
        &["stale"]
    }

    fn charts(&self, r: &Results) -> Result<Vec<Chart>> {
        match &r.probes.stale {
            Some(f) => Ok(vec![(STALE_SVG, stale_chart(f, r.provenance.cache_len)?)]),
            None => Ok(Vec::new()),
        }
    }

    fn block(&self, r: &Results, charts: &[Chart]) -> Option<ProbeBlock> {
        let f = r.probes.stale.as_ref()?;
        let rows: Vec<_> = f
            .steps
            .iter()
            .map(|x| {
                (
                    vec![
                        x.step.to_string(),
                        x.position.to_string(),
                        num(x.cosine_to_clean, 6),
                        num(x.max_abs_diff, 4),
                        yes(x.moved),
                    ],
                    Some(!x.moved),
                )
            })
            .collect();
        Some(ProbeBlock {
            id: "stale",
            title: "Stale: poisoned unused ring slots",
            summary: kv_table(&summary_pairs(f)),
            chart: chart(charts, STALE_SVG, "stale slot map per step"),
            detail: fold(
                "per-step table",
                &table(
                    &["step", "position", "cosine to clean", "max |diff|", "moved"],
                    &rows,
                ),
                rows.len(),
            ),
        })
    }

    fn summary(&self, r: &Results) -> String {
        r.probes.stale.as_ref().map(summary).unwrap_or_default()
    }
}

fn summary_pairs(f: &StaleFinding) -> Vec<(&'static str, String)> {
    let leaks: Vec<String> = f
        .leaks
        .iter()
        .map(|l| format!("step {} slot {} ({})", l.step, l.slot, html(&l.class)))
        .collect();
    let mut pairs = vec![
        (
            "poisoned never-written slots",
            f.never_written_slots.len().to_string(),
        ),
        (
            "poisoned previously-written slots",
            f.previously_written_slots.len().to_string(),
        ),
        ("poison |value|", num(f.poison_magnitude, 3)),
        (
            "leaking slots",
            if leaks.is_empty() {
                "none".into()
            } else {
                leaks.join(", ")
            },
        ),
    ];
    if let Some(b) = &f.back_to_back {
        pairs.push((
            "second request, with reset",
            format!(
                "min cosine {} — {}",
                num(b.with_reset_cosine, 6),
                if b.depends_with_reset {
                    "DEPENDS on the first"
                } else {
                    "independent"
                }
            ),
        ));
        pairs.push((
            "second request, without reset",
            format!("min cosine {}", num(b.without_reset_cosine, 6)),
        ));
    }
    pairs
}

fn summary(f: &StaleFinding) -> String {
    let moved: Vec<String> = f
        .steps
        .iter()
        .filter(|x| x.moved)
        .map(|x| x.step.to_string())
        .collect();
    let mut s = format!(
        "stale: {} never-written + {} previously-written slots poisoned (|value| {:.3}); steps moved: {}\n",
        f.never_written_slots.len(),
        f.previously_written_slots.len(),
        f.poison_magnitude,
        if moved.is_empty() { "none".to_string() } else { moved.join(", ") }
    );
    for l in &f.leaks {
        s += &format!(
            "  leak: step {} sees slot {} ({}, {} slots from the valid window)\n",
            l.step, l.slot, l.class, l.distance_to_valid
        );
    }
    if !f.leak_search_complete {
        s += &format!("  slot search stopped after {} trials\n", f.leak_trials);
    }
    if let Some(b) = &f.back_to_back {
        s += &format!(
            "stale: second request after the first: with reset min cosine {:.6} ({}), without reset {:.6} ({})\n",
            b.with_reset_cosine,
            if b.depends_with_reset { "DEPENDS on the first" } else { "independent" },
            b.without_reset_cosine,
            if b.depends_without_reset { "depends, as a continuation should" } else { "independent" }
        );
    }
    s
}

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
            let first_pos = st.position.saturating_sub(st.step);
            let written = crate::index::ring_written(first_pos, st.position, cache_len, *slot);
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
            csv6(st.cosine_to_clean),
            csv6(st.max_abs_diff),
            st.moved,
            slots.join(" ")
        );
    }
    s
}

pub fn stale_chart(f: &StaleFinding, cache_len: usize) -> Result<String> {
    let m = stale_matrix(f, cache_len);
    let leaks = crate::index::first_index(&f.leaks, |l| (l.step, l.slot));
    let marked = m
        .outer_iter()
        .enumerate()
        .map(|(k, row)| {
            (0..row.len())
                .map(|slot| leaks.contains_key(&(k, slot)))
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

#[cfg(test)]
mod tests {
    use super::*;
    use kvprobe_schema::test_findings::stale;
    use kvprobe_schema::StaleStep;

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
