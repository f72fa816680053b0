//! What `layout --infer` found: the cache layout solved from the ring bytes, per cache edge.

use serde::{Deserialize, Serialize};

use crate::device::{CacheKind, Layout};

/// Which logical axis a digit of a strided map indexes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MapAxis {
    Token,
    Feature,
}

/// One digit of a strided map: `⌊x/divisor⌋ mod size` of the axis, times `stride` elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapDigit {
    pub axis: MapAxis,
    pub size: usize,
    /// Elements between consecutive values of this digit (full tiles).
    pub stride: usize,
    /// 1 for a low digit; the tile/group size for a high digit.
    pub divisor: usize,
}

/// The solved layout of one cache edge.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InferredCache {
    pub cache_id: u32,
    pub layer: Option<usize>,
    pub kind: Option<CacheKind>,
    /// The best map explains at least the finding's threshold of the prompt's elements.
    pub explained: bool,
    /// Fraction of the prompt's K/V elements found, within the tolerance, where the map puts them.
    pub fraction_explained: f64,
    /// Cosine of per-feature-centred ring values and reference at the mapped places.
    pub residual_cosine: f64,
    /// Slot shift relative to the ring prediction (position p's window at slot p mod L + shift).
    pub shift: i64,
    /// `ℓ(t, c) = …` in elements of the writer's window.
    pub formula: String,
    pub description: String,
    /// Outer → inner.
    pub digits: Vec<MapDigit>,
    /// Tokens per tile (= the window when untiled); the last tile may be narrower.
    pub tile: usize,
    /// The named layout ([`Layout::ALL`]) equal to this map, if any.
    pub named: Option<Layout>,
    /// The best map that differs from this one (layout or shift), and its fraction.
    pub runner_up: Option<String>,
    pub runner_up_fraction: f64,
    /// Fraction explained per ring slot under the best map (heatmap row); −1 = the map puts no
    /// prompt element in that slot.
    pub slot_fraction: Vec<f32>,
    /// Fraction explained per element column of an entry (binned to at most 64), −1 = none.
    pub column_fraction: Vec<f32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayoutInferFinding {
    pub caches: Vec<InferredCache>,
    /// Prompt tokens prefilled: the prompt cut to one prefill run (`min(n, P)`).
    pub prompt_tokens: usize,
    /// Writer window `N` (entries per prefill run) and elements per entry `C` the maps are over.
    pub window: usize,
    pub features: usize,
    /// Maps and slot shifts searched per edge.
    pub candidates: usize,
    pub shifts_searched: usize,
    /// An element is explained within this many quantisation steps of the reference.
    pub tolerance_steps: f64,
    /// Below this fraction an edge is reported `unexplained`.
    pub threshold: f64,
    /// Edges whose best map falls below the threshold.
    pub unexplained: usize,
    /// Most common formula and shift over the explained edges (None when none is explained).
    pub writer_formula: Option<String>,
    pub writer_description: Option<String>,
    pub writer_shift: Option<i64>,
    /// Edges that do not follow the majority (formula or shift) or are unexplained.
    pub outlier_edges: Vec<String>,
}

impl LayoutInferFinding {
    /// One line for a report or a verdict's evidence.
    pub fn evidence(&self) -> String {
        let f = self;
        let n = f.caches.len();
        let mut s = match (&f.writer_description, &f.writer_formula, f.writer_shift) {
            (Some(d), Some(formula), Some(shift)) => {
                let follow = f
                    .caches
                    .iter()
                    .filter(|c| c.explained && c.formula == *formula && c.shift == shift)
                    .collect::<Vec<_>>();
                let min = follow
                    .iter()
                    .map(|c| c.fraction_explained)
                    .fold(1.0, f64::min);
                format!(
                    "layout --infer: {}/{n} cache edges follow {d} [{formula}] at slot shift {shift:+} (each explains ≥ {:.2} of its prompt elements)",
                    follow.len(),
                    min
                )
            }
            _ => {
                let best = f
                    .caches
                    .iter()
                    .max_by(|a, b| a.fraction_explained.total_cmp(&b.fraction_explained));
                match best {
                    Some(b) => format!(
                        "layout --infer: no cache edge explained (threshold {:.2}); the closest map, {} at slot shift {:+} on {}, explains {:.2} of the prompt elements",
                        f.threshold,
                        b.description,
                        b.shift,
                        edge_name(b.layer, b.kind, b.cache_id),
                        b.fraction_explained
                    ),
                    None => "layout --infer: the device has no cache edge".to_string(),
                }
            }
        };
        if f.writer_formula.is_some() && !f.outlier_edges.is_empty() {
            let shown: Vec<&str> = f.outlier_edges.iter().take(6).map(String::as_str).collect();
            let more = f.outlier_edges.len() - shown.len();
            s += &format!(
                "; differ or unexplained: {}{}",
                shown.join(", "),
                if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                }
            );
        }
        s
    }
}

/// `K3`, `V0`, or `cache 7` when the role is unknown.
pub fn edge_name(layer: Option<usize>, kind: Option<CacheKind>, id: u32) -> String {
    match (layer, kind) {
        (Some(l), Some(CacheKind::K)) => format!("K{l}"),
        (Some(l), Some(CacheKind::V)) => format!("V{l}"),
        _ => format!("cache {id}"),
    }
}

#[cfg(test)]
mod tests {
    use crate::ProbeFindings;

    #[test]
    fn results_written_before_layout_infer_still_load() {
        let old = r#"{"layout": null}"#;
        let p: ProbeFindings = serde_json::from_str(old).expect("old findings load");
        assert!(p.layout_infer.is_none());
        // and a finding without it does not write the key at all
        let s = serde_json::to_string(&ProbeFindings::default()).unwrap();
        assert!(!s.contains("layout_infer"), "{s}");
    }
}
