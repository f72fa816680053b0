//! `chat`: a multi-turn conversation appended to one state, turn by turn against the reference.
//! Its finding sits in `ProbeFindings::extra["chat"]`; the JSON written by
//! `kvprobe_probes::chat` is the contract, read here into the fields this section shows.

use std::fmt::Write as _;

use kvprobe_schema::{GreedyStep, Results};
use serde::Deserialize;

use crate::html::{fold, kv_table, table};
use crate::section::{Chart, ProbeBlock, ProbeSection};
use crate::text::{html, html_visible, num};

#[derive(Deserialize)]
struct Turn {
    turn: usize,
    first_position: usize,
    fed: usize,
    steps: Vec<GreedyStep>,
    device_text: String,
    mean_cosine: Option<f64>,
    min_cosine: Option<f64>,
    top1_agreement: Option<f64>,
}

#[derive(Deserialize)]
struct Divergence {
    turn: usize,
    step: usize,
    position: usize,
    why: String,
}

#[derive(Deserialize)]
struct Fresh {
    tokens: usize,
    appended_cosine: Option<f64>,
    fresh_cosine: Option<f64>,
    fresh_top1_match: Option<bool>,
    fresh_agrees: Option<bool>,
    not_run: Option<String>,
}

#[derive(Deserialize)]
struct Finding {
    turns: Vec<Turn>,
    turns_planned: usize,
    not_run: Option<String>,
    steps_per_turn: usize,
    total_tokens: usize,
    first_divergence: Option<Divergence>,
    fresh: Option<Fresh>,
    matched: Option<String>,
}

fn finding(r: &Results) -> Option<Finding> {
    let v = r.probes.extra.get("chat")?;
    serde_json::from_value(v.clone()).ok()
}

fn opt(x: Option<f64>, digits: usize) -> String {
    x.map_or("NaN".to_string(), |v| num(v, digits))
}

fn divergence(f: &Finding) -> String {
    match &f.first_divergence {
        None => "none: every turn agrees (near ties apart)".to_string(),
        Some(d) => format!(
            "turn {} of {}, step {} (position {}): {}",
            d.turn,
            f.turns.len(),
            d.step,
            d.position,
            d.why
        ),
    }
}

fn control(f: &Finding) -> String {
    let Some(c) = &f.fresh else {
        return "not needed (no divergence after turn 1)".to_string();
    };
    if let Some(why) = &c.not_run {
        return format!("not run: {why}");
    }
    format!(
        "the {}-token history as one prompt on a fresh request: cosine {} (appended: {}), top-1 {}; {}",
        c.tokens,
        opt(c.fresh_cosine, 4),
        opt(c.appended_cosine, 4),
        match c.fresh_top1_match {
            Some(true) => "agrees",
            Some(false) => "differs",
            None => "not compared",
        },
        match c.fresh_agrees {
            Some(true) => "the fresh request agrees: appending to the kept state is at fault",
            Some(false) => "the fresh request diverges too: not the appending alone",
            None => "not compared",
        }
    )
}

pub struct Chat;

impl ProbeSection for Chat {
    fn tables(&self, r: &Results) -> Vec<(String, String)> {
        let Some(f) = finding(r) else {
            return Vec::new();
        };
        let mut s = "turn,step,position,cosine,device_top1,reference_top1,near_tie\n".to_string();
        for t in &f.turns {
            for st in &t.steps {
                let c = &st.comparison;
                let _ = writeln!(
                    s,
                    "{},{},{},{},{},{},{}",
                    t.turn,
                    st.step,
                    st.position,
                    c.cosine,
                    c.device_top1,
                    c.reference_top1,
                    st.near_tie
                );
            }
        }
        vec![("chat.csv".to_string(), s)]
    }

    fn block(&self, r: &Results, _charts: &[Chart]) -> Option<ProbeBlock> {
        let f = finding(r)?;
        let rows: Vec<_> = f
            .turns
            .iter()
            .map(|t| {
                let ok = t
                    .steps
                    .iter()
                    .all(|s| s.comparison.top1_match || s.near_tie);
                (
                    vec![
                        t.turn.to_string(),
                        format!("{}..{}", t.first_position, t.first_position + t.fed),
                        opt(t.mean_cosine, 4),
                        opt(t.min_cosine, 4),
                        opt(t.top1_agreement.map(|a| 100.0 * a), 0) + "%",
                        html_visible(&t.device_text),
                    ],
                    Some(ok),
                )
            })
            .collect();
        let mut summary = vec![
            (
                "turns run",
                format!("{} of {}", f.turns.len(), f.turns_planned),
            ),
            ("greedy steps a turn", f.steps_per_turn.to_string()),
            ("tokens in the conversation", f.total_tokens.to_string()),
            ("first divergence", html(&divergence(&f))),
            ("fresh-request control", html(&control(&f))),
        ];
        if let Some(why) = &f.not_run {
            summary.push(("not run", html(why)));
        }
        if let Some(m) = &f.matched {
            summary.push(("precision-matched reference", html(m)));
        }
        Some(ProbeBlock {
            id: "chat",
            title: "Chat: turns appended to one state, against the reference",
            summary: kv_table(&summary),
            chart: String::new(),
            detail: fold(
                "per-turn table",
                &table(
                    &[
                        "turn",
                        "positions fed",
                        "mean cosine",
                        "min cosine",
                        "top-1",
                        "device's reply",
                    ],
                    &rows,
                ),
                rows.len(),
            ),
        })
    }

    fn summary(&self, r: &Results) -> String {
        let Some(f) = finding(r) else {
            return String::new();
        };
        match &f.first_divergence {
            None => format!(
                "chat: {} turns appended to one state ({} tokens), every turn agrees\n",
                f.turns.len(),
                f.total_tokens
            ),
            Some(_) => format!(
                "chat: {} turns appended to one state, DIVERGES at {}; control: {}\n",
                f.turns.len(),
                divergence(&f),
                control(&f)
            ),
        }
    }
}
