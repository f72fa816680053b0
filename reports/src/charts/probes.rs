//! The charts of each probe, built from its finding: (file name, SVG text) pairs.

use super::heatmap::{self, Heatmap, RowClass, Scale};
use super::metric::{self, MetricChart};
use crate::error::Result;
use crate::issue10;
use crate::tables::kind_name;
use crate::text::visible;
use kvprobe_schema::{
    ColmapFinding, ColumnMatch, GreedyFinding, Layout, LayoutFinding, PositionsFinding,
    PrefillFinding, Results, SelfmaskFinding, ZtapFinding,
};

pub const COLMAP_SVG: &str = "colmap.svg";
pub const ZTAP_SVG: &str = "ztap_zero_map.svg";
pub const LAYOUT_SVG: &str = "layout.svg";
pub const GREEDY_SVG: &str = "greedy.svg";
pub const SELFMASK_SVG: &str = "selfmask.svg";
pub const PREFILL_SVG: &str = "prefill.svg";
pub const POSITIONS_SVG: &str = "positions.svg";

/// Every chart `results` has data for, in a fixed order.
pub fn charts(results: &Results) -> Result<Vec<(&'static str, String)>> {
    let p = &results.probes;
    let mut out = Vec::new();
    if let Some(f) = &p.prefill {
        out.push((PREFILL_SVG, prefill(f)?));
    }
    if let Some(f) = &p.greedy {
        out.push((GREEDY_SVG, greedy(f)?));
    }
    if let Some(f) = &p.selfmask {
        out.push((SELFMASK_SVG, selfmask(f)?));
    }
    if let Some(f) = &p.colmap {
        out.push((COLMAP_SVG, colmap(f)?));
    }
    if let Some(f) = &p.ztap {
        out.push((ZTAP_SVG, zero_map(f)?));
    }
    if let Some(f) = &p.positions {
        out.push((POSITIONS_SVG, positions(f)?));
    }
    if let Some(f) = &p.layout {
        out.push((LAYOUT_SVG, layout(f)?));
    }
    if let Some(f) = &p.stale {
        out.push((
            issue10::STALE_SVG,
            issue10::stale_chart(f, results.provenance.cache_len)?,
        ));
    }
    if let Some(f) = &p.causality {
        out.push((issue10::CAUSALITY_SVG, issue10::causality_chart(f)?));
    }
    if let Some(f) = &p.splits {
        out.push((issue10::SPLITS_SVG, issue10::splits_chart(f)?));
    }
    if let Some(f) = &p.layout_infer {
        out.extend(crate::layout_infer::charts(f)?);
    }
    Ok(out)
}

pub fn prefill(f: &PrefillFinding) -> Result<String> {
    metric::render(&MetricChart {
        title: "prefill: device vs reference logits per prompt position".into(),
        x_desc: "prompt position (last token of the prefix)".into(),
        xs: f.rows.iter().map(|r| r.position as f64).collect(),
        cosine: f.rows.iter().map(|r| r.comparison.cosine).collect(),
        top1: f.rows.iter().map(|r| r.comparison.top1_match).collect(),
        marker: None,
    })
}

pub fn greedy(f: &GreedyFinding) -> Result<String> {
    metric::render(&MetricChart {
        title: "greedy: device vs reference logits per step (teacher-forced)".into(),
        x_desc: "step (0 = token from prefill)".into(),
        xs: f.steps.iter().map(|s| s.step as f64).collect(),
        cosine: f.steps.iter().map(|s| s.comparison.cosine).collect(),
        top1: f.steps.iter().map(|s| s.comparison.top1_match).collect(),
        marker: f
            .first_divergence
            .map(|d| (d as f64, format!("first divergence (step {d})"))),
    })
}

pub fn selfmask(f: &SelfmaskFinding) -> Result<String> {
    metric::render(&MetricChart {
        title: "selfmask: tbt steps seeing only themselves vs reference".into(),
        x_desc: "step".into(),
        xs: f.steps.iter().map(|s| s.step as f64).collect(),
        cosine: f.steps.iter().map(|s| s.comparison.cosine).collect(),
        top1: f.steps.iter().map(|s| s.comparison.top1_match).collect(),
        marker: None,
    })
}

pub fn positions(f: &PositionsFinding) -> Result<String> {
    metric::render(&MetricChart {
        title: "positions: first tbt step with the positional input at pos + δ".into(),
        x_desc: "δ (position offset)".into(),
        xs: f.points.iter().map(|p| p.delta as f64).collect(),
        cosine: f.points.iter().map(|p| p.comparison.cosine).collect(),
        top1: f.points.iter().map(|p| p.comparison.top1_match).collect(),
        marker: Some((f.best_delta as f64, format!("best δ = {:+}", f.best_delta))),
    })
}

fn row_class(c: ColumnMatch) -> RowClass {
    match c {
        ColumnMatch::Clean => RowClass::Clean,
        ColumnMatch::Mixture => RowClass::Mixture,
        ColumnMatch::None => RowClass::None,
    }
}

pub fn colmap(f: &ColmapFinding) -> Result<String> {
    let expected = crate::arrays::colmap_expected(f);
    let row_info: Vec<Option<&kvprobe_schema::ColmapRow>> = f
        .entries
        .iter()
        .map(|e| f.rows.iter().find(|r| r.entry == *e))
        .collect();
    let row_labels = f
        .entries
        .iter()
        .zip(&row_info)
        .map(|(e, r)| match r.and_then(|r| r.expected_position) {
            Some(p) => format!("j {e} (p {p})"),
            None => format!("j {e} (empty)"),
        })
        .collect();
    let col_labels = f
        .positions
        .iter()
        .enumerate()
        .map(|(k, p)| {
            let tok = f
                .position_tokens
                .get(k)
                .map(|t| visible(t))
                .unwrap_or_default();
            format!("{p} {tok}")
        })
        .collect();
    let mut notes = vec![format!(
        "query token {} at position {}; outlined = where the ring arithmetic puts each prompt position",
        f.query_token, f.query_position
    )];
    if !f.covered_all {
        notes.push(format!(
            "covered part of the window only: {} entries (written ones plus a few empty)",
            f.entries.len()
        ));
    }
    let (rows, cols) = (f.entries.len(), f.positions.len());
    if rows > heatmap::MAX_CELLS || cols > heatmap::MAX_CELLS {
        notes.push(format!(
            "{rows} × {cols} cells shown pooled: each cell is the maximum of its block; labels name a block's first row/column"
        ));
    }
    heatmap::render(&Heatmap {
        title: "colmap: which prompt position each cache entry holds (cosine)".into(),
        notes,
        values: f
            .matrix
            .iter()
            .map(|r| r.iter().map(|v| *v as f64).collect())
            .collect(),
        marked: expected.outer_iter().map(|r| r.to_vec()).collect(),
        mark_label: Some("expected cell (ring arithmetic)".into()),
        row_labels,
        col_labels,
        row_class: Some(
            row_info
                .iter()
                .map(|r| r.map(|r| row_class(r.class)).unwrap_or(RowClass::None))
                .collect(),
        ),
        x_title: "reference prompt position p and its token".into(),
        y_title: "device read-window entry j (expected position)".into(),
        scale: Scale::Diverging,
        scale_label: "cosine".into(),
        nan_label: "no data".into(),
        square: true,
    })
}

fn cache_label(id: u32, layer: Option<usize>, kind: Option<kvprobe_schema::CacheKind>) -> String {
    let mut s = format!("cache {id}");
    if let Some(l) = layer {
        s.push_str(&format!(" L{l}"));
    }
    let k = kind_name(kind);
    if !k.is_empty() {
        s.push(' ');
        s.push_str(k);
    }
    s
}

pub fn zero_map(f: &ZtapFinding) -> Result<String> {
    let width = f.caches.iter().map(|c| c.zero_map.len()).max().unwrap_or(0);
    let values = f
        .caches
        .iter()
        .map(|c| {
            (0..width)
                .map(|k| match c.zero_map.get(k) {
                    Some(true) => 1.0,
                    Some(false) => 0.0,
                    None => f64::NAN,
                })
                .collect()
        })
        .collect();
    let mut notes = vec![format!(
        "source: {} — dark = the column is zero in every examined entry",
        visible(&f.source)
    )];
    if width > heatmap::MAX_CELLS {
        notes.push("columns pooled: shade = fraction of zero columns in the block".into());
    }
    heatmap::render(&Heatmap {
        title: "ztap: always-zero columns per cache".into(),
        notes,
        values,
        marked: vec![],
        mark_label: None,
        row_labels: f
            .caches
            .iter()
            .map(|c| cache_label(c.cache_id, c.layer, c.kind))
            .collect(),
        col_labels: (0..width).map(|k| k.to_string()).collect(),
        row_class: None,
        x_title: "column within an entry".into(),
        y_title: "cache".into(),
        scale: Scale::Fraction,
        scale_label: "zero in every entry".into(),
        nan_label: "beyond this cache's width".into(),
        square: false,
    })
}

fn layout_abbrev(l: Layout) -> &'static str {
    match l {
        Layout::TokenMajor => "TM",
        Layout::FeatureMajor => "FM",
        Layout::F8cr => "F8",
        Layout::HeadMajor => "HM",
        Layout::Tile16 => "T16",
    }
}

pub fn layout(f: &LayoutFinding) -> Result<String> {
    let corr = crate::arrays::layout_correlations(f);
    let ns = f.shifts.len();
    let values = corr
        .outer_iter()
        .map(|cache| cache.iter().copied().collect())
        .collect();
    let marked = f
        .caches
        .iter()
        .map(|c| {
            let mut row = vec![false; Layout::ALL.len() * ns];
            let li = Layout::ALL.iter().position(|l| *l == c.best_layout);
            let si = f.shifts.iter().position(|s| *s == c.best_shift);
            if let (Some(li), Some(si)) = (li, si) {
                row[li * ns + si] = true;
            }
            row
        })
        .collect();
    let col_labels = Layout::ALL
        .iter()
        .flat_map(|l| {
            f.shifts
                .iter()
                .map(move |s| format!("{} {s:+}", layout_abbrev(*l)))
        })
        .collect();
    heatmap::render(&Heatmap {
        title: "layout: ring bytes decoded per layout and slot shift vs reference K/V".into(),
        notes: vec![
            "TM = token-major, FM = feature-major, F8 = f8cr; shift = slot offset from t mod L"
                .into(),
            format!(
                "writer: {} at shift {:+} (mean correlation {:.3})",
                f.writer_layout.name(),
                f.writer_shift,
                f.writer_score
            ),
        ],
        values,
        marked,
        mark_label: Some("best layout and shift".into()),
        row_labels: f
            .caches
            .iter()
            .map(|c| cache_label(c.cache_id, c.layer, c.kind))
            .collect(),
        col_labels,
        row_class: None,
        x_title: "layout and slot shift".into(),
        y_title: "cache".into(),
        scale: Scale::Diverging,
        scale_label: "correlation".into(),
        nan_label: "not tried".into(),
        square: false,
    })
}
