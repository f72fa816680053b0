//! `quant`: declared quantisation of every cache edge, the mask and the embeddings.

use std::fmt::Write as _;

use kvprobe_schema::{QuantFinding, QuantInfo, Results};

use crate::cells::{kind_name, opt, yes};
use crate::html::{fold, kv_table, table};
use crate::section::{Chart, ProbeBlock, ProbeSection};
use crate::text::num;

pub struct Quant;

impl ProbeSection for Quant {
    fn tables(&self, r: &Results) -> Vec<(String, String)> {
        match &r.probes.quant {
            Some(f) => vec![("quant.csv".to_string(), csv(f))],
            None => Vec::new(),
        }
    }

    fn block(&self, r: &Results, _charts: &[Chart]) -> Option<ProbeBlock> {
        let f = r.probes.quant.as_ref()?;
        let rows: Vec<_> = f
            .caches
            .iter()
            .map(|c| {
                (
                    vec![
                        c.cache_id.to_string(),
                        c.layer.map(|l| l.to_string()).unwrap_or_default(),
                        kind_name(c.kind).to_string(),
                        quant_cell(&c.prefill_output),
                        quant_cell(&c.tbt_input),
                        quant_cell(&c.prefill_input),
                        quant_cell(&c.tbt_output),
                        num(c.max_scale_ratio, 4),
                        yes(c.consistent),
                    ],
                    Some(c.consistent),
                )
            })
            .collect();
        Some(ProbeBlock {
            id: "quant",
            title: "Declared quantisation of the cache edges",
            summary: kv_table(&[
                (
                    "inconsistent caches",
                    format!("{} of {}", f.inconsistent_caches, f.caches.len()),
                ),
                ("mask input", quant_cell(&f.mask)),
                (
                    "mask \"allowed\" byte",
                    f.mask_allowed_value
                        .map(|v| v.to_string())
                        .unwrap_or_else(|| "—".into()),
                ),
                ("embeddings input", quant_cell(&f.embeddings)),
            ]),
            chart: String::new(),
            detail: fold(
                "per-cache table (writer = prefill/tbt output, reader = tbt/prefill input)",
                &table(
                    &[
                        "cache",
                        "layer",
                        "kind",
                        "prefill out (writer)",
                        "tbt in (reader)",
                        "prefill in",
                        "tbt out",
                        "max scale ratio",
                        "consistent",
                    ],
                    &rows,
                ),
                rows.len(),
            ),
        })
    }

    fn summary(&self, r: &Results) -> String {
        let Some(f) = &r.probes.quant else {
            return String::new();
        };
        format!(
            "quant: {} caches, {} inconsistent; mask allowed value {:?}\n",
            f.caches.len(),
            f.inconsistent_caches,
            f.mask_allowed_value
        )
    }
}

fn quant_cell(q: &Option<QuantInfo>) -> String {
    match q {
        Some(q) => format!(
            "scale {} · zp {} · [{}, {}]",
            q.scale, q.zero_point, q.min, q.max
        ),
        None => "<span class=\"muted\">not declared</span>".to_string(),
    }
}

/// quant.csv: four edges per cache, then the mask and the embeddings.
fn csv(f: &QuantFinding) -> String {
    let mut s = "cache_id,layer,kind,edge,scale,zero_point,min,max,consistent,max_scale_ratio\n"
        .to_string();
    let mut row =
        |id: String, layer: String, kind: &str, edge: &str, q: &Option<QuantInfo>, tail: String| {
            let qs = match q {
                Some(q) => format!("{},{},{},{}", q.scale, q.zero_point, q.min, q.max),
                None => ",,,".to_string(),
            };
            let _ = writeln!(s, "{id},{layer},{kind},{edge},{qs},{tail}");
        };
    for c in &f.caches {
        let tail = format!("{},{}", c.consistent, c.max_scale_ratio);
        for (edge, q) in [
            ("prefill_input", &c.prefill_input),
            ("prefill_output", &c.prefill_output),
            ("tbt_input", &c.tbt_input),
            ("tbt_output", &c.tbt_output),
        ] {
            row(
                c.cache_id.to_string(),
                opt(c.layer),
                kind_name(c.kind),
                edge,
                q,
                tail.clone(),
            );
        }
    }
    row(
        String::new(),
        String::new(),
        "",
        "mask",
        &f.mask,
        ",".into(),
    );
    row(
        String::new(),
        String::new(),
        "",
        "embeddings",
        &f.embeddings,
        ",".into(),
    );
    s
}
