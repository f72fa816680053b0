//! The capacity rule (issue 20): on a run whose every control passes, `diagnose` runs the
//! `capacity` probe's cheap check (a prompt one past the longest the device accepts, the longest
//! one, and the steps around the end of the context from it) and names `capacity-overflow` when
//! a request the device answered misses its reference with no refusal. Its own facts and table
//! (docs/diagnosis.md, `rules:capacity`): ring and stateful devices share it.

use kvprobe_schema::{
    CapacityFinding, CapacityOutcome, CapacityPhase, ProbeFindings, QuantFinding, Timing, Verdict,
};

use super::engine::{Cause, Control, Controls, Engine, Rule, Tier};
use super::outcome::timed;
use crate::capacity_record::CapacityEvidence;
use crate::session::Session;
use crate::{capacity, Result};

pub struct CapacityFacts {
    pub finding: CapacityFinding,
    /// The writer's and reader's declared cache quant infos (ring devices).
    pub quant: Option<QuantFinding>,
}

impl Controls for CapacityFacts {
    fn fails(&self, c: Control) -> bool {
        match c {
            Control::Capacity | Control::Any => self.finding.silent_overflow,
            _ => false,
        }
    }
}

type R = Rule<CapacityFacts>;

/// After the controls passed, before the healthy rule.
pub const CAPACITY: &[R] = &[
    R::new(
        "capacity-quantization",
        Tier::CachePath,
        Some(Verdict::CacheQuantization),
        capacity_quantization,
    )
    .needs(Control::Capacity)
    .stop(),
    R::new(
        "capacity-overflow",
        Tier::CachePath,
        Some(Verdict::CapacityOverflow),
        capacity_overflow,
    )
    .needs(Control::Capacity)
    .stop(),
];

/// Every capacity rule, in evaluation order.
pub const TABLE: &[&[R]] = &[CAPACITY];

fn what(phase: CapacityPhase, tokens: usize) -> String {
    match phase {
        CapacityPhase::Prompt => format!("a prompt of {tokens} tokens"),
        CapacityPhase::Generation => format!("the generation step that sees {tokens} tokens"),
    }
}

/// A generation step past a declared limit garbles while writer and reader declare different
/// cache quant infos: the mismatch is there at every step, and the step that has lost the
/// prompt's oldest entries shows it (SmolLM2 `tbt-cache-scale=1.5` on K of three layers, L 40:
/// the steps that see 40 and 41 tokens miss the precision-matched reference by 0.0005 and
/// 0.0007, the one that sees 42 by 0.035). The garbled step is the failing control, the
/// declared infos name the cause; the runtime answering past its limit stays in `also`.
fn capacity_quantization(f: &CapacityFacts) -> Option<Cause> {
    let g = f.finding.garbled().next()?;
    let cmp = g.comparison.as_ref()?;
    let line = super::ring::graph::quant_mismatch(f.quant.as_ref()?)?;
    Some(
        Cause::new(0.85)
            .line(format!(
                "capacity: {} comes back garbled (cosine {:.4}) with no refusal",
                what(g.phase, g.tokens),
                cmp.cosine
            ))
            .line(line)
            .also(Verdict::CapacityOverflow, 0.5),
    )
}

fn capacity_overflow(f: &CapacityFacts) -> Option<Cause> {
    let limits: Vec<String> = f
        .finding
        .limits
        .iter()
        .map(|l| format!("{} {}", l.kind.name(), l.value))
        .collect();
    // an answer where the documented runtime refuses is the contract broken outright; garbage
    // inside the declared limits says the device holds less than it declares
    if let Some(u) = f.finding.unrefused().next() {
        let cos = u.comparison.as_ref().map_or(String::new(), |c| {
            format!(" (cosine {:.4} against the full reference)", c.cosine)
        });
        let reached: Vec<&str> = u.beyond.iter().map(|k| k.name()).collect();
        return Some(Cause::new(0.85).line(format!(
            "→ capacity-overflow: the device declares {} and every control passes, yet {} (past {}, where the documented runtime refuses) is answered{cos} with no refusal: it continues silently past its limit",
            limits.join(", "),
            what(u.phase, u.tokens),
            reached.join(", ")
        )));
    }
    let g = f.finding.garbled().next()?;
    let cmp = g.comparison.as_ref()?;
    Some(Cause::new(0.85).line(format!(
        "→ capacity-overflow: the device declares {} and every control passes, yet {} comes back garbled (cosine {:.4}, top-1 {}) with no refusal: it holds less than it declares and says nothing",
        limits.join(", "),
        what(g.phase, g.tokens),
        cmp.cosine,
        if cmp.top1_match { "kept" } else { "lost" }
    )))
}

/// One evidence line for the quick check. Consecutive generation steps with the same outcome
/// are one range with their cosines' span: NPUW's cheap check walks 60-odd steps from the
/// longest prompt to the end of its KV model, and a line listing each one buries the refusal.
fn summary(f: &CapacityFinding) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < f.points.len() {
        let p = &f.points[i];
        let mut j = i + 1;
        while j < f.points.len() && same_run(&f.points[j - 1], &f.points[j]) {
            j += 1;
        }
        parts.push(if j - i >= 3 {
            let cosines: Vec<f64> = f.points[i..j]
                .iter()
                .filter_map(|q| q.comparison.as_ref().map(|c| c.cosine))
                .collect();
            let span = match (
                cosines.iter().copied().reduce(f64::min),
                cosines.iter().copied().reduce(f64::max),
            ) {
                (Some(lo), Some(hi)) => format!(" {lo:.4}–{hi:.4}"),
                _ => String::new(),
            };
            format!(
                "the {} generation steps that see {}–{} tokens: {}{span}",
                j - i,
                p.tokens,
                f.points[j - 1].tokens,
                p.outcome.name()
            )
        } else {
            f.points[i..j]
                .iter()
                .map(point_text)
                .collect::<Vec<_>>()
                .join("; ")
        });
        i = j;
    }
    let refused = f
        .points
        .iter()
        .any(|p| p.outcome == CapacityOutcome::Refused);
    // a refusal inside the declared limits is the device taking less than kvprobe reads from
    // its documentation (no verdict: the device says so); said first, not as one word
    let early = f
        .points
        .iter()
        .find(|p| p.outcome == CapacityOutcome::RefusedEarly)
        .map_or(String::new(), |p| {
            let limits: Vec<String> =
                f.limits.iter().map(|l| format!("{} {}", l.kind.name(), l.value)).collect();
            format!(
                "the device refuses {} although it declares {}: it holds less than its documented limits say (the refusal: {}); ",
                what(p.phase, p.tokens),
                limits.join(", "),
                p.refusal.as_deref().unwrap_or("no message")
            )
        });
    format!(
        "capacity (cheap check, not the whole sweep: `kvprobe capacity` runs it): {early}{}{}",
        parts.join("; "),
        if refused {
            "; past the limit the runtime refuses with a typed error"
        } else {
            ""
        }
    )
}

fn point_text(p: &kvprobe_schema::CapacityPoint) -> String {
    let cos = p
        .comparison
        .as_ref()
        .map_or(String::new(), |c| format!(" {:.4}", c.cosine));
    format!("{} {}{cos}", what(p.phase, p.tokens), p.outcome.name())
}

/// Two points are one run of the summary: consecutive generation steps, the same outcome.
fn same_run(a: &kvprobe_schema::CapacityPoint, b: &kvprobe_schema::CapacityPoint) -> bool {
    a.phase == CapacityPhase::Generation
        && b.phase == CapacityPhase::Generation
        && a.outcome == b.outcome
        && b.tokens == a.tokens + 1
}

/// Runs the cheap check and the capacity rule; the check and the device's answers when the rule
/// ended the diagnosis (its replays are judged on them).
pub(crate) fn phase(
    s: &mut Session,
    eng: &mut Engine,
    timings: &mut Vec<Timing>,
    probes: &mut ProbeFindings,
    quant: Option<&QuantFinding>,
) -> Result<Option<CapacityEvidence>> {
    let (finding, record) = timed(timings, "capacity", || capacity::run_recorded(s, true))?;
    eng.line(summary(&finding));
    if let Ok(v) = serde_json::to_value(&finding) {
        probes.extra.insert("capacity".into(), v);
    }
    let facts = CapacityFacts {
        finding,
        quant: quant.cloned(),
    };
    eng.apply(CAPACITY, &facts);
    Ok(eng.stopped().then_some(CapacityEvidence {
        finding: facts.finding,
        record,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvprobe_schema::{CapacityPoint, LogitComparison, PastLimit};

    fn point(tokens: usize, cosine: f64, outcome: CapacityOutcome) -> CapacityPoint {
        CapacityPoint {
            phase: CapacityPhase::Prompt,
            tokens,
            beyond: Vec::new(),
            documented: None,
            window: None,
            refusal: None,
            comparison: Some(LogitComparison {
                cosine,
                kl: 0.0,
                device_top1: 1,
                reference_top1: 2,
                top1_match: false,
            }),
            matched: None,
            outcome,
        }
    }

    fn facts(points: Vec<CapacityPoint>) -> CapacityFacts {
        let silent_overflow = points.iter().any(|p| {
            matches!(
                p.outcome,
                CapacityOutcome::Garbled | CapacityOutcome::Unrefused
            )
        });
        CapacityFacts {
            finding: CapacityFinding {
                limits: Vec::new(),
                points,
                generation_prompt: 127,
                first_garbled_prompt: None,
                first_garbled_context: None,
                silent_overflow,
                quick: true,
            },
            quant: None,
        }
    }

    #[test]
    fn a_garbled_answer_names_capacity_overflow_and_a_refusal_does_not() {
        let mut refused = point(128, 0.0, CapacityOutcome::Refused);
        refused.comparison = None;
        refused.documented = Some(PastLimit::Refused);
        let bad = facts(vec![
            refused.clone(),
            point(127, 0.42, CapacityOutcome::Garbled),
        ]);
        let mut e = Engine::new();
        e.apply(CAPACITY, &bad);
        assert!(e.stopped());
        let c = e.conclude();
        assert_eq!(c.verdict, Verdict::CapacityOverflow);
        assert!(
            c.evidence[0].contains("a prompt of 127 tokens"),
            "{:?}",
            c.evidence
        );
        let good = facts(vec![refused, point(127, 0.998, CapacityOutcome::Matches)]);
        let mut e = Engine::new();
        e.apply(CAPACITY, &good);
        assert!(!e.stopped());
        assert_eq!(e.conclude().verdict, Verdict::Unknown);
    }

    #[test]
    fn a_garbled_step_with_mismatched_declared_quant_infos_names_cache_quantization() {
        let mut past = point(42, 0.9723, CapacityOutcome::Garbled);
        past.phase = CapacityPhase::Generation;
        past.beyond = vec![kvprobe_schema::LimitKind::CacheLen];
        let garbled = facts(vec![point(23, 1.0, CapacityOutcome::Matches), past]);
        let mismatched = CapacityFacts {
            quant: Some(crate::diagnose::ring::testing::quant(&[1, 3])),
            ..facts(garbled.finding.points.clone())
        };
        let mut e = Engine::new();
        e.apply(CAPACITY, &mismatched);
        assert!(e.stopped());
        let c = e.conclude();
        assert_eq!(c.verdict, Verdict::CacheQuantization);
        assert_eq!(c.also, vec![Verdict::CapacityOverflow]);
        assert!(
            c.evidence[0].contains("the generation step that sees 42 tokens comes back garbled")
        );
        assert!(c.evidence[1].starts_with("→ cache-quantization: 2 of 4 caches"));
        // consistent declarations: the garbled step is an overflow
        let consistent = CapacityFacts {
            quant: Some(crate::diagnose::ring::testing::quant(&[])),
            ..facts(garbled.finding.points.clone())
        };
        for f in [garbled, consistent] {
            let mut e = Engine::new();
            e.apply(CAPACITY, &f);
            assert_eq!(e.conclude().verdict, Verdict::CapacityOverflow);
        }
    }

    /// A sliding cache past its documented refusal still looks close to the reference: the
    /// answer alone is the failure, named as a silent continuation, not as a smaller capacity.
    #[test]
    fn an_answer_where_the_runtime_refuses_is_capacity_overflow() {
        let mut past = point(65, 0.9997, CapacityOutcome::Unrefused);
        past.documented = Some(PastLimit::Refused);
        past.beyond = vec![kvprobe_schema::LimitKind::PromptLen];
        let mut e = Engine::new();
        e.apply(
            CAPACITY,
            &facts(vec![point(12, 1.0, CapacityOutcome::Matches), past]),
        );
        let c = e.conclude();
        assert_eq!(c.verdict, Verdict::CapacityOverflow);
        assert!(
            c.evidence[0].contains("a prompt of 65 tokens (past prompt-len")
                && c.evidence[0].contains("continues silently"),
            "{:?}",
            c.evidence
        );
    }
    /// A refusal inside the declared limits is said first, with the refusal and the limits, not
    /// as one outcome word among the points (NPUW's "KV-Cache is full" one step before the
    /// capacity kvprobe read until session 24).
    #[test]
    fn a_refusal_inside_the_declared_limits_is_said_first() {
        let mut early = point(128, 0.0, CapacityOutcome::RefusedEarly);
        early.phase = CapacityPhase::Generation;
        early.comparison = None;
        early.refusal = Some("KV-Cache is full".into());
        let mut f = facts(vec![point(64, 0.9999, CapacityOutcome::Matches), early]).finding;
        f.limits = vec![kvprobe_schema::DeviceLimit {
            kind: kvprobe_schema::LimitKind::MaxContext,
            value: 128,
            prompt: None,
            generation: Some(PastLimit::Refused),
            source: String::new(),
        }];
        let line = summary(&f);
        assert!(
            line.contains("): the device refuses the generation step that sees 128 tokens although it declares max-context 128: it holds less than its documented limits say (the refusal: KV-Cache is full); a prompt of 64"),
            "{line}"
        );
        f.points.pop();
        assert!(!summary(&f).contains("holds less"));
    }

    /// NPUW's walk from the longest prompt to the end of its KV model: the matching steps are one
    /// range with their cosines' span, the refusal after them stays on its own.
    #[test]
    fn consecutive_matching_steps_are_one_range_in_the_summary() {
        let step = |tokens, cos, outcome| {
            let mut p = point(tokens, cos, outcome);
            p.phase = CapacityPhase::Generation;
            p
        };
        let mut points = vec![point(64, 0.9999, CapacityOutcome::Matches)];
        points.extend((65..=70).map(|t| {
            step(
                t,
                if t == 67 { 0.9993 } else { 1.0 },
                CapacityOutcome::Matches,
            )
        }));
        let mut refused = step(71, 0.0, CapacityOutcome::Refused);
        refused.comparison = None;
        points.push(refused);
        let line = summary(&facts(points).finding);
        assert!(
            line.contains("a prompt of 64 tokens matches 0.9999; the 6 generation steps that see 65–70 tokens: matches 0.9993–1.0000; the generation step that sees 71 tokens refused"),
            "{line}"
        );
        // two steps are not a range
        let two = facts(vec![
            step(5, 1.0, CapacityOutcome::Matches),
            step(6, 1.0, CapacityOutcome::Matches),
        ]);
        assert!(summary(&two.finding)
            .contains("sees 5 tokens matches 1.0000; the generation step that sees 6"));
    }
}
