//! `diagnose` on a genai-ring device: runs the probes stage by stage and fills [`RingFacts`];
//! the rule phases of [`TABLE`] decide (docs/diagnosis.md).
//!
//! Stage order (issue 4): prefill graph → tbt graph → cache path. The controls run first
//! (quant, prefill, selfmask, greedy); the cache-path probes run only when the graphs pass,
//! since a broken graph already explains a bad generation and would poison their references.
//! This file decides only which probe runs next, and writes the lines that say what a probe
//! measured; every verdict comes from a rule.

mod cache;
mod facts;
pub(super) mod fits;
pub(super) mod graph;
mod reader;
#[cfg(test)]
pub(crate) mod testing;
mod writer;

use kvprobe_schema::{Layout, ProbeFindings, Timing, Verdict};

pub use cache::{CACHE_LATE, CACHE_PATH, SOLVED};
pub use facts::{GreedyStats, RingFacts, RowStats, SKIPPED, SKIPPED_BOTH};
pub use graph::{GRAPH_END, HEADS, HEALTHY, MULTI_CHUNK, PREFILL_GRAPH, SELF_ONLY, THETA};

use super::engine::{Control, Controls, Engine, Rule, Tier};
use super::outcome::{timed, DiagnoseOptions, Diagnosis, REFERENCE_TAIL};
use crate::session::Session;
use crate::{
    affected, colmap, determinism, greedy, inject, kvdiff, layout, layout_infer, maskconv,
    positions, precision, prefill, quant, scalefit, selfmask, ztap, Result,
};
use facts::{mean, pct, prefill_split};

/// The ring rules, phase by phase in the order they are evaluated; the orchestration runs the
/// probes a phase reads before it.
pub const TABLE: &[&[Rule<RingFacts>]] = &[
    REPEAT,
    HEALTHY,
    HEADS,
    MULTI_CHUNK,
    THETA,
    PREFILL_GRAPH,
    SELF_ONLY,
    GRAPH_END,
    CACHE_PATH,
    CACHE_LATE,
    SOLVED,
];

/// Before every other phase: the same request twice from cleared rings must give the same bytes.
pub const REPEAT: &[Rule<RingFacts>] = &[Rule::new(
    "nondeterministic",
    Tier::CachePath,
    Some(Verdict::Nondeterministic),
    nondeterministic,
)
.needs(Control::Rerun)
.stop()];

fn nondeterministic(f: &RingFacts) -> Option<super::engine::Cause> {
    super::repeat::nondeterministic(f.repeat.as_ref()?)
}

struct Run<'s, 'a> {
    s: &'s mut Session<'a>,
    timings: Vec<Timing>,
    p: ProbeFindings,
    eng: Engine,
}

impl Run<'_, '_> {
    fn timed<T>(&mut self, what: &str, f: impl FnOnce(&mut Session) -> Result<T>) -> Result<T> {
        let s = &mut *self.s;
        timed(&mut self.timings, what, || f(s))
    }

    fn done(self, stage: Option<kvprobe_schema::Stage>) -> Diagnosis {
        let mut d = Diagnosis::from_rules(self.eng.conclude(), self.p, self.timings);
        d.stage = stage;
        d
    }
}

/// The genai-ring rules (`diagnose` minus the stateful and stage-only paths).
pub fn diagnose(s: &mut Session, opts: &DiagnoseOptions) -> Result<Diagnosis> {
    let mut run = Run {
        s,
        timings: Vec::new(),
        p: ProbeFindings::default(),
        eng: Engine::new(),
    };
    let repeat = repeat(&mut run)?;
    let mut f = controls(&mut run, opts)?;
    f.repeat = repeat;
    run.eng.apply(REPEAT, &f);
    if run.eng.stopped() {
        return Ok(run.done(None));
    }
    if let Some(r) = &f.repeat {
        run.eng.line(determinism::repeat_evidence(r));
    }
    quiet_checks(&mut run, &mut f)?;
    // every control passes: the cheap capacity check before the healthy rule (issue 20)
    if !f.fails(Control::Any) {
        let quant = Some(&f.quant);
        let (s, p) = (&mut *run.s, &mut run.p);
        if let Some(c) = super::capacity::phase(s, &mut run.eng, &mut run.timings, p, quant)? {
            let mut d = run.done(None);
            d.capacity = Some(c);
            return Ok(d);
        }
    }
    run.eng.apply(HEALTHY, &f);
    if run.eng.stopped() || graph_stage(&mut run, &mut f)? {
        return Ok(run.done(None));
    }
    cache_path(run, f, opts)
}

/// The same request twice from cleared rings (prefill + 3 tbt steps), when the device lets the
/// host clear its rings: without that the second run would read the first one's bytes in its
/// stale slots, which the `stale` probes judge, not this one.
fn repeat(run: &mut Run) -> Result<Option<kvprobe_schema::DeterminismFinding>> {
    if !run.s.dev.capabilities().write_cache {
        run.eng.line(
            "repeat: not run (the device cannot clear its rings, so two requests would not start from identical caches)",
        );
        return Ok(None);
    }
    let rp = run.timed("repeat", |s| {
        let start = s.driver.host_state();
        let rp = determinism::repeat(s, super::stateful::REPEAT_STEPS)?;
        // the probes after it see the rings, offset and host window a fresh device has: the
        // repeat leaves no trace in what they measure (a fault's stale bytes included)
        s.driver.reset(s.dev)?;
        s.driver.set_host_state(start);
        s.clear_rings()?;
        Ok(rp)
    })?;
    run.p.determinism = Some(rp.clone());
    Ok(Some(rp))
}

/// The controls: quant, prefill, selfmask, greedy, and the relative checks that may fail them.
fn controls(run: &mut Run, opts: &DiagnoseOptions) -> Result<RingFacts> {
    let q = run.timed("quant", |s| quant::run(s.describe()))?;
    let pf = run.timed("prefill", |s| prefill::run(s, &opts.prefill))?;
    let [single, multi] = prefill_split(&pf, &run.s.geometry());
    run.eng.line(format!(
        "prefill: {} single-chunk prefixes, mean cosine {:.4} (min {:.4}, top-1 {})",
        single.count,
        single.mean,
        single.min,
        pct(single.top1)
    ));
    if multi.count > 0 {
        run.eng.line(format!(
            "prefill: {} multi-chunk prefixes (they read the cache), mean cosine {:.4} (min {:.4}, top-1 {})",
            multi.count, multi.mean, multi.min, pct(multi.top1)
        ));
    }
    if !pf.rerun_identical {
        run.eng.warn(format!(
            "prefill: re-running the first prefix after the sweep gave cosine {:.6}, not identical: state leaks across reset",
            pf.rerun_cosine
        ));
    }
    let sm = if run.s.has_tbt() {
        Some(run.timed("selfmask", |s| selfmask::run(s, opts.selfmask_steps))?)
    } else {
        None
    };
    if let Some(f) = &sm {
        run.eng.line(format!(
            "selfmask: {} self-only tbt steps, mean cosine {:.4} (min {:.4}, top-1 {})",
            f.steps.len(),
            f.mean_cosine,
            f.min_cosine,
            pct(f.top1_agreement)
        ));
    }
    let gr = run.timed("greedy", |s| {
        greedy::run_with(s, opts.steps, Some(REFERENCE_TAIL))
    })?;
    let mut f = RingFacts::from_controls(run.s, q.clone(), &pf, sm.as_ref(), &gr);
    run.p.quant = Some(q);
    run.p.prefill = Some(pf);
    run.p.selfmask = sm;
    run.p.greedy = Some(gr);
    relative_controls(run, &mut f)?;
    let gs = &f.greedy;
    run.eng.line(format!(
        "greedy: {} steps, tbt mean cosine {:.4} (min {:.4}, top-1 {}{}), first divergence {}",
        gs.steps,
        f.g_tbt_mean(),
        gs.tbt_min,
        pct(gs.tbt_top1),
        near_ties(run.p.greedy.as_ref().map_or(0, |g| g.near_tie_flips)),
        gs.first_divergence
            .map_or("none".into(), |d| format!("at step {d}"))
    ));
    Ok(f)
}

/// The near-tie flips a top-1 figure leaves out, as a clause.
fn near_ties(n: usize) -> String {
    match n {
        0 => String::new(),
        1 => ", 1 near-tie flip counted apart".into(),
        n => format!(", {n} near-tie flips counted apart"),
    }
}

/// A graph far less precise than the device's other precise controls on the same edges
/// computes other math (thresholds: REL_*); and a prefill graph whose attention scale is near 1
/// stays inside the row tolerances, yet one scale ≠ 1 explains its output.
fn relative_controls(run: &mut Run, f: &mut RingFacts) -> Result<()> {
    use crate::thresholds::REL_RATIO;
    if f.prefill_relative_miss() {
        run.eng.line(format!(
            "prefill graph: single-chunk rows miss the reference by {:.4} (1 − mean cosine), ≥ {REL_RATIO}× the self-only steps' {:.5} on the same edges",
            1.0 - f.single.mean,
            f.selfmask_noise().unwrap_or(0.0)
        ));
    }
    if f.selfmask_relative_miss() {
        run.eng.line(format!(
            "tbt graph: self-only steps miss the reference by {:.4} (1 − mean cosine), ≥ {REL_RATIO}× the single-chunk prefill rows' {:.5} on the same edges",
            f.selfmask_noise().unwrap_or(0.0),
            1.0 - f.single.mean
        ));
    }
    if f.prefill_leaves_matched() {
        let n = f.single_matched.len() as f64;
        let (rm, md) = f
            .single_matched
            .iter()
            .fold((0.0, 0.0), |(a, b), &(x, y)| (a + x / n, b + y / n));
        run.eng.line(format!(
            "prefill graph: single-chunk rows against the precision-matched reference: f32 vs matched {rm:.5}, matched vs device {md:.5} — the device leaves what its declared precision computes at most rows"
        ));
    }
    if f.wants_prefill_scale() {
        let fit = run.timed("scalefit", prefill_scale)?;
        f.prefill_scale = Some(fit.clone());
        if let Some(hit) = f.prefill_scale_hit() {
            run.eng.line(format!(
                "prefill graph: the prompt's prefill matches the reference with its attention scale ×{:.3} ({:.5} vs {:.5} at ×1)",
                hit.best_scale, hit.best_cosine, hit.unit_cosine
            ));
        }
        if let Some(pf) = &mut run.p.prefill {
            pf.scale = Some(fit);
        }
    }
    if let (Some(band), Some(m)) = (f.precision_band(), &f.greedy.matched) {
        let (rm, md) = (m.reference_vs_matched, m.matched_vs_device);
        run.eng.line(format!(
            "greedy, three-way over tbt steps: f32 vs device {:.4}, f32 vs precision-matched {:.4}, precision-matched vs device {:.4}; the declared precision costs {:.4} (cache-free controls + matched reference) → {}",
            f.g_tbt_mean(),
            rm,
            md,
            band,
            if f.greedy_relative_miss() {
                "the device leaves the matched reference by more than that at most steps"
            } else {
                "the device stays within it"
            }
        ));
    }
    if f.wants_cache_floor() {
        // The controls read no cache; a step that does also pays for the cache's integer
        // format. A miss within what the rounding alone costs is no evidence.
        let floor = run.timed("cache precision", precision::quantised_first_step)?;
        let floor_miss = 1.0 - floor.cosine;
        f.cache_floor = Some(floor.cosine);
        run.p.cache_precision = Some(floor);
        let miss = 1.0 - f.g_tbt_mean();
        run.eng.line(if f.greedy_relative_miss() {
            format!(
                "greedy: tbt steps miss the reference by {:.4} (1 − mean cosine), ≥ {REL_RATIO}× the prefill and self-only controls' {:.5} and above the cache's rounding floor {:.4}",
                miss, f.cache_noise(), floor_miss
            )
        } else {
            format!(
                "greedy: tbt steps miss the reference by {:.4}, ≥ {REL_RATIO}× the cache-free controls' {:.5} but within the cache's rounding floor {:.4} (the reference's first step over the prompt's K/V rounded through the rings' quantisation)",
                miss, f.cache_noise(), floor_miss
            )
        });
    }
    Ok(())
}

/// Healthy so far: the cheap positive discriminators (a mask convention or a position shift
/// that reproduces the reference better than the server's own) still run, since a small model
/// can hide a wiring fault inside the greedy tolerance; then `layout`, whose placement shows
/// only as warnings unless some rings decode as another layout.
fn quiet_checks(run: &mut Run, f: &mut RingFacts) -> Result<()> {
    if f.healthy_so_far() && f.has_tbt {
        let ps = run.timed("positions", positions::run)?;
        let mc = run.timed("maskconv", maskconv::run)?;
        f.positions = Some(ps.clone());
        f.maskconv = Some(mc.clone());
        run.p.positions = Some(ps);
        run.p.maskconv = Some(mc);
        if f.quiet_fault() {
            run.eng.line("positions/maskconv: a non-server convention reproduces the reference better than the server's own");
        }
    }
    if !f.healthy_so_far() || f.quiet_fault() || f.marginal() {
        return Ok(());
    }
    let ly = run.timed("layout", layout::run)?;
    f.layout = Some(ly.clone());
    let laid_out = affected::misplaced_layout(&ly.caches);
    if f.quiet_layout() {
        run.eng.line(format!(
            "layout: the writer data of {} decode as another layout",
            affected::describe(&laid_out, ly.caches.len())
        ));
    } else if ly.writer_layout != Layout::TokenMajor || ly.writer_shift != 0 {
        run.eng.warn(format!(
            "layout: the writer's data decodes best as {} at slot shift {} (score {:.3}) yet every output matches: windows stay consistent, no output changes",
            ly.writer_layout.name(),
            ly.writer_shift,
            ly.writer_score
        ));
    }
    run.eng.line(format!(
        "layout: writer {} at shift {} (mean correlation {:.3})",
        ly.writer_layout.name(),
        ly.writer_shift,
        ly.writer_score
    ));
    run.p.layout = Some(ly);
    Ok(())
}

/// The graph stages; true when a rule ended the diagnosis (stop early: a broken graph explains
/// a bad generation and would poison the cache-path references).
fn graph_stage(run: &mut Run, f: &mut RingFacts) -> Result<bool> {
    let mc = if f.has_tbt {
        Some(run.timed("maskconv", maskconv::run)?)
    } else {
        None
    };
    if let Some(m) = &mc {
        let list: Vec<String> = m
            .variants
            .iter()
            .map(|v| format!("{} {:.4}", v.name, v.comparison.cosine))
            .collect();
        run.eng.line(format!(
            "maskconv: first tbt step cosine per mask convention: {}",
            list.join(", ")
        ));
    }
    f.maskconv = mc.clone();
    run.p.maskconv = mc;
    run.eng.apply(HEADS, f);
    if run.eng.stopped() {
        return Ok(true);
    }
    if f.only_multi_chunk_fails() {
        // the multi-chunk rows read what earlier chunks wrote: byte-level writer evidence first
        let ly = run.timed("layout", layout::run)?;
        let zt = run.timed("ztap", ztap::run)?;
        f.layout = Some(ly.clone());
        f.ztap = Some(zt.clone());
        run.p.layout = Some(ly);
        run.p.ztap = Some(zt);
    }
    run.eng.apply(MULTI_CHUNK, f);
    if f.wants_theta() {
        let t = run.timed("theta", positions::theta_check)?;
        f.theta = t.clone();
        run.p.theta = t;
        let k = run.timed("kvdiff", |s| {
            kvdiff::run(s, &kvdiff::KvdiffOptions { steps: 1 })
        })?;
        run.eng.line(format!(
            "kvdiff after the prefill only (single-chunk rows fail on a RoPE model): {}",
            k.evidence()
        ));
        f.kvdiff = Some(k.clone());
        run.p.kvdiff = Some(k);
    }
    run.eng.apply(THETA, f);
    if run.eng.stopped() {
        return Ok(true);
    }
    run.eng.apply(PREFILL_GRAPH, f);
    if f.wants_self_only_positions() {
        let ps = run.timed("positions", positions::run)?;
        f.positions = Some(ps.clone());
        run.p.positions = Some(ps);
    }
    run.eng.apply(SELF_ONLY, f);
    run.eng.apply(GRAPH_END, f);
    Ok(run.eng.stopped())
}

/// Every graph passes (or a marginal stage or quiet discriminator brought us here): the
/// cache-path probes, then the cache rules; `layout --infer` runs before the rules that read it.
fn cache_path(mut run: Run, mut f: RingFacts, opts: &DiagnoseOptions) -> Result<Diagnosis> {
    let ps = match f.positions.clone() {
        Some(x) => x,
        None => run.timed("positions", positions::run)?,
    };
    let ly = run.timed("layout", layout::run)?;
    let gap = f.reader_search_gap();
    let inj = run.timed("inject", |s| inject::run_with(s, gap))?;
    let zt = run.timed("ztap", ztap::run)?;
    let cm = run.timed("colmap", |s| colmap::run(s, &opts.colmap))?;
    cache_probe_lines(&mut run.eng, &ps, &ly, &inj, &zt, &cm);
    run.p.positions = Some(ps.clone());
    run.p.layout = Some(ly.clone());
    run.p.inject = Some(inj.clone());
    run.p.ztap = Some(zt.clone());
    run.p.colmap = Some(cm.clone());
    f.positions = Some(ps);
    f.layout = Some(ly);
    f.inject = Some(inj);
    f.ztap = Some(zt);
    f.colmap = Some(cm);
    // every cache-path verdict carries kvdiff's line, and a rule reads the cache itself (a K
    // the tbt graph rotated, ahead of the mask fits it can mimic): it runs once, here
    cache_kvdiff(&mut run)?;
    f.kvdiff = run.p.kvdiff.clone();
    run.eng.apply(CACHE_PATH, &f);
    if !run.eng.has_causes() && f.writer_blamed() {
        solve_layout(&mut run, &mut f)?;
    }
    run.eng.apply(CACHE_LATE, &f);
    if run.eng.stopped() {
        return Ok(run.done(None));
    }
    if run.eng.has_causes() {
        run.eng.line(format!(
            "{SKIPPED}: a named rule already settled the verdict"
        ));
        return Ok(run.done(None));
    }
    solve_layout(&mut run, &mut f)?;
    run.eng.apply(SOLVED, &f);
    if run.eng.has_causes() {
        return Ok(run.done(None));
    }
    run.eng
        .line("no rule matched: the cache path fails but no probe isolates why");
    // an `unknown` verdict carries the issue-10 probes' evidence and the stage they point at
    let mut lines = Vec::new();
    let stage = super::stage::run_new_probes(run.s, &mut run.timings, &mut run.p, &mut lines)?;
    lines.into_iter().for_each(|l| run.eng.line(l));
    Ok(run.done(stage))
}

/// A cache-path verdict carries `kvdiff`'s first divergent layer and head (issue 20): run only
/// here, bounded, so the graph verdicts and healthy runs pay nothing for it.
fn cache_kvdiff(run: &mut Run) -> Result<()> {
    let opts = kvdiff::KvdiffOptions {
        steps: kvdiff::DIAGNOSE_STEPS,
    };
    match run.timed("kvdiff", |s| kvdiff::run(s, &opts)) {
        Ok(k) => {
            run.eng.line(kvdiff::verdict_line(&k));
            run.p.kvdiff = Some(k);
        }
        // the device failed a run the verdict already explains: evidence beside it
        Err(crate::Error::Npu(e)) if e.origin() == kvprobe_npu::Origin::Device => run
            .eng
            .line(format!("kvdiff not run: {}", e.what_device_did())),
        Err(e) => return Err(e),
    }
    Ok(())
}

/// Runs `layout --infer` once (kept in the findings).
fn solve_layout(run: &mut Run, f: &mut RingFacts) -> Result<()> {
    if run.p.layout_infer.is_none() {
        run.p.layout_infer = Some(run.timed("layout --infer", layout_infer::run)?);
    }
    f.layout_infer = run.p.layout_infer.clone();
    Ok(())
}

fn cache_probe_lines(
    eng: &mut Engine,
    ps: &kvprobe_schema::PositionsFinding,
    ly: &kvprobe_schema::LayoutFinding,
    inj: &kvprobe_schema::InjectFinding,
    zt: &kvprobe_schema::ZtapFinding,
    cm: &kvprobe_schema::ColmapFinding,
) {
    eng.line(format!(
        "positions: first tbt step cosine {:.4} at the server's position, best {:.4} at δ = {:+}",
        ps.baseline_cosine, ps.best_cosine, ps.best_delta
    ));
    eng.line(format!(
        "layout: writer {} at slot shift {:+} (mean correlation {:.3}; token-major at the predicted slots {:.3})",
        ly.writer_layout.name(),
        ly.writer_shift,
        ly.writer_score,
        mean(ly.caches.iter().map(|c| c.token_major_score))
    ));
    eng.line(format!(
        "inject: device rings {:.4}, golden token-major rings {:.4}, golden K↔V swapped {:.4} → blame {}",
        inj.device_rings.cosine, inj.golden.cosine, inj.golden_swapped.cosine, inj.blame
    ));
    let tbt_cut = affected::truncated(&zt.tbt_written).len();
    eng.line(format!(
        "ztap ({}): {}; zero columns {} (transposed reader would show ≈ {:.1}){}",
        zt.source,
        zt.interpretation,
        zt.caches.iter().map(|c| c.zero_columns).sum::<usize>() / zt.caches.len().max(1),
        mean(zt.caches.iter().map(|c| c.expected_transposed_zero_columns)),
        if zt.tbt_written.is_empty() {
            String::new()
        } else {
            format!(
                "; the first tbt steps' entries: {tbt_cut} of {} rings end in the same zero columns",
                zt.tbt_written.len()
            )
        }
    ));
    eng.line(format!(
        "colmap: diagonal {:.3}, best off-diagonal {:.3}, best shift {:+} ({:.3}), {} clean / {} mixture rows, never-written rows {}",
        cm.diagonal_strength,
        cm.best_off_diagonal,
        cm.best_shift,
        cm.best_shift_score,
        cm.clean_rows,
        cm.mixture_rows,
        match cm.empty_rows_identical {
            Some(true) => "identical".to_string(),
            Some(false) => format!("differ (spread {:.4})", cm.empty_rows_spread.unwrap_or(0.0)),
            None => "not covered".to_string(),
        }
    ));
}

/// The attention-scale fit of the whole prompt's prefill (device output from the first-step
/// prefill every cache probe shares).
fn prefill_scale(s: &mut Session) -> Result<kvprobe_schema::ScaleFit> {
    let first = s.first_step()?;
    let prompt = s.prompt_ref()?;
    let n = s.ids.len();
    scalefit::prefill(s.model, &s.ids, &first.device_prefill, prompt.row(n - 1))
}

/// The cache-path probes' ring evidence for a `healthy` verdict whose healthy hypothesis leaves
/// steps garbled that no mild fault reproduces (`score::compete`): what the rings hold (layout,
/// inject, the zero tap, kvdiff) names the rings and values a discrete fault hidden in the
/// precision would be hypothesised at (`Fits`), as on the cache path. Evidence only: no rule
/// reads it here, the replays judge (`decide::attach_unexplained`). A probe the device fails is
/// a line, not a failed diagnosis.
pub(super) fn ring_evidence(s: &mut Session, d: &mut Diagnosis) -> Result<()> {
    let device_line = |what: &str, e: &crate::Error| match e {
        crate::Error::Npu(e) if e.origin() == kvprobe_npu::Origin::Device => {
            Some(format!("{what} not run: {}", e.what_device_did()))
        }
        _ => None,
    };
    macro_rules! probe {
        ($what:expr, $slot:ident, $run:expr) => {
            if d.probes.$slot.is_none() {
                match timed(&mut d.timings, $what, || $run(&mut *s)) {
                    Ok(x) => d.probes.$slot = Some(x),
                    Err(e) => match device_line($what, &e) {
                        Some(line) => {
                            d.evidence.push(line);
                            return Ok(());
                        }
                        None => return Err(e),
                    },
                }
            }
        };
    }
    probe!("layout", layout, layout::run);
    probe!("inject", inject, inject::run);
    probe!("ztap", ztap, ztap::run);
    let opts = kvdiff::KvdiffOptions {
        steps: kvdiff::DIAGNOSE_STEPS,
    };
    probe!("kvdiff", kvdiff, |s: &mut Session| kvdiff::run(s, &opts));
    if let Some(k) = &d.probes.kvdiff {
        d.evidence.push(kvdiff::verdict_line(k));
    }
    Ok(())
}
