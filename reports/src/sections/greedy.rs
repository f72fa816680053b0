//! `greedy`: prefill plus teacher-forced tbt steps through the server's ring mask.

use std::fmt::Write as _;

use kvprobe_schema::{GreedyFinding, Results};

use crate::cells::{chart, cmp_cells, cmp_csv, pct, with_cmp, CMP_HEADER};
use crate::charts::metric::{self, MetricChart};
use crate::error::Result;
use crate::html::{fold, html_text, kv_table, table};
use crate::section::{Chart, ProbeBlock, ProbeSection};
use crate::text::{html, num};

pub const GREEDY_SVG: &str = "greedy.svg";

pub struct Greedy;

impl ProbeSection for Greedy {
    fn tables(&self, r: &Results) -> Vec<(String, String)> {
        let Some(f) = &r.probes.greedy else {
            return Vec::new();
        };
        let mut s = format!("step,position,input_token,visible_keys,{CMP_HEADER}\n");
        for st in &f.steps {
            let _ = writeln!(
                s,
                "{},{},{},{},{}",
                st.step,
                st.position,
                st.input_token,
                st.visible_keys,
                cmp_csv(&st.comparison)
            );
        }
        vec![("greedy.csv".to_string(), s)]
    }

    fn charts(&self, r: &Results) -> Result<Vec<Chart>> {
        match &r.probes.greedy {
            Some(f) => Ok(vec![(GREEDY_SVG, greedy_chart(f)?)]),
            None => Ok(Vec::new()),
        }
    }

    fn block(&self, r: &Results, charts: &[Chart]) -> Option<ProbeBlock> {
        let f = r.probes.greedy.as_ref()?;
        let rows: Vec<_> = f
            .steps
            .iter()
            .map(|s| {
                let mut cells = vec![
                    s.step.to_string(),
                    s.position.to_string(),
                    s.input_token.to_string(),
                    s.visible_keys.to_string(),
                ];
                cells.extend(cmp_cells(&s.comparison));
                (cells, Some(s.comparison.top1_match))
            })
            .collect();
        Some(ProbeBlock {
            id: "greedy",
            title: "Greedy decoding through the KV-cache",
            summary: kv_table(&summary_pairs(f)),
            chart: chart(charts, GREEDY_SVG, "greedy cosine and top-1 per step"),
            detail: fold(
                "per-step table",
                &table(
                    &with_cmp(&["step", "position", "input token", "visible keys"]),
                    &rows,
                ),
                rows.len(),
            ),
        })
    }

    fn summary(&self, r: &Results) -> String {
        let Some(f) = &r.probes.greedy else {
            return String::new();
        };
        format!(
            "greedy: {} steps, mean cosine {:.4} (tbt {:.4}), top-1 {:.0}%, first divergence {:?}\n  device:    {:?}\n  reference: {:?}\n",
            f.steps.len(),
            f.mean_cosine,
            f.tbt_mean_cosine.unwrap_or(f64::NAN),
            100.0 * f.top1_agreement,
            f.first_divergence,
            f.device_text,
            f.reference_text
        )
    }
}

fn summary_pairs(f: &GreedyFinding) -> Vec<(&'static str, String)> {
    let ids = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>().join(" ");
    vec![
        ("steps", f.steps.len().to_string()),
        ("mean cosine", num(f.mean_cosine, 4)),
        ("min cosine", num(f.min_cosine, 4)),
        (
            "mean cosine, tbt steps only",
            f.tbt_mean_cosine
                .map(|c| num(c, 4))
                .unwrap_or_else(|| "—".into()),
        ),
        ("top-1 agreement", pct(f.top1_agreement)),
        (
            "first divergence",
            f.first_divergence
                .map(|d| format!("step {d}"))
                .unwrap_or_else(|| "none".into()),
        ),
        (
            "device text",
            format!("<pre>{}</pre>", html_text(&f.device_text)),
        ),
        (
            "reference text",
            format!(
                "<pre>{}</pre>{}",
                html_text(&f.reference_text),
                if f.reference_ids.len() < f.device_ids.len() {
                    format!(
                        "<p class=\"muted\">{} of {} tokens: diagnose stops the reference's continuation a few tokens after the first divergence (run <code>kvprobe greedy</code> for all of it)</p>",
                        f.reference_ids.len(),
                        f.device_ids.len()
                    )
                } else {
                    String::new()
                }
            ),
        ),
        (
            "device ids",
            format!("<code>{}</code>", html(&ids(&f.device_ids))),
        ),
        (
            "reference ids",
            format!("<code>{}</code>", html(&ids(&f.reference_ids))),
        ),
    ]
}

pub fn greedy_chart(f: &GreedyFinding) -> Result<String> {
    metric::render(&MetricChart {
        title: "greedy: device vs reference logits per step (teacher-forced)".into(),
        x_desc: "step (0 = token from prefill)".into(),
        xs: f.steps.iter().map(|s| s.step as f64).collect(),
        cosine: f.steps.iter().map(|s| s.comparison.cosine).collect(),
        top1: f.steps.iter().map(|s| s.comparison.top1_match).collect(),
        marker: f
            .first_divergence
            .map(|d| (d as f64, format!("first divergence (step {d})"))),
    })
}
