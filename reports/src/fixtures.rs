//! Hand-built `Results` for tests and demos: a healthy run with a clean diagonal colmap and a
//! faulty one (reader/writer layout mismatch) with mixture rows, both carrying hostile strings
//! in every user- or model-derived field. Shapes match real runs (L = 128, 96 prompt tokens).

use kvprobe_schema::*;

/// Deterministic noise in [-1, 1] (no RNG dependency, same on every platform).
fn noise(a: usize, b: usize, seed: u64) -> f64 {
    let mut x = (a as u64)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add((b as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F))
        .wrapping_add(seed);
    x ^= x >> 29;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 32;
    (x % 20_001) as f64 / 10_000.0 - 1.0
}

pub const HOSTILE_PROMPT: &str = "<script>alert(1)</script> \"&' The quick brown fox";

/// Token texts for `n` prompt positions, hostile ones first.
pub fn prompt_tokens(n: usize) -> Vec<String> {
    let hostile = [
        "<script>",
        "alert(1)",
        "</script>",
        " \"&'",
        "\n",
        "\u{0}",
        "=cmd|' /C calc'!A0",
        "<img src=x onerror=alert(2)>",
        " a,b",
    ];
    let words = [
        " The",
        " quick",
        " brown",
        " fox",
        " jumps",
        " over",
        " the",
        " lazy",
        " dog",
        ".",
        " Ä",
        " résumé",
        " 東京",
    ];
    (0..n)
        .map(|i| {
            if i < hostile.len() {
                hostile[i].to_string()
            } else {
                words[i % words.len()].to_string()
            }
        })
        .collect()
}

fn cmp(cosine: f64, top1: u32, matched: bool) -> LogitComparison {
    LogitComparison {
        cosine,
        kl: ((1.0 - cosine) * 3.0).max(0.0),
        device_top1: if matched { top1 } else { top1 + 17 },
        reference_top1: top1,
        top1_match: matched,
    }
}

fn provenance(n: usize, faults: Vec<String>) -> Provenance {
    let tokens = prompt_tokens(n);
    let qi = |scale: f32| QuantInfo {
        scale,
        zero_point: 128.0,
        min: -20.0,
        max: 20.0,
    };
    Provenance {
        versions: [(
            "emulator".to_string(),
            "kvprobe-npu hailo-sim 0.1.0".to_string(),
        )]
        .into(),
        command: vec![
            "kvprobe".into(),
            "diagnose".into(),
            "--model".into(),
            "/models/<script>alert(1)</script>/smollm2 \"&'.gguf".into(),
            "--sim".into(),
            "--prompt".into(),
            HOSTILE_PROMPT.into(),
        ],
        kvprobe_version: "0.1.0".into(),
        git_hash: Some("05d56d3".into()),
        model_path: "/models/<script>alert(1)</script>/smollm2 \"&'.gguf".into(),
        model_sha256: "3f0c2b5d9a7e6b1c4d8f0a2e5b7c9d1f3a5c7e9b0d2f4a6c8e0b2d4f6a8c0e2b".into(),
        model_architecture: "gguf:llama".into(),
        backend: "emulator".into(),
        hef_path: None,
        hef_sha256: None,
        sim_manifest: Some(SimManifest {
            device: "hailo-sim".into(),
            schema_version: 1,
            model: ModelIdentity {
                path: "/models/<script>alert(1)</script>/smollm2 \"&'.gguf".into(),
                sha256: "3f0c2b5d".into(),
                architecture: "gguf:llama".into(),
            },
            cache_len: 128,
            prefill_len: 32,
            cache_quant: "uint8".into(),
            cache_heads: "un-expanded".into(),
            weights: "f32".into(),
            taps: true,
            rope_theta: "plain".into(),
            layouts: vec![EdgeLayout {
                group: GroupKind::Tbt,
                cache_id: 0,
                direction: "input".into(),
                layout: Layout::TokenMajor,
            }],
            calibration_prompts: vec!["Once upon a time <b>bold</b>".into()],
            quant: vec![NamedQuant {
                name: "prefill/k0/out".into(),
                quant: qi(0.08),
            }],
            faults,
        }),
        cache_len: 128,
        prefill_len: 32,
        prompt: HOSTILE_PROMPT.into(),
        prompt_ids: (0..n as u32).map(|i| 1000 + i * 7).collect(),
        prompt_tokens: tokens,
        timings: vec![
            Timing {
                what: "load model".into(),
                seconds: 0.512,
            },
            Timing {
                what: "diagnose".into(),
                seconds: 9.25,
            },
        ],
        host: "linux x86_64, 2 cpus".into(),
    }
}

/// Rows = 127 read-window entries, columns = 96 prompt positions; `mix` selects mixtures.
fn colmap(n: usize, entries: usize, mix: bool) -> ColmapFinding {
    let tokens = prompt_tokens(n);
    let mut matrix = vec![vec![0f32; n]; entries];
    let mut rows = Vec::new();
    for (j, row) in matrix.iter_mut().enumerate() {
        let expected = (j < n).then_some(j);
        for (p, cell) in row.iter_mut().enumerate() {
            let base = match (expected, mix) {
                (Some(e), false) if e == p => 0.96 + 0.03 * noise(j, p, 1).abs(),
                // A mixture: the entry's bytes blend four positions (F9-like reader layout).
                (Some(e), true) if p / 4 == e / 4 => 0.35 + 0.1 * noise(j, p, 2),
                (None, true) => 0.15 * noise(j, p, 3),
                (None, false) => 0.02,
                _ => 0.08 * noise(j, p, 4),
            };
            *cell = base as f32;
        }
        let (best_p, best) =
            row.iter().enumerate().fold(
                (0, f32::MIN),
                |acc, (p, v)| if *v > acc.1 { (p, *v) } else { acc },
            );
        let second = row
            .iter()
            .enumerate()
            .filter(|(p, _)| *p != best_p)
            .map(|(_, v)| *v)
            .fold(f32::MIN, f32::max);
        let class = match (expected, mix) {
            (None, _) => ColumnMatch::None,
            (Some(_), false) => ColumnMatch::Clean,
            (Some(_), true) => ColumnMatch::Mixture,
        };
        rows.push(ColmapRow {
            entry: j,
            expected_position: expected,
            best_position: expected.map(|_| best_p),
            best_cosine: best as f64,
            second_cosine: second as f64,
            class,
        });
    }
    let written = n.min(entries);
    ColmapFinding {
        query_token: 4044,
        query_position: n,
        entries: (0..entries).collect(),
        positions: (0..n).collect(),
        position_tokens: tokens,
        matrix,
        rows,
        diagonal_strength: if mix { 0.38 } else { 0.975 },
        best_off_diagonal: if mix { 0.44 } else { 0.079 },
        best_shift: 0,
        best_shift_score: if mix { 0.38 } else { 0.975 },
        best_permutation_score: if mix { 0.41 } else { 0.975 },
        clean_rows: if mix { 0 } else { written },
        mixture_rows: if mix { written } else { 0 },
        empty_rows_identical: Some(!mix),
        empty_rows_spread: Some(if mix { 0.31 } else { 0.0 }),
        covered_all: entries >= 127,
    }
}

fn findings(n: usize, faulty: bool) -> ProbeFindings {
    let caches = caches();
    ProbeFindings {
        prefill: Some(PrefillFinding {
            scale: None,
            token_texts: [(40, "<the>".to_string())].into(),
            rows: (0..n)
                .step_by(8)
                .map(|p| PrefillRow {
                    position: p,
                    comparison: cmp(0.98 + 0.01 * noise(p, 1, 7), 40 + p as u32, true),
                    matched: None,
                })
                .collect(),
            rerun_cosine: 1.0,
            rerun_identical: true,
            min_cosine: 0.97,
            mean_cosine: 0.981,
            top1_agreement: 1.0,
        }),
        greedy: Some(greedy(n, faulty)),
        selfmask: Some(SelfmaskFinding {
            steps: (0..8)
                .map(|s| SelfmaskStep {
                    step: s,
                    position: n + s,
                    input_token: 2000 + s as u32,
                    comparison: cmp(0.985 + 0.01 * noise(s, 2, 8), 500 + s as u32, true),
                })
                .collect(),
            token_texts: Default::default(),
            mean_cosine: 0.985,
            matched_mean_cosine: None,
            control_matched_mean_cosine: None,
            min_cosine: 0.975,
            top1_agreement: 1.0,
        }),
        colmap: Some(colmap(n, 127, faulty)),
        ztap: Some(ztap(n, faulty, &caches)),
        quant: Some(quant(&caches)),
        maskconv: Some(maskconv(faulty)),
        positions: Some(positions(faulty)),
        theta: Some(ThetaCheck {
            declared: "plain".into(),
            rows: 3,
            declared_cosine: if faulty { 0.41 } else { 0.9999 },
            other_cosine: if faulty { 0.9999 } else { 0.41 },
        }),
        layout: Some(layout(&caches)),
        inject: Some(InjectFinding {
            device_rings: cmp(if faulty { 0.45 } else { 0.98 }, 77, !faulty),
            golden: cmp(if faulty { 0.46 } else { 0.98 }, 77, !faulty),
            golden_swapped: cmp(0.2, 77, false),
            blame: if faulty { "reader" } else { "none" }.into(),
            partial_swap: None,
            reader_layout: None,
            golden_left_valid: None,
            crossed_writes: Vec::new(),
        }),
        layout_infer: None,
        cache_precision: None,
        stale: None,
        causality: None,
        splits: None,
        overflow: None,
        state: None,
        determinism: None,
        kvdiff: None,
        not_applicable: Vec::new(),
        extra: Default::default(),
    }
}

/// Eight cache edges: K and V of four layers.
fn caches() -> Vec<(u32, usize, CacheKind)> {
    (0..8u32)
        .map(|id| {
            (
                id,
                id as usize / 2,
                if id % 2 == 0 {
                    CacheKind::K
                } else {
                    CacheKind::V
                },
            )
        })
        .collect()
}

fn greedy(n: usize, faulty: bool) -> GreedyFinding {
    let steps = 32;
    let greedy_steps: Vec<GreedyStep> = (0..steps)
        .map(|s| {
            let cos = if faulty && s > 0 {
                0.45 + 0.2 * noise(s, 0, 5)
            } else {
                0.975 + 0.015 * noise(s, 0, 6)
            };
            // Healthy: one INT8 top-1 flip at step 13; faulty: two of three tbt steps differ.
            let matched = if faulty {
                s == 0 || s % 3 == 0
            } else {
                s != 13
            };
            GreedyStep {
                step: s,
                position: n - 1 + s,
                input_token: 2000 + s as u32,
                visible_keys: n + s,
                comparison: cmp(cos, 300 + s as u32, matched),
                reference_margin: 0.0,
                near_tie: false,
                matched: None,
            }
        })
        .collect();
    GreedyFinding {
        first_divergence: greedy_steps
            .iter()
            .find(|s| !s.comparison.top1_match)
            .map(|s| s.step),
        device_ids: (0..steps as u32).map(|i| 300 + i).collect(),
        device_text: if faulty {
            " the the <script>alert(3)</script>\n\u{1b}[31m garbage".into()
        } else {
            " jumps over the lazy dog.\nThe end.".into()
        },
        reference_ids: (0..steps as u32).map(|i| 300 + i).collect(),
        reference_text: " jumps over the lazy dog.\nThe end.".into(),
        mean_cosine: if faulty { 0.47 } else { 0.975 },
        min_cosine: if faulty { 0.25 } else { 0.96 },
        top1_agreement: if faulty { 0.34 } else { 0.97 },
        tbt_mean_cosine: Some(if faulty { 0.45 } else { 0.975 }),
        near_tie_flips: 0,
        matched: None,
        token_texts: Default::default(),
        steps: greedy_steps,
    }
}

fn ztap(n: usize, faulty: bool, caches: &[(u32, usize, CacheKind)]) -> ZtapFinding {
    ZtapFinding {
        source: "taps".into(),
        caches: caches
            .iter()
            .map(|(id, layer, kind)| {
                let width = 192;
                let empty = 127 - n;
                let zero_map: Vec<bool> = (0..width)
                    .map(|k| faulty && k >= width - width * empty / 127)
                    .collect();
                ZtapCache {
                    cache_id: *id,
                    layer: Some(*layer),
                    kind: Some(*kind),
                    entries: 127,
                    width,
                    zero_columns: zero_map.iter().filter(|z| **z).count(),
                    zero_map,
                    empty_entries: empty,
                    expected_transposed_zero_columns: (empty * width) as f64 / 127.0,
                    interpretation: if faulty { "transposition" } else { "none" }.into(),
                }
            })
            .collect(),
        interpretation: if faulty { "transposition" } else { "none" }.into(),
        tbt_written: Vec::new(),
    }
}

fn quant(caches: &[(u32, usize, CacheKind)]) -> QuantFinding {
    let qi = |scale: f32| QuantInfo {
        scale,
        zero_point: 128.0,
        min: -20.0,
        max: 20.0,
    };
    QuantFinding {
        caches: caches
            .iter()
            .map(|(id, layer, kind)| QuantCacheRow {
                cache_id: *id,
                layer: Some(*layer),
                kind: Some(*kind),
                prefill_input: Some(qi(0.08)),
                prefill_output: Some(qi(0.08)),
                tbt_input: Some(qi(0.08)),
                tbt_output: Some(qi(0.08)),
                consistent: true,
                max_scale_ratio: 1.0,
            })
            .collect(),
        mask: Some(QuantInfo {
            scale: 1.0 / 255.0,
            zero_point: 0.0,
            min: 0.0,
            max: 1.0,
        }),
        mask_allowed_value: Some(255),
        embeddings: None,
        inconsistent_caches: 0,
    }
}

fn maskconv(faulty: bool) -> MaskconvFinding {
    MaskconvFinding {
        variants: ["ring", "left-valid", "shift-1", "shift+1", "per-head"]
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let good = !faulty && i == 0;
                MaskVariant {
                    name: name.to_string(),
                    comparison: cmp(if good { 0.98 } else { 0.5 - 0.05 * i as f64 }, 77, good),
                    reproduces: good,
                }
            })
            .collect(),
        other_heads_ignored_cosine: Some(0.41),
        best: (!faulty).then(|| "ring".to_string()),
        prefill_other_heads_ignored_cosine: Some(0.38),
        prefill_per_head_reference_cosine: Some(0.36),
    }
}

fn positions(faulty: bool) -> PositionsFinding {
    PositionsFinding {
        scale: None,
        points: (-4..=4)
            .map(|d: i64| PositionPoint {
                delta: d,
                comparison: cmp(
                    if faulty {
                        0.45
                    } else {
                        0.98 - 0.1 * d.unsigned_abs() as f64
                    },
                    77,
                    !faulty && d == 0,
                ),
            })
            .collect(),
        best_delta: 0,
        best_cosine: if faulty { 0.45 } else { 0.98 },
        baseline_cosine: if faulty { 0.45 } else { 0.98 },
    }
}

fn layout(caches: &[(u32, usize, CacheKind)]) -> LayoutFinding {
    let shifts: Vec<i64> = (-2..=2).collect();
    LayoutFinding {
        caches: caches
            .iter()
            .map(|(id, layer, kind)| {
                let scores: Vec<LayoutScore> = Layout::ALL
                    .iter()
                    .flat_map(|l| {
                        shifts.iter().map(move |s| LayoutScore {
                            layout: *l,
                            shift: *s,
                            score: if *l == Layout::TokenMajor && *s == 0 {
                                0.995
                            } else {
                                0.1 * noise(*id as usize, (*s + 10) as usize, 9)
                            },
                        })
                    })
                    .collect();
                LayoutCache {
                    cache_id: *id,
                    layer: Some(*layer),
                    kind: Some(*kind),
                    scores,
                    best_layout: Layout::TokenMajor,
                    best_shift: 0,
                    best_score: 0.995,
                    token_major_score: 0.995,
                }
            })
            .collect(),
        shifts,
        writer_layout: Layout::TokenMajor,
        writer_shift: 0,
        writer_score: 0.995,
    }
}

/// A healthy diagnose run: diagonal colmap, cosines around 0.97-0.99 (INT8 edges).
pub fn healthy_results() -> Results {
    let n = 96;
    Results {
        schema_version: SCHEMA_VERSION,
        command: "diagnose".into(),
        verdict: Some(Verdict::Healthy),
        confidence: Some(0.93),
        evidence: vec![
            "greedy: mean cosine 0.975 over 32 steps, top-1 97 %".into(),
            "colmap: diagonal strength 0.975, 96 clean rows".into(),
        ],
        also: vec![],
        warnings: vec![],
        stage: None,
        hypothesis: None,
        reproducer: None,
        incomplete: None,
        probes: findings(n, false),
        provenance: provenance(n, vec![]),
    }
}

/// A faulty run (reader layout ≠ writer layout, F9): mixtures in colmap, greedy drops after
/// step 0; evidence quotes hostile strings.
pub fn faulty_results() -> Results {
    let n = 96;
    Results {
        schema_version: SCHEMA_VERSION,
        command: "diagnose".into(),
        verdict: Some(Verdict::CacheLayoutMismatch),
        confidence: Some(0.87),
        evidence: vec![
            "greedy: tbt mean cosine 0.45 after a prefill at 0.98".into(),
            "colmap: 96 mixture rows, never-written rows differ (spread 0.31)".into(),
            "inject: golden token-major rings still fail → the reader is at fault".into(),
            "prompt was <script>alert(1)</script> \"&'".into(),
        ],
        also: vec![Verdict::CacheQuantization],
        warnings: vec!["placement: <b>offset</b> advanced by P on a short first chunk".into()],
        stage: None,
        hypothesis: Some(super::fixtures_replay::faulty_hypothesis()),
        reproducer: Some(super::fixtures_replay::faulty_reproducer()),
        incomplete: None,
        probes: findings(n, true),
        provenance: provenance(
            n,
            vec!["reader-layout=feature-major".into(), "<script>".into()],
        ),
    }
}

/// A colmap on a real-size cache: L = 2048, `written` prompt tokens plus a few empty entries.
pub fn large_colmap_results(written: usize) -> Results {
    let mut r = healthy_results();
    let mut c = colmap(written, written + 8, false);
    c.covered_all = false;
    r.probes.colmap = Some(c);
    r.provenance.cache_len = 2048;
    r.provenance.prompt_ids = (0..written as u32).collect();
    r.provenance.prompt_tokens = prompt_tokens(written);
    r
}
