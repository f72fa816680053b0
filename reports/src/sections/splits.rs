//! `splits`: the prompt prefilled then continued, and decoded from each split point, against
//! the reference.

use std::fmt::Write as _;
use std::path::Path;

use kvprobe_schema::{Results, SplitsFinding};
use ndarray::Array2;

use crate::cells::{chart, csv6};
use crate::charts::heatmap::{self, Heatmap, Scale};
use crate::charts::{pooled_note, to_f64};
use crate::error::Result;
use crate::html::{fold, kv_table, table};
use crate::npy::write_npy;
use crate::section::{Chart, ProbeBlock, ProbeSection};
use crate::text::num;

pub const SPLITS_NPY: &str = "splits.npy";
pub const SPLITS_SVG: &str = "splits.svg";

pub struct Splits;

impl ProbeSection for Splits {
    fn tables(&self, r: &Results) -> Vec<(String, String)> {
        match &r.probes.splits {
            Some(f) => vec![("splits.csv".to_string(), splits_csv(f))],
            None => Vec::new(),
        }
    }

    fn array_files(&self, r: &Results) -> Vec<String> {
        match r.probes.splits {
            Some(_) => vec![SPLITS_NPY.to_string()],
            None => Vec::new(),
        }
    }

    fn write_arrays(&self, r: &Results, dir: &Path) -> Result<()> {
        match &r.probes.splits {
            Some(f) => write_npy(&dir.join(SPLITS_NPY), &splits_matrix(f)),
            None => Ok(()),
        }
    }

    fn reserved_prefixes(&self) -> &'static [&'static str] {
        &["splits"]
    }

    fn charts(&self, r: &Results) -> Result<Vec<Chart>> {
        match &r.probes.splits {
            Some(f) => Ok(vec![(SPLITS_SVG, splits_chart(f)?)]),
            None => Ok(Vec::new()),
        }
    }

    fn block(&self, r: &Results, charts: &[Chart]) -> Option<ProbeBlock> {
        let f = r.probes.splits.as_ref()?;
        let rows: Vec<_> = f
            .rows
            .iter()
            .map(|r| {
                let pc = r
                    .prefill_continue
                    .as_ref()
                    .map_or("—".to_string(), |c| num(c.cosine, 4));
                (
                    vec![r.split.to_string(), pc, num(r.decode_final.cosine, 4)],
                    Some(!f.failing_splits.contains(&r.split)),
                )
            })
            .collect();
        Some(ProbeBlock {
            id: "splits",
            title: "Splits: the prompt through every split point",
            summary: kv_table(&[
                ("whole prefill cosine", num(f.whole_prefill.cosine, 4)),
                ("prefill-continue min", num(f.prefill_continue_min, 4)),
                ("pure decode min", num(f.pure_decode_min, 4)),
                ("decode after prefill min", num(f.mixed_decode_min, 4)),
            ]),
            chart: chart(charts, SPLITS_SVG, "split-point matrix"),
            detail: fold(
                "per-split table",
                &table(
                    &["split", "prefill-continue cosine", "decode final cosine"],
                    &rows,
                ),
                rows.len(),
            ),
        })
    }

    fn summary(&self, r: &Results) -> String {
        let Some(f) = &r.probes.splits else {
            return String::new();
        };
        format!(
            "splits: whole prefill {:.4}; prefill-continue min {:.4}; pure decode min {:.4}; decode after prefill min {:.4}; failing splits {:?}\n",
            f.whole_prefill.cosine,
            f.prefill_continue_min,
            f.pure_decode_min,
            f.mixed_decode_min,
            f.failing_splits
        )
    }
}

/// `[split rows, prompt positions]`: cosine to the reference of the decode step at each
/// position (NaN where not decoded: before the split, prefilled; past a bounded decode).
pub fn splits_matrix(f: &SplitsFinding) -> Array2<f32> {
    let mut m = Array2::from_elem((f.rows.len(), f.prompt_len), f32::NAN);
    for (i, r) in f.rows.iter().enumerate() {
        for (j, c) in r.decode_cosines.iter().enumerate() {
            if r.split.saturating_add(j) < f.prompt_len {
                m[[i, r.split + j]] = *c as f32;
            }
        }
    }
    m
}

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
                .map_or(String::new(), |c| csv6(c.cosine)),
            csv6(r.decode_final.cosine),
            csv6(min),
            f.failing_splits.contains(&r.split)
        );
    }
    s
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
    use kvprobe_schema::test_findings::{comparison, splits};
    use kvprobe_schema::SplitRow;

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
}
