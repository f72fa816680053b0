//! `diagnose` on a stateful device (issue 9): the runtime-kind gate of [`crate::diagnose`] sends
//! a `RuntimeKind::Stateful` device here. Ring-specific probes say why they do not apply; the
//! rules (docs/diagnosis.md "Stateful devices") run in this order:
//!
//! 1. the prompt after a reset depends on the request before it (back-to-back) → stale-cache;
//! 2. non-finite logits or states after the prompt's prefill → numeric-overflow;
//! 3. the prefill wrote other slots than `0..n` → cache-offset;
//! 4. prefill and greedy agree with the reference → healthy;
//! 5. reference K/V written in `[ctx, kv_heads, d]` reproduce the reference and the documented
//!    order does not → cache-layout-mismatch;
//! 6. a self-only step misses the reference token alone → mask-convention (the mask input is not
//!    applied as 0 / −inf);
//! 7. otherwise unknown.

use kvprobe_schema::{NotApplicable, ProbeFindings, Timing, Verdict};

use crate::diagnose::{DiagnoseOptions, Diagnosis};
use crate::session::Session;
use crate::thresholds::*;
use crate::{greedy, prefill, selfmask, statecheck, Result};

/// Probes that need the genai ring, with the reason (reported, never skipped silently).
pub const NOT_APPLICABLE: &[(&str, &str)] = &[
    ("quant", "the states and inputs are fp16/f32 without quant infos; there is nothing to compare"),
    ("colmap", "single-key columns of a ring window; a stateful device's mask columns are absolute positions (the layout and mask state checks cover this)"),
    ("ztap", "the device exposes no graph taps"),
    ("maskconv", "the uint8 mask conventions of the genai server; the fp16 additive mask is checked by the self-only state check"),
    ("positions", "ring read-offset/position wiring; positions are absolute inputs of every run"),
    ("layout", "ring entry layouts written by the prefill group; the state layout check writes reference K/V in both state orders instead"),
    ("inject", "golden ring windows at a read offset; the state layout check injects reference K/V into the states instead"),
    ("stale", "ring slots outside the read window; the back-to-back rerun of the prefill check covers stale state"),
    ("causality", "ring entries by slot; stateful slots are positions, checked by the occupancy state check"),
    ("splits", "the handover between the genai prefill and tbt groups at every split; one graph serves both here (chunk continuation is the chunked-prefill property of npu/tests/ane_sim.rs)"),
];

fn na() -> Vec<NotApplicable> {
    NOT_APPLICABLE
        .iter()
        .map(|(p, why)| NotApplicable {
            probe: p.to_string(),
            why: format!("not applicable on a stateful device: {why}"),
        })
        .collect()
}

fn timed<T>(
    s: &mut Session,
    t: &mut Vec<Timing>,
    what: &str,
    f: impl FnOnce(&mut Session) -> Result<T>,
) -> Result<T> {
    crate::diagnose::timed(t, what, || f(s))
}

fn done(
    verdict: Verdict,
    confidence: f64,
    evidence: Vec<String>,
    probes: ProbeFindings,
    timings: Vec<Timing>,
) -> Diagnosis {
    crate::diagnose::finish(
        verdict,
        confidence,
        evidence,
        Vec::new(),
        Vec::new(),
        probes,
        timings,
    )
}

pub fn diagnose(s: &mut Session, opts: &DiagnoseOptions) -> Result<Diagnosis> {
    let mut t = Vec::new();
    let mut p = ProbeFindings {
        not_applicable: na(),
        ..Default::default()
    };
    let mut ev = vec![format!(
        "stateful device (max_ctx {}, max_query {}): {} ring probes not applicable (listed in the report)",
        s.describe().cache_len,
        s.describe().prefill_len,
        NOT_APPLICABLE.len()
    )];

    let bb = timed(s, &mut t, "back-to-back", statecheck::back_to_back)?;
    if !bb.identical {
        ev.push(match &bb.refused {
            Some(e) => format!(
                "back-to-back: the prompt after a reset was refused ({e}) although it fits the context alone: the previous request's state length was kept"
            ),
            None => format!(
                "back-to-back: the prompt after a reset gives different logits depending on the request before it (cosine {:.4})",
                bb.cosine
            ),
        });
        ev.push("→ the second request's logits depend on the first: the state is not reset between requests".into());
        return Ok(done(Verdict::StaleCache, 0.9, ev, p, t));
    }
    ev.push("back-to-back: the prompt after a reset gives bit-identical logits whatever request came before".into());

    // the back-to-back check left the device right after a reset and the prompt's prefill:
    // the states the overflow and occupancy checks read
    let ov = timed(s, &mut t, "overflow", |s| statecheck::overflow(s, &bb.last))?;
    let overflowed = !ov.logits_finite || ov.layer.is_some();
    p.overflow = Some(ov.clone());
    if overflowed {
        let at = match (ov.layer, ov.position) {
            (Some(l), Some(pos)) => format!("inside layer {l} at position {pos} (the first non-finite K/V is layer {} at position {pos})", l + 1),
            (Some(l), None) => format!("in layer {l} or the head (every state finite, logits not)"),
            _ => "in the graph".into(),
        };
        ev.push(format!(
            "overflow: the {}-token prefill produces inf/NaN {at}",
            ov.prompt_len
        ));
        for probe in ["prefill", "greedy", "selfmask", "state"] {
            p.not_applicable.push(NotApplicable {
                probe: probe.into(),
                why: "not run: the device's outputs are inf/NaN (numeric-overflow), comparisons would be NaN".into(),
            });
        }
        return Ok(done(Verdict::NumericOverflow, 0.95, ev, p, t));
    }
    ev.push(format!(
        "overflow: every state and the logits of the {}-token prefill are finite",
        ov.prompt_len
    ));

    // occupancy now, before other probes move the states
    let written = timed(s, &mut t, "occupancy", statecheck::written_positions)?;
    // fewer prefixes than on a ring device: no chunk-boundary remainder rule to cover
    let popts = prefill::PrefillOptions {
        max_rows: opts.prefill.max_rows.min(4),
    };
    let pf = timed(s, &mut t, "prefill", |s| prefill::run(s, &popts))?;
    ev.push(format!(
        "prefill: mean cosine {:.4} (min {:.4}, top-1 {:.0}%); the first prefix rerun after a reset: cosine {:.6}",
        pf.mean_cosine,
        pf.min_cosine,
        100.0 * pf.top1_agreement,
        pf.rerun_cosine
    ));
    p.prefill = Some(pf.clone());

    let gr = timed(s, &mut t, "greedy", |s| {
        greedy::run_with(s, opts.steps, Some(crate::diagnose::REFERENCE_TAIL))
    })?;
    ev.push(format!(
        "greedy: {} steps, mean cosine {:.4} (min {:.4}), top-1 {:.0}%",
        gr.steps.len(),
        gr.mean_cosine,
        gr.min_cosine,
        100.0 * gr.top1_agreement
    ));
    let pf_ok = pf.mean_cosine >= STAGE_MEAN_COSINE
        && pf.min_cosine >= STAGE_MIN_COSINE
        && (pf.top1_agreement >= PREFILL_TOP1 || pf.mean_cosine >= TOP1_IRRELEVANT_ABOVE);
    let gr_ok = gr.mean_cosine >= STAGE_MEAN_COSINE
        && gr.min_cosine >= STAGE_MIN_COSINE
        && (gr.top1_agreement >= GREEDY_TOP1 || gr.mean_cosine >= TOP1_IRRELEVANT_ABOVE);
    p.greedy = Some(gr);
    // the decode graph without the context: one-row runs whose mask allows only themselves
    let sm = timed(s, &mut t, "selfmask", |s| {
        selfmask::run(s, opts.selfmask_steps)
    })?;
    ev.push(format!(
        "selfmask: {} self-only steps, mean cosine {:.4} against the token alone",
        sm.steps.len(),
        sm.mean_cosine
    ));
    p.selfmask = Some(sm);

    let st = timed(s, &mut t, "state", |s| {
        statecheck::run(s, written, !(pf_ok && gr_ok))
    })?;
    let n = st.prompt_len;
    let expected: Vec<usize> = (0..n).collect();
    let written_ok = st.written == expected;
    ev.push(format!(
        "state: the prefill of {n} tokens wrote positions {}",
        ranges(&st.written)
    ));
    p.state = Some(st.clone());
    if !written_ok {
        ev.push(format!(
            "→ slice_update writes other slots than 0..{n}: the state positions are off"
        ));
        return Ok(done(Verdict::CacheOffset, 0.9, ev, p, t));
    }
    if pf_ok && gr_ok {
        ev.push("→ prefill, decode and the states agree with the reference".into());
        return Ok(done(Verdict::Healthy, 0.9, ev, p, t));
    }
    if let Some([doc, swapped]) = st.layout_cosines {
        ev.push(format!(
            "state layout: reference K/V written [kv_heads, ctx, d] → cosine {doc:.4}; [ctx, kv_heads, d] → {swapped:.4}"
        ));
        if swapped >= REPRODUCES_COSINE && swapped >= doc + REPAIR_MARGIN {
            ev.push("→ the attention reads the states as [ctx, kv_heads, d]".into());
            return Ok(done(Verdict::CacheLayoutMismatch, 0.9, ev, p, t));
        }
    }
    if let (Some(own), Some(full)) = (st.selfonly_cosine, st.full_cosine) {
        ev.push(format!(
            "mask: a self-only step against the token alone: cosine {own:.4}; the full-context step: {full:.4}"
        ));
        if own < REPRODUCES_COSINE {
            ev.push(
                "→ blocked columns still contribute: the additive mask is not applied as 0 / −inf"
                    .into(),
            );
            return Ok(done(Verdict::MaskConvention, 0.8, ev, p, t));
        }
    }
    Ok(done(Verdict::Unknown, 0.3, ev, p, t))
}

/// `0..4, 7` style list.
fn ranges(v: &[usize]) -> String {
    if v.is_empty() {
        return "none".into();
    }
    let mut out = Vec::new();
    let mut start = v[0];
    let mut prev = v[0];
    for &x in &v[1..] {
        if x != prev + 1 {
            out.push(if start == prev {
                format!("{start}")
            } else {
                format!("{start}..={prev}")
            });
            start = x;
        }
        prev = x;
    }
    out.push(if start == prev {
        format!("{start}")
    } else {
        format!("{start}..={prev}")
    });
    out.join(", ")
}
