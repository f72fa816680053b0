//! What the probes found: one serialisable type per probe, the diagnosis, and the run record.
//!
//! `Results` is the single object behind `results.json` and `--json`; the HTML report is rendered
//! from it alone (plus nothing that depends on render time).

use crate::device::{CacheKind, Layout, QuantInfo};
use crate::manifest::SimManifest;
use serde::{Deserialize, Serialize};

/// Named root cause. Order of the variants = stage order used to pick the headline verdict when
/// several faults are found (prefill graph, then tbt graph, then the cache path).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    Healthy,
    PrefillGraph,
    TbtGraph,
    CacheLayoutMismatch,
    CacheTruncation,
    MaskConvention,
    CacheOffset,
    CacheQuantization,
    PositionMismatch,
    KvBinding,
    /// fp16 overflow (inf/NaN) inside the graph: a stateful fp16 device (issue 9).
    NumericOverflow,
    /// State left over from a previous request changes the next one (issue 9).
    StaleCache,
    Unknown,
}

impl Verdict {
    pub const ALL: [Verdict; 13] = [
        Verdict::Healthy,
        Verdict::PrefillGraph,
        Verdict::TbtGraph,
        Verdict::CacheLayoutMismatch,
        Verdict::CacheTruncation,
        Verdict::MaskConvention,
        Verdict::CacheOffset,
        Verdict::CacheQuantization,
        Verdict::PositionMismatch,
        Verdict::KvBinding,
        Verdict::NumericOverflow,
        Verdict::StaleCache,
        Verdict::Unknown,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Verdict::Healthy => "healthy",
            Verdict::PrefillGraph => "prefill-graph",
            Verdict::TbtGraph => "tbt-graph",
            Verdict::CacheLayoutMismatch => "cache-layout-mismatch",
            Verdict::CacheTruncation => "cache-truncation",
            Verdict::MaskConvention => "mask-convention",
            Verdict::CacheOffset => "cache-offset",
            Verdict::CacheQuantization => "cache-quantization",
            Verdict::PositionMismatch => "position-mismatch",
            Verdict::KvBinding => "kv-binding",
            Verdict::NumericOverflow => "numeric-overflow",
            Verdict::StaleCache => "stale-cache",
            Verdict::Unknown => "unknown",
        }
    }

    pub fn parse(s: &str) -> Option<Verdict> {
        Verdict::ALL.into_iter().find(|v| v.name() == s)
    }
}

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
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GreedyFinding {
    pub steps: Vec<GreedyStep>,
    /// First step whose top-1 differs from the reference (teacher-forced on the device's tokens).
    pub first_divergence: Option<usize>,
    pub device_ids: Vec<u32>,
    pub device_text: String,
    /// The reference's own free-running greedy continuation.
    pub reference_ids: Vec<u32>,
    pub reference_text: String,
    pub mean_cosine: f64,
    pub min_cosine: f64,
    pub top1_agreement: f64,
    /// Mean cosine over tbt steps only (step ≥ 1).
    pub tbt_mean_cosine: Option<f64>,
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
    pub min_cosine: f64,
    pub top1_agreement: f64,
}

/// How a colmap row (one cache entry) decomposes over prompt positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ColumnMatch {
    /// One prompt position stands out.
    Clean,
    /// Several positions share the similarity.
    Mixture,
    /// No position matches (e.g. a never-written entry).
    None,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ColmapRow {
    /// Read-window entry index j (column of the tbt mask).
    pub entry: usize,
    /// Prompt position the ring arithmetic puts there; `None` = never written.
    pub expected_position: Option<usize>,
    pub best_position: Option<usize>,
    pub best_cosine: f64,
    pub second_cosine: f64,
    pub class: ColumnMatch,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ColmapFinding {
    /// Query token (the device's prefill argmax) and its position.
    pub query_token: u32,
    pub query_position: usize,
    /// Covered window entries (rows of `matrix`).
    pub entries: Vec<usize>,
    /// Prompt positions (columns of `matrix`).
    pub positions: Vec<usize>,
    /// Token text of each prompt position, for axis labels.
    pub position_tokens: Vec<String>,
    /// cos(device_j − device_self, ref_p − ref_self), `[entries][positions]`.
    pub matrix: Vec<Vec<f32>>,
    pub rows: Vec<ColmapRow>,
    /// Mean cosine at the expected (entry, position) cells.
    pub diagonal_strength: f64,
    /// Mean over written entries of the best cosine away from the expected cell.
    pub best_off_diagonal: f64,
    /// Entry shift s (entry j ↔ expected position of j + s) that maximises the mean matched cosine.
    pub best_shift: i64,
    pub best_shift_score: f64,
    /// Mean matched cosine of the best one-to-one assignment (any permutation).
    pub best_permutation_score: f64,
    pub clean_rows: usize,
    pub mixture_rows: usize,
    /// Never-written entries' device rows all (nearly) identical: a token-local fault.
    pub empty_rows_identical: Option<bool>,
    /// Largest distance (1 − cosine) between never-written entries' device rows.
    pub empty_rows_spread: Option<f64>,
    /// The window is larger than what was covered (large caches).
    pub covered_all: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ZtapCache {
    pub cache_id: u32,
    pub layer: Option<usize>,
    pub kind: Option<CacheKind>,
    /// Entries in the examined window.
    pub entries: usize,
    /// Bytes (or features) per entry examined.
    pub width: usize,
    /// Columns that are zero in every examined entry.
    pub zero_columns: usize,
    /// Per column: zero in every entry.
    pub zero_map: Vec<bool>,
    /// Never-written entries in the window.
    pub empty_entries: usize,
    /// `empty_entries × width / entries`: zero columns a transposed reader would show.
    pub expected_transposed_zero_columns: f64,
    /// "transposition", "truncation" or "none".
    pub interpretation: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ZtapFinding {
    /// "taps" (what the tbt graph read) or "ring-bytes" (what the writer left).
    pub source: String,
    pub caches: Vec<ZtapCache>,
    /// Summary interpretation over all caches.
    pub interpretation: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuantCacheRow {
    pub cache_id: u32,
    pub layer: Option<usize>,
    pub kind: Option<CacheKind>,
    pub prefill_input: Option<QuantInfo>,
    pub prefill_output: Option<QuantInfo>,
    pub tbt_input: Option<QuantInfo>,
    pub tbt_output: Option<QuantInfo>,
    /// All declared infos of this cache_id agree.
    pub consistent: bool,
    /// Largest relative scale difference between writer and reader.
    pub max_scale_ratio: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuantFinding {
    pub caches: Vec<QuantCacheRow>,
    pub mask: Option<QuantInfo>,
    /// The mask's "allowed" byte: 1.0 quantised with the prefill mask quant info.
    pub mask_allowed_value: Option<u8>,
    pub embeddings: Option<QuantInfo>,
    pub inconsistent_caches: usize,
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
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayoutScore {
    pub layout: Layout,
    /// Slot shift relative to the ring prediction (token t at slot t mod L + shift).
    pub shift: i64,
    /// Mean per-token correlation with the reference K/V.
    pub score: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayoutCache {
    pub cache_id: u32,
    pub layer: Option<usize>,
    pub kind: Option<CacheKind>,
    pub scores: Vec<LayoutScore>,
    pub best_layout: Layout,
    pub best_shift: i64,
    pub best_score: f64,
    pub token_major_score: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayoutFinding {
    pub caches: Vec<LayoutCache>,
    /// Shifts that were tried (columns of the correlation matrix).
    pub shifts: Vec<i64>,
    /// Majority writer layout and placement over all caches.
    pub writer_layout: Layout,
    pub writer_shift: i64,
    pub writer_score: f64,
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
}

/// Golden rings swapped K↔V on some layers only.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartialSwap {
    pub layers: Vec<usize>,
    pub comparison: LogitComparison,
}

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

/// Per-probe results; a probe that did not run is `None`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProbeFindings {
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub prefill: Option<PrefillFinding>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub greedy: Option<GreedyFinding>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub selfmask: Option<SelfmaskFinding>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub colmap: Option<ColmapFinding>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub ztap: Option<ZtapFinding>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub quant: Option<QuantFinding>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub maskconv: Option<MaskconvFinding>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub positions: Option<PositionsFinding>,
    /// The theta table's sign convention against the other one (RoPE models only). Its own
    /// field: `diagnose` runs it without the position sweep where single-chunk prefill fails.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub theta: Option<ThetaCheck>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub layout: Option<LayoutFinding>,
    /// `layout --infer` (older results.json files have none).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub layout_infer: Option<crate::layout_infer::LayoutInferFinding>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub inject: Option<InjectFinding>,
    /// diagnose: the reference's first tbt step over the prompt's K/V rounded through the rings'
    /// quantisation, the cache's precision floor (older results.json files have none).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub cache_precision: Option<LogitComparison>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub stale: Option<StaleFinding>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub causality: Option<CausalityFinding>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub splits: Option<SplitsFinding>,
    /// Stateful devices (issue 9): where fp16 overflow first shows.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub overflow: Option<OverflowFinding>,
    /// Stateful devices (issue 9): the state checks.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub state: Option<StateFinding>,
    /// Probes that cannot run on this device, each with the reason (never a silent skip).
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub not_applicable: Vec<NotApplicable>,
}

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
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    pub what: String,
    pub seconds: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Provenance {
    /// Exact command line, argv.
    pub command: Vec<String>,
    pub kvprobe_version: String,
    pub git_hash: Option<String>,
    pub model_path: String,
    pub model_sha256: String,
    pub model_architecture: String,
    /// "emulator" or "hailo".
    pub backend: String,
    pub hef_path: Option<String>,
    pub hef_sha256: Option<String>,
    pub sim_manifest: Option<SimManifest>,
    pub cache_len: usize,
    pub prefill_len: usize,
    pub prompt: String,
    pub prompt_ids: Vec<u32>,
    pub prompt_tokens: Vec<String>,
    pub timings: Vec<Timing>,
    /// e.g. "linux x86_64, 2 cpus".
    pub host: String,
}

/// Everything a run produced: the object of `results.json` and of `--json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Results {
    pub schema_version: u32,
    /// Which command produced it: "diagnose" or a single probe's name.
    pub command: String,
    /// `None` for a single probe.
    pub verdict: Option<Verdict>,
    pub confidence: Option<f64>,
    pub evidence: Vec<String>,
    /// Further root causes found besides the headline verdict.
    pub also: Vec<Verdict>,
    /// Observations that change no output (e.g. placement off with consistent windows).
    #[serde(default)]
    pub warnings: Vec<String>,
    /// Pipeline stage the stale/causality/splits probes point at (diagnose only; older
    /// results.json files have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<Stage>,
    pub probes: ProbeFindings,
    pub provenance: Provenance,
}
