//! SVG charts drawn with plotters' SVG backend (no fonts, no C): heatmaps on a pixel canvas
//! (full control of label thinning), metric lines on plotters' cartesian charts.
//!
//! Every chart is a pure function of the findings, so a re-render is byte-identical.

pub mod heatmap;
pub mod metric;

use crate::error::Error;

pub(crate) fn chart_err<E: std::fmt::Display>(name: &'static str) -> impl Fn(E) -> Error {
    move |e| Error::Chart {
        name: name.to_string(),
        message: e.to_string(),
    }
}

/// plotters' SVG backend writes `font-size = size / 1.24`; this gives the pixel size asked for.
pub(crate) fn font_px(px: f64) -> f64 {
    px * 1.24
}

pub(crate) const FONT: &str = "sans-serif";

/// Rows of an `f32` matrix as the `f64` rows a heatmap takes.
pub(crate) fn to_f64(m: &ndarray::Array2<f32>) -> Vec<Vec<f64>> {
    m.outer_iter()
        .map(|r| r.iter().map(|v| *v as f64).collect())
        .collect()
}

/// The note a heatmap too large to show cell by cell carries.
pub(crate) fn pooled_note(notes: &mut Vec<String>, rows: usize, cols: usize) {
    if rows > heatmap::MAX_CELLS || cols > heatmap::MAX_CELLS {
        notes.push(format!(
            "{rows} × {cols} cells shown pooled; labels name a block's first row/column"
        ));
    }
}
