//! One definition of "a hypothesis reproduces the device at its declared precision" for the
//! greedy control and the fits that replay a hypothesis of the host's feed on the reference side,
//! teacher-forced on the device's tokens: the wiring fit (rules `output-position` /
//! `output-mask`, `diagnose::output_fit`), the chat's fit (`crate::chat`) and the host's declared
//! feed (rule `host-feed`, `crate::host_feed`).
//!
//! A hypothesis is replayed on the reference the healthy hypothesis is: the precision-matched
//! reference of a host cache (`matched::models_everything`: the declared weights, cache and
//! arithmetic as the device declares them), unless the device declares what that reference does
//! not compute (`Device::unmodelled_precision`: HTP's integer QDQ kernels); so a fault's
//! hypothesis is not charged the declared precision's cost against f32 (QDQ `rope-offset` on the
//! CPU EP: position +1 at 5.7e-3 in f32 against a jitter of 1.1e-4; a W2 feed on the uint8
//! window replayed in f32 missed the device by 2.3e-3 against a precision of 2.4e-3, on the
//! matched reference by less). A step's band is the jitter control's spread where that control
//! judges the device (the matched reference computes every op: `jitter_applies`), else the
//! declared precision's cost against f32. Elsewhere (rings, stateful devices, HTP's QDQ) the
//! hypotheses run on the float32 reference, at the cost band; on HTP's QDQ the CPU EP control
//! adds the device's measured stray to it (`crate::device_stray`).

use kvprobe_reference::Model;
use kvprobe_schema::{DeviceDescription, MatchedStep};

use crate::matched::Precision;
use crate::session::Session;
use crate::Result;

/// Where a session's hypotheses are replayed and how a step's band is read.
#[derive(Clone)]
pub struct Footing {
    /// The precision-matched reference the hypotheses are replayed on (a host cache's, the
    /// device declaring nothing it does not compute); `None`: the float32 reference.
    pub matched: Option<Precision>,
    /// A step's band is the jitter control's spread (`jitter_applies`).
    pub jitter: bool,
}

impl Footing {
    /// The session's footing (its description and what its device declares unmodelled).
    pub fn of(s: &Session) -> Result<Footing> {
        let unmodelled = s.dev.unmodelled_precision().is_some();
        Footing::of_desc(s.describe(), s.model, unmodelled)
    }

    /// [`Footing::of`] from a description, `unmodelled` the device's
    /// `Device::unmodelled_precision().is_some()`.
    pub fn of_desc(desc: &DeviceDescription, model: &Model, unmodelled: bool) -> Result<Footing> {
        let matched = match crate::matched::models_everything(desc) && !unmodelled {
            true => Precision::of(desc, model)?,
            false => None,
        };
        let jitter = matched.is_some() && jitter_applies(desc, unmodelled);
        Ok(Footing { matched, jitter })
    }

    /// The steps' band is the jitter's.
    pub fn jitter(&self) -> bool {
        self.jitter
    }

    /// A step's band as a cosine (`band`).
    pub fn band(&self, m: &MatchedStep) -> f64 {
        band(m, self.jitter())
    }
}

/// The jitter control judges this device: the matched reference computes every op it declares
/// (`matched_jitter::applies`) and it declares nothing the reference does not compute.
pub fn jitter_applies(desc: &DeviceDescription, unmodelled: bool) -> bool {
    !unmodelled && crate::matched_jitter::applies(desc)
}

/// A step's band as a cosine: the smallest cosine of the jitter control's draws against the
/// matched reference where `jitter` and the control ran, else the matched reference's own cosine
/// against f32 (the declared precision's cost); with the device's measured stray from its
/// control added as a miss where one ran (`MatchedStep::stray`, `crate::device_stray`: QNN
/// HTP's QDQ kernels against the same graph on the CPU EP). Independent errors in a logit space
/// of thousands of entries are nearly orthogonal, so their misses (1 − cosine) add.
pub fn band(m: &MatchedStep, jitter: bool) -> f64 {
    own_band(m, jitter) - m.stray.map_or(0.0, |s| 1.0 - s.cosine)
}

/// The matched reference's own band at a step: the jitter's spread where `jitter` and the
/// control ran, else its cosine against f32.
pub fn own_band(m: &MatchedStep, jitter: bool) -> f64 {
    m.jitter
        .filter(|_| jitter)
        .unwrap_or(m.reference_vs_matched)
}

/// What a step or row judges, as `(band, cosine)` for `ring::fits::leaves_matched`. Where the
/// device runs a control (`MatchedStep::control_vs_matched`: QNN HTP's QDQ graph on the CPU EP,
/// the same feeds), the graph is judged: the control against the matched reference at that
/// reference's own band (a fault of the graph or of the host's feed is computed by both runs),
/// while the device's distance from its control is the device's own arithmetic (`stray`,
/// reported beside it, docs/qnn.md "The CPU EP control"). Judging the device against the matched
/// reference at the jitter plus the stray would charge the device for a row the matched
/// reference does not model (SmolLM2 QDQ's off-grid rows, where the control itself sits away
/// from it). Without a control: the device against the matched reference at [`band`].
pub fn judged(m: &MatchedStep, jitter: bool) -> (f64, f64) {
    match m.control_vs_matched {
        Some(c) => (own_band(m, jitter), c),
        None => (band(m, jitter), m.matched_vs_device),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A QDQ step on QNN HTP: the jitter draws were recorded (`matched_jitter::fill_steps` runs
    /// where the reference models the graph), but the device declares HTP's integer kernels,
    /// which the reference does not compute: its band stays the declared precision's cost, for
    /// the greedy control and the fits alike; where the control judges the device, the jitter.
    #[test]
    fn a_step_is_judged_by_the_jitter_only_where_the_control_judges_the_device() {
        let m = MatchedStep {
            reference_vs_matched: 0.9921,
            matched_vs_device: 0.9990,
            matched_top1: 7,
            band: 0.5,
            matched_margin: 0.0,
            jitter: Some(0.99996),
            stray: None,
            control_vs_matched: None,
        };
        assert_eq!(band(&m, true), 0.99996);
        assert_eq!(band(&m, false), 0.9921);
        // a step written before the control (or where it did not run) keeps the cost either way
        let old = MatchedStep { jitter: None, ..m };
        assert_eq!(band(&old, true), 0.9921);
        let f32_footing = Footing {
            matched: None,
            jitter: false,
        };
        assert!(!f32_footing.jitter());
        assert_eq!(f32_footing.band(&m), 0.9921);
    }
}
