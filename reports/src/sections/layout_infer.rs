//! `layout --infer`: its CSV table, its two `.npy` match maps, its heatmaps (cache edges × ring
//! slots, cache edges × entry columns), its report section and its summary lines.

use ndarray::Array2;

use crate::cells::{chart, kind_name};
use crate::charts::heatmap::{self, Heatmap, Scale};
use crate::error::Result;
use crate::html::{fold, kv_table, table};
use crate::npy::write_npy;
use crate::section::{Chart, ProbeBlock, ProbeSection};
use crate::text::{csv_text, html, num};
use kvprobe_schema::{edge_name, InferredCache, LayoutInferFinding, Results};
use std::fmt::Write as _;
use std::path::Path;

pub const SLOTS_SVG: &str = "layout_infer_slots.svg";
pub const COLUMNS_SVG: &str = "layout_infer_columns.svg";
pub const SLOTS_NPY: &str = "layout_infer_slots.npy";
pub const COLUMNS_NPY: &str = "layout_infer_columns.npy";
pub const CSV: &str = "layout_infer.csv";

fn label(c: &InferredCache) -> String {
    match c.layer {
        Some(l) => format!("L{l} {}", kind_name(c.kind)),
        None => format!("cache {}", c.cache_id),
    }
}

/// One row per cache edge.
pub fn csv(f: &LayoutInferFinding) -> String {
    let mut s = "cache_id,layer,kind,explained,fraction_explained,residual_cosine,shift,named,formula,description,runner_up,runner_up_fraction\n".to_string();
    for c in &f.caches {
        let _ = writeln!(
            s,
            "{},{},{},{},{},{},{},{},{},{},{},{}",
            c.cache_id,
            c.layer.map(|l| l.to_string()).unwrap_or_default(),
            kind_name(c.kind),
            c.explained,
            c.fraction_explained,
            c.residual_cosine,
            c.shift,
            c.named.map(|l| l.name()).unwrap_or(""),
            csv_text(&c.formula),
            csv_text(&c.description),
            csv_text(c.runner_up.as_deref().unwrap_or("")),
            c.runner_up_fraction
        );
    }
    s
}

/// `[edges, columns]` of a per-edge profile; NaN where the map puts no prompt element (or the
/// edge's profile is shorter).
fn matrix(f: &LayoutInferFinding, pick: fn(&InferredCache) -> &Vec<f32>) -> Array2<f32> {
    let width = f.caches.iter().map(|c| pick(c).len()).max().unwrap_or(0);
    let mut m = Array2::from_elem((f.caches.len(), width), f32::NAN);
    for (i, c) in f.caches.iter().enumerate() {
        for (j, &x) in pick(c).iter().enumerate() {
            if x >= 0.0 {
                m[[i, j]] = x;
            }
        }
    }
    m
}

pub fn slots_matrix(f: &LayoutInferFinding) -> Array2<f32> {
    matrix(f, |c| &c.slot_fraction)
}

pub fn columns_matrix(f: &LayoutInferFinding) -> Array2<f32> {
    matrix(f, |c| &c.column_fraction)
}

fn heat(f: &LayoutInferFinding, m: Array2<f32>, title: &str, x_title: &str) -> Result<String> {
    let values: Vec<Vec<f64>> = m
        .outer_iter()
        .map(|r| r.iter().map(|&x| x as f64).collect())
        .collect();
    let width = m.ncols();
    heatmap::render(&Heatmap {
        title: title.into(),
        notes: vec![
            format!(
                "dark = the edge's best map finds the prompt's K/V there (within {} quantisation steps)",
                f.tolerance_steps
            ),
            match (&f.writer_description, f.writer_shift) {
                (Some(d), Some(s)) => format!("majority: {d}, slot shift {s:+}"),
                _ => format!("no edge explained above {:.2}", f.threshold),
            },
        ],
        values,
        marked: vec![],
        mark_label: None,
        row_labels: f.caches.iter().map(label).collect(),
        col_labels: (0..width).map(|k| k.to_string()).collect(),
        row_class: None,
        x_title: x_title.into(),
        y_title: "cache edge".into(),
        scale: Scale::Fraction,
        scale_label: "fraction explained".into(),
        nan_label: "no prompt element mapped here".into(),
        square: false,
    })
}

/// (file name, SVG) of both heatmaps.
pub fn charts(f: &LayoutInferFinding) -> Result<Vec<(&'static str, String)>> {
    Ok(vec![
        (
            SLOTS_SVG,
            heat(
                f,
                slots_matrix(f),
                "layout --infer: prompt elements found per ring slot",
                "ring slot",
            )?,
        ),
        (
            COLUMNS_SVG,
            heat(
                f,
                columns_matrix(f),
                "layout --infer: prompt elements found per entry column",
                "element column within an entry (binned to at most 64)",
            )?,
        ),
    ])
}

pub struct LayoutInfer;

impl ProbeSection for LayoutInfer {
    fn tables(&self, r: &Results) -> Vec<(String, String)> {
        match &r.probes.layout_infer {
            Some(f) => vec![(CSV.to_string(), csv(f))],
            None => Vec::new(),
        }
    }

    fn array_files(&self, r: &Results) -> Vec<String> {
        match r.probes.layout_infer {
            Some(_) => vec![SLOTS_NPY.to_string(), COLUMNS_NPY.to_string()],
            None => Vec::new(),
        }
    }

    fn write_arrays(&self, r: &Results, dir: &Path) -> Result<()> {
        if let Some(f) = &r.probes.layout_infer {
            write_npy(&dir.join(SLOTS_NPY), &slots_matrix(f))?;
            write_npy(&dir.join(COLUMNS_NPY), &columns_matrix(f))?;
        }
        Ok(())
    }

    fn reserved_prefixes(&self) -> &'static [&'static str] {
        &["layout_infer"]
    }

    fn charts(&self, r: &Results) -> Result<Vec<Chart>> {
        match &r.probes.layout_infer {
            Some(f) => charts(f),
            None => Ok(Vec::new()),
        }
    }

    fn files_listed_last(&self) -> bool {
        true
    }

    fn block(&self, r: &Results, charts: &[Chart]) -> Option<ProbeBlock> {
        r.probes.layout_infer.as_ref().map(|f| block(f, charts))
    }

    fn summary(&self, r: &Results) -> String {
        r.probes
            .layout_infer
            .as_ref()
            .map(summary)
            .unwrap_or_default()
    }
}

/// The solved layout: the one-line evidence, then one line per group of edges sharing a map and
/// shift outside the majority.
fn summary(f: &LayoutInferFinding) -> String {
    let mut s = format!("{}\n", f.evidence());
    let mut groups: Vec<(&InferredCache, Vec<String>)> = Vec::new();
    for c in &f.caches {
        let majority = c.explained
            && f.writer_formula.as_deref() == Some(c.formula.as_str())
            && f.writer_shift == Some(c.shift);
        if majority {
            continue;
        }
        let name = edge_name(c.layer, c.kind, c.cache_id);
        match groups.iter_mut().find(|(g, _)| {
            g.formula == c.formula && g.shift == c.shift && g.explained == c.explained
        }) {
            Some((_, names)) => names.push(name),
            None => groups.push((c, vec![name])),
        }
    }
    for (c, names) in groups {
        s += &format!(
            "  {}: {} [{}] at shift {:+}, {:.2} explained{}\n",
            names.join(", "),
            c.description,
            c.formula,
            c.shift,
            c.fraction_explained,
            if c.explained { "" } else { " (UNEXPLAINED)" }
        );
    }
    s
}

fn block(f: &LayoutInferFinding, charts: &[Chart]) -> ProbeBlock {
    let svg = |name: &str, alt: &str| chart(charts, name, alt);
    let rows: Vec<_> = f
        .caches
        .iter()
        .map(|c| {
            (
                vec![
                    html(&label(c)),
                    html(&c.formula),
                    html(&c.description),
                    format!("{:+}", c.shift),
                    num(c.fraction_explained, 3),
                    num(c.residual_cosine, 3),
                    html(c.runner_up.as_deref().unwrap_or("—")),
                    num(c.runner_up_fraction, 3),
                ],
                Some(c.explained),
            )
        })
        .collect();
    let writer = match (&f.writer_description, &f.writer_formula, f.writer_shift) {
        (Some(d), Some(fm), Some(s)) => {
            format!("{} — <code>{}</code>, slot shift {s:+}", html(d), html(fm))
        }
        _ => "<strong>unexplained</strong>: no edge's best map reaches the threshold".to_string(),
    };
    let outliers = if f.outlier_edges.is_empty() {
        "none".to_string()
    } else {
        html(&f.outlier_edges.join(", "))
    };
    ProbeBlock {
        id: "layout-infer",
        title: "Layout solved from the ring bytes (layout --infer)",
        summary: kv_table(&[
            ("majority writer map", writer),
            (
                "edges explained",
                format!("{} of {}", f.caches.len() - f.unexplained, f.caches.len()),
            ),
            ("edges off the majority or unexplained", outliers),
            (
                "search",
                format!(
                    "{} maps × up to {} slot shifts per edge over a {}-token × {}-element window; {} prompt tokens in one prefill run; explained = within {} quantisation steps, edge threshold {:.2}",
                    f.candidates, f.shifts_searched, f.window, f.features, f.prompt_tokens, f.tolerance_steps, f.threshold
                ),
            ),
        ]),
        chart: svg(SLOTS_SVG, "layout --infer slot heatmap")
            + &svg(COLUMNS_SVG, "layout --infer column heatmap"),
        detail: fold(
            "per-edge maps",
            &table(
                &[
                    "edge",
                    "map",
                    "in words",
                    "shift",
                    "explained",
                    "residual cosine",
                    "runner-up",
                    "runner-up explained",
                ],
                &rows,
            ),
            rows.len(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edge(slots: Vec<f32>, columns: Vec<f32>) -> InferredCache {
        InferredCache {
            cache_id: 0,
            layer: Some(0),
            kind: None,
            explained: false,
            fraction_explained: 0.0,
            residual_cosine: 0.0,
            shift: 0,
            formula: "ℓ(t, c) = 4·t + c".into(),
            description: "<script>".into(),
            digits: vec![],
            tile: 1,
            named: None,
            runner_up: None,
            runner_up_fraction: 0.0,
            slot_fraction: slots,
            column_fraction: columns,
        }
    }

    fn finding(caches: Vec<InferredCache>) -> LayoutInferFinding {
        LayoutInferFinding {
            unexplained: caches.len(),
            caches,
            prompt_tokens: 1,
            window: 1,
            features: 4,
            candidates: 1,
            shifts_searched: 1,
            tolerance_steps: 1.5,
            threshold: 0.75,
            writer_formula: None,
            writer_description: None,
            writer_shift: None,
            outlier_edges: vec![],
        }
    }

    #[test]
    fn degenerate_findings_render_and_escape() {
        for f in [
            finding(vec![]),
            finding(vec![edge(vec![], vec![])]),
            finding(vec![
                edge(vec![-1.0, 0.5], vec![1.0]),
                edge(vec![1.0], vec![]),
            ]),
        ] {
            let charts = charts(&f).expect("charts render");
            let b = block(&f, &charts);
            assert!(!b.detail.contains("<script>"));
            // ragged profiles pad with NaN, never panic; −1 (nothing mapped) becomes NaN
            let m = slots_matrix(&f);
            assert_eq!(m.nrows(), f.caches.len());
            if f.caches.len() == 2 {
                assert!(m[[0, 0]].is_nan() && m[[0, 1]] == 0.5 && m[[1, 1]].is_nan());
            }
            assert_eq!(csv(&f).lines().count(), f.caches.len() + 1);
        }
    }
}
