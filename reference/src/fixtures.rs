//! Tiny deterministic random-weight models written as Hugging Face folders (config.json,
//! model.safetensors, tokenizer.json), so tests of every crate run in milliseconds without
//! downloads (design.md "Fixtures").

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, Tokenizer};

use crate::error::one_line;
use crate::{Error, Result};

/// How to write a fixture.
#[derive(Debug, Clone)]
pub struct FixtureOptions {
    /// 1 = `model.safetensors`; more = shards plus `model.safetensors.index.json`.
    pub shards: usize,
    /// Storage dtype of the weights (F32, F16 or BF16); the loader converts back to f32.
    pub dtype: DType,
}

impl Default for FixtureOptions {
    fn default() -> Self {
        Self {
            shards: 1,
            dtype: DType::F32,
        }
    }
}

/// Sizes of the tiny Llama: GQA (4 query heads on 2 KV heads), untied lm_head.
pub const LLAMA_HIDDEN: usize = 64;
pub const LLAMA_HEADS: usize = 4;
pub const LLAMA_KV_HEADS: usize = 2;
pub const LLAMA_HEAD_DIM: usize = 16;
pub const LLAMA_LAYERS: usize = 2;
pub const LLAMA_INTER: usize = 128;
pub const LLAMA_VOCAB: usize = 300;
pub const LLAMA_MAX_POS: usize = 256;
/// Sizes of the tiny GPT-2 (tied lm_head).
pub const GPT2_HIDDEN: usize = 64;
pub const GPT2_HEADS: usize = 4;
pub const GPT2_LAYERS: usize = 2;
pub const GPT2_VOCAB: usize = 280;
pub const GPT2_MAX_POS: usize = 128;

pub fn write_tiny_llama(dir: &Path, seed: u64) -> Result<()> {
    write_tiny_llama_with(dir, seed, &FixtureOptions::default())
}

pub fn write_tiny_gpt2(dir: &Path, seed: u64) -> Result<()> {
    write_tiny_gpt2_with(dir, seed, &FixtureOptions::default())
}

pub fn write_tiny_llama_with(dir: &Path, seed: u64, opts: &FixtureOptions) -> Result<()> {
    write_llama(dir, seed, opts, 1.0)
}

/// The tiny Llama of `seed` with its residual stream carried at `residual_scale` times its usual
/// size: the embedding and every layer's o_proj and down_proj (the only writers of the residual)
/// are multiplied by it. Every RMSNorm divides the scale out again, so in exact arithmetic the
/// model computes the same logits at any scale (up to eps against mean(x²)); only an arithmetic
/// with a limited range sees the difference. Real models carry such residuals (SmolLM2's reaches
/// |x| ~ 770 from layer 3): this is how a test gets one at fixture size.
pub fn write_tiny_llama_at_scale(dir: &Path, seed: u64, residual_scale: f64) -> Result<()> {
    write_llama(dir, seed, &FixtureOptions::default(), residual_scale)
}

fn write_llama(dir: &Path, seed: u64, opts: &FixtureOptions, scale: f64) -> Result<()> {
    create_dir(dir)?;
    let tok = build_tokenizer(&["<s>", "</s>"], true)?;
    let bos = token_id(&tok, "<s>")?;
    let eos = token_id(&tok, "</s>")?;
    let (h, hd, nh, nkv, inter, v) = (
        LLAMA_HIDDEN,
        LLAMA_HEAD_DIM,
        LLAMA_HEADS,
        LLAMA_KV_HEADS,
        LLAMA_INTER,
        LLAMA_VOCAB,
    );
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": h,
        "intermediate_size": inter,
        "num_hidden_layers": LLAMA_LAYERS,
        "num_attention_heads": nh,
        "num_key_value_heads": nkv,
        "head_dim": hd,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": LLAMA_MAX_POS,
        "vocab_size": v,
        "tie_word_embeddings": false,
        "hidden_act": "silu",
        "bos_token_id": bos,
        "eos_token_id": eos,
        "torch_dtype": "float32",
    });
    let mut rng = Rng::new(seed);
    let mut w: Vec<(String, Tensor)> = Vec::new();
    w.push((
        "model.embed_tokens.weight".into(),
        (rng.normal(&[v, h], 1.0)? * scale)?,
    ));
    for i in 0..LLAMA_LAYERS {
        let p = format!("model.layers.{i}");
        w.push((format!("{p}.input_layernorm.weight"), rng.around_one(h)?));
        w.push((
            format!("{p}.self_attn.q_proj.weight"),
            rng.linear(nh * hd, h)?,
        ));
        w.push((
            format!("{p}.self_attn.k_proj.weight"),
            rng.linear(nkv * hd, h)?,
        ));
        w.push((
            format!("{p}.self_attn.v_proj.weight"),
            rng.linear(nkv * hd, h)?,
        ));
        w.push((
            format!("{p}.self_attn.o_proj.weight"),
            (rng.linear(h, nh * hd)? * scale)?,
        ));
        w.push((
            format!("{p}.post_attention_layernorm.weight"),
            rng.around_one(h)?,
        ));
        w.push((format!("{p}.mlp.gate_proj.weight"), rng.linear(inter, h)?));
        w.push((format!("{p}.mlp.up_proj.weight"), rng.linear(inter, h)?));
        w.push((
            format!("{p}.mlp.down_proj.weight"),
            (rng.linear(h, inter)? * scale)?,
        ));
    }
    w.push(("model.norm.weight".into(), rng.around_one(h)?));
    // std 2/sqrt(h): logits spread over a few units, so top-1 and softmax are not degenerate.
    w.push((
        "lm_head.weight".into(),
        rng.normal(&[v, h], 2.0 / (h as f64).sqrt())?,
    ));
    write_folder(dir, &config, w, &tok, opts)
}

pub fn write_tiny_gpt2_with(dir: &Path, seed: u64, opts: &FixtureOptions) -> Result<()> {
    create_dir(dir)?;
    let tok = build_tokenizer(&["<|endoftext|>"], false)?;
    let eot = token_id(&tok, "<|endoftext|>")?;
    let (h, v) = (GPT2_HIDDEN, GPT2_VOCAB);
    let inter = 4 * h;
    let config = serde_json::json!({
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "n_embd": h,
        "n_head": GPT2_HEADS,
        "n_layer": GPT2_LAYERS,
        "n_positions": GPT2_MAX_POS,
        "n_inner": null,
        "vocab_size": v,
        "layer_norm_epsilon": 1e-5,
        "activation_function": "gelu_new",
        "bos_token_id": eot,
        "eos_token_id": eot,
    });
    let mut rng = Rng::new(seed ^ 0x6770_7432);
    let mut w: Vec<(String, Tensor)> = Vec::new();
    // Tied: wte is also the output projection, so its scale sets the logit spread.
    w.push((
        "transformer.wte.weight".into(),
        rng.normal(&[v, h], 2.0 / (h as f64).sqrt())?,
    ));
    w.push((
        "transformer.wpe.weight".into(),
        rng.normal(&[GPT2_MAX_POS, h], 0.5)?,
    ));
    for i in 0..GPT2_LAYERS {
        let p = format!("transformer.h.{i}");
        w.push((format!("{p}.ln_1.weight"), rng.around_one(h)?));
        w.push((format!("{p}.ln_1.bias"), rng.normal(&[h], 0.1)?));
        w.push((format!("{p}.attn.c_attn.weight"), rng.conv1d(h, 3 * h)?));
        w.push((format!("{p}.attn.c_attn.bias"), rng.normal(&[3 * h], 0.1)?));
        w.push((format!("{p}.attn.c_proj.weight"), rng.conv1d(h, h)?));
        w.push((format!("{p}.attn.c_proj.bias"), rng.normal(&[h], 0.1)?));
        w.push((format!("{p}.ln_2.weight"), rng.around_one(h)?));
        w.push((format!("{p}.ln_2.bias"), rng.normal(&[h], 0.1)?));
        w.push((format!("{p}.mlp.c_fc.weight"), rng.conv1d(h, inter)?));
        w.push((format!("{p}.mlp.c_fc.bias"), rng.normal(&[inter], 0.1)?));
        w.push((format!("{p}.mlp.c_proj.weight"), rng.conv1d(inter, h)?));
        w.push((format!("{p}.mlp.c_proj.bias"), rng.normal(&[h], 0.1)?));
    }
    w.push(("transformer.ln_f.weight".into(), rng.around_one(h)?));
    w.push(("transformer.ln_f.bias".into(), rng.normal(&[h], 0.1)?));
    write_folder(dir, &config, w, &tok, opts)
}

pub(crate) fn create_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|source| Error::Io {
        path: dir.to_path_buf(),
        source,
    })
}

pub(crate) fn write_folder(
    dir: &Path,
    config: &serde_json::Value,
    weights: Vec<(String, Tensor)>,
    tok: &Tokenizer,
    opts: &FixtureOptions,
) -> Result<()> {
    write_text(&dir.join("config.json"), &pretty(config))?;
    let tok_path = dir.join("tokenizer.json");
    tok.save(&tok_path, true).map_err(|e| Error::Tokenizer {
        path: tok_path.clone(),
        detail: one_line(&e.to_string()),
    })?;
    let shards = opts.shards.max(1);
    let mut files: Vec<HashMap<String, Tensor>> = vec![HashMap::new(); shards];
    let n = weights.len();
    let mut index = serde_json::Map::new();
    for (i, (name, t)) in weights.into_iter().enumerate() {
        let s = i * shards / n;
        let t = t.to_dtype(opts.dtype)?;
        index.insert(name.clone(), shard_name(s, shards).into());
        files[s].insert(name, t);
    }
    for (s, f) in files.iter().enumerate() {
        let p = dir.join(if shards == 1 {
            "model.safetensors".to_string()
        } else {
            shard_name(s, shards)
        });
        candle_core::safetensors::save(f, &p)?;
    }
    if shards > 1 {
        let idx = serde_json::json!({ "metadata": {}, "weight_map": index });
        write_text(&dir.join("model.safetensors.index.json"), &pretty(&idx))?;
    }
    Ok(())
}

fn shard_name(s: usize, n: usize) -> String {
    format!("model-{:05}-of-{:05}.safetensors", s + 1, n)
}

fn pretty(v: &serde_json::Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
}

fn write_text(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })
}

pub(crate) fn token_id(tok: &Tokenizer, s: &str) -> Result<u32> {
    tok.token_to_id(s).ok_or_else(|| Error::Tokenizer {
        path: "(fixture tokenizer)".into(),
        detail: format!("special token {s} missing"),
    })
}

/// GPT-2's reversible byte → printable char map (bytes that are printable map to themselves, the
/// rest to 256 + n in byte order), as byte-level BPE vocabularies spell bytes.
fn byte_char(b: u8) -> char {
    let printable = |x: u32| {
        (0x21..=0x7e).contains(&x) || (0xa1..=0xac).contains(&x) || (0xae..=0xff).contains(&x)
    };
    let x = b as u32;
    if printable(x) {
        return char::from_u32(x).unwrap_or('?');
    }
    let n = (0..x).filter(|&y| !printable(y)).count() as u32;
    char::from_u32(256 + n).unwrap_or('?')
}

/// The merges of [`build_tokenizer`], in rank order (byte-level spellings; GGUF writes them as
/// `"a b"`).
pub fn fixture_merges() -> Vec<(String, String)> {
    let sp = byte_char(b' ').to_string();
    let mut merges: Vec<(String, String)> = [
        (sp.as_str(), "t"),
        ("h", "e"),
        ("i", "n"),
        ("e", "r"),
        ("a", "n"),
        ("o", "n"),
        (sp.as_str(), "a"),
        ("r", "e"),
        (sp.as_str(), "s"),
        ("e", "s"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    merges.push((format!("{sp}t"), "he".to_string()));
    merges
}

/// Byte-level BPE: 256 byte tokens (id = byte value), a few merges, then the special tokens.
/// `bos_template`: a post-processor that prepends the first special token (Llama style).
pub fn build_tokenizer(specials: &[&str], bos_template: bool) -> Result<Tokenizer> {
    let fail = |e: String| Error::Tokenizer {
        path: "(fixture tokenizer)".into(),
        detail: one_line(&e),
    };
    let mut vocab: Vec<(String, u32)> = (0..=255u8)
        .map(|b| (byte_char(b).to_string(), b as u32))
        .collect();
    let merges = fixture_merges();
    for (a, b) in &merges {
        let id = vocab.len() as u32;
        vocab.push((format!("{a}{b}"), id));
    }
    for s in specials {
        let id = vocab.len() as u32;
        vocab.push((s.to_string(), id));
    }
    let vocab_map: Vocab = vocab.iter().cloned().collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab_map, merges)
        .build()
        .map_err(|e| fail(e.to_string()))?;
    let mut tok = Tokenizer::new(bpe);
    tok.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
    tok.with_decoder(Some(ByteLevel::default()));
    tok.add_special_tokens(
        specials
            .iter()
            .map(|s| AddedToken::from(s.to_string(), true)),
    )
    .map_err(|e| fail(e.to_string()))?;
    if bos_template {
        if let Some(first) = specials.first() {
            let id = vocab
                .iter()
                .find(|(s, _)| s == first)
                .map(|(_, i)| *i)
                .unwrap_or(0);
            let tp = TemplateProcessing::builder()
                .try_single(format!("{first} $A"))
                .map_err(|e| fail(e.to_string()))?
                .try_pair(format!("{first} $A $B"))
                .map_err(|e| fail(e.to_string()))?
                .special_tokens(vec![(first.to_string(), id)])
                .build()
                .map_err(|e| fail(e.to_string()))?;
            tok.with_post_processor(Some(tp));
        }
    }
    Ok(tok)
}

/// splitmix64: small, seedable, identical on every platform.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_add(0x9E37_79B9_7F4A_7C15))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1).
    pub fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// Standard normal (Box-Muller).
    pub fn gauss(&mut self) -> f64 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }

    pub fn normal(&mut self, shape: &[usize], std: f64) -> Result<Tensor> {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n).map(|_| (self.gauss() * std) as f32).collect();
        Ok(Tensor::from_vec(v, shape, &Device::Cpu)?)
    }

    /// nn.Linear `[out, in]` with std 1/sqrt(in): activations stay O(1) through the layers.
    pub fn linear(&mut self, out: usize, inp: usize) -> Result<Tensor> {
        self.normal(&[out, inp], 1.0 / (inp as f64).sqrt())
    }

    /// Conv1D `[in, out]` with std 1/sqrt(in).
    fn conv1d(&mut self, inp: usize, out: usize) -> Result<Tensor> {
        self.normal(&[inp, out], 1.0 / (inp as f64).sqrt())
    }

    /// Norm gains 1 ± 0.1.
    pub fn around_one(&mut self, n: usize) -> Result<Tensor> {
        let v: Vec<f32> = (0..n).map(|_| (1.0 + 0.1 * self.gauss()) as f32).collect();
        Ok(Tensor::from_vec(v, n, &Device::Cpu)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ForwardOptions, Model};

    /// The residual scale is invisible in float32: the norms divide it out, so a test that sees
    /// a difference at scale sees the arithmetic, not another model.
    #[test]
    fn a_scaled_residual_stream_is_the_same_model_in_f32() {
        let ids = [1u32, 5, 9, 22, 41, 17, 3, 99];
        let logits = |scale: f64| {
            let d = tempfile::tempdir().unwrap();
            write_tiny_llama_at_scale(d.path(), 3, scale).unwrap();
            let m = Model::load(d.path()).unwrap();
            m.forward(&ids, &ForwardOptions::default()).unwrap().logits
        };
        let (one, big) = (logits(1.0), logits(300.0));
        let worst = one
            .iter()
            .zip(&big)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        let spread = one.iter().map(|a| a.abs()).fold(0f32, f32::max);
        assert!(worst <= 1e-4 * spread, "max |Δ| {worst} of {spread}");
    }
}
