//! Findings of the probes that compare device logits with the reference's: prefill, greedy,
//! selfmask, maskconv, positions (and the theta check), inject.

use serde::{Deserialize, Serialize};

/// Device logits against reference logits at one position or step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogitComparison {
    pub cosine: f64,
    /// KL(reference ‖ device) of the softmax distributions, nats.
    pub kl: f64,
    pub device_top1: u32,
    pub reference_top1: u32,
    pub top1_match: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PrefillRow {
    /// Position of the last prompt token of this prefix (prefix length − 1).
    pub position: usize,
    pub comparison: LogitComparison,
    /// The precision-matched reference of a single-chunk prefix, when the device declares a
    /// lower precision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matched: Option<MatchedStep>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PrefillFinding {
    pub rows: Vec<PrefillRow>,
    /// Cosine between the first prefix's device logits and its re-run at the end.
    pub rerun_cosine: f64,
    /// False when the re-run differs: state leaked between resets.
    pub rerun_identical: bool,
    pub min_cosine: f64,
    pub mean_cosine: f64,
    pub top1_agreement: f64,
    /// The whole prompt's prefill against references with other attention scales (`diagnose`
    /// runs it when the prefill rows pass: a near-1 scale hides inside their tolerance).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale: Option<ScaleFit>,
    /// Readable text of every top-1 id the row table shows, for the reports.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub token_texts: std::collections::BTreeMap<u32, String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GreedyStep {
    /// 0 = the token from prefill.
    pub step: usize,
    /// Absolute position of the token whose logits these are.
    pub position: usize,
    /// Token fed at this step (last prompt token for step 0).
    pub input_token: u32,
    /// Keys the reference saw (sliding window once the ring wraps).
    pub visible_keys: usize,
    pub comparison: LogitComparison,
    /// The reference's logit margin between its top-1 and the device's top-1 (0 when they agree).
    #[serde(default)]
    pub reference_margin: f64,
    /// A top-1 flip whose reference margin lies inside the precision band: the device's
    /// declared precision alone can decide it either way (counted apart, issue 18).
    #[serde(default)]
    pub near_tie: bool,
    /// The precision-matched reference at this step, when the device declares a lower precision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matched: Option<MatchedStep>,
}

/// The three-way comparison of one step: f32 reference, precision-matched reference, device.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MatchedStep {
    /// Cosine of the precision-matched reference against the f32 reference.
    pub reference_vs_matched: f64,
    /// Cosine of the device against the precision-matched reference.
    pub matched_vs_device: f64,
    /// Top-1 of the precision-matched reference.
    pub matched_top1: u32,
    /// How far the declared precision moves a logit gap at this step (twice the 99.9th
    /// percentile of |matched − f32| over the vocabulary): a reference margin below it is a
    /// near tie.
    pub band: f64,
    /// The matched reference's own logit gap between its top-1 and the device's top-1 (0 when
    /// they agree): where the device is judged against this reference instead of the f32 one
    /// (a chat on a device whose declared precision it models), a flip whose gap is below `band`
    /// is a near tie, as a flip against f32 is by `GreedyStep::reference_margin`.
    #[serde(default)]
    pub matched_margin: f64,
    /// The healthy hypothesis' own spread at this step: the smallest cosine of the matched
    /// reference against itself with every norm weight moved by ≤ 1 ulp of the declared
    /// arithmetic (the jitter control, docs/diagnosis.md); only on a host cache whose every op
    /// the matched reference computes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jitter: Option<f64>,
    /// The device against its control at this step: the same graph run on another execution
    /// provider with the same feeds (QNN HTP's QDQ graph on the CPU EP, docs/qnn.md), which
    /// implements the graph's arithmetic as written. Their distance is the device's own
    /// arithmetic, part of the declared precision; never the device's result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stray: Option<DeviceStray>,
    /// The control against the precision-matched reference at this step (cosine), where a
    /// control ran (`stray`): the graph as written, computed by another execution provider, against
    /// the reference that models it. Where it is recorded the graph is judged by it, at the
    /// matched reference's own band (`jitter`), and the device by its distance from the control
    /// (`stray`) (docs/qnn.md, "The CPU EP control").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_vs_matched: Option<f64>,
}

/// How far a device strays from its control (the same graph on another execution provider, the
/// same feeds) at one row.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct DeviceStray {
    /// Cosine of the device's logits against the control's.
    pub cosine: f64,
    /// How far that arithmetic moves a logit gap: twice the 99.9th percentile of
    /// |device − control| over the vocabulary (as `MatchedStep::band` for the declared precision).
    pub band: f64,
}

/// What the precision-matched reference rounded, and its tbt means.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MatchedSummary {
    pub precision: String,
    /// Mean cosine over tbt steps (step ≥ 1) of the matched reference against the f32 one.
    pub tbt_reference_vs_matched: Option<f64>,
    /// Mean cosine over tbt steps of the device against the matched reference.
    pub tbt_matched_vs_device: Option<f64>,
    pub min_matched_vs_device: f64,
    /// Under a declared fp16 arithmetic, the matched reference's first op output beyond fp16's
    /// range ("fp16 overflow at layer L <norm> <op>: value V"; issue 36).
    #[serde(default)]
    pub fp16_overflow: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GreedyFinding {
    pub steps: Vec<GreedyStep>,
    /// First step whose top-1 differs from the reference (teacher-forced on the device's tokens)
    /// outside a near tie.
    pub first_divergence: Option<usize>,
    pub device_ids: Vec<u32>,
    pub device_text: String,
    /// The reference's own free-running greedy continuation.
    pub reference_ids: Vec<u32>,
    pub reference_text: String,
    pub mean_cosine: f64,
    pub min_cosine: f64,
    /// Top-1 agreement over the steps that are not near-tie flips.
    pub top1_agreement: f64,
    /// Mean cosine over tbt steps only (step ≥ 1).
    pub tbt_mean_cosine: Option<f64>,
    /// Top-1 flips inside the precision band (left out of `top1_agreement`).
    #[serde(default)]
    pub near_tie_flips: usize,
    /// The precision-matched reference's summary, when one ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matched: Option<MatchedSummary>,
    /// Readable text of every token id the step table shows (inputs and top-1s), for the
    /// reports.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub token_texts: std::collections::BTreeMap<u32, String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SelfmaskStep {
    pub step: usize,
    pub position: usize,
    pub input_token: u32,
    pub comparison: LogitComparison,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SelfmaskFinding {
    pub steps: Vec<SelfmaskStep>,
    pub mean_cosine: f64,
    /// Mean cosine of the self-only steps against the precision-matched reference's self-only
    /// rows, where that reference computes every op the device declares (the f32 comparison
    /// then carries the declared precision's cost: a healthy QDQ self-only step sits at 0.94).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matched_mean_cosine: Option<f64>,
    /// The same rows on the device's control (the graph on another execution provider with the
    /// same feeds, `MatchedStep::stray`) against the precision-matched reference's self-only
    /// rows: the graph's own self-only steps, where a control runs. Recorded, not judged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_matched_mean_cosine: Option<f64>,
    pub min_cosine: f64,
    pub top1_agreement: f64,
    /// Readable text of every id the step table shows (inputs and top-1s), for the reports.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub token_texts: std::collections::BTreeMap<u32, String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MaskVariant {
    /// e.g. "ring", "left-valid", "shift-1", "shift+1", "per-head".
    pub name: String,
    pub comparison: LogitComparison,
    pub reproduces: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MaskconvFinding {
    pub variants: Vec<MaskVariant>,
    /// Cosine between device outputs when only heads ≥ 1 get a different mask: ≈ 1 means the
    /// graph ignored their rows (uses one head's row for all).
    pub other_heads_ignored_cosine: Option<f64>,
    pub best: Option<String>,
    /// The same per-head control on a single prefill chunk (the prompt's first `P` tokens):
    /// the device's last-row logits with heads ≥ 1 given self-only rows against its plain
    /// prefill. ≈ 1 means the prefill graph ignored those rows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_other_heads_ignored_cosine: Option<f64>,
    /// How far that per-head mask moves the reference's last row (cosine to its causal
    /// output): the control is informative only when this is well below 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_per_head_reference_cosine: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PositionPoint {
    pub delta: i64,
    pub comparison: LogitComparison,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PositionsFinding {
    pub points: Vec<PositionPoint>,
    pub best_delta: i64,
    pub best_cosine: f64,
    pub baseline_cosine: f64,
    /// The same first tbt step (server position) against references computed with other
    /// attention scales: a position shift and a wrong scale can mimic each other, the fit tells.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale: Option<ScaleFit>,
}

/// Single-chunk prefill rows driven with the device's theta table and with the same table in
/// the other RoPE sign convention (contract §2.6: the embedded table decides, and a graph
/// compiled for the other convention turns every rotation into a non-rotation).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThetaCheck {
    /// "plain" (both halves positive) or "sign-folded" (first half negated).
    pub declared: String,
    pub rows: usize,
    /// Mean cosine to the reference of the rows with the declared table.
    pub declared_cosine: f64,
    /// Same rows with the table in the other convention.
    pub other_cosine: f64,
}

/// Which attention-scale multiplier of the reference best explains a device output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScaleFit {
    /// (scale multiplier, cosine of the device output to the reference at that scale).
    pub points: Vec<(f64, f64)>,
    pub best_scale: f64,
    pub best_cosine: f64,
    /// Cosine at the model's own scale (multiplier 1).
    pub unit_cosine: f64,
    /// (multiplier, cosine) of the same fit against the precision-matched reference, when the
    /// device declares a precision and the f32 fit searched: the healthy hypothesis at the
    /// device's precision, so its multiplier is the graph's own (the value a replay takes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub against_matched: Option<(f64, f64)>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InjectFinding {
    /// The tbt step on the rings as the device's own prefill left them.
    pub device_rings: LogitComparison,
    /// The tbt step on golden token-major rings (reference K/V, declared quant infos).
    pub golden: LogitComparison,
    /// The same with the K and V rings swapped.
    pub golden_swapped: LogitComparison,
    /// "writer" (golden matches, device rings do not), "reader", "binding" (swapped matches),
    /// "none" (everything matches).
    pub blame: String,
    /// When neither golden variant reproduces: golden rings with K↔V swapped on only the layers
    /// whose single-layer swap helps (a binding crossed on some layers only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partial_swap: Option<PartialSwap>,
    /// When the reader is blamed: golden rings re-encoded so that a reader decoding some cache
    /// edges in another named layout sees the reference (the best candidate the search found).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reader_layout: Option<ReaderLayoutRepair>,
    /// When the reader is blamed: golden token-major rings read with the left-valid mask
    /// (prior art §2.4) instead of the ring mask; `None` where the two masks are equal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub golden_left_valid: Option<LogitComparison>,
    /// Layers whose golden tbt step wrote its K where the reference's V belongs and its V where
    /// the reference's K belongs (read back from the rings): bound crosswise on the write.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub crossed_writes: Vec<usize>,
}

/// Golden rings whose read windows were re-encoded for a reader that decodes `edges` in
/// another layout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReaderLayoutRepair {
    pub edges: Vec<ReaderEdgeLayout>,
    pub comparison: LogitComparison,
    /// Trial steps the search ran.
    pub trials: usize,
}

/// One cache edge's reader layout, as the repair assumed it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReaderEdgeLayout {
    pub layer: usize,
    pub kind: crate::CacheKind,
    pub layout: crate::Layout,
}

/// Golden rings swapped K↔V on some layers only.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartialSwap {
    pub layers: Vec<usize>,
    pub comparison: LogitComparison,
}
