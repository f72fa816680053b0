//! `diagnose`: run the probes stage by stage and name the root cause (docs/diagnosis.md).
//!
//! Per runtime, an orchestration runs the probes and fills a facts value; an ordered table of
//! rules reads the facts, and one [`engine::Engine`] writes the verdict, its confidence, the
//! evidence and `also`: [`ring`] (genai ring devices), [`stateful`] (stateful devices) and
//! [`stage`] (the issue-10 probes' pipeline stage, on `unknown` and under `stage_only`).

pub mod capacity;
mod capacity_fit;
mod capacity_replay;
mod choice;
pub mod decide;
pub mod engine;
pub mod evidence;
pub mod fits;
#[cfg(test)]
mod invariant;
mod outcome;
pub mod output_fit;
mod partial;
mod refine;
mod repeat;
pub mod replay;
pub mod replayer;
mod residual;
pub mod ring;
pub mod score;
pub mod stage;
mod state_evidence;
pub mod stateful;
mod stateful_binding;
mod stateful_causes;
mod stateful_facts;
mod stateful_na;
#[cfg(test)]
mod stateful_recorded;
mod unknown_kvdiff;

pub use outcome::{DiagnoseOptions, Diagnosis};

use crate::session::Session;
use crate::Result;
use ring::{SKIPPED, SKIPPED_BOTH};

/// The runtime gate (issue 9): a stateful device has its own rules.
fn runs_stateful(s: &Session) -> bool {
    s.dev.capabilities().stateful
}

pub fn diagnose(s: &mut Session, opts: &DiagnoseOptions) -> Result<Diagnosis> {
    let mut d = match diagnose_runtime(s, opts) {
        Ok(d) => d,
        Err(e) => return partial::after_failure(s, opts, e),
    };
    decide::attach(s, opts.replay.as_ref(), &mut d, !opts.stage_only);
    if let Some(u) = score::compete(s, opts.replay.as_ref(), &mut d) {
        decide::attach_unexplained(s, opts.replay.as_ref(), &mut d, u)?;
    }
    let chat = crate::chat_diagnose::Outcome {
        verdict: &mut d.verdict,
        confidence: &mut d.confidence,
        hypothesis: &mut d.hypothesis,
        evidence: &mut d.evidence,
        probes: &mut d.probes,
        timings: &mut d.timings,
    };
    if let Err(e) = crate::chat_diagnose::attach(s, chat) {
        return partial::after_chat_failure(d, e);
    }
    unknown_kvdiff::attach(s, &mut d)?;
    Ok(d)
}

fn diagnose_runtime(s: &mut Session, opts: &DiagnoseOptions) -> Result<Diagnosis> {
    if runs_stateful(s) {
        return stateful::diagnose(s, opts);
    }
    if opts.stage_only {
        return stage::diagnose_stage_only(s, opts);
    }
    let mut d = ring::diagnose(s, opts)?;
    if opts.all_probes && d.stage.is_none() && s.has_tbt() {
        for e in &mut d.evidence {
            if let Some(why) = e.strip_prefix(SKIPPED_BOTH) {
                *e = format!("cache-path probes skipped{why}");
            }
        }
        d.evidence.retain(|e| !e.starts_with(SKIPPED));
        d.evidence.push(format!(
            "stale/causality/splits run on request (--all-probes); the {} verdict stands",
            d.verdict.name()
        ));
        d.stage = stage::run_new_probes(s, &mut d.timings, &mut d.probes, &mut d.evidence)?;
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::engine::Rule;

    const DOC: &str = include_str!("../../../docs/diagnosis.md");

    /// `(rule, verdict or stage, control)` rows of the doc's list between `<!-- rules:NAME -->`
    /// markers (the stage list has no control column: its third cell is its condition).
    fn documented(name: &str) -> Vec<(String, String, String)> {
        let start = format!("<!-- rules:{name} -->");
        let end = format!("<!-- /rules:{name} -->");
        let from = DOC.find(&start).expect("start marker") + start.len();
        let to = DOC[from..].find(&end).expect("end marker") + from;
        DOC[from..to]
            .lines()
            .filter_map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                let k = cells.iter().position(|c| c.starts_with('`'))?;
                let id = cells[k].trim_matches('`').to_string();
                Some((
                    id,
                    cells.get(k + 1)?.to_string(),
                    cells.get(k + 2)?.trim_matches('`').to_string(),
                ))
            })
            .collect()
    }

    fn rows<F>(table: &[&[Rule<F>]]) -> Vec<(String, String, String)> {
        table
            .iter()
            .flat_map(|phase| phase.iter())
            .map(|r| {
                let v = r.verdict.map_or("note", |v| v.name());
                (r.id.to_string(), v.to_string(), r.needs.key().to_string())
            })
            .collect()
    }

    #[test]
    fn docs_list_every_rule_in_table_order() {
        assert_eq!(documented("ring"), rows(super::ring::TABLE));
        assert_eq!(documented("stateful"), rows(super::stateful::TABLE));
        assert_eq!(documented("capacity"), rows(super::capacity::TABLE));
        let stage: Vec<(String, String)> = super::stage::TABLE
            .iter()
            .map(|r| (r.id.to_string(), r.stage.name().to_string()))
            .collect();
        let doc: Vec<(String, String)> = documented("stage")
            .into_iter()
            .map(|(a, b, _)| (a, b))
            .collect();
        assert_eq!(doc, stage);
    }

    #[test]
    fn rule_ids_are_unique_per_table() {
        let mut ids: Vec<String> = rows(super::ring::TABLE).into_iter().map(|r| r.0).collect();
        let n = ids.len();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), n);
    }
}
