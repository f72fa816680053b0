//! A capacity verdict decided by replay (issue 34, docs/diagnosis.md "Replay"). The capacity
//! check is the failing control: its garbled answers are what a hypothesis must reproduce, so
//! every hypothesis is sent the check's own requests (`CapacityRecord::replay`) and compared
//! with the device point by point, not on the greedy steps (which never reach the end of the
//! context and cannot tell a capacity fault from healthy).
//!
//! The rule of evidence is the replays' (`evidence::judge_points`): on the garbled points, the
//! hypothesis' median miss is within the declared precision there (the fault-free emulator's
//! miss against the f32 reference) and `PRECISION_RATIO` × below the healthy hypothesis' (the
//! fault-free emulator built to the device's description); and on no other point does the
//! healthy hypothesis beat it that way (a hypothesis that breaks a point the device answered
//! like its reference contradicts a passing control). A refusal where the device answered, or an
//! answer where it refused, is the largest miss.
//!
//! The hypotheses: the capacity faults of the family's table, each at the real limit fitted by
//! replay inside every interval between two declared limits (a device holds less than one of
//! them: `fit_limit`), the rule's own candidates, and the competitors the greedy search found
//! closest (a position or scale fault that garbles only past the end of the context).

use kvprobe_npu::contract::faults::{Expected, FaultTable, Values};
use kvprobe_schema::{
    CapacityFinding, CapacityOutcome, CapacityPhase, FaultHypothesis, FaultValue, Replay,
    ReplayStep, Verdict,
};

use super::choice::{apply, choose, not_replayed};
use super::evidence::{median, Point};
use super::outcome::Diagnosis;
use super::replay::{in_replay, judged, miss, Replayer};
use crate::capacity_record::CapacityEvidence;
use crate::capacity_record::CapacityRecord;
use crate::session::Session;
use crate::thresholds::STEP_NOISE_FLOOR;
use kvprobe_reference::Model;

/// Answers of a replay, one per capacity point (`None`: refused).
type Answers = Vec<Option<Vec<f32>>>;

/// 1 − cosine between two answers; both refused agree, one refused is the largest miss (2).
pub(super) fn point_miss(a: Option<&Vec<f32>>, b: Option<&Vec<f32>>) -> f64 {
    match (a, b) {
        (Some(a), Some(b)) => miss(a, b),
        (None, None) => 0.0,
        _ => 2.0,
    }
}

/// The device's capacity check and the healthy hypothesis' account of it, what every fault
/// hypothesis is judged against.
pub(super) struct CapacityJudge<'r> {
    rec: &'r CapacityRecord,
    /// The failing control's points (garbled answers).
    garbled: Vec<bool>,
    /// The healthy hypothesis' miss against the device, per point.
    healthy: Vec<f64>,
    /// The declared precision per point: the fault-free emulator against the f32 reference.
    precision: Vec<Option<f64>>,
}

impl<'r> CapacityJudge<'r> {
    /// `healthy`: the fault-free emulator's answers to every request of `rec`.
    pub(super) fn new(
        rec: &'r CapacityRecord,
        finding: &CapacityFinding,
        healthy: &Answers,
    ) -> Self {
        let garbled = finding
            .points
            .iter()
            .map(|p| p.outcome == CapacityOutcome::Garbled)
            .collect();
        let healthy_miss = (0..rec.device.len())
            .map(|i| {
                point_miss(
                    healthy.get(i).and_then(Option::as_ref),
                    rec.device[i].as_ref(),
                )
            })
            .collect();
        let precision = (0..rec.device.len())
            .map(|i| {
                match (
                    healthy.get(i).and_then(Option::as_ref),
                    rec.reference.get(i),
                ) {
                    (Some(h), Some(Some(r))) => Some(miss(h, r)),
                    _ => None,
                }
            })
            .collect();
        CapacityJudge {
            rec,
            garbled,
            healthy: healthy_miss,
            precision,
        }
    }

    /// The median over the garbled points of `v`.
    fn over_garbled(&self, v: impl Fn(usize) -> Option<f64>) -> Option<f64> {
        median(
            (0..self.garbled.len())
                .filter(|&i| self.garbled[i])
                .filter_map(v)
                .collect(),
        )
    }

    /// The healthy hypothesis' median miss on the garbled points.
    pub(super) fn healthy_miss(&self) -> f64 {
        self.over_garbled(|i| Some(self.healthy[i])).unwrap_or(0.0)
    }

    /// `fault`'s answers judged (module doc); `answers` may stop short (a screen): the points
    /// it does not reach are not judged.
    pub(super) fn judge(&self, fault: FaultHypothesis, answers: &Answers) -> Replay {
        let steps: Vec<ReplayStep> = answers
            .iter()
            .enumerate()
            .map(|(i, a)| ReplayStep {
                step: i,
                replay_miss: point_miss(a.as_ref(), self.rec.device[i].as_ref()),
                healthy_miss: Some(self.healthy[i]),
                precision: self.precision[i],
            })
            .collect();
        // the garbled points are the capacity check's own verdict on each answer
        let points: Vec<Point> = (0..self.garbled.len())
            .map(|i| Point {
                healthy: Some(self.healthy[i]),
                precision: self.precision[i],
                garbled: self.garbled[i],
            })
            .collect();
        judged(fault, steps, &points)
    }
}

/// Runs `fault` through the capacity check's requests on its emulator, the points `..upto`.
pub(super) fn answers(
    (model, ids): (&Model, &[u32]),
    replayer: &dyn Replayer,
    fault: &FaultHypothesis,
    rec: &CapacityRecord,
    upto: usize,
) -> Result<Answers, String> {
    in_replay((model, ids), replayer, fault, |rs| {
        rec.replay(rs, upto).map_err(|e| e.to_string())
    })
}

/// The capacity faults of `table`: declared `capacity-overflow`, valued by a number of tokens.
pub(super) fn capacity_faults(table: &FaultTable) -> Vec<&'static str> {
    table
        .faults
        .iter()
        .filter(|d| d.expected == Expected::Always(Verdict::CapacityOverflow))
        .filter(|d| matches!(d.values, Values::Number(_)))
        .map(|d| d.name)
        .collect()
}

/// `name=n`, unscoped.
pub(super) fn at(name: &str, n: usize) -> FaultHypothesis {
    FaultHypothesis {
        name: name.to_string(),
        value: FaultValue::Number(n as f64),
        groups: vec![],
        kinds: vec![],
        layers: vec![],
    }
}

/// The device's measured limit and how many request pairs measured it.
pub(super) struct Departure {
    pub limit: usize,
    pub requests: usize,
}

/// Where `device` departs from `healthy` (the fault-free emulator) over `rec`'s sequence: the
/// shortest prompt after which its answers — the prompt's, then one step fed the sequence's next
/// token — leave the healthy hypothesis' by more than the declared precision (`tol`), bisected
/// between the session's prompt and the first garbled request of the check. `None` when the
/// session's prompt already departs (the fault is not one of capacity: it shows inside every
/// limit) or the garbled request does not.
pub(super) fn departure(
    device: &mut Session,
    healthy: &mut Session,
    (rec, finding): (&CapacityRecord, &CapacityFinding),
    tol: f64,
) -> crate::Result<Option<Departure>> {
    let Some(hi) = first_garbled_prompt(finding) else {
        return Ok(None);
    };
    let lo = rec.lengths.first().copied().unwrap_or(1).min(hi);
    let mut requests = 0;
    let mut agrees = |t: usize| -> crate::Result<bool> {
        requests += 1;
        let d = rec.prompt_and_step(device, t)?;
        let h = rec.prompt_and_step(healthy, t)?;
        Ok(point_miss(d.0.as_ref(), h.0.as_ref()) <= tol
            && point_miss(d.1.as_ref(), h.1.as_ref()) <= tol)
    };
    if lo >= hi || !agrees(lo)? || agrees(hi)? {
        return Ok(None);
    }
    let (mut lo, mut hi) = (lo, hi);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if agrees(mid)? {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(Some(Departure {
        limit: hi,
        requests,
    }))
}

/// The prompt whose answers (its own, then one step's) first reach the check's first garbled
/// point: the garbled prompt itself, or the prompt one short of a garbled step's context.
fn first_garbled_prompt(finding: &CapacityFinding) -> Option<usize> {
    let p = finding.garbled().next()?;
    Some(match p.phase {
        CapacityPhase::Prompt => p.tokens,
        CapacityPhase::Generation => p.tokens.saturating_sub(1),
    })
}

/// The capacity hypotheses at a measured limit: every capacity fault of `table` at each value
/// the measurement cannot tell apart (a prompt of `limit` tokens and its step see `limit` and
/// `limit + 1` tokens, so the real limit is within one token of it).
pub(super) fn at_limit(table: &FaultTable, limit: usize) -> Vec<FaultHypothesis> {
    capacity_faults(table)
        .into_iter()
        .flat_map(|name| {
            (limit.saturating_sub(1)..=limit + 1)
                .filter(|&n| n > 0)
                .map(move |n| at(name, n))
        })
        .collect()
}

/// A measured departure, none, or why it could not be measured.
pub(super) type Measured = Result<Option<Departure>, String>;

/// The device's [`Departure`] from the fault-free emulator over the capacity check's sequence
/// (`c`: none when the check did not decide the verdict), within the declared precision: the
/// greedy steps' median matched-vs-f32 miss (`healthy`, `replay::healthy_steps`), at least the
/// noise floor.
///
/// First the device's answers to the check's requests are recorded again from a fresh start, as
/// every replay starts (the check ran after other probes, whose ring bytes a capacity fault may
/// keep: no emulator can replay that history).
pub(super) fn measure(
    s: &mut Session,
    replayer: &dyn Replayer,
    c: Option<&mut CapacityEvidence>,
    healthy: &[(Option<f64>, Option<f64>)],
) -> Option<Measured> {
    let c = c?;
    let all = c.record.device.len();
    match c.record.replay(s, all) {
        Ok(again) if again.len() == all => c.record.device = again,
        Ok(_) => {
            return Some(Err(
                "the device's answers could not be recorded again".into()
            ))
        }
        Err(e) => {
            return Some(Err(format!(
                "the device's answers could not be recorded again: {e}"
            )))
        }
    }
    let tol = median(healthy.iter().filter_map(|h| h.1).collect())
        .unwrap_or(0.0)
        .max(STEP_NOISE_FLOOR);
    let (model, ids) = (s.model, s.ids.clone());
    Some(in_replay((model, &ids), replayer, &none(), |hs| {
        departure(s, hs, (&c.record, &c.finding), tol).map_err(|e| e.to_string())
    }))
}

/// The measured limit and the evidence line that says how it was measured (or why not).
pub(super) fn said(d: Option<Measured>) -> (Option<usize>, String) {
    match d {
        Some(Ok(Some(d))) => (
            Some(d.limit),
            format!(
                "the device answers as the healthy hypothesis does up to a prompt of {} tokens \
                 and one step, not from {} on (bisected in {} requests): the capacity faults \
                 are replayed there",
                d.limit - 1,
                d.limit,
                d.requests
            ),
        ),
        Some(Ok(None)) => (
            None,
            "no capacity limit measured: the device already leaves the healthy hypothesis on the \
             session's prompt and its step, or not yet on the first garbled request, so no \
             capacity fault is replayed"
                .into(),
        ),
        Some(Err(e)) => (None, format!("no capacity limit measured: {e}")),
        None => (None, String::new()),
    }
}

/// What the capacity replays found: every whole replay (not the healthy hypothesis'), the
/// hypotheses the emulator refused, and the line that says how.
pub(super) struct CapacityReplays {
    pub replays: Vec<Replay>,
    pub refused: Vec<String>,
    pub line: String,
}

/// The healthy hypothesis, then `hyps` (the capacity faults at the device's measured limit, the
/// rule's candidates and the greedy search's closest), each through `rec`'s requests and judged
/// by [`CapacityJudge`]; `spent` counts every replay. `Err` when the healthy hypothesis itself
/// cannot be replayed.
pub(super) fn replay_all(
    ctx: (&Model, &[u32]),
    replayer: &dyn Replayer,
    (finding, rec): (&CapacityFinding, &CapacityRecord),
    hyps: Vec<FaultHypothesis>,
    spent: &std::cell::Cell<usize>,
) -> Result<CapacityReplays, String> {
    let all = rec.device.len();
    let run = |h: &FaultHypothesis| {
        spent.set(spent.get() + 1);
        answers(ctx, replayer, h, rec, all)
    };
    let healthy = run(&none())?;
    let judge = CapacityJudge::new(rec, finding, &healthy);
    let mut out = CapacityReplays {
        replays: Vec::new(),
        refused: Vec::new(),
        line: format!(
            "replayed on the capacity check's {all} requests (its garbled answers are the failing \
             control; the greedy steps never reach the end of the context): the healthy \
             hypothesis misses the garbled answers by {:.2e} (median)",
            judge.healthy_miss(),
        ),
    };
    let mut seen: Vec<String> = Vec::new();
    for h in hyps {
        let text = h.text();
        if seen.contains(&text) || replayer.leaves_out(&h.name) {
            continue;
        }
        seen.push(text.clone());
        match run(&h) {
            Ok(a) => out.replays.push(judge.judge(h, &a)),
            Err(e) => out.refused.push(format!("{text}: {e}")),
        }
    }
    Ok(out)
}

/// The verdict of a diagnosis the capacity check decided (`decide`): the capacity faults at the
/// measured limit (`departure`), the rule's own candidates (`own`) and the greedy search's
/// closest (`rivals`) replayed on the check's requests, the scorer's choice written into `d`.
pub(super) fn verdict(
    d: &mut Diagnosis,
    ctx: (&Model, &[u32]),
    replayer: &dyn Replayer,
    (c, departure): (CapacityEvidence, Option<Measured>),
    (own, rivals): (Vec<FaultHypothesis>, Vec<FaultHypothesis>),
    spent: &std::cell::Cell<usize>,
) {
    let table = replayer.table();
    let (limit, line) = said(departure);
    let mut hyps = limit.map_or(Vec::new(), |l| at_limit(&table, l));
    hyps.extend(own);
    hyps.extend(rivals);
    let found = match replay_all(ctx, replayer, (&c.finding, &c.record), hyps, spent) {
        Ok(f) => f,
        Err(e) => {
            let why = format!("the capacity check's requests could not be replayed: {e}");
            return not_replayed(d, &why);
        }
    };
    let command = |r: &Replay| replayer.capacity_command(&r.fault.text());
    let expected = |r: &Replay| table.expected(&r.fault.text()).ok();
    let choice = choose(d.verdict, &found.replays, &expected);
    let tried = found
        .replays
        .iter()
        .map(|r| (r.fault.text(), r.replay_miss))
        .collect();
    apply(
        d,
        choice,
        tried,
        &found.refused,
        &command,
        c.record.device.len(),
    );
    d.evidence.push(format!("{}; {line}", found.line));
    d.evidence
        .push(format!("replay budget: {} replays", spent.get()));
}

/// The healthy hypothesis: the emulator without a fault.
pub(super) fn none() -> FaultHypothesis {
    FaultHypothesis {
        name: String::new(),
        value: FaultValue::None,
        groups: vec![],
        kinds: vec![],
        layers: vec![],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_on_one_side_is_the_largest_miss() {
        let v = vec![1.0f32, 0.0];
        assert_eq!(point_miss(None, None), 0.0);
        assert_eq!(point_miss(Some(&v), None), 2.0);
        assert!(point_miss(Some(&v), Some(&v)).abs() < 1e-9);
    }

    /// Three points: a prompt the device got right, a step it garbled, a refusal. A hypothesis
    /// that reproduces the garbled step and the rest wins; one that also garbles the passing
    /// prompt contradicts it; one that answers the refused request misses it by the most.
    #[test]
    fn a_replay_must_reproduce_the_garbled_points_and_contradict_no_other() {
        use kvprobe_schema::{CapacityPoint, LogitComparison};
        let (good, bad, other) = (
            vec![1.0f32, 0.0, 0.0],
            vec![0.0f32, 1.0, 0.0],
            vec![0.0f32, 0.0, 1.0],
        );
        let rec = CapacityRecord {
            device: vec![Some(good.clone()), Some(bad.clone()), None],
            reference: vec![Some(good.clone()), Some(good.clone()), None],
            ..CapacityRecord::default()
        };
        let point = |outcome| CapacityPoint {
            phase: CapacityPhase::Generation,
            tokens: 0,
            beyond: vec![],
            documented: None,
            window: None,
            refusal: None,
            comparison: Some(LogitComparison {
                cosine: 0.0,
                kl: 0.0,
                device_top1: 0,
                reference_top1: 0,
                top1_match: false,
            }),
            matched: None,
            outcome,
        };
        let finding = CapacityFinding {
            limits: vec![],
            points: vec![
                point(CapacityOutcome::Matches),
                point(CapacityOutcome::Garbled),
                point(CapacityOutcome::Refused),
            ],
            generation_prompt: 0,
            first_garbled_prompt: None,
            first_garbled_context: None,
            silent_overflow: true,
            quick: true,
        };
        // the fault-free emulator answers like the reference and refuses like the device
        let healthy = vec![Some(good.clone()), Some(good.clone()), None];
        let judge = CapacityJudge::new(&rec, &finding, &healthy);
        assert!(judge.healthy_miss() > 0.9);
        let right = judge.judge(at("ring-capacity", 9), &rec.device.clone());
        assert!(
            right.reproduces && right.replay_miss.abs() < 1e-9,
            "{right:?}"
        );
        // garbles the passing prompt as well: contradicts it
        let broken = vec![Some(other.clone()), Some(bad.clone()), None];
        let r = judge.judge(at("ring-capacity", 8), &broken);
        assert!(r.replay_miss.abs() < 1e-9 && !r.reproduces, "{r:?}");
        // answers where the device refused: the largest miss there, a contradiction
        let answers = vec![Some(good.clone()), Some(bad.clone()), Some(good.clone())];
        let r = judge.judge(at("ring-capacity", 7), &answers);
        assert_eq!(r.steps[2].replay_miss, 2.0);
        assert!(!r.reproduces);
        // healthy itself: does not beat itself
        assert!(!judge.judge(none(), &healthy).reproduces);
    }

    #[test]
    fn the_capacity_hypotheses_bracket_the_measured_limit() {
        let table = kvprobe_npu::sim::FAMILY.faults;
        let t: Vec<String> = at_limit(&table, 96).iter().map(|h| h.text()).collect();
        assert_eq!(
            t,
            [
                "prefill-truncate=95",
                "prefill-truncate=96",
                "prefill-truncate=97",
                "ring-capacity=95",
                "ring-capacity=96",
                "ring-capacity=97"
            ]
        );
    }
}
