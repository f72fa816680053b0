//! Calibration of the emulator's edge quantisation, like a compiler's: ranges measured on a fixed
//! set of varied built-in prompts (never the probed prompt), widened by a margin because clipping,
//! not resolution, dominates the K/V error (dependency notes, edge quantisation).

use kvprobe_reference::{ForwardOptions, Model};

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

/// Run the model on every calibration prompt (at most `max_tokens` tokens each) and record the
/// ranges of every layer's K (after RoPE) and V, of the logits, and of the embedding table.
pub fn measure(model: &Model, max_tokens: usize) -> Result<Ranges> {
    let n_layers = model.config().n_layers;
    let empty = (f32::INFINITY, f32::NEG_INFINITY);
    let mut r = Ranges {
        k: vec![empty; n_layers],
        v: vec![empty; n_layers],
        logits: empty,
        embeddings: empty,
    };
    let limit = max_tokens.min(model.config().max_position).max(1);
    let mut used = 0;
    for text in CALIBRATION_PROMPTS {
        let mut ids = model.encode(text, None)?;
        ids.truncate(limit);
        if ids.is_empty() {
            continue;
        }
        let out = model.forward(
            &ids,
            &ForwardOptions {
                taps: true,
                ..Default::default()
            },
        )?;
        extend(&mut r.logits, &out.logits);
        let taps = out
            .taps
            .ok_or_else(|| Error::Device("reference forward returned no K/V taps".into()))?;
        for (l, kv) in taps.iter().enumerate().take(n_layers) {
            extend(&mut r.k[l], &kv.k.flatten_all()?.to_vec1::<f32>()?);
            extend(&mut r.v[l], &kv.v.flatten_all()?.to_vec1::<f32>()?);
        }
        used += 1;
    }
    if used == 0 {
        return Err(Error::Device(
            "no calibration prompt produced tokens with this model's tokenizer".into(),
        ));
    }
    let table: Vec<f32> = model.embedding_table().flatten_all()?.to_vec1()?;
    extend(&mut r.embeddings, &table);
    Ok(r)
}
