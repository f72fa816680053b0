//! `ztap`: always-zero columns of what the tbt graph read (or of the ring bytes).

use std::fmt::Write as _;
use std::path::Path;

use kvprobe_schema::{Results, ZtapCache, ZtapFinding};
use ndarray::Array1;

use crate::cells::{cache_label, chart, kind_name, opt};
use crate::charts::heatmap::{self, Heatmap, Scale};
use crate::error::Result;
use crate::html::{fold, kv_table, table};
use crate::npy::write_npy;
use crate::section::{Chart, ProbeBlock, ProbeSection};
use crate::text::{csv_text, html_visible, num, visible};

pub const ZTAP_SVG: &str = "ztap_zero_map.svg";

pub struct Ztap;

impl ProbeSection for Ztap {
    fn tables(&self, r: &Results) -> Vec<(String, String)> {
        let Some(f) = &r.probes.ztap else {
            return Vec::new();
        };
        let mut s = "source,cache_id,layer,kind,entries,width,zero_columns,empty_entries,expected_transposed_zero_columns,interpretation\n".to_string();
        let written = f.caches.iter().map(|c| (f.source.as_str(), c));
        let tbt = f.tbt_written.iter().map(|c| ("tbt-written", c));
        for (source, c) in written.chain(tbt) {
            let _ = writeln!(
                s,
                "{},{},{},{},{},{},{},{},{},{}",
                csv_text(source),
                c.cache_id,
                opt(c.layer),
                kind_name(c.kind),
                c.entries,
                c.width,
                c.zero_columns,
                c.empty_entries,
                c.expected_transposed_zero_columns,
                csv_text(&c.interpretation)
            );
        }
        vec![("ztap.csv".to_string(), s)]
    }

    fn array_files(&self, r: &Results) -> Vec<String> {
        match &r.probes.ztap {
            Some(z) => z.caches.iter().map(zero_map_file).collect(),
            None => Vec::new(),
        }
    }

    fn write_arrays(&self, r: &Results, dir: &Path) -> Result<()> {
        if let Some(z) = &r.probes.ztap {
            for cache in &z.caches {
                let arr = Array1::from_vec(cache.zero_map.clone());
                write_npy(&dir.join(zero_map_file(cache)), &arr)?;
            }
        }
        Ok(())
    }

    fn reserved_prefixes(&self) -> &'static [&'static str] {
        &["ztap_zero_map"]
    }

    fn charts(&self, r: &Results) -> Result<Vec<Chart>> {
        match &r.probes.ztap {
            Some(f) => Ok(vec![(ZTAP_SVG, zero_map_chart(f)?)]),
            None => Ok(Vec::new()),
        }
    }

    fn block(&self, r: &Results, charts: &[Chart]) -> Option<ProbeBlock> {
        let f = r.probes.ztap.as_ref()?;
        let rows: Vec<_> = f
            .caches
            .iter()
            .map(|c| {
                (
                    vec![
                        c.cache_id.to_string(),
                        c.layer.map(|l| l.to_string()).unwrap_or_default(),
                        kind_name(c.kind).to_string(),
                        c.entries.to_string(),
                        c.width.to_string(),
                        c.zero_columns.to_string(),
                        c.empty_entries.to_string(),
                        num(c.expected_transposed_zero_columns, 1),
                        html_visible(&c.interpretation),
                    ],
                    None,
                )
            })
            .collect();
        Some(ProbeBlock {
            id: "ztap",
            title: "Zero-column taps",
            summary: kv_table(&[
                ("source", html_visible(&f.source)),
                ("interpretation", html_visible(&f.interpretation)),
                ("entries the first tbt steps wrote", tbt_written_summary(f)),
            ]),
            chart: chart(charts, ZTAP_SVG, "zero-column map per cache"),
            detail: fold(
                "per-cache table",
                &table(
                    &[
                        "cache",
                        "layer",
                        "kind",
                        "entries",
                        "width",
                        "zero columns",
                        "empty entries",
                        "expected if transposed",
                        "interpretation",
                    ],
                    &rows,
                ),
                rows.len(),
            ),
        })
    }

    fn summary(&self, r: &Results) -> String {
        let Some(f) = &r.probes.ztap else {
            return String::new();
        };
        let z: usize = f.caches.iter().map(|c| c.zero_columns).sum();
        format!(
            "ztap ({}): {} — {} zero columns over {} caches\n",
            f.source,
            f.interpretation,
            z,
            f.caches.len()
        )
    }
}

/// How many rings the tbt steps' entries were read from and which of them end in zero columns.
fn tbt_written_summary(f: &ZtapFinding) -> String {
    if f.tbt_written.is_empty() {
        return "not read".into();
    }
    let cut = f
        .tbt_written
        .iter()
        .filter(|c| c.interpretation == "truncation")
        .count();
    format!(
        "{} rings read, {cut} with the same zero tail in every entry",
        f.tbt_written.len()
    )
}

pub fn zero_map_file(c: &ZtapCache) -> String {
    format!("ztap_zero_map_c{}.npy", c.cache_id)
}

pub fn zero_map_chart(f: &ZtapFinding) -> Result<String> {
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
