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
use kvprobe_schema::{FaultHypothesis, Hypothesis, Replay, Timing, Verdict};

use super::capacity_fit;
use super::capacity_replay;
use super::choice::{apply, choose, not_replayed};
use super::outcome::Diagnosis;
use super::refine::{is_factor, refine};
use super::replay::{
    candidates, healthy_steps, in_replay, proposals, replay_one, screen_scored, DeviceSteps, Fits,
    Replayer, Stop, MAX_REPLAYS, SCREEN_STEPS,
};
use super::residual::{grow, replay_rings, starts, Growth, Residual, RingResidual};
use super::score::{mild, Unexplained, FULL_REPLAYS};
use crate::session::Session;
use crate::thresholds::STEP_NOISE_FLOOR;

/// Replays a named verdict's candidates and lets the scorer decide it (module doc); `healthy`
/// is `score::compete`'s. A rules' `unknown` replays what the rings its evidence names allow
/// (`replay::proposals`), when there are such rings and a greedy run to compare with; an
/// `unknown` the device ended (`incomplete`) replays nothing.
///
/// `measures_limit`: a capacity limit inside the request may be measured (`capacity_fit`) and
/// propose hypotheses on a rules' `unknown` whose evidence names no ring (not under
/// `--stage-only`, where no cause may be named).
pub fn attach(
    s: &mut Session,
    replayer: Option<&Arc<dyn Replayer>>,
    d: &mut Diagnosis,
    measures_limit: bool,
) {
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
                let table = r.table();
                let limit = measures_limit
                    && s.has_tbt()
                    && capacity_replay::capacity_faults(&table)
                        .iter()
                        .any(|name| !r.leaves_out(name));
                limit
                    || proposals(&table, &fits)
                        .iter()
                        .any(|(_, h)| !r.leaves_out(&h.name))
            });
        if !proposes {
            return;
        }
    }
    let t = std::time::Instant::now();
    decide(s, replayer, d, None, measures_limit);
    d.timings.push(Timing {
        what: "replay".into(),
        seconds: t.elapsed().as_secs_f64(),
    });
}

/// A `healthy` verdict whose healthy hypothesis leaves steps garbled that no mild fault
/// reproduces (`score::compete`): a discrete fault may hide in the precision on a few steps (a
/// truncated entry on two layers garbles 3 of 11). The cache-path probes read the rings
/// (`ring::ring_evidence`), and what they name proposes hypotheses as for a rules' `unknown`
/// (`replay::proposals`, then the residual's layer growth), judged by the same rule against
/// the same healthy hypothesis as the mild faults were. A replay that reproduces names its
/// fault's declared verdict; none reproducing leaves `healthy`, with the closest replay said.
pub fn attach_unexplained(
    s: &mut Session,
    replayer: Option<&Arc<dyn Replayer>>,
    d: &mut Diagnosis,
    u: Unexplained,
) -> crate::Result<()> {
    let Some(r) = replayer else { return Ok(()) };
    if !s.has_tbt() || s.dev.capabilities().stateful {
        return Ok(());
    }
    let n = u.judged.len();
    let why = format!(
        "the healthy hypothesis leaves {} of {n} steps garbled and no mild fault reproduces them",
        u.garbled
    );
    super::ring::ring_evidence(s, d)?;
    let fits = Fits::of_session(s, &d.probes);
    let proposed = proposals(&r.table(), &fits)
        .iter()
        .filter(|(_, h)| !r.leaves_out(&h.name))
        .count();
    if proposed == 0 {
        d.evidence.push(format!(
            "{why}; the rings' evidence names no ring a fault could be hypothesised at"
        ));
        return Ok(());
    }
    let healthy = d.clone();
    d.verdict = Verdict::Unknown;
    let t = std::time::Instant::now();
    decide(s, replayer, d, Some(u.judged), true);
    d.timings.push(Timing {
        what: "replay (garbled steps)".into(),
        seconds: t.elapsed().as_secs_f64(),
    });
    if d.verdict != Verdict::Unknown {
        d.evidence.insert(
            1,
            format!("{why}: the rings' evidence was read for hypotheses"),
        );
        return Ok(());
    }
    let tried = d.reproducer.as_ref().map_or(0, |r| r.tried.len());
    let said = format!("{why}; the rings' evidence proposed {proposed} hypotheses and none reproduces them ({tried} replayed whole)");
    match d
        .probes
        .kvdiff
        .as_ref()
        .and_then(|k| k.first_divergent.as_ref())
    {
        // the cache itself leaves its declared band (kvdiff: a failing control) where the
        // steps are garbled: a fault no hypothesis names, `unknown` with the closest replays
        Some(k) => {
            let head = format!(
                "{said}, while the cache leaves its declared band from layer {} {:?} (kvdiff): \
                 a fault, but none the emulator's grammar reproduces",
                k.layer, k.kind
            );
            d.evidence.insert(1, head.clone());
            d.confidence = 0.3;
            d.hypothesis = Some(Hypothesis {
                rule: super::score::RULE.into(),
                decisive: vec![head],
                fault: None,
            });
        }
        // nothing the rings name reproduces the garbled steps and every ring stays in its
        // band: `healthy` stands, with the probes that ran, their lines and what was tried
        None => {
            let timings = d.timings.clone();
            *d = healthy;
            d.timings = timings;
            d.evidence
                .push(format!("{said}, and kvdiff finds every ring in its band"));
        }
    }
    Ok(())
}

/// Why a verdict cannot be replayed at all, if it cannot.
fn unreplayable(replayer: Option<&Arc<dyn Replayer>>, d: &Diagnosis) -> Option<&'static str> {
    if replayer.is_none() {
        return Some(
            "this device has no emulator to replay on (replays run for --sim, --device ane-sim and the manifests the emulator rebuilds)",
        );
    }
    // its evidence is reruns that differ: a replay compares one deterministic run per step
    (d.verdict == Verdict::Nondeterministic)
        .then_some("a nondeterministic device differs between reruns; a replay reproduces one run")
}

/// `over`: the healthy hypothesis per step to judge against, when not the matched reference's
/// (`healthy_steps`); `measures_limit`: as [`attach`]'s.
fn decide(
    s: &mut Session,
    replayer: Option<&Arc<dyn Replayer>>,
    d: &mut Diagnosis,
    over: Option<Vec<(Option<f64>, Option<f64>)>>,
    measures_limit: bool,
) {
    let (Some(replayer), None) = (replayer, unreplayable(replayer, d)) else {
        let why = unreplayable(replayer, d).unwrap_or_default();
        return not_replayed(d, why);
    };
    let Some(greedy) = d.probes.greedy.as_ref() else {
        return not_replayed(d, "no greedy run to compare a replay with");
    };
    // The device's request again from a fresh start (reset, cleared rings, the host window a
    // new process starts with), as every replay and the reproducer command start: the greedy
    // probe ran after other probes, whose bytes and window rows a faulty reader may see in
    // never-written slots, and no emulator can replay that history. Recorded step by step as
    // far as the replays compare (an exact replay of the rule's cause is decided after half).
    let tokens = greedy.device_ids.clone();
    let healthy = over.unwrap_or_else(|| healthy_steps(greedy));
    let n = greedy.steps.len().max(1);
    let fits = Fits::of_session(s, &d.probes);
    let table = replayer.table();
    let (model, ids) = (s.model, s.ids.clone());
    // the device's rings over the first steps, kept for a residual (`residual`)
    let ring_residual = RingResidual::of(s.describe(), model, ids.len());
    let k_rings = ring_residual.as_ref().map_or(0, |_| SCREEN_STEPS.min(n));
    let mut capacity = d.capacity.take();
    // measured before the greedy record takes the device (a verdict the capacity check decided)
    let departure = capacity_replay::measure(s, replayer.as_ref(), capacity.as_mut(), &healthy);
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
    let own = own_hypotheses(&table, d.verdict, &fits, replayer.as_ref());
    let mut search = Search::default();
    if capacity.is_none() {
        search.own_cause(own.clone(), &table, n, &run, &run_own);
    }
    // every other candidate, unless the rule's reproduces at the noise floor
    search.others(&d.also, (&table, &fits), replayer.as_ref(), n, &run);
    // a capacity limit inside the request: no probe fits it, generation from one whole prefill
    // window measures it (`capacity_fit`), and its hypotheses compete like the others
    let limit = (measures_limit && capacity.is_none() && !search.reproduced())
        .then(|| search.capacity_limit(&dev, replayer.as_ref(), (model, &ids), &healthy, n, &run))
        .flatten();
    if let Some(c) = capacity {
        // the capacity check decided the verdict: its requests judge the replays, the greedy
        // search only proposes its closest competitors
        let hyps = (
            own.into_iter().map(|(_, h)| h).collect(),
            search.closest(FULL_REPLAYS),
        );
        let (ctx, r) = ((model, ids.as_slice()), replayer.as_ref());
        return capacity_replay::verdict(d, ctx, r, (c, departure), hyps, &spent);
    }
    // a layer scope the evidence named only in part: grown from the residual of the closest
    // layer-scoped replay when none reproduces
    let mut residual = |h: &FaultHypothesis| -> Result<Residual, String> {
        let rings = ring_residual.as_ref().map_err(|e| e.to_string())?;
        let dev = dev.borrow();
        let device = dev
            .rings(k_rings)
            .ok_or("the device's rings could not be read")?;
        spent.set(spent.get() + 1);
        let replay = replay_rings((model, &ids), replayer.as_ref(), h, &tokens, k_rings)?;
        rings.first(&device, &replay).map_err(|e| e.to_string())
    };
    let grown = search.grow_scope(model.config().n_layers, n, &mut residual, &run);
    let Search {
        replays,
        tried,
        refused,
        ..
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
    d.evidence.extend(limit);
}

/// The verdict's own hypotheses, ranked (`replay::candidates`; a rules' `unknown`: what the
/// rings its evidence names propose), without the ones the run leaves out.
fn own_hypotheses(
    table: &FaultTable,
    verdict: Verdict,
    fits: &Fits,
    replayer: &dyn Replayer,
) -> Vec<(usize, FaultHypothesis)> {
    let mut own = if verdict == Verdict::Unknown {
        proposals(table, fits)
    } else {
        candidates(table, verdict, fits)
    };
    own.retain(|(_, h)| !replayer.leaves_out(&h.name));
    own
}

/// The device's generation from one whole prefill window against the fault-free emulator's
/// (`capacity_fit::generation_departure`), within the declared precision (the median over the
/// compared steps, at least the noise floor, as the capacity check's measurement). Every
/// compared greedy step is recorded first: the device then serves the measurement, and a later
/// step recorded after it would continue from the measurement's state.
fn measure_limit(
    dev: &RefCell<DeviceSteps>,
    replayer: &dyn Replayer,
    (model, ids): (&kvprobe_reference::Model, &[u32]),
    healthy: &[(Option<f64>, Option<f64>)],
    n: usize,
) -> capacity_fit::Measured {
    let mut dev = dev.borrow_mut();
    dev.step(n - 1)
        .map_err(|e| format!("the device's request could not be recorded again: {e}"))?;
    let tokens = dev.tokens().to_vec();
    let s = dev.session();
    let g = s.geometry();
    let seq = capacity_fit::sequence(ids, &tokens, g.cache_len);
    let tol = super::evidence::median(healthy.iter().filter_map(|h| h.1).collect())
        .unwrap_or(0.0)
        .max(STEP_NOISE_FLOOR);
    let none = capacity_replay::none();
    in_replay((model, ids), replayer, &none, |hs| {
        capacity_fit::generation_departure(s, hs, &seq, g.prefill_len, tol)
            .map_err(|e| e.to_string())
    })
}

/// A replay of `h` over the first `k` steps.
type Run<'a> = dyn Fn(&FaultHypothesis, usize) -> Result<Replay, String> + 'a;

/// One diagnosis' replays, every hypothesis tried with its miss (in order), the ones the
/// emulator refused, and every screened hypothesis with its screen's summed miss.
#[derive(Default)]
struct Search {
    replays: Vec<Replay>,
    tried: Vec<(String, f64)>,
    refused: Vec<String>,
    screened: Vec<(f64, FaultHypothesis)>,
}

impl Search {
    fn push(&mut self, r: Replay) {
        self.tried.push((r.fault.text(), r.replay_miss));
        self.replays.push(r);
    }

    /// The hypotheses of the `k` closest whole replays.
    fn closest(&self, k: usize) -> Vec<FaultHypothesis> {
        let mut r: Vec<&Replay> = self.replays.iter().collect();
        r.sort_by(|a, b| a.replay_miss.total_cmp(&b.replay_miss));
        r.into_iter().take(k).map(|r| r.fault.clone()).collect()
    }

    fn reproduced(&self) -> bool {
        self.replays.iter().any(|r| r.reproduces)
    }

    /// `hs` ordered by their miss over the first steps, closest first (`replay::screen`); the
    /// scores are kept for where a layer scope's growth starts.
    fn screen(&mut self, hs: Vec<FaultHypothesis>, n: usize, run: &Run) -> Vec<FaultHypothesis> {
        let scored = screen_scored(hs, SCREEN_STEPS.min(n), run, &mut self.refused);
        self.screened.extend(scored.iter().cloned());
        scored.into_iter().map(|(_, h)| h).collect()
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
        let others = self.screen(others, n, run);
        for h in others.into_iter().take(FULL_REPLAYS) {
            if let Ok(r) = run(&h, n) {
                self.push(r);
            }
        }
    }

    /// When no replay reproduces, grows a layer scope from the residual of each fault's closest
    /// hypothesis scoped to some layers, replayed whole or only screened (`residual::starts`,
    /// `residual::grow`, at most `n_layers` rounds in all); its whole replays (over `n` steps)
    /// join the search, the ones already tried are not replayed again.
    fn grow_scope(
        &mut self,
        n_layers: usize,
        n: usize,
        residual: &mut dyn FnMut(&FaultHypothesis) -> Result<Residual, String>,
        run: &Run,
    ) -> Growth {
        if self.reproduced() {
            return Growth::default();
        }
        let from = starts(&self.replays, &self.screened);
        let tried: Vec<String> = self.tried.iter().map(|t| t.0.clone()).collect();
        let mut whole = |h: &FaultHypothesis| match tried.contains(&h.text()) {
            true => Err("already replayed".to_string()),
            false => run(h, n),
        };
        let g = grow(&from, n_layers, residual, &mut whole);
        g.replays.iter().cloned().for_each(|r| self.push(r));
        g
    }

    /// A capacity limit inside the request measured (`measure_limit`) and the capacity faults
    /// at it screened, the closest `FULL_REPLAYS` replayed whole (those not tried yet); the
    /// measurement's evidence line, None when the family has no capacity fault.
    fn capacity_limit(
        &mut self,
        dev: &RefCell<DeviceSteps>,
        replayer: &dyn Replayer,
        ctx: (&kvprobe_reference::Model, &[u32]),
        healthy: &[(Option<f64>, Option<f64>)],
        n: usize,
        run: &Run,
    ) -> Option<String> {
        let table = replayer.table();
        if capacity_replay::capacity_faults(&table).is_empty() {
            return None;
        }
        let measured = measure_limit(dev, replayer, ctx, healthy, n);
        let said = capacity_fit::said(&measured);
        let Ok(Some(d)) = measured else {
            return Some(said);
        };
        let hs: Vec<FaultHypothesis> = capacity_fit::hypotheses(&table, d)
            .into_iter()
            .filter(|h| !replayer.leaves_out(&h.name))
            .filter(|h| !self.tried.iter().any(|t| t.0 == h.text()))
            .collect();
        let hs = self.screen(hs, n, run);
        for h in hs.into_iter().take(FULL_REPLAYS) {
            if let Ok(r) = run(&h, n) {
                self.push(r);
            }
        }
        Some(said)
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
            self.screen(pointed, n, run)
        } else {
            pointed
        };
        self.replay_all(pointed, n, run_own);
        if !self.reproduced() && self.replays.len() < MAX_REPLAYS {
            let rest: Vec<FaultHypothesis> = rest.into_iter().map(|c| c.1).collect();
            let rest = if rest.len() > MAX_REPLAYS - self.replays.len() {
                self.screen(rest, n, run)
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
