//! The device's own arithmetic, measured by its control (issue 36): where a device runs the same
//! graph on a control with the same feeds (`Device::control_logits`: QNN HTP's QDQ graph on the
//! CPU EP, whose float32 Q/DQ arithmetic the matched reference models), each compared row's
//! distance from the control is how far the device's kernels take it from the graph as written.
//! That distance is part of the healthy hypothesis' precision at that row, beside its own jitter
//! spread (`crate::footing::band`). A fault of the graph is computed by the control too, so it
//! stays outside that precision and shows against the matched reference.

use kvprobe_npu::Device;
use kvprobe_schema::{DeviceStray, GreedyStep};

use crate::matched_summary::precision_band;
use crate::metrics::cosine;

/// The device's logits `device` against its control's for the same run, where one ran.
pub fn of(dev: &dyn Device, device: &[f32]) -> Option<DeviceStray> {
    let control = dev.control_logits(device)?;
    Some(DeviceStray {
        cosine: cosine(device, &control),
        band: precision_band(device, &control),
    })
}

/// Sets `matched.stray` on every step with a matched comparison (`device[i]` is step i's logits).
pub fn fill_steps(dev: &dyn Device, device: &[Vec<f32>], steps: &mut [GreedyStep]) {
    for (st, logits) in steps.iter_mut().zip(device) {
        if let Some(m) = st.matched.as_mut() {
            m.stray = of(dev, logits);
        }
    }
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
}
