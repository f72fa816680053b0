//! The Llama-family weights as plain tensors, for devices that run their own graph (the fp16
//! stateful emulator of issue 9) instead of [`Model::run_graph`].

use candle_core::Tensor;

use crate::blocks::{Linear, Mlp, Norm, Qkv};
use crate::{Family, Model, Result};

/// `y = x Wᵀ + b` with `w` in `[out, in]` (nn.Linear) order.
#[derive(Debug, Clone)]
pub struct LinearExport {
    pub w: Tensor,
    pub b: Option<Tensor>,
}

#[derive(Debug, Clone)]
pub struct LayerExport {
    pub attn_norm: Tensor,
    /// Qwen3 QK-norm gains `[head_dim]` (RMSNorm over each head of q / k before RoPE, with the
    /// model's eps); None for architectures without it.
    pub q_norm: Option<Tensor>,
    pub k_norm: Option<Tensor>,
    pub q: LinearExport,
    pub k: LinearExport,
    pub v: LinearExport,
    pub o: LinearExport,
    pub mlp_norm: Tensor,
    pub gate: LinearExport,
    pub up: LinearExport,
    pub down: LinearExport,
}

/// A Llama-family model's weights (f32, as loaded) and the numbers its forward needs.
#[derive(Debug, Clone)]
pub struct LlamaExport {
    /// `[vocab, hidden]`.
    pub embed: Tensor,
    pub layers: Vec<LayerExport>,
    pub final_norm: Tensor,
    pub lm_head: LinearExport,
    pub norm_eps: f64,
    /// HF `inv_freq` (length head_dim / 2).
    pub inv_freq: Vec<f32>,
}

fn linear(l: &Linear) -> Result<LinearExport> {
    let w = l.w.to_tensor()?;
    let w = if l.in_out { w.t()?.contiguous()? } else { w };
    Ok(LinearExport { w, b: l.b.clone() })
}

fn rms(n: &Norm) -> Option<(Tensor, f64)> {
    match n {
        Norm::Rms { w, eps } => Some((w.clone(), *eps)),
        Norm::Layer { .. } => None,
    }
}

impl Model {
    /// The weights of a Llama-family model (RMSNorm, separate q/k/v, SwiGLU); `None` for GPT-2.
    pub fn llama_export(&self) -> Result<Option<LlamaExport>> {
        if self.config.family != Family::Llama {
            return Ok(None);
        }
        let Some(inv_freq) = self.inv_freq.clone() else {
            return Ok(None);
        };
        let mut layers = Vec::with_capacity(self.blocks.len());
        for b in &self.blocks {
            let (Some((attn_norm, _)), Some((mlp_norm, _))) = (rms(&b.norm1), rms(&b.norm2)) else {
                return Ok(None);
            };
            let Qkv::Separate { q, k, v } = &b.qkv else {
                return Ok(None);
            };
            let Mlp::SwiGlu { gate, up, down } = &b.mlp else {
                return Ok(None);
            };
            let head_norm = |n: &Option<Norm>| n.as_ref().and_then(rms).map(|(w, _)| w);
            layers.push(LayerExport {
                attn_norm,
                q_norm: head_norm(&b.q_norm),
                k_norm: head_norm(&b.k_norm),
                q: linear(q)?,
                k: linear(k)?,
                v: linear(v)?,
                o: linear(&b.o)?,
                mlp_norm,
                gate: linear(gate)?,
                up: linear(up)?,
                down: linear(down)?,
            });
        }
        let Some((final_norm, norm_eps)) = rms(&self.final_norm) else {
            return Ok(None);
        };
        Ok(Some(LlamaExport {
            embed: self.embed.to_tensor()?,
            layers,
            final_norm,
            lm_head: linear(&self.lm_head)?,
            norm_eps,
            inv_freq,
        }))
    }
}
