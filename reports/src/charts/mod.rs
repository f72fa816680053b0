//! SVG charts drawn with plotters' SVG backend (no fonts, no C): heatmaps on a pixel canvas
//! (full control of label thinning), metric lines on plotters' cartesian charts.
//!
//! Every chart is a pure function of the findings, so a re-render is byte-identical.

pub mod heatmap;
pub mod metric;
pub mod probes;

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
