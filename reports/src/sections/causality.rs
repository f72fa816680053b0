//! `causality`: one prompt token replaced at a time; which earlier positions' cache entries
//! change.

use std::fmt::Write as _;
use std::path::Path;

use kvprobe_schema::{CausalityFinding, Results};
use ndarray::Array2;

use crate::cells::{chart, csv6, yes};
use crate::charts::heatmap::{self, Heatmap, Scale};
use crate::charts::{pooled_note, to_f64};
use crate::error::Result;
use crate::html::{fold, kv_table, table};
use crate::npy::{rectangular, write_npy};
use crate::section::{Chart, ProbeBlock, ProbeSection};
use crate::text::num;

pub const CAUSALITY_NPY: &str = "causality.npy";
pub const CAUSALITY_FIRST_NPY: &str = "causality_first_layer.npy";
pub const CAUSALITY_SVG: &str = "causality.svg";

pub struct Causality;

impl ProbeSection for Causality {
    fn tables(&self, r: &Results) -> Vec<(String, String)> {
        match &r.probes.causality {
            Some(f) => vec![("causality.csv".to_string(), causality_csv(f))],
            None => Vec::new(),
        }
    }

    fn array_files(&self, r: &Results) -> Vec<String> {
        match r.probes.causality {
            Some(_) => vec![CAUSALITY_NPY.to_string(), CAUSALITY_FIRST_NPY.to_string()],
            None => Vec::new(),
        }
    }

    fn write_arrays(&self, r: &Results, dir: &Path) -> Result<()> {
        if let Some(f) = &r.probes.causality {
            write_npy(&dir.join(CAUSALITY_NPY), &causality_matrix(f)?)?;
            write_npy(&dir.join(CAUSALITY_FIRST_NPY), &causality_first_layer(f)?)?;
        }
        Ok(())
    }

    fn reserved_prefixes(&self) -> &'static [&'static str] {
        &["causality"]
    }

    fn charts(&self, r: &Results) -> Result<Vec<Chart>> {
        match &r.probes.causality {
            Some(f) => Ok(vec![(CAUSALITY_SVG, causality_chart(f)?)]),
            None => Ok(Vec::new()),
        }
    }

    fn block(&self, r: &Results, charts: &[Chart]) -> Option<ProbeBlock> {
        let f = r.probes.causality.as_ref()?;
        let rows: Vec<_> = f
            .leaks
            .iter()
            .map(|l| {
                (
                    vec![
                        l.position.to_string(),
                        l.perturbed.to_string(),
                        num(l.change, 4),
                        yes(l.first_layer),
                    ],
                    Some(false),
                )
            })
            .collect();
        Some(ProbeBlock {
            id: "causality",
            title: "Causality: earlier cache entries after replacing a later token",
            summary: kv_table(&[
                ("perturbed positions", f.perturbed.len().to_string()),
                ("leak cells above the diagonal", f.leak_cells.to_string()),
                (
                    "of which in the first layer",
                    f.first_layer_leak_cells.to_string(),
                ),
                (
                    "stray cells (slots without a prompt token)",
                    f.stray_cells.to_string(),
                ),
                (
                    "padding-row cells (expected, §2.5)",
                    f.padding_cells.to_string(),
                ),
                (
                    "most slots one token's first-layer change spread over",
                    f.first_layer_spread.to_string(),
                ),
                (
                    "frozen entry tail (columns)",
                    f.frozen_tail_columns.to_string(),
                ),
            ]),
            chart: chart(charts, CAUSALITY_SVG, "causality matrix"),
            detail: fold(
                "leak cells",
                &table(
                    &[
                        "position",
                        "perturbed position",
                        "relative change",
                        "first layer",
                    ],
                    &rows,
                ),
                rows.len(),
            ),
        })
    }

    fn summary(&self, r: &Results) -> String {
        let Some(f) = &r.probes.causality else {
            return String::new();
        };
        let mut s = format!(
            "causality: {} perturbed positions; {} leak cells above the diagonal ({} in the first layer), {} stray cells, first-layer shift {:?}\n",
            f.perturbed.len(),
            f.leak_cells,
            f.first_layer_leak_cells,
            f.stray_cells,
            f.first_layer_shift
        );
        for l in f.leaks.iter().take(8) {
            s += &format!(
                "  leak: position {} changed by {:.4} when position {} was replaced{}\n",
                l.position,
                l.change,
                l.perturbed,
                if l.first_layer { " (first layer)" } else { "" }
            );
        }
        s
    }
}

pub fn causality_matrix(f: &CausalityFinding) -> Result<Array2<f32>> {
    rectangular("causality", &f.matrix, f.slots.len(), f.perturbed.len())
}

pub fn causality_first_layer(f: &CausalityFinding) -> Result<Array2<f32>> {
    rectangular(
        "causality_first_layer",
        &f.first_layer_matrix,
        f.slots.len(),
        f.perturbed.len(),
    )
}

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
                all.map_or(String::new(), |v| csv6(v as f64)),
                first.map_or(String::new(), |v| csv6(v as f64))
            );
        }
    }
    s
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
