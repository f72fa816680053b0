//! The ring rules up to the cache path (docs/diagnosis.md, stages 2-3): healthy, the graph
//! stages, and the stop before the cache-path probes. Each phase is evaluated right after the
//! probes it reads ran.

use kvprobe_schema::{QuantFinding, Verdict};

use super::facts::{
    clean_shift, pct, position_fault, theta_fault, RingFacts, SKIPPED, SKIPPED_BOTH,
};
use super::writer::writer_layout;
use crate::affected;
use crate::diagnose::engine::{Cause, Control, Controls, Rule, Tier, When};
use crate::positions;
use crate::thresholds::*;

type R = Rule<RingFacts>;
const PREFILL: Tier = Tier::PrefillGraph;
const TBT: Tier = Tier::TbtGraph;
const CACHE: Tier = Tier::CachePath;

/// After the controls and the quiet discriminators: non-finite output first (every comparison
/// after it is meaningless), then every control passes and nothing quiet shows.
pub const HEALTHY: &[R] = &[
    R::new(
        "non-finite-logits",
        PREFILL,
        Some(Verdict::NumericOverflow),
        non_finite_logits,
    )
    .needs(Control::Output)
    .stop(),
    R::new("healthy", CACHE, Some(Verdict::Healthy), healthy).stop(),
];

/// The device answered with inf or NaN logits: the graph overflows (an fp16 or INT8
/// accumulator, a scale), and the cosines of every probe after it only say "no agreement".
fn non_finite_logits(f: &RingFacts) -> Option<Cause> {
    let step = f.non_finite_step?;
    let at = if step == 0 {
        "the prefill's last row (greedy step 0)".to_string()
    } else {
        format!("tbt step {step}")
    };
    Some(Cause::new(0.9).line(format!(
        "→ numeric-overflow: the device's logits at {at} hold inf/NaN; the comparisons count them as no agreement, so no later rule can tell more"
    )))
}

/// After the graph stage's `maskconv`.
pub const HEADS: &[R] = &[R::new(
    "one-head-mask-row",
    CACHE,
    Some(Verdict::MaskConvention),
    one_head_mask_row,
)
.needs(Control::Any)
.stop()];

/// After `layout` and `ztap` on a run where only the multi-chunk prefill rows fail.
pub const MULTI_CHUNK: &[R] = &[
    R::new(
        "multi-chunk-truncation",
        PREFILL,
        Some(Verdict::CacheTruncation),
        multi_chunk_truncation,
    )
    .needs(Control::PrefillMulti),
    R::new(
        "multi-chunk-offset",
        PREFILL,
        Some(Verdict::CacheOffset),
        multi_chunk_offset,
    )
    .needs(Control::PrefillMulti),
    R::new(
        "multi-chunk-layout",
        PREFILL,
        Some(Verdict::CacheLayoutMismatch),
        multi_chunk_layout,
    )
    .needs(Control::PrefillMulti),
    R::new(
        "multi-chunk-mask",
        PREFILL,
        Some(Verdict::MaskConvention),
        multi_chunk_mask,
    )
    .needs(Control::PrefillMulti),
];

/// After the theta check.
pub const THETA: &[R] = &[
    R::new(
        "theta-convention",
        PREFILL,
        Some(Verdict::PositionMismatch),
        theta_convention,
    )
    .needs(Control::PrefillSingle)
    .stop(),
    R::new("theta-no-repair", PREFILL, None, theta_no_repair),
    R::new(
        "first-layer-k-rotated",
        PREFILL,
        Some(Verdict::PositionMismatch),
        first_layer_k_rotated,
    )
    .needs(Control::PrefillSingle)
    .stop(),
];

/// The prefill graph's control.
pub const PREFILL_GRAPH: &[R] = &[
    R::new(
        "prefill-one-head-mask-row",
        PREFILL,
        Some(Verdict::MaskConvention),
        prefill_one_head_mask_row,
    )
    .needs(Control::PrefillSingle),
    R::new(
        "prefill-graph",
        PREFILL,
        Some(Verdict::PrefillGraph),
        prefill_graph,
    )
    .needs(Control::PrefillSingle),
    R::new(
        "prefill-only-mask",
        PREFILL,
        Some(Verdict::MaskConvention),
        prefill_only_mask,
    )
    .needs(Control::PrefillSingle),
];

/// After the position sweep of a failing self-only control.
pub const SELF_ONLY: &[R] = &[
    R::new(
        "self-only-position",
        TBT,
        Some(Verdict::PositionMismatch),
        self_only_position,
    )
    .needs(Control::SelfOnly),
    R::new(
        "self-only-position-unchecked",
        TBT,
        None,
        self_only_position_unchecked,
    ),
    R::new("tbt-graph", TBT, Some(Verdict::TbtGraph), tbt_graph).needs(Control::Any),
];

/// A failing graph explains the bad generation: the cache-path probes would compare against a
/// reference the device never had. Only the free description check adds to it.
pub const GRAPH_END: &[R] = &[
    R::new(
        "graph-cache-quantization",
        CACHE,
        Some(Verdict::CacheQuantization),
        cache_quantization,
    )
    .needs(Control::Any)
    .when(When::AfterCause),
    R::new("graph-stop", CACHE, None, graph_stop)
        .when(When::AfterCause)
        .stop(),
    R::new("no-tbt", CACHE, None, no_tbt).stop(),
];

/// No control fails beyond the device's precision: healthy, whatever a fit, variant or
/// decode would otherwise suggest (issue 18). Those become warnings and lower the confidence.
fn healthy(f: &RingFacts) -> Option<Cause> {
    if f.fails(Control::Any) {
        return None;
    }
    let margin = [
        f.single.mean - STAGE_MEAN_COSINE,
        f.selfmask.map_or(1.0, |s| s.mean - STAGE_MEAN_COSINE),
        f.g_tbt_mean() - STAGE_MEAN_COSINE,
    ]
    .into_iter()
    .fold(f64::INFINITY, f64::min);
    let mut cause = Cause::new(0.95).line(format!("{SKIPPED}: every control passes"));
    let mut doubts = 0;
    for (doubt, line) in [
        (f.quiet_fault(), "positions/maskconv: a non-server convention or an attention scale reproduces the reference a little better, but no control fails: noted, not a verdict"),
        (f.quiet_layout(), "layout: some rings' writer data decode as another layout, but every output matches: noted, not a verdict"),
        (f.quant.inconsistent_caches > 0, "quant: the declared cache quant infos disagree between writer and reader, but every output matches: noted, not a verdict"),
        (f.marginal() && f.precision_band().is_none(), "a cache-reading stage passes close to its floor and no precision-matched reference ran to say what the device's precision allows"),
        (!f.pf_single_ok() && !f.pf_single_fails(), "prefill: the prompt's prefill matches the reference better with another attention scale, but every single-chunk row passes: noted, not a verdict"),
    ] {
        if doubt {
            cause = cause.warn(line);
            doubts += 1;
        }
    }
    cause.confidence = if margin >= 0.02 && doubts == 0 {
        0.95
    } else {
        0.75
    };
    Some(cause)
}

/// F4: heads ≥ 1 given a self-only row leave the output identical, so the graph uses one
/// head's mask row for all; it also breaks prefill and self-only, so it is checked first.
fn one_head_mask_row(f: &RingFacts) -> Option<Cause> {
    let c = f
        .maskconv
        .as_ref()?
        .other_heads_ignored_cosine
        .filter(|c| *c >= IDENTICAL_COSINE)?;
    if f.pf_single_ok() && f.sm_ok() && f.greedy_ok() {
        return None;
    }
    Some(Cause::new(0.95).line(format!(
        "maskconv: giving heads ≥ 1 a self-only row leaves the output unchanged (cosine {c:.6} to the ring mask): the graph applies one head's mask row to every head"
    )))
}

/// The multi-chunk rows read what earlier chunks wrote: byte-level writer evidence (zeroed
/// tails, a constant slot shift) explains them before any mask does.
fn multi_chunk_truncation(f: &RingFacts) -> Option<Cause> {
    let zt = f.ztap.as_ref()?;
    let cut = affected::truncated(&zt.caches);
    if !f.only_multi_chunk_fails() || cut.is_empty() {
        return None;
    }
    Some(Cause::new(0.85).line(format!(
        "→ cache-truncation: multi-chunk prefixes fail (mean {:.4}) and the same tail columns are zero in every written entry of {}",
        f.multi.mean,
        affected::describe(&cut, zt.caches.len())
    )))
}

fn multi_chunk_offset(f: &RingFacts) -> Option<Cause> {
    let (ly, zt) = (f.layout.as_ref()?, f.ztap.as_ref()?);
    let tm = f.token_major_score();
    if !f.only_multi_chunk_fails()
        || !affected::truncated(&zt.caches).is_empty()
        || !clean_shift(ly, tm)
    {
        return None;
    }
    Some(Cause::new(0.85).line(format!(
        "→ cache-offset: multi-chunk prefixes fail (mean {:.4}) and the prompt's tokens sit at slot shift {:+} (correlation {:.3} vs {:.3} at the predicted slots)",
        f.multi.mean, ly.writer_shift, ly.writer_score, tm
    )))
}

/// Later chunks read what earlier chunks wrote: the writer's bytes decoding as another layout
/// (for the majority or any ring) explain the multi-chunk rows before any mask does (sweep
/// seed 12's `prefill-write-layout=f8cr@k`, K rings f8cr at 0.9999 vs token-major 0.22, was
/// `mask-convention` by the rule below).
fn multi_chunk_layout(f: &RingFacts) -> Option<Cause> {
    let zt = f.ztap.as_ref()?;
    if !f.only_multi_chunk_fails() || !affected::truncated(&zt.caches).is_empty() {
        return None;
    }
    writer_layout(f)
}

/// The tbt steps read the same rings fine, so the cache holds the right data, and single-chunk
/// rows show the in-chunk attention is right: what a multi-chunk row adds is the cached columns
/// and their mask. The catalogue's cause is the prefill graph applying the mask to cached
/// columns in another convention; a graph bug confined to cached keys looks the same, hence
/// `also`.
fn multi_chunk_mask(f: &RingFacts) -> Option<Cause> {
    let (ly, zt) = (f.layout.as_ref()?, f.ztap.as_ref()?);
    if !f.only_multi_chunk_fails()
        || !affected::truncated(&zt.caches).is_empty()
        || clean_shift(ly, f.token_major_score())
        || writer_layout(f).is_some()
    {
        return None;
    }
    Some(Cause::new(0.7).also(Verdict::PrefillGraph, 0.7).line(format!(
        "prefill graph: multi-chunk prefixes fail (mean {:.4}, top-1 {}) while single-chunk rows pass and tbt steps read the same rings correctly: the prefill graph mishandles the cached columns (their mask)",
        f.multi.mean,
        pct(f.multi.top1)
    )))
}

/// A graph compiled for the other RoPE sign convention than the table it ships fails every
/// single-chunk row; driving with the table flipped repairs them (contract §2.6). It stands
/// alone: the tbt position sweep cannot change this path's verdict.
fn theta_convention(f: &RingFacts) -> Option<Cause> {
    let t = f
        .theta
        .as_ref()
        .filter(|t| f.wants_theta() && theta_fault(t))?;
    Some(Cause::new(0.95).line(format!(
        "→ position-mismatch: single-chunk prefill rows reach cosine {:.4} when the host sends the theta table in the other sign convention, against {:.4} with the shipped {} table: the graph was compiled for the other RoPE convention than rope_theta_data.bin",
        t.other_cosine, t.declared_cosine, t.declared
    )))
}

fn theta_no_repair(f: &RingFacts) -> Option<Cause> {
    let t = f
        .theta
        .as_ref()
        .filter(|t| f.wants_theta() && !theta_fault(t))?;
    Some(Cause::note(format!(
        "positions: the theta table in the other sign convention does not repair the single-chunk rows ({:.4} vs {:.4} with the shipped {} table)",
        t.other_cosine, t.declared_cosine, t.declared
    )))
}

/// Seed 000's "sharp break inside layer 0": the first layer's K is a function of its token and
/// position alone. When it leaves its precision band while V of the same layer stays inside, and
/// turning each RoPE pair by one angle per position repairs it, K was rotated for other
/// positions or frequencies: Q and K tables tiled differently, or another theta scaling
/// (ai-hub-models#337). The failing single-chunk rows are its control.
fn first_layer_k_rotated(f: &RingFacts) -> Option<Cause> {
    let k = f.kvdiff.as_ref().filter(|_| f.wants_theta())?;
    let r = k.first_layer_rotation.as_ref().filter(|r| r.explained)?;
    Some(Cause::new(0.9).line(format!(
        "→ position-mismatch: layer 0's K leaves its precision band (relative L2 {:.4}, band {:.4}) while its V stays inside ({:.4}), and one angle per RoPE pair and position brings K back ({:.4}): the graph rotates K for other positions or frequencies than the model's (Q/K cos-sin tables of different widths, or another rope scaling)",
        r.k_rel_l2, r.band, r.v_rel_l2, r.rotated_rel_l2
    )))
}

fn prefill_graph(f: &RingFacts) -> Option<Cause> {
    if f.pf_single_ok() {
        return None;
    }
    let scale_hit = f.prefill_scale_hit().is_some();
    let confidence = if f.single.mean < STAGE_MEAN_COSINE - 0.05 {
        0.9
    } else if scale_hit {
        0.85
    } else {
        0.7
    };
    let cause = Cause::new(confidence);
    // the relative and scale-fit controls wrote their own line when they failed the rows
    if f.prefill_relative_miss() || f.prefill_leaves_matched() || scale_hit {
        return Some(cause);
    }
    Some(cause.line(format!(
        "prefill graph: single-chunk prefixes (no cache read) fall below {STAGE_MEAN_COSINE} mean / {STAGE_MIN_COSINE} min cosine"
    )))
}

/// F4 confined to the prefill graph: a prefill chunk whose heads ≥ 1 get self-only rows returns
/// the plain chunk's output although the reference moves, so the prefill graph reads one head's
/// mask row for every head. Only with the failing single-chunk control it would explain.
fn prefill_one_head_mask_row(f: &RingFacts) -> Option<Cause> {
    let mc = f.maskconv.as_ref()?;
    let c = mc
        .prefill_other_heads_ignored_cosine
        .filter(|c| *c >= IDENTICAL_COSINE)?;
    let r = mc
        .prefill_per_head_reference_cosine
        .filter(|r| *r < VARIANT_MOVES_COSINE)?;
    if f.pf_single_ok() {
        return None;
    }
    Some(Cause::new(0.9).line(format!(
        "maskconv: a prefill chunk whose heads ≥ 1 get self-only rows returns the plain chunk's output (cosine {c:.6}) while the reference moves to {r:.4}: the prefill graph applies one head's mask row to every head"
    )))
}

/// A prefill-only mask convention other than F4's repeat breaks the same rows as a prefill
/// graph fault; the mask probes vary only the tbt step's conventions (known limits).
fn prefill_only_mask(f: &RingFacts) -> Option<Cause> {
    if f.pf_single_ok()
        || !f.sm_ok()
        || f.prefill_scale_hit().is_some()
        || prefill_one_head_mask_row(f).is_some()
    {
        return None;
    }
    Some(Cause::new(0.5).line(
        "prefill graph: a prefill-only mask convention other than one head's row repeated would fail the same rows; the other mask conventions are varied on the tbt step only",
    ))
}

/// Learned absolute positions (GPT-2) make a self-only step depend on its position: a tbt
/// positional input wired off fails the self-only control too, and a position sweep tells.
/// With RoPE a self-only step's attention to itself is position-invariant.
fn self_only_position(f: &RingFacts) -> Option<Cause> {
    let ps = f.self_only_positions().filter(|ps| position_fault(ps))?;
    Some(Cause::new(0.85).line(format!(
        "→ position-mismatch: self-only steps fail, and sending position pos{:+} reproduces the reference ({:.4} vs {:.4}): the tbt graph's positional input is wired {:+} off",
        ps.best_delta, ps.best_cosine, ps.baseline_cosine, -ps.best_delta
    )))
}

/// A wiring +k off needs the shift −k, a negative position while pos < k: learned positions have
/// no such row, so the sweep cannot rule the position out.
fn position_unchecked(f: &RingFacts) -> bool {
    f.self_only_positions().is_some_and(|ps| {
        !position_fault(ps)
            && ps.points.iter().map(|x| x.delta).min().unwrap_or(0) > *positions::DELTAS.start()
    })
}

fn self_only_position_unchecked(f: &RingFacts) -> Option<Cause> {
    position_unchecked(f).then(|| Cause::note(format!(
        "positions: the first tbt step sits at position {}, so shifts below −{0} (a wiring that many positions ahead) cannot be sent; a position fault is not ruled out",
        f.prompt_len
    )))
}

fn tbt_graph(f: &RingFacts) -> Option<Cause> {
    let position_hit = f.self_only_positions().is_some_and(position_fault);
    if f.sm_ok() || position_hit {
        return None;
    }
    let m = f.selfmask.map_or(0.0, |s| s.mean);
    let confidence = if m < STAGE_MEAN_COSINE - 0.05 {
        0.9
    } else {
        0.7
    };
    let cause = Cause::new(confidence).line(format!(
        "tbt graph: self-only steps (no cache read) reach only {m:.4} mean cosine against the reference"
    ));
    Some(if position_unchecked(f) {
        cause.also(Verdict::PositionMismatch, 0.5)
    } else {
        cause
    })
}

/// Writer and reader declare different quant infos for some rings (relative scale > 1e-3).
pub(super) fn cache_quantization(f: &RingFacts) -> Option<Cause> {
    Some(Cause::new(0.9).line(quant_mismatch(&f.quant)?))
}

/// The evidence line of writer and reader quant infos that differ, if any do.
pub(crate) fn quant_mismatch(q: &QuantFinding) -> Option<String> {
    if q.inconsistent_caches == 0 {
        return None;
    }
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
    Some(format!(
        "→ cache-quantization: {} of {} caches ({}) declare different quant infos for writer and reader (scale ratio up to {:.3})",
        q.inconsistent_caches,
        q.caches.len(),
        affected::describe(&off, q.caches.len()),
        worst
    ))
}

fn graph_stop(_: &RingFacts) -> Option<Cause> {
    Some(Cause::note(format!(
        "{SKIPPED_BOTH}: a graph control already fails"
    )))
}

fn no_tbt(f: &RingFacts) -> Option<Cause> {
    (!f.has_tbt).then(|| Cause::note("the device has no tbt group; only prefill could be checked"))
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;
    use crate::diagnose::engine::Engine;
    use kvprobe_schema::Layout;

    fn fires_in(id: &str, f: &RingFacts) -> Option<Cause> {
        fires(&super::super::TABLE.concat(), id, f)
    }

    /// Single-chunk prefill rows fail (a graph fault), self-only passes.
    fn prefill_broken() -> RingFacts {
        RingFacts {
            single: rows(0.3, 0.2, 4),
            prefill_scale: None,
            ..healthy_facts()
        }
    }

    /// Only the multi-chunk prefill rows fail; layout and ztap ran.
    fn multi_broken() -> RingFacts {
        RingFacts {
            multi: rows(0.8, 0.7, 2),
            layout: Some(layout(Layout::TokenMajor, 0, 0.99, &[])),
            ztap: Some(ztap(&[], "none")),
            ..healthy_facts()
        }
    }

    /// GPT-2 style: learned positions, the self-only control fails.
    fn self_only_broken() -> RingFacts {
        RingFacts {
            learned_positions: true,
            rope_table: false,
            selfmask: Some(rows(0.5, 0.4, 4)),
            ..healthy_facts()
        }
    }

    #[test]
    fn non_finite_logits_name_the_first_step() {
        let f = RingFacts {
            non_finite_step: Some(3),
            single: rows(0.0, 0.0, 4),
            ..healthy_facts()
        };
        let c = fires_in("non-finite-logits", &f).expect("fires");
        assert!(c.evidence[0]
            .starts_with("→ numeric-overflow: the device's logits at tbt step 3 hold inf/NaN"));
        let prefill = RingFacts {
            non_finite_step: Some(0),
            ..f.clone()
        };
        assert!(fires_in("non-finite-logits", &prefill)
            .expect("fires")
            .evidence[0]
            .contains("the prefill's last row (greedy step 0)"));
        // a failing device whose logits are finite is for the other rules
        let finite = RingFacts {
            non_finite_step: None,
            ..f
        };
        assert!(fires_in("non-finite-logits", &finite).is_none());
        let mut e = Engine::new();
        e.apply(HEALTHY, &prefill);
        assert!(e.stopped());
        assert_eq!(e.conclude().verdict, Verdict::NumericOverflow);
    }

    #[test]
    fn healthy_fires_on_passing_controls_and_doubts_only_lower_its_confidence() {
        let c = fires_in("healthy", &healthy_facts()).expect("healthy");
        assert_eq!(c.confidence, 0.95);
        assert_eq!(
            c.evidence,
            ["stale/causality/splits skipped: every control passes"]
        );
        // a control within 0.02 of the stage floor: healthy, less sure (prefill rows about as
        // imprecise, or the relative self-only control fails)
        let narrow = RingFacts {
            selfmask: Some(rows(0.955, 0.95, 4)),
            single: rows(0.997, 0.995, 4),
            ..healthy_facts()
        };
        assert_eq!(
            fires_in("healthy", &narrow).map(|c| c.confidence),
            Some(0.75)
        );
        // no verdict without a failing control (issue 18): a marginal stage, a layout decode
        // or a fit is a warning on a healthy verdict, never a fault
        let mut marginal = healthy_facts();
        marginal.greedy.tbt_mean = Some(0.955);
        let c = fires_in("healthy", &marginal).expect("marginal is healthy");
        assert_eq!(c.confidence, 0.75);
        assert!(
            c.warnings[0].contains("close to its floor"),
            "{:?}",
            c.warnings
        );
        let laid_out = RingFacts {
            layout: Some(layout(Layout::TokenMajor, 0, 0.99, &[3])),
            ..healthy_facts()
        };
        let c = fires_in("healthy", &laid_out).expect("laid out is healthy");
        assert_eq!(c.confidence, 0.75);
        assert!(c.warnings[0].starts_with("layout:"), "{:?}", c.warnings);
        // a failing control: not healthy
        let mut failing = healthy_facts();
        failing.greedy.tbt_mean = Some(0.90);
        assert!(fires_in("healthy", &failing).is_none());
    }

    #[test]
    fn one_head_mask_row_needs_identical_outputs_and_a_failing_control() {
        let mut mc = maskconv(0.5, &[]);
        mc.other_heads_ignored_cosine = Some(0.999_999_2);
        let f = RingFacts {
            maskconv: Some(mc.clone()),
            selfmask: Some(rows(0.6, 0.5, 4)),
            ..healthy_facts()
        };
        let c = fires_in("one-head-mask-row", &f).expect("fires");
        assert!(c.evidence[0].contains("cosine 0.999999"));
        mc.other_heads_ignored_cosine = Some(0.99999);
        let near = RingFacts {
            maskconv: Some(mc),
            ..f.clone()
        };
        assert!(fires_in("one-head-mask-row", &near).is_none());
        let passing = RingFacts {
            selfmask: healthy_facts().selfmask,
            ..f
        };
        assert!(fires_in("one-head-mask-row", &passing).is_none());
    }

    #[test]
    fn multi_chunk_truncation_names_the_cut_rings() {
        let f = RingFacts {
            ztap: Some(ztap(&[1, 3], "truncation")),
            ..multi_broken()
        };
        let c = fires_in("multi-chunk-truncation", &f).expect("fires");
        assert_eq!(
            c.evidence,
            ["→ cache-truncation: multi-chunk prefixes fail (mean 0.8000) and the same tail columns are zero in every written entry of only V rings (all layers)"]
        );
        assert!(fires_in("multi-chunk-truncation", &multi_broken()).is_none());
        // the same zeroed tails while the multi-chunk rows pass
        let passing = RingFacts {
            multi: healthy_facts().multi,
            ..f
        };
        assert!(fires_in("multi-chunk-truncation", &passing).is_none());
    }

    #[test]
    fn multi_chunk_offset_needs_a_clean_shift() {
        let f = RingFacts {
            layout: Some(layout(Layout::TokenMajor, -1, 0.95, &[])),
            ..multi_broken()
        };
        let c = fires_in("multi-chunk-offset", &f).expect("fires");
        assert!(c.evidence[0].contains("slot shift -1 (correlation 0.950 vs 0.050"));
        let near = RingFacts {
            layout: Some(layout(Layout::TokenMajor, -1, 0.75, &[])),
            ..multi_broken()
        };
        assert!(fires_in("multi-chunk-offset", &near).is_none());
        let cut = RingFacts {
            ztap: Some(ztap(&[0], "truncation")),
            ..f
        };
        assert!(fires_in("multi-chunk-offset", &cut).is_none());
    }

    #[test]
    fn multi_chunk_layout_heads_the_mask_when_a_ring_decodes_as_another_layout() {
        let f = RingFacts {
            layout: Some(layout(Layout::TokenMajor, 0, 0.98, &[0, 2])),
            ..multi_broken()
        };
        let c = fires_in("multi-chunk-layout", &f).expect("fires");
        assert!(
            c.evidence[0].starts_with(
                "→ cache-layout-mismatch: the prefill writer's ring bytes of only K rings (all layers) decode as feature-major"
            ),
            "{:?}",
            c.evidence
        );
        assert!(fires_in("multi-chunk-mask", &f).is_none());
        assert!(fires_in("multi-chunk-layout", &multi_broken()).is_none());
        // the same bytes while the multi-chunk rows pass: not this stage's business
        let passing = RingFacts {
            multi: healthy_facts().multi,
            ..f
        };
        assert!(fires_in("multi-chunk-layout", &passing).is_none());
    }

    #[test]
    fn multi_chunk_mask_is_what_remains() {
        let c = fires_in("multi-chunk-mask", &multi_broken()).expect("fires");
        assert_eq!(
            (c.confidence, c.also.clone()),
            (0.7, vec![(Verdict::PrefillGraph, 0.7)])
        );
        assert!(c.evidence[0].contains("mean 0.8000, top-1 100%"));
        let shifted = RingFacts {
            layout: Some(layout(Layout::TokenMajor, 2, 0.9, &[])),
            ..multi_broken()
        };
        assert!(fires_in("multi-chunk-mask", &shifted).is_none());
        assert!(fires_in("multi-chunk-mask", &healthy_facts()).is_none());
    }

    #[test]
    fn theta_convention_needs_the_other_table_to_pass_and_repair() {
        let f = RingFacts {
            theta: Some(theta(0.30, 0.9999)),
            ..prefill_broken()
        };
        let c = fires_in("theta-convention", &f).expect("fires");
        assert!(c.evidence[0].contains("cosine 0.9999 when the host sends"));
        assert!(fires_in("theta-no-repair", &f).is_none());
        let near = RingFacts {
            theta: Some(theta(0.30, 0.93)),
            ..prefill_broken()
        };
        assert!(fires_in("theta-convention", &near).is_none());
        // 14-fold, but short of a repair (SmolLM2 `gqa-repeat=block@prefill,tbt`: the flip
        // lifted the rows of a graph repeating the KV heads in blocks from 0.516 to 0.966)
        let partial = RingFacts {
            theta: Some(theta(0.5162, 0.9655)),
            ..prefill_broken()
        };
        assert!(fires_in("theta-convention", &partial).is_none());
        // flipping cuts the miss only 5-fold (0.005 → 0.001), not 10-fold
        let small = RingFacts {
            theta: Some(theta(0.995, 0.999)),
            ..prefill_broken()
        };
        assert!(fires_in("theta-convention", &small).is_none());
    }

    #[test]
    fn theta_no_repair_says_so_only_when_the_check_ran_and_failed() {
        let f = RingFacts {
            theta: Some(theta(0.30, 0.5)),
            ..prefill_broken()
        };
        assert_eq!(
            fires_in("theta-no-repair", &f).map(|c| c.evidence),
            Some(vec!["positions: the theta table in the other sign convention does not repair the single-chunk rows (0.5000 vs 0.3000 with the shipped plain table)".to_string()])
        );
        let no_tbt = RingFacts {
            has_tbt: false,
            ..f
        };
        assert!(fires_in("theta-no-repair", &no_tbt).is_none());
    }

    #[test]
    fn prefill_graph_confidence_by_how_far_and_why() {
        let c = fires_in("prefill-graph", &prefill_broken()).expect("fires");
        assert_eq!(c.confidence, 0.9);
        assert_eq!(
            c.evidence,
            ["prefill graph: single-chunk prefixes (no cache read) fall below 0.94 mean / 0.85 min cosine"]
        );
        // a fitted prefill scale failed the rows and wrote its own line
        let scaled = RingFacts {
            prefill_scale: Some(scale(0.995, 0.9999, 1.15)),
            ..healthy_facts()
        };
        let c = fires_in("prefill-graph", &scaled).expect("fires");
        assert_eq!((c.confidence, c.evidence.len()), (0.85, 0));
        // relative miss: rows pass the floors but miss 20× the self-only steps
        let relative = RingFacts {
            single: rows(0.99, 0.98, 4),
            selfmask: Some(rows(0.99999, 0.9999, 4)),
            prefill_scale: None,
            ..healthy_facts()
        };
        let c = fires_in("prefill-graph", &relative).expect("fires");
        assert_eq!((c.confidence, c.evidence.len()), (0.7, 0));
        assert!(fires_in("prefill-graph", &healthy_facts()).is_none());
    }

    #[test]
    fn prefill_only_mask_needs_passing_self_only_steps_and_no_scale() {
        let c = fires_in("prefill-only-mask", &prefill_broken()).expect("fires");
        assert_eq!(c.confidence, 0.5);
        let both = RingFacts {
            selfmask: Some(rows(0.5, 0.4, 4)),
            ..prefill_broken()
        };
        assert!(fires_in("prefill-only-mask", &both).is_none());
        let scaled = RingFacts {
            prefill_scale: Some(scale(0.995, 0.9999, 1.15)),
            ..healthy_facts()
        };
        assert!(fires_in("prefill-only-mask", &scaled).is_none());
    }

    #[test]
    fn prefill_one_head_mask_row_needs_an_ignored_variant_the_reference_feels() {
        let with = |ignored: f64, reference: f64, f: RingFacts| {
            let mut mc = maskconv(0.99, &[]);
            mc.prefill_other_heads_ignored_cosine = Some(ignored);
            mc.prefill_per_head_reference_cosine = Some(reference);
            RingFacts {
                maskconv: Some(mc),
                ..f
            }
        };
        let c = fires_in(
            "prefill-one-head-mask-row",
            &with(1.0, 0.93, prefill_broken()),
        )
        .expect("fires");
        assert_eq!(c.confidence, 0.9);
        // the weaker guess of the same stage stays silent when the control names it
        assert!(fires_in("prefill-only-mask", &with(1.0, 0.93, prefill_broken())).is_none());
        assert!(
            c.evidence[0].contains("cosine 1.000000"),
            "{:?}",
            c.evidence
        );
        assert!(
            c.evidence[0].contains("moves to 0.9300"),
            "{:?}",
            c.evidence
        );
        // the device feels the rows (a healthy mask input): no
        assert!(fires_in(
            "prefill-one-head-mask-row",
            &with(0.9999, 0.93, prefill_broken())
        )
        .is_none());
        // a variant that does not move the reference proves nothing
        assert!(fires_in(
            "prefill-one-head-mask-row",
            &with(1.0, 0.9995, prefill_broken())
        )
        .is_none());
        // no failing control: no verdict
        assert!(fires_in(
            "prefill-one-head-mask-row",
            &with(1.0, 0.93, healthy_facts())
        )
        .is_none());
    }

    #[test]
    fn self_only_position_needs_a_reproducing_shift() {
        let f = RingFacts {
            positions: Some(positions(0.5, -2, 0.99)),
            ..self_only_broken()
        };
        let c = fires_in("self-only-position", &f).expect("fires");
        assert!(c.evidence[0].contains("pos-2 reproduces the reference (0.9900 vs 0.5000)"));
        assert!(c.evidence[0].ends_with("wired +2 off"));
        let near = RingFacts {
            positions: Some(positions(0.5, -2, 0.96)),
            ..self_only_broken()
        };
        assert!(fires_in("self-only-position", &near).is_none());
        // RoPE: a self-only step cannot see its position, the sweep is not asked
        let rope = RingFacts {
            learned_positions: false,
            ..f
        };
        assert!(fires_in("self-only-position", &rope).is_none());
    }

    #[test]
    fn position_unchecked_when_negative_positions_could_not_be_sent() {
        let mut ps = positions(0.5, 0, 0.5);
        ps.points.retain(|p| p.delta >= -2);
        let f = RingFacts {
            positions: Some(ps),
            prompt_len: 2,
            ..self_only_broken()
        };
        let c = fires_in("self-only-position-unchecked", &f).expect("fires");
        assert!(c.evidence[0]
            .starts_with("positions: the first tbt step sits at position 2, so shifts below −2"));
        let full = RingFacts {
            positions: Some(positions(0.5, 0, 0.5)),
            ..self_only_broken()
        };
        assert!(fires_in("self-only-position-unchecked", &full).is_none());
        let tbt = fires_in("tbt-graph", &f).expect("tbt-graph");
        assert_eq!(tbt.also, vec![(Verdict::PositionMismatch, 0.5)]);
    }

    #[test]
    fn tbt_graph_from_its_control_unless_a_position_explains_it() {
        let f = RingFacts {
            positions: Some(positions(0.5, 0, 0.5)),
            ..self_only_broken()
        };
        let c = fires_in("tbt-graph", &f).expect("fires");
        assert_eq!(c.confidence, 0.9);
        assert_eq!(
            c.evidence,
            ["tbt graph: self-only steps (no cache read) reach only 0.5000 mean cosine against the reference"]
        );
        let mild = RingFacts {
            selfmask: Some(rows(0.92, 0.9, 4)),
            ..healthy_facts()
        };
        assert_eq!(
            fires_in("tbt-graph", &mild).map(|c| c.confidence),
            Some(0.7)
        );
        let hit = RingFacts {
            positions: Some(positions(0.5, 1, 0.99)),
            ..self_only_broken()
        };
        assert!(fires_in("tbt-graph", &hit).is_none());
        assert!(fires_in("tbt-graph", &healthy_facts()).is_none());
    }

    #[test]
    fn cache_quantization_names_the_rings() {
        let f = RingFacts {
            quant: quant(&[1, 3]),
            ..healthy_facts()
        };
        let id = "graph-cache-quantization";
        let c = fires_in(id, &f).expect("fires");
        assert_eq!(
            c.evidence,
            ["→ cache-quantization: 2 of 4 caches (only V rings (all layers)) declare different quant infos for writer and reader (scale ratio up to 1.500)"]
        );
        assert!(fires_in(id, &healthy_facts()).is_none());
    }

    #[test]
    fn graph_end_stops_only_after_a_cause_and_without_tbt() {
        let mut e = Engine::new();
        e.apply(GRAPH_END, &healthy_facts());
        assert!(!e.stopped());
        assert!(fires_in("graph-stop", &healthy_facts()).is_some());
        let mut e = Engine::new();
        e.apply(PREFILL_GRAPH, &prefill_broken());
        e.apply(GRAPH_END, &prefill_broken());
        assert!(e.stopped());
        assert_eq!(
            e.fired(),
            ["prefill-graph", "prefill-only-mask", "graph-stop"]
        );
        let no_tbt = RingFacts {
            has_tbt: false,
            selfmask: None,
            ..healthy_facts()
        };
        assert!(fires_in("no-tbt", &no_tbt).is_some());
        assert!(fires_in("no-tbt", &healthy_facts()).is_none());
    }

    #[test]
    fn first_layer_k_rotated_needs_failing_rows_and_an_explaining_rotation() {
        let f = RingFacts {
            kvdiff: Some(kvdiff_rotation(true, 0)),
            ..prefill_broken()
        };
        let c = fires_in("first-layer-k-rotated", &f).expect("fires");
        assert!(c.evidence[0].starts_with("→ position-mismatch: layer 0's K"));
        let unexplained = RingFacts {
            kvdiff: Some(kvdiff_rotation(false, 0)),
            ..prefill_broken()
        };
        assert!(fires_in("first-layer-k-rotated", &unexplained).is_none());
        // the rows pass: the rotation alone names nothing
        let passing = RingFacts {
            kvdiff: Some(kvdiff_rotation(true, 0)),
            ..healthy_facts()
        };
        assert!(fires_in("first-layer-k-rotated", &passing).is_none());
        // learned positions ship no theta table: the check does not apply
        let learned = RingFacts {
            rope_table: false,
            ..f
        };
        assert!(fires_in("first-layer-k-rotated", &learned).is_none());
    }
}
