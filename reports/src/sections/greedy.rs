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
        let mut s = format!(
            "step,position,input_token,visible_keys,{CMP_HEADER},near_tie,reference_margin,reference_vs_matched,matched_vs_device,precision_band\n"
        );
        for st in &f.steps {
            let m = st.matched;
            let _ = writeln!(
                s,
                "{},{},{},{},{},{},{},{},{},{}",
                st.step,
                st.position,
                st.input_token,
                st.visible_keys,
                cmp_csv(&st.comparison),
                st.near_tie,
                st.reference_margin,
                m.map_or(String::new(), |m| m.reference_vs_matched.to_string()),
                m.map_or(String::new(), |m| m.matched_vs_device.to_string()),
                m.map_or(String::new(), |m| m.band.to_string()),
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
        let tok = |id: u32| match f.token_texts.get(&id) {
            Some(t) => format!("{id} {}", html(&format!("{t:?}"))),
            None => id.to_string(),
        };
        let three_way = f.matched.is_some();
        let rows: Vec<_> = f
            .steps
            .iter()
            .map(|s| {
                let mut cells = vec![
                    s.step.to_string(),
                    s.position.to_string(),
                    tok(s.input_token),
                    s.visible_keys.to_string(),
                ];
                let mut cmp = cmp_cells(&s.comparison);
                cmp[2] = tok(s.comparison.device_top1);
                cmp[3] = tok(s.comparison.reference_top1);
                if s.near_tie {
                    cmp[4] = format!("near tie (margin {})", num(s.reference_margin, 3));
                }
                cells.extend(cmp);
                if three_way {
                    let m = s.matched;
                    cells.push(m.map_or("—".into(), |m| num(m.reference_vs_matched, 4)));
                    cells.push(m.map_or("—".into(), |m| num(m.matched_vs_device, 4)));
                    cells.push(m.map_or("—".into(), |m| num(m.band, 3)));
                }
                (cells, Some(s.comparison.top1_match || s.near_tie))
            })
            .collect();
        let mut head = with_cmp(&["step", "position", "input token", "visible keys"]);
        if three_way {
            head.extend([
                "f32 vs precision-matched",
                "precision-matched vs device",
                "precision band (logits)",
            ]);
        }
        Some(ProbeBlock {
            id: "greedy",
            title: "Greedy decoding through the KV-cache",
            summary: kv_table(&summary_pairs(f)),
            chart: chart(charts, GREEDY_SVG, "greedy cosine and top-1 per step"),
            detail: fold("per-step table", &table(&head, &rows), rows.len()),
        })
    }

    fn summary(&self, r: &Results) -> String {
        let Some(f) = &r.probes.greedy else {
            return String::new();
        };
        let three_way = f.matched.as_ref().map_or(String::new(), |m| {
            format!(
                "\n  three-way (tbt means): f32 vs precision-matched {:.4}, precision-matched vs device {:.4} [{}]",
                m.tbt_reference_vs_matched.unwrap_or(f64::NAN),
                m.tbt_matched_vs_device.unwrap_or(f64::NAN),
                m.precision
            )
        });
        format!(
            "greedy: {} steps, mean cosine {:.4} (tbt {:.4}), top-1 {:.0}% ({} near-tie flips counted apart), first divergence {:?}{three_way}\n  device:    {:?}\n  reference: {:?}\n",
            f.steps.len(),
            f.mean_cosine,
            f.tbt_mean_cosine.unwrap_or(f64::NAN),
            100.0 * f.top1_agreement,
            f.near_tie_flips,
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
        (
            "top-1 agreement (near ties left out)",
            pct(f.top1_agreement),
        ),
        ("near-tie flips", f.near_tie_flips.to_string()),
        (
            "precision-matched reference",
            f.matched
                .as_ref()
                .map_or("not run (the device declares float32 edges)".into(), |m| {
                    format!(
                        "{}; tbt means: f32 vs matched {}, matched vs device {}",
                        html(&m.precision),
                        m.tbt_reference_vs_matched.map_or("—".into(), |c| num(c, 4)),
                        m.tbt_matched_vs_device.map_or("—".into(), |c| num(c, 4))
                    )
                }),
        ),
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
