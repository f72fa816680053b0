//! `diagnose`: run the probes stage by stage and name the root cause (rules and thresholds in
//! docs/diagnosis.md).
//!
//! Stage order (issue 4): prefill graph → tbt graph → cache path. The controls run first
//! (quant, prefill, selfmask, greedy); the cache-path probes run only when the graphs pass, since
//! a broken graph already explains a bad generation and would poison their references. The
//! headline `verdict` is the earliest failing stage; `also` lists the other causes found.

use std::time::Instant;

use kvprobe_schema::{Layout, ProbeFindings, Timing, Verdict};

use crate::affected;
use crate::colmap::ColmapOptions;
use crate::greedy::{tbt_min, tbt_top1};
use crate::prefill::PrefillOptions;
use crate::session::{Geometry, Session};
use crate::thresholds::*;
use crate::{
    colmap, greedy, inject, layout, maskconv, positions, precision, prefill, quant, scalefit,
    selfmask, ztap, Result,
};

/// Reference tokens `diagnose` decodes past the first divergence for the report's text.
pub(crate) const REFERENCE_TAIL: usize = 8;

#[derive(Debug, Clone)]
pub struct DiagnoseOptions {
    /// Greedy steps (generated tokens, the prefill token included).
    pub steps: usize,
    pub selfmask_steps: usize,
    pub prefill: PrefillOptions,
    pub colmap: ColmapOptions,
    /// Test/research switch: hide every named-fault rule, so only the stale, causality and
    /// splits probes decide and the verdict carries a stage (`diagnose_stage`).
    pub stage_only: bool,
    /// Run `layout --infer`, stale, causality and splits even when a rule already settled the
    /// verdict (their evidence, artefacts and stage join the named verdict, which they do not
    /// change).
    pub all_probes: bool,
}

impl Default for DiagnoseOptions {
    fn default() -> Self {
        DiagnoseOptions {
            steps: 16,
            selfmask_steps: 4,
            prefill: PrefillOptions { max_rows: 6 },
            colmap: ColmapOptions::default(),
            stage_only: false,
            all_probes: false,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Diagnosis {
    pub verdict: Verdict,
    pub confidence: f64,
    pub evidence: Vec<String>,
    pub also: Vec<Verdict>,
    pub warnings: Vec<String>,
    pub probes: ProbeFindings,
    pub timings: Vec<Timing>,
    /// Pipeline stage from the stale/causality/splits probes (on `unknown`, or `stage_only`).
    pub stage: Option<kvprobe_schema::Stage>,
}

/// One cause found by a rule, with how sure the rule is.
#[derive(Debug, Clone)]
struct Cause {
    verdict: Verdict,
    confidence: f64,
    /// 0 prefill graph, 1 tbt graph (from its control), 2 cache path.
    stage: u8,
}

struct Run<'s, 'a> {
    s: &'s mut Session<'a>,
    timings: Vec<Timing>,
}

impl Run<'_, '_> {
    fn timed<T>(&mut self, what: &str, f: impl FnOnce(&mut Session) -> Result<T>) -> Result<T> {
        let s = &mut *self.s;
        timed(&mut self.timings, what, || f(s))
    }
}

/// Runs `f` and records its wall time under `what` (every diagnosis path's timings).
pub(crate) fn timed<T>(
    timings: &mut Vec<Timing>,
    what: &str,
    f: impl FnOnce() -> Result<T>,
) -> Result<T> {
    let t = Instant::now();
    let r = f()?;
    timings.push(Timing {
        what: what.into(),
        seconds: t.elapsed().as_secs_f64(),
    });
    Ok(r)
}

fn pct(x: f64) -> String {
    format!("{:.0}%", 100.0 * x)
}

/// Single-chunk and multi-chunk prefill rows: (mean, min, count) of each.
fn prefill_split(f: &kvprobe_schema::PrefillFinding, g: &Geometry) -> [(f64, f64, usize, f64); 2] {
    let mut out = [(0.0, f64::INFINITY, 0usize, 0.0); 2];
    for r in &f.rows {
        let i = usize::from(g.chunks(r.position + 1) > 1);
        out[i].0 += r.comparison.cosine;
        out[i].1 = out[i].1.min(r.comparison.cosine);
        out[i].2 += 1;
        out[i].3 += r.comparison.top1_match as usize as f64;
    }
    for o in &mut out {
        if o.2 > 0 {
            o.0 /= o.2 as f64;
            o.3 /= o.2 as f64;
        } else {
            o.1 = 1.0;
        }
    }
    out
}

/// Top-1 agreement counts only where the logits are not near-identical: a flat distribution
/// (random-weight fixtures, near-tie tokens) flips its argmax on edge noise alone.
fn top1_ok(agreement: f64, floor: f64, mean_cosine: f64) -> bool {
    agreement >= floor || mean_cosine >= TOP1_IRRELEVANT_ABOVE
}

fn stage_ok(mean: f64, min: f64) -> bool {
    mean >= STAGE_MEAN_COSINE && min >= STAGE_MIN_COSINE
}

pub fn diagnose(s: &mut Session, opts: &DiagnoseOptions) -> Result<Diagnosis> {
    // runtime-kind gate (issue 9): a stateful device has its own rules
    if s.dev.capabilities().stateful {
        return crate::diagnose_stateful::diagnose(s, opts);
    }
    if opts.stage_only {
        return crate::diagnose_stage::diagnose_stage_only(s, opts);
    }
    let mut d = diagnose_ring(s, opts)?;
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
        d.stage = crate::diagnose_stage::run_new_probes(
            s,
            &mut d.timings,
            &mut d.probes,
            &mut d.evidence,
        )?;
    }
    Ok(d)
}

/// Evidence lines that say the issue-10 probes did not run (rewritten under `all_probes`).
const SKIPPED: &str = "stale/causality/splits skipped";
const SKIPPED_BOTH: &str = "cache-path probes and stale/causality/splits skipped";

/// The genai-ring rules (`diagnose` minus the stateful and stage-only paths).
fn diagnose_ring(s: &mut Session, opts: &DiagnoseOptions) -> Result<Diagnosis> {
    let g = s.geometry();
    let mut run = Run {
        s,
        timings: Vec::new(),
    };
    let mut p = ProbeFindings::default();
    let mut ev: Vec<String> = Vec::new();
    let mut warnings: Vec<String> = Vec::new();
    let mut causes: Vec<Cause> = Vec::new();
    let has_tbt = run.s.has_tbt();

    // --- controls -------------------------------------------------------------------------
    let q = run.timed("quant", |s| quant::run(s.describe()))?;
    let pf = run.timed("prefill", |s| prefill::run(s, &opts.prefill))?;
    let [single, multi] = prefill_split(&pf, &g);
    let mut pf_single_ok = single.2 == 0
        || (stage_ok(single.0, single.1) && top1_ok(single.3, PREFILL_TOP1, single.0));
    let pf_multi_ok =
        multi.2 == 0 || (stage_ok(multi.0, multi.1) && top1_ok(multi.3, PREFILL_TOP1, multi.0));
    ev.push(format!(
        "prefill: {} single-chunk prefixes, mean cosine {:.4} (min {:.4}, top-1 {})",
        single.2,
        single.0,
        single.1,
        pct(single.3)
    ));
    if multi.2 > 0 {
        ev.push(format!(
            "prefill: {} multi-chunk prefixes (they read the cache), mean cosine {:.4} (min {:.4}, top-1 {})",
            multi.2,
            multi.0,
            multi.1,
            pct(multi.3)
        ));
    }
    if !pf.rerun_identical {
        warnings.push(format!(
            "prefill: re-running the first prefix after the sweep gave cosine {:.6}, not identical: state leaks across reset",
            pf.rerun_cosine
        ));
    }

    p.quant = Some(q.clone());
    p.prefill = Some(pf.clone());
    let sm = if has_tbt {
        Some(run.timed("selfmask", |s| selfmask::run(s, opts.selfmask_steps))?)
    } else {
        None
    };
    let sm_ok = sm
        .as_ref()
        .is_none_or(|f| stage_ok(f.mean_cosine, f.min_cosine));
    if let Some(f) = &sm {
        ev.push(format!(
            "selfmask: {} self-only tbt steps, mean cosine {:.4} (min {:.4}, top-1 {})",
            f.steps.len(),
            f.mean_cosine,
            f.min_cosine,
            pct(f.top1_agreement)
        ));
    }
    p.selfmask = sm.clone();

    let gr = run.timed("greedy", |s| {
        greedy::run_with(s, opts.steps, Some(REFERENCE_TAIL))
    })?;
    let g_tbt_mean = gr.tbt_mean_cosine.unwrap_or(1.0);
    let g_tbt_min = tbt_min(&gr).unwrap_or(1.0);
    let g_tbt_top1 = tbt_top1(&gr).unwrap_or(1.0);
    let mut greedy_ok =
        stage_ok(g_tbt_mean, g_tbt_min) && top1_ok(g_tbt_top1, GREEDY_TOP1, g_tbt_mean);
    // Relative controls (thresholds: REL_*): a graph far less precise than the device's other
    // precise controls on the same edges computes other math.
    let noise = |c: f64| (1.0 - c).max(REL_NOISE_FLOOR);
    let sm_noise = sm.as_ref().map(|f| noise(f.mean_cosine));
    let pf_rel_fail = pf_single_ok
        && single.2 > 0
        && sm_noise
            .is_some_and(|n| 1.0 - single.0 >= REL_PREFILL_GAP && 1.0 - single.0 >= REL_RATIO * n);
    if pf_rel_fail {
        ev.push(format!(
            "prefill graph: single-chunk rows miss the reference by {:.4} (1 − mean cosine), ≥ {REL_RATIO}× the self-only steps' {:.5} on the same edges",
            1.0 - single.0,
            sm_noise.unwrap_or(0.0)
        ));
        pf_single_ok = false;
    }
    // The whole prompt's prefill against other attention scales: a prefill graph whose scale
    // is near 1 stays inside the row tolerances, yet one scale ≠ 1 explains its output.
    let mut pf_scale_hit = false;
    if pf_single_ok {
        let fit = run.timed("scalefit", prefill_scale)?;
        if fit.best_cosine >= POSITION_REPRODUCES && fit_repairs(fit.unit_cosine, fit.best_cosine) {
            ev.push(format!(
                "prefill graph: the prompt's prefill matches the reference with its attention scale ×{:.3} ({:.5} vs {:.5} at ×1)",
                fit.best_scale, fit.best_cosine, fit.unit_cosine
            ));
            pf_single_ok = false;
            pf_scale_hit = true;
        }
        if let Some(f) = &mut p.prefill {
            f.scale = Some(fit);
        }
    }
    let cache_noise = [
        sm_noise,
        (single.2 > 0).then(|| noise(single.0)),
        (multi.2 > 0).then(|| noise(multi.0)),
    ]
    .into_iter()
    .flatten()
    .fold(REL_NOISE_FLOOR, f64::max);
    if greedy_ok
        && gr.tbt_mean_cosine.is_some()
        && 1.0 - g_tbt_mean >= REL_TBT_GAP
        && 1.0 - g_tbt_mean >= REL_RATIO * cache_noise
    {
        // The controls read no cache; a step that does also pays for the cache's integer
        // format. A miss within what the rounding alone costs is no evidence.
        let floor = run.timed("cache precision", precision::quantised_first_step)?;
        let floor_miss = 1.0 - floor.cosine;
        p.cache_precision = Some(floor);
        if 1.0 - g_tbt_mean > floor_miss {
            ev.push(format!(
                "greedy: tbt steps miss the reference by {:.4} (1 − mean cosine), ≥ {REL_RATIO}× the prefill and self-only controls' {:.5} and above the cache's rounding floor {:.4}",
                1.0 - g_tbt_mean,
                cache_noise,
                floor_miss
            ));
            greedy_ok = false;
        } else {
            ev.push(format!(
                "greedy: tbt steps miss the reference by {:.4}, ≥ {REL_RATIO}× the cache-free controls' {:.5} but within the cache's rounding floor {:.4} (the reference's first step over the prompt's K/V rounded through the rings' quantisation)",
                1.0 - g_tbt_mean,
                cache_noise,
                floor_miss
            ));
        }
    }
    ev.push(format!(
        "greedy: {} steps, tbt mean cosine {:.4} (min {:.4}, top-1 {}), first divergence {}",
        gr.steps.len(),
        g_tbt_mean,
        g_tbt_min,
        pct(g_tbt_top1),
        gr.first_divergence
            .map_or("none".into(), |d| format!("at step {d}"))
    ));
    p.greedy = Some(gr.clone());

    // A passing but marginal cache-reading stage: too far from the device's healthy level to
    // call healthy unchecked, too close to name a fault by elimination.
    let marginal = (g_tbt_mean < MARGINAL_MEAN_COSINE || g_tbt_min < MARGINAL_MIN_COSINE)
        || (multi.2 > 0 && (multi.0 < MARGINAL_MEAN_COSINE || multi.1 < MARGINAL_MIN_COSINE));

    // --- healthy so far: the cheap positive discriminators (a mask convention or a position
    // shift that reproduces the reference better than the server's own) still run, since a
    // small model can hide a wiring fault inside the greedy tolerance.
    let mut quiet_fault = false;
    if pf_single_ok && pf_multi_ok && sm_ok && greedy_ok && q.inconsistent_caches == 0 && has_tbt {
        let ps = run.timed("positions", positions::run)?;
        let mc = run.timed("maskconv", maskconv::run)?;
        quiet_fault =
            position_fault(&ps) || mask_variant_fault(&mc).is_some() || scale_fault(&ps).is_some();
        p.positions = Some(ps);
        p.maskconv = Some(mc);
        if quiet_fault {
            ev.push("positions/maskconv: a non-server convention reproduces the reference better than the server's own".into());
        }
    }
    // --- healthy: stop early, placement only as warnings ------------------------------------
    let mut quiet_layout = false;
    if pf_single_ok
        && pf_multi_ok
        && sm_ok
        && greedy_ok
        && q.inconsistent_caches == 0
        && !quiet_fault
        && !marginal
    {
        let ly = run.timed("layout", layout::run)?;
        let laid_out = affected::misplaced_layout(&ly.caches);
        if !laid_out.is_empty() {
            // some rings' writer data are in another layout: a fault the other rings' healthy
            // data can hide inside the tolerance; the cache path names it
            ev.push(format!(
                "layout: the writer data of {} decode as another layout",
                affected::describe(&laid_out, ly.caches.len())
            ));
            quiet_layout = true;
        } else if ly.writer_layout != Layout::TokenMajor || ly.writer_shift != 0 {
            warnings.push(format!(
                "layout: the writer's data decodes best as {} at slot shift {} (score {:.3}) yet every output matches: windows stay consistent, no output changes",
                ly.writer_layout.name(),
                ly.writer_shift,
                ly.writer_score
            ));
        }
        ev.push(format!(
            "layout: writer {} at shift {} (mean correlation {:.3})",
            ly.writer_layout.name(),
            ly.writer_shift,
            ly.writer_score
        ));
        p.layout = Some(ly);
    }
    if pf_single_ok
        && pf_multi_ok
        && sm_ok
        && greedy_ok
        && q.inconsistent_caches == 0
        && !quiet_fault
        && !marginal
        && !quiet_layout
    {
        let margin = [
            single.0 - STAGE_MEAN_COSINE,
            sm.as_ref()
                .map_or(1.0, |f| f.mean_cosine - STAGE_MEAN_COSINE),
            g_tbt_mean - STAGE_MEAN_COSINE,
        ]
        .into_iter()
        .fold(f64::INFINITY, f64::min);
        let confidence = if margin >= 0.02 { 0.95 } else { 0.75 };
        ev.push(format!("{SKIPPED}: every control passes"));
        return Ok(finish(
            Verdict::Healthy,
            confidence,
            ev,
            Vec::new(),
            warnings,
            p,
            run.timings,
        ));
    }

    // --- graph stages -------------------------------------------------------------------------
    let mc = if has_tbt {
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
        ev.push(format!(
            "maskconv: first tbt step cosine per mask convention: {}",
            list.join(", ")
        ));
    }
    p.maskconv = mc.clone();
    let heads_ignored = mc
        .as_ref()
        .and_then(|m| m.other_heads_ignored_cosine)
        .is_some_and(|c| c >= IDENTICAL_COSINE);
    if heads_ignored && (!pf_single_ok || !sm_ok || !greedy_ok) {
        ev.push(format!(
            "maskconv: giving heads ≥ 1 a self-only row leaves the output unchanged (cosine {:.6} to the ring mask): the graph applies one head's mask row to every head",
            mc.as_ref().and_then(|m| m.other_heads_ignored_cosine).unwrap_or(0.0)
        ));
        causes.push(Cause {
            verdict: Verdict::MaskConvention,
            confidence: 0.95,
            stage: 2,
        });
        return Ok(conclude(causes, ev, warnings, p, run.timings));
    }
    if pf_single_ok && !pf_multi_ok && sm_ok && greedy_ok {
        // The multi-chunk rows read what earlier chunks wrote: byte-level writer evidence
        // (zeroed tails, a constant slot shift) explains them before any mask does.
        let ly = run.timed("layout", layout::run)?;
        let zt = run.timed("ztap", ztap::run)?;
        let cut = affected::truncated(&zt.caches);
        let tm = mean(ly.caches.iter().map(|c| c.token_major_score));
        let shifted = ly.writer_layout == Layout::TokenMajor
            && ly.writer_shift != 0
            && ly.writer_score >= LAYOUT_CLEAN
            && ly.writer_score >= tm + LAYOUT_MARGIN;
        if !cut.is_empty() {
            ev.push(format!(
                "→ cache-truncation: multi-chunk prefixes fail (mean {:.4}) and the same tail columns are zero in every written entry of {}",
                multi.0,
                affected::describe(&cut, zt.caches.len())
            ));
            causes.push(Cause {
                verdict: Verdict::CacheTruncation,
                confidence: 0.85,
                stage: 0,
            });
        } else if shifted {
            ev.push(format!(
                "→ cache-offset: multi-chunk prefixes fail (mean {:.4}) and the prompt's tokens sit at slot shift {:+} (correlation {:.3} vs {:.3} at the predicted slots)",
                multi.0, ly.writer_shift, ly.writer_score, tm
            ));
            causes.push(Cause {
                verdict: Verdict::CacheOffset,
                confidence: 0.85,
                stage: 0,
            });
        } else {
            // The tbt steps read the same rings fine, so the cache holds the right data, and
            // single-chunk rows show the in-chunk attention is right: what a multi-chunk row adds is
            // the cached columns and their mask. The catalogue's cause is the prefill graph applying
            // the mask to cached columns in another convention; a graph bug confined to cached keys
            // looks the same to these probes, hence `also`.
            ev.push(format!(
                "prefill graph: multi-chunk prefixes fail (mean {:.4}, top-1 {}) while single-chunk rows pass and tbt steps read the same rings correctly: the prefill graph mishandles the cached columns (their mask)",
                multi.0,
                pct(multi.3)
            ));
            causes.push(Cause {
                verdict: Verdict::MaskConvention,
                confidence: 0.7,
                stage: 0,
            });
            causes.push(Cause {
                verdict: Verdict::PrefillGraph,
                confidence: 0.7,
                stage: 0,
            });
        }
        p.layout = Some(ly);
        p.ztap = Some(zt);
    }
    if !pf_single_ok && has_tbt && run.s.driver.rope_theta().is_some() {
        // A graph compiled for the other RoPE sign convention than the table it ships fails
        // every single-chunk row; driving with the table flipped repairs them (contract §2.6).
        // The check stands alone: the tbt position sweep cannot change this path's verdict.
        p.theta = run.timed("theta", positions::theta_check)?;
        let flipped = p.theta.clone();
        if let Some(t) = flipped.as_ref().filter(|t| theta_fault(t)) {
            ev.push(format!(
                "→ position-mismatch: single-chunk prefill rows reach cosine {:.4} when the host sends the theta table in the other sign convention, against {:.4} with the shipped {} table: the graph was compiled for the other RoPE convention than rope_theta_data.bin",
                t.other_cosine, t.declared_cosine, t.declared
            ));
            causes.push(Cause {
                verdict: Verdict::PositionMismatch,
                confidence: 0.95,
                stage: 0,
            });
            return Ok(conclude(causes, ev, warnings, p, run.timings));
        }
        if let Some(t) = flipped {
            ev.push(format!(
                "positions: the theta table in the other sign convention does not repair the single-chunk rows ({:.4} vs {:.4} with the shipped {} table)",
                t.other_cosine, t.declared_cosine, t.declared
            ));
        }
    }
    if !pf_single_ok {
        if !pf_rel_fail && !pf_scale_hit {
            ev.push(format!(
                "prefill graph: single-chunk prefixes (no cache read) fall below {STAGE_MEAN_COSINE} mean / {STAGE_MIN_COSINE} min cosine"
            ));
        }
        causes.push(Cause {
            verdict: Verdict::PrefillGraph,
            confidence: if single.0 < STAGE_MEAN_COSINE - 0.05 {
                0.9
            } else if pf_scale_hit {
                0.85
            } else {
                0.7
            },
            stage: 0,
        });
        if sm_ok && !pf_scale_hit {
            // A prefill-only mask convention (e.g. F4's repeat in the prefill graph alone) breaks
            // the same rows; maskconv varies only the tbt step's mask, so it cannot tell them
            // apart (docs/diagnosis.md, known limits).
            ev.push("prefill graph: a prefill-only mask convention would fail the same rows; the mask probes vary only the tbt step".into());
            causes.push(Cause {
                verdict: Verdict::MaskConvention,
                confidence: 0.5,
                stage: 0,
            });
        }
    }
    // Learned absolute positions (GPT-2) make a self-only step depend on its position: a tbt
    // positional input wired off fails the self-only control too, and a position sweep tells.
    // With RoPE a self-only step's attention to itself is position-invariant, so only a model
    // with learned positions can fail self-only through its positional input.
    let learned_positions = run.s.model.rope_inv_freq().is_none();
    let mut position_unchecked = false;
    let sm_position = if !sm_ok && pf_single_ok && has_tbt && learned_positions {
        let ps = run.timed("positions", positions::run)?;
        let hit = position_fault(&ps);
        if hit {
            ev.push(format!(
                "→ position-mismatch: self-only steps fail, and sending position pos{:+} reproduces the reference ({:.4} vs {:.4}): the tbt graph's positional input is wired {:+} off",
                ps.best_delta, ps.best_cosine, ps.baseline_cosine, -ps.best_delta
            ));
            causes.push(Cause {
                verdict: Verdict::PositionMismatch,
                confidence: 0.85,
                stage: 1,
            });
        }
        // a wiring +k off needs the shift −k, a negative position while pos < k: learned
        // positions have no such row, so the sweep cannot rule the position out
        let cut = ps.points.iter().map(|x| x.delta).min().unwrap_or(0) > *positions::DELTAS.start();
        if !hit && cut {
            ev.push(format!(
                "positions: the first tbt step sits at position {}, so shifts below −{0} (a wiring that many positions ahead) cannot be sent; a position fault is not ruled out",
                g.prompt_len
            ));
            position_unchecked = true;
        }
        p.positions = Some(ps);
        hit
    } else {
        false
    };
    if !sm_ok && !sm_position {
        let f = sm.as_ref().map_or(0.0, |f| f.mean_cosine);
        ev.push(format!(
            "tbt graph: self-only steps (no cache read) reach only {f:.4} mean cosine against the reference"
        ));
        causes.push(Cause {
            verdict: Verdict::TbtGraph,
            confidence: if f < STAGE_MEAN_COSINE - 0.05 {
                0.9
            } else {
                0.7
            },
            stage: 1,
        });
        if position_unchecked {
            causes.push(Cause {
                verdict: Verdict::PositionMismatch,
                confidence: 0.5,
                stage: 1,
            });
        }
    }
    if !causes.is_empty() {
        // A broken graph explains the bad generation; the cache-path probes would compare
        // against a reference the device never had. Only the free description check adds to it.
        if q.inconsistent_caches > 0 {
            causes.push(quant_cause(&q, &mut ev));
        }
        ev.push(format!("{SKIPPED_BOTH}: a graph control already fails"));
        return Ok(conclude(causes, ev, warnings, p, run.timings));
    }
    if !has_tbt {
        ev.push("the device has no tbt group; only prefill could be checked".into());
        return Ok(conclude(causes, ev, warnings, p, run.timings));
    }

    // --- cache path ---------------------------------------------------------------------------
    // Every control passes: we are here for a marginal stage or a quiet discriminator, so only
    // positive evidence may name a fault.
    let controls_pass = pf_single_ok && pf_multi_ok && sm_ok && greedy_ok;
    let ps = match p.positions.clone() {
        Some(x) => x,
        None => run.timed("positions", positions::run)?,
    };
    let ly = run.timed("layout", layout::run)?;
    let inj = run.timed("inject", inject::run)?;
    let zt = run.timed("ztap", ztap::run)?;
    let cm = run.timed("colmap", |s| colmap::run(s, &opts.colmap))?;
    p.positions = Some(ps.clone());
    p.layout = Some(ly.clone());
    p.inject = Some(inj.clone());
    p.ztap = Some(zt.clone());
    p.colmap = Some(cm.clone());
    let mc = mc.unwrap_or_else(empty_maskconv);

    ev.push(format!(
        "positions: first tbt step cosine {:.4} at the server's position, best {:.4} at δ = {:+}",
        ps.baseline_cosine, ps.best_cosine, ps.best_delta
    ));
    ev.push(format!(
        "layout: writer {} at slot shift {:+} (mean correlation {:.3}; token-major at the predicted slots {:.3})",
        ly.writer_layout.name(),
        ly.writer_shift,
        ly.writer_score,
        mean(ly.caches.iter().map(|c| c.token_major_score))
    ));
    ev.push(format!(
        "inject: device rings {:.4}, golden token-major rings {:.4}, golden K↔V swapped {:.4} → blame {}",
        inj.device_rings.cosine, inj.golden.cosine, inj.golden_swapped.cosine, inj.blame
    ));
    ev.push(format!(
        "ztap ({}): {}; zero columns {} (transposed reader would show ≈ {:.1})",
        zt.source,
        zt.interpretation,
        zt.caches.iter().map(|c| c.zero_columns).sum::<usize>() / zt.caches.len().max(1),
        mean(zt.caches.iter().map(|c| c.expected_transposed_zero_columns))
    ));
    ev.push(format!(
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

    // a. declared quant infos
    if q.inconsistent_caches > 0 {
        causes.push(quant_cause(&q, &mut ev));
    }
    // e. truncation (byte-level evidence, ahead of the output-level discriminators: zeroed
    // tails can make a shifted position look better)
    let cut = affected::truncated(&zt.caches);
    if !cut.is_empty() {
        let widths: Vec<usize> = zt
            .caches
            .iter()
            .filter(|c| c.interpretation == "truncation")
            .map(|c| c.width - c.zero_columns)
            .collect();
        ev.push(format!(
            "→ cache-truncation: the same tail columns are zero in every written entry of {} (entries keep {} of {} bytes)",
            affected::describe(&cut, zt.caches.len()),
            widths.iter().min().copied().unwrap_or(0),
            zt.caches.first().map_or(0, |c| c.width)
        ));
        causes.push(Cause {
            verdict: Verdict::CacheTruncation,
            confidence: 0.9,
            stage: 2,
        });
    }
    // s. attention scale: one scale multiplier reproduces the first tbt step better than any
    // position shift; a mask variant that does better still keeps the headline (rule d).
    let best_mask_cosine = mask_variant_fault(&mc).map_or(0.0, |v| v.comparison.cosine);
    // Golden rings repairing the step show the tbt graph computes right on right bytes: a scale
    // fit is then the wrong bytes mimicking a scale (a K ring scrambled by the writer).
    let writer_blamed = inj.blame == "writer";
    if let Some(f) = scale_fault(&ps).filter(|_| writer_blamed) {
        ev.push(format!(
            "attention-scale fit ×{:.3} ({:.5}) set aside: golden token-major rings repair the step ({:.4}), so the tbt graph is right on right bytes",
            f.best_scale, f.best_cosine, inj.golden.cosine
        ));
    }
    let mut scale = scale_fault(&ps).filter(|_| !writer_blamed).map(|f| {
        ev.push(format!(
            "→ tbt-graph (attention scale): the first tbt step at the server's position matches the reference with its attention scale ×{:.3} ({:.5} vs {:.5} at ×1), better than any position shift ({:.5})",
            f.best_scale, f.best_cosine, f.unit_cosine, ps.best_cosine
        ));
        (
            Cause {
                verdict: Verdict::TbtGraph,
                confidence: 0.85,
                stage: 2,
            },
            f.best_cosine > best_mask_cosine,
        )
    });
    if let Some((c, true)) = &scale {
        causes.push(c.clone());
        scale = None;
    }
    // b. positions
    if position_fault(&ps) {
        ev.push(format!(
            "→ position-mismatch: sending position pos{:+} reproduces the reference ({:.4} vs {:.4}): the tbt graph's positional input is wired {:+} off",
            ps.best_delta, ps.best_cosine, ps.baseline_cosine, -ps.best_delta
        ));
        causes.push(Cause {
            verdict: Verdict::PositionMismatch,
            confidence: 0.9,
            stage: 2,
        });
    }
    // c. layout and placement of the writer
    let tm_score = mean(ly.caches.iter().map(|c| c.token_major_score));
    let placement_off = ly.writer_layout == Layout::TokenMajor
        && ly.writer_shift != 0
        && ly.writer_score >= LAYOUT_CLEAN
        && ly.writer_score >= tm_score + LAYOUT_MARGIN;
    let n_caches = ly.caches.len();
    let laid_out = affected::misplaced_layout(&ly.caches);
    let majority_layout = ly.writer_layout != Layout::TokenMajor
        && ly.writer_score >= LAYOUT_CLEAN
        && ly.writer_score >= tm_score + LAYOUT_MARGIN;
    if majority_layout || !laid_out.is_empty() {
        let layouts: Vec<&str> = {
            let mut v: Vec<&str> = ly
                .caches
                .iter()
                .filter(|c| laid_out.contains(&(c.layer, c.kind)))
                .map(|c| c.best_layout.name())
                .collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        ev.push(format!(
            "→ cache-layout-mismatch: the prefill writer's ring bytes of {} decode as {} (majority {} at correlation {:.3} vs token-major {:.3}); HailoRT's ring needs token-major (contract §7.4)",
            affected::describe(&laid_out, n_caches),
            if layouts.is_empty() { ly.writer_layout.name().to_string() } else { layouts.join(" / ") },
            ly.writer_layout.name(),
            ly.writer_score,
            tm_score
        ));
        causes.push(Cause {
            verdict: Verdict::CacheLayoutMismatch,
            confidence: 0.9,
            stage: 2,
        });
    }
    // d'. placement before masks: a mis-placed prompt makes some other mask convention look
    // right (a shifted or reversed window lines up with it), never the reverse.
    if placement_off {
        ev.push(format!(
            "→ cache-offset: prompt tokens sit at slot shift {:+} from position mod L (correlation {:.3} vs {:.3} at the predicted slots)",
            ly.writer_shift, ly.writer_score, tm_score
        ));
        causes.push(Cause {
            verdict: Verdict::CacheOffset,
            confidence: 0.85,
            stage: 2,
        });
    }
    // d. mask conventions
    if let Some(v) = mask_variant_fault(&mc) {
        if v.name.starts_with("shift") && placement_off {
            // a shifted mask "repairs" a shifted placement: placement decides (fault signatures)
        } else {
            ev.push(format!(
                "→ mask-convention: the `{}` mask reproduces the reference ({:.4}) where the server's ring mask gives {:.4}",
                v.name, v.comparison.cosine, mc.variants[0].comparison.cosine
            ));
            causes.push(Cause {
                verdict: Verdict::MaskConvention,
                confidence: 0.9,
                stage: 2,
            });
        }
    }
    // a mask variant that reproduces better than the scale fit keeps the headline
    if let Some((c, _)) = scale {
        causes.push(c);
    }
    // f. the reader
    if causes.is_empty() {
        match inj.blame.as_str() {
            "binding" => {
                let partial = inj
                    .partial_swap
                    .as_ref()
                    .filter(|p| p.comparison.cosine > inj.golden_swapped.cosine);
                ev.push(match partial {
                    Some(p) => format!(
                        "→ kv-binding: golden rings fail ({:.4}), swapped K↔V on every layer too ({:.4}), but swapped on layers {} only they reproduce the reference ({:.4}): the K and V rings of those layers are bound crosswise",
                        inj.golden.cosine,
                        inj.golden_swapped.cosine,
                        p.layers.iter().map(usize::to_string).collect::<Vec<_>>().join(", "),
                        p.comparison.cosine
                    ),
                    None => format!(
                        "→ kv-binding: golden rings fail ({:.4}) but the same rings swapped K↔V reproduce the reference ({:.4})",
                        inj.golden.cosine, inj.golden_swapped.cosine
                    ),
                });
                causes.push(Cause {
                    verdict: Verdict::KvBinding,
                    confidence: 0.9,
                    stage: 2,
                });
            }
            "reader" => {
                // Never-written entries are the decisive rows (fault signatures): identical =
                // token-local, different = a reader layout spreading real data over them. Row
                // classes decide only when no never-written entry was covered: single-key
                // responses of a real model share a common component, so its rows look mixed.
                let mixing = match cm.empty_rows_identical {
                    Some(identical) => !identical,
                    None => cm.mixture_rows > cm.clean_rows || zt.interpretation == "transposition",
                };
                if mixing {
                    ev.push(format!(
                        "→ cache-layout-mismatch (reader): golden token-major rings fail too ({:.4}) and column-map rows mix tokens ({} of {} mixtures; never-written rows differ): the tbt reader uses another layout",
                        inj.golden.cosine, cm.mixture_rows, cm.rows.len()
                    ));
                    causes.push(Cause {
                        verdict: Verdict::CacheLayoutMismatch,
                        confidence: 0.85,
                        stage: 2,
                    });
                } else if !controls_pass {
                    ev.push(format!(
                        "→ tbt-graph (by elimination): golden rings fail ({:.4}), the column map stays diagonal ({:.3}), positions, masks, quant and placement are clean; the self-only control is blind to the attention scale",
                        inj.golden.cosine, cm.diagonal_strength
                    ));
                    causes.push(Cause {
                        verdict: Verdict::TbtGraph,
                        confidence: 0.65,
                        stage: 2,
                    });
                    // a crossed layer whose single swap moves the step by less than inject's
                    // per-layer screen escapes it (docs/diagnosis.md)
                    causes.push(Cause {
                        verdict: Verdict::KvBinding,
                        confidence: 0.5,
                        stage: 2,
                    });
                }
            }
            _ => {}
        }
    }
    // f''. golden rings repair the step, so the writer's bytes are wrong: a writer map outside
    // the named layouts, solved from the bytes, explains that before any mask rule does.
    if causes.is_empty()
        && inj.blame == "writer"
        && solved_writer_layout(&mut run, &mut p, &mut ev)?
    {
        causes.push(Cause {
            verdict: Verdict::CacheLayoutMismatch,
            confidence: 0.85,
            stage: 2,
        });
    }
    // f'. the prefill writer's data are wrong (golden rings repair the step) although no
    // placement, layout or truncation shows, and single-chunk prefill rows pass while
    // multi-chunk ones fail: later chunks computed their K/V with a wrong attention over the
    // cached columns, the prefill graph's mask convention for them (see the control rule).
    // f'0. the same with the prompt's tokens mostly at one slot shift (an offset applied after
    // the first chunk leaves later chunks' entries mixed, below the clean correlation)
    if causes.is_empty()
        && pf_single_ok
        && !pf_multi_ok
        && inj.blame == "writer"
        && ly.writer_layout == Layout::TokenMajor
        && ly.writer_shift != 0
        && ly.writer_score >= PARTIAL_SHIFT_SCORE
        && ly.writer_score >= tm_score + PARTIAL_SHIFT_LEAD
    {
        ev.push(format!(
            "→ cache-offset: golden rings repair the tbt step ({:.4} vs {:.4}) and the prompt's tokens sit mostly at slot shift {:+} (correlation {:.3} vs {:.3} at the predicted slots)",
            inj.golden.cosine, inj.device_rings.cosine, ly.writer_shift, ly.writer_score, tm_score
        ));
        causes.push(Cause {
            verdict: Verdict::CacheOffset,
            confidence: 0.75,
            stage: 2,
        });
    }
    if causes.is_empty() && pf_single_ok && !pf_multi_ok && inj.blame == "writer" {
        ev.push(format!(
            "→ mask-convention (prefill graph): single-chunk prefill rows pass, multi-chunk ones fail (mean {:.4}) and golden rings repair the tbt step ({:.4} vs {:.4}): later chunks attended to the cached columns wrongly, so their K/V are wrong",
            multi.0, inj.golden.cosine, inj.device_rings.cosine
        ));
        causes.push(Cause {
            verdict: Verdict::MaskConvention,
            confidence: 0.7,
            stage: 2,
        });
        causes.push(Cause {
            verdict: Verdict::PrefillGraph,
            confidence: 0.7,
            stage: 2,
        });
    }
    // g. elimination: nothing on the cache path is wrong, the column map is clean, yet steps
    // that read the cache fail — the tbt graph's attention over cached keys (e.g. its scale,
    // to which the self-only control is blind).
    // g'. the first tbt step reproduces on the rings prefill left (injection blames nothing),
    // as precisely as the controls, yet later steps fail: they also read entries the tbt graph itself wrote, so the tbt
    // writer's entries are wrong. The catalogue's cause is a truncating tbt writer; ztap looks
    // only at prefill-written bytes, hence `also`.
    if causes.is_empty()
        && !controls_pass
        && inj.blame == "none"
        && sm_ok
        && 1.0 - inj.device_rings.cosine <= (REL_RATIO * cache_noise).min(REL_TBT_GAP)
    {
        ev.push(format!(
            "→ cache-truncation (tbt writer, by elimination): the first tbt step reproduces on the rings prefill wrote ({:.4}) but later steps fail: entries written by the tbt graph are wrong",
            inj.device_rings.cosine
        ));
        causes.push(Cause {
            verdict: Verdict::CacheTruncation,
            confidence: 0.65,
            stage: 2,
        });
        causes.push(Cause {
            verdict: Verdict::TbtGraph,
            confidence: 0.6,
            stage: 2,
        });
    }
    if causes.is_empty()
        && !controls_pass
        && cm.diagonal_strength >= COLMAP_DIAGONAL
        && cm.empty_rows_identical != Some(false)
    {
        ev.push(format!(
            "→ tbt-graph (by elimination): positions, masks, quant, placement and injection are clean and the column map is diagonal ({:.3}), yet steps that read the cache fail; the self-only control is blind to the attention scale",
            cm.diagonal_strength
        ));
        causes.push(Cause {
            verdict: Verdict::TbtGraph,
            confidence: 0.6,
            stage: 2,
        });
        // a binding crossed on a layer too weak for inject's per-layer screen leaves the same
        // clean column map
        causes.push(Cause {
            verdict: Verdict::KvBinding,
            confidence: 0.5,
            stage: 2,
        });
    }
    if causes.is_empty() && controls_pass {
        // marginal but every control passes and no discriminator names a fault: elimination
        // is not enough to call a passing device faulty
        warnings.push("the cache-reading steps pass but are marginal (below 0.96 mean or 0.9 min cosine); no probe isolates a cause".into());
        return Ok(finish(
            Verdict::Healthy,
            0.6,
            ev,
            Vec::new(),
            warnings,
            p,
            run.timings,
        ));
    }
    let mut stage = None;
    if causes.is_empty() {
        // Before calling it unknown: solve the writer's layout from the bytes. A clean map that
        // is not token-major is a layout mismatch even when no named layout is that map.
        if solved_writer_layout(&mut run, &mut p, &mut ev)? {
            ev.push(format!(
                "{SKIPPED}: the writer's layout was solved from the ring bytes"
            ));
            causes.push(Cause {
                verdict: Verdict::CacheLayoutMismatch,
                confidence: 0.8,
                stage: 2,
            });
        } else {
            ev.push("no rule matched: the cache path fails but no probe isolates why".into());
            stage = unknown_evidence(&mut run, &mut p, &mut ev)?;
        }
    } else {
        ev.push(format!(
            "{SKIPPED}: a named rule already settled the verdict"
        ));
    }
    let mut d = conclude(causes, ev, warnings, p, run.timings);
    d.stage = stage;
    Ok(d)
}

/// Runs `layout --infer` once (kept in `p`) and says whether some cache edge's bytes are
/// explained by a writer map that is not token-major, with the evidence line when they are.
fn solved_writer_layout(
    run: &mut Run,
    p: &mut ProbeFindings,
    ev: &mut Vec<String>,
) -> Result<bool> {
    if p.layout_infer.is_none() {
        p.layout_infer = Some(run.timed("layout --infer", crate::layout_infer::run)?);
    }
    let Some(li) = &p.layout_infer else {
        return Ok(false);
    };
    let solved = li
        .caches
        .iter()
        .filter(|c| c.explained && c.named != Some(Layout::TokenMajor))
        .count();
    if solved > 0 {
        ev.push(format!(
            "→ cache-layout-mismatch: {solved} of {} cache edges solve to a prefill-writer layout that is not token-major; {}",
            li.caches.len(),
            crate::layout_infer::evidence(li)
        ));
    }
    Ok(solved > 0)
}

/// The other theta convention repairs the single-chunk rows that the shipped one fails.
fn theta_fault(t: &kvprobe_schema::ThetaCheck) -> bool {
    let miss = |c: f64| (1.0 - c).max(REL_NOISE_FLOOR);
    t.other_cosine >= STAGE_MEAN_COSINE
        && miss(t.declared_cosine) >= THETA_REPAIR_RATIO * miss(t.other_cosine)
}

/// The attention-scale fit of the whole prompt's prefill (device output from the first-step
/// prefill every cache probe shares).
fn prefill_scale(s: &mut Session) -> Result<kvprobe_schema::ScaleFit> {
    let first = s.first_step()?;
    let prompt = s.prompt_ref()?;
    let n = s.ids.len();
    scalefit::prefill(s.model, &s.ids, &first.device_prefill, prompt.row(n - 1))
}

/// A position shift δ ≠ 0 reproduces the reference clearly better than the server's position
/// (by the lead, or by shrinking the miss `FIT_RATIO`-fold), and better than any attention scale.
fn position_fault(ps: &kvprobe_schema::PositionsFinding) -> bool {
    ps.best_delta != 0
        && ps.best_cosine >= POSITION_REPRODUCES
        && (ps.best_cosine >= ps.baseline_cosine + POSITION_MARGIN
            || fit_repairs(ps.baseline_cosine, ps.best_cosine))
        && scale_fault(ps).is_none_or(|f| f.best_cosine < ps.best_cosine)
}

/// Another attention scale reproduces the server-position first tbt step (positions' scale fit).
fn scale_fault(ps: &kvprobe_schema::PositionsFinding) -> Option<&kvprobe_schema::ScaleFit> {
    ps.scale.as_ref().filter(|f| {
        f.best_cosine >= POSITION_REPRODUCES && fit_repairs(f.unit_cosine, f.best_cosine)
    })
}

/// The best non-server mask convention that reproduces the reference (maskconv marks a variant
/// `reproduces` only when it beats the ring mask by the repair margin).
fn mask_variant_fault(
    mc: &kvprobe_schema::MaskconvFinding,
) -> Option<&kvprobe_schema::MaskVariant> {
    let ring = mc
        .variants
        .iter()
        .find(|v| v.name == "ring")
        .map_or(0.0, |v| v.comparison.cosine);
    // or, near the healthy level, a variant that shrinks the ring mask's miss FIT_RATIO-fold
    // (a wrapped full window differs from the ring mask in a single column)
    mc.variants
        .iter()
        .filter(|v| {
            v.reproduces
                || (v.comparison.cosine >= POSITION_REPRODUCES
                    && fit_repairs(ring, v.comparison.cosine))
        })
        .filter(|v| v.name != "ring" && v.name != "per-head")
        .max_by(|a, b| a.comparison.cosine.total_cmp(&b.comparison.cosine))
}

fn quant_cause(q: &kvprobe_schema::QuantFinding, ev: &mut Vec<String>) -> Cause {
    let worst = q
        .caches
        .iter()
        .map(|c| c.max_scale_ratio)
        .fold(1.0, f64::max);
    let off: Vec<affected::Ring> = q
        .caches
        .iter()
        .filter(|c| !c.consistent)
        .map(|c| (c.layer, c.kind))
        .collect();
    ev.push(format!(
        "→ cache-quantization: {} of {} caches ({}) declare different quant infos for writer and reader (scale ratio up to {:.3})",
        q.inconsistent_caches,
        q.caches.len(),
        affected::describe(&off, q.caches.len()),
        worst
    ));
    Cause {
        verdict: Verdict::CacheQuantization,
        confidence: 0.9,
        stage: 2,
    }
}

fn mean(it: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = it.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 {
        0.0
    } else {
        s / n as f64
    }
}

fn empty_maskconv() -> kvprobe_schema::MaskconvFinding {
    kvprobe_schema::MaskconvFinding {
        variants: Vec::new(),
        other_heads_ignored_cosine: None,
        best: None,
    }
}

/// Headline = earliest stage (prefill graph, tbt graph from its control) else the first
/// cache-path rule that fired; the rest go to `also`.
fn conclude(
    causes: Vec<Cause>,
    ev: Vec<String>,
    warnings: Vec<String>,
    p: ProbeFindings,
    timings: Vec<Timing>,
) -> Diagnosis {
    if causes.is_empty() {
        return finish(Verdict::Unknown, 0.3, ev, Vec::new(), warnings, p, timings);
    }
    let head = causes
        .iter()
        .enumerate()
        .min_by_key(|(i, c)| (c.stage, *i))
        .map(|(i, _)| i)
        .unwrap_or(0);
    let verdict = causes[head].verdict;
    let mut also: Vec<Verdict> = Vec::new();
    for c in &causes {
        if c.verdict != verdict && !also.contains(&c.verdict) {
            also.push(c.verdict);
        }
    }
    // several independent causes on the cache path make each one less certain
    let confidence = (causes[head].confidence - 0.05 * also.len() as f64).max(0.5);
    finish(verdict, confidence, ev, also, warnings, p, timings)
}

pub(crate) fn finish(
    verdict: Verdict,
    confidence: f64,
    evidence: Vec<String>,
    also: Vec<Verdict>,
    warnings: Vec<String>,
    probes: ProbeFindings,
    timings: Vec<Timing>,
) -> Diagnosis {
    Diagnosis {
        verdict,
        confidence,
        evidence,
        also,
        warnings,
        probes,
        timings,
        stage: None,
    }
}

/// An `unknown` verdict carries the issue-10 probes' evidence and the stage they point at.
fn unknown_evidence(
    run: &mut Run,
    p: &mut ProbeFindings,
    ev: &mut Vec<String>,
) -> Result<Option<kvprobe_schema::Stage>> {
    crate::diagnose_stage::run_new_probes(run.s, &mut run.timings, p, ev)
}
