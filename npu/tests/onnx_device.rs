//! The ONNX Runtime GenAI device (issue 22) on the random fixture exported by
//! scripts/export-onnx.py, run by the real ONNX Runtime (scripts/fetch-onnxruntime.sh). Expected
//! values come from the candle reference, never from the device.
#![cfg(feature = "onnx")]

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use kvprobe_npu::onnx::{OnnxDevice, OnnxOptions};
use kvprobe_npu::{argmax, Device, Driver, MaskMode};
use kvprobe_reference::{KeySet, Model};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `scripts/export-onnx.py HF_DIR OUT` (fails the test with the script's message, e.g. a missing
/// `onnx` package or ONNX Runtime library).
pub fn export(hf: &Path, out: &Path) {
    export_with(hf, out, &[]);
}

/// The same with extra exporter arguments (convention (b): `--window W --max-length C`).
pub fn export_with(hf: &Path, out: &Path, extra: &[&str]) {
    let o = Command::new("python3")
        .arg(root().join("scripts/export-onnx.py"))
        .arg(hf)
        .arg(out)
        .args(extra)
        .output()
        .expect("python3");
    assert!(
        o.status.success(),
        "export-onnx.py failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn lib_present() {
    let lib = kvprobe_npu::onnx::library_path();
    assert!(
        lib.is_file(),
        "{}: run scripts/fetch-onnxruntime.sh first (these tests drive the real ONNX Runtime)",
        lib.display()
    );
}

fn open(model: &Arc<Model>, dir: &Path, max_ctx: Option<usize>) -> (OnnxDevice, Driver) {
    lib_present();
    let mut opts = OnnxOptions::new(dir);
    opts.max_ctx = max_ctx;
    let dev = OnnxDevice::open(model, &opts).expect("onnx device");
    let drv = driver_for(&dev, model);
    (dev, drv)
}

fn fixture(seed: u64) -> (tempfile::TempDir, Arc<Model>, tempfile::TempDir) {
    fixture_with(seed, &[])
}

fn fixture_with(seed: u64, extra: &[&str]) -> (tempfile::TempDir, Arc<Model>, tempfile::TempDir) {
    let (hf, model) = tiny_llama(seed);
    let out = tempfile::tempdir().unwrap();
    let genai = out.path().join("genai");
    export_with(hf.path(), &genai, extra);
    (hf, model, out)
}

/// Convention (b): W 8, C 64 (float32 or the QDQ uint8 cache).
const WINDOWED: &[&str] = &["--window", "8", "--max-length", "64"];
const WINDOWED_U8: &[&str] = &["--window", "8", "--max-length", "64", "--kv-dtype", "uint8"];

/// Prefill then greedy steps (teacher-forced on the device's own tokens) against the reference's
/// causal forward of the same sequence: per-step cosines.
fn step_cosines(
    model: &Model,
    dev: &mut OnnxDevice,
    drv: &mut Driver,
    prompt: &[u32],
    steps: usize,
) -> Vec<f64> {
    drv.reset(dev).unwrap();
    let mut seq = prompt.to_vec();
    let mut outs = vec![drv.prefill(dev, prompt).unwrap().logits];
    for _ in 1..steps {
        let t = argmax(outs.last().unwrap());
        seq.push(t);
        outs.push(drv.step(dev, t, &MaskMode::Ring).unwrap().logits);
    }
    let full = model.forward(&seq, &Default::default()).unwrap();
    outs.iter()
        .enumerate()
        .map(|(i, o)| cosine(o, full.row(prompt.len() - 1 + i)))
        .collect()
}

#[test]
fn fp32_fixture_matches_the_reference_step_by_step() {
    let (_hf, model, out) = fixture(7);
    let (mut dev, mut drv) = open(&model, &out.path().join("genai"), None);
    assert_eq!(dev.describe().cache_len, 128, "min(128, max_length 256)");
    for (salt, n) in [(0, 9), (1, 20), (2, 1)] {
        let prompt = ids(n, 300, salt);
        let cos = step_cosines(&model, &mut dev, &mut drv, &prompt, 12);
        let worst = cos.iter().cloned().fold(1.0, f64::min);
        eprintln!("fixture prompt {n}: min per-step cosine {worst:.8}");
        assert!(worst >= 0.99999, "prompt of {n}: {cos:?}");
    }
}

#[test]
fn masks_step_back_and_state_buffers_behave_as_the_reference() {
    let (_hf, model, out) = fixture(11);
    let (mut dev, mut drv) = open(&model, &out.path().join("genai"), Some(32));
    let prompt = ids(10, 300, 3);
    let n = prompt.len();
    drv.prefill(&mut dev, &prompt).unwrap();
    assert_eq!(dev.past_len(), n);
    let state = model
        .prefix_state(&prompt, &(0..n).collect::<Vec<_>>())
        .unwrap();
    // trials from one state: self only, a single key, the whole context; each equals the
    // reference step under the same key set, and the device rewinds between them
    let modes = [MaskMode::SelfOnly, MaskMode::SingleKey(4), MaskMode::Ring];
    let outs = drv.trial_steps(&mut dev, 42, &modes).unwrap();
    let sets = [KeySet::None, KeySet::Subset(vec![4]), KeySet::All];
    for (o, k) in outs.iter().zip(sets.iter()) {
        let r = model.step(&state, 42, n, k).unwrap();
        assert!(
            cosine(&o.logits, &r) >= 0.99999,
            "{k:?}: {}",
            cosine(&o.logits, &r)
        );
    }
    assert_eq!(dev.past_len(), n + 1, "the last trial appended its token");
    // the states through the contract: layer-0 K of the prompt, fp16, against the reference
    let bufs = dev.cache_buffers().unwrap();
    let (h, d) = (2, 16);
    let k0: Vec<f32> = bufs[&0]
        .chunks_exact(2)
        .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
        .collect();
    let rk: Vec<f32> = state.layers[0].k.flatten_all().unwrap().to_vec1().unwrap();
    for hh in 0..h {
        for t in 0..n {
            for c in 0..d {
                let (a, b) = (k0[(hh * 32 + t) * d + c], rk[(hh * n + t) * d + c]);
                assert!(
                    (a - b).abs() <= 2e-3 * (1.0 + b.abs()),
                    "K h{hh} t{t} c{c}: {a} vs {b}"
                );
            }
        }
    }
    assert!(
        k0[(32 - 1) * d..32 * d].iter().all(|&x| x == 0.0),
        "unwritten slots are zero"
    );
    // a zeroed layer-0 V written through the contract moves the next step; a short buffer is refused
    drv.reset(&mut dev).unwrap();
    drv.prefill(&mut dev, &prompt).unwrap();
    let good = drv.trial_step(&mut dev, 7, &MaskMode::Ring).unwrap().logits;
    let saved = dev.cache_buffers().unwrap()[&1].clone();
    dev.write_cache_buffer(1, &vec![0u8; saved.len()]).unwrap();
    let bad = drv.trial_step(&mut dev, 7, &MaskMode::Ring).unwrap().logits;
    assert!(cosine(&good, &bad) < 0.999, "zeroed V must move the step");
    assert!(dev.write_cache_buffer(1, &saved[1..]).is_err());
    // the context ends at max_ctx: no wrap
    drv.reset(&mut dev).unwrap();
    assert!(drv.prefill(&mut dev, &ids(32, 300, 0)).is_err());
    assert!(dev.update_cache_offset(1).is_err() && dev.init_cache(3).is_err());
}

#[test]
fn windowed_fp32_fixture_matches_the_reference_step_by_step() {
    let (_hf, model, out) = fixture_with(7, WINDOWED);
    let (mut dev, mut drv) = open(&model, &out.path().join("genai"), None);
    assert_eq!(dev.describe().cache_len, 64, "min(128, max_length 64)");
    // one window with pads, three windows with pads, a whole window, one token
    for (salt, n) in [(0, 5), (1, 20), (2, 8), (3, 1)] {
        let prompt = ids(n, 300, salt);
        let cos = step_cosines(&model, &mut dev, &mut drv, &prompt, 12);
        let worst = cos.iter().cloned().fold(1.0, f64::min);
        eprintln!("windowed fixture prompt {n}: min per-step cosine {worst:.8}");
        assert!(worst >= 0.99999, "prompt of {n}: {cos:?}");
    }
    // trials from one state (the device restores GenAI's bookkeeping between them) and a step
    // back into the prompt (replayed): each equals the reference under the same key set
    let prompt = ids(10, 300, 3);
    let n = prompt.len();
    drv.reset(&mut dev).unwrap();
    drv.prefill(&mut dev, &prompt).unwrap();
    let state = model
        .prefix_state(&prompt, &(0..n).collect::<Vec<_>>())
        .unwrap();
    let modes = [MaskMode::SelfOnly, MaskMode::SingleKey(4), MaskMode::Ring];
    let outs = drv.trial_steps(&mut dev, 42, &modes).unwrap();
    let sets = [KeySet::None, KeySet::Subset(vec![4]), KeySet::All];
    for (o, k) in outs.iter().zip(sets.iter()) {
        let r = model.step(&state, 42, n, k).unwrap();
        let c = cosine(&o.logits, &r);
        assert!(c >= 0.99999, "{k:?}: {c}");
    }
    // the states through the contract: layer-0 K of the prompt against the reference
    let k0: Vec<f32> = dev.cache_buffers().unwrap()[&0]
        .chunks_exact(2)
        .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
        .collect();
    let rk: Vec<f32> = state.layers[0].k.flatten_all().unwrap().to_vec1().unwrap();
    let (h, d, ctx) = (2, 16, 64);
    for hh in 0..h {
        for t in 0..n {
            for c in 0..d {
                let (a, b) = (k0[(hh * ctx + t) * d + c], rk[(hh * n + t) * d + c]);
                assert!(
                    (a - b).abs() <= 2e-3 * (1.0 + b.abs()),
                    "K h{hh} t{t}: {a} vs {b}"
                );
            }
        }
    }
    // GenAI's capacity: the padded prompt and the tokens end at max_length (64), pads counted:
    // 60 tokens pad to 64, so the next token is a typed error although position 60 < max_ctx
    drv.reset(&mut dev).unwrap();
    drv.prefill(&mut dev, &ids(60, 300, 0)).unwrap();
    // the device's own refusal, wrapped as the device's (exit 3) with the typed cause inside
    let e = drv.step(&mut dev, 1, &MaskMode::Ring).unwrap_err();
    assert!(
        matches!(&e, kvprobe_npu::Error::ByDevice { cause, .. }
            if matches!(**cause, kvprobe_npu::Error::ContextFull { .. })),
        "{e}"
    );
}

/// The uint8 (QDQ) windowed folder through the `onnxruntime-genai` 0.18 wheel where it runs it:
/// the first run of a prompt of at most one window (pads, GenAI's mask and positions, the
/// pad_value-filled uint8 cache). Its single-decoder windowed path pads every `append_tokens` to a
/// multiple of W (a token becomes W − 1 pads and the token) while the cache and the position ids
/// switch to one-token runs, and feeds a prompt past one window whole against W-wide position ids;
/// those runs are not compared (checked here: the wheel fails on them; printed).
#[test]
fn windowed_uint8_first_window_matches_the_genai_runtime() {
    let (_hf, model, out) = fixture_with(13, WINDOWED_U8);
    let dir = out.path().join("genai");
    let (mut dev, mut drv) = open(&model, &dir, None);
    let genai = |prompt: &[u32], steps: usize| {
        let npy = out.path().join(format!("w-{}-{steps}.npy", prompt.len()));
        (genai_logits(&dir, prompt, steps, Some(64), &npy), npy)
    };
    // ids below 250 avoid the pad id (eos 268): GenAI takes a pad-valued prompt token for a pad
    for (salt, n) in [(4, 3), (5, 8), (6, 6)] {
        let prompt: Vec<u32> = ids(n, 250, salt);
        let (o, npy) = genai(&prompt, 1);
        if o.status.code() == Some(3) {
            eprintln!(
                "onnxruntime-genai wheel absent: skipped ({})",
                String::from_utf8_lossy(&o.stderr).trim()
            );
            return;
        }
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let theirs: ndarray::Array2<f32> = ndarray_npy::read_npy(&npy).unwrap();
        drv.reset(&mut dev).unwrap();
        let ours = drv.prefill(&mut dev, &prompt).unwrap().logits;
        let d = max_abs_diff(&ours, theirs.row(0).as_slice().unwrap());
        eprintln!(
            "GenAI runtime vs kvprobe host side, windowed uint8, prompt {n}: max |Δlogit| {d:e}"
        );
        assert!(d <= 1e-5, "prompt {n}: max |Δ| {d}");
    }
    for (what, prompt, steps) in [
        ("a token after the prompt", ids(5, 250, 7), 2),
        ("a prompt past one window", ids(11, 250, 8), 1),
    ] {
        let (o, _) = genai(&prompt, steps);
        assert!(
            !o.status.success(),
            "the wheel now runs {what}: compare it here"
        );
        eprintln!(
            "not compared with onnxruntime-genai 0.18: {what} (its single-decoder windowed path fails: {})",
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("")
                .chars()
                .take(160)
                .collect::<String>()
        );
    }
}

/// The same folder through the real ONNX Runtime GenAI runtime (the `onnxruntime-genai` wheel's
/// Generator builds mask, positions and past/present itself): per-step logits agree to 1e-5.
#[test]
fn host_side_matches_the_genai_runtime_step_by_step() {
    let (_hf, model, out) = fixture(13);
    let dir = out.path().join("genai");
    let (mut dev, mut drv) = open(&model, &dir, None);
    for (salt, n) in [(4, 6), (5, 17)] {
        let prompt = ids(n, 300, salt);
        let npy = out.path().join(format!("genai-{n}.npy"));
        let steps = 10;
        let o = genai_logits(&dir, &prompt, steps, None, &npy);
        if o.status.code() == Some(3) {
            eprintln!(
                "onnxruntime-genai wheel absent: skipped ({})",
                String::from_utf8_lossy(&o.stderr).trim()
            );
            return;
        }
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let tokens = genai_tokens(&o);
        let genai: ndarray::Array2<f32> = ndarray_npy::read_npy(&npy).unwrap();
        drv.reset(&mut dev).unwrap();
        let mut worst = 0f32;
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
            worst = worst.max(d);
            assert!(d <= 1e-5, "prompt {n}, step {k}: max |Δ| {d}");
            assert_eq!(argmax(&ours), tokens[k], "prompt {n}, step {k}");
        }
        eprintln!("GenAI runtime vs kvprobe host side, prompt {n}: max |Δlogit| {worst:e}");
    }
}
