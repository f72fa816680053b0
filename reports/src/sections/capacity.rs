//! `capacity`: prompts up to and past every declared limit, and generation past the end. Its
//! finding sits in `ProbeFindings::extra["capacity"]` as the schema's `CapacityFinding` (the
//! probe writes it; `diagnose` writes its cheap check there too).

use std::fmt::Write as _;

use kvprobe_schema::{
    CapacityFinding, CapacityOutcome, CapacityPhase, CapacityPoint, LogitComparison, Results,
};

use crate::cells::{chart, cmp_cells, cmp_csv, opt, yes, CMP_HEADER};
use crate::charts::metric::{self, MetricChart};
use crate::error::Result;
use crate::html::{fold, kv_table, table};
use crate::section::{Chart, ProbeBlock, ProbeSection};
use crate::text::csv_text;

pub const CAPACITY_SVG: &str = "capacity.svg";

fn finding(r: &Results) -> Option<CapacityFinding> {
    let v = r.probes.extra.get("capacity")?;
    serde_json::from_value(v.clone()).ok()
}

fn phase(p: &CapacityPoint) -> &'static str {
    match p.phase {
        CapacityPhase::Prompt => "prompt",
        CapacityPhase::Generation => "generation",
    }
}

fn beyond(p: &CapacityPoint) -> String {
    p.beyond
        .iter()
        .map(|k| k.name())
        .collect::<Vec<_>>()
        .join(" ")
}

fn documented(p: &CapacityPoint) -> &'static str {
    p.documented.map_or("inside", |d| d.name())
}

fn limits(f: &CapacityFinding) -> String {
    f.limits
        .iter()
        .map(|l| format!("{} {}", l.kind.name(), l.value))
        .collect::<Vec<_>>()
        .join(", ")
}

pub struct Capacity;

impl ProbeSection for Capacity {
    fn tables(&self, r: &Results) -> Vec<(String, String)> {
        let Some(f) = finding(r) else {
            return Vec::new();
        };
        let mut s = format!("phase,tokens,beyond,documented,window,outcome,refusal,{CMP_HEADER}\n");
        for p in &f.points {
            let cmp = p.comparison.as_ref().map_or(",,,,".to_string(), cmp_csv);
            let _ = writeln!(
                s,
                "{},{},{},{},{},{},{},{cmp}",
                phase(p),
                p.tokens,
                beyond(p),
                documented(p),
                opt(p.window),
                p.outcome.name(),
                csv_text(p.refusal.as_deref().unwrap_or(""))
            );
        }
        let mut l = "limit,value,prompt_past,generation_past,source\n".to_string();
        for d in &f.limits {
            let _ = writeln!(
                l,
                "{},{},{},{},{}",
                d.kind.name(),
                d.value,
                d.prompt.map_or("", |x| x.name()),
                d.generation.map_or("", |x| x.name()),
                csv_text(&d.source)
            );
        }
        vec![
            ("capacity.csv".to_string(), s),
            ("capacity_limits.csv".to_string(), l),
        ]
    }

    fn charts(&self, r: &Results) -> Result<Vec<Chart>> {
        let Some(f) = finding(r) else {
            return Ok(Vec::new());
        };
        let mut answered: Vec<(usize, LogitComparison)> = f
            .points
            .iter()
            .filter_map(|p| p.comparison.clone().map(|c| (p.tokens, c)))
            .collect();
        if answered.is_empty() {
            return Ok(Vec::new());
        }
        answered.sort_by_key(|(t, _)| *t);
        let svg = metric::render(&MetricChart {
            title: "capacity: device vs reference per prompt length and generation step".into(),
            x_desc: "tokens (prompt length, or tokens a generation step sees)".into(),
            xs: answered.iter().map(|(t, _)| *t as f64).collect(),
            cosine: answered.iter().map(|(_, c)| c.cosine).collect(),
            top1: answered.iter().map(|(_, c)| c.top1_match).collect(),
            marker: f
                .first_garbled_prompt
                .or(f.first_garbled_context)
                .map(|t| (t as f64, format!("first garbled at {t} tokens"))),
        })?;
        Ok(vec![(CAPACITY_SVG, svg)])
    }

    fn block(&self, r: &Results, charts: &[Chart]) -> Option<ProbeBlock> {
        let f = finding(r)?;
        let rows: Vec<_> = f
            .points
            .iter()
            .map(|p| {
                let mut cells = vec![
                    phase(p).to_string(),
                    p.tokens.to_string(),
                    beyond(p),
                    documented(p).to_string(),
                    p.outcome.name().to_string(),
                    p.refusal.clone().unwrap_or_default(),
                ];
                match &p.comparison {
                    Some(c) => cells.extend(cmp_cells(c)),
                    None => cells.extend(std::iter::repeat_n(String::new(), 5)),
                }
                let ok = !matches!(
                    p.outcome,
                    CapacityOutcome::Garbled | CapacityOutcome::Unrefused
                );
                (cells, Some(ok))
            })
            .collect();
        let headers = crate::cells::with_cmp(&[
            "phase",
            "tokens",
            "reaches",
            "documented",
            "outcome",
            "refusal",
        ]);
        Some(ProbeBlock {
            id: "capacity",
            title: "Capacity: prompts and generation up to and past the declared limits",
            summary: kv_table(&[
                ("declared limits", limits(&f)),
                (
                    "scope",
                    if f.quick {
                        "diagnose's cheap check (the longest accepted prompt, one past it, the end of the context)".into()
                    } else {
                        "the whole sweep".into()
                    },
                ),
                ("silent garbage (no refusal)", yes(f.silent_overflow)),
                ("first garbled prompt", opt(f.first_garbled_prompt)),
                (
                    "first garbled generation step (tokens seen)",
                    opt(f.first_garbled_context),
                ),
            ]),
            chart: chart(charts, CAPACITY_SVG, "capacity per length"),
            detail: fold("per-request table", &table(&headers, &rows), rows.len()),
        })
    }

    fn summary(&self, r: &Results) -> String {
        let Some(f) = finding(r) else {
            return String::new();
        };
        let mut s = format!(
            "capacity: limits {}; {}\n",
            limits(&f),
            if f.silent_overflow {
                "SILENT GARBAGE past a limit (no refusal)"
            } else {
                "no silent garbage"
            }
        );
        for p in &f.points {
            let cos = p
                .comparison
                .as_ref()
                .map_or(String::new(), |c| format!(" cosine {:.4}", c.cosine));
            let _ = writeln!(
                s,
                "  {} {:>5}: {}{cos}",
                phase(p),
                p.tokens,
                p.outcome.name()
            );
        }
        s
    }
}
