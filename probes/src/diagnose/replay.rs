//! Replay (issue 34): the verdict's cause as typed fault hypotheses of the emulator's grammar,
//! each replayed on the emulator built to the device's description, driven on the device's own
//! greedy tokens and compared per step with the device's logits. The closest replay becomes the
//! verdict's reproducer: the command that produces the same failure without the hardware, and
//! how close it came (docs/diagnosis.md, "Replay").
//!
//! The hypotheses come from the family's fault table (the faults whose declared verdict is the
//! verdict named), their values from what the probes fitted (attention scale, position shift)
//! or, for faults no probe fits, from the table's own sweep values. The emulator's fault list of
//! the device under test is never read: the replayer gets only the hypothesis.

use kvprobe_npu::contract::faults::{FaultDecl, FaultTable, FaultText, Scope, SweepValue, Values};
use kvprobe_reference::Model;
use kvprobe_schema::{FaultHypothesis, FaultValue, GreedyFinding, Replay, ReplayStep, Verdict};

pub(super) use super::evidence::median;
use super::evidence::{judge_points, Point, MILD_FACTORS};
pub use super::fits::Fits;
use super::fits::{evidence_scopes, hypothesis, scopes, RingScope};
pub use super::replayer::Replayer;
use crate::cache_io::{self, Rings};
use crate::determinism::request_step;
use crate::metrics::cosine;
use crate::progress::NoProgress;
use crate::session::Session;
use crate::thresholds::STEP_NOISE_FLOOR;

/// At most this many hypotheses are replayed per diagnosis (each builds an emulator and runs
/// the prompt and every greedy step): the `diagnose` benchmark's budget, not a decision.
pub const MAX_REPLAYS: usize = 3;

/// Values tried for a factor fault that no probe fitted: the sweep's range ends and the mild
/// factors (`score::MILD_FACTORS`).
const FACTOR_FALLBACK: [f64; 2] = [0.5, 2.0];

/// The values `decl` is hypothesised with, fitted ones first (`true` = fitted).
fn values(decl: &FaultDecl, fits: &Fits) -> Vec<(FaultValue, bool)> {
    // a word a probe decoded (a reader's layout) is fitted
    let words = |w: &[&str]| -> Vec<(FaultValue, bool)> {
        w.iter()
            .map(|w| FaultValue::Word(w.to_string()))
            .map(|v| (v.clone(), fits.fitted(decl, &v)))
            .collect()
    };
    let numbers = |xs: Vec<f64>, fitted: bool| -> Vec<(FaultValue, bool)> {
        xs.into_iter()
            .map(|x| (FaultValue::Number(x), fitted))
            .collect()
    };
    match (decl.sweep, decl.values) {
        (_, Values::None) => vec![(FaultValue::None, false)],
        (SweepValue::Fixed(w), Values::OneOf(_)) => words(&[w]),
        // every word the grammar takes, not only the ones the sweep draws: a writer layout
        // solved from the ring bytes (`layout --infer`) may be one the sweep never injects
        (_, Values::OneOf(w)) => words(w),
        (SweepValue::OneOf(w), _) => words(w),
        (SweepValue::Factor, _) => {
            // the scale fits measure the attention scale, the quant infos a cache scale
            let fitted = if decl.name.ends_with("attn-scale") {
                fits.scales.clone()
            } else if decl.name.ends_with("cache-scale") {
                fits.cache_scales.clone()
            } else {
                Vec::new()
            };
            let mut v = numbers(fitted, true);
            v.extend(numbers(FACTOR_FALLBACK.to_vec(), false));
            v.extend(numbers(MILD_FACTORS.to_vec(), false));
            v
        }
        (SweepValue::SmallSigned, _) => {
            let (fitted, small) = small_shifts(fits);
            let mut v = numbers(fitted, true);
            v.extend(numbers(small, false));
            v
        }
        (SweepValue::EntryFraction, _) => {
            // the bytes the zero tap shows kept first, then the sweep's fractions of the entry
            let mut v = numbers(fits.kept_bytes.clone(), true);
            let fractions = [1, 2, 3].iter().map(|k| (fits.entry_bytes * k / 4) as f64);
            v.extend(numbers(
                fractions
                    .filter(|&x| x > 0.0 && !fits.kept_bytes.contains(&x))
                    .collect(),
                false,
            ));
            v
        }
        (SweepValue::HeadFraction, _) => numbers(
            [4, 8]
                .iter()
                .map(|k| fits.head_dim / k)
                .filter(|&w| w >= 2)
                .map(|w| w as f64)
                .collect(),
            false,
        ),
        (SweepValue::RopeFactor, _) => numbers(vec![2.0, 4.0, 8.0], false),
        (_, Values::OptionalNumber(_)) => vec![(FaultValue::None, false)],
        // a number no probe fits and the sweep does not draw: not hypothesised
        _ => Vec::new(),
    }
}

/// The shifts a small signed fault is tried at: the fitted shift (when one is), then the
/// grammar's small values ±1 beside it. A shift fitted on one tbt step can be one off (a
/// `tbt-position=-1` on SmolLM2 at L 64 / P 16 fits +2): the fit joins the small values, never
/// replaces them.
pub(super) fn small_shifts(fits: &Fits) -> (Vec<f64>, Vec<f64>) {
    let fitted: Vec<f64> = (fits.shift != 0)
        .then_some(fits.shift as f64)
        .into_iter()
        .collect();
    let small = [1.0, -1.0]
        .into_iter()
        .filter(|x| !fitted.contains(x))
        .collect();
    (fitted, small)
}

/// The hypotheses the rings the evidence names allow, whatever verdict they declare: every
/// fault the grammar scopes by ring (layer or K/V) at each scope a probe or kvdiff names
/// (`Fits::rings`, `Fits::hinted`), at its values, ranked as [`candidates`] ranks. What a
/// rules' `unknown` replays (no rule named a cause, but the evidence names rings), and what
/// competes with a named cause no replay of which is exact: a fault on one layer is a scope
/// question the scorer answers, not a rule.
pub fn proposals(table: &FaultTable, fits: &Fits) -> Vec<(usize, FaultHypothesis)> {
    ranked(table, fits, evidence_scopes, &|_| true)
}

/// Every hypothesis of `table` whose declared verdict is `verdict`, each with how many of its
/// value and scope the evidence points at (`fits`: 2 both, 1 one, 0 neither), most pointed first,
/// then in table order.
pub fn candidates(
    table: &FaultTable,
    verdict: Verdict,
    fits: &Fits,
) -> Vec<(usize, FaultHypothesis)> {
    ranked(table, fits, scopes, &|v| v == verdict)
}

/// Every fault of `table` at each of its values and of the scopes `scopes_of` gives it, whose
/// declared verdict under that scope `keeps`, each with how much of it the evidence points at
/// (a fitted value, a named scope), most pointed first.
fn ranked(
    table: &FaultTable,
    fits: &Fits,
    scopes_of: fn(&FaultDecl, &Fits) -> Vec<(RingScope, bool)>,
    keeps: &dyn Fn(Verdict) -> bool,
) -> Vec<(usize, FaultHypothesis)> {
    let mut out: Vec<(usize, FaultHypothesis)> = Vec::new();
    for decl in table.faults {
        for (value, was_fitted) in values(decl, fits) {
            for (scope, named) in scopes_of(decl, fits) {
                let h = hypothesis(decl, value.clone(), &scope);
                let text = h.text();
                let f = FaultText::split(&text);
                // a scope the grammar refuses for this fault is no hypothesis
                let expected = table
                    .decl(&f)
                    .ok()
                    .filter(|d| d.name == decl.name)
                    .and_then(|d| Scope::parse(&f, d).ok().map(|s| d.expected(&s)));
                if !expected.is_some_and(keeps) || out.iter().any(|x| x.1.text() == text) {
                    continue;
                }
                out.push((usize::from(was_fitted) + usize::from(named), h));
            }
        }
    }
    // stable: table order within a rank
    out.sort_by_key(|(k, _)| std::cmp::Reverse(*k));
    out
}

/// The rule of evidence for a replay (`evidence::judge_points`): on the steps the device
/// garbled (the healthy hypothesis leaves it there by `PRECISION_RATIO` × the declared
/// precision), its median miss is within the declared precision and `PRECISION_RATIO` × below
/// the healthy hypothesis'; on no other step does the healthy hypothesis beat it that way.
pub fn judge(fault: FaultHypothesis, steps: Vec<ReplayStep>) -> Replay {
    let healthy: Vec<(Option<f64>, Option<f64>)> = steps
        .iter()
        .map(|s| (s.healthy_miss, s.precision))
        .collect();
    judge_over(fault, steps, &healthy)
}

/// The compared steps as the rule of evidence sees them: the healthy hypothesis' miss and the
/// declared precision per step, and whether the device garbled it.
pub(super) fn points(healthy: &[(Option<f64>, Option<f64>)]) -> Vec<Point> {
    healthy.iter().map(|&(h, p)| Point::of(h, p)).collect()
}

/// [`judge`] of a replay whose `steps` may stop short of the compared steps (`healthy`, one per
/// step compared): the steps it did not reach are not judged, and the healthy hypothesis and the
/// precision are the medians over every garbled step compared, so a replay decided early is
/// judged against the same bar as a whole one.
fn judge_over(
    fault: FaultHypothesis,
    steps: Vec<ReplayStep>,
    healthy: &[(Option<f64>, Option<f64>)],
) -> Replay {
    // without a matched reference the f32 reference is the healthy hypothesis (`healthy_steps`)
    judged(fault, steps, &points(healthy))
}

/// `fault`'s replay `steps` (one per point it reached, in order) judged over `points` by the
/// rule of evidence (`evidence::judge_points`): what every replay, greedy or capacity, records.
pub(super) fn judged(fault: FaultHypothesis, steps: Vec<ReplayStep>, points: &[Point]) -> Replay {
    let misses: Vec<f64> = steps.iter().map(|s| s.replay_miss).collect();
    let j = judge_points(&misses, points);
    Replay {
        fault,
        steps,
        replay_miss: j.replay_miss,
        healthy_miss: j.healthy_miss,
        precision: j.precision,
        reproduces: j.reproduces,
    }
}

/// 1 − cosine; a step with non-finite logits on either side (an overflow) is the largest miss,
/// 2, so results.json stays finite and such a step never counts as reproduced.
pub(super) fn miss(replay: &[f32], device: &[f32]) -> f64 {
    // `cosine` reads non-finite input as 0 (a miss of 1, an orthogonal step): a NaN or an
    // infinity is the largest miss instead, worse than any finite disagreement.
    let finite = |v: &[f32]| v.iter().all(|x| x.is_finite());
    if !finite(replay) || !finite(device) {
        return 2.0;
    }
    1.0 - cosine(replay, device)
}

/// What a replay compares against: the device's logits per step, recorded on demand.
pub(super) type DeviceLogits<'a> = dyn FnMut(usize) -> Result<Vec<f32>, String> + 'a;

/// The device's request recorded from a fresh start one step at a time, as far as a replay
/// asks (issue 34: a replay decided after half the steps needs the device's first half only),
/// and its rings after each of the first `keep_rings` steps: what a replay's rings are compared
/// with to grow a layer scope (`residual`). They are read in this same run because a second run
/// would move the device away from the position recorded here.
pub(super) struct DeviceSteps<'s, 'a> {
    s: &'s mut Session<'a>,
    tokens: Vec<u32>,
    logits: Vec<Vec<f32>>,
    keep_rings: usize,
    /// `None` where the device's cache could not be read (a device without `cache_buffers`).
    rings: Vec<Option<Rings>>,
}

impl<'s, 'a> DeviceSteps<'s, 'a> {
    pub(super) fn new(s: &'s mut Session<'a>, tokens: Vec<u32>, keep_rings: usize) -> Self {
        DeviceSteps {
            s,
            tokens,
            logits: Vec::new(),
            keep_rings,
            rings: Vec::new(),
        }
    }

    /// The device's tokens the request is driven with.
    pub(super) fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The device's session, for a measurement after the compared steps were recorded (a step
    /// recorded after it would continue from the measurement's state).
    pub(super) fn session(&mut self) -> &mut Session<'a> {
        self.s
    }

    /// The logits of step `i` (0: the prompt's prefill), recording the steps up to it (past the
    /// device's tokens, on its own argmax: `request_step`).
    pub(super) fn step(&mut self, i: usize) -> crate::Result<&[f32]> {
        while self.logits.len() <= i {
            let k = self.logits.len();
            let before = self.logits.last().map_or(&[][..], Vec::as_slice);
            if let Some(next) = request_step(self.s, k, &self.tokens, Some(before))? {
                self.logits.push(next);
            }
            self.keep_rings_of(k);
        }
        Ok(&self.logits[i])
    }

    fn keep_rings_of(&mut self, step: usize) {
        if step < self.keep_rings {
            let what = format!("after step {step} of the replays' record");
            self.rings.push(cache_io::read(self.s.dev, &what).ok());
        }
    }

    /// The device's rings after each of the first `k` steps, when all of them were read.
    pub(super) fn rings(&self, k: usize) -> Option<Vec<&Rings>> {
        let rings: Vec<&Rings> = self.rings.iter().take(k).flatten().collect();
        (rings.len() == k).then_some(rings)
    }
}

/// Whether a replay may stop before its last step: `Exact` once more than half of the compared
/// steps the device garbled (of every compared step, when it garbled none) replayed at the noise
/// floor (the median the rule of evidence takes is then at the floor too: the replay is exact,
/// and an exact replay of the rule's cause ends the search — nothing can be more precise).
/// `Whole` replays every step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Stop {
    Whole,
    Exact,
}

/// One hypothesis replayed over the first `k` steps: prefill the prompt, step on the device's
/// tokens, miss per step against `device`. `model` and `ids` are the device session's.
#[allow(clippy::too_many_arguments)]
pub(super) fn replay_one(
    (model, ids): (&Model, &[u32]),
    replayer: &dyn Replayer,
    fault: &FaultHypothesis,
    device: &mut DeviceLogits,
    (k, stop): (usize, Stop),
    tokens: &[u32],
    healthy: &[(Option<f64>, Option<f64>)],
) -> Result<Replay, String> {
    // a fresh start (`start_logits`: reset, rings cleared, a new process' host window), stepped
    // as the device's request was recorded again (`DeviceSteps`) and as the reproducer command
    // runs: the device's tokens, past their end the replay's own argmax (`request_step`)
    let k = k.max(1);
    let compared = points(&healthy[..k.min(healthy.len())]);
    // the steps the exact stop counts: the garbled ones, or all when none is
    let garbled: Vec<bool> = compared.iter().map(|p| p.garbled).collect();
    let counted = |step: usize| !garbled.contains(&true) || garbled.get(step) == Some(&true);
    let at_floor_needed = (0..k).filter(|&i| counted(i)).count() / 2 + 1;
    let steps = in_replay((model, ids), replayer, fault, |rs| {
        let mut steps: Vec<ReplayStep> = Vec::with_capacity(k);
        let mut last: Vec<f32> = Vec::new();
        for step in 0..k {
            let Some(logits) =
                request_step(rs, step, tokens, Some(&last)).map_err(|e| e.to_string())?
            else {
                break;
            };
            steps.push(ReplayStep {
                step,
                replay_miss: miss(&logits, &device(step)?),
                healthy_miss: healthy.get(step).and_then(|h| h.0),
                precision: healthy.get(step).and_then(|h| h.1),
            });
            last = logits;
            let at_floor = steps
                .iter()
                .filter(|x| counted(x.step) && x.replay_miss <= STEP_NOISE_FLOOR)
                .count();
            if stop == Stop::Exact && at_floor >= at_floor_needed {
                break;
            }
        }
        Ok(steps)
    })?;
    Ok(judged(fault.clone(), steps, &compared))
}

/// `f` on a session of the emulator the replayer builds with `fault`, over the device session's
/// `model` and `ids`: what a replay and a replay's ring read (`residual::replay_rings`) run in.
pub(super) fn in_replay<T>(
    (model, ids): (&Model, &[u32]),
    replayer: &dyn Replayer,
    fault: &FaultHypothesis,
    f: impl FnOnce(&mut Session) -> Result<T, String>,
) -> Result<T, String> {
    let mut dev = replayer.open(&fault.text()).map_err(|e| e.to_string())?;
    let progress = NoProgress;
    let mut rs =
        Session::new(model, dev.as_mut(), ids.to_vec(), &progress).map_err(|e| e.to_string())?;
    f(&mut rs)
}

/// Per greedy step, the healthy hypothesis' miss against the device (the matched reference's,
/// or the f32 reference's where the device declares no lower precision) and the declared
/// precision (the matched reference's miss against f32).
pub(super) fn healthy_steps(greedy: &GreedyFinding) -> Vec<(Option<f64>, Option<f64>)> {
    greedy
        .steps
        .iter()
        .map(|x| {
            x.matched
                .map_or((Some(1.0 - x.comparison.cosine), None), |m| {
                    (
                        Some(1.0 - m.matched_vs_device),
                        Some(1.0 - m.reference_vs_matched),
                    )
                })
        })
        .collect()
}

/// Steps a hypothesis is screened on when there are more than can be replayed whole: the prefill
/// and the first tbt steps, where a fault first shows (a budget, not a decision).
pub(super) const SCREEN_STEPS: usize = 4;

/// `hyps` ordered by their summed miss over the first `steps` steps (`run(h, k)`
/// replays `h` over `k` steps), closest first; the ones the emulator refuses go to `refused`.
pub(super) fn screen(
    hyps: Vec<FaultHypothesis>,
    steps: usize,
    run: &dyn Fn(&FaultHypothesis, usize) -> Result<Replay, String>,
    refused: &mut Vec<String>,
) -> Vec<FaultHypothesis> {
    screen_scored(hyps, steps, run, refused)
        .into_iter()
        .map(|(_, h)| h)
        .collect()
}

/// [`screen`] with each hypothesis' summed miss (what a growth start is ranked by, `residual`).
pub(super) fn screen_scored(
    hyps: Vec<FaultHypothesis>,
    steps: usize,
    run: &dyn Fn(&FaultHypothesis, usize) -> Result<Replay, String>,
    refused: &mut Vec<String>,
) -> Vec<(f64, FaultHypothesis)> {
    let mut scored: Vec<(f64, FaultHypothesis)> = Vec::new();
    for h in hyps {
        match run(&h, steps) {
            Ok(r) => scored.push((r.steps.iter().map(|x| x.replay_miss).sum(), h)),
            Err(e) => refused.push(format!("{}: {e}", h.text())),
        }
    }
    scored.sort_by(|a, b| a.0.total_cmp(&b.0));
    scored
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_follow_the_table_and_put_fitted_values_first() {
        let table = kvprobe_npu::sim::FAMILY.faults;
        let fits = Fits {
            scales: vec![0.85],
            entry_bytes: 64,
            head_dim: 64,
            ..Fits::default()
        };
        let texts = |fits: &Fits, v: Verdict| -> Vec<String> {
            candidates(&table, v, fits)
                .iter()
                .map(|(_, h)| h.text())
                .collect()
        };
        let c = texts(&fits, Verdict::TbtGraph);
        assert_eq!(c[0], "tbt-attn-scale=0.85", "{c:?}");
        assert!(c.contains(&"tbt-attn-scale=0.5".to_string()), "{c:?}");
        // a prefill-scoped graph fault is a prefill-graph hypothesis, never a tbt-graph one
        assert!(c.iter().all(|t| !t.contains("@prefill")), "{c:?}");
        let p = texts(&fits, Verdict::PositionMismatch);
        assert!(p.contains(&"tbt-position=+1".to_string()), "{p:?}");
        // the position fit found the host shift +2 repairing it: the graph is wired −2 off
        let shifted = Fits {
            shift: -2,
            ..fits.clone()
        };
        assert_eq!(
            texts(&shifted, Verdict::PositionMismatch)[0],
            "tbt-position=-2"
        );
        // the quant infos' ratio on the rings they name, then the ratio elsewhere and the named
        // rings at the table's values
        let quant = Fits {
            cache_scales: vec![1.5, 0.67],
            rings: vec![super::super::fits::RingScope {
                kinds: vec![kvprobe_schema::CacheKind::V],
                ..Default::default()
            }],
            ..fits.clone()
        };
        let q = candidates(&table, Verdict::CacheQuantization, &quant);
        assert_eq!(q[0], (2, q[0].1.clone()));
        assert_eq!(q[0].1.text(), "tbt-cache-scale=1.5@v");
        assert_eq!(q[1].1.text(), "tbt-cache-scale=0.67@v");
        // the writer's ring bytes of K decode as f8cr: that layout on K first
        let writer = Fits {
            writer_layouts: vec!["f8cr".into()],
            rings: vec![super::super::fits::RingScope {
                kinds: vec![kvprobe_schema::CacheKind::K],
                ..Default::default()
            }],
            ..fits.clone()
        };
        let w = candidates(&table, Verdict::CacheLayoutMismatch, &writer);
        assert_eq!(w[0].0, 2);
        assert_eq!(w[0].1.text(), "prefill-write-layout=f8cr@k");
        // layers named by a partial swap: the swap on those layers first
        let swap = Fits {
            rings: vec![super::super::fits::RingScope {
                layers: vec![1, 2],
                ..Default::default()
            }],
            ..fits
        };
        assert_eq!(
            texts(&swap, Verdict::KvBinding)[0],
            "kv-swap@layer=1,layer=2"
        );
    }

    #[test]
    fn a_fitted_shift_joins_the_small_values() {
        let table = kvprobe_npu::sim::FAMILY.faults;
        let texts = |shift: i64| -> Vec<String> {
            let fits = Fits {
                shift,
                ..Fits::default()
            };
            candidates(&table, Verdict::PositionMismatch, &fits)
                .iter()
                .map(|(_, h)| h.text())
                .filter(|t| t.starts_with("tbt-position"))
                .collect()
        };
        // fitted −2 first, then ±1 beside it: a fit one off leaves the true value tried
        assert_eq!(
            texts(-2),
            ["tbt-position=-2", "tbt-position=+1", "tbt-position=-1"]
        );
        // a fitted ±1 is not tried twice
        assert_eq!(texts(1), ["tbt-position=+1", "tbt-position=-1"]);
        assert_eq!(texts(0), ["tbt-position=+1", "tbt-position=-1"]);
    }

    #[test]
    fn the_rings_the_evidence_names_propose_every_ring_fault_there() {
        use super::super::fits::RingScope;
        use kvprobe_schema::CacheKind;
        let table = kvprobe_npu::sim::FAMILY.faults;
        // no rule named a cause; kvdiff hints layer 7's K and the layer before it
        let fits = Fits {
            hinted: vec![
                RingScope {
                    kinds: vec![CacheKind::K],
                    layers: vec![7],
                    ..RingScope::default()
                },
                RingScope {
                    kinds: vec![CacheKind::K],
                    layers: vec![6],
                    ..RingScope::default()
                },
            ],
            entry_bytes: 64,
            head_dim: 64,
            ..Fits::default()
        };
        let p: Vec<String> = proposals(&table, &fits)
            .iter()
            .map(|(_, h)| h.text())
            .collect();
        for want in [
            "tbt-read-layout=f8cr@k,layer=6",
            "prefill-write-layout=feature-major@k,layer=7",
            "tbt-cache-scale=1.15@k,layer=6",
            "truncate-entry=32@k,layer=7",
            "kv-swap@layer=6",
        ] {
            assert!(p.contains(&want.to_string()), "{want} missing from {p:?}");
        }
        // only at the rings named: no fault without a ring scope, no ring the evidence skips
        assert!(
            p.iter()
                .all(|t| t.contains("layer=6") || t.contains("layer=7")),
            "{p:?}"
        );
        // a probe's ring outranks kvdiff's hint, a fitted value a table's
        let named = Fits {
            rings: vec![fits.hinted[1].clone()],
            reader_layouts: vec!["f8cr".into()],
            ..fits.clone()
        };
        let top = &proposals(&table, &named)[0];
        assert_eq!(
            (top.0, top.1.text()),
            (2, "tbt-read-layout=f8cr@k,layer=6".into())
        );
        // nothing named, nothing proposed
        assert!(proposals(&table, &Fits::default()).is_empty());
    }

    fn step(replay: f64, healthy: f64, precision: f64) -> ReplayStep {
        ReplayStep {
            step: 0,
            replay_miss: replay,
            healthy_miss: Some(healthy),
            precision: Some(precision),
        }
    }

    fn h() -> FaultHypothesis {
        FaultHypothesis {
            name: "kv-swap".into(),
            value: FaultValue::None,
            groups: vec![],
            kinds: vec![],
            layers: vec![],
        }
    }

    #[test]
    fn a_replay_stopped_early_is_judged_by_the_medians_of_every_garbled_step() {
        let healthy = vec![(Some(0.2), Some(1e-3)); 5];
        let r = judge_over(h(), vec![step(0.0, 0.2, 1e-3); 3], &healthy);
        assert!(r.reproduces && r.replay_miss == 0.0 && r.steps.len() == 3);
        // the device garbled steps 0 and 3 (0.2 and 3e-3 against a precision of 1e-3, ≥ 2.5×);
        // a replay that stopped after step 0 meets the bar of both: the healthy hypothesis'
        // median over every garbled step compared, not over the one replayed
        let mixed = [
            (Some(0.2), Some(1e-3)),
            (Some(1e-5), Some(1e-3)),
            (Some(1e-5), Some(1e-3)),
            (Some(3e-3), Some(1e-3)),
        ];
        let r = judge_over(h(), vec![step(0.0, 0.2, 1e-3)], &mixed);
        assert!(r.reproduces);
        assert_eq!(r.healthy_miss, Some((0.2 + 3e-3) / 2.0));
        // a replay that reached no garbled step has reproduced nothing
        let quiet_first = [mixed[1], mixed[0]];
        let r = judge_over(h(), vec![step(0.0, 1e-5, 1e-3)], &quiet_first);
        assert!(!r.reproduces && r.replay_miss == 2.0);
    }

    #[test]
    fn a_non_finite_step_is_the_largest_miss() {
        assert_eq!(miss(&[f32::NAN, 1.0], &[1.0, 1.0]), 2.0);
        assert!(miss(&[1.0, 1.0], &[1.0, 1.0]).abs() < 1e-9);
    }

    #[test]
    fn a_replay_reproduces_within_precision_and_clearly_better_than_healthy() {
        // exact on the emulator
        assert!(judge(h(), vec![step(0.0, 0.2, 1e-3); 3]).reproduces);
        // within precision, but no better than the healthy hypothesis: not a cause
        assert!(!judge(h(), vec![step(5e-4, 6e-4, 1e-3); 3]).reproduces);
        // far better than healthy but outside the declared precision
        assert!(!judge(h(), vec![step(0.01, 0.3, 1e-3); 3]).reproduces);
        // the median decides, not one step
        let r = judge(
            h(),
            vec![
                step(0.0, 0.2, 1e-3),
                step(0.5, 0.2, 1e-3),
                step(0.0, 0.2, 1e-3),
            ],
        );
        assert!(r.reproduces && r.replay_miss == 0.0);
    }
}
