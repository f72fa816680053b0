//! `rerun`: the same request twice in one process — reset, prefill, then greedy tbt steps — and
//! the two runs' logits compared bit for bit. A device is deterministic: a prefill or step whose
//! output depends on the run before it (state kept across a reset, a ring byte a masked slot
//! still leaks, an uninitialised buffer) is a field bug of its own (field-bugs.md), and this is
//! the cheapest way to see it. The second run is fed the first run's tokens, so a difference is
//! never just the echo of an earlier one.

use kvprobe_npu::MaskMode;
use serde::{Deserialize, Serialize};

use crate::metrics::top1;
use crate::session::Session;
use crate::Result;

/// Where the two runs first differ: step (0 = the prefill's logits) and logit index.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RerunDifference {
    pub step: usize,
    pub logit: usize,
    pub first: f32,
    pub second: f32,
}

/// What `rerun` found; stored in `ProbeFindings::extra["rerun"]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RerunFinding {
    /// Steps per run: the prefill, then tbt steps.
    pub steps: usize,
    pub identical: bool,
    pub first_difference: Option<RerunDifference>,
    /// Per step, the largest |first − second| over the logits.
    pub step_max_abs_diff: Vec<f64>,
}

/// One request: reset, prefill, then `steps − 1` tbt steps on `tokens` (or, when empty, on the
/// device's own argmax). Returns each step's logits and the tokens fed.
fn request(s: &mut Session, steps: usize, tokens: &[u32]) -> Result<(Vec<Vec<f32>>, Vec<u32>)> {
    let out = s.prefill_prompt()?;
    s.progress.inc(1);
    let mut logits = vec![out.logits];
    let mut fed = Vec::with_capacity(steps);
    for step in 1..steps {
        let token = match tokens.get(step - 1) {
            Some(&t) => t,
            None => top1(&logits[step - 1]),
        };
        fed.push(token);
        logits.push(s.driver.step(s.dev, token, &MaskMode::Ring)?.logits);
        s.progress.inc(1);
    }
    Ok((logits, fed))
}

pub fn run(s: &mut Session, steps: usize) -> Result<RerunFinding> {
    let steps = steps.max(1);
    if steps > 1 {
        s.require_tbt("rerun")?;
    }
    s.progress.phase("rerun", 2 * steps as u64);
    let (first, tokens) = request(s, steps, &[])?;
    let (second, _) = request(s, steps, &tokens)?;
    let mut first_difference = None;
    let mut step_max_abs_diff = Vec::with_capacity(steps);
    for (step, (a, b)) in first.iter().zip(&second).enumerate() {
        let differs = a
            .iter()
            .zip(b)
            .position(|(x, y)| x.to_bits() != y.to_bits());
        if let (None, Some(logit)) = (&first_difference, differs) {
            first_difference = Some(RerunDifference {
                step,
                logit,
                first: a[logit],
                second: b[logit],
            });
        }
        let max = a
            .iter()
            .zip(b)
            .map(|(x, y)| (*x as f64 - *y as f64).abs())
            .fold(0.0, f64::max);
        step_max_abs_diff.push(max);
    }
    Ok(RerunFinding {
        steps,
        identical: first_difference.is_none(),
        first_difference,
        step_max_abs_diff,
    })
}

/// `kvprobe rerun`.
pub struct RerunProbe;

impl crate::probe::Probe for RerunProbe {
    fn name(&self) -> &'static str {
        "rerun"
    }

    fn about(&self) -> &'static str {
        "The same prefill and greedy tbt steps twice (reset between): bit-identical, or where they first differ"
    }

    fn run(
        &self,
        s: &mut Session,
        opts: &crate::probe::ProbeOptions,
        into: &mut kvprobe_schema::ProbeFindings,
    ) -> Result<()> {
        let f = run(s, opts.steps)?;
        crate::probe::store_extra(into, self.name(), &f)
    }
}
