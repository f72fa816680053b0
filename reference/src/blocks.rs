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

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn eye(n: usize) -> Tensor {
        Tensor::eye(n, candle_core::DType::F32, &Device::Cpu).unwrap()
    }

    #[test]
    fn gelu_mlp_is_tanh_gelu() {
        // Published values of GPT-2's gelu_new: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
        let mlp = Mlp::Gelu {
            fc: Linear {
                w: eye(4),
                b: None,
                in_out: true,
            },
            proj: Linear {
                w: eye(4),
                b: None,
                in_out: true,
            },
            act: Activation::GeluTanh,
        };
        let x = Tensor::new(&[[1.0f32, -1.0, 2.0, 0.5]], &Device::Cpu).unwrap();
        let y: Vec<Vec<f32>> = mlp.forward(&x).unwrap().to_vec2().unwrap();
        let want = [0.841_192, -0.158_808, 1.954_598, 0.345_714];
        for (a, b) in y[0].iter().zip(want) {
            assert!((a - b).abs() < 2e-6, "{:?}", y[0]);
        }
    }

    #[test]
    fn layer_norm_by_hand() {
        // x = [1,2,3,4]: mean 2.5, biased var 1.25.
        let n = Norm::Layer {
            w: Tensor::new(&[1.0f32, 1.0, 2.0, 1.0], &Device::Cpu).unwrap(),
            b: Tensor::new(&[0.0f32, 0.0, 0.0, 1.0], &Device::Cpu).unwrap(),
            eps: 0.0,
        };
        let x = Tensor::new(&[[1.0f32, 2.0, 3.0, 4.0]], &Device::Cpu).unwrap();
        let y: Vec<Vec<f32>> = n.forward(&x).unwrap().to_vec2().unwrap();
        let s = 1.25f32.sqrt();
        let want = [-1.5 / s, -0.5 / s, 2.0 * 0.5 / s, 1.5 / s + 1.0];
        for (a, b) in y[0].iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{:?}", y[0]);
        }
    }

    #[test]
    fn linear_layouts() {
        // nn.Linear [out, in] computes x Wᵀ; Conv1D [in, out] computes x W.
        let w = Tensor::new(&[[1.0f32, 2.0], [3.0, 4.0], [5.0, 6.0]], &Device::Cpu).unwrap();
        let x = Tensor::new(&[[1.0f32, 10.0]], &Device::Cpu).unwrap();
        let lin = Linear {
            w: w.clone(),
            b: None,
            in_out: false,
        };
        assert_eq!(
            lin.forward(&x).unwrap().to_vec2::<f32>().unwrap(),
            vec![vec![21.0, 43.0, 65.0]]
        );
        let x3 = Tensor::new(&[[1.0f32, 10.0, 100.0]], &Device::Cpu).unwrap();
        let b = Tensor::new(&[0.5f32, -0.5], &Device::Cpu).unwrap();
        let conv = Linear {
            w,
            b: Some(b),
            in_out: true,
        };
        assert_eq!(
            conv.forward(&x3).unwrap().to_vec2::<f32>().unwrap(),
            vec![vec![531.5, 641.5]]
        );
    }
}
