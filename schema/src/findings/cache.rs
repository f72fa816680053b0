//! Findings of the probes that read the cache itself: colmap, ztap, quant, layout.

use crate::device::{CacheKind, Layout, QuantInfo};
use serde::{Deserialize, Serialize};

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
    /// Ring bytes only: the same map over the entries the first tbt steps wrote after the
    /// prefill (a truncating tbt writer leaves the prefill's entries whole), per ring whose
    /// bytes changed in exactly one entry per step.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tbt_written: Vec<ZtapCache>,
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
