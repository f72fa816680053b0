//! The device's own arithmetic, measured by its control (issue 36): where a device runs the same
//! graph on a control with the same feeds (`Device::control_logits`: QNN HTP's QDQ graph on the
//! CPU EP, whose float32 Q/DQ arithmetic the matched reference models), each compared row's
//! distance from the control (`MatchedStep::stray`) is how far the device's kernels take it from
//! the graph as written, and the control's distance from the matched reference
//! (`MatchedStep::control_vs_matched`) is how far the graph as the control computes it departs
//! from the healthy hypothesis. A fault of the graph or of the host's feed is what the device and
//! its control share; so where a control ran the graph is judged by the control against the
//! matched reference at that reference's own band (`crate::footing::judged`), and the device by
//! its distance from the control (the stage floors, [`judged`]). A fault of the device's own
//! kernels is inside its stray by construction.

use kvprobe_npu::Device;
use kvprobe_reference::Model;
use kvprobe_schema::{DeviceDescription, DeviceStray, GreedyStep, MatchedStep};

use crate::matched::{greedy_logits_shared, DriveMemo, Precision};
use crate::matched_summary::{agreement, precision_band};
use crate::metrics::cosine;
use crate::thresholds::STEP_NOISE_FLOOR;
use crate::Result;

/// The device's logits against its control's for the same run.
fn stray(device: &[f32], control: &[f32]) -> DeviceStray {
    DeviceStray {
        cosine: cosine(device, control),
        band: precision_band(device, control),
    }
}

/// Sets `m.stray` (the device against its control) and `m.control_vs_matched` (the control
/// against `matched`, the matched reference's logits of the same row), where a control ran.
pub fn fill(dev: &dyn Device, device: &[f32], matched: &[f32], m: &mut MatchedStep) {
    if let Some(control) = dev.control_logits(device) {
        m.stray = Some(stray(device, &control));
        m.control_vs_matched = Some(cosine(&control, matched));
    }
}

/// [`fill`] on every greedy step with a matched comparison (`device[i]` is step i's logits, the
/// prompt `seq[..n]`): the matched logits come from this session's memo (`matched::three_way`
/// drove them).
pub fn fill_steps(
    dev: &dyn Device,
    memo: (&Model, &DriveMemo),
    at: (&DeviceDescription, &[u32], usize),
    device: &[Vec<f32>],
    steps: &mut [GreedyStep],
) -> Result<()> {
    let positions: Vec<usize> = (0..device.len()).map(|i| at.2 - 1 + i).collect();
    fill_at(dev, memo, at, &positions, device, steps)
}

/// [`fill_steps`] for steps compared at `positions` only (rising, each ≥ `n − 1`: a chat's
/// rows, as `matched::three_way_at` compares them).
pub fn fill_at(
    dev: &dyn Device,
    (model, memo): (&Model, &DriveMemo),
    (desc, seq, n): (&DeviceDescription, &[u32], usize),
    positions: &[usize],
    device: &[Vec<f32>],
    steps: &mut [GreedyStep],
) -> Result<()> {
    let ran = device.first().and_then(|d| dev.control_logits(d)).is_some();
    let precision = match ran {
        true => Precision::of(desc, model)?,
        false => None,
    };
    let (Some(p), Some(&last)) = (precision, positions.last()) else {
        return Ok(());
    };
    let geometry = (n, last + 2 - n, desc.cache_len, desc.prefill_len);
    let matched = greedy_logits_shared((memo, model), &p, seq, geometry)?;
    for ((st, logits), &pos) in steps.iter_mut().zip(device).zip(positions) {
        if let (Some(m), Some(row)) = (st.matched.as_mut(), matched.get(pos + 1 - n)) {
            fill(dev, logits, row, m);
        }
    }
    Ok(())
}

/// Each step judged as the device's own arithmetic (the chat's rows): its cosine the device's
/// against its control, its top-1 left agreeing (a flip is judged against the matched
/// reference); `None` unless every step has a control.
pub fn against_control(steps: &[GreedyStep]) -> Option<Vec<GreedyStep>> {
    steps
        .iter()
        .map(|st| {
            let stray = st.matched?.stray?;
            let mut st = st.clone();
            st.comparison.cosine = stray.cosine;
            st.comparison.top1_match = true;
            st.near_tie = false;
            Some(st)
        })
        .collect()
}

/// What a stage's floors read where the device runs a control at every compared point, and the
/// evidence that says so.
pub struct Judged {
    /// The worse of the graph's and the device's (mean, min, top-1): the floors pass only if
    /// both pass.
    pub floors: [f64; 3],
    pub lines: Vec<String>,
}

/// With a control at every point `(position, matched comparison, the device's top-1)`: the
/// graph judged by the control against the matched reference, the device's own arithmetic by
/// the device against its control (`stray`), each as (mean, min, top-1 of the device against the
/// matched reference, a flip inside the stray's band agreeing). A row where the control leaves
/// the matched reference beyond that reference's own band (`footing::own_band`: the jitter's
/// spread under `jitter`) is a row the matched reference does not model as the graph computes
/// it, or a graph fault: it is judged as the control shows it and listed, never set aside.
pub fn judged(points: &[(usize, &MatchedStep, u32)], jitter: bool, what: &str) -> Option<Judged> {
    let pts = || points.iter().map(|&(_, m, t)| (Some(m), t));
    let graph = agreement(pts(), |m| m.control_vs_matched)?;
    let device = agreement(pts(), |m| m.stray.map(|s| s.cosine))?;
    let mut lines = vec![format!(
        "{what}, judged with the device's control (the same graph on ONNX Runtime's CPU EP with the same feeds, never reported as the device): the graph (the control against the precision-matched reference) mean cosine {:.4} (min {:.4}); the device's own arithmetic (the device against its control) mean {:.4} (min {:.4}); top-1 {:.0}% (the device against the matched reference)",
        graph[0],
        graph[1],
        device[0],
        device[1],
        100.0 * graph[2]
    )];
    for &(position, m, _) in points {
        // the band floored as the per-row test floors it (`ring::fits::leaves_matched`)
        let own = crate::footing::own_band(m, jitter).min(1.0 - STEP_NOISE_FLOOR);
        let c = m.control_vs_matched;
        let Some(c) = c.filter(|&c| c < own) else {
            continue;
        };
        let of = match m.jitter.filter(|_| jitter) {
            Some(_) => "its jitter",
            None => "its cost against f32",
        };
        lines.push(format!(
            "{what} at position {position}: the control leaves the precision-matched reference beyond that reference's own band ({of} {own:.4}): the control {c:.4}, the device {:.4} against its control and {:.4} against the matched reference, the matched reference {:.4} against f32; a row the matched reference does not model as the graph computes it, or a graph fault: judged as the control shows it, not set aside",
            m.stray.map_or(f64::NAN, |s| s.cosine),
            m.matched_vs_device,
            m.reference_vs_matched,
        ));
    }
    let floors = [0, 1, 2].map(|i| graph[i].min(device[i]));
    Some(Judged { floors, lines })
}

/// The stage floors' reading where a control ran: each floor reads the better of `direct` (the
/// device against the matched reference) and `through` (the graph by its control, the device by
/// its stray: [`Judged`]). Both are the healthy hypothesis computed two ways, and a fault of the
/// graph shows in both (the control computes it too), so each floor takes the healthy
/// hypothesis' better account; never worse than either alone. "Give me three tips for better
/// sleep." on HTP needs the control's (the device 0.8173 from the matched reference on a
/// saturated row is its stray 0.8793 on a control at 0.9926); "The capital of France is" needs
/// the direct one (its last prefill row: the device 0.9829 from the matched reference, the
/// control 0.8541 and the device 0.7880 from the control, on a row whose jitter is 0.7923).
pub fn better_explained(direct: [f64; 3], through: [f64; 3]) -> [f64; 3] {
    [0, 1, 2].map(|i| direct[i].max(through[i]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::matched_step as step;

    /// Misses add: a jitter spread of 1e-3 and a stray of 2e-2 give a band of 1 − 2.1e-2; without
    /// a control the band is the spread alone, and without the jitter the cost against f32.
    #[test]
    fn the_band_adds_the_measured_stray_to_the_spread() {
        let stray = DeviceStray {
            cosine: 0.98,
            band: 0.5,
        };
        let band = crate::footing::band;
        assert!((band(&step(Some(0.999), Some(stray)), true) - 0.979).abs() < 1e-12);
        assert!((band(&step(Some(0.999), None), true) - 0.999).abs() < 1e-12);
        assert!((band(&step(Some(0.999), None), false) - 0.99).abs() < 1e-12);
        assert!((band(&step(None, Some(stray)), true) - 0.97).abs() < 1e-12);
    }

    /// The floors take the healthy hypothesis' better account of the device's worst row: the
    /// recorded prefill of "The capital of France is" (direct mean 0.9914, min 0.9829; through
    /// the control, the worse of the graph and the stray: 0.9453, 0.7880) and the greedy of
    /// "Give me three tips for better sleep." (direct min 0.8173; through 0.8793).
    #[test]
    fn the_floors_read_the_better_of_the_two_accounts() {
        let france = better_explained([0.9914, 0.9829, 1.0], [0.9453, 0.7880, 1.0]);
        assert_eq!(france, [0.9914, 0.9829, 1.0]);
        let sleep = better_explained([0.9505, 0.8173, 1.0], [0.9657, 0.8793, 1.0]);
        assert_eq!(sleep, [0.9657, 0.8793, 1.0]);
    }

    /// The greedy steps of SmolLM2 QDQ on HTP, "Give me three tips for better sleep." as recorded
    /// (/work/s30/qdqp17, positions 7–10: matched_vs_device, jitter, stray, reference_vs_matched,
    /// control_vs_matched): the floors read the worse of the graph and the device's stray (the
    /// device's 0.8173 against the matched reference is its stray 0.8793 on a control at 0.9926),
    /// every top-1 agrees, and the two steps whose control sits below the jitter are listed.
    #[test]
    fn with_a_control_the_floors_judge_the_graph_and_the_stray_and_list_departing_rows() {
        let at = |md: f64, j: f64, s: f64, rm: f64, c: f64| MatchedStep {
            reference_vs_matched: rm,
            matched_vs_device: md,
            matched_top1: 1,
            band: 30.0,
            matched_margin: 0.0,
            jitter: Some(j),
            stray: Some(DeviceStray {
                cosine: s,
                band: 4.0,
            }),
            control_vs_matched: Some(c),
        };
        let steps = [
            at(0.9908, 0.9953, 0.9914, 0.9808, 0.9978),
            at(0.9971, 0.9899, 0.9947, 0.4332, 0.9967),
            at(0.8173, 0.9944, 0.8793, 0.1114, 0.9926),
            at(0.9970, 0.9991, 0.9974, -0.0470, 0.9989),
        ];
        let points: Vec<_> = steps
            .iter()
            .enumerate()
            .map(|(i, m)| (7 + i, m, 1))
            .collect();
        let j = judged(&points, true, "greedy").unwrap();
        assert!((j.floors[1] - 0.8793).abs() < 1e-12, "the stray's min");
        let graph_mean: f64 = (0.9978 + 0.9967 + 0.9926 + 0.9989) / 4.0;
        let stray_mean = (0.9914 + 0.9947 + 0.8793 + 0.9974) / 4.0;
        assert!((j.floors[0] - graph_mean.min(stray_mean)).abs() < 1e-12);
        assert_eq!(j.floors[2], 1.0);
        assert_eq!(j.lines.len(), 3, "{:?}", j.lines);
        assert!(j.lines[1].starts_with("greedy at position 9:"));
        assert!(j.lines[2].starts_with("greedy at position 10:"));
        // the per-step test reads the control at the jitter, not the device at jitter + stray
        assert_eq!(crate::footing::judged(&steps[2], true), (0.9944, 0.9926));
        let without = MatchedStep {
            control_vs_matched: None,
            ..steps[2]
        };
        let (band, cos) = crate::footing::judged(&without, true);
        assert!((band - (0.9944 - (1.0 - 0.8793))).abs() < 1e-12);
        assert_eq!(cos, 0.8173);
        // a point without a control: the floors read the device against the matched reference
        let mut mixed = points.clone();
        mixed[0].1 = &without;
        assert!(judged(&mixed, true, "greedy").is_none());
    }
}
