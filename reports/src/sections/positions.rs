//! `positions`: the first tbt step with its positional input shifted by δ.

use std::fmt::Write as _;

use kvprobe_schema::{PositionsFinding, Results};

use crate::cells::{chart, cmp_cells, cmp_csv, with_cmp, CMP_HEADER};
use crate::charts::metric::{self, MetricChart};
use crate::error::Result;
use crate::html::{fold, kv_table, table};
use crate::section::{Chart, ProbeBlock, ProbeSection};
use crate::text::num;

pub const POSITIONS_SVG: &str = "positions.svg";

pub struct Positions;

impl ProbeSection for Positions {
    fn tables(&self, r: &Results) -> Vec<(String, String)> {
        let Some(f) = &r.probes.positions else {
            return Vec::new();
        };
        let mut s = format!("delta,{CMP_HEADER}\n");
        for pt in &f.points {
            let _ = writeln!(s, "{},{}", pt.delta, cmp_csv(&pt.comparison));
        }
        vec![("positions.csv".to_string(), s)]
    }

    fn charts(&self, r: &Results) -> Result<Vec<Chart>> {
        match &r.probes.positions {
            Some(f) => Ok(vec![(POSITIONS_SVG, positions_chart(f)?)]),
            None => Ok(Vec::new()),
        }
    }

    fn block(&self, r: &Results, charts: &[Chart]) -> Option<ProbeBlock> {
        let f = r.probes.positions.as_ref()?;
        let rows: Vec<_> = f
            .points
            .iter()
            .map(|pt| {
                let mut cells = vec![format!("{:+}", pt.delta)];
                cells.extend(cmp_cells(&pt.comparison));
                (cells, Some(pt.comparison.top1_match))
            })
            .collect();
        let summary = [
            (
                "best δ",
                format!("{:+} (cosine {})", f.best_delta, num(f.best_cosine, 4)),
            ),
            ("cosine at δ = 0", num(f.baseline_cosine, 4)),
        ];
        Some(ProbeBlock {
            id: "positions",
            title: "Position sweep on the first tbt step",
            summary: kv_table(&summary),
            chart: chart(charts, POSITIONS_SVG, "position sweep"),
            detail: fold("sweep", &table(&with_cmp(&["δ"]), &rows), rows.len()),
        })
    }

    fn summary(&self, r: &Results) -> String {
        let Some(f) = &r.probes.positions else {
            return String::new();
        };
        format!(
            "positions: baseline cosine {:.4}, best {:.4} at δ = {:+}\n",
            f.baseline_cosine, f.best_cosine, f.best_delta
        )
    }
}

pub fn positions_chart(f: &PositionsFinding) -> Result<String> {
    metric::render(&MetricChart {
        title: "positions: first tbt step with the positional input at pos + δ".into(),
        x_desc: "δ (position offset)".into(),
        xs: f.points.iter().map(|p| p.delta as f64).collect(),
        cosine: f.points.iter().map(|p| p.comparison.cosine).collect(),
        top1: f.points.iter().map(|p| p.comparison.top1_match).collect(),
        marker: Some((f.best_delta as f64, format!("best δ = {:+}", f.best_delta))),
    })
}
