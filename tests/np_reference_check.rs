//! Our float32 logits against scripts/np_reference.py, a numpy implementation that shares no code
//! with the Rust crates (it runs GGUF files the llama.cpp way, on the file's permuted q/k rows with
//! adjacent-pair RoPE, so it also checks our un-permutation). Runs when python3 with numpy is
//! available; the SmolLM2 cases also need scripts/fetch-model.sh. Otherwise prints SKIP.

use std::path::{Path, PathBuf};
use std::process::Command;

use kvprobe_reference::fixtures;
use ndarray::Array2;
use ndarray_npy::ReadNpyExt;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
/// 15 tokens of SmolLM2's chat template (ids from llama.cpp's tokenizer).
const SMOLLM2_IDS: &str = "1,4093,198,1780,314,260,3575,282,4649,47,2,198,1,520,9531";

fn have_numpy() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import numpy"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        eprintln!("SKIP: python3 with numpy not available (pip install numpy)");
    }
    ok
}

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("spawn");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn read(p: &Path) -> Array2<f32> {
    Array2::<f32>::read_npy(std::fs::File::open(p).unwrap()).unwrap()
}

/// Per-row cosine and top-1 of ours vs numpy's; asserts min cosine and 100 % top-1.
fn compare(label: &str, ours: &Array2<f32>, theirs: &Array2<f32>, min_cos: f64) {
    assert_eq!(ours.dim(), theirs.dim(), "{label}: shapes");
    let mut worst = 1.0f64;
    for (t, (a, b)) in ours.rows().into_iter().zip(theirs.rows()).enumerate() {
        let dot: f64 = a
            .iter()
            .zip(b.iter())
            .map(|(x, y)| *x as f64 * *y as f64)
            .sum();
        let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
        let nb: f64 = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
        let cos = dot / (na * nb);
        worst = worst.min(cos);
        let am = argmax(a.iter());
        let bm = argmax(b.iter());
        assert_eq!(am, bm, "{label}: top-1 differs at position {t} (cos {cos})");
    }
    eprintln!(
        "{label}: min cosine {worst:.9} (1-cos {:.1e}), top-1 100 %",
        1.0 - worst
    );
    assert!(worst >= min_cos, "{label}: min cosine {worst} < {min_cos}");
}

fn argmax<'a>(it: impl Iterator<Item = &'a f32>) -> usize {
    let mut best = (0, f32::NEG_INFINITY);
    for (i, &v) in it.enumerate() {
        if v > best.1 {
            best = (i, v);
        }
    }
    best.0
}

fn check(label: &str, model: &Path, ids: &str, single_key: Option<usize>, min_cos: f64) {
    let d = tempfile::tempdir().unwrap();
    let ours = d.path().join("ours.npy");
    let theirs = d.path().join("np.npy");
    let mut k = Command::new(env!("CARGO_BIN_EXE_kvprobe"));
    k.args([
        "ref",
        "logits",
        "--model",
        model.to_str().unwrap(),
        "--ids",
        ids,
        "--out",
    ])
    .arg(&ours);
    let mut p = Command::new("python3");
    p.arg(Path::new(ROOT).join("scripts/np_reference.py"))
        .args([
            "logits",
            "--model",
            model.to_str().unwrap(),
            "--ids",
            ids,
            "--out",
        ])
        .arg(&theirs);
    if let Some(k_) = single_key {
        k.args(["--single-key", &k_.to_string()]);
        p.args(["--single-key", &k_.to_string()]);
    }
    run(&mut k);
    run(&mut p);
    compare(label, &read(&ours), &read(&theirs), min_cos);
}

#[test]
fn tiny_llama_matches_numpy() {
    if !have_numpy() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("llama");
    fixtures::write_tiny_llama(&m, 11).unwrap();
    let ids = "5,17,250,3,99,42,7,128,64,1,200,33";
    check("tiny llama causal", &m, ids, None, 0.99999);
    check("tiny llama single-key 4", &m, ids, Some(4), 0.99999);
}

#[test]
fn tiny_gpt2_matches_numpy() {
    if !have_numpy() {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("gpt2");
    fixtures::write_tiny_gpt2(&m, 12).unwrap();
    let ids = "5,17,250,3,99,42,7,128,64,1,200,33";
    check("tiny gpt2 causal", &m, ids, None, 0.99999);
    check("tiny gpt2 single-key 2", &m, ids, Some(2), 0.99999);
}

fn smollm2() -> Option<PathBuf> {
    let p = Path::new(ROOT).join(".cache/models/smollm2-135m-instruct-q4_1.gguf");
    if p.exists() {
        Some(p)
    } else {
        eprintln!("SKIP: SmolLM2 not fetched (run scripts/fetch-model.sh)");
        None
    }
}

#[test]
fn smollm2_matches_numpy_causal_and_single_key() {
    if !have_numpy() {
        return;
    }
    let Some(m) = smollm2() else { return };
    check("SmolLM2 causal", &m, SMOLLM2_IDS, None, 0.99999);
    check("SmolLM2 single-key 3", &m, SMOLLM2_IDS, Some(3), 0.99999);
}
