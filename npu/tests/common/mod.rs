#![allow(dead_code)]
//! Shared helpers of the npu integration tests.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kvprobe_npu::sim::{CacheQuant, SimDevice, SimOptions};
use kvprobe_npu::{argmax, Driver};
use kvprobe_reference::{fixtures, ForwardOptions, Model};

pub fn tiny_llama(seed: u64) -> (tempfile::TempDir, Arc<Model>) {
    let dir = tempfile::tempdir().unwrap();
    fixtures::write_tiny_llama(dir.path(), seed).unwrap();
    let m = Model::load(dir.path()).unwrap();
    (dir, Arc::new(m))
}

pub fn tiny_gpt2(seed: u64) -> (tempfile::TempDir, Arc<Model>) {
    let dir = tempfile::tempdir().unwrap();
    fixtures::write_tiny_gpt2(dir.path(), seed).unwrap();
    let m = Model::load(dir.path()).unwrap();
    (dir, Arc::new(m))
}

pub fn smollm2() -> Option<Arc<Model>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let p: PathBuf = root.join(".cache/models/smollm2-135m-instruct-q4_1.gguf");
    if !p.exists() {
        eprintln!("SmolLM2 not fetched ({}); skipping", p.display());
        return None;
    }
    Some(Arc::new(Model::load(&p).unwrap()))
}

pub fn ids(n: usize, vocab: usize, salt: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i * 37 + salt * 11 + 5) % vocab) as u32)
        .collect()
}

pub fn float_opts(l: usize, p: usize) -> SimOptions {
    SimOptions {
        cache_len: l,
        prefill_len: p,
        cache_quant: CacheQuant::Float,
        ..SimOptions::default()
    }
}

pub fn sim(model: &Arc<Model>, opts: SimOptions) -> (SimDevice, Driver) {
    let dev = SimDevice::new(model.clone(), opts).unwrap();
    let drv = dev.driver().unwrap();
    (dev, drv)
}

/// Greedy continuation by full forwards of the growing sequence (no KV cache at all).
pub fn reference_greedy(model: &Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut seq = prompt.to_vec();
    let mut out = Vec::new();
    for _ in 0..n {
        let f = model.forward(&seq, &ForwardOptions::default()).unwrap();
        let t = argmax(f.row(f.rows - 1));
        out.push(t);
        seq.push(t);
    }
    out
}

/// Last-row logits of a full forward.
pub fn reference_last_logits(model: &Model, seq: &[u32]) -> Vec<f32> {
    let f = model.forward(seq, &ForwardOptions::default()).unwrap();
    f.row(f.rows - 1).to_vec()
}

pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut ab, mut aa, mut bb) = (0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        ab += x as f64 * y as f64;
        aa += x as f64 * x as f64;
        bb += y as f64 * y as f64;
    }
    ab / (aa.sqrt() * bb.sqrt()).max(1e-30)
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// The generic driver over `dev`, its embedding table read from the reference `model` in the
/// layout the device's prefill embeddings input declares.
pub fn driver_for(dev: &dyn kvprobe_npu::Device, model: &Model) -> Driver {
    let emb = dev
        .describe()
        .group(kvprobe_schema::GroupKind::Prefill)
        .unwrap()
        .inputs
        .iter()
        .find(|i| i.role == Some(kvprobe_schema::InputRole::Embeddings))
        .unwrap()
        .clone();
    let table = kvprobe_npu::EmbeddingTable::from_tensor(model.embedding_table(), &emb).unwrap();
    Driver::new(dev, table).unwrap()
}

/// `scripts/onnx-genai-logits.py DIR --ids … --steps N --out NPY`, to add options to.
pub fn genai_command(
    dir: &Path,
    prompt: &[u32],
    steps: usize,
    npy: &Path,
) -> std::process::Command {
    let mut cmd = std::process::Command::new("python3");
    cmd.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/onnx-genai-logits.py"))
        .arg(dir)
        .arg("--ids")
        .arg(ids_arg(prompt))
        .arg("--steps")
        .arg(steps.to_string())
        .arg("--out")
        .arg(npy);
    cmd
}

/// Ids as the scripts take them: `1,2,3`.
pub fn ids_arg(ids: &[u32]) -> String {
    ids.iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// `scripts/onnx-genai-logits.py DIR --ids … --steps N [--max-length M] --out NPY`: the real GenAI
/// runtime's per-step logits (into NPY) and greedy tokens (stdout JSON).
pub fn genai_logits(
    dir: &Path,
    prompt: &[u32],
    steps: usize,
    max_length: Option<usize>,
    npy: &Path,
) -> std::process::Output {
    let mut cmd = genai_command(dir, prompt, steps, npy);
    if let Some(m) = max_length {
        cmd.arg("--max-length").arg(m.to_string());
    }
    cmd.output().expect("python3")
}

/// The greedy tokens onnx-genai-logits.py printed (stdout JSON `{"tokens": [...]}`).
pub fn genai_tokens(o: &std::process::Output) -> Vec<u32> {
    serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect()
}
