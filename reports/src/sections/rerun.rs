//! `rerun`: the same request twice, compared bit for bit. Its finding sits in
//! `ProbeFindings::extra["rerun"]`; the JSON written by `kvprobe_probes::rerun` is the contract,
//! read here into the fields this section shows.

use std::fmt::Write as _;

use kvprobe_schema::Results;
use serde::Deserialize;

use crate::cells::yes;
use crate::html::{fold, kv_table, table};
use crate::section::{Chart, ProbeBlock, ProbeSection};
use crate::text::num;

#[derive(Deserialize)]
struct Difference {
    step: usize,
    logit: usize,
    first: Option<f64>,
    second: Option<f64>,
}

#[derive(Deserialize)]
struct Finding {
    steps: usize,
    identical: bool,
    first_difference: Option<Difference>,
    step_max_abs_diff: Vec<Option<f64>>,
}

fn finding(r: &Results) -> Option<Finding> {
    let v = r.probes.extra.get("rerun")?;
    serde_json::from_value(v.clone()).ok()
}

fn value(x: Option<f64>) -> String {
    x.map_or("NaN".to_string(), |v| v.to_string())
}

fn difference(f: &Finding) -> String {
    match &f.first_difference {
        None => "none: bit-identical".to_string(),
        Some(d) => format!(
            "step {}, logit {}: {} then {}",
            d.step,
            d.logit,
            value(d.first),
            value(d.second)
        ),
    }
}

pub struct Rerun;

impl ProbeSection for Rerun {
    fn tables(&self, r: &Results) -> Vec<(String, String)> {
        let Some(f) = finding(r) else {
            return Vec::new();
        };
        let mut s = "step,max_abs_diff\n".to_string();
        for (step, d) in f.step_max_abs_diff.iter().enumerate() {
            let _ = writeln!(s, "{step},{}", value(*d));
        }
        vec![("rerun.csv".to_string(), s)]
    }

    fn block(&self, r: &Results, _charts: &[Chart]) -> Option<ProbeBlock> {
        let f = finding(r)?;
        let rows: Vec<_> = f
            .step_max_abs_diff
            .iter()
            .enumerate()
            .map(|(step, d)| {
                let same = *d == Some(0.0);
                (
                    vec![step.to_string(), d.map_or("NaN".into(), |d| num(d, 6))],
                    Some(same),
                )
            })
            .collect();
        Some(ProbeBlock {
            id: "rerun",
            title: "Rerun: the same request twice, bit for bit",
            summary: kv_table(&[
                ("steps per run (prefill, then tbt)", f.steps.to_string()),
                ("bit-identical", yes(f.identical)),
                ("first difference", difference(&f)),
            ]),
            chart: String::new(),
            detail: fold(
                "per-step table",
                &table(&["step", "max |first − second|"], &rows),
                rows.len(),
            ),
        })
    }

    fn summary(&self, r: &Results) -> String {
        let Some(f) = finding(r) else {
            return String::new();
        };
        if f.identical {
            format!("rerun: {} steps twice, bit-identical\n", f.steps)
        } else {
            format!(
                "rerun: {} steps twice, DIFFERS first at {}\n",
                f.steps,
                difference(&f)
            )
        }
    }
}
