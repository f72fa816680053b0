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
    check_ranges(r).map_err(bad)?;
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

/// Index and list sizes a real run keeps: the sections do arithmetic and lookups with them, and a
/// list far longer than its axis would make a lookup per row quadratic in the file.
fn check_ranges(r: &Results) -> std::result::Result<(), String> {
    let p = &r.probes;
    if let Some(s) = &p.stale {
        let l = r.provenance.cache_len;
        if let Some(st) = s.steps.iter().find(|st| st.step > st.position) {
            return Err(format!(
                "stale step {} is at position {}, before its own step count",
                st.step, st.position
            ));
        }
        for (what, n) in [
            ("never_written_slots", s.never_written_slots.len()),
            ("previously_written_slots", s.previously_written_slots.len()),
            ("leaks", s.leaks.len()),
        ] {
            if n > l {
                return Err(format!("stale {what} lists {n} slots of a {l}-slot ring"));
            }
        }
    }
    if let Some(s) = &p.splits {
        let n = s.prompt_len;
        if let Some(row) = s.rows.iter().find(|row| row.split > n) {
            return Err(format!(
                "splits row splits at {} of a {n}-token prompt",
                row.split
            ));
        }
        if s.rows.len() > n.saturating_add(1) || s.failing_splits.len() > s.rows.len() {
            return Err(format!(
                "splits lists {} rows and {} failing splits for a {n}-token prompt",
                s.rows.len(),
                s.failing_splits.len()
            ));
        }
    }
    if let Some(c) = &p.colmap {
        if c.rows.len() > c.entries.len() {
            return Err(format!(
                "colmap lists {} rows for {} entries",
                c.rows.len(),
                c.entries.len()
            ));
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
