//! `inject`: golden token-major rings (and K↔V swapped ones) written into the device.

use std::fmt::Write as _;

use kvprobe_schema::Results;

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
        let mut s = format!("rings,{CMP_HEADER},blame\n");
        for (name, c) in [
            ("device", &f.device_rings),
            ("golden", &f.golden),
            ("golden-swapped", &f.golden_swapped),
        ] {
            let _ = writeln!(s, "{name},{},{}", cmp_csv(c), csv_text(&f.blame));
        }
        vec![("inject.csv".to_string(), s)]
    }

    fn block(&self, r: &Results, _charts: &[Chart]) -> Option<ProbeBlock> {
        let f = r.probes.inject.as_ref()?;
        let rows: Vec<_> = [
            ("device's own rings", &f.device_rings),
            ("golden token-major rings", &f.golden),
            ("golden rings, K↔V swapped", &f.golden_swapped),
        ]
        .into_iter()
        .map(|(name, c)| {
            let mut cells = vec![html(name)];
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
        let Some(f) = &r.probes.inject else {
            return String::new();
        };
        format!(
            "inject: device rings {:.4}, golden {:.4}, golden swapped {:.4} → blame {}\n",
            f.device_rings.cosine, f.golden.cosine, f.golden_swapped.cosine, f.blame
        )
    }
}
