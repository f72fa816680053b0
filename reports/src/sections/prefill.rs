//! `prefill`: device logits per prompt prefix.

use std::fmt::Write as _;

use kvprobe_schema::{PrefillFinding, Results};

use crate::cells::{chart, cmp_cells_texts, cmp_csv, pct, tok, with_cmp, CMP_HEADER};
use crate::charts::metric::{self, MetricChart};
use crate::error::Result;
use crate::html::{fold, kv_table, table};
use crate::section::{Chart, ProbeBlock, ProbeSection};
use crate::text::{csv_text, num};

pub const PREFILL_SVG: &str = "prefill.svg";

pub struct Prefill;

impl ProbeSection for Prefill {
    fn tables(&self, r: &Results) -> Vec<(String, String)> {
        let Some(f) = &r.probes.prefill else {
            return Vec::new();
        };
        let tokens = &r.provenance.prompt_tokens;
        let mut s = format!("position,token,{CMP_HEADER}\n");
        for row in &f.rows {
            let t = tokens.get(row.position).map(String::as_str).unwrap_or("");
            let _ = writeln!(
                s,
                "{},{},{}",
                row.position,
                csv_text(t),
                cmp_csv(&row.comparison)
            );
        }
        vec![("prefill.csv".to_string(), s)]
    }

    fn charts(&self, r: &Results) -> Result<Vec<Chart>> {
        match &r.probes.prefill {
            Some(f) => Ok(vec![(PREFILL_SVG, prefill_chart(f)?)]),
            None => Ok(Vec::new()),
        }
    }

    fn block(&self, r: &Results, charts: &[Chart]) -> Option<ProbeBlock> {
        let f = r.probes.prefill.as_ref()?;
        let tokens = &r.provenance.prompt_tokens;
        let rows: Vec<_> = f
            .rows
            .iter()
            .map(|row| {
                let mut cells = vec![row.position.to_string(), tok(tokens, row.position)];
                cells.extend(cmp_cells_texts(&row.comparison, &f.token_texts));
                (cells, Some(row.comparison.top1_match))
            })
            .collect();
        Some(ProbeBlock {
            id: "prefill",
            title: "Prefill: device logits per prompt prefix",
            summary: kv_table(&[
                ("min cosine", num(f.min_cosine, 4)),
                ("mean cosine", num(f.mean_cosine, 4)),
                ("top-1 agreement", pct(f.top1_agreement)),
                (
                    "first prefix re-run at the end",
                    format!(
                        "cosine {} — {}",
                        num(f.rerun_cosine, 6),
                        if f.rerun_identical {
                            "identical (no state leak)"
                        } else {
                            "DIFFERS: state leaked between resets"
                        }
                    ),
                ),
            ]),
            chart: chart(charts, PREFILL_SVG, "prefill cosine per position"),
            detail: fold(
                "per-position table",
                &table(&with_cmp(&["position", "token"]), &rows),
                rows.len(),
            ),
        })
    }

    fn summary(&self, r: &Results) -> String {
        let Some(f) = &r.probes.prefill else {
            return String::new();
        };
        let mut s = format!(
            "prefill: {} prefixes, mean cosine {:.4}, min {:.4}, top-1 {:.0}%, re-run {}\n",
            f.rows.len(),
            f.mean_cosine,
            f.min_cosine,
            100.0 * f.top1_agreement,
            if f.rerun_identical {
                "identical"
            } else {
                "DIFFERS"
            }
        );
        for row in &f.rows {
            s += &format!(
                "  pos {:>4}: cosine {:.4} top-1 {}\n",
                row.position, row.comparison.cosine, row.comparison.top1_match
            );
        }
        s
    }
}

pub fn prefill_chart(f: &PrefillFinding) -> Result<String> {
    metric::render(&MetricChart {
        title: "prefill: device vs reference logits per prompt position".into(),
        x_desc: "prompt position (last token of the prefix)".into(),
        xs: f.rows.iter().map(|r| r.position as f64).collect(),
        cosine: f.rows.iter().map(|r| r.comparison.cosine).collect(),
        top1: f.rows.iter().map(|r| r.comparison.top1_match).collect(),
        marker: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The row table shows a top-1 id's text beside it, escaped; ids without text stay bare.
    #[test]
    fn top1_ids_carry_their_text() {
        let r = crate::fixtures::faulty_results();
        let block = Prefill.block(&r, &[]).expect("a prefill block");
        assert!(
            block
                .detail
                .contains("40 <code class=\"tok\">&lt;the&gt;</code>"),
            "{}",
            block.detail
        );
        assert!(!block.detail.contains("<the>"));
    }
}
