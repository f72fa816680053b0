//! What a fit, a variant or a solved layout says about a fault (docs/diagnosis.md): each
//! predicate only *explains* a failing control, the rules check that the control failed.

use kvprobe_schema::{
    Layout, LayoutFinding, MaskVariant, MaskconvFinding, PositionsFinding, ScaleFit, ThetaCheck,
};

use super::facts::noise;
use crate::thresholds::*;

/// Rows or steps `(f32 vs matched, matched vs device)` leave the precision-matched reference:
/// over `MATCHED_GAP` on average, and at the median one by ≥ `PRECISION_RATIO` × the matched
/// reference's own miss (floored at `STEP_NOISE_FLOOR`) plus the graph's noise — or at one step
/// by ≥ `LONE_STEP_RATIO` × that and ≥ `LONE_STEP_GAP`. Per row,
/// because rounding amplifies at a few sensitive steps for the device and the matched reference
/// alike, while a fault moves every step.
pub fn leaves_matched(rows: &[(f64, f64)], graph_noise: f64) -> bool {
    if rows.is_empty() {
        return false;
    }
    let mean_miss = rows.iter().map(|&(_, md)| 1.0 - md).sum::<f64>() / rows.len() as f64;
    if mean_miss < MATCHED_GAP {
        return false;
    }
    let ratio =
        |&(rm, md): &(f64, f64)| (1.0 - md) / ((1.0 - rm).max(STEP_NOISE_FLOOR) + graph_noise);
    // one step far outside the precision where the matched reference itself sits on f32: a fault
    // that shows only at a few steps (a mask that differs from the ring's at the wrap)
    let lone = rows
        .iter()
        .any(|r| 1.0 - r.1 >= LONE_STEP_GAP && ratio(r) >= LONE_STEP_RATIO);
    let mut ratios: Vec<f64> = rows.iter().map(ratio).collect();
    ratios.sort_by(f64::total_cmp);
    lone || ratios[ratios.len() / 2] >= PRECISION_RATIO
}

/// The other theta convention repairs the single-chunk rows that the shipped one fails, to the
/// level a position repair must reach: a convention mismatch breaks every rotation and the
/// flipped table restores them all (SmolLM2 0.9999, the flat fixture 1.0000), while a graph
/// that repeats the KV heads in blocks was lifted from 0.516 to 0.966 by the flip alone.
pub fn theta_fault(t: &ThetaCheck) -> bool {
    t.other_cosine >= POSITION_REPRODUCES
        && noise(t.declared_cosine) >= THETA_REPAIR_RATIO * noise(t.other_cosine)
}

/// A position shift δ ≠ 0 reproduces the reference clearly better than the server's position
/// (by the lead, or by shrinking the miss `POSITION_FIT_RATIO`-fold), and better than any
/// attention scale.
pub fn position_fault(ps: &PositionsFinding) -> bool {
    ps.best_delta != 0
        && ps.best_cosine >= POSITION_REPRODUCES
        && (ps.best_cosine >= ps.baseline_cosine + POSITION_MARGIN
            || position_repairs(ps.baseline_cosine, ps.best_cosine))
        && scale_fault(ps).is_none_or(|f| f.best_cosine < ps.best_cosine)
}

/// The rule that names [`scale_fault`] (rules that rank after it name it).
pub const ATTENTION_SCALE: &str = "attention-scale";

/// Another attention scale reproduces the server-position first tbt step (positions' scale fit).
pub fn scale_fault(ps: &PositionsFinding) -> Option<&ScaleFit> {
    ps.scale.as_ref().filter(|f| {
        f.best_cosine >= POSITION_REPRODUCES && fit_repairs(f.unit_cosine, f.best_cosine)
    })
}

/// The best non-server mask convention that reproduces the reference (maskconv marks a variant
/// `reproduces` only when it beats the ring mask by the repair margin).
pub fn mask_variant_fault(mc: &MaskconvFinding) -> Option<&MaskVariant> {
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

/// Token-major data at a clean slot shift ≠ 0 (the prompt sits at other slots).
pub fn clean_shift(ly: &LayoutFinding, token_major: f64) -> bool {
    ly.writer_layout == Layout::TokenMajor
        && ly.writer_shift != 0
        && ly.writer_score >= LAYOUT_CLEAN
        && ly.writer_score >= token_major + LAYOUT_MARGIN
}

pub fn mean(it: impl Iterator<Item = f64>) -> f64 {
    let (s, n) = it.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 {
        0.0
    } else {
        s / n as f64
    }
}

pub fn pct(x: f64) -> String {
    format!("{:.0}%", 100.0 * x)
}
