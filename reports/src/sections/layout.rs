//! `layout`: the ring bytes after prefill decoded under each named layout and slot shift.

use std::fmt::Write as _;
use std::path::Path;

use kvprobe_schema::{Layout, LayoutFinding, Results};
use ndarray::Array3;

use crate::cells::{cache_label, chart, kind_name, opt};
use crate::charts::heatmap::{self, Heatmap, Scale};
use crate::error::Result;
use crate::html::{fold, kv_table, table};
use crate::npy::write_npy;
use crate::section::{Chart, ProbeBlock, ProbeSection};
use crate::text::{html, num};

pub const LAYOUT_SVG: &str = "layout.svg";
const CORRELATIONS_NPY: &str = "layout_correlations.npy";

pub struct LayoutSection;

impl ProbeSection for LayoutSection {
    fn tables(&self, r: &Results) -> Vec<(String, String)> {
        match &r.probes.layout {
            Some(f) => vec![("layout.csv".to_string(), csv(f))],
            None => Vec::new(),
        }
    }

    fn array_files(&self, r: &Results) -> Vec<String> {
        match r.probes.layout {
            Some(_) => vec![CORRELATIONS_NPY.to_string()],
            None => Vec::new(),
        }
    }

    fn write_arrays(&self, r: &Results, dir: &Path) -> Result<()> {
        match &r.probes.layout {
            Some(l) => write_npy(&dir.join(CORRELATIONS_NPY), &layout_correlations(l)),
            None => Ok(()),
        }
    }

    fn reserved_prefixes(&self) -> &'static [&'static str] {
        &["layout_correlations"]
    }

    fn charts(&self, r: &Results) -> Result<Vec<Chart>> {
        match &r.probes.layout {
            Some(f) => Ok(vec![(LAYOUT_SVG, layout_chart(f)?)]),
            None => Ok(Vec::new()),
        }
    }

    fn block(&self, r: &Results, charts: &[Chart]) -> Option<ProbeBlock> {
        let f = r.probes.layout.as_ref()?;
        let rows: Vec<_> = f
            .caches
            .iter()
            .map(|c| {
                (
                    vec![
                        c.cache_id.to_string(),
                        c.layer.map(|l| l.to_string()).unwrap_or_default(),
                        kind_name(c.kind).to_string(),
                        c.best_layout.name().to_string(),
                        format!("{:+}", c.best_shift),
                        num(c.best_score, 4),
                        num(c.token_major_score, 4),
                    ],
                    None,
                )
            })
            .collect();
        Some(ProbeBlock {
            id: "layout",
            title: "Writer layout and placement from the ring bytes",
            summary: kv_table(&[
                ("writer layout", html(f.writer_layout.name())),
                ("writer slot shift", format!("{:+}", f.writer_shift)),
                ("mean correlation", num(f.writer_score, 4)),
            ]),
            chart: chart(charts, LAYOUT_SVG, "layout correlation matrix"),
            detail: fold(
                "per-cache table",
                &table(
                    &[
                        "cache",
                        "layer",
                        "kind",
                        "best layout",
                        "best shift",
                        "best score",
                        "token-major score",
                    ],
                    &rows,
                ),
                rows.len(),
            ),
        })
    }

    fn summary(&self, r: &Results) -> String {
        let Some(f) = &r.probes.layout else {
            return String::new();
        };
        format!(
            "layout: writer {} at shift {:+}, mean correlation {:.3}\n",
            f.writer_layout.name(),
            f.writer_shift,
            f.writer_score
        )
    }
}

/// layout.csv: one row per cache, layout and shift tried.
fn csv(f: &LayoutFinding) -> String {
    let mut s = "cache_id,layer,kind,layout,shift,score,best\n".to_string();
    for c in &f.caches {
        for sc in &c.scores {
            let best = sc.layout == c.best_layout && sc.shift == c.best_shift;
            let _ = writeln!(
                s,
                "{},{},{},{},{},{},{}",
                c.cache_id,
                opt(c.layer),
                kind_name(c.kind),
                sc.layout.name(),
                sc.shift,
                sc.score,
                best
            );
        }
    }
    s
}

/// `[caches, layouts (Layout::ALL order), shifts (finding.shifts order)]`; NaN = not tried.
pub fn layout_correlations(l: &LayoutFinding) -> Array3<f64> {
    let mut m = Array3::from_elem(
        (l.caches.len(), Layout::ALL.len(), l.shifts.len()),
        f64::NAN,
    );
    let shift_at = crate::index::first_index(&l.shifts, |s| *s);
    for (i, cache) in l.caches.iter().enumerate() {
        for s in &cache.scores {
            let li = Layout::ALL.iter().position(|x| *x == s.layout);
            let si = shift_at.get(&s.shift).copied();
            if let (Some(li), Some(si)) = (li, si) {
                m[[i, li, si]] = s.score;
            }
        }
    }
    m
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

pub fn layout_chart(f: &LayoutFinding) -> Result<String> {
    let corr = layout_correlations(f);
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
