//! Building blocks shared by both families: linear layers (HF `Linear` or GPT-2 `Conv1D` layout),
//! norms, and the two MLP kinds.

use candle_core::{Tensor, D};

use crate::Result;

/// A linear map. HF `nn.Linear` stores `[out, in]` (y = x Wᵀ + b), GPT-2 `Conv1D` stores `[in, out]`
/// (y = x W + b). The weight is kept as loaded and multiplied through a transposed *view*, so no
/// transposed copy doubles the memory (dependency notes: as fast as a copy).
#[derive(Debug, Clone)]
pub(crate) struct Linear {
    pub w: Tensor,
    pub b: Option<Tensor>,
    /// true = `[in, out]` (Conv1D), false = `[out, in]` (nn.Linear).
    pub in_out: bool,
}

impl Linear {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = if self.in_out {
            x.matmul(&self.w)?
        } else {
            x.matmul(&self.w.t()?)?
        };
        Ok(match &self.b {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }
}

#[derive(Debug, Clone)]
pub(crate) enum Norm {
    /// x / sqrt(mean(x²) + eps) * w (HF LlamaRMSNorm, computed in f32).
    Rms { w: Tensor, eps: f64 },
    /// (x - mean) / sqrt(var + eps) * w + b, biased variance (torch LayerNorm).
    Layer { w: Tensor, b: Tensor, eps: f64 },
}

impl Norm {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Norm::Rms { w, eps } => {
                let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
                let inv = (ms + *eps)?.sqrt()?.recip()?;
                x.broadcast_mul(&inv)?.broadcast_mul(w)?
            }
            Norm::Layer { w, b, eps } => {
                let mean = x.mean_keepdim(D::Minus1)?;
                let xc = x.broadcast_sub(&mean)?;
                let var = xc.sqr()?.mean_keepdim(D::Minus1)?;
                let inv = (var + *eps)?.sqrt()?.recip()?;
                xc.broadcast_mul(&inv)?.broadcast_mul(w)?.broadcast_add(b)?
            }
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Activation {
    /// GELU, tanh approximation (GPT-2 `gelu_new`).
    GeluTanh,
}

#[derive(Debug, Clone)]
pub(crate) enum Mlp {
    /// down(silu(gate(x)) * up(x)).
    SwiGlu {
        gate: Linear,
        up: Linear,
        down: Linear,
    },
    /// proj(act(fc(x))).
    Gelu {
        fc: Linear,
        proj: Linear,
        act: Activation,
    },
}

impl Mlp {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Mlp::SwiGlu { gate, up, down } => {
                let g = gate.forward(x)?.silu()?;
                down.forward(&(g * up.forward(x)?)?)
            }
            Mlp::Gelu { fc, proj, act } => {
                let h = fc.forward(x)?;
                // candle's `gelu` is the tanh approximation (checked by a hand-value test).
                let h = match act {
                    Activation::GeluTanh => h.gelu()?,
                };
                proj.forward(&h)
            }
        }
    }

    pub fn linears_mut(&mut self) -> Vec<&mut Linear> {
        match self {
            Mlp::SwiGlu { gate, up, down } => vec![gate, up, down],
            Mlp::Gelu { fc, proj, .. } => vec![fc, proj],
        }
    }
}

/// How a layer produces q, k, v.
#[derive(Debug, Clone)]
pub(crate) enum Qkv {
    /// Llama family: three projections (Qwen2: with bias).
    Separate { q: Linear, k: Linear, v: Linear },
    /// GPT-2: one Conv1D producing [q | k | v].
    Fused(Linear),
}

/// One pre-norm transformer block: x += o(attn(norm1(x))); x += mlp(norm2(x)).
#[derive(Debug, Clone)]
pub(crate) struct Block {
    pub norm1: Norm,
    pub qkv: Qkv,
    pub o: Linear,
    pub norm2: Norm,
    pub mlp: Mlp,
}

impl Block {
    /// Returns q `[T, nh*hd]`, k and v `[T, nkv*hd]`.
    pub fn qkv(&self, h: &Tensor, q_dim: usize, kv_dim: usize) -> Result<(Tensor, Tensor, Tensor)> {
        Ok(match &self.qkv {
            Qkv::Separate { q, k, v } => (q.forward(h)?, k.forward(h)?, v.forward(h)?),
            Qkv::Fused(lin) => {
                let all = lin.forward(h)?;
                (
                    all.narrow(1, 0, q_dim)?,
                    all.narrow(1, q_dim, kv_dim)?,
                    all.narrow(1, q_dim + kv_dim, kv_dim)?,
                )
            }
        })
    }

    pub fn linears_mut(&mut self) -> Vec<&mut Linear> {
        let mut v: Vec<&mut Linear> = match &mut self.qkv {
            Qkv::Separate { q, k, v } => vec![q, k, v],
            Qkv::Fused(l) => vec![l],
        };
        v.push(&mut self.o);
        v.extend(self.mlp.linears_mut());
        v
    }
}
