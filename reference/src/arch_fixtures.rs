//! Seeded random-weight models of the architectures of issue 21 (Qwen2/2.5, Qwen3, Llama-3.2 RoPE
//! scaling), at tiny sizes for the tests and at the real geometries (Qwen2.5-0.5B, Qwen2-1.5B,
//! Qwen3-0.6B, Llama-3.2-1B) for benchmarks, because no package on the registries this project
//! reaches ships their weights. Written as Hugging Face folders here and as GGUF files by
//! `fixtures_gguf.rs`; one seed gives the same values in both.

use std::path::Path;

use candle_core::{DType, Tensor};
use tokenizers::Tokenizer;

use crate::fixtures::{build_tokenizer, create_dir, token_id, write_folder, FixtureOptions, Rng};
use crate::Result;

/// The architecture of a fixture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FixtureArch {
    /// q/k/v biases, tied embeddings, RoPE θ 1e6.
    Qwen2,
    /// QK-norm, head_dim independent of hidden / heads, tied embeddings, RoPE θ 1e6.
    Qwen3,
    /// Llama with `rope_scaling` of type llama3, untied lm_head, BOS.
    Llama3,
}

impl FixtureArch {
    pub const ALL: [FixtureArch; 3] = [FixtureArch::Qwen2, FixtureArch::Qwen3, FixtureArch::Llama3];

    pub fn name(self) -> &'static str {
        match self {
            FixtureArch::Qwen2 => "qwen2",
            FixtureArch::Qwen3 => "qwen3",
            FixtureArch::Llama3 => "llama3",
        }
    }

    pub fn tied(self) -> bool {
        self != FixtureArch::Llama3
    }

    /// The special tokens, first = BOS for Llama-3 (Qwen adds none).
    pub fn specials(self) -> &'static [&'static str] {
        match self {
            FixtureArch::Llama3 => &["<|begin_of_text|>", "<|end_of_text|>"],
            _ => &["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        }
    }
}

/// The sizes of a model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Geometry {
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    pub vocab: usize,
    pub max_position: usize,
    pub rope_theta: f64,
    /// llama3 rope_scaling: factor, low_freq_factor, high_freq_factor, original context.
    pub llama3: Option<(f64, f64, f64, usize)>,
}

impl Geometry {
    /// Tiny Qwen2 (GQA 4 on 2, biases, tied).
    pub const TINY_QWEN2: Geometry = Geometry {
        hidden: 64,
        layers: 2,
        heads: 4,
        kv_heads: 2,
        head_dim: 16,
        intermediate: 128,
        vocab: 300,
        max_position: 256,
        rope_theta: 1_000_000.0,
        llama3: None,
    };
    /// Tiny Qwen3: head_dim 32 with hidden 64 and 4 heads (q is 128 wide, as in Qwen3 where
    /// heads × head_dim ≠ hidden).
    pub const TINY_QWEN3: Geometry = Geometry {
        head_dim: 32,
        ..Geometry::TINY_QWEN2
    };
    /// Tiny Llama-3: the llama3 bands at a 64-token original context, so that positions of a
    /// short test prompt are rotated differently in each band (high kept, middle smoothed, low
    /// divided by the factor).
    pub const TINY_LLAMA3: Geometry = Geometry {
        rope_theta: 10_000.0,
        llama3: Some((8.0, 1.0, 4.0, 64)),
        ..Geometry::TINY_QWEN2
    };
    /// Qwen2.5-0.5B(-Instruct).
    pub const QWEN2_5_0_5B: Geometry = Geometry {
        hidden: 896,
        layers: 24,
        heads: 14,
        kv_heads: 2,
        head_dim: 64,
        intermediate: 4864,
        vocab: 151_936,
        max_position: 32_768,
        rope_theta: 1_000_000.0,
        llama3: None,
    };
    /// Qwen2-1.5B(-Instruct), the geometry of Hailo's Qwen2-1.5B-Instruct HEF.
    pub const QWEN2_1_5B: Geometry = Geometry {
        hidden: 1536,
        layers: 28,
        heads: 12,
        kv_heads: 2,
        head_dim: 128,
        intermediate: 8960,
        vocab: 151_936,
        max_position: 32_768,
        rope_theta: 1_000_000.0,
        llama3: None,
    };
    /// Qwen3-0.6B.
    pub const QWEN3_0_6B: Geometry = Geometry {
        hidden: 1024,
        layers: 28,
        heads: 16,
        kv_heads: 8,
        head_dim: 128,
        intermediate: 3072,
        vocab: 151_936,
        max_position: 40_960,
        rope_theta: 1_000_000.0,
        llama3: None,
    };
    /// Llama-3.2-1B(-Instruct).
    pub const LLAMA3_2_1B: Geometry = Geometry {
        hidden: 2048,
        layers: 16,
        heads: 32,
        kv_heads: 8,
        head_dim: 64,
        intermediate: 8192,
        vocab: 128_256,
        max_position: 131_072,
        rope_theta: 500_000.0,
        llama3: Some((32.0, 1.0, 4.0, 8192)),
    };

    /// A named geometry: `tiny-<arch>`, `qwen2.5-0.5b`, `qwen2-1.5b`, `qwen3-0.6b`, `llama3.2-1b`.
    pub fn named(name: &str) -> Option<(FixtureArch, Geometry)> {
        Some(match name {
            "tiny-qwen2" => (FixtureArch::Qwen2, Geometry::TINY_QWEN2),
            "tiny-qwen3" => (FixtureArch::Qwen3, Geometry::TINY_QWEN3),
            "tiny-llama3" => (FixtureArch::Llama3, Geometry::TINY_LLAMA3),
            "qwen2.5-0.5b" => (FixtureArch::Qwen2, Geometry::QWEN2_5_0_5B),
            "qwen2-1.5b" => (FixtureArch::Qwen2, Geometry::QWEN2_1_5B),
            "qwen3-0.6b" => (FixtureArch::Qwen3, Geometry::QWEN3_0_6B),
            "llama3.2-1b" => (FixtureArch::Llama3, Geometry::LLAMA3_2_1B),
            _ => return None,
        })
    }

    pub const NAMES: [&'static str; 7] = [
        "tiny-qwen2",
        "tiny-qwen3",
        "tiny-llama3",
        "qwen2.5-0.5b",
        "qwen2-1.5b",
        "qwen3-0.6b",
        "llama3.2-1b",
    ];
}

/// The fixture's byte-level tokenizer (the vocabulary of the tiny fixtures; a real geometry's
/// larger embedding simply has rows no text reaches).
pub fn tokenizer(arch: FixtureArch) -> Result<Tokenizer> {
    build_tokenizer(arch.specials(), arch == FixtureArch::Llama3)
}

/// config.json of a fixture, spelled as the real model's.
pub fn config_json(arch: FixtureArch, g: &Geometry, tok: &Tokenizer) -> Result<serde_json::Value> {
    let specials = arch.specials();
    let bos = token_id(tok, specials[0])?;
    let eos = token_id(tok, specials[specials.len().min(2) - 1])?;
    let mut c = serde_json::json!({
        "hidden_size": g.hidden,
        "intermediate_size": g.intermediate,
        "num_hidden_layers": g.layers,
        "num_attention_heads": g.heads,
        "num_key_value_heads": g.kv_heads,
        "rms_norm_eps": 1e-6,
        "rope_theta": g.rope_theta,
        "max_position_embeddings": g.max_position,
        "vocab_size": g.vocab,
        "tie_word_embeddings": arch.tied(),
        "hidden_act": "silu",
        "bos_token_id": bos,
        "eos_token_id": eos,
        "torch_dtype": "bfloat16",
    });
    let (archs, model_type) = match arch {
        FixtureArch::Qwen2 => ("Qwen2ForCausalLM", "qwen2"),
        FixtureArch::Qwen3 => ("Qwen3ForCausalLM", "qwen3"),
        FixtureArch::Llama3 => ("LlamaForCausalLM", "llama"),
    };
    c["architectures"] = serde_json::json!([archs]);
    c["model_type"] = model_type.into();
    match arch {
        FixtureArch::Qwen2 => {
            c["use_sliding_window"] = false.into();
            c["sliding_window"] = g.max_position.into();
            c["max_window_layers"] = g.layers.into();
        }
        FixtureArch::Qwen3 => {
            c["head_dim"] = g.head_dim.into();
            c["attention_bias"] = false.into();
            c["use_sliding_window"] = false.into();
            c["sliding_window"] = serde_json::Value::Null;
        }
        FixtureArch::Llama3 => {
            c["head_dim"] = g.head_dim.into();
            c["attention_bias"] = false.into();
            c["mlp_bias"] = false.into();
            if let Some((factor, low, high, orig)) = g.llama3 {
                c["rope_scaling"] = serde_json::json!({
                    "rope_type": "llama3",
                    "factor": factor,
                    "low_freq_factor": low,
                    "high_freq_factor": high,
                    "original_max_position_embeddings": orig,
                });
            }
        }
    }
    Ok(c)
}

/// The weights under Hugging Face names, each stored as `dtype` as soon as it is drawn (a real
/// geometry in bf16 never holds an f32 copy of the whole model).
pub fn weights(
    arch: FixtureArch,
    g: &Geometry,
    seed: u64,
    dtype: DType,
) -> Result<Vec<(String, Tensor)>> {
    let (h, hd, nh, nkv, inter, v) = (
        g.hidden,
        g.head_dim,
        g.heads,
        g.kv_heads,
        g.intermediate,
        g.vocab,
    );
    let mut rng = Rng::new(seed ^ 0x7177_656e);
    let mut w: Vec<(String, Tensor)> = Vec::new();
    let mut push = |name: String, t: Tensor| -> Result<()> {
        w.push((name, t.to_dtype(dtype)?));
        Ok(())
    };
    // tied: the embedding is also the output projection. Kept small against the layers' outputs
    // so that a token's own embedding, still in the residual stream, does not win the output
    // product and make greedy decoding repeat the input token (which would make a greedy check
    // of the tied fixtures nearly empty).
    let embed_std = if arch.tied() {
        0.4 / (h as f64).sqrt()
    } else {
        1.0
    };
    push(
        "model.embed_tokens.weight".into(),
        rng.normal(&[v, h], embed_std)?,
    )?;
    for i in 0..g.layers {
        let p = format!("model.layers.{i}");
        push(format!("{p}.input_layernorm.weight"), rng.around_one(h)?)?;
        push(
            format!("{p}.self_attn.q_proj.weight"),
            rng.linear(nh * hd, h)?,
        )?;
        push(
            format!("{p}.self_attn.k_proj.weight"),
            rng.linear(nkv * hd, h)?,
        )?;
        push(
            format!("{p}.self_attn.v_proj.weight"),
            rng.linear(nkv * hd, h)?,
        )?;
        if arch == FixtureArch::Qwen2 {
            // Qwen2's k biases are large in the real checkpoints: they shift every key alike
            push(
                format!("{p}.self_attn.q_proj.bias"),
                rng.normal(&[nh * hd], 0.5)?,
            )?;
            push(
                format!("{p}.self_attn.k_proj.bias"),
                rng.normal(&[nkv * hd], 1.0)?,
            )?;
            push(
                format!("{p}.self_attn.v_proj.bias"),
                rng.normal(&[nkv * hd], 0.2)?,
            )?;
        }
        if arch == FixtureArch::Qwen3 {
            // gains far from 1 so that a missing or misplaced norm cannot go unnoticed
            push(
                format!("{p}.self_attn.q_norm.weight"),
                rng.normal(&[hd], 1.0)?.abs()?,
            )?;
            push(
                format!("{p}.self_attn.k_norm.weight"),
                rng.normal(&[hd], 1.0)?.abs()?,
            )?;
        }
        push(
            format!("{p}.self_attn.o_proj.weight"),
            rng.linear(h, nh * hd)?,
        )?;
        push(
            format!("{p}.post_attention_layernorm.weight"),
            rng.around_one(h)?,
        )?;
        push(format!("{p}.mlp.gate_proj.weight"), rng.linear(inter, h)?)?;
        push(format!("{p}.mlp.up_proj.weight"), rng.linear(inter, h)?)?;
        push(format!("{p}.mlp.down_proj.weight"), rng.linear(h, inter)?)?;
    }
    push("model.norm.weight".into(), rng.around_one(h)?)?;
    if !arch.tied() {
        push(
            "lm_head.weight".into(),
            rng.normal(&[v, h], 2.0 / (h as f64).sqrt())?,
        )?;
    }
    Ok(w)
}

/// Write a Hugging Face folder (config.json, safetensors in `opts.dtype`, tokenizer.json,
/// tokenizer_config.json with the model's BOS rule).
pub fn write_hf(
    dir: &Path,
    arch: FixtureArch,
    g: &Geometry,
    seed: u64,
    opts: &FixtureOptions,
) -> Result<()> {
    create_dir(dir)?;
    let tok = tokenizer(arch)?;
    let config = config_json(arch, g, &tok)?;
    let w = weights(arch, g, seed, opts.dtype)?;
    write_folder(dir, &config, w, &tok, opts)?;
    let tc = serde_json::json!({ "add_bos_token": arch == FixtureArch::Llama3 });
    let p = dir.join("tokenizer_config.json");
    std::fs::write(&p, tc.to_string()).map_err(|source| crate::Error::Io { path: p, source })
}
