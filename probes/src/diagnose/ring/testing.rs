//! Hand-made ring facts for the rule tests: [`healthy_facts`] is a run every control passes with
//! margin, [`cache_path`] adds clean cache-path probes; a test changes only what it is about.

use kvprobe_schema::test_findings::comparison;
use kvprobe_schema::{
    CacheKind, ColmapFinding, InferredCache, InjectFinding, Layout, LayoutCache, LayoutFinding,
    LayoutInferFinding, MaskVariant, MaskconvFinding, PartialSwap, PositionPoint, PositionsFinding,
    QuantCacheRow, QuantFinding, ScaleFit, ThetaCheck, ZtapCache, ZtapFinding,
};

use super::facts::{GreedyStats, RingFacts, RowStats};
use crate::diagnose::engine::{Cause, Rule};

/// Two layers, K and V rings each.
pub const RINGS: [(usize, CacheKind); 4] = [
    (0, CacheKind::K),
    (0, CacheKind::V),
    (1, CacheKind::K),
    (1, CacheKind::V),
];

pub fn rows(mean: f64, min: f64, count: usize) -> RowStats {
    RowStats {
        mean,
        min,
        count,
        top1: 1.0,
    }
}

pub fn quant(inconsistent: &[usize]) -> QuantFinding {
    let caches: Vec<QuantCacheRow> = RINGS
        .iter()
        .enumerate()
        .map(|(i, (layer, kind))| QuantCacheRow {
            cache_id: i as u32,
            layer: Some(*layer),
            kind: Some(*kind),
            prefill_input: None,
            prefill_output: None,
            tbt_input: None,
            tbt_output: None,
            consistent: !inconsistent.contains(&i),
            max_scale_ratio: if inconsistent.contains(&i) { 1.5 } else { 1.0 },
        })
        .collect();
    QuantFinding {
        caches,
        mask: None,
        mask_allowed_value: None,
        embeddings: None,
        inconsistent_caches: inconsistent.len(),
    }
}

/// Every control passes with margin on a RoPE model; no discriminator ran yet.
pub fn healthy_facts() -> RingFacts {
    RingFacts {
        has_tbt: true,
        rope_table: true,
        learned_positions: false,
        prompt_len: 13,
        quant: quant(&[]),
        single: rows(0.9999, 0.9995, 4),
        multi: rows(0.9998, 0.9990, 2),
        selfmask: Some(rows(1.0, 0.9999, 4)),
        greedy: GreedyStats {
            steps: 16,
            tbt_mean: Some(0.9995),
            tbt_min: 0.998,
            tbt_top1: 0.94,
            first_divergence: None,
            matched: None,
        },
        prefill_scale: Some(scale(0.9999, 0.99995, 1.0)),
        ..RingFacts::default()
    }
}

/// `healthy` with clean cache-path probes (positions, maskconv, layout, inject, ztap, colmap).
pub fn cache_path() -> RingFacts {
    RingFacts {
        positions: Some(positions(0.999, 0, 0.999)),
        maskconv: Some(maskconv(0.999, &[("left-valid", 0.3), ("shift+1", 0.8)])),
        layout: Some(layout(Layout::TokenMajor, 0, 0.99, &[])),
        inject: Some(inject(0.999, 0.999, 0.2, "none")),
        ztap: Some(ztap(&[], "none")),
        colmap: Some(colmap(0.95, Some(true))),
        ..healthy_facts()
    }
}

pub fn scale(unit: f64, best: f64, at: f64) -> ScaleFit {
    ScaleFit {
        points: vec![(1.0, unit), (at, best)],
        best_scale: at,
        best_cosine: best,
        unit_cosine: unit,
        against_matched: None,
    }
}

/// The first tbt step at the server's position (`baseline`) and at the best shift.
pub fn positions(baseline: f64, delta: i64, best: f64) -> PositionsFinding {
    PositionsFinding {
        points: (-4..=4)
            .map(|d| PositionPoint {
                delta: d,
                comparison: comparison(if d == delta { best } else { baseline - 0.1 }),
            })
            .collect(),
        best_delta: delta,
        best_cosine: best,
        baseline_cosine: baseline,
        scale: None,
    }
}

/// The ring mask at `ring`, then the named variants; `reproduces` as maskconv marks it.
pub fn maskconv(ring: f64, variants: &[(&str, f64)]) -> MaskconvFinding {
    let variant = |name: &str, c: f64| MaskVariant {
        name: name.into(),
        comparison: comparison(c),
        reproduces: name != "ring" && c >= 0.94 && c >= ring + 0.02,
    };
    MaskconvFinding {
        variants: std::iter::once(variant("ring", ring))
            .chain(variants.iter().map(|(n, c)| variant(n, *c)))
            .collect(),
        other_heads_ignored_cosine: Some(0.5),
        best: None,
        prefill_other_heads_ignored_cosine: Some(0.6),
        prefill_per_head_reference_cosine: Some(0.7),
    }
}

/// Writer majority `best` at `shift` with score `score`; `other` rings (indices into
/// [`RINGS`]) decode cleanly as feature-major, the rest token-major.
pub fn layout(best: Layout, shift: i64, score: f64, other: &[usize]) -> LayoutFinding {
    let caches = RINGS
        .iter()
        .enumerate()
        .map(|(i, (layer, kind))| {
            let odd = other.contains(&i);
            LayoutCache {
                cache_id: i as u32,
                layer: Some(*layer),
                kind: Some(*kind),
                scores: Vec::new(),
                best_layout: if odd { Layout::FeatureMajor } else { best },
                best_shift: shift,
                best_score: if odd { 0.95 } else { score },
                token_major_score: if best == Layout::TokenMajor && shift == 0 && !odd {
                    score
                } else {
                    0.05
                },
            }
        })
        .collect();
    LayoutFinding {
        caches,
        shifts: vec![-1, 0, 1],
        writer_layout: best,
        writer_shift: shift,
        writer_score: score,
    }
}

pub fn inject(device: f64, golden: f64, swapped: f64, blame: &str) -> InjectFinding {
    InjectFinding {
        device_rings: comparison(device),
        golden: comparison(golden),
        golden_swapped: comparison(swapped),
        blame: blame.into(),
        partial_swap: None,
        reader_layout: None,
        golden_left_valid: None,
        crossed_writes: Vec::new(),
    }
}

pub fn partial(layers: &[usize], cosine: f64) -> Option<PartialSwap> {
    Some(PartialSwap {
        layers: layers.to_vec(),
        comparison: comparison(cosine),
    })
}

/// `cut` rings (indices into [`RINGS`]) keep 48 of 64 bytes.
pub fn ztap(cut: &[usize], interpretation: &str) -> ZtapFinding {
    let caches = RINGS
        .iter()
        .enumerate()
        .map(|(i, (layer, kind))| {
            let c = cut.contains(&i);
            ZtapCache {
                cache_id: i as u32,
                layer: Some(*layer),
                kind: Some(*kind),
                entries: 13,
                width: 64,
                zero_columns: if c { 16 } else { 0 },
                zero_map: Vec::new(),
                empty_entries: 10,
                expected_transposed_zero_columns: 20.0,
                interpretation: if c { "truncation" } else { "none" }.into(),
            }
        })
        .collect();
    ZtapFinding {
        source: "ring-bytes".into(),
        caches,
        interpretation: interpretation.into(),
        tbt_written: Vec::new(),
    }
}

pub fn colmap(diagonal: f64, empty_identical: Option<bool>) -> ColmapFinding {
    ColmapFinding {
        query_token: 0,
        query_position: 13,
        entries: Vec::new(),
        positions: Vec::new(),
        position_tokens: Vec::new(),
        matrix: Vec::new(),
        rows: Vec::new(),
        diagonal_strength: diagonal,
        best_off_diagonal: 0.2,
        best_shift: 0,
        best_shift_score: diagonal,
        best_permutation_score: diagonal,
        clean_rows: 10,
        mixture_rows: 3,
        empty_rows_identical: empty_identical,
        empty_rows_spread: empty_identical.map(|i| if i { 0.0 } else { 0.3 }),
        covered_all: true,
    }
}

pub fn theta(declared: f64, other: f64) -> ThetaCheck {
    ThetaCheck {
        declared: "plain".into(),
        rows: 4,
        declared_cosine: declared,
        other_cosine: other,
    }
}

/// One edge per ring solved to `named` (None = a map outside the named list) at `shift`.
pub fn layout_infer(named: Option<Layout>, shift: i64) -> LayoutInferFinding {
    let caches = RINGS
        .iter()
        .enumerate()
        .map(|(i, (layer, kind))| InferredCache {
            cache_id: i as u32,
            layer: Some(*layer),
            kind: Some(*kind),
            explained: true,
            fraction_explained: 0.95,
            residual_cosine: 0.9,
            shift,
            formula: "ℓ(t, c) = 64·t + c".into(),
            description: "test map".into(),
            digits: Vec::new(),
            tile: 8,
            named,
            runner_up: None,
            runner_up_fraction: 0.0,
            slot_fraction: Vec::new(),
            column_fraction: Vec::new(),
        })
        .collect();
    LayoutInferFinding {
        caches,
        prompt_tokens: 8,
        window: 8,
        features: 64,
        candidates: 10,
        shifts_searched: 24,
        tolerance_steps: 1.5,
        threshold: 0.75,
        unexplained: 0,
        writer_formula: None,
        writer_description: None,
        writer_shift: None,
        outlier_edges: Vec::new(),
    }
}

/// The rule of `table` named `id` (panics in tests when absent).
/// A kvdiff finding whose first-layer rotation, read at `step`, is `explained` or not.
pub fn kvdiff_rotation(explained: bool, step: usize) -> kvprobe_schema::KvdiffFinding {
    kvprobe_schema::KvdiffFinding {
        source: "ring".into(),
        layout: "token-major".into(),
        precision: "uint8".into(),
        layers: 2,
        kv_heads: 1,
        prompt_len: 4,
        steps: Vec::new(),
        first_divergent: None,
        k_map: Vec::new(),
        v_map: Vec::new(),
        outside_map: Vec::new(),
        first_layer_rotation: Some(kvprobe_schema::KvdiffRotation {
            layer: 0,
            step,
            k_rel_l2: 0.6,
            rotated_rel_l2: 0.03,
            v_rel_l2: 0.05,
            band: 0.04,
            mean_angle_per_frequency: vec![0.5],
            explained,
        }),
    }
}

pub fn rule<'t, F>(table: &'t [Rule<F>], id: &str) -> &'t Rule<F> {
    table
        .iter()
        .find(|r| r.id == id)
        .unwrap_or_else(|| panic!("no rule {id}"))
}

/// Evaluates one rule alone.
pub fn fires<F>(table: &[Rule<F>], id: &str, f: &F) -> Option<Cause> {
    (rule(table, id).check)(f)
}
