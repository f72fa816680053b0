//! `kvdiff` (issue 20): the device's K/V cache against the reference, per layer × KV head ×
//! position, after the prefill and after every greedy step; the first layer (and head) whose
//! cache leaves the band its declared precision allows.

use serde::{Deserialize, Serialize};

use crate::CacheKind;

/// The relative L2 of a head vector that holds inf or NaN (JSON holds no non-finite number).
pub const KVDIFF_NON_FINITE: f64 = f64::MAX;

/// A relative L2 as the evidence prints it.
fn rel_l2_text(x: f64) -> String {
    if x >= KVDIFF_NON_FINITE {
        "non-finite (inf/NaN in the device's entry)".into()
    } else {
        format!("{x:.4}")
    }
}

/// One comparison point: the cache after the prefill (step 0) or after greedy step `step`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KvdiffStep {
    pub step: usize,
    /// Positions compared (those the cache still holds).
    pub positions: usize,
    /// `[layer][kv_head]`: the largest relative L2 (‖device − reference‖ / ‖reference‖ of one
    /// position's head vector) over the positions, for K and V.
    pub k_rel_l2: Vec<Vec<f64>>,
    pub v_rel_l2: Vec<Vec<f64>>,
    /// `[layer][kv_head]`: the smallest cosine over the positions.
    pub k_cosine: Vec<Vec<f64>>,
    pub v_cosine: Vec<Vec<f64>>,
    /// The first layer (then head, K before V) outside the band at this step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_divergent: Option<KvdiffDivergence>,
}

/// Where a cache first leaves its precision band.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KvdiffDivergence {
    pub step: usize,
    pub layer: usize,
    pub kv_head: usize,
    pub kind: CacheKind,
    /// The position with the largest miss in that layer and head.
    pub position: usize,
    /// Its relative L2 against the f32 reference and against the precision-matched reference.
    pub rel_l2: f64,
    pub matched_rel_l2: f64,
    /// The band it left (relative L2 against the precision-matched reference).
    pub band: f64,
    /// Positions of that layer and head outside the band.
    pub positions_outside: usize,
}

/// The first layer's K against its reference as a rotation: K leaves its band while V of the
/// same layer stays inside, and rotating each RoPE pair of the device's K by one angle per
/// (pair, position) brings it back inside (the positional encoding of K differs; nothing else).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KvdiffRotation {
    pub layer: usize,
    /// The cache it was read from: 0 after the prefill, k after greedy step k (the first whose
    /// layer-0 K leaves its band, where the prefill's stays inside).
    #[serde(default)]
    pub step: usize,
    /// Largest K relative L2 over heads and positions before and after the best rotation.
    pub k_rel_l2: f64,
    pub rotated_rel_l2: f64,
    /// Largest V relative L2 of that layer (inside its band for the rotation to count).
    pub v_rel_l2: f64,
    pub band: f64,
    /// Mean |angle| the device's pairs are off (radians), per RoPE frequency index.
    pub mean_angle_per_frequency: Vec<f64>,
    /// Whether a pure rotation explains K (rotated miss inside the band, V inside).
    pub explained: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KvdiffFinding {
    /// Where the device's cache came from and how it was decoded (ring bytes through the
    /// writer layout and quant, stateful states, host present tensors).
    pub source: String,
    /// The writer layout the ring bytes were decoded with, and who named it.
    pub layout: String,
    /// What the band is made of (the declared precision).
    pub precision: String,
    pub layers: usize,
    pub kv_heads: usize,
    pub prompt_len: usize,
    pub steps: Vec<KvdiffStep>,
    /// The earliest step's first divergent layer and head.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_divergent: Option<KvdiffDivergence>,
    /// `[layer][position]` after the last step: the largest relative L2 over KV heads against
    /// the f32 reference, K and V (−1 = position not in the cache).
    pub k_map: Vec<Vec<f64>>,
    pub v_map: Vec<Vec<f64>>,
    /// `[layer][position]` after the last step: 1 where some head is outside the band.
    pub outside_map: Vec<Vec<bool>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_layer_rotation: Option<KvdiffRotation>,
}

impl KvdiffFinding {
    /// One line for a verdict's evidence.
    pub fn evidence(&self) -> String {
        match &self.first_divergent {
            None => format!(
                "kvdiff: every layer's K and V stay inside the declared precision band ({} layers × {} KV heads, {} comparison points)",
                self.layers,
                self.kv_heads,
                self.steps.len()
            ),
            Some(d) => format!(
                "kvdiff: first divergent layer {} (KV head {}, {}) {} at position {}: relative L2 {} against the f32 reference, {} against the precision-matched one (band {:.4}), {} positions outside",
                d.layer,
                d.kv_head,
                match d.kind {
                    CacheKind::K => "K",
                    CacheKind::V => "V",
                },
                if d.step == 0 {
                    "after the prefill".to_string()
                } else {
                    format!("after greedy step {}", d.step)
                },
                d.position,
                rel_l2_text(d.rel_l2),
                rel_l2_text(d.matched_rel_l2),
                d.band,
                d.positions_outside
            ),
        }
    }
}
