//! The scorer decides a named verdict (issue 34, docs/diagnosis.md "The rule of evidence"): a
//! rule's verdict stands only when a replay of its cause reproduces the device. Every candidate
//! — the rule's cause with its parameters, then (unless that already reproduces at the noise
//! floor, where nothing can be more precise) the fitted and mild values of every factor and
//! shift fault — is replayed on the emulator built to the device's description and judged by one
//! rule (`evidence::beats_healthy`, through `replay::judge`): median per-step miss against the
//! device within the declared precision and clearly below the healthy hypothesis'. Of the
//! candidates that reproduce, the most precise names the verdict; when none does, the verdict is
//! `unknown` with the closest candidates and their misses. A device without an emulator to
//! replay on keeps the rule's verdict and says "not replayed" in its evidence.

use std::cell::RefCell;
use std::sync::Arc;

use kvprobe_npu::contract::faults::FaultTable;
use kvprobe_schema::{FaultHypothesis, Hypothesis, Replay, Reproducer, Timing, Verdict};

use super::outcome::Diagnosis;
use super::refine::{is_factor, refine};
use super::replay::{
    candidates, healthy_steps, proposals, replay_one, screen, DeviceSteps, Fits, Replayer, Stop,
    MAX_REPLAYS, SCREEN_STEPS,
};
use super::residual::{grow, replay_rings, Growth, Residual, RingResidual};
use super::score::{mild, FULL_REPLAYS, RULE};
use crate::session::Session;
use crate::thresholds::{PRECISION_RATIO, STEP_NOISE_FLOOR};

/// Confidence of a verdict the scorer names instead of the rule's (as a mild fault's).
pub const SCORED_CONFIDENCE: f64 = 0.75;

/// Replays a named verdict's candidates and lets the scorer decide it (module doc); `healthy`
/// is `score::compete`'s. A rules' `unknown` replays what the rings its evidence names allow
/// (`replay::proposals`), when there are such rings and a greedy run to compare with; an
/// `unknown` the device ended (`incomplete`) replays nothing.
pub fn attach(s: &mut Session, replayer: Option<&Arc<dyn Replayer>>, d: &mut Diagnosis) {
    // a rule that replayed its own hypothesis on the reference (`host-feed`) carries its
    // reproducer already
    if d.verdict == Verdict::Healthy || d.reproducer.is_some() {
        return;
    }
    if d.verdict == Verdict::Unknown {
        let proposes = replayer.is_some()
            && d.incomplete.is_none()
            && d.probes.greedy.is_some()
            && replayer.is_some_and(|r| {
                let fits = Fits::of_session(s, &d.probes);
                proposals(&r.table(), &fits)
                    .iter()
                    .any(|(_, h)| !r.leaves_out(&h.name))
            });
        if !proposes {
            return;
        }
    }
    let t = std::time::Instant::now();
    decide(s, replayer, d);
    d.timings.push(Timing {
        what: "replay".into(),
        seconds: t.elapsed().as_secs_f64(),
    });
}

fn decide(s: &mut Session, replayer: Option<&Arc<dyn Replayer>>, d: &mut Diagnosis) {
    let Some(replayer) = replayer else {
        return not_replayed(
            d,
            "this device has no emulator to replay on (replays run for --sim, --device ane-sim and the manifests the emulator rebuilds)",
        );
    };
    if d.verdict == Verdict::Nondeterministic {
        // its evidence is reruns that differ: a replay compares one deterministic run per step
        return not_replayed(
            d,
            "a nondeterministic device differs between reruns; a replay reproduces one run",
        );
    }
    let Some(greedy) = d.probes.greedy.as_ref() else {
        return not_replayed(d, "no greedy run to compare a replay with");
    };
    // The device's request again from a fresh start (reset, cleared rings, the host window a
    // new process starts with), as every replay and the reproducer command start: the greedy
    // probe ran after other probes, whose bytes and window rows a faulty reader may see in
    // never-written slots, and no emulator can replay that history. Recorded step by step as
    // far as the replays compare (an exact replay of the rule's cause is decided after half).
    let tokens = greedy.device_ids.clone();
    let healthy = healthy_steps(greedy);
    let n = greedy.steps.len().max(1);
    let fits = Fits::of_session(s, &d.probes);
    let table = replayer.table();
    let (model, ids) = (s.model, s.ids.clone());
    // the device's rings over the first steps, kept for a residual (`residual`)
    let ring_residual = RingResidual::of(s.describe(), model, ids.len());
    let k_rings = if ring_residual.is_ok() {
        SCREEN_STEPS.min(n)
    } else {
        0
    };
    let dev = RefCell::new(DeviceSteps::new(s, tokens.clone(), k_rings));
    if let Err(e) = dev.borrow_mut().step(0) {
        return not_replayed(
            d,
            &format!("the device's request could not be recorded again: {e}"),
        );
    }
    // every replay, screens included: the budget a case spends (said in the evidence)
    let spent = std::cell::Cell::new(0usize);
    let run_with = |h: &FaultHypothesis, k: usize, stop: Stop| {
        spent.set(spent.get() + 1);
        let mut device = |i: usize| {
            dev.borrow_mut()
                .step(i)
                .map(<[f32]>::to_vec)
                .map_err(|e| format!("the device's request could not be recorded again: {e}"))
        };
        replay_one(
            (model, &ids),
            replayer.as_ref(),
            h,
            &mut device,
            (k, stop),
            &tokens,
            &healthy,
        )
    };
    let run = |h: &FaultHypothesis, k: usize| run_with(h, k, Stop::Whole);
    // the rule's own cause may stop once exact: an exact replay of it ends the search
    let run_own = |h: &FaultHypothesis, k: usize| run_with(h, k, Stop::Exact);
    let mut own = if d.verdict == Verdict::Unknown {
        proposals(&table, &fits)
    } else {
        candidates(&table, d.verdict, &fits)
    };
    own.retain(|(_, h)| !replayer.leaves_out(&h.name));
    let mut search = Search::default();
    search.own_cause(own, &table, n, &run, &run_own);
    // every other candidate, unless the rule's reproduces at the noise floor
    search.others(&d.also, (&table, &fits), replayer.as_ref(), n, &run);
    // a layer scope the evidence named only in part: grown from the residual of the closest
    // layer-scoped replay when none reproduces
    let mut residual = |h: &FaultHypothesis| -> Result<Residual, String> {
        let rings = ring_residual.as_ref().map_err(|e| e.to_string())?;
        spent.set(spent.get() + 1);
        let replay = replay_rings((model, &ids), replayer.as_ref(), h, &tokens, k_rings)?;
        let dev = dev.borrow();
        let device = dev
            .rings(k_rings)
            .ok_or("the device's rings could not be read")?;
        rings.first(&device, &replay).map_err(|e| e.to_string())
    };
    let grown = search.grow_scope(model.config().n_layers, n, &mut residual, &run);
    let Search {
        replays,
        tried,
        refused,
    } = search;
    let command = |r: &Replay| replayer.command(&r.fault.text(), n);
    let expected = |r: &Replay| table.expected(&r.fault.text()).ok();
    let choice = choose(d.verdict, &replays, &expected);
    let whole = tried.len();
    apply(d, choice, tried, &refused, &command, n);
    d.evidence.push(format!(
        "replay budget: {} replays, {whole} of them over every step, the rest screens over the \
         first {} steps{}",
        spent.get(),
        SCREEN_STEPS.min(n),
        grown.said(k_rings)
    ));
}

/// A replay of `h` over the first `k` steps.
type Run<'a> = dyn Fn(&FaultHypothesis, usize) -> Result<Replay, String> + 'a;

/// One diagnosis' replays, every hypothesis tried with its miss (in order), and the ones the
/// emulator refused.
#[derive(Default)]
struct Search {
    replays: Vec<Replay>,
    tried: Vec<(String, f64)>,
    refused: Vec<String>,
}

impl Search {
    fn push(&mut self, r: Replay) {
        self.tried.push((r.fault.text(), r.replay_miss));
        self.replays.push(r);
    }

    fn reproduced(&self) -> bool {
        self.replays.iter().any(|r| r.reproduces)
    }

    /// Every candidate besides the rule's own, unless one of the rule's reproduces at the noise
    /// floor: the causes the other fired rules named (`also`), the faults the named rings allow,
    /// then the mild values — every named cause competes by its replay, not by the rules' order —
    /// screened, the closest `FULL_REPLAYS` replayed whole.
    fn others(
        &mut self,
        also: &[Verdict],
        (table, fits): (&FaultTable, &Fits),
        replayer: &dyn Replayer,
        n: usize,
        run: &Run,
    ) {
        let exact = self
            .replays
            .iter()
            .any(|r| r.reproduces && r.replay_miss <= STEP_NOISE_FLOOR);
        if exact {
            return;
        }
        let mut others: Vec<FaultHypothesis> = Vec::new();
        let named = also.iter().flat_map(|&v| candidates(table, v, fits));
        let ringed = proposals(table, fits).into_iter();
        for h in named.chain(ringed).map(|(_, h)| h).chain(mild(table, fits)) {
            let t = h.text();
            if !replayer.leaves_out(&h.name)
                && !self.tried.iter().any(|x| x.0 == t)
                && !others.iter().any(|x| x.text() == t)
            {
                others.push(h);
            }
        }
        let others = screen(others, SCREEN_STEPS.min(n), run, &mut self.refused);
        for h in others.into_iter().take(FULL_REPLAYS) {
            if let Ok(r) = run(&h, n) {
                self.push(r);
            }
        }
    }

    /// When no replay reproduces, grows the scope of the closest replay scoped to some layers
    /// from the residual (`residual::grow`, at most `n_layers` rounds); its whole replays (over
    /// `n` steps) join the search, the ones already tried are not replayed again.
    fn grow_scope(
        &mut self,
        n_layers: usize,
        n: usize,
        residual: &mut dyn FnMut(&FaultHypothesis) -> Result<Residual, String>,
        run: &Run,
    ) -> Growth {
        let from = self
            .replays
            .iter()
            .filter(|r| !r.fault.layers.is_empty())
            .min_by(|a, b| a.replay_miss.total_cmp(&b.replay_miss));
        let Some(from) = from.filter(|_| !self.reproduced()).cloned() else {
            return Growth::default();
        };
        let tried: Vec<String> = self.tried.iter().map(|t| t.0.clone()).collect();
        let mut whole = |h: &FaultHypothesis| match tried.contains(&h.text()) {
            true => Err("already replayed".to_string()),
            false => run(h, n),
        };
        let g = grow(&from, n_layers, residual, &mut whole);
        g.replays.iter().cloned().for_each(|r| self.push(r));
        g
    }

    /// Replays `hs` whole over `n` steps, in order, until one reproduces or the budget is spent.
    fn replay_all(&mut self, hs: Vec<FaultHypothesis>, n: usize, run: &Run) {
        for h in hs {
            if self.replays.len() >= MAX_REPLAYS || self.reproduced() {
                break;
            }
            match run(&h, n) {
                Ok(r) => self.push(r),
                // the emulator refuses a fault that changes nothing here: not a hypothesis
                Err(e) => self.refused.push(format!("{}: {e}", h.text())),
            }
        }
    }

    /// The rule's cause and its parameters (`own`, ranked by how much of each the evidence
    /// points at): the most pointed replayed first, in table order, then the rest screened; the
    /// first that reproduces ends it. When none does, a factor cause has its value fitted by
    /// replay at the scope of the most pointed factor replay (then the closest).
    fn own_cause(
        &mut self,
        own: Vec<(usize, FaultHypothesis)>,
        table: &FaultTable,
        n: usize,
        run: &Run,
        run_own: &Run,
    ) {
        let top = own.first().map_or(0, |c| c.0);
        let rank: Vec<(String, usize)> = own.iter().map(|(k, h)| (h.text(), *k)).collect();
        let (pointed, rest): (Vec<_>, Vec<_>) =
            own.into_iter().partition(|c| top > 0 && c.0 == top);
        // more pointed candidates than replays (a fitted value on a named scope and on its
        // first layer alone, several decoded layouts): screened like the rest, so the budget
        // never decides which of them is tried
        let pointed: Vec<FaultHypothesis> = pointed.into_iter().map(|c| c.1).collect();
        let pointed = if pointed.len() > MAX_REPLAYS {
            screen(pointed, SCREEN_STEPS.min(n), run, &mut self.refused)
        } else {
            pointed
        };
        self.replay_all(pointed, n, run_own);
        if !self.reproduced() && self.replays.len() < MAX_REPLAYS {
            let rest: Vec<FaultHypothesis> = rest.into_iter().map(|c| c.1).collect();
            let rest = if rest.len() > MAX_REPLAYS - self.replays.len() {
                screen(rest, SCREEN_STEPS.min(n), run, &mut self.refused)
            } else {
                rest
            };
            self.replay_all(rest, n, run_own);
        }
        if self.reproduced() {
            return;
        }
        let pointed_at = |r: &Replay| {
            let t = r.fault.text();
            rank.iter().find(|x| x.0 == t).map_or(0, |x| x.1)
        };
        let factor = self
            .replays
            .iter()
            .filter(|r| is_factor(table, &r.fault))
            .min_by(|a, b| {
                pointed_at(b)
                    .cmp(&pointed_at(a))
                    .then(a.replay_miss.total_cmp(&b.replay_miss))
            })
            .map(|r| r.fault.clone());
        if let Some(h) = factor.and_then(|h| refine(&h, SCREEN_STEPS.min(n), run)) {
            if let Ok(r) = run_own(&h, n) {
                self.push(r);
            }
        }
    }
}

/// Writes the scorer's choice into the diagnosis.
fn apply(
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
                "replay inconclusive: on the greedy steps a replay compares, the healthy \
                 hypothesis misses the device by {:.2e} (median), below {PRECISION_RATIO} × \
                 {STEP_NOISE_FLOOR:e}, so no replay can beat it there; the {} verdict stands on \
                 its failing control",
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
enum Choice {
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
fn choose(
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
fn not_replayed(d: &mut Diagnosis, why: &str) {
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
             and clearly better than the healthy hypothesis; no rule named a cause, the rings the \
             evidence names proposed it",
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
        "no rule named a cause, and of the faults the named rings allow".to_string()
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
    use kvprobe_schema::FaultValue;

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
