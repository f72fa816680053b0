//! What the `determinism` probe found (issue 20): the same request (prompt, then greedy tbt
//! steps) run again in the same process and once in a second OS process, compared bit for bit,
//! logits and cache bytes.

use serde::{Deserialize, Serialize};

/// Where two runs of the same request first differ.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Divergence {
    /// 0 = the prefill, k = the k-th tbt step.
    pub step: usize,
    /// First logit index that differs at that step (`None`: the logits agree there, a cache
    /// differs).
    pub logit: Option<usize>,
    /// First layer whose cache bytes differ after that step (`None`: caches agree or were not
    /// readable).
    pub layer: Option<usize>,
    pub cache_id: Option<u32>,
    /// First slot (ring slot, or state row = position) whose bytes differ in that cache.
    pub slot: Option<usize>,
}

/// One pair of runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunComparison {
    /// "same process" or "second process".
    pub against: String,
    pub identical: bool,
    pub first: Option<Divergence>,
    /// Per step, the largest |first − second| over the logits (`None`: a non-finite
    /// difference, e.g. NaN against a number).
    pub step_max_abs_diff: Vec<Option<f64>>,
    /// `[step][layer]`: slots whose bytes differ in that layer's K or V cache after the step
    /// (empty when the device's caches are not readable).
    pub slots_differing: Vec<Vec<usize>>,
}

/// `ProbeFindings.determinism`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeterminismFinding {
    /// Steps per run: the prefill, then tbt steps.
    pub steps: usize,
    /// Whether the cache bytes were compared (the device can read its caches).
    pub caches_compared: bool,
    /// Every state read all zero right after each reset (stateful), or every ring after the
    /// host zeroed it (genai ring); `None`: the device cannot be read back, or cannot have its
    /// rings cleared. Only with `Some(true)` are two runs' inputs identical down to the caches.
    pub clean_reset: Option<bool>,
    pub comparisons: Vec<RunComparison>,
    /// Why the second-process run did not happen (`None`: it ran, or was not asked for).
    pub second_process_skipped: Option<String>,
}

impl DeterminismFinding {
    /// Every comparison bit-identical.
    pub fn identical(&self) -> bool {
        self.comparisons.iter().all(|c| c.identical)
    }
}
