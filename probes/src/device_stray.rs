//! The device's own arithmetic, measured by its control (issue 36): where a device runs the same
//! graph on a control with the same feeds (`Device::control_logits`: QNN HTP's QDQ graph on the
//! CPU EP, whose float32 Q/DQ arithmetic the matched reference models), each compared row's
//! distance from the control (`MatchedStep::stray`) is how far the device's kernels take it from
//! the graph as written; that distance is part of the healthy hypothesis' precision at that row,
//! beside its own jitter spread (`crate::footing::band`). The control's own distance from the
//! matched reference (`MatchedStep::control_vs_matched`) is recorded beside it: how far the
//! graph as the control computes it departs from the healthy hypothesis. A fault of the graph is
//! computed by the control too, so it stays outside that precision and shows against the matched
//! reference.

use kvprobe_npu::Device;
use kvprobe_reference::Model;
use kvprobe_schema::{DeviceDescription, DeviceStray, GreedyStep, MatchedStep};

use crate::matched::{greedy_logits_shared, DriveMemo, Precision};
use crate::matched_summary::precision_band;
use crate::metrics::cosine;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn step(jitter: Option<f64>, stray: Option<DeviceStray>) -> MatchedStep {
        MatchedStep {
            reference_vs_matched: 0.99,
            matched_vs_device: 0.98,
            matched_top1: 7,
            band: 6.0,
            matched_margin: 0.3,
            jitter,
            stray,
            control_vs_matched: None,
        }
    }

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
}
