//! `diagnose` on a stateful device (issue 9): the runtime gate of [`crate::diagnose`] sends a
//! stateful device here. Ring-specific probes say why they do not apply; the rules of [`TABLE`]
//! (docs/diagnosis.md "Stateful devices") run in order, the first that fires ends it:
//!
//! 0. the same request twice from fresh (all-zero) states differs → nondeterministic;
//! 1. the prompt after a reset depends on the request before it (back-to-back) → stale-cache;
//! 2. non-finite logits or states after the prompt's prefill, or non-finite logits at a greedy
//!    step (a device failing mid-generation) → numeric-overflow;
//! 3. the prefill wrote other slots than `0..n` → cache-offset;
//! 4. prefill and greedy agree with the reference → healthy; else (4′) the greedy run replayed
//!    on the matched reference under the host's declared feed (a first-window prompt token equal
//!    to `pad_token_id`, GenAI's windowed rules) reproduces the device → mask-convention
//!    (`crate::host_feed`);
//! 5. reference K/V written in `[ctx, kv_heads, d]` reproduce the reference and the documented
//!    order does not → cache-layout-mismatch;
//! 6. the device's cache edges declare other quantisations for the same cache (a runner over a
//!    cache of another element type) and generation fails → cache-quantization;
//! 7. the first decode step is reproduced by the reference with its query at another position
//!    → position-mismatch;
//! 8. a self-only step misses the reference token alone → mask-convention (the mask input is not
//!    applied as 0 / −inf);
//! 9. by elimination: the step alone, the slots and the positions are right, yet reference K/V in
//!    the documented order do not repair the step → cache-layout-mismatch (0.6);
//! 10. otherwise unknown.

use kvprobe_schema::{NotApplicable, ProbeFindings, Timing, Verdict};

use super::engine::{Control, Controls, Engine, Rule, Tier, When};
use super::outcome::{DiagnoseOptions, Diagnosis, REFERENCE_TAIL};
use super::state_evidence::{declared_quant_mismatch, non_finite_decode, ranges};
use super::stateful_causes::*;
pub use super::stateful_facts::StatefulFacts;
pub use super::stateful_na::NOT_APPLICABLE;
use super::stateful_na::{hidden_state_probes, na};
use crate::{determinism, greedy, prefill, selfmask, statecheck, Result};

/// Steps of the repeat `diagnose` runs (the prefill and 3 tbt steps, twice, in this process).
pub const REPEAT_STEPS: usize = 4;

type R = Rule<StatefulFacts>;
const T: Tier = Tier::CachePath;

/// After the repeat.
pub const REPEAT: &[R] = &[R::new(
    "nondeterministic",
    T,
    Some(Verdict::Nondeterministic),
    nondeterministic,
)
.needs(Control::Rerun)
.stop()];

/// After the back-to-back check.
pub const STALE: &[R] = &[
    R::new("stale-cache", T, Some(Verdict::StaleCache), stale_cache)
        .needs(Control::Rerun)
        .stop(),
];

/// After the overflow scan.
pub const OVERFLOW: &[R] = &[R::new(
    "numeric-overflow",
    T,
    Some(Verdict::NumericOverflow),
    numeric_overflow,
)
.needs(Control::Output)
.stop()];

/// After the controls and the state check: a step that came back inf/NaN first (every
/// comparison after it only says "no agreement").
pub const STATE: &[R] = &[
    R::new(
        "non-finite-decode",
        T,
        Some(Verdict::NumericOverflow),
        non_finite_decode,
    )
    .needs(Control::Output)
    .stop(),
    R::new(
        "state-holes",
        T,
        Some(Verdict::CapacityOverflow),
        state_holes,
    )
    .needs(Control::StateWrites)
    .stop(),
    R::new("state-offset", T, Some(Verdict::CacheOffset), state_offset)
        .needs(Control::StateWrites)
        .stop(),
    R::new(
        "fp16-overflow",
        T,
        Some(Verdict::NumericOverflow),
        fp16_overflow,
    )
    .needs(Control::Greedy)
    .stop(),
    R::new("healthy", T, Some(Verdict::Healthy), healthy).stop(),
    R::new("host-feed-fit", T, None, host_feed_line),
    R::new("host-feed", T, Some(Verdict::MaskConvention), host_feed)
        .needs(Control::Any)
        .stop(),
    R::new("host-writer-fit", T, None, host_writer_line),
    R::new("host-writer", T, Some(Verdict::CacheOffset), host_writer)
        .needs(Control::Any)
        .stop(),
    R::new("state-layout-cosines", T, None, state_layout_cosines),
    R::new(
        "state-layout",
        T,
        Some(Verdict::CacheLayoutMismatch),
        state_layout,
    )
    .stop(),
    R::new(
        "kv-binding-fit",
        T,
        None,
        super::stateful_binding::binding_fit,
    ),
    R::new(
        "kv-binding",
        T,
        Some(Verdict::KvBinding),
        super::stateful_binding::kv_binding,
    )
    .needs(Control::Greedy)
    .stop(),
    R::new(
        "state-writer-layout",
        T,
        Some(Verdict::CacheLayoutMismatch),
        super::stateful_binding::state_writer_layout,
    )
    .needs(Control::Greedy)
    .stop(),
    R::new(
        "declared-quant",
        T,
        Some(Verdict::CacheQuantization),
        declared_quant,
    )
    .needs(Control::Greedy)
    .stop(),
    R::new("position-cosines", T, None, position_cosines),
    R::new(
        "state-position",
        T,
        Some(Verdict::PositionMismatch),
        state_position,
    )
    .needs(Control::Greedy)
    .keeps(Control::PrefillSingle)
    .stop(),
    R::new("mask-cosines", T, None, mask_cosines),
    R::new(
        "self-only-mask",
        T,
        Some(Verdict::MaskConvention),
        self_only_mask,
    )
    .needs(Control::SelfOnly)
    .stop(),
    R::new("output-fit", T, None, output_fit_line),
    R::new(
        "output-position",
        T,
        Some(Verdict::PositionMismatch),
        output_position,
    )
    .needs(Control::Greedy)
    .keeps(Control::PrefillSingle)
    .stop(),
    R::new("output-mask", T, Some(Verdict::MaskConvention), output_mask)
        .needs(Control::Greedy)
        .keeps(Control::PrefillSingle)
        .stop(),
    R::new(
        "state-reader",
        T,
        Some(Verdict::CacheLayoutMismatch),
        state_reader,
    )
    .when(When::NothingYet)
    .needs(Control::Greedy)
    .stop(),
];

/// Every stateful rule, in evaluation order.
pub const TABLE: &[&[R]] = &[REPEAT, STALE, OVERFLOW, STATE];

struct Run<'s, 'a> {
    s: &'s mut crate::session::Session<'a>,
    t: Vec<Timing>,
    p: ProbeFindings,
    eng: Engine,
}

impl Run<'_, '_> {
    fn timed<T>(
        &mut self,
        what: &str,
        f: impl FnOnce(&mut crate::session::Session) -> Result<T>,
    ) -> Result<T> {
        let s = &mut *self.s;
        super::outcome::timed(&mut self.t, what, || f(s))
    }

    fn done(self) -> Diagnosis {
        Diagnosis::from_rules(self.eng.conclude(), self.p, self.t)
    }

    /// [`Run::done`] with the reproducer of a `host-feed` or `host-writer` verdict: each replayed
    /// its own hypothesis on the reference, so its command needs no emulator.
    fn done_with(self, f: &StatefulFacts) -> Diagnosis {
        let model = self.s.model;
        let mut d = self.done();
        if d.hypothesis.as_ref().is_some_and(|h| h.rule == "host-feed") {
            d.reproducer = f.host_feed.as_ref().map(|h| h.reproducer(model));
        }
        if d.hypothesis
            .as_ref()
            .is_some_and(|h| h.rule == "host-writer")
        {
            d.reproducer = f.host_writer.as_ref().map(|h| h.reproducer(model));
        }
        d
    }

    /// A cache-path verdict (every named cause but healthy) carries `kvdiff`'s first divergent
    /// layer (issue 20); run only then.
    fn cache_kvdiff(&mut self) -> Result<()> {
        if !self.eng.has_causes() || self.eng.fired().contains(&"healthy") {
            return Ok(());
        }
        let (k, line) = super::unknown_kvdiff::run_for_evidence(self.s, &mut self.t)?;
        self.eng.line(line);
        self.p.kvdiff = k;
        Ok(())
    }
}

pub fn diagnose(s: &mut crate::session::Session, opts: &DiagnoseOptions) -> Result<Diagnosis> {
    let mut eng = Engine::new();
    eng.line(format!(
        "stateful device (max_ctx {}, max_query {}): {} ring probes not applicable (listed in the report)",
        s.describe().cache_len,
        s.describe().prefill_len,
        NOT_APPLICABLE.len()
    ));
    let mut run = Run {
        s,
        t: Vec::new(),
        p: ProbeFindings {
            not_applicable: na(),
            ..Default::default()
        },
        eng,
    };
    let rp = match run.timed("repeat", |s| determinism::repeat(s, REPEAT_STEPS)) {
        Ok(rp) => Some(rp),
        // the same request again, after a reset, refused by the device: the back-to-back check
        // names what it kept
        Err(crate::Error::Npu(e))
            if e.origin() == kvprobe_npu::Origin::Device && e.is_capacity_refusal() =>
        {
            run.eng.line(format!(
                "repeat not compared: the device refused a request after a reset ({})",
                e.what_device_did()
            ));
            None
        }
        Err(e) => return Err(e),
    };
    run.p.determinism = rp.clone();
    let mut f = StatefulFacts::first(rp, declared_quant_mismatch(run.s.describe()));
    run.eng.apply(REPEAT, &f);
    if run.eng.stopped() {
        return Ok(run.done());
    }
    if let Some(r) = &f.repeat {
        run.eng.line(determinism::repeat_evidence(r));
    }
    let bb = run.timed("back-to-back", statecheck::back_to_back)?;
    f.back_to_back_identical = bb.identical;
    f.back_to_back_cosine = bb.cosine;
    f.back_to_back_refused = bb.refused.clone();
    run.eng.apply(STALE, &f);
    if run.eng.stopped() {
        run.cache_kvdiff()?;
        return Ok(run.done());
    }
    run.eng.line("back-to-back: the prompt after a reset gives bit-identical logits whatever request came before");
    // both checks ran on the device and it repeats itself after a reset, bit for bit: from here
    // a request that repeats an earlier one run for run is answered from it (npu's SharedRuns)
    let repeats = f
        .repeat
        .as_ref()
        .is_some_and(|r| r.clean_reset == Some(true) && r.identical());
    if repeats && f.back_to_back_identical {
        run.s.dev.share_identical_runs(true);
    }
    if !run.s.dev.capabilities().read_cache {
        // states out of reach (OpenVINO's C API): the output checks and capacity judge the device
        hidden_states(&mut run);
        controls_then_rules(&mut run, &mut f, opts)?;
        return Ok(run.done());
    }
    // the back-to-back check left the device right after a reset and the prompt's prefill:
    // the states the overflow and occupancy checks read
    let ov = run.timed("overflow", |s| statecheck::overflow(s, &bb.last))?;
    run.p.overflow = Some(ov.clone());
    let prompt_len = ov.prompt_len;
    f.overflow = Some(ov);
    run.eng.apply(OVERFLOW, &f);
    if run.eng.stopped() {
        for probe in ["prefill", "greedy", "selfmask", "state"] {
            run.p.not_applicable.push(NotApplicable {
                probe: probe.into(),
                why: "not run: the device's outputs are inf/NaN (numeric-overflow), comparisons would be NaN".into(),
            });
        }
        return Ok(run.done());
    }
    run.eng.line(format!(
        "overflow: every state and the logits of the {prompt_len}-token prefill are finite"
    ));
    if let Some(c) = controls_then_rules(&mut run, &mut f, opts)? {
        let mut d = run.done();
        d.capacity = Some(c);
        return Ok(d);
    }
    run.cache_kvdiff()?;
    Ok(run.done_with(&f))
}

/// The controls and the state checks, then the state rules; the capacity check when it
/// concluded first (every control passes: the cheap check before the healthy rule, issue 20).
fn controls_then_rules(
    run: &mut Run,
    f: &mut StatefulFacts,
    opts: &DiagnoseOptions,
) -> Result<Option<crate::capacity_record::CapacityEvidence>> {
    controls_and_state(run, f, opts)?;
    if !f.fails(Control::Any) {
        let c = super::capacity::phase(run.s, &mut run.eng, &mut run.t, &mut run.p, None)?;
        if c.is_some() {
            return Ok(c);
        }
    }
    run.eng.apply(STATE, f);
    Ok(None)
}

/// A device that declares a lower precision (int4 weights, issue 35) is judged against the
/// precision-matched reference, which computes what it declares: the f32 reference's miss is the
/// declared precision's cost. One evidence line says so.
fn matched_facts(
    run: &mut Run,
    points: &[(usize, Option<&kvprobe_schema::MatchedStep>, u32)],
    what: &str,
) -> Option<[f64; 3]> {
    if !crate::matched::models_everything(run.s.describe()) {
        return None;
    }
    let m = crate::matched::against_matched(points.iter().map(|&(_, m, t)| (m, t)))?;
    run.eng.line(format!(
        "{what} against the precision-matched reference (the precision the device declares): mean cosine {:.4} (min {:.4}, top-1 {:.0}%)",
        m[0],
        m[1],
        100.0 * m[2]
    ));
    // with a control: the graph by the control, the device by its distance from the control;
    // the healthy graph has two implementations then (the matched reference, the CPU EP), and
    // each floor reads the better of the two accounts (`better_explained`)
    let unmodelled = run.s.dev.unmodelled_precision().is_some();
    let jitter = crate::footing::jitter_applies(run.s.describe(), unmodelled);
    let every: Option<Vec<_>> = points.iter().map(|&(p, m, t)| Some((p, m?, t))).collect();
    match every.and_then(|e| crate::device_stray::judged(&e, jitter, what)) {
        Some(j) => {
            j.lines.into_iter().for_each(|l| run.eng.line(l));
            Some(crate::device_stray::better_explained(m, j.floors))
        }
        None => Some(m),
    }
}

/// The cache-free controls' miss: the larger of the prefill rows' (each prefix one run from a
/// reset) and the self-only steps'. Not the smaller, as the ring rules take it: the stateful
/// matched reference models only the arithmetic a device declares (the ANE emulator's fp16, not
/// a float32 runtime's own kernels, matched.rs), and a one-token
/// self-only step exercises none of the accumulation over a context that a prefill row and a tbt
/// step share (NPUW on SmolLM2: self-only 1.4e-5, prefill rows 2e-4, a healthy "Write a haiku
/// about autumn." greedy at 3e-4 … 5e-4 a step). A prefill graph fault does not hide here: its
/// own control fails first, and a failed control's miss is never part of the band (the band
/// must not grow with the fault it judges: issue 35's norm weight, whose prefill at 0.43 widened
/// the wiring fit's band to 0.57).
///
/// Under the jitter control (`matched`: the matched reference computes every op) both against
/// that reference: the prefill rows' mean miss and the self-only steps' (against f32 they carry
/// the declared precision's cost, which the matched reference computes: a healthy QDQ self-only
/// step sits at 0.94 against f32, graph noise 7.6e-2, docs/qnn.md). Where the device runs a
/// control (`crate::device_stray`), the self-only steps are the control's: QNN HTP's QDQ self-only steps
/// sit 0.12 – 0.38 from the reference (the device's own arithmetic on a feed no prompt makes,
/// docs/qnn.md), which as the graph's noise would widen every tbt step's band to about 0.8.
fn graph_noise(run: &Run, f: &StatefulFacts, matched: bool) -> f64 {
    let miss = |c: f64| (1.0 - c).max(crate::thresholds::REL_NOISE_FLOOR);
    let prefill_fails = f.prefill_fails();
    let rows = &f.prefill_rows;
    let prefill = if matched && !rows.is_empty() {
        Some(rows.iter().map(|&(_, md)| md).sum::<f64>() / rows.len() as f64)
    } else {
        run.p.prefill.as_ref().map(|p| p.mean_cosine)
    };
    // with a control, the graph's own self-only rows (the control's): the device's stray from
    // them is its arithmetic on a feed no prompt makes, measured per row where rows are judged
    let selfmask = run.p.selfmask.as_ref().map(|m| {
        match (m.control_matched_mean_cosine, m.matched_mean_cosine) {
            (Some(c), _) | (None, Some(c)) if matched => c,
            _ => m.mean_cosine,
        }
    });
    [
        prefill.filter(|_| !prefill_fails).map(miss),
        selfmask.map(miss),
    ]
    .into_iter()
    .flatten()
    .fold(crate::thresholds::REL_NOISE_FLOOR, f64::max)
}

/// The checks that read the states, listed as not applicable on a device that hides them.
fn hidden_states(run: &mut Run) {
    run.p.not_applicable.extend(hidden_state_probes());
    run.eng
        .line("overflow, state and kvdiff not run: the device does not expose its K/V states");
}

/// The decode graph without the context: one-row runs whose mask allows only themselves (the
/// self-only steps against f32, and against the matched reference where it computes every op).
fn selfmask_control(run: &mut Run, opts: &DiagnoseOptions) -> Result<()> {
    if let Some(why) = run.s.dev.mask_by_length() {
        run.eng.line(format!("selfmask and the self-only state check: not applicable ({why}); prefill, greedy, the state layout and position checks and kvdiff judge the cache"));
        run.p.not_applicable.push(NotApplicable {
            probe: "selfmask".into(),
            why: format!("not applicable: {why}"),
        });
    } else {
        let sm = run.timed("selfmask", |s| selfmask::run(s, opts.selfmask_steps))?;
        let matched = sm.matched_mean_cosine.map_or(String::new(), |c| {
            let control = sm.control_matched_mean_cosine.map_or(String::new(), |c| {
                format!("; the same rows on the device's control, not the device: {c:.4}")
            });
            format!(" ({c:.4} against the precision-matched reference's self-only rows{control})")
        });
        run.eng.line(format!(
            "selfmask: {} self-only steps, mean cosine {:.4} against the token alone{matched}",
            sm.steps.len(),
            sm.mean_cosine
        ));
        run.p.selfmask = Some(sm);
    }
    Ok(())
}

/// Prefill, greedy and selfmask against the reference, then the state checks (their
/// experiments only when a control fails) where the device exposes its states.
fn controls_and_state(run: &mut Run, f: &mut StatefulFacts, opts: &DiagnoseOptions) -> Result<()> {
    let states = run.s.dev.capabilities().read_cache;
    let written = if states {
        // occupancy now, before other probes move the states
        run.timed("occupancy", statecheck::written_positions)?
    } else {
        Vec::new()
    };
    // fewer prefixes than on a ring device: no chunk-boundary remainder rule to cover
    let popts = prefill::PrefillOptions {
        max_rows: opts.prefill.max_rows.min(4),
    };
    let pf = run.timed("prefill", |s| prefill::run(s, &popts))?;
    run.eng.line(format!(
        "prefill: mean cosine {:.4} (min {:.4}, top-1 {:.0}%); the first prefix rerun after a reset: cosine {:.6}",
        pf.mean_cosine,
        pf.min_cosine,
        100.0 * pf.top1_agreement,
        pf.rerun_cosine
    ));
    f.prefill = Some([pf.mean_cosine, pf.min_cosine, pf.top1_agreement]);
    let rows: Vec<_> = pf
        .rows
        .iter()
        .map(|r| (r.position, r.matched.as_ref(), r.comparison.device_top1))
        .collect();
    if let Some(m) = matched_facts(run, &rows, "prefill") {
        f.prefill = Some(m);
    }
    let unmodelled = run.s.dev.unmodelled_precision().is_some();
    f.prefill_rows = super::stateful_facts::declared_rows(run.s.describe(), unmodelled, &pf);
    if f.prefill_leaves_matched() {
        run.eng.line(super::stateful_facts::PREFILL_LEAVES_MATCHED);
    }
    run.p.prefill = Some(pf);
    let gr = run.timed("greedy", |s| {
        greedy::run_with(s, opts.steps, Some(REFERENCE_TAIL))
    })?;
    run.eng.line(format!(
        "greedy: {} steps, mean cosine {:.4} (min {:.4}), top-1 {:.0}%",
        gr.steps.len(),
        gr.mean_cosine,
        gr.min_cosine,
        100.0 * gr.top1_agreement
    ));
    f.greedy = Some([gr.mean_cosine, gr.min_cosine, gr.top1_agreement]);
    let steps: Vec<_> = gr
        .steps
        .iter()
        .map(|s| (s.position, s.matched.as_ref(), s.comparison.device_top1))
        .collect();
    if let Some(m) = matched_facts(run, &steps, "greedy") {
        if let Some(at) = gr.matched.as_ref().and_then(|m| m.fp16_overflow.clone()) {
            f.fp16_overflow = f.greedy.map(|g| (at, g));
        }
        f.greedy = Some(m);
    }
    f.non_finite_step = greedy::first_non_finite_step(run.s);
    // a step's band: the healthy hypothesis' own spread where the jitter control ran (the
    // matched reference computes every op), else the declared precision's cost against f32; the
    // fits after a failed greedy control replay their hypotheses on the same footing
    let jitter = crate::footing::jitter_applies(run.s.describe(), unmodelled);
    f.greedy_steps = super::stateful_facts::greedy_rows(&gr, jitter);
    selfmask_control(run, opts)?;
    f.graph_noise = graph_noise(run, f, jitter);
    if f.greedy_leaves_matched() {
        run.eng.line(format!(
            "greedy: the tbt steps leave the precision-matched reference by more than the declared precision and the cache-free controls' miss ({:.1e}) explain",
            f.graph_noise
        ));
    }
    if f.fails(Control::Greedy) && f.non_finite_step.is_none() {
        let noise = f.graph_noise;
        f.output_fit = run.timed("output fit", |s| super::output_fit::run(s, &gr, noise))?;
    }
    replay_host_feed(run, f, &gr)?;
    run.p.greedy = Some(gr);
    if !states {
        return Ok(());
    }
    let experiments = !(f.prefill_ok() && f.greedy_ok());
    let st = run.timed("state", |s| statecheck::run(s, written, experiments))?;
    run.eng.line(format!(
        "state: the prefill of {} tokens wrote positions {}",
        st.prompt_len,
        ranges(&st.written)
    ));
    run.p.state = Some(st.clone());
    f.state = Some(st);
    if experiments {
        let noise = f.graph_noise;
        f.binding = run.timed("binding", |s| crate::state_binding::run(s, noise))?;
    }
    Ok(())
}

/// The host's declared feed replayed (`crate::host_feed`) when a control failed and the device
/// declares one; the typed fit goes to results.json (`probes.extra.host_feed`).
fn replay_host_feed(
    run: &mut Run,
    f: &mut StatefulFacts,
    gr: &kvprobe_schema::GreedyFinding,
) -> Result<()> {
    let declares_feed = run.s.dev.host_window().is_some();
    if !declares_feed || (f.prefill_ok() && f.greedy_ok()) || f.non_finite_step.is_some() {
        return Ok(());
    }
    let (noise, pf) = (f.graph_noise, run.p.prefill.clone());
    f.host_feed = run.timed("host feed", |s| {
        crate::host_feed::run(s, gr, noise, pf.as_ref())
    })?;
    if let Some(h) = &f.host_feed {
        crate::probe::store_extra(&mut run.p, "host_feed", h)?;
    }
    if f.host_feed.is_none() {
        f.host_writer = run.timed("host slots", |s| crate::host_slots::run(s, gr))?;
    }
    if let Some(h) = &f.host_writer {
        crate::probe::store_extra(&mut run.p, "host_writer", h)?;
    }
    Ok(())
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::diagnose::engine::Cause;
    use kvprobe_schema::{DeterminismFinding, OverflowFinding, StateFinding};

    /// A healthy stateful run: every check ran, nothing is off.
    pub(in crate::diagnose) fn healthy_facts() -> StatefulFacts {
        StatefulFacts {
            repeat: None,
            back_to_back_identical: true,
            back_to_back_cosine: 1.0,
            back_to_back_refused: None,
            overflow: Some(OverflowFinding {
                prompt_len: 4,
                layer: None,
                position: None,
                logits_finite: true,
                longest_finite_prefix: None,
                zero_rows: None,
                logits_zero: false,
            }),
            non_finite_step: None,
            prefill: Some([0.999, 0.998, 1.0]),
            greedy: Some([0.999, 0.998, 1.0]),
            // a declared precision that costs the rows 1e-3, which the device follows
            prefill_rows: vec![(0.999, 0.99995); 4],
            greedy_steps: vec![(1.0, 0.9995); 4],
            graph_noise: 1e-3,
            output_fit: None,
            host_feed: None,
            host_writer: None,
            state: Some(StateFinding {
                prompt_len: 4,
                written: vec![0, 1, 2, 3],
                layout_cosines: None,
                selfonly_cosine: None,
                full_cosine: None,
                position_cosines: None,
                selfonly_control: None,
                selfonly_fit: None,
            }),
            declared_quant_mismatch: None,
            fp16_overflow: None,
            binding: None,
        }
    }

    /// Controls fail; the experiments ran with the given results.
    fn failing(layout: [f64; 2], own: f64) -> StatefulFacts {
        let mut f = healthy_facts();
        f.greedy = Some([0.5, 0.2, 0.3]);
        if let Some(st) = &mut f.state {
            st.layout_cosines = Some(layout);
            st.selfonly_cosine = Some(own);
            st.full_cosine = Some(0.5);
        }
        f
    }

    use kvprobe_schema::{MaskReplay, SelfOnlyFit};

    fn check(id: &str, f: &StatefulFacts) -> Option<Cause> {
        let all: Vec<&R> = TABLE.iter().flat_map(|t| t.iter()).collect();
        let rule = all.iter().find(|r| r.id == id).expect("rule");
        (rule.check)(f)
    }

    fn conclude(f: &StatefulFacts) -> (Verdict, f64) {
        let mut e = Engine::new();
        for phase in TABLE {
            e.apply(phase, f);
        }
        let c = e.conclude();
        (c.verdict, c.confidence)
    }

    #[test]
    fn stale_cache_on_different_or_refused_second_requests() {
        let mut f = healthy_facts();
        f.back_to_back_identical = false;
        f.back_to_back_cosine = 0.97;
        let c = check("stale-cache", &f).expect("fires");
        assert!(c.evidence[0].ends_with("(cosine 0.9700)"));
        f.back_to_back_refused = Some("context full".into());
        assert!(
            check("stale-cache", &f).expect("fires").evidence[0].contains("refused (context full)")
        );
        assert!(check("stale-cache", &healthy_facts()).is_none());
        assert_eq!(conclude(&f), (Verdict::StaleCache, 0.9));
    }

    /// The matched fp16 reference overflows and reproduces the device, the f32 one does not:
    /// numeric-overflow naming the op; the same facts with f32 agreeing, or without an
    /// overflow, stay healthy.
    #[test]
    fn an_fp16_overflow_the_matched_reference_reproduces_is_named() {
        let mut f = healthy_facts();
        let at = "fp16 overflow at layer 3 input_layernorm x·x: value 5.8829e5".to_string();
        f.fp16_overflow = Some((at.clone(), [-0.15, -0.82, 0.44]));
        let c = check("fp16-overflow", &f).expect("fires");
        assert!(c.evidence[0].contains(&at), "{:?}", c.evidence);
        assert_eq!(conclude(&f), (Verdict::NumericOverflow, 0.9));
        f.fp16_overflow = Some((at, [0.9999, 0.998, 1.0]));
        assert!(check("fp16-overflow", &f).is_none());
        assert!(check("fp16-overflow", &healthy_facts()).is_none());
        assert_eq!(conclude(&healthy_facts()).0, Verdict::Healthy);
    }

    #[test]
    fn numeric_overflow_names_the_layer() {
        let mut f = healthy_facts();
        if let Some(ov) = &mut f.overflow {
            ov.layer = Some(2);
            ov.position = Some(3);
        }
        assert_eq!(
            check("numeric-overflow", &f).expect("fires").evidence,
            ["overflow: the 4-token prefill produces inf/NaN inside layer 2 at position 3 (the first non-finite K/V is layer 3 at position 3)"]
        );
        assert!(check("numeric-overflow", &healthy_facts()).is_none());
        assert_eq!(conclude(&f), (Verdict::NumericOverflow, 0.95));
    }

    /// A device that fails mid-generation: finite prefill, NaN logits at greedy step 3.
    #[test]
    fn non_finite_decode_names_the_step() {
        let mut f = failing([0.2, 0.2], 0.2);
        f.non_finite_step = Some(3);
        let c = check("non-finite-decode", &f).expect("fires");
        assert!(c.evidence[0].starts_with(
            "→ numeric-overflow: the device's logits at greedy step 3 (every earlier step finite) hold inf/NaN"
        ));
        assert_eq!(conclude(&f).0, Verdict::NumericOverflow);
        assert!(check("non-finite-decode", &healthy_facts()).is_none());
    }

    #[test]
    fn overflow_evidence_names_the_mask_or_the_layer() {
        let mut f = healthy_facts();
        let ov = f.overflow.as_mut().expect("overflow");
        (ov.layer, ov.position) = (Some(0), Some(4)); // past the 4 positions the host sent
        let c = check("numeric-overflow", &f).expect("fires");
        assert!(c.evidence[0].contains("position 4, past the 4 positions the host sent"));
        assert!(c.evidence[0].contains("the mask"), "{:?}", c.evidence);
        let ov = f.overflow.as_mut().expect("overflow");
        (ov.layer, ov.position, ov.zero_rows) = (None, None, Some([2, 0]));
        let c = check("numeric-overflow", &f).expect("fires");
        assert!(c.evidence[0].contains("the input norm of layer 2 returned zeros"));
        assert_eq!(conclude(&f), (Verdict::NumericOverflow, 0.95));
    }

    fn repeat(clean: bool, identical: bool) -> Option<DeterminismFinding> {
        let first = kvprobe_schema::Divergence {
            step: 0,
            logit: Some(3),
            layer: Some(1),
            cache_id: Some(2),
            slot: Some(16),
        };
        let c = kvprobe_schema::RunComparison {
            against: "same process".into(),
            identical,
            first: (!identical).then_some(first),
            step_max_abs_diff: vec![Some(if identical { 0.0 } else { 0.5 })],
            slots_differing: Vec::new(),
        };
        Some(DeterminismFinding {
            steps: 4,
            caches_compared: true,
            clean_reset: Some(clean),
            comparisons: vec![c],
            second_process_skipped: None,
        })
    }

    #[test]
    fn nondeterministic_only_from_all_zero_states() {
        let mut f = healthy_facts();
        f.repeat = repeat(true, false);
        let c = check("nondeterministic", &f).expect("fires");
        assert!(c.evidence[0]
            .contains("differs first at step 0 (logit 3), cache 2 of layer 1, slot 16"));
        assert_eq!(conclude(&f), (Verdict::Nondeterministic, 0.9));
        // a state kept across the reset: not identical inputs, the stale-cache rule's case
        f.repeat = repeat(false, false);
        f.back_to_back_identical = false;
        assert!(check("nondeterministic", &f).is_none());
        assert_eq!(conclude(&f), (Verdict::StaleCache, 0.9));
        f.repeat = repeat(true, true);
        f.back_to_back_identical = true;
        assert_eq!(conclude(&f), (Verdict::Healthy, 0.9));
    }

    #[test]
    fn state_offset_when_the_prefill_writes_other_slots() {
        let mut f = healthy_facts();
        if let Some(st) = &mut f.state {
            st.written = vec![1, 2, 3, 4];
        }
        assert!(check("state-offset", &f).is_some());
        assert!(check("healthy", &f).is_none());
        assert!(check("state-offset", &healthy_facts()).is_none());
        assert_eq!(conclude(&f), (Verdict::CacheOffset, 0.9));
    }

    #[test]
    fn holes_inside_the_prompt_are_dropped_rows_not_an_offset() {
        // query length 4 of 8: each chunk of the 13 tokens wrote its first 4 rows
        let mut f = healthy_facts();
        if let Some(st) = &mut f.state {
            st.prompt_len = 13;
            st.written = vec![0, 1, 2, 3, 8, 9, 10, 11];
        }
        assert!(check("state-holes", &f).is_some());
        assert_eq!(conclude(&f), (Verdict::CapacityOverflow, 0.85));
        // an offset writes outside 0..n: not holes
        let mut g = healthy_facts();
        if let Some(st) = &mut g.state {
            st.written = (1..=st.prompt_len).collect();
        }
        assert!(check("state-holes", &g).is_none());
        assert!(check("state-holes", &healthy_facts()).is_none());
    }

    #[test]
    fn healthy_when_prefill_and_greedy_pass() {
        assert!(check("healthy", &healthy_facts()).is_some());
        assert_eq!(conclude(&healthy_facts()), (Verdict::Healthy, 0.9));
        let mut near = healthy_facts();
        near.prefill = Some([0.95, 0.9, 0.5]);
        assert!(check("healthy", &near).is_none());
    }

    #[test]
    fn a_prefill_outside_the_declared_precision_is_never_healthy() {
        // issue 35's tiny fp32 builder export with layer 1's norm weight dropped: every prefill
        // row 0.997 against f32 on a device that declares f32, the greedy steps passing
        let mut f = healthy_facts();
        f.prefill = Some([0.997, 0.996, 1.0]);
        f.prefill_rows = vec![(1.0, 0.997), (1.0, 0.996), (1.0, 0.998), (1.0, 0.997)];
        assert!(f.fails(Control::PrefillSingle));
        assert!(check("healthy", &f).is_none());
        assert_eq!(conclude(&f).0, Verdict::Unknown);
        // the same rows on a device whose declared precision costs them 3e-3 and which
        // follows its matched reference within 1e-4: the precision's own miss
        f.prefill_rows = vec![
            (0.997, 0.99991),
            (0.996, 0.99992),
            (0.998, 0.9999),
            (0.997, 0.9999),
        ];
        assert!(!f.fails(Control::PrefillSingle));
        assert_eq!(conclude(&f), (Verdict::Healthy, 0.9));
        // a matched reference that did not run for the prefill rows (a windowed uint8 cache,
        // `matched::computes_prefill`): the stage floors alone judge them
        f.prefill_rows.clear();
        assert_eq!(conclude(&f), (Verdict::Healthy, 0.9));
    }

    #[test]
    fn state_layout_when_the_swapped_order_reproduces() {
        let f = failing([0.3, 0.99], 0.99);
        assert!(check("state-layout-cosines", &f).is_some());
        assert!(check("state-layout", &f).is_some());
        assert_eq!(conclude(&f), (Verdict::CacheLayoutMismatch, 0.9));
        let near = failing([0.98, 0.99], 0.99);
        assert!(check("state-layout", &near).is_none());
        assert!(check("state-layout-cosines", &healthy_facts()).is_none());
    }

    #[test]
    fn declared_quant_when_edges_disagree_and_generation_fails() {
        let mut f = failing([0.3, 0.3], 0.99);
        f.declared_quant_mismatch = Some("cache 0: u16 vs u8".into());
        assert!(check("declared-quant", &f).is_some());
        assert_eq!(conclude(&f), (Verdict::CacheQuantization, 0.9));
        let mut ok = healthy_facts();
        ok.declared_quant_mismatch = Some("cache 0: u16 vs u8".into());
        assert_eq!(
            conclude(&ok),
            (Verdict::Healthy, 0.9),
            "a passing run stays healthy"
        );
    }

    #[test]
    fn state_position_when_a_shifted_query_reproduces() {
        let mut f = failing([0.3, 0.3], 0.99);
        // an f32 device whose first decode step misses the reference by 0.2
        f.greedy_steps = vec![(1.0, 0.8); 4];
        f.graph_noise = 1e-5;
        if let Some(st) = &mut f.state {
            st.position_cosines = Some(vec![[-1.0, 0.9999999], [0.0, 0.8], [1.0, 0.7]]);
        }
        assert!(check("position-cosines", &f).is_some());
        assert_eq!(conclude(&f), (Verdict::PositionMismatch, 0.85));
        if let Some(st) = &mut f.state {
            st.position_cosines = Some(vec![[-1.0, 0.95], [0.0, 0.8]]);
        }
        assert!(
            check("state-position", &f).is_none(),
            "outside the precision"
        );
        // the healthy fp16 ANE emulator the fixed level called shifted (SmolLM2, max-ctx 25): the
        // precision-matched reference reproduces the device's step, which sits at 0.9612 against
        // f32; δ = +2 reaches 0.9750 against f32, no closer to the device than fp16 costs
        f.greedy_steps = vec![(0.9615, 0.99995); 4];
        f.graph_noise = 1e-4;
        if let Some(st) = &mut f.state {
            st.position_cosines = Some(vec![[0.0, 0.9612], [2.0, 0.9750]]);
        }
        assert!(
            check("state-position", &f).is_none(),
            "an fp16 step is not a shift"
        );
    }

    /// States hidden (OpenVINO): the absolute floors pass (mean 0.99, top-1 100 %), one tbt
    /// step leaves the matched reference far outside the band: the greedy control fails, and only
    /// a wiring hypothesis that reproduces within precision names a cause.
    #[test]
    fn greedy_judged_per_step_and_an_output_fit_names_the_wiring() {
        use crate::wiring_fit::{Wiring, WiringFit};
        let mut f = healthy_facts();
        f.state = None;
        f.graph_noise = 1e-5;
        f.greedy_steps = vec![(1.0, 0.99999); 4];
        assert_eq!(conclude(&f).0, Verdict::Healthy);
        // a position shift on SmolLM2 (CPU, f32): 1.0000 → a step at 0.919, the rest ≥ 0.99
        f.greedy = Some([0.9909, 0.919, 1.0]);
        f.greedy_steps = vec![(1.0, 0.998), (1.0, 0.919), (1.0, 0.997), (1.0, 0.999)];
        assert!(f.fails(Control::Greedy));
        assert_eq!(conclude(&f).0, Verdict::Unknown);
        let fit = |wiring, miss| WiringFit {
            wiring,
            miss,
            healthy_miss: 2.5e-3,
            precision: 1.1e-4,
            tried: vec![],
            worst: miss,
            healthy_worst: 2.5e-3,
        };
        f.output_fit = Some(fit(Wiring::Shift(1), 1e-8));
        assert_eq!(conclude(&f), (Verdict::PositionMismatch, 0.85));
        f.output_fit = Some(fit(Wiring::HideNewest, 1e-8));
        assert_eq!(conclude(&f).0, Verdict::MaskConvention);
        // a wiring of the runs after the prompt leaves the prefill as healthy computes it: with
        // the prefill failing too it does not reproduce the device (issue 35's norm weight
        // dropped on one layer of a builder export was named mask-convention this way)
        let prefill = f.prefill;
        f.prefill = Some([0.43, 0.2, 0.1]);
        assert!(f.fails(Control::PrefillSingle));
        assert_eq!(conclude(&f).0, Verdict::Unknown);
        f.output_fit = Some(fit(Wiring::Shift(1), 1e-8));
        assert_eq!(conclude(&f).0, Verdict::Unknown);
        f.prefill = prefill;
        f.output_fit = Some(fit(Wiring::HideNewest, 1e-8));
        // closest, but not within the precision: no cause
        f.output_fit = Some(fit(Wiring::Shift(1), 5e-4));
        assert_eq!(conclude(&f).0, Verdict::Unknown);
        // the same fit beside a passing greedy control is set aside
        f.greedy = Some([0.999, 0.998, 1.0]);
        f.greedy_steps = vec![(1.0, 0.99999); 4];
        f.output_fit = Some(fit(Wiring::Shift(1), 1e-8));
        assert_eq!(conclude(&f).0, Verdict::Healthy);
    }

    #[test]
    fn state_reader_by_elimination_only() {
        // graph right alone, golden state not repairing, no shift: the reader's layout
        let mut f = failing([0.2, 0.2], 1.0);
        if let Some(st) = &mut f.state {
            st.position_cosines = Some(vec![[0.0, 0.3], [1.0, 0.5]]);
        }
        assert!(check("state-reader", &f).is_some());
        assert_eq!(conclude(&f), (Verdict::CacheLayoutMismatch, 0.6));
        // a golden state that repairs, or a failing self-only step, is not this rule's
        let mut g = f.clone();
        if let Some(st) = &mut g.state {
            st.layout_cosines = Some([0.99, 0.2]);
        }
        assert!(check("state-reader", &g).is_none());
        if let Some(st) = &mut f.state {
            st.selfonly_cosine = Some(0.5);
        }
        assert!(check("state-reader", &f).is_none());
    }

    /// A self-only fit with the given misses against the device's row (`control`: and the
    /// control's row) for bias 0 over the held entries and bias +1 over the whole state.
    fn mask_fit(misses: [f64; 2], control: Option<[f64; 2]>, healthy: f64) -> SelfOnlyFit {
        let h = |bias: f64, empty: usize, i: usize| MaskReplay {
            bias,
            empty,
            miss: misses[i],
            control_miss: control.map(|c| c[i]),
            device_step: false,
        };
        SelfOnlyFit {
            hypotheses: vec![h(0.0, 0, 0), h(1.0, 82, 1)],
            healthy_miss: healthy,
            declared: 0.0,
            ids: vec![1, 2, 3],
            model: "m.gguf".into(),
        }
    }

    /// Hand-made facts (an fp32 device, no control): the rule names the hypothesis whose replay
    /// reproduces the self-only row, with its parameter and grammar row, never a fixed cosine.
    #[test]
    fn self_only_mask_names_the_hypothesis_whose_replay_reproduces_the_row() {
        let mut f = failing([0.9, 0.3], 0.6);
        assert!(check("mask-cosines", &f).is_some());
        // no replay: the self-only cosine alone names nothing (before: mask-convention at 0.6)
        assert!(check("self-only-mask", &f).is_none());
        assert_eq!(conclude(&f), (Verdict::Unknown, 0.3));
        let with = |f: &StatefulFacts, fit: SelfOnlyFit| {
            let mut g = f.clone();
            if let Some(st) = &mut g.state {
                st.selfonly_fit = Some(fit);
            }
            g
        };
        let named = with(&f, mask_fit([0.2, 3e-5], None, 0.4));
        let line = format!("{:?}", check("self-only-mask", &named).expect("named"));
        assert!(
            line.contains("0 / +1") && line.contains("ane-mask-01"),
            "{line}"
        );
        assert!(
            line.contains("--ids 1,2,3 --self-only-bias 1 --empty-slots 82"),
            "{line}"
        );
        assert!(format!("{:?}", check("mask-cosines", &named)).contains("miss 3.0e-5"));
        assert_eq!(conclude(&named), (Verdict::MaskConvention, 0.8));
        // closest, but outside the declared precision's floor
        let loose = with(&f, mask_fit([0.2, 5e-3], None, 0.4));
        assert!(check("self-only-mask", &loose).is_none());
        // within it, but the healthy hypothesis is not 2.5× worse
        f = with(&f, mask_fit([0.2, 5e-5], None, 1e-4));
        assert!(check("self-only-mask", &f).is_none());
        assert!(check("mask-cosines", &healthy_facts()).is_none());
    }

    /// The recorded QDQ SmolLM2 state experiment on HTP ("My favourite food is", session 28: the
    /// self-only step −0.1601 against the token alone, the full-context step 0.9908), with
    /// hand-made replay misses (the recording has none). The device's stray from its control
    /// joins the precision; the control's row must be reproduced too: beside a control whose
    /// own self-only step is the token alone (the graph applies the mask), no hypothesis is
    /// named; beside a control that lets the blocked columns in as well (a fault of the graph,
    /// computed by both) and a replay that reproduces both rows, it is.
    #[test]
    fn a_self_only_step_is_a_mask_fault_only_where_the_graph_computes_it_too() {
        let mut f = failing([0.9875, 0.4789], -0.1601);
        if let Some(st) = &mut f.state {
            st.full_cosine = Some(0.9908);
        }
        let with = |control: [f64; 2], fit: SelfOnlyFit| {
            let mut g = f.clone();
            if let Some(st) = &mut g.state {
                st.selfonly_control = Some(control);
                st.selfonly_fit = Some(fit);
            }
            g
        };
        // the device's row reproduced, the control's (0.999 from the token alone) not
        let graph_masks = with(
            [0.9990, -0.1550],
            mask_fit([0.05, 0.9], Some([1.1, 1.5]), 1.16),
        );
        assert!(check("self-only-mask", &graph_masks).is_none());
        let line = check("mask-cosines", &graph_masks).expect("the note");
        assert!(format!("{line:?}").contains("not the device"));
        // both rows reproduced within the precision and the device's stray (5e-4)
        let graph_fault = with(
            [-0.1402, 0.9995],
            mask_fit([4e-4, 0.9], Some([2e-5, 1.5]), 1.16),
        );
        assert!(check("self-only-mask", &graph_fault).is_some());
        // the control's row not reproduced by the ratio
        let near = with(
            [-0.1402, 0.9995],
            mask_fit([4e-4, 0.9], Some([0.5, 1.5]), 1.16),
        );
        assert!(check("self-only-mask", &near).is_none());
    }

    /// Hand-made facts: the fixture's 11 ids in windows of 8 (5 pads in front), greedy failing;
    /// the host's runs with each window's presents rolled name the cause only when the replay
    /// reproduces. By hand: a roll by 1 keeps rows 6, 7 and 0 in the visible slots 5..8, so one
    /// pad row is read and token 0 (row 5) is not; a roll by 3 keeps rows 0, 1, 2 (all pads) and
    /// loses tokens 0, 1, 2.
    #[test]
    fn a_rolled_window_write_is_named_only_when_its_slot_replay_reproduces() {
        use crate::host_feed::FeedMisses;
        use crate::host_slots::HostWriterFit;
        let mut f = healthy_facts();
        f.greedy = Some([0.95, 0.94, 0.33]);
        assert!(f.fails(Control::Any));
        let fit = |roll: usize, miss: f64| HostWriterFit {
            window: 8,
            context: 64,
            pads: 5,
            roll,
            on_matched: true,
            misses: FeedMisses {
                miss,
                worst: miss,
                healthy_miss: 4.4e-2,
                healthy_worst: 5.7e-2,
                precision: 1.1e-4,
            },
            tried: vec![(roll, miss)],
            alike: Vec::new(),
            f32_miss: 4.8e-3,
            seq: (1..15).collect(),
            prompt_len: 11,
            pad_token: 268,
        };
        f.host_writer = Some(fit(1, 1.4e-6));
        assert_eq!(conclude(&f), (Verdict::CacheOffset, 0.85));
        let c = check("host-writer", &f).expect("fires");
        assert!(
            c.evidence[0].contains("rolled by 1")
                && c.evidence[0].contains(
                    "hold 1 pad row(s)' entries and prompt token(s) 0' entries sit in masked slots"
                ),
            "{:?}",
            c.evidence
        );
        f.host_writer = Some(fit(3, 1.4e-6));
        let c = check("host-writer", &f).expect("fires");
        assert!(
            c.evidence[0]
                .contains("hold 3 pad row(s)' entries and prompt token(s) 0, 1, 2' entries"),
            "{:?}",
            c.evidence
        );
        // a roll that does not reproduce the device within the precision names nothing
        f.host_writer = Some(fit(1, 5e-3));
        assert!(check("host-writer", &f).is_none());
        assert_ne!(conclude(&f).0, Verdict::CacheOffset);
        // every control passing: healthy stops first
        let mut g = healthy_facts();
        g.host_writer = Some(fit(1, 1.4e-6));
        assert_eq!(conclude(&g).0, Verdict::Healthy);
    }

    /// Hand-made facts: a prompt whose first window holds a token equal to pad_token_id, the
    /// prefill failing; the host's feed names the cause only when its replay reproduces.
    #[test]
    fn the_host_feed_names_a_pad_valued_prompt_token_only_when_its_replay_reproduces() {
        use crate::host_feed::{FeedMisses, HostFeedFit};
        let mut f = healthy_facts();
        f.prefill = Some([0.65, -0.39, 0.9]);
        assert!(f.fails(Control::Any));
        assert_eq!(conclude(&f).0, Verdict::Unknown);
        let seq = vec![
            1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520,
        ];
        let fit = |miss: f64| HostFeedFit {
            window: 16,
            context: 128,
            pad_token: 2,
            pad_valued: vec![10],
            first_departure: 10,
            on_matched: false,
            misses: FeedMisses {
                miss,
                worst: miss,
                healthy_miss: 3e-2,
                healthy_worst: 1e-1,
                precision: 2e-4,
            },
            f32_miss: miss,
            seq: seq.clone(),
            prompt_len: 12,
        };
        f.host_feed = Some(fit(1e-6));
        assert_eq!(conclude(&f), (Verdict::MaskConvention, 0.85));
        let c = check("host-feed", &f).expect("fires");
        assert!(
            c.evidence[0].contains("prompt token 10 (id 2)")
                && c.evidence[0].contains("pad_token_id 2")
                && c.evidence[0].contains("W 16"),
            "{:?}",
            c.evidence
        );
        // a feed that does not reproduce the device within the precision names nothing
        f.host_feed = Some(fit(5e-3));
        assert_eq!(conclude(&f).0, Verdict::Unknown);
        // every control passing: healthy stops first, whatever the feed
        let mut g = healthy_facts();
        g.host_feed = Some(fit(1e-6));
        assert_eq!(conclude(&g).0, Verdict::Healthy);
    }
}
