//! Exports of onnxruntime-genai's own model builder (issue 35: GroupQueryAttention, one shared
//! KV buffer per layer written in place, positions implied by the mask, fp32 / fp16 / int4
//! weights) driven by kvprobe's host side and by the real GenAI runtime (the onnxruntime-genai
//! wheel's Generator): the logits of every step must be the same numbers. The folders are the
//! builder's exports of the reference fixture (seed 13), written by `scripts/export-builder.sh
//! tiny PRECISION` (CI runs it); a missing folder fails the test with that command.
#![cfg(feature = "onnx")]

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kvprobe_npu::onnx::{OnnxDevice, OnnxOptions};
use kvprobe_npu::{argmax, Driver, MaskMode};
use kvprobe_reference::Model;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The builder's export of the seed-13 fixture at `precision`.
fn builder_folder(precision: &str) -> PathBuf {
    let dir = root()
        .join(".cache/builder")
        .join(format!("tiny-{precision}"));
    assert!(
        dir.join("genai_config.json").is_file(),
        "{}: run scripts/export-builder.sh tiny {precision} first (the model builder's export these tests drive)",
        dir.display()
    );
    dir
}

fn open(model: &Arc<Model>, dir: &Path, max_ctx: Option<usize>) -> (OnnxDevice, Driver) {
    let lib = kvprobe_npu::onnx::library_path();
    assert!(
        lib.is_file(),
        "{}: run scripts/fetch-onnxruntime.sh first",
        lib.display()
    );
    let mut opts = OnnxOptions::new(dir);
    opts.max_ctx = max_ctx;
    let dev = OnnxDevice::open(model, &opts).expect("onnx device");
    let drv = driver_for(&dev, model);
    (dev, drv)
}

/// GenAI's per-step logits (scripts/onnx-genai-logits.py) and its greedy tokens.
fn genai_steps(
    dir: &Path,
    prompt: &[u32],
    steps: usize,
    max_length: Option<usize>,
    npy: &Path,
) -> (ndarray::Array2<f32>, Vec<u32>) {
    let o = genai_logits(dir, prompt, steps, max_length, npy);
    assert!(
        o.status.success(),
        "onnx-genai-logits.py (CI installs onnxruntime-genai==0.18.0): {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let tokens = genai_tokens(&o);
    (ndarray_npy::read_npy(npy).unwrap(), tokens)
}

/// Prompts of 6 and 17 tokens, 10 steps each; GenAI's buffer is prompt + steps long in the first
/// and the config's max_length (256) in the second, kvprobe's is its context (128): the
/// buffer's length past the request must change no number.
fn matches_genai(precision: &str) {
    let (_hf, model) = tiny_llama(13);
    let dir = builder_folder(precision);
    let (mut dev, mut drv) = open(&model, &dir, None);
    let tmp = tempfile::tempdir().unwrap();
    for (salt, n, max_length) in [(4, 6, None), (5, 17, Some(256))] {
        let prompt = ids(n, 300, salt);
        let steps = 10;
        let npy = tmp.path().join(format!("genai-{n}.npy"));
        let (genai, tokens) = genai_steps(&dir, &prompt, steps, max_length, &npy);
        drv.reset(&mut dev).unwrap();
        for k in 0..steps {
            let ours = if k == 0 {
                drv.prefill(&mut dev, &prompt).unwrap().logits
            } else {
                drv.step(&mut dev, tokens[k - 1], &MaskMode::Ring)
                    .unwrap()
                    .logits
            };
            let row = genai.row(k);
            let d = max_abs_diff(&ours, row.as_slice().unwrap());
            assert_eq!(
                d, 0.0,
                "{precision}, prompt {n}, step {k}: max |Δlogit| {d}"
            );
            assert_eq!(
                argmax(&ours),
                tokens[k],
                "{precision}, prompt {n}, step {k}"
            );
        }
        eprintln!("builder {precision}: GenAI runtime vs kvprobe, prompt {n} × {steps} steps: bit-identical");
    }
}

#[test]
fn builder_fp32_export_matches_the_genai_runtime_bit_for_bit() {
    matches_genai("fp32");
}

/// The builder's fp16 CPU export (MultiHeadAttention, separate fp16 buffers, position_ids, fp16
/// logits): the prompt run agrees bit for bit; the first token run fails inside ONNX Runtime
/// ("Shape mismatch attempting to re-use buffer" at an inserted fp16 Cast of the repeat_kv
/// reshape), in GenAI's Generator and in kvprobe alike, and plain onnxruntime 1.32 too. The test
/// requires both to fail there, so a runtime or builder that fixes it gets noticed.
#[test]
fn builder_fp16_export_matches_the_genai_runtime_bit_for_bit() {
    let (_hf, model) = tiny_llama(13);
    let dir = builder_folder("fp16");
    let (mut dev, mut drv) = open(&model, &dir, None);
    let tmp = tempfile::tempdir().unwrap();
    for (salt, n) in [(4, 6), (5, 17)] {
        let prompt = ids(n, 300, salt);
        let npy = tmp.path().join(format!("genai-{n}.npy"));
        let (genai, tokens) = genai_steps(&dir, &prompt, 1, None, &npy);
        drv.reset(&mut dev).unwrap();
        let ours = drv.prefill(&mut dev, &prompt).unwrap().logits;
        let d = max_abs_diff(&ours, genai.row(0).as_slice().unwrap());
        assert_eq!(d, 0.0, "fp16, prompt {n}: max |Δlogit| {d}");
        assert_eq!(argmax(&ours), tokens[0]);
        let theirs = genai_logits(&dir, &prompt, 2, None, &npy);
        let stderr = String::from_utf8_lossy(&theirs.stderr);
        let mine = drv.step(&mut dev, tokens[0], &MaskMode::Ring);
        const BUG: &str = "Shape mismatch attempting to re-use buffer";
        assert!(
            !theirs.status.success() && stderr.contains(BUG),
            "GenAI now runs the fp16 builder export's token step; compare it step by step: {stderr}"
        );
        match mine {
            Err(e) => assert!(e.to_string().contains(BUG), "{e}"),
            Ok(_) => panic!("kvprobe ran the token step GenAI fails on"),
        }
        eprintln!(
            "builder fp16, prompt {n}: prefill bit-identical; the token run fails in both ({BUG})"
        );
    }
}

/// GenAI's continuous decoding (`Generator::AppendTokens` after generated tokens, allowed where
/// the KV cache lives on the CPU: `SupportsContinuousDecoding`, src/generators.cpp) runs a
/// multi-token chunk over the past, the run kvprobe's stateful prefill makes after steps
/// (diagnose's chunked runs). Both give the same logits bit for bit on the fp32 and int4 exports,
/// so a device failing that run fails a run GenAI makes: a finding, never a probe the device
/// cannot run (docs/onnx-genai.md "Session 24").
#[test]
fn a_chunk_over_a_past_is_genai_s_continuous_decoding() {
    let (_hf, model) = tiny_llama(13);
    let tmp = tempfile::tempdir().unwrap();
    for precision in ["fp32", "int4"] {
        let dir = builder_folder(precision);
        let (mut dev, mut drv) = open(&model, &dir, None);
        let (prompt, chunk, steps) = (ids(7, 300, 6), ids(5, 300, 7), 4);
        let npy = tmp.path().join(format!("then-{precision}.npy"));
        let o = genai_command(&dir, &prompt, steps, &npy)
            .args(["--then", &ids_arg(&chunk)])
            .output()
            .expect("python3");
        assert!(
            o.status.success(),
            "onnx-genai-logits.py --then: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let tokens = genai_tokens(&o);
        let genai: ndarray::Array2<f32> = ndarray_npy::read_npy(&npy).unwrap();
        drv.reset(&mut dev).unwrap();
        drv.prefill(&mut dev, &prompt).unwrap();
        for t in &tokens[..steps - 1] {
            drv.step(&mut dev, *t, &MaskMode::Ring).unwrap();
        }
        let ours = drv.prefill(&mut dev, &chunk).unwrap().logits;
        let d = max_abs_diff(&ours, genai.row(steps).as_slice().unwrap());
        assert_eq!(
            d, 0.0,
            "{precision}: the chunk over the past, max |Δlogit| {d}"
        );
        eprintln!("builder {precision}: a {}-token chunk over a past of {}: bit-identical to GenAI's continuation", chunk.len(), prompt.len() + steps - 1);
    }
}

#[test]
fn builder_int4_export_matches_the_genai_runtime_bit_for_bit() {
    matches_genai("int4");
}

/// A step back over the shared buffer: GenAI's RewindTo only moves the length and the next run
/// overwrites the stale entry in place; a different token at that position and then the first
/// token again must give exactly the logits of a straight run (and a new request starts from a
/// zeroed buffer).
#[test]
fn builder_shared_buffer_rewinds_by_length() {
    let (_hf, model) = tiny_llama(13);
    let dir = builder_folder("fp32");
    let (mut dev, mut drv) = open(&model, &dir, Some(64));
    let prompt = ids(9, 300, 6);
    drv.reset(&mut dev).unwrap();
    let t = argmax(&drv.prefill(&mut dev, &prompt).unwrap().logits);
    let a = drv.step(&mut dev, t, &MaskMode::Ring).unwrap().logits;
    let u = argmax(&a);
    let b = drv.step(&mut dev, u, &MaskMode::Ring).unwrap().logits;
    drv.step_back(&mut dev).unwrap();
    let other = drv
        .step(&mut dev, (u + 1) % 300, &MaskMode::Ring)
        .unwrap()
        .logits;
    assert!(
        max_abs_diff(&b, &other) > 0.0,
        "another token, other logits"
    );
    drv.step_back(&mut dev).unwrap();
    let b2 = drv.step(&mut dev, u, &MaskMode::Ring).unwrap().logits;
    assert_eq!(max_abs_diff(&b, &b2), 0.0, "the overwritten entry");
    drv.reset(&mut dev).unwrap();
    assert_eq!(argmax(&drv.prefill(&mut dev, &prompt).unwrap().logits), t);
    let a2 = drv.step(&mut dev, t, &MaskMode::Ring).unwrap().logits;
    assert_eq!(max_abs_diff(&a, &a2), 0.0, "a new request");
}

/// Issue 35: the precision-matched reference reads the int4 export's MatMulNBits weights (levels,
/// block scales, default zero point 8) and its `accuracy_level` 4 (inputs quantised to int8 per
/// block) and computes them; against ONNX Runtime's own MatMulNBits on the CPU EP it is the same
/// function up to the f32 order of the sums, while the checkpoint's f32 weights are not.
#[test]
fn builder_int4_weights_are_computed_as_onnx_runtime_computes_them() {
    let (_hf, model) = tiny_llama(13);
    let dir = builder_folder("int4");
    let declared = model
        .with_onnx_block_weights(&dir.join("model.onnx"))
        .expect("the int4 export's weights");
    let (mut dev, mut drv) = open(&model, &dir, None);
    let (mut worst_matched, mut worst_f32) = (0f32, 0f32);
    for (salt, n) in [(4, 6), (5, 17)] {
        let mut seq = ids(n, 300, salt);
        drv.reset(&mut dev).unwrap();
        let mut rows = vec![drv.prefill(&mut dev, &seq).unwrap().logits];
        for _ in 0..8 {
            let t = argmax(rows.last().unwrap());
            seq.push(t);
            rows.push(drv.step(&mut dev, t, &MaskMode::Ring).unwrap().logits);
        }
        let opts = kvprobe_reference::ForwardOptions::default();
        let m = declared.forward(&seq, &opts).unwrap();
        let f = model.forward(&seq, &opts).unwrap();
        for (k, ours) in rows.iter().enumerate() {
            let scale = ours.iter().fold(0f32, |a, x| a.max(x.abs()));
            worst_matched = worst_matched.max(max_abs_diff(ours, m.row(n - 1 + k)) / scale);
            worst_f32 = worst_f32.max(max_abs_diff(ours, f.row(n - 1 + k)) / scale);
        }
    }
    eprintln!("int4 export vs declared weights: max |Δ|/max|logit| {worst_matched:.2e}; vs f32 checkpoint {worst_f32:.2e}");
    assert!(worst_matched < 1e-5, "declared weights: {worst_matched}");
    assert!(
        worst_f32 > 100.0 * worst_matched,
        "f32: {worst_f32} vs {worst_matched}"
    );
}

/// GroupQueryAttention reads the mask as a length: the builder's folder says so and refuses a
/// self-only or single-key row (the op would write the token at position 0 and read it alone),
/// while the Ring mask it can express runs (issue 35).
#[test]
fn builder_graph_refuses_a_mask_with_holes() {
    use kvprobe_npu::Device;
    let (_hf, model) = tiny_llama(13);
    let dir = builder_folder("fp32");
    let (mut dev, mut drv) = open(&model, &dir, Some(64));
    let why = dev.mask_by_length().expect("a GroupQueryAttention graph");
    assert!(why.contains("GroupQueryAttention"), "{why}");
    let prompt = ids(9, 300, 6);
    drv.reset(&mut dev).unwrap();
    let t = argmax(&drv.prefill(&mut dev, &prompt).unwrap().logits);
    for mode in [MaskMode::SelfOnly, MaskMode::SingleKey(2)] {
        let e = drv.trial_step(&mut dev, t, &mode).unwrap_err().to_string();
        assert!(e.contains("a mask with holes"), "{mode:?}: {e}");
    }
    drv.trial_step(&mut dev, t, &MaskMode::Ring)
        .expect("a length mask");
}

/// The reference's last-row logits of `ids` (one run, empty past) with `model`'s weights in
/// `arithmetic`.
fn reference_logits(
    model: &kvprobe_reference::Model,
    ids: &[u32],
    arithmetic: kvprobe_reference::Arithmetic,
) -> Vec<f32> {
    use kvprobe_reference::{GraphInput, GraphOptions, PositionInput};
    let t = ids.len();
    let nh = model.config().n_heads;
    let mask = (0..t)
        .flat_map(|i| (0..nh).flat_map(move |_| (0..t).map(move |j| j <= i)))
        .collect();
    let out = model
        .run_graph(&GraphInput {
            hidden: model.embed(ids).unwrap(),
            positions: PositionInput::Ids((0..t).map(|p| p as f32).collect()),
            past: Vec::new(),
            mask,
            graph: GraphOptions {
                arithmetic,
                ..GraphOptions::default()
            },
            last_only: true,
        })
        .unwrap();
    out.logits
}

/// Issue 35: the builder's fp16 export declares the fp16 ONNX Runtime's CPU EP computes it in,
/// derived from the graph (npu/src/onnx/ort_cpu_fp16.rs): fp16 only where a node with an fp16
/// kernel or a graph output sits, norms after a residual add reading the float32 sum, fp16
/// cos/sin caches. Against ONNX Runtime's own logits (the prompt run; the token run fails
/// inside ONNX Runtime, above) that reference is closer than float32 and than every op
/// rounded to fp16 (what the device declared before), over prompts of 3 to 29 tokens.
#[test]
fn builder_fp16_export_declares_what_onnx_runtime_computes() {
    use kvprobe_npu::Device;
    use kvprobe_reference::arith::Sites;
    use kvprobe_reference::{Arithmetic, Fp16, NormStatistic, Overflow};
    use kvprobe_schema::{DeclaredArithmetic, DeclaredNorm};
    let (_hf, model) = tiny_llama(13);
    let (mut dev, mut drv) = open(&model, &builder_folder("fp16"), None);
    let DeclaredArithmetic::Fp16 {
        saturate_at: None,
        norm: DeclaredNorm::Fused,
        rounded: Some(rounded),
        norm_reads_f32_sum,
        rope_tables_fp16,
        fp16_sums: false,
    } = dev.describe().arithmetic.clone()
    else {
        panic!("{:?}", dev.describe().arithmetic)
    };
    assert!(norm_reads_f32_sum && rope_tables_fp16);
    let declared = Arithmetic::Fp16(Fp16 {
        sites: Some(Sites::of(&rounded).unwrap()),
        skip_sum_f32: norm_reads_f32_sum,
        rope_tables_fp16,
        ..Fp16::every_op(Overflow::Infinite, NormStatistic::Fused)
    });
    let every_op = Arithmetic::Fp16(Fp16::every_op(Overflow::Infinite, NormStatistic::Fused));
    let fp16_weights = model.with_fp16_weights().unwrap();
    // squared error and squared norm, summed over the prompts: f32, every op, declared
    let (mut err, mut norm) = ([0f64; 3], 0f64);
    for (salt, n) in [(4, 3), (5, 8), (6, 11), (7, 17), (8, 29)] {
        let prompt = ids(n, 300, salt);
        drv.reset(&mut dev).unwrap();
        let device = drv.prefill(&mut dev, &prompt).unwrap().logits;
        let refs = [
            reference_logits(&model, &prompt, Arithmetic::F32),
            reference_logits(&fp16_weights, &prompt, every_op),
            reference_logits(&fp16_weights, &prompt, declared),
        ];
        let sq = |r: &[f32]| -> f64 {
            r.iter()
                .zip(&device)
                .map(|(a, b)| f64::from(a - b).powi(2))
                .sum()
        };
        let here: Vec<f64> = refs.iter().map(|r| sq(r)).collect();
        let n2 = device.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>();
        eprintln!(
            "prompt of {n}: relative L2 float32 {:.2e}, every op {:.2e}, declared {:.2e}",
            (here[0] / n2).sqrt(),
            (here[1] / n2).sqrt(),
            (here[2] / n2).sqrt()
        );
        for (e, h) in err.iter_mut().zip(&here) {
            *e += h;
        }
        norm += n2;
    }
    let [f32_rel, every_rel, declared_rel] = err.map(|e| (e / norm).sqrt());
    eprintln!(
        "builder fp16 vs ONNX Runtime's CPU EP, relative L2 of the prompt logits: float32 {f32_rel:.2e}, every op fp16 {every_rel:.2e}, declared ({}) {declared_rel:.2e}",
        rounded.join(", ")
    );
    assert!(
        declared_rel < 0.5 * f32_rel && declared_rel < 0.5 * every_rel,
        "declared {declared_rel:.2e}, float32 {f32_rel:.2e}, every op {every_rel:.2e}"
    );
    let (dev, _drv) = open(&model, &builder_folder("fp32"), None);
    assert_eq!(dev.describe().arithmetic, DeclaredArithmetic::Float32);
}
