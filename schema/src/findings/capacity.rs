//! `capacity` (issue 20): prompts swept up to and past every limit the device declares, and
//! generation run past the end, each against the reference. Stored in
//! `ProbeFindings::extra["capacity"]` (the probe writes it, the report section reads it).

use serde::{Deserialize, Serialize};

use super::LogitComparison;
use crate::limits::{DeviceLimit, LimitKind, PastLimit};

/// What one request of the sweep gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CapacityOutcome {
    /// The output agrees with the reference the documented behaviour gives.
    Matches,
    /// A typed refusal where the documented runtime refuses.
    Refused,
    /// A typed refusal inside every declared limit: the device takes less than it declares,
    /// but says so.
    RefusedEarly,
    /// Logits that miss the reference, and no refusal: silent garbage.
    Garbled,
    /// An answer where the documented runtime refuses (a prompt past the compiled length, a
    /// step past the context): the request continued silently, whatever its cosine says (a
    /// sliding cache keeps the newest tokens and may still look close to the reference).
    Unrefused,
}

impl CapacityOutcome {
    pub fn name(self) -> &'static str {
        match self {
            CapacityOutcome::Matches => "matches",
            CapacityOutcome::Refused => "refused",
            CapacityOutcome::RefusedEarly => "refused-early",
            CapacityOutcome::Garbled => "garbled",
            CapacityOutcome::Unrefused => "unrefused",
        }
    }
}

/// Whether a point is a prompt (reset, prefill) or a generation step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CapacityPhase {
    Prompt,
    Generation,
}

/// One request of the sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CapacityPoint {
    pub phase: CapacityPhase,
    /// Prompt: its length. Generation: the tokens the step's query sees, itself included
    /// (position + 1).
    pub tokens: usize,
    /// The declared limits this length reaches (a prompt) or passes (a step).
    pub beyond: Vec<LimitKind>,
    /// What the documented runtime does here (the strongest of `beyond`); `None`: inside every
    /// limit, the output must equal the full causal reference.
    pub documented: Option<PastLimit>,
    /// Keys the reference let the compared row see (a documented sliding window); `None`: all.
    pub window: Option<usize>,
    /// The typed error, one line, when the host or runtime refused.
    pub refusal: Option<String>,
    /// Device against reference; `None` when refused (or no reference reaches this length).
    pub comparison: Option<LogitComparison>,
    /// Device against the precision-matched reference (the same request at the device's
    /// declared precision; issue 18): a miss it shares is the precision's, not garbage. `None`
    /// where none is computed (prompts, a float32 host cache).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matched: Option<LogitComparison>,
    pub outcome: CapacityOutcome,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CapacityFinding {
    /// What the device declares (`Device::limits`).
    pub limits: Vec<DeviceLimit>,
    /// The prompts (each after a reset) then the generation steps, in the order they ran.
    pub points: Vec<CapacityPoint>,
    /// Prompt length the generation started from.
    pub generation_prompt: usize,
    /// Shortest prompt whose output is garbled.
    pub first_garbled_prompt: Option<usize>,
    /// Smallest context (tokens seen) at which a generation step is garbled.
    pub first_garbled_context: Option<usize>,
    /// Some request came back garbled, or answered where the runtime refuses, without a
    /// refusal.
    pub silent_overflow: bool,
    /// `diagnose`'s cheap check (the longest accepted prompt, one past it, and the steps around
    /// the end of the context), not the whole sweep.
    pub quick: bool,
}

impl CapacityFinding {
    pub fn garbled(&self) -> impl Iterator<Item = &CapacityPoint> {
        self.points
            .iter()
            .filter(|p| p.outcome == CapacityOutcome::Garbled)
    }

    pub fn unrefused(&self) -> impl Iterator<Item = &CapacityPoint> {
        self.points
            .iter()
            .filter(|p| p.outcome == CapacityOutcome::Unrefused)
    }
}
