//! `selfmask`: tbt steps that see only themselves (the tbt graph without the cache).

use std::fmt::Write as _;

use kvprobe_schema::{Results, SelfmaskFinding};

use crate::cells::{chart, cmp_cells_texts, cmp_csv, id_text, pct, with_cmp, CMP_HEADER};
use crate::charts::metric::{self, MetricChart};
use crate::error::Result;
use crate::html::{fold, kv_table, table};
use crate::section::{Chart, ProbeBlock, ProbeSection};
use crate::text::num;

pub const SELFMASK_SVG: &str = "selfmask.svg";

pub struct Selfmask;

impl ProbeSection for Selfmask {
    fn tables(&self, r: &Results) -> Vec<(String, String)> {
        let Some(f) = &r.probes.selfmask else {
            return Vec::new();
        };
        let mut s = format!("step,position,input_token,{CMP_HEADER}\n");
        for st in &f.steps {
            let _ = writeln!(
                s,
                "{},{},{},{}",
                st.step,
                st.position,
                st.input_token,
                cmp_csv(&st.comparison)
            );
        }
        vec![("selfmask.csv".to_string(), s)]
    }

    fn charts(&self, r: &Results) -> Result<Vec<Chart>> {
        match &r.probes.selfmask {
            Some(f) => Ok(vec![(SELFMASK_SVG, selfmask_chart(f)?)]),
            None => Ok(Vec::new()),
        }
    }

    fn block(&self, r: &Results, charts: &[Chart]) -> Option<ProbeBlock> {
        let f = r.probes.selfmask.as_ref()?;
        let rows: Vec<_> = f
            .steps
            .iter()
            .map(|s| {
                let mut cells = vec![
                    s.step.to_string(),
                    s.position.to_string(),
                    id_text(s.input_token, &f.token_texts),
                ];
                cells.extend(cmp_cells_texts(&s.comparison, &f.token_texts));
                (cells, Some(s.comparison.top1_match))
            })
            .collect();
        Some(ProbeBlock {
            id: "selfmask",
            title: "Self-only tbt steps (control for the tbt graph)",
            summary: kv_table(&[
                ("mean cosine", num(f.mean_cosine, 4)),
                ("min cosine", num(f.min_cosine, 4)),
                ("top-1 agreement", pct(f.top1_agreement)),
            ]),
            chart: chart(charts, SELFMASK_SVG, "selfmask cosine per step"),
            detail: fold(
                "per-step table",
                &table(&with_cmp(&["step", "position", "input token"]), &rows),
                rows.len(),
            ),
        })
    }

    fn summary(&self, r: &Results) -> String {
        let Some(f) = &r.probes.selfmask else {
            return String::new();
        };
        format!(
            "selfmask: {} steps, mean cosine {:.4}, min {:.4}, top-1 {:.0}%\n",
            f.steps.len(),
            f.mean_cosine,
            f.min_cosine,
            100.0 * f.top1_agreement
        )
    }
}

pub fn selfmask_chart(f: &SelfmaskFinding) -> Result<String> {
    metric::render(&MetricChart {
        title: "selfmask: tbt steps seeing only themselves vs reference".into(),
        x_desc: "step".into(),
        xs: f.steps.iter().map(|s| s.step as f64).collect(),
        cosine: f.steps.iter().map(|s| s.comparison.cosine).collect(),
        top1: f.steps.iter().map(|s| s.comparison.top1_match).collect(),
        marker: None,
    })
}
