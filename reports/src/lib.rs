//! kvprobe reports: results.json, CSV tables, `.npy` arrays, SVG charts and a self-contained
//! report.html from the schema's findings alone (depends on `kvprobe-schema`, never on probes,
//! devices or models — design.md).
//!
//! - [`write_artifacts`] writes a run's folder;
//! - [`render_report`] re-renders report.html and the SVGs from results.json, byte-identical;
//! - [`render_compare`] writes compare.html: before the fix beside after the fix.

pub mod arrays;
mod cells;
pub mod charts;
pub mod error;
pub mod fixtures;
pub mod fixtures_replay;
mod fsio;
pub mod html;
mod index;
pub mod interrupt;
pub mod markdown;
pub mod marker;
mod npy;
pub mod render;
pub mod run_folder;
pub mod section;
pub mod sections;
pub mod summary;
pub mod text;
mod validate;

pub use arrays::{ArrayData, NamedArray};
pub use error::{Error, Result};
pub use fsio::{exclusive_temp, folder_of};
pub use marker::MARKER;
pub use render::{
    load_results, render_compare, render_markdown, render_report, write_artifacts, COMPARE_HTML,
    REPORT_HTML, RESULTS_JSON, SUMMARY_MD,
};
pub use run_folder::{check_out_dir, write_run_folder};
pub use section::{Chart, ProbeBlock, ProbeSection};
pub use summary::text as summary;
