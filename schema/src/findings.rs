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
    Unknown,
}

impl Verdict {
    pub const ALL: [Verdict; 11] = [
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
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub layout: Option<LayoutFinding>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub inject: Option<InjectFinding>,
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
    pub probes: ProbeFindings,
    pub provenance: Provenance,
}
