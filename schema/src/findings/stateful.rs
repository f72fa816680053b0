//! Findings of a stateful device's diagnosis (issue 9) and the probes that do not apply to it.

use serde::{Deserialize, Serialize};

/// A probe that does not apply to the device's runtime, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NotApplicable {
    pub probe: String,
    pub why: String,
}

/// What the state checks of a stateful device saw (probes/src/statecheck.rs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StateFinding {
    pub prompt_len: usize,
    /// Positions whose K state (layer 0, every KV head) is non-zero after a fresh prefill of the
    /// prompt; a correct slice_update writes exactly `0..prompt_len`.
    pub written: Vec<usize>,
    /// The first decode step with the reference K/V written into the states, cosine against the
    /// reference: `[documented [kv_heads, ctx, d], swapped [ctx, kv_heads, d]]`.
    pub layout_cosines: Option<[f64; 2]>,
    /// A decode step whose mask allows only itself, against the reference token alone.
    pub selfonly_cosine: Option<f64>,
    /// The same step under the full-context mask, against its reference.
    pub full_cosine: Option<f64>,
    /// That full-context step against the reference step with the query at position n + δ
    /// (the keys at theirs): `[δ, cosine]` for δ in −4..=4 (issue 22: position ids that a runner
    /// does not advance).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position_cosines: Option<Vec<[f64; 2]>>,
    /// The same self-only step on the device's control (the graph on another execution provider,
    /// the same feeds: `MatchedStep::stray`): `[control against the token alone, device against
    /// the control]`. The graph's own mask, which a fault of the graph shares.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selfonly_control: Option<[f64; 2]>,
    /// The self-only step's mask hypotheses replayed on the reference (issue 34: rule
    /// `self-only-mask` names a mask only when one reproduces the device's row). Older files
    /// have none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selfonly_fit: Option<SelfOnlyFit>,
}

/// The self-only step replayed under each mask hypothesis (`probes/src/selfonly_fit.rs`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SelfOnlyFit {
    pub hypotheses: Vec<MaskReplay>,
    /// The healthy hypothesis' miss: 1 − cosine of the device's row against the token alone at
    /// the declared precision.
    pub healthy_miss: f64,
    /// The row's declared precision: the token alone at the declared precision against the f32
    /// reference (1 − cosine; 0 where the device declares f32).
    pub declared: f64,
    /// The feed replayed: the prompt's ids, then the step's token (its position is the prompt's
    /// length), and the reference model's path: what a `kvprobe ref logits` reproducer runs.
    #[serde(default)]
    pub ids: Vec<u32>,
    #[serde(default)]
    pub model: String,
}

/// One mask hypothesis: the row allows only itself and every other column enters with its
/// score plus `bias` instead of −inf; `empty` never-written slots the mask covers enter as zero
/// keys (0: the held entries only).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MaskReplay {
    pub bias: f64,
    pub empty: usize,
    /// 1 − cosine of the replay against the device's self-only row.
    pub miss: f64,
    /// The same against the device's control's row, where one runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_miss: Option<f64>,
    /// The hypothesis' row is the device's own full-context step (bias 0 over every entry the
    /// device holds, the host's pads included, which its state view does not show), not a
    /// reference replay.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub device_step: bool,
}

/// Where inf/NaN first appears on a stateful fp16 device: the state scan after a prefill.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OverflowFinding {
    /// Prompt tokens of the prefill that was scanned.
    pub prompt_len: usize,
    /// First layer whose attention produced a non-finite value (`None`: all finite).
    pub layer: Option<usize>,
    /// First absolute position holding a non-finite value in that layer's output.
    pub position: Option<usize>,
    /// Whether the prefill's logits were finite.
    pub logits_finite: bool,
    /// Longest prompt prefix (tokens) whose prefill stayed finite, when a search ran.
    pub longest_finite_prefix: Option<usize>,
    /// First layer (and position) whose K and V rows are exactly zero at a prompt position that
    /// layer 0 wrote: the layer's input normalised to zero (an fp16 sum of squares past 65504
    /// gives rsqrt(inf) = 0). Issue 20; older files have none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zero_rows: Option<[usize; 2]>,
    /// Every logit of the prefill is exactly zero (the final norm returned zeros).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub logits_zero: bool,
}
