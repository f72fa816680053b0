//! The pipeline stage and the findings of the probes that localise it (issue 10): stale,
//! causality, splits.

use super::logits::LogitComparison;
use serde::{Deserialize, Serialize};

/// Where in the pipeline a fault sits (issue 10): what the stale, causality and splits probes can
/// localise without naming a fault. Order = the order a report lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Stage {
    /// What the prefill graph writes into the cache (layout, placement, bytes kept).
    PrefillWriter,
    /// How the tbt graph reads or binds the cache the prefill wrote.
    TbtReader,
    /// How a graph applies the attention mask.
    Mask,
    /// Ring offset or positional bookkeeping shifted by a constant.
    Offset,
    /// Quantisation of the cache edges.
    Numeric,
    /// A graph's own math (attention scale, softmax, head expansion).
    Graph,
}

impl Stage {
    pub const ALL: [Stage; 6] = [
        Stage::PrefillWriter,
        Stage::TbtReader,
        Stage::Mask,
        Stage::Offset,
        Stage::Numeric,
        Stage::Graph,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Stage::PrefillWriter => "prefill-writer",
            Stage::TbtReader => "tbt-reader",
            Stage::Mask => "mask",
            Stage::Offset => "offset",
            Stage::Numeric => "numeric",
            Stage::Graph => "graph",
        }
    }

    pub fn parse(s: &str) -> Option<Stage> {
        Stage::ALL.into_iter().find(|v| v.name() == s)
    }
}

/// One tbt step of the stale probe: the poisoned run against the clean run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StaleStep {
    pub step: usize,
    /// Absolute position of the token fed at this step.
    pub position: usize,
    /// Cosine of the poisoned run's logits to the clean run's.
    pub cosine_to_clean: f64,
    pub max_abs_diff: f64,
    /// The poison changed this step's logits (cosine below the identical-run level).
    pub moved: bool,
}

/// A poisoned ring slot whose poison alone moves a step's logits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StaleLeak {
    pub step: usize,
    /// Ring slot (entry index, position mod L).
    pub slot: usize,
    /// "never-written" or "previously-written".
    pub class: String,
    /// Ring distance (in slots) to the nearest entry that is valid at this step.
    pub distance_to_valid: usize,
}

/// Two different requests back to back, the second compared with the same request on its own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BackToBack {
    pub first_ids: Vec<u32>,
    pub second_ids: Vec<u32>,
    /// Lowest cosine over the second request's outputs (prefill and tbt steps) to the same
    /// request run alone, with `Driver::reset` between the two requests.
    pub with_reset_cosine: f64,
    /// The same without a reset (the second request continues the first: dependence expected).
    pub without_reset_cosine: f64,
    pub depends_with_reset: bool,
    pub depends_without_reset: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StaleFinding {
    /// Dequantised magnitude of the poison values (largest |value| the reader's quant can hold).
    pub poison_magnitude: f64,
    /// Ring slots poisoned after prefill, by class.
    pub never_written_slots: Vec<usize>,
    pub previously_written_slots: Vec<usize>,
    pub steps: Vec<StaleStep>,
    pub first_moved_step: Option<usize>,
    /// Slots found to leak at the first moved step (group testing, bounded).
    pub leaks: Vec<StaleLeak>,
    /// False when the trial budget ran out before every leaking slot was isolated.
    pub leak_search_complete: bool,
    pub leak_trials: usize,
    /// Cosine between two runs whose leaking slots hold the same distinct entries in two
    /// different orders (None: fewer than two leaking slots found).
    #[serde(default)]
    pub leak_permutation_cosine: Option<f64>,
    /// The leaking slots are read as whole entries (permutation-invariant: a mask admits them)
    /// rather than assembled from other slots' bytes (a reader layout).
    #[serde(default)]
    pub leaks_whole_entries: Option<bool>,
    pub back_to_back: Option<BackToBack>,
}

/// A cell above the causal diagonal that changed: position `position` wrote different cache
/// entries when the later token at `perturbed` was replaced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CausalLeak {
    pub position: usize,
    pub perturbed: usize,
    pub change: f64,
    /// The change reaches the first layer, whose K/V depend on the token alone: bytes of the
    /// later token landed in the earlier slot (writer placement/layout), not attention.
    pub first_layer: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CausalityFinding {
    /// Ring slots of the matrix rows.
    pub slots: Vec<usize>,
    /// Prompt position the ring arithmetic puts in each row's slot (None = no prompt token).
    pub slot_positions: Vec<Option<usize>>,
    /// Perturbed prompt positions (columns).
    pub perturbed: Vec<usize>,
    /// Token each perturbed position was replaced with.
    pub replacement_tokens: Vec<u32>,
    /// `[slots][perturbed]`: relative change of the slot's cache entries (max over caches).
    pub matrix: Vec<Vec<f32>>,
    /// The same over the first layer's caches only.
    pub first_layer_matrix: Vec<Vec<f32>>,
    /// Cosine of the prefill's final logits with and without the perturbation (the perturbation
    /// must be visible there).
    pub final_logits_cosine: Vec<f64>,
    pub leaks: Vec<CausalLeak>,
    pub leak_cells: usize,
    pub first_layer_leak_cells: usize,
    /// Cells that changed in slots holding no prompt token (writes outside the valid entries).
    pub stray_cells: usize,
    /// Later-layer changes in slots only padding rows wrote: expected, since padding rows
    /// attend to every column (contract §2.5) and those slots stay masked until overwritten.
    #[serde(default)]
    pub padding_cells: usize,
    /// Most slots one perturbed token's first-layer change spread over: 1 = whole entries
    /// (placed at some slot), more = the token's bytes scattered (another layout).
    #[serde(default)]
    pub first_layer_spread: usize,
    /// Trailing entry columns no perturbation ever changed in a first-layer entry it changed
    /// (a writer keeping only the head of each entry).
    #[serde(default)]
    pub frozen_tail_columns: usize,
    /// When every perturbed token's first-layer data moved to the same other slot: that shift
    /// (slot − position mod L).
    pub first_layer_shift: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SplitRow {
    /// Tokens prefilled before the split (0 = decode from the first token).
    pub split: usize,
    /// Final logits after prefilling `ids[..split]`, then `ids[split..]` as a second prefill
    /// (other chunk boundaries than the server's remainder-first chunking); None for split 0.
    pub prefill_continue: Option<LogitComparison>,
    /// Cosine to the reference of each decode step feeding `ids[split..]` one token at a time,
    /// positions `split..n`.
    pub decode_cosines: Vec<f64>,
    /// The last decode step against the reference.
    pub decode_final: LogitComparison,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SplitsFinding {
    pub prompt_len: usize,
    pub prefill_len: usize,
    pub rows: Vec<SplitRow>,
    /// The server's own prefill of the whole prompt against the reference (the split-free row).
    pub whole_prefill: LogitComparison,
    /// Lowest decode cosine of the pure-decode row (split 0: tbt reads only what tbt wrote).
    pub pure_decode_min: f64,
    /// Lowest decode cosine over rows whose steps read prefill-written entries (split ≥ 1).
    pub mixed_decode_min: f64,
    /// Lowest prefill-continue final cosine.
    pub prefill_continue_min: f64,
    /// Split points whose final cosine falls below the stage floor.
    pub failing_splits: Vec<usize>,
}
