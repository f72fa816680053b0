//! `maskconv`: the first tbt step under other mask conventions.

use std::fmt::Write as _;

use kvprobe_schema::Results;

use crate::cells::{cmp_cells, cmp_csv, with_cmp, yes, CMP_HEADER};
use crate::html::{fold, kv_table, table};
use crate::section::{Chart, ProbeBlock, ProbeSection};
use crate::text::{csv_text, html_visible, num};

pub struct Maskconv;

impl ProbeSection for Maskconv {
    fn tables(&self, r: &Results) -> Vec<(String, String)> {
        let Some(f) = &r.probes.maskconv else {
            return Vec::new();
        };
        let mut s = format!("variant,{CMP_HEADER},reproduces\n");
        for v in &f.variants {
            let _ = writeln!(
                s,
                "{},{},{}",
                csv_text(&v.name),
                cmp_csv(&v.comparison),
                v.reproduces
            );
        }
        vec![("maskconv.csv".to_string(), s)]
    }

    fn block(&self, r: &Results, _charts: &[Chart]) -> Option<ProbeBlock> {
        let f = r.probes.maskconv.as_ref()?;
        let rows: Vec<_> = f
            .variants
            .iter()
            .map(|v| {
                let mut cells = vec![html_visible(&v.name)];
                cells.extend(cmp_cells(&v.comparison));
                cells.push(yes(v.reproduces));
                (cells, Some(v.reproduces))
            })
            .collect();
        let mut head = with_cmp(&["mask variant"]);
        head.push("reproduces reference");
        Some(ProbeBlock {
            id: "maskconv",
            title: "Mask conventions on the first tbt step",
            summary: kv_table(&[
                (
                    "variant that reproduces the reference",
                    f.best
                        .as_deref()
                        .map(html_visible)
                        .unwrap_or_else(|| "none".into()),
                ),
                (
                    "other heads' mask rows ignored (cosine)",
                    f.other_heads_ignored_cosine
                        .map(|c| num(c, 6))
                        .unwrap_or_else(|| "—".into()),
                ),
                (
                    "prefill chunk: other heads' rows ignored (cosine; reference moves to)",
                    match (
                        f.prefill_other_heads_ignored_cosine,
                        f.prefill_per_head_reference_cosine,
                    ) {
                        (Some(c), Some(r)) => format!("{}; {}", num(c, 6), num(r, 4)),
                        _ => "—".into(),
                    },
                ),
            ]),
            chart: String::new(),
            detail: fold("variants", &table(&head, &rows), rows.len()),
        })
    }

    fn summary(&self, r: &Results) -> String {
        let Some(f) = &r.probes.maskconv else {
            return String::new();
        };
        let mut s = String::new();
        for v in &f.variants {
            s += &format!(
                "maskconv {:>10}: cosine {:.4}{}\n",
                v.name,
                v.comparison.cosine,
                if v.reproduces { "  reproduces" } else { "" }
            );
        }
        if let Some(c) = f.other_heads_ignored_cosine {
            s += &format!(
                "maskconv: other heads' rows changed → output cosine {c:.6} to the ring output\n"
            );
        }
        if let (Some(c), Some(r)) = (
            f.prefill_other_heads_ignored_cosine,
            f.prefill_per_head_reference_cosine,
        ) {
            s += &format!(
                "maskconv: prefill chunk, other heads' rows changed → output cosine {c:.6} to the plain chunk (reference {r:.4})\n"
            );
        }
        s
    }
}
