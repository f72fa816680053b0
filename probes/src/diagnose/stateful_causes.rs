//! The causes of the stateful rules ([`super::stateful::TABLE`]): each reads the
//! [`StatefulFacts`] and says whether its rule fires, with the evidence line it prints.

use kvprobe_schema::Verdict;

use super::engine::Cause;
use super::evidence::beats_healthy;
use super::stateful_facts::StatefulFacts;
use crate::statecheck;
use crate::thresholds::*;

/// Identical inputs down to the states, different outputs: nothing before the request explains it.
pub(super) fn nondeterministic(f: &StatefulFacts) -> Option<Cause> {
    super::repeat::nondeterministic(f.repeat.as_ref()?)
}

pub(super) fn stale_cache(f: &StatefulFacts) -> Option<Cause> {
    if f.back_to_back_identical {
        return None;
    }
    let first = match &f.back_to_back_refused {
        Some(e) => format!(
            "back-to-back: the prompt after a reset was refused ({e}) although it fits the context alone: the previous request's state length was kept"
        ),
        None => format!(
            "back-to-back: the prompt after a reset gives different logits depending on the request before it (cosine {:.4})",
            f.back_to_back_cosine
        ),
    };
    Some(Cause::new(0.9).line(first).line(
        "→ the second request's logits depend on the first: the state is not reset between requests",
    ))
}

/// A layer whose output at position p is non-finite shows as non-finite K/V of the next layer.
pub(super) fn numeric_overflow(f: &StatefulFacts) -> Option<Cause> {
    let ov = f.overflow.as_ref().filter(|_| f.overflowed())?;
    Some(Cause::new(0.95).line(statecheck::overflow_evidence(ov)))
}

/// The prefill wrote only positions inside `0..n`, from 0, and left some unwritten: rows were
/// dropped (a graph that takes fewer query rows, or a state shorter than declared, issue 20),
/// not moved (an offset writes outside `0..n`).
pub(super) fn state_holes(f: &StatefulFacts) -> Option<Cause> {
    let st = f.state.as_ref()?;
    let n = st.prompt_len;
    let inside = st.written.first() == Some(&0) && st.written.iter().all(|&p| p < n);
    (inside && st.written.len() < n).then(|| {
        Cause::new(0.85).line(format!(
            "→ capacity-overflow: the prefill of {n} tokens wrote {} positions, all inside 0..{n}, and left {} unwritten: the device dropped rows it was given and said nothing",
            st.written.len(),
            n - st.written.len()
        ))
    })
}

pub(super) fn state_offset(f: &StatefulFacts) -> Option<Cause> {
    let n = f.state.as_ref()?.prompt_len;
    (f.written_ok() == Some(false)).then(|| {
        Cause::new(0.9).line(format!(
            "→ slice_update writes other slots than 0..{n}: the state positions are off"
        ))
    })
}

pub(super) fn healthy(f: &StatefulFacts) -> Option<Cause> {
    let states_ok = f.written_ok().unwrap_or(f.state.is_none());
    (states_ok && f.prefill_ok() && f.greedy_ok()).then(|| {
        Cause::new(0.9).line(if f.state.is_some() {
            "→ prefill, decode and the states agree with the reference"
        } else {
            "→ prefill and decode agree with the reference (the states are not readable on this device: judged by its outputs only)"
        })
    })
}

/// The device computes what its declared fp16 arithmetic computes (the matched reference, which
/// overflows fp16 inside the graph, reproduces it) and the f32 reference does not: the graph
/// overflows fp16, not the device's K/V path (issue 36; the control is the same graph without the
/// overflow, healthy).
pub(super) fn fp16_overflow(f: &StatefulFacts) -> Option<Cause> {
    let (at, g) = f.fp16_overflow.as_ref()?;
    (f.prefill_ok() && f.greedy_ok() && !f.f32_greedy_ok()).then(|| {
        Cause::new(0.9).line(format!(
            "→ {at}: the fp16 reference reproduces the device (greedy matched) where the f32 reference does not (greedy mean cosine {:.4}, top-1 {:.0}%)",
            g[0],
            100.0 * g[2]
        ))
    })
}

pub(super) fn state_layout_cosines(f: &StatefulFacts) -> Option<Cause> {
    let [doc, swapped] = f.state.as_ref()?.layout_cosines?;
    Some(Cause::note(format!(
        "state layout: reference K/V written [kv_heads, ctx, d] → cosine {doc:.4}; [ctx, kv_heads, d] → {swapped:.4}"
    )))
}

/// The swapped state order reproduces the reference and beats the documented one.
pub(super) fn state_layout(f: &StatefulFacts) -> Option<Cause> {
    let [doc, swapped] = f.state.as_ref()?.layout_cosines?;
    (swapped >= REPRODUCES_COSINE && swapped >= doc + REPAIR_MARGIN)
        .then(|| Cause::new(0.9).line("→ the attention reads the states as [ctx, kv_heads, d]"))
}

pub(super) fn declared_quant(f: &StatefulFacts) -> Option<Cause> {
    let what = f.declared_quant_mismatch.as_ref()?;
    Some(Cause::new(0.9).line(format!(
        "→ the cache's edges declare different element types or quantisations ({what}): the runner reads the cache in another format than the graph writes it"
    )))
}

/// `(δ, cosine)` of the best shift δ ≠ 0 and the cosine at δ = 0.
pub(super) fn best_shift(f: &StatefulFacts) -> Option<((i64, f64), f64)> {
    let shifts = f.state.as_ref()?.position_cosines.as_ref()?;
    let zero = shifts.iter().find(|s| s[0] == 0.0)?[1];
    let best = shifts
        .iter()
        .filter(|s| s[0] != 0.0)
        .max_by(|a, b| a[1].total_cmp(&b[1]))?;
    Some(((best[0] as i64, best[1]), zero))
}

pub(super) fn position_cosines(f: &StatefulFacts) -> Option<Cause> {
    let ((d, c), zero) = best_shift(f)?;
    Some(Cause::note(format!(
        "positions: the first decode step against the reference with its query at n + δ: best δ = {d:+} → cosine {c:.4}; δ = 0 → {zero:.4}"
    )))
}

/// A shifted query reproduces the first decode step at the position level, beats the documented
/// position, and passes the rule of evidence (`evidence::beats_healthy`) at that step's declared
/// precision. The level and margin against f32 alone called a healthy fp16 ANE emulator's
/// sensitive step a shift (SmolLM2, max-ctx 25, a 5-token prompt: δ = +2 at 0.9750 against
/// 0.9612 at δ = 0, while the precision-matched reference is closer to the device than either).
/// The rule of evidence alone is not enough here: its band adds the cache-free controls' miss,
/// which a fault that breaks the prefill itself inflates (`win-mask-all-valid` on SmolLM2: a band
/// of 0.44 let δ = −4 at 0.936 through).
pub(super) fn state_position(f: &StatefulFacts) -> Option<Cause> {
    let ((d, c), zero) = best_shift(f)?;
    let (healthy, precision) = first_step_band(f, zero);
    let level = c >= POSITION_REPRODUCES && c >= zero + POSITION_MARGIN;
    (level && beats_healthy(1.0 - c, healthy, precision)).then(|| {
        Cause::new(0.85).line(format!(
            "→ the decode step runs at position n {d:+}: the position ids fed to the graph are off (query at n {d:+} misses the device by {:.1e}, the healthy hypothesis by {healthy:.1e}, the declared precision {precision:.1e})",
            1.0 - c
        ))
    })
}

/// The healthy hypothesis' miss at the first decode step and that step's declared precision:
/// the precision-matched reference against the device, and its own miss against f32 floored at
/// `STEP_NOISE_FLOOR` (the shifted queries are f32 runs), plus the graph's noise; without a
/// greedy comparison, the f32 reference at δ = 0 and the floor.
fn first_step_band(f: &StatefulFacts, zero: f64) -> (f64, f64) {
    let noise = f.graph_noise.max(REL_NOISE_FLOOR);
    match f.greedy_steps.first() {
        Some(&(rm, md)) => (1.0 - md, (1.0 - rm).max(STEP_NOISE_FLOOR) + noise),
        None => (1.0 - zero, STEP_NOISE_FLOOR + noise),
    }
}

pub(super) fn mask_cosines(f: &StatefulFacts) -> Option<Cause> {
    let st = f.state.as_ref()?;
    let (own, full) = (st.selfonly_cosine?, st.full_cosine?);
    let control = st.selfonly_control.map_or(String::new(), |[c, d]| {
        format!("; the same self-only feed on the device's control (the graph on the CPU EP, not the device): {c:.4} against the token alone, the device {d:.4} against it")
    });
    let fit = st.selfonly_fit.as_ref().map_or(String::new(), |fit| {
        let each: Vec<String> = fit
            .hypotheses
            .iter()
            .map(|h| {
                let c = h
                    .control_miss
                    .map_or(String::new(), |m| format!(", the control's row {m:.1e}"));
                let over = if h.device_step {
                    "the device's own full-context step".to_string()
                } else {
                    scope(h.empty)
                };
                format!("bias {:+} over {over} → miss {:.1e}{c}", h.bias, h.miss)
            })
            .collect();
        format!(
            "; mask hypotheses replayed on the reference for the same feed (misses against the device's row): {}; the token alone {:.1e}",
            each.join(", "),
            fit.healthy_miss
        )
    });
    Some(Cause::note(format!(
        "mask: a self-only step against the token alone: cosine {own:.4}; the full-context step: {full:.4}{control}{fit}"
    )))
}

fn scope(empty: usize) -> String {
    if empty == 0 {
        "the written slots".into()
    } else {
        format!("the whole state ({empty} empty slots)")
    }
}

/// Blocked columns still contribute: the self-only step replayed on the reference under a mask
/// hypothesis (`crate::selfonly_fit`: what the blocked columns get instead of −inf, over which
/// columns) reproduces the device's self-only row by the rule of evidence
/// (`evidence::beats_healthy`) against the healthy hypothesis, the token alone on the same
/// reference, at the row's declared precision (the token alone at that precision against f32,
/// floored). Where the device runs a control (`StateFinding::selfonly_control`), the device's
/// distance from the control's row is its own arithmetic on this feed (QNN HTP's QDQ kernels,
/// docs/qnn.md) and joins the precision, and the control's row is the graph's: a mask fault of
/// the graph is computed there too, so the hypothesis must reproduce the control's row by the
/// same rule at the declared precision alone, or the control contradicts it.
pub(super) fn self_only_mask(f: &StatefulFacts) -> Option<Cause> {
    let st = f.state.as_ref()?;
    let fit = st.selfonly_fit.as_ref()?;
    let best = fit
        .hypotheses
        .iter()
        .min_by(|a, b| a.miss.total_cmp(&b.miss))?;
    // the row's declared precision: its own cost (the token alone at the declared precision
    // against f32), floored; the device's row is judged on the first decode step's footing, as
    // `state-position`'s is (that step's band plus the graph's noise: the emulated ANE's fp16
    // softmax over 128 columns, which the fp16 reference does not compute, puts SmolLM2
    // `ane-mask-01`'s replay 1.8e-4 from its row)
    let declared = fit.declared.max(STEP_NOISE_FLOOR);
    let stray = st.selfonly_control.map_or(0.0, |[_, d]| 1.0 - d);
    let precision = declared.max(first_step_band(f, 1.0).1) + stray;
    let control = match (st.selfonly_control, best.control_miss) {
        (None, _) => Some(String::new()),
        (Some([c, _]), Some(m)) => beats_healthy(m, 1.0 - c, declared).then(|| {
            format!(
                "; the control's row (the graph on the CPU EP) too: miss {m:.1e} against the token alone's {:.1e}",
                1.0 - c
            )
        }),
        (Some(_), None) => None,
    };
    let control = control.filter(|_| beats_healthy(best.miss, fit.healthy_miss, precision))?;
    let stray_said = st.selfonly_control.map_or(String::new(), |_| {
        format!(" with the device's stray from its control {stray:.1e}")
    });
    Some(
        Cause::new(0.8)
            .line(format!(
                "→ blocked columns still contribute, the mask is not applied as 0 / −inf: {} ({}) reproduces the self-only row: miss {:.1e} against the healthy hypothesis' (the token alone) {:.1e}, the declared precision {declared:.1e}, on the first decode step's footing {precision:.1e}{stray_said}{control}",
                crate::selfonly_fit::describe(best),
                crate::selfonly_fit::grammar_row(best.bias, best.empty),
                best.miss,
                fit.healthy_miss
            ))
            .line(format!(
                "→ the hypothesis on the float32 reference, over the prompt's K/V as the reference writes them: `{}`",
                crate::selfonly_fit::command(fit, best)
            )),
    )
}

pub(super) fn output_fit_line(f: &StatefulFacts) -> Option<Cause> {
    Some(Cause::note(f.output_fit.as_ref()?.line()))
}

/// The device's greedy run is what the reference computes with the runs after the prompt fed
/// `verdict`'s wrong wiring, within the declared precision and clearly closer than healthy.
pub(super) fn output_wiring(f: &StatefulFacts, verdict: Verdict) -> Option<Cause> {
    let fit = f.output_fit.as_ref()?;
    let cause = fit.cause().filter(|_| fit.wiring.verdict() == verdict)?;
    Some(Cause::new(0.85).line(format!("→ {cause}")))
}

pub(super) fn output_position(f: &StatefulFacts) -> Option<Cause> {
    output_wiring(f, Verdict::PositionMismatch)
}

pub(super) fn output_mask(f: &StatefulFacts) -> Option<Cause> {
    output_wiring(f, Verdict::MaskConvention)
}

/// By elimination: the graph alone is right (a self-only step matches the token alone), the
/// positions are (no shift reproduces), the slots written are, yet the reference K/V written in
/// the documented order do not repair the step: the graph reads the state in another arrangement
/// than the host keeps it (the ONNX `win-k-layout` fault: K `[H, 1, D, T]` copied as
/// `[H, 1, T, D]`, which no order the experiment writes undoes).
pub(super) fn state_reader(f: &StatefulFacts) -> Option<Cause> {
    let st = f.state.as_ref()?;
    let [doc, _] = st.layout_cosines?;
    let own = st.selfonly_cosine?;
    let ((_, shifted), _) = best_shift(f)?;
    (f.written_ok() == Some(true)
        && own >= REPRODUCES_COSINE
        && doc < REPRODUCES_COSINE
        && shifted < POSITION_REPRODUCES)
        .then(|| {
            Cause::new(0.6).line(format!(
                "→ by elimination: the step alone is right (self-only {own:.4}), the slots and positions are, but reference K/V in the documented order do not repair it ({doc:.4}): the graph reads the state in another layout than the host writes it"
            ))
        })
}

pub(super) fn host_feed_line(f: &StatefulFacts) -> Option<Cause> {
    Some(Cause::note(f.host_feed.as_ref()?.line()))
}

/// The device computes what its host's declared feed gives (`crate::host_feed`): GenAI's
/// windowed rules take a first-window prompt token equal to `pad_token_id` for a pad, and the
/// request replayed on the precision-matched reference under that feed reproduces the device
/// within the declared precision, clearly closer than healthy.
pub(super) fn host_feed(f: &StatefulFacts) -> Option<Cause> {
    let h = f.host_feed.as_ref().filter(|h| h.reproduces())?;
    let m = h.misses;
    let toks: Vec<String> = h
        .pad_valued
        .iter()
        .map(|&i| format!("prompt token {i} (id {})", h.seq[i]))
        .collect();
    Some(
        Cause::new(0.85)
            .line(format!(
                "→ the host feeds {} as a pad: its id is pad_token_id {} and it sits in the first window (W {}); position 0 and masked (GenAI's WindowedPositionInputs::Update, W2), so the device computes another function than the model from token {} on",
                toks.join(", "),
                h.pad_token,
                h.window,
                h.first_departure
            ))
            .line(format!(
                "→ the request replayed on the precision-matched reference under that feed reproduces the device: median miss {:.1e} (worst step {:.1e}) against the healthy hypothesis' {:.1e} (worst {:.1e}), the declared precision with the graph's noise {:.1e}",
                m.miss, m.worst, m.healthy_miss, m.healthy_worst, m.precision
            )),
    )
}

pub(super) fn host_writer_line(f: &StatefulFacts) -> Option<Cause> {
    Some(Cause::note(f.host_writer.as_ref()?.line()))
}

/// The device computes what the host's runs give when each prompt window's presents are stored
/// rolled (`crate::host_slots`): the host's runs replayed at the slot level on the
/// precision-matched reference, each window's presents rolled by r, reproduce the device within
/// the declared precision, clearly closer than healthy.
pub(super) fn host_writer(f: &StatefulFacts) -> Option<Cause> {
    let h = f.host_writer.as_ref().filter(|h| h.reproduces())?;
    let m = h.misses;
    Some(
        Cause::new(0.85)
            .line(format!(
                "→ the cache is written at the wrong position: {}",
                h.what()
            ))
            .line(format!(
                "→ the host's runs replayed at the slot level with that write reproduce the device: median miss {:.1e} (worst step {:.1e}) against the healthy hypothesis' {:.1e} (worst {:.1e}), the declared precision {:.1e}",
                m.miss, m.worst, m.healthy_miss, m.healthy_worst, m.precision
            )),
    )
}
