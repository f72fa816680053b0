//! `colmap`: the single-key column-to-token map of the first tbt window.

use std::fmt::Write as _;
use std::path::Path;

use kvprobe_schema::{ColmapFinding, ColmapRow, ColumnMatch, Results};
use ndarray::Array2;

use crate::cells::{chart, opt, yes};
use crate::charts::heatmap::{self, Heatmap, RowClass, Scale};
use crate::error::{Error, Result};
use crate::html::{fold, kv_table, table};
use crate::index::first_index;
use crate::npy::write_npy;
use crate::section::{Chart, ProbeBlock, ProbeSection};
use crate::text::{html_visible, num, visible};

pub const COLMAP_SVG: &str = "colmap.svg";

pub struct Colmap;

impl ProbeSection for Colmap {
    fn tables(&self, r: &Results) -> Vec<(String, String)> {
        let Some(f) = &r.probes.colmap else {
            return Vec::new();
        };
        let mut s =
            "entry,expected_position,best_position,best_cosine,second_cosine,class\n".to_string();
        for row in &f.rows {
            let _ = writeln!(
                s,
                "{},{},{},{},{},{}",
                row.entry,
                opt(row.expected_position),
                opt(row.best_position),
                row.best_cosine,
                row.second_cosine,
                class_name(row.class)
            );
        }
        vec![("colmap_rows.csv".to_string(), s)]
    }

    fn array_files(&self, r: &Results) -> Vec<String> {
        match r.probes.colmap {
            Some(_) => vec!["colmap.npy".to_string(), "colmap_expected.npy".to_string()],
            None => Vec::new(),
        }
    }

    fn write_arrays(&self, r: &Results, dir: &Path) -> Result<()> {
        if let Some(c) = &r.probes.colmap {
            write_npy(&dir.join("colmap.npy"), &colmap_matrix(c)?)?;
            write_npy(&dir.join("colmap_expected.npy"), &colmap_expected(c))?;
        }
        Ok(())
    }

    fn reserved_prefixes(&self) -> &'static [&'static str] {
        &["colmap"]
    }

    fn charts(&self, r: &Results) -> Result<Vec<Chart>> {
        match &r.probes.colmap {
            Some(f) => Ok(vec![(COLMAP_SVG, colmap_chart(f)?)]),
            None => Ok(Vec::new()),
        }
    }

    fn block(&self, r: &Results, charts: &[Chart]) -> Option<ProbeBlock> {
        let f = r.probes.colmap.as_ref()?;
        let at = first_index(&f.positions, |p| *p);
        let rows: Vec<_> = f.rows.iter().map(|row| row_cells(f, row, &at)).collect();
        Some(ProbeBlock {
            id: "colmap",
            title: "Column-to-token map (single-key steps)",
            summary: kv_table(&summary_pairs(f)),
            chart: chart(charts, COLMAP_SVG, "colmap heatmap"),
            detail: fold(
                "per-entry table",
                &table(
                    &[
                        "entry j",
                        "expected position",
                        "best position",
                        "best token",
                        "best cosine",
                        "second cosine",
                        "class",
                    ],
                    &rows,
                ),
                rows.len(),
            ),
        })
    }

    fn summary(&self, r: &Results) -> String {
        let Some(f) = &r.probes.colmap else {
            return String::new();
        };
        format!(
            "colmap: {} entries × {} positions, diagonal {:.3}, best off-diagonal {:.3}, best shift {:+} ({:.3}), permutation {:.3}, {} clean / {} mixture, never-written rows identical: {:?}\n",
            f.entries.len(),
            f.positions.len(),
            f.diagonal_strength,
            f.best_off_diagonal,
            f.best_shift,
            f.best_shift_score,
            f.best_permutation_score,
            f.clean_rows,
            f.mixture_rows,
            f.empty_rows_identical
        )
    }
}

pub fn class_name(c: ColumnMatch) -> &'static str {
    match c {
        ColumnMatch::Clean => "clean",
        ColumnMatch::Mixture => "mixture",
        ColumnMatch::None => "none",
    }
}

/// `at`: where each position stands in `f.positions`.
fn row_cells(
    f: &ColmapFinding,
    row: &ColmapRow,
    at: &std::collections::HashMap<usize, usize>,
) -> (Vec<String>, Option<bool>) {
    let opt = |v: Option<usize>| v.map(|x| x.to_string()).unwrap_or_else(|| "—".into());
    let ok = row.expected_position.map(|e| row.best_position == Some(e));
    let best_token = row
        .best_position
        .and_then(|p| at.get(&p).copied())
        .map(|k| {
            f.position_tokens
                .get(k)
                .map(|t| format!("<code class=\"tok\">{}</code>", html_visible(t)))
                .unwrap_or_default()
        })
        .unwrap_or_default();
    (
        vec![
            row.entry.to_string(),
            opt(row.expected_position),
            opt(row.best_position),
            best_token,
            num(row.best_cosine, 4),
            num(row.second_cosine, 4),
            class_name(row.class).to_string(),
        ],
        ok,
    )
}

fn summary_pairs(f: &ColmapFinding) -> Vec<(&'static str, String)> {
    let opt_bool = |b: Option<bool>| b.map(yes).unwrap_or_else(|| "—".into());
    vec![
        (
            "query",
            format!("token {} at position {}", f.query_token, f.query_position),
        ),
        ("diagonal strength", num(f.diagonal_strength, 4)),
        ("best off-diagonal", num(f.best_off_diagonal, 4)),
        (
            "best shift",
            format!("{:+} (score {})", f.best_shift, num(f.best_shift_score, 4)),
        ),
        ("best permutation score", num(f.best_permutation_score, 4)),
        (
            "rows",
            format!(
                "{} clean, {} mixtures, of {}",
                f.clean_rows,
                f.mixture_rows,
                f.rows.len()
            ),
        ),
        (
            "never-written rows identical",
            opt_bool(f.empty_rows_identical),
        ),
        (
            "never-written rows spread (1 − cos)",
            f.empty_rows_spread
                .map(|x| num(x, 4))
                .unwrap_or_else(|| "—".into()),
        ),
        ("whole window covered", yes(f.covered_all)),
    ]
}

/// `[entries, positions]`; ragged rows are an error (the finding is malformed).
pub fn colmap_matrix(c: &ColmapFinding) -> Result<Array2<f32>> {
    let (r, n) = (c.entries.len(), c.positions.len());
    if c.matrix.len() != r || c.matrix.iter().any(|row| row.len() != n) {
        return Err(Error::BadArray {
            name: "colmap".into(),
            reason: format!(
                "matrix is not [entries={r}][positions={n}]; the colmap finding is malformed"
            ),
        });
    }
    let flat: Vec<f32> = c.matrix.iter().flatten().copied().collect();
    Array2::from_shape_vec((r, n), flat).map_err(|e| Error::BadArray {
        name: "colmap".into(),
        reason: e.to_string(),
    })
}

/// `[entries, positions]`: true where the ring arithmetic puts prompt position p at entry j.
pub fn colmap_expected(c: &ColmapFinding) -> Array2<bool> {
    let mut m = Array2::from_elem((c.entries.len(), c.positions.len()), false);
    let (rows, at) = (
        first_index(&c.rows, |r| r.entry),
        first_index(&c.positions, |p| *p),
    );
    for (i, entry) in c.entries.iter().enumerate() {
        let expected = rows.get(entry).and_then(|&r| c.rows[r].expected_position);
        if let Some(p) = expected {
            if let Some(&k) = at.get(&p) {
                m[[i, k]] = true;
            }
        }
    }
    m
}

fn row_class(c: ColumnMatch) -> RowClass {
    match c {
        ColumnMatch::Clean => RowClass::Clean,
        ColumnMatch::Mixture => RowClass::Mixture,
        ColumnMatch::None => RowClass::None,
    }
}

pub fn colmap_chart(f: &ColmapFinding) -> Result<String> {
    let expected = colmap_expected(f);
    let rows = first_index(&f.rows, |r| r.entry);
    let row_info: Vec<Option<&ColmapRow>> = f
        .entries
        .iter()
        .map(|e| rows.get(e).map(|&r| &f.rows[r]))
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
