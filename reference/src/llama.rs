//! Llama family (Llama incl. Llama-3 RoPE scaling, SmolLM/SmolLM2, Mistral, Qwen2, Qwen3): weight
//! layout and RoPE tables.

use crate::blocks::{Block, Linear, Mlp, Norm, Qkv};
use crate::store::Weight;
use crate::weights::WeightGetter;
use crate::{Error, ModelConfig, Result};

pub(crate) struct LlamaParts {
    pub embed: Weight,
    pub blocks: Vec<Block>,
    pub final_norm: Norm,
    pub lm_head: Linear,
    pub tied: bool,
}

pub(crate) fn build(cfg: &ModelConfig, g: &WeightGetter) -> Result<LlamaParts> {
    let (h, hd, nh, nkv, inter) = (
        cfg.hidden_size,
        cfg.head_dim,
        cfg.n_heads,
        cfg.n_kv_heads,
        cfg.intermediate_size,
    );
    let embed = g.get("model.embed_tokens.weight", &[cfg.vocab_size, h])?;
    // no capacity from the config: a lying config.json must fail at its first missing layer,
    // not allocate for a billion of them
    let mut blocks = Vec::new();
    for i in 0..cfg.n_layers {
        let p = format!("model.layers.{i}");
        let rms = |name: &str| -> Result<Norm> {
            Ok(Norm::Rms {
                w: g.get_f32(&format!("{p}.{name}.weight"), &[h])?,
                eps: cfg.norm_eps,
            })
        };
        // Qwen3's per-head norms: RMSNorm over head_dim, same eps as the layer norms (HF Qwen3RMSNorm)
        let head_norm = |name: &str| -> Result<Option<Norm>> {
            if !cfg.qk_norm {
                return Ok(None);
            }
            Ok(Some(Norm::Rms {
                w: g.get_f32(&format!("{p}.self_attn.{name}.weight"), &[hd])?,
                eps: cfg.norm_eps,
            }))
        };
        blocks.push(Block {
            q_norm: head_norm("q_norm")?,
            k_norm: head_norm("k_norm")?,
            norm1: rms("input_layernorm")?,
            qkv: Qkv::Separate {
                q: g.linear(&format!("{p}.self_attn.q_proj"), nh * hd, h, cfg.qkv_bias)?,
                k: g.linear(&format!("{p}.self_attn.k_proj"), nkv * hd, h, cfg.qkv_bias)?,
                v: g.linear(&format!("{p}.self_attn.v_proj"), nkv * hd, h, cfg.qkv_bias)?,
            },
            o: g.linear(&format!("{p}.self_attn.o_proj"), h, nh * hd, false)?,
            norm2: rms("post_attention_layernorm")?,
            mlp: Mlp::SwiGlu {
                gate: g.linear(&format!("{p}.mlp.gate_proj"), inter, h, false)?,
                up: g.linear(&format!("{p}.mlp.up_proj"), inter, h, false)?,
                down: g.linear(&format!("{p}.mlp.down_proj"), h, inter, false)?,
            },
        });
    }
    let final_norm = Norm::Rms {
        w: g.get_f32("model.norm.weight", &[h])?,
        eps: cfg.norm_eps,
    };
    // Tied when the config says so (GGUF: when the file has no `output.weight`). An untied
    // config without the projection used to fall back to the embedding without a word: HF would
    // run it with a freshly initialised lm_head, so no fallback reproduces it.
    let head = if cfg.tie_embeddings {
        None
    } else {
        Some(
            g.opt("lm_head.weight", &[cfg.vocab_size, h])?
                .ok_or_else(|| Error::Format {
                    path: g.path.clone(),
                    detail: "config.json has `tie_word_embeddings: false` (or no such field: false for this architecture) but the checkpoint holds no `lm_head.weight`; set `\"tie_word_embeddings\": true` if the output projection is the embedding, or add the lm_head weights".into(),
                })?,
        )
    };
    let tied = head.is_none();
    let lm_head = Linear {
        w: head.unwrap_or_else(|| embed.clone()),
        b: None,
        in_out: false,
    };
    Ok(LlamaParts {
        embed,
        blocks,
        final_norm,
        lm_head,
        tied,
    })
}

/// HF `inv_freq[i] = theta^(-2i/hd)`, i < hd/2, rounded to f32 as HF stores it.
pub fn inv_freq(theta: f64, head_dim: usize) -> Vec<f32> {
    (0..head_dim / 2)
        .map(|i| (1.0 / theta.powf((2 * i) as f64 / head_dim as f64)) as f32)
        .collect()
}

/// [`inv_freq`] divided by per-frequency factors (llama.cpp's `rope_freqs`: theta_i / factor_i),
/// the division done in f64 before the one rounding to f32. `None` = plain RoPE (the same bits as
/// [`inv_freq`]).
pub fn inv_freq_scaled(theta: f64, head_dim: usize, factors: Option<&[f32]>) -> Vec<f32> {
    let Some(f) = factors else {
        return inv_freq(theta, head_dim);
    };
    (0..head_dim / 2)
        .map(|i| {
            let base = 1.0 / theta.powf((2 * i) as f64 / head_dim as f64);
            (base / f64::from(f[i])) as f32
        })
        .collect()
}

/// Llama-3 `rope_scaling` (`rope_type: llama3`) as per-frequency divisors, from HF's
/// `_compute_llama3_parameters`: wavelengths shorter than `original / high_freq_factor` keep
/// their frequency (divisor 1), longer than `original / low_freq_factor` are divided by
/// `factor`, and the band between is interpolated with
/// `smooth = (original / wavelen - low) / (high - low)`: `inv * ((1 - smooth) / factor + smooth)`.
/// This is the divisor llama.cpp's converter writes as the `rope_freqs` tensor.
pub fn llama3_factors(
    theta: f64,
    head_dim: usize,
    factor: f64,
    low_freq_factor: f64,
    high_freq_factor: f64,
    original_max_position: f64,
) -> Vec<f32> {
    let low_wavelen = original_max_position / low_freq_factor;
    let high_wavelen = original_max_position / high_freq_factor;
    (0..head_dim / 2)
        .map(|i| {
            let inv = 1.0 / theta.powf((2 * i) as f64 / head_dim as f64);
            let wavelen = 2.0 * std::f64::consts::PI / inv;
            let div = if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor
            } else {
                let smooth = (original_max_position / wavelen - low_freq_factor)
                    / (high_freq_factor - low_freq_factor);
                1.0 / ((1.0 - smooth) / factor + smooth)
            };
            div as f32
        })
        .collect()
}

/// cos/sin tables `[T][hd]` in the rotate_half layout `[freqs, freqs]`.
///
/// The angle is the f32 product `pos * inv_freq` (HF forms it with an f32 matmul), then cos/sin of
/// that f32 value evaluated in f64 and rounded.
pub fn rope_tables(positions: &[f32], inv_freq: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let half = inv_freq.len();
    let hd = 2 * half;
    let mut cos = vec![0f32; positions.len() * hd];
    let mut sin = vec![0f32; positions.len() * hd];
    for (t, &p) in positions.iter().enumerate() {
        for (i, &f) in inv_freq.iter().enumerate() {
            let a = (p * f) as f64;
            let (s, c) = a.sin_cos();
            for j in [i, i + half] {
                cos[t * hd + j] = c as f32;
                sin[t * hd + j] = s as f32;
            }
        }
    }
    (cos, sin)
}
