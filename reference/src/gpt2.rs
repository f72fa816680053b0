//! GPT-2 family (GPT-2, distilgpt2): weight layout (Conv1D `[in, out]`), learned positions.

use candle_core::Tensor;

use crate::blocks::{Activation, Block, Linear, Mlp, Norm, Qkv};
use crate::store::Weight;
use crate::weights::WeightGetter;
use crate::{ModelConfig, Result};

pub(crate) struct Gpt2Parts {
    pub wte: Weight,
    pub wpe: Tensor,
    pub blocks: Vec<Block>,
    pub final_norm: Norm,
    pub lm_head: Linear,
}

pub(crate) fn build(cfg: &ModelConfig, g: &WeightGetter, act: Activation) -> Result<Gpt2Parts> {
    let h = cfg.hidden_size;
    let inter = cfg.intermediate_size;
    let ln = |p: &str| -> Result<Norm> {
        Ok(Norm::Layer {
            w: g.get_f32(&format!("{p}.weight"), &[h])?,
            b: g.get_f32(&format!("{p}.bias"), &[h])?,
            eps: cfg.norm_eps,
        })
    };
    let wte = g.get("wte.weight", &[cfg.vocab_size, h])?;
    let wpe = g.get_f32("wpe.weight", &[cfg.max_position, h])?;
    // no capacity from the config: a lying config.json must fail at its first missing layer,
    // not allocate for a billion of them
    let mut blocks = Vec::new();
    for i in 0..cfg.n_layers {
        let p = format!("h.{i}");
        blocks.push(Block {
            q_norm: None,
            k_norm: None,
            norm1: ln(&format!("{p}.ln_1"))?,
            qkv: Qkv::Fused(g.conv1d(&format!("{p}.attn.c_attn"), h, 3 * h)?),
            o: g.conv1d(&format!("{p}.attn.c_proj"), h, h)?,
            norm2: ln(&format!("{p}.ln_2"))?,
            mlp: Mlp::Gelu {
                fc: g.conv1d(&format!("{p}.mlp.c_fc"), h, inter)?,
                proj: g.conv1d(&format!("{p}.mlp.c_proj"), inter, h)?,
                act,
            },
        });
    }
    let final_norm = ln("ln_f")?;
    // GPT-2 always ties the output projection to wte.
    let lm_head = Linear {
        w: wte.clone(),
        b: None,
        in_out: false,
    };
    Ok(Gpt2Parts {
        wte,
        wpe,
        blocks,
        final_norm,
        lm_head,
    })
}

/// Strip the optional `transformer.` prefix so both checkpoint spellings share one name space.
pub(crate) fn canonical_name(name: &str) -> &str {
    name.strip_prefix("transformer.").unwrap_or(name)
}
