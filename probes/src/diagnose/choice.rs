//! What the scorer makes of a named verdict's replays (issue 34, docs/diagnosis.md "The rule of
//! evidence"): of the replays that reproduce, the most precise names the verdict; none
//! reproducing is `unknown` with the closest; and how each outcome is written into the
//! diagnosis (its head evidence line, hypothesis and reproducer). Shared by the greedy replays
//! (`decide`) and the capacity check's (`capacity_replay`).

use kvprobe_schema::{Hypothesis, Replay, Reproducer, Verdict};

use super::outcome::Diagnosis;
use super::score::RULE;
use crate::thresholds::{PRECISION_RATIO, STEP_NOISE_FLOOR};

/// Confidence of a verdict the scorer names instead of the rule's (as a mild fault's).
pub const SCORED_CONFIDENCE: f64 = 0.75;

/// Writes the scorer's choice into the diagnosis.
pub(super) fn apply(
    d: &mut Diagnosis,
    choice: Choice,
    tried: Vec<(String, f64)>,
    refused: &[String],
    command: &dyn Fn(&Replay) -> Vec<String>,
    n: usize,
) {
    // a replay of the rule's cause stops once exact (`Stop::Exact`): say over how many steps
    let early = |r: &Replay| {
        (r.steps.len() < n).then(|| {
            format!(
                "decided after {} of {n} steps: more than half replayed at the noise floor \
                 ({STEP_NOISE_FLOOR:e}), so the median over all {n} is at it too",
                r.steps.len()
            )
        })
    };
    match choice {
        Choice::Refused => not_replayed(
            d,
            &format!(
                "the emulator refused every hypothesis ({})",
                refused.join("; ")
            ),
        ),
        Choice::Keep(r) => {
            if let Some(h) = &mut d.hypothesis {
                h.fault = Some(r.fault.clone());
            }
            d.reproducer = Some(Reproducer {
                setup: Vec::new(),
                command: command(&r),
                note: early(&r),
                replay: Some(r),
                tried,
            });
        }
        Choice::Rename(v, r) => {
            let c = command(&r);
            renamed(d, v, r, c, tried)
        }
        Choice::Inconclusive(r) => {
            d.evidence.push(format!(
                "replay inconclusive: on the steps (or capacity requests) a replay compares, \
                 the healthy hypothesis misses the device by {:.2e} (median), below \
                 {PRECISION_RATIO} × {STEP_NOISE_FLOOR:e}, so no replay can beat it there; the {} \
                 verdict stands on its failing control",
                r.healthy_miss.unwrap_or(0.0),
                d.verdict.name()
            ));
            d.reproducer = Some(Reproducer {
                setup: Vec::new(),
                command: command(&r),
                note: Some(
                    ["the replayed steps do not tell a fault from healthy".to_string()]
                        .into_iter()
                        .chain(early(&r))
                        .collect::<Vec<_>>()
                        .join("; "),
                ),
                replay: Some(r),
                tried,
            });
        }
        Choice::Unknown(r) => {
            let c = command(&r);
            unknown(d, r, c, tried)
        }
    }
}

/// What the scorer makes of a named verdict's replays.
#[derive(Debug, PartialEq)]
pub(super) enum Choice {
    /// No replay ran (the emulator refused every hypothesis).
    Refused,
    /// The most precise reproducing replay is of the rule's verdict.
    Keep(Replay),
    /// The most precise reproducing replay declares another verdict.
    Rename(Verdict, Replay),
    /// None reproduces: the closest replay.
    Unknown(Replay),
    /// None reproduces, but on the steps compared the healthy hypothesis misses the device by
    /// less than `PRECISION_RATIO` × `STEP_NOISE_FLOOR`: no replay can beat it there (as on a
    /// healthy verdict, `score::compete`), so the replay cannot test the rule's verdict.
    Inconclusive(Replay),
}

/// Of the replays that reproduce, the most precise names the verdict (a tie keeps the first
/// tried: the rule's own candidates come first); none reproducing → `unknown` with the closest.
pub(super) fn choose(
    verdict: Verdict,
    replays: &[Replay],
    expected: &dyn Fn(&Replay) -> Option<Verdict>,
) -> Choice {
    let closest = |reproducing: bool| {
        replays
            .iter()
            .filter(|r| r.reproduces || !reproducing)
            .min_by(|a, b| a.replay_miss.total_cmp(&b.replay_miss))
            .cloned()
    };
    let Some(any) = closest(false) else {
        return Choice::Refused;
    };
    match closest(true).and_then(|r| expected(&r).map(|v| (v, r))) {
        Some((v, r)) if v == verdict => Choice::Keep(r),
        Some((v, r)) => Choice::Rename(v, r),
        None if any.healthy_miss.unwrap_or(1.0) < PRECISION_RATIO * STEP_NOISE_FLOOR => {
            Choice::Inconclusive(any)
        }
        None => Choice::Unknown(any),
    }
}

/// No replay: the rule's verdict stands, its evidence says why it was not replayed.
pub(super) fn not_replayed(d: &mut Diagnosis, why: &str) {
    d.evidence.push(format!("not replayed: {why}"));
    if d.verdict == Verdict::Unknown {
        // a rules' `unknown` names no cause a replay could fail to reproduce
        return;
    }
    d.confidence = (d.confidence - 0.1).max(0.5).min(d.confidence);
    d.warnings.push(format!(
        "the {} verdict is not reproduced on the emulator (not replayed: {why})",
        d.verdict.name()
    ));
    d.reproducer = Some(Reproducer {
        setup: Vec::new(),
        command: Vec::new(),
        replay: None,
        tried: Vec::new(),
        note: Some(why.to_string()),
    });
}

fn rule_name(d: &Diagnosis) -> String {
    d.hypothesis
        .as_ref()
        .map_or("?".into(), |h| format!("`{}`", h.rule))
}

/// Another candidate reproduces more precisely than the rule's cause: it names the verdict.
fn renamed(
    d: &mut Diagnosis,
    v: Verdict,
    r: Replay,
    command: Vec<String>,
    tried: Vec<(String, f64)>,
) {
    let rule_verdict = d.verdict;
    let head = if rule_verdict == Verdict::Unknown {
        format!(
            "{} replayed reproduces the device by {:.2e} (median), within the declared precision \
             and clearly better than the healthy hypothesis; no rule named a cause, the evidence \
             proposed it (the rings it names, or a capacity limit measured inside the request)",
            r.fault.text(),
            r.replay_miss,
        )
    } else {
        format!(
            "{} replayed reproduces the device by {:.2e} (median), more precisely than any replay \
             of the {} cause the rule {} named",
            r.fault.text(),
            r.replay_miss,
            d.verdict.name(),
            rule_name(d)
        )
    };
    d.evidence.insert(0, head.clone());
    // the rule's verdict goes to `also` (its rule fired), the new one heads
    d.also.retain(|&a| a != v && a != rule_verdict);
    if rule_verdict != Verdict::Unknown {
        d.also.insert(0, rule_verdict);
    }
    d.verdict = v;
    d.confidence = SCORED_CONFIDENCE;
    d.hypothesis = Some(Hypothesis {
        rule: RULE.into(),
        decisive: vec![head],
        fault: Some(r.fault.clone()),
    });
    d.reproducer = Some(Reproducer {
        setup: Vec::new(),
        command,
        replay: Some(r),
        tried,
        note: None,
    });
}

/// No candidate reproduces: `unknown`, naming the closest candidates and their misses.
fn unknown(d: &mut Diagnosis, r: Replay, command: Vec<String>, tried: Vec<(String, f64)>) {
    let mut best = tried.clone();
    best.sort_by(|a, b| a.1.total_cmp(&b.1));
    let list: Vec<String> = best
        .iter()
        .take(3)
        .map(|(h, m)| format!("{h} {m:.2e}"))
        .collect();
    let named = if d.verdict == Verdict::Unknown {
        "no rule named a cause, and of the hypotheses the evidence proposes".to_string()
    } else {
        format!("the rule {} named {}, but", rule_name(d), d.verdict.name())
    };
    let head = format!(
        "unknown: {named} no replay reproduces the device within the declared precision {} and \
         clearly better than the healthy hypothesis ({}); closest: {}",
        r.precision.map_or("n/a".into(), |p| format!("{p:.2e}")),
        r.healthy_miss.map_or("n/a".into(), |m| format!("{m:.2e}")),
        list.join(", ")
    );
    d.evidence.insert(0, head.clone());
    let note = "no hypothesis reproduces: the cause may lie outside the emulator's fault grammar";
    d.reproducer = Some(Reproducer {
        setup: Vec::new(),
        command,
        replay: Some(r),
        tried,
        note: Some(note.into()),
    });
    if d.verdict == Verdict::Unknown {
        // the rules' own `unknown` (its rule and stage) stands; the replays are its evidence
        return;
    }
    d.verdict = Verdict::Unknown;
    d.confidence = 0.3;
    d.also.clear();
    d.hypothesis = Some(Hypothesis {
        rule: RULE.into(),
        decisive: vec![head],
        fault: None,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvprobe_schema::{FaultHypothesis, FaultValue};

    fn replay(name: &str, miss: f64, reproduces: bool) -> Replay {
        Replay {
            fault: FaultHypothesis {
                name: name.into(),
                value: FaultValue::None,
                groups: vec![],
                kinds: vec![],
                layers: vec![],
            },
            steps: vec![],
            replay_miss: miss,
            healthy_miss: Some(0.1),
            precision: Some(1e-3),
            reproduces,
        }
    }

    fn expected(r: &Replay) -> Option<Verdict> {
        Some(match r.fault.name.as_str() {
            "kv-swap" => Verdict::KvBinding,
            _ => Verdict::TbtGraph,
        })
    }

    #[test]
    fn the_most_precise_reproducing_replay_names_the_verdict() {
        let v = Verdict::KvBinding;
        let own = replay("kv-swap", 5e-4, true);
        let other = replay("tbt-attn-scale", 1e-4, true);
        assert_eq!(
            choose(v, &[own.clone(), other.clone()], &expected),
            Choice::Rename(Verdict::TbtGraph, other.clone())
        );
        // a tie keeps the rule's, tried first
        let tie = replay("tbt-attn-scale", 5e-4, true);
        assert_eq!(
            choose(v, &[own.clone(), tie], &expected),
            Choice::Keep(own.clone())
        );
        // a closer replay that does not reproduce names nothing
        let near = replay("tbt-attn-scale", 1e-5, false);
        assert_eq!(
            choose(v, &[own.clone(), near], &expected),
            Choice::Keep(own)
        );
    }

    #[test]
    fn a_rule_no_replay_reproduces_is_unknown_with_the_closest() {
        let a = replay("kv-swap", 3e-2, false);
        let b = replay("tbt-attn-scale", 4e-3, false);
        assert_eq!(
            choose(Verdict::KvBinding, &[a, b.clone()], &expected),
            Choice::Unknown(b)
        );
        assert_eq!(choose(Verdict::KvBinding, &[], &expected), Choice::Refused);
        // steps where healthy itself misses by less than the ratio × floor cannot decide
        let quiet = Replay {
            healthy_miss: Some(7e-5),
            ..replay("tbt-attn-scale", 0.0, false)
        };
        assert_eq!(
            choose(Verdict::KvBinding, std::slice::from_ref(&quiet), &expected),
            Choice::Inconclusive(quiet)
        );
    }
}
