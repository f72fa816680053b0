//! results.json checked against itself on load, before anything is drawn: every matrix has the
//! shape its axes declare (a colmap with more rows than entries panicked while pooling), and no
//! chart is sized beyond what the file's data can back (a 1.4 MB file declared a 10 GB matrix).

use std::path::Path;

use kvprobe_schema::{Layout, Results};

use crate::error::{Error, Result};

/// Cells one chart may allocate whatever the file's size: far above a real run's largest (a
/// 2048-slot ring × 64 steps), far below memory trouble (about 13 bytes a cell while drawing).
const MIN_CELL_BUDGET: u64 = 1 << 22;
/// Beyond that, cells per byte of results.json: a cell of real data takes at least two bytes of
/// JSON, and the sparse matrices (stale, splits, layout) are a few times their data at most.
const CELLS_PER_BYTE: u64 = 4;

/// `Error::Malformed` naming `path` for the first inconsistency of `r`, read from `file_len` bytes.
pub(crate) fn check(r: &Results, path: &Path, file_len: usize) -> Result<()> {
    let bad = |detail: String| Error::Malformed {
        path: path.to_path_buf(),
        detail,
    };
    check_shapes(r).map_err(bad)?;
    let budget = MIN_CELL_BUDGET.max(CELLS_PER_BYTE.saturating_mul(file_len as u64));
    for (what, cells) in declared_cells(r) {
        if cells > budget {
            return Err(bad(format!(
                "the {what} declares {cells} cells, more than {file_len} bytes of results can hold"
            )));
        }
    }
    Ok(())
}

/// Matrices stored whole must match their axes (the charts index one by the other).
fn check_shapes(r: &Results) -> std::result::Result<(), String> {
    if let Some(c) = &r.probes.colmap {
        rectangular(
            "colmap matrix",
            &c.matrix,
            ("entries", c.entries.len()),
            ("positions", c.positions.len()),
        )?;
    }
    if let Some(c) = &r.probes.causality {
        for (name, m) in [
            ("causality matrix", &c.matrix),
            ("causality first_layer_matrix", &c.first_layer_matrix),
        ] {
            rectangular(
                name,
                m,
                ("slots", c.slots.len()),
                ("perturbed", c.perturbed.len()),
            )?;
        }
    }
    Ok(())
}

fn rectangular(
    name: &str,
    m: &[Vec<f32>],
    (row_axis, rows): (&str, usize),
    (col_axis, cols): (&str, usize),
) -> std::result::Result<(), String> {
    if m.len() != rows {
        return Err(format!("{name} has {} rows for {rows} {row_axis}", m.len()));
    }
    match m.iter().position(|r| r.len() != cols) {
        Some(i) => Err(format!(
            "{name} row {i} has {} values for {cols} {col_axis}",
            m[i].len()
        )),
        None => Ok(()),
    }
}

/// (what, cells) of every matrix the charts and arrays allocate, sized as the sections size them.
fn declared_cells(r: &Results) -> Vec<(&'static str, u64)> {
    let p = &r.probes;
    let n = |x: usize| x as u64;
    let grid = |rows: usize, cols: usize| n(rows).saturating_mul(n(cols));
    let mut out = Vec::new();
    if let Some(c) = &p.colmap {
        out.push(("colmap", grid(c.entries.len(), c.positions.len())));
    }
    if let Some(z) = &p.ztap {
        let width = z.caches.iter().map(|c| c.zero_map.len()).max();
        out.push(("ztap zero map", grid(z.caches.len(), width.unwrap_or(0))));
    }
    if let Some(l) = &p.layout {
        let cols = grid(Layout::ALL.len(), l.shifts.len());
        out.push((
            "layout correlation matrix",
            n(l.caches.len()).saturating_mul(cols),
        ));
    }
    if let Some(l) = &p.layout_infer {
        let width = l
            .caches
            .iter()
            .map(|c| c.slot_fraction.len().max(c.column_fraction.len()))
            .max();
        out.push(("layout_infer map", grid(l.caches.len(), width.unwrap_or(0))));
    }
    if let Some(s) = &p.stale {
        out.push(("stale map", grid(s.steps.len(), r.provenance.cache_len)));
    }
    if let Some(c) = &p.causality {
        let rows = c.slots.len().max(c.slot_positions.len());
        out.push(("causality matrix", grid(rows, c.perturbed.len())));
    }
    if let Some(s) = &p.splits {
        out.push(("splits matrix", grid(s.rows.len(), s.prompt_len)));
    }
    out
}
