//! Weights kept in their storage type (issue 21 "Memory"): a bf16 / f16 checkpoint loaded by
//! `Model::load` (mapped, converted a tile at a time in every product) against the same values
//! held as an f32 copy (`hf::load` / `gguf::load` materialise every tensor as f32, and
//! `Model::from_parts` computes on those): within 1e-6 relative, prompt logits and KV decode steps.

mod common;

use candle_core::quantized::GgmlDType;
use candle_core::DType;
use common::ids;
use kvprobe_reference::arch_fixtures::{write_hf, FixtureArch, Geometry};
use kvprobe_reference::fixtures::{write_tiny_gpt2_with, write_tiny_llama_with, FixtureOptions};
use kvprobe_reference::fixtures_gguf::write_gguf;
use kvprobe_reference::{gguf, hf, ForwardOptions, KeySet, Model};

/// Wide enough that the lm_head / embedding (3000 rows of 256) and the MLP's gate and up (2560
/// rows) are multiplied in several tiles.
const WIDE: Geometry = Geometry {
    hidden: 256,
    heads: 4,
    kv_heads: 2,
    head_dim: 64,
    intermediate: 2560,
    vocab: 3000,
    ..Geometry::TINY_QWEN2
};

fn max_rel(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = a
        .iter()
        .fold(0f32, |m, x| m.max(x.abs()))
        .max(f32::MIN_POSITIVE);
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
        / scale
}

/// Prompt logits, then 5 decode steps on the KV state, concatenated.
fn run(m: &Model, x: &[u32]) -> Vec<f32> {
    let mut all = m.forward(x, &ForwardOptions::default()).unwrap().logits;
    let mut state = m
        .prefix_state(&x[..8], &(0..8).collect::<Vec<_>>())
        .unwrap();
    for (i, &t) in x[8..13].iter().enumerate() {
        all.extend(m.decode_step(&mut state, t, 8 + i).unwrap());
    }
    // one step attending to a subset, as the probes' colmap does
    all.extend(
        m.step(&state, x[13], 13, &KeySet::Subset(vec![0, 3]))
            .unwrap(),
    );
    all
}

fn check(what: &str, stored: &Model, copy: &Model) {
    let x = ids(15, stored.config().vocab_size, 11);
    let (a, b) = (run(copy, &x), run(stored, &x));
    let r = max_rel(&a, &b);
    assert!(r <= 1e-6, "{what}: max relative difference {r}");
}

#[test]
fn half_hf_folders_equal_their_f32_copy() {
    let cases: Vec<(FixtureArch, Geometry)> = vec![
        (FixtureArch::Qwen2, Geometry::TINY_QWEN2),
        (FixtureArch::Qwen3, Geometry::TINY_QWEN3),
        (FixtureArch::Llama3, Geometry::TINY_LLAMA3),
        (FixtureArch::Qwen2, WIDE),
        (
            FixtureArch::Llama3,
            Geometry {
                llama3: Some((8.0, 1.0, 4.0, 64)),
                rope_theta: 1e4,
                ..WIDE
            },
        ),
    ];
    for (arch, g) in cases {
        for dtype in [DType::BF16, DType::F16] {
            let d = tempfile::tempdir().unwrap();
            let opts = FixtureOptions { shards: 1, dtype };
            write_hf(d.path(), arch, &g, 5, &opts).unwrap();
            let stored = Model::load(d.path()).unwrap();
            let p = hf::load(d.path()).unwrap();
            let copy = Model::from_parts(p.config, p.weights, p.tokenizer).unwrap();
            check(
                &format!("{} hidden {} {dtype:?}", arch.name(), g.hidden),
                &stored,
                &copy,
            );
        }
    }
    // the two families of the original fixtures (GPT-2: Conv1D weights, learned positions)
    for dtype in [DType::BF16, DType::F16] {
        let opts = FixtureOptions { shards: 2, dtype };
        for gpt2 in [false, true] {
            let d = tempfile::tempdir().unwrap();
            if gpt2 {
                write_tiny_gpt2_with(d.path(), 3, &opts).unwrap();
            } else {
                write_tiny_llama_with(d.path(), 3, &opts).unwrap();
            }
            let stored = Model::load(d.path()).unwrap();
            let p = hf::load(d.path()).unwrap();
            let copy = Model::from_parts(p.config, p.weights, p.tokenizer).unwrap();
            check(&format!("gpt2 {gpt2} {dtype:?}"), &stored, &copy);
        }
    }
}

#[test]
fn half_gguf_files_equal_the_hf_folder() {
    // The same bf16 values as a GGUF file (llama: q/k rows permuted by the converter and
    // restored by the loader in their stored bytes) and as an HF folder: the same logits.
    for (arch, g) in [
        (FixtureArch::Qwen2, WIDE),
        (FixtureArch::Qwen3, Geometry::TINY_QWEN3),
        (FixtureArch::Llama3, Geometry::TINY_LLAMA3),
    ] {
        let d = tempfile::tempdir().unwrap();
        let opts = FixtureOptions {
            shards: 1,
            dtype: DType::BF16,
        };
        write_hf(d.path(), arch, &g, 9, &opts).unwrap();
        let file = d.path().join("m.gguf");
        write_gguf(&file, arch, &g, 9, GgmlDType::BF16).unwrap();
        let from_hf = Model::load(d.path()).unwrap();
        let from_gguf = Model::load(&file).unwrap();
        check(arch.name(), &from_gguf, &from_hf);
        // and the f32 copy of the GGUF file
        let p = gguf::load(&file).unwrap();
        let copy = Model::from_parts(p.config, p.weights, p.tokenizer).unwrap();
        check(&format!("{} gguf copy", arch.name()), &from_gguf, &copy);
    }
}

#[test]
fn embedding_rows_are_the_table() {
    let d = tempfile::tempdir().unwrap();
    let opts = FixtureOptions {
        shards: 1,
        dtype: DType::BF16,
    };
    write_hf(
        d.path(),
        FixtureArch::Qwen2,
        &Geometry::TINY_QWEN2,
        2,
        &opts,
    )
    .unwrap();
    let m = Model::load(d.path()).unwrap();
    assert_eq!(m.embedding_dims(), (300, 64));
    let t: Vec<Vec<f32>> = m.embedding_table().to_vec2().unwrap();
    assert_eq!(m.embedding_rows(7, 10).unwrap(), t[7..10].concat());
    assert!(m.embedding_rows(299, 301).is_err());
    // bf16 weights: 2 bytes per value, the tied lm_head counted once
    let g = Geometry::TINY_QWEN2;
    let per_layer = g.hidden * (g.heads + 2 * g.kv_heads) * g.head_dim
        + g.heads * g.head_dim * g.hidden
        + 3 * g.hidden * g.intermediate;
    let biases = 4 * g.layers * (g.heads + 2 * g.kv_heads) * g.head_dim;
    assert_eq!(
        m.stored_weight_bytes(),
        2 * (g.vocab * g.hidden + g.layers * per_layer) + biases
    );
}
