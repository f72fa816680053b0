//! What the greedy and stage facts read off the precision-matched comparisons (matched.rs):
//! the summary results.json carries and the device's agreement with the matched reference.

use kvprobe_schema::{GreedyStep, MatchedStep, MatchedSummary};

use crate::metrics::{cosine, top1};

/// (mean, min, top-1 agreement) of the device against the precision-matched reference over
/// `points` = (its matched comparison, the device's top-1): None unless every point has one.
/// What a stage's facts read when the device declares a precision (the f32 reference's miss is
/// then the declared precision's cost, not the device's).
pub fn against_matched<'a>(
    points: impl Iterator<Item = (Option<&'a MatchedStep>, u32)>,
) -> Option<[f64; 3]> {
    let (mut sum, mut min, mut top1, mut n) = (0.0, f64::INFINITY, 0usize, 0usize);
    for (m, device_top1) in points {
        let m = m?;
        sum += m.matched_vs_device;
        min = min.min(m.matched_vs_device);
        // a flip by a gap the device's measured arithmetic moves agrees
        top1 += usize::from(m.matched_top1 == device_top1 || near_tie(m, device_top1));
        n += 1;
    }
    (n > 0).then(|| [sum / n as f64, min, top1 as f64 / n as f64])
}

/// The greedy finding's summary of the matched comparisons; `precision` says what was rounded.
pub(crate) fn summary(
    precision: String,
    fp16_overflow: Option<String>,
    steps: &[GreedyStep],
) -> MatchedSummary {
    let tbt: Vec<&MatchedStep> = steps
        .iter()
        .skip(1)
        .filter_map(|s| s.matched.as_ref())
        .collect();
    let mean = |f: fn(&MatchedStep) -> f64| {
        (!tbt.is_empty()).then(|| tbt.iter().map(|m| f(m)).sum::<f64>() / tbt.len() as f64)
    };
    MatchedSummary {
        precision,
        fp16_overflow,
        tbt_reference_vs_matched: mean(|m| m.reference_vs_matched),
        tbt_matched_vs_device: mean(|m| m.matched_vs_device),
        min_matched_vs_device: steps
            .iter()
            .filter_map(|s| s.matched.map(|m| m.matched_vs_device))
            .fold(1.0, f64::min),
    }
}

/// The three-way comparison of one position: matched logits against the f32 reference and the
/// device.
pub fn step(matched: &[f32], reference: &[f32], device: &[f32]) -> MatchedStep {
    let (mt, dt) = (top1(matched), top1(device));
    MatchedStep {
        reference_vs_matched: cosine(matched, reference),
        matched_vs_device: cosine(device, matched),
        matched_top1: mt,
        band: precision_band(matched, reference),
        matched_margin: gap(matched, mt, dt),
        jitter: None,
        stray: None,
    }
}

/// `logits[a] − logits[b]` (0 when either index is outside the row or the two agree).
fn gap(logits: &[f32], a: u32, b: u32) -> f64 {
    match (logits.get(a as usize), logits.get(b as usize)) {
        (Some(x), Some(y)) if a != b => f64::from(x - y),
        _ => 0.0,
    }
}

/// How far the declared precision moves the gap between two logits at one step: twice the
/// 99.9th percentile of |matched − f32| over the vocabulary (the largest few are the outliers of
/// one vocabulary entry, not the typical pair a flip involves).
pub(crate) fn precision_band(matched: &[f32], reference: &[f32]) -> f64 {
    let mut d: Vec<f32> = matched
        .iter()
        .zip(reference)
        .map(|(x, y)| (x - y).abs())
        .filter(|x| x.is_finite())
        .collect();
    if d.is_empty() {
        return 0.0;
    }
    let k = ((d.len() as f64) * BAND_QUANTILE) as usize;
    let k = k.min(d.len() - 1);
    let (_, v, _) = d.select_nth_unstable_by(k, f32::total_cmp);
    2.0 * *v as f64
}

const BAND_QUANTILE: f64 = 0.999;

/// The device's top-1 differs from the matched reference's by a gap that the device's measured
/// arithmetic moves (its control's band): a near tie, counted as agreement (as the chat counts a
/// flip inside the declared band, `chat::against_matched`).
pub(crate) fn near_tie(m: &MatchedStep, device_top1: u32) -> bool {
    m.matched_top1 != device_top1 && m.stray.is_some_and(|s| m.matched_margin <= s.band)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::matched_step as step;
    use kvprobe_schema::DeviceStray;

    /// A flip by a gap of 0.3 is a near tie where the control's band is 0.5, not where it is
    /// 0.2, and never without a control (the declared band of 6 is not this rule's).
    #[test]
    fn a_flip_inside_the_measured_band_is_a_near_tie() {
        let at = |b: f64| {
            step(
                Some(0.999),
                Some(DeviceStray {
                    cosine: 0.98,
                    band: b,
                }),
            )
        };
        assert!(near_tie(&at(0.5), 3));
        assert!(!near_tie(&at(0.2), 3));
        assert!(!near_tie(&at(0.5), 7));
        assert!(!near_tie(&step(Some(0.999), None), 3));
    }
}
