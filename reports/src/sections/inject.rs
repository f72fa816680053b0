//! `inject`: golden token-major rings (and K↔V swapped ones, and ones re-encoded for a reader
//! of another layout) written into the device.

use std::fmt::Write as _;

use kvprobe_schema::{CacheKind, InjectFinding, LogitComparison, ReaderLayoutRepair, Results};

use crate::cells::{cmp_cells, cmp_csv, with_cmp, CMP_HEADER};
use crate::html::{fold, kv_table, table};
use crate::section::{Chart, ProbeBlock, ProbeSection};
use crate::text::{csv_text, html, html_visible};

pub struct Inject;

impl ProbeSection for Inject {
    fn tables(&self, r: &Results) -> Vec<(String, String)> {
        let Some(f) = &r.probes.inject else {
            return Vec::new();
        };
        let mut s = format!("rings,{CMP_HEADER},blame,edges\n");
        for (name, c, edges) in runs(f) {
            let _ = writeln!(
                s,
                "{name},{},{},{}",
                cmp_csv(c),
                csv_text(&f.blame),
                csv_text(&edges)
            );
        }
        vec![("inject.csv".to_string(), s)]
    }

    fn block(&self, r: &Results, _charts: &[Chart]) -> Option<ProbeBlock> {
        let f = r.probes.inject.as_ref()?;
        let rows: Vec<_> = runs(f)
            .into_iter()
            .map(|(name, c, edges)| {
                let label = match name {
                    "device" => "device's own rings".to_string(),
                    "golden" => "golden token-major rings".to_string(),
                    "golden-swapped" => "golden rings, K↔V swapped".to_string(),
                    "partial-swap" => format!("golden rings, K↔V swapped on {edges}"),
                    "golden-left-valid" => "golden rings, left-valid mask".to_string(),
                    _ => format!("golden rings re-encoded for a reader of {edges}"),
                };
                let mut cells = vec![html(&label)];
                cells.extend(cmp_cells(c));
                (cells, Some(c.top1_match))
            })
            .collect();
        Some(ProbeBlock {
            id: "inject",
            title: "Golden-ring injection",
            summary: kv_table(&[("blame", html_visible(&f.blame))]),
            chart: String::new(),
            detail: fold("runs", &table(&with_cmp(&["rings"]), &rows), rows.len()),
        })
    }

    fn summary(&self, r: &Results) -> String {
        let reader = r
            .probes
            .inject
            .as_ref()
            .and_then(|f| f.reader_layout.as_ref())
            .map(|l| {
                format!(
                    "; re-encoded for a reader of {} {:.4}",
                    reader_edges(l),
                    l.comparison.cosine
                )
            })
            .unwrap_or_default();
        let Some(f) = &r.probes.inject else {
            return String::new();
        };
        format!(
            "inject: device rings {:.4}, golden {:.4}, golden swapped {:.4}{reader} → blame {}\n",
            f.device_rings.cosine, f.golden.cosine, f.golden_swapped.cosine, f.blame
        )
    }
}

/// Every ring variant the probe ran, with the edges it changed ("" for the whole-ring ones).
fn runs(f: &InjectFinding) -> Vec<(&'static str, &LogitComparison, String)> {
    let mut v = vec![
        ("device", &f.device_rings, String::new()),
        ("golden", &f.golden, String::new()),
        ("golden-swapped", &f.golden_swapped, String::new()),
    ];
    if let Some(p) = &f.partial_swap {
        let layers: Vec<String> = p.layers.iter().map(usize::to_string).collect();
        v.push((
            "partial-swap",
            &p.comparison,
            format!("layers {}", layers.join(" ")),
        ));
    }
    if let Some(c) = &f.golden_left_valid {
        v.push(("golden-left-valid", c, String::new()));
    }
    if let Some(l) = &f.reader_layout {
        v.push(("reader-layout", &l.comparison, reader_edges(l)));
    }
    v
}

/// "K0 f8cr, K1 f8cr": each re-encoded edge and the layout its reader was assumed to decode.
fn reader_edges(l: &ReaderLayoutRepair) -> String {
    l.edges
        .iter()
        .map(|e| {
            let kind = if e.kind == CacheKind::K { "K" } else { "V" };
            format!("{kind}{} {}", e.layer, e.layout.name())
        })
        .collect::<Vec<_>>()
        .join(" ")
}
