//! The architecture fixtures of `arch_fixtures.rs` written as GGUF files the way llama.cpp's
//! converter writes the real models: `<arch>.*` metadata, byte-level BPE vocabulary and merges in
//! `tokenizer.ggml.*`, GGUF tensor names, llama's q/k rows permuted for adjacent-pair RoPE (qwen2
//! and qwen3 are not permuted), and Llama-3's RoPE scaling as the `rope_freqs` tensor.

use std::path::Path;

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Tensor};

use crate::arch_fixtures::{self, FixtureArch, Geometry};
use crate::{Error, Result};

/// Write `path` as a GGUF file of `arch` at geometry `g`, tensors stored as `dtype` (F32, F16 or
/// BF16; 1-D tensors stay F32 as the converter keeps them).
pub fn write_gguf(
    path: &Path,
    arch: FixtureArch,
    g: &Geometry,
    seed: u64,
    dtype: GgmlDType,
) -> Result<()> {
    let storage = match dtype {
        GgmlDType::F32 => DType::F32,
        _ => DType::BF16,
    };
    let ws = arch_fixtures::weights(arch, g, seed, storage)?;
    let mut tensors: Vec<(String, QTensor)> = Vec::with_capacity(ws.len() + 1);
    for (hf, t) in ws {
        let name = crate::gguf::gguf_name_of(&hf);
        let mut t = t.to_dtype(DType::F32)?;
        if arch == FixtureArch::Llama3 && (hf.contains(".q_proj.") || hf.contains(".k_proj.")) {
            let heads = if hf.contains(".q_proj.") {
                g.heads
            } else {
                g.kv_heads
            };
            t = permute_rows(&t, heads)?;
        }
        let ty = if t.rank() == 1 { GgmlDType::F32 } else { dtype };
        tensors.push((name, QTensor::quantize(&t, ty)?));
    }
    if let Some((factor, low, high, orig)) = g.llama3 {
        let f =
            crate::llama::llama3_factors(g.rope_theta, g.head_dim, factor, low, high, orig as f64);
        let n = f.len();
        let t = Tensor::from_vec(f, n, &candle_core::Device::Cpu)?;
        tensors.push((
            "rope_freqs.weight".into(),
            QTensor::quantize(&t, GgmlDType::F32)?,
        ));
    }
    let meta = metadata(arch, g)?;
    let meta_refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut f = std::fs::File::create(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    candle_core::quantized::gguf_file::write(&mut f, &meta_refs, &tensor_refs)?;
    Ok(())
}

/// llama.cpp's converter permutation: inside each head, HF row `half * hd/2 + i` goes to row
/// `2 i + half` (reshape `[heads, 2, hd/2, in]`, swap the two inner axes).
fn permute_rows(t: &Tensor, heads: usize) -> Result<Tensor> {
    let dims = t.dims().to_vec();
    let hd = dims[0] / heads;
    let mut split = vec![heads, 2, hd / 2];
    split.extend_from_slice(&dims[1..]);
    Ok(t.reshape(split)?
        .transpose(1, 2)?
        .contiguous()?
        .reshape(dims)?)
}

fn metadata(arch: FixtureArch, g: &Geometry) -> Result<Vec<(String, Value)>> {
    let a = match arch {
        FixtureArch::Qwen2 => "qwen2",
        FixtureArch::Qwen3 => "qwen3",
        FixtureArch::Llama3 => "llama",
    };
    let u = |x: usize| Value::U32(x as u32);
    let mut m: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(a.into())),
        (
            "general.name".into(),
            Value::String(format!("kvprobe fixture {}", arch.name())),
        ),
        (format!("{a}.block_count"), u(g.layers)),
        (format!("{a}.context_length"), u(g.max_position)),
        (format!("{a}.embedding_length"), u(g.hidden)),
        (format!("{a}.feed_forward_length"), u(g.intermediate)),
        (format!("{a}.attention.head_count"), u(g.heads)),
        (format!("{a}.attention.head_count_kv"), u(g.kv_heads)),
        (
            format!("{a}.rope.freq_base"),
            Value::F32(g.rope_theta as f32),
        ),
        (
            format!("{a}.attention.layer_norm_rms_epsilon"),
            Value::F32(1e-6),
        ),
    ];
    if arch != FixtureArch::Qwen2 {
        m.push((format!("{a}.attention.key_length"), u(g.head_dim)));
        m.push((format!("{a}.attention.value_length"), u(g.head_dim)));
    }
    if arch == FixtureArch::Llama3 {
        m.push((format!("{a}.rope.dimension_count"), u(g.head_dim)));
        m.push((format!("{a}.vocab_size"), u(g.vocab)));
    }
    m.extend(tokenizer_metadata(arch, g)?);
    Ok(m)
}

/// `tokenizer.ggml.*` of the fixture tokenizer, padded to the embedding's rows (llama.cpp wants
/// one token per row, as the real Qwen files pad with `[PAD…]` tokens).
fn tokenizer_metadata(arch: FixtureArch, g: &Geometry) -> Result<Vec<(String, Value)>> {
    let tok = arch_fixtures::tokenizer(arch)?;
    let vocab = tok.get_vocab(true);
    let mut tokens = vec![String::new(); vocab.len().max(g.vocab)];
    for (s, id) in &vocab {
        if let Some(slot) = tokens.get_mut(*id as usize) {
            *slot = s.clone();
        }
    }
    for (i, t) in tokens.iter_mut().enumerate() {
        if t.is_empty() {
            *t = format!("[PAD{i}]");
        }
    }
    tokens.truncate(g.vocab);
    let specials = arch.specials();
    let types: Vec<Value> = tokens
        .iter()
        .map(|t| Value::I32(if specials.contains(&t.as_str()) { 3 } else { 1 }))
        .collect();
    let merges: Vec<Value> = crate::fixtures::fixture_merges()
        .into_iter()
        .map(|(a, b)| Value::String(format!("{a} {b}")))
        .collect();
    let id = |s: &str| vocab.get(s).copied().unwrap_or(0);
    let llama = arch == FixtureArch::Llama3;
    let eos = specials[specials.len().min(2) - 1];
    Ok(vec![
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        (
            "tokenizer.ggml.pre".into(),
            Value::String(if llama { "llama-bpe" } else { "qwen2" }.into()),
        ),
        (
            "tokenizer.ggml.tokens".into(),
            Value::Array(tokens.into_iter().map(Value::String).collect()),
        ),
        ("tokenizer.ggml.token_type".into(), Value::Array(types)),
        ("tokenizer.ggml.merges".into(), Value::Array(merges)),
        (
            "tokenizer.ggml.bos_token_id".into(),
            Value::U32(id(specials[0])),
        ),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(id(eos))),
        ("tokenizer.ggml.add_bos_token".into(), Value::Bool(llama)),
    ])
}
