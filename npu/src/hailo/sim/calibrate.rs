//! Calibration of the emulator's edge quantisation, like a compiler's: ranges measured on a fixed
//! set of varied built-in prompts (never the probed prompt), widened by a margin because clipping,
//! not resolution, dominates the K/V error (dependency notes, edge quantisation).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use kvprobe_reference::{GraphInput, GraphOptions, Model, PositionInput};

use crate::{Error, Result};

/// The built-in calibration set: narrative, dialogue, code, numbers, a list, mixed punctuation.
pub const CALIBRATION_PROMPTS: &[&str] = &[
    "Once upon a time there was a little girl who lived in a small house near the forest. Every morning she walked to the river.",
    "<|im_start|>user\nWhat is the capital of France, and why is it famous?<|im_end|>\n<|im_start|>assistant\n",
    "fn main() {\n    let xs = vec![3, 1, 4, 1, 5, 9, 2, 6];\n    println!(\"{:?}\", xs.iter().sum::<i32>());\n}",
    "The results were: 42.7%, 13.05 kg, 2024-03-17, $1,299.99 and 0x7FFF; see Table 3 (p < 0.001).",
    "Shopping list:\n- eggs\n- flour\n- MILK!!!\n- apples, pears & plums\nRemember: call Dr. Smith at 5 pm.",
    "In quantum mechanics, the Schrödinger equation describes how the wave function of a physical system evolves over time.",
];

/// Measured ranges (min, max) per edge class.
#[derive(Debug, Clone, PartialEq)]
pub struct Ranges {
    pub k: Vec<(f32, f32)>,
    pub v: Vec<(f32, f32)>,
    pub logits: (f32, f32),
    pub embeddings: (f32, f32),
}

fn extend(r: &mut (f32, f32), xs: &[f32]) {
    for &x in xs {
        if x.is_finite() {
            r.0 = r.0.min(x);
            r.1 = r.1.max(x);
        }
    }
}

/// Logits values one batched calibration run may hold (`rows × vocab`, 64 MB of f32).
const MAX_BATCH_LOGITS: usize = 1 << 24;

/// Run the model on every calibration prompt (at most `max_tokens` tokens each) and record the
/// ranges of every layer's K (after RoPE) and V, of the logits, and of the embedding table.
pub fn measure(model: &Model, max_tokens: usize) -> Result<Ranges> {
    measure_prompts(model, &prompt_ids(model, max_tokens)?)
}

/// [`measure`] remembered for the process, keyed by the model's content hash, the weights kind
/// (`f32`/`int8`) and the calibration token ids: a second emulator on the same weights (tests,
/// a CLI building two devices) does not calibrate again. `sha256` None (in-memory weights,
/// identified by their configuration only) always measures.
pub fn measure_cached(
    model: &Model,
    max_tokens: usize,
    sha256: Option<&str>,
    weights: &str,
) -> Result<Ranges> {
    type Key = (String, String, Vec<Vec<u32>>);
    static CACHE: OnceLock<Mutex<HashMap<Key, Ranges>>> = OnceLock::new();
    let prompts = prompt_ids(model, max_tokens)?;
    let Some(sha) = sha256 else {
        return measure_prompts(model, &prompts);
    };
    let key = (sha.to_string(), weights.to_string(), prompts);
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(r) = cache.lock().ok().and_then(|c| c.get(&key).cloned()) {
        return Ok(r);
    }
    let r = measure_prompts(model, &key.2)?;
    if let Ok(mut c) = cache.lock() {
        c.insert(key, r.clone());
    }
    Ok(r)
}

/// Token ids of the calibration prompts (each cut to `max_tokens`, empty ones dropped).
fn prompt_ids(model: &Model, max_tokens: usize) -> Result<Vec<Vec<u32>>> {
    let limit = max_tokens.min(model.config().max_position).max(1);
    let mut prompts = Vec::new();
    for text in CALIBRATION_PROMPTS {
        let mut ids = model.encode(text, None)?;
        ids.truncate(limit);
        if !ids.is_empty() {
            prompts.push(ids);
        }
    }
    if prompts.is_empty() {
        return Err(Error::Device(
            "no calibration prompt produced tokens with this model's tokenizer".into(),
        ));
    }
    Ok(prompts)
}

/// The prompts go through as few graph runs as the logits bound allows: their rows are stacked,
/// each attends causally within its own prompt only (block-diagonal mask) at positions restarting
/// from 0, which is each prompt's own causal forward (the ranges are min/max over the same values).
fn measure_prompts(model: &Model, prompts: &[Vec<u32>]) -> Result<Ranges> {
    let n_layers = model.config().n_layers;
    let vocab = model.config().vocab_size.max(1);
    let empty = (f32::INFINITY, f32::NEG_INFINITY);
    let mut r = Ranges {
        k: vec![empty; n_layers],
        v: vec![empty; n_layers],
        logits: empty,
        embeddings: empty,
    };
    let mut group: Vec<&[u32]> = Vec::new();
    let mut rows = 0;
    for p in prompts {
        if !group.is_empty() && (rows + p.len()) * vocab > MAX_BATCH_LOGITS {
            run_group(model, &group, &mut r)?;
            group.clear();
            rows = 0;
        }
        group.push(p);
        rows += p.len();
    }
    if !group.is_empty() {
        run_group(model, &group, &mut r)?;
    }
    // a block of rows at a time: no f32 copy of the whole table beside the model's own
    let vocab = model.embedding_dims().0;
    for r0 in (0..vocab).step_by(1024) {
        extend(
            &mut r.embeddings,
            &model.embedding_rows(r0, (r0 + 1024).min(vocab))?,
        );
    }
    Ok(r)
}

fn run_group(model: &Model, prompts: &[&[u32]], r: &mut Ranges) -> Result<()> {
    let nh = model.config().n_heads;
    let ids: Vec<u32> = prompts.concat();
    let t = ids.len();
    let mut positions = Vec::with_capacity(t);
    let mut mask = vec![false; t * nh * t];
    let mut start = 0;
    for p in prompts {
        for i in 0..p.len() {
            positions.push(i as f32);
            let row = start + i;
            for h in 0..nh {
                let o = (row * nh + h) * t;
                mask[o + start..=o + row].iter_mut().for_each(|x| *x = true);
            }
        }
        start += p.len();
    }
    let out = model.run_graph(&GraphInput {
        hidden: model.embed(&ids)?,
        positions: PositionInput::Ids(positions),
        past: Vec::new(),
        mask,
        graph: GraphOptions::default(),
        last_only: false,
    })?;
    extend(&mut r.logits, &out.logits);
    for (l, kv) in out.new_kv.iter().enumerate().take(r.k.len()) {
        extend(&mut r.k[l], &kv.k.flatten_all()?.to_vec1::<f32>()?);
        extend(&mut r.v[l], &kv.v.flatten_all()?.to_vec1::<f32>()?);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvprobe_reference::{fixtures, ForwardOptions};

    /// The per-prompt causal forwards the batched run replaces (the original definition).
    fn looped(model: &Model, max_tokens: usize) -> Ranges {
        let n = model.config().n_layers;
        let e = (f32::INFINITY, f32::NEG_INFINITY);
        let mut r = Ranges {
            k: vec![e; n],
            v: vec![e; n],
            logits: e,
            embeddings: e,
        };
        for ids in prompt_ids(model, max_tokens).unwrap() {
            let out = model
                .forward(
                    &ids,
                    &ForwardOptions {
                        taps: true,
                        ..Default::default()
                    },
                )
                .unwrap();
            extend(&mut r.logits, &out.logits);
            for (l, kv) in out.taps.unwrap().iter().enumerate() {
                extend(&mut r.k[l], &kv.k.flatten_all().unwrap().to_vec1().unwrap());
                extend(&mut r.v[l], &kv.v.flatten_all().unwrap().to_vec1().unwrap());
            }
        }
        let table: Vec<f32> = model
            .embedding_table()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        extend(&mut r.embeddings, &table);
        r
    }

    fn near(a: (f32, f32), b: (f32, f32)) -> bool {
        let near = |x: f32, y: f32| approx::relative_eq!(x, y, epsilon = 1e-5, max_relative = 1e-5);
        near(a.0, b.0) && near(a.1, b.1)
    }

    #[test]
    fn batched_calibration_equals_per_prompt_forwards() {
        for gpt2 in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            if gpt2 {
                fixtures::write_tiny_gpt2(dir.path(), 4).unwrap();
            } else {
                fixtures::write_tiny_llama(dir.path(), 4).unwrap();
            }
            let m = Model::load(dir.path()).unwrap();
            for max_tokens in [5, 96] {
                let (a, b) = (measure(&m, max_tokens).unwrap(), looped(&m, max_tokens));
                assert!(near(a.logits, b.logits), "{a:?} vs {b:?}");
                assert_eq!(a.embeddings, b.embeddings);
                for l in 0..a.k.len() {
                    assert!(near(a.k[l], b.k[l]) && near(a.v[l], b.v[l]), "layer {l}");
                }
                // the ranges are real: not empty, not degenerate
                assert!(a.logits.0 < a.logits.1 && a.k[0].0 < a.k[0].1);
            }
        }
    }

    #[test]
    fn cache_returns_the_same_ranges_and_skips_unidentified_models() {
        let dir = tempfile::tempdir().unwrap();
        fixtures::write_tiny_llama(dir.path(), 11).unwrap();
        let m = Model::load(dir.path()).unwrap();
        let a = measure_cached(&m, 96, Some("test-sha-11"), "f32").unwrap();
        let b = measure_cached(&m, 96, Some("test-sha-11"), "f32").unwrap();
        assert_eq!(a, b);
        assert_eq!(a, measure(&m, 96).unwrap());
        // another weights kind under the same hash is its own entry
        let int8 = m.with_int8_weights().unwrap();
        let c = measure_cached(&int8, 96, Some("test-sha-11"), "int8").unwrap();
        assert_eq!(c, measure(&int8, 96).unwrap());
        assert_ne!(a, c);
        assert_eq!(measure_cached(&m, 96, None, "f32").unwrap(), a);
    }
}
