//! Building blocks shared by both families: linear layers (HF `Linear` or GPT-2 `Conv1D` layout),
//! norms, and the two MLP kinds.

use candle_core::{Device, Tensor};

use crate::arith::Rounder;
use crate::matmul::{self, Rhs};
use crate::store::Weight;
use crate::streamed_gemv::streamed_gemv;
use crate::Result;

/// A linear map. HF `nn.Linear` stores `[out, in]` (y = x Wᵀ + b), GPT-2 `Conv1D` stores `[in, out]`
/// (y = x W + b). The weight is kept as the checkpoint stores it ([`Weight`]: f32, or f16/bf16/
/// quantised blocks converted a tile at a time) and multiplied through a transposed *view*, so
/// neither an f32 nor a transposed copy doubles the memory.
#[derive(Debug, Clone)]
pub(crate) struct Linear {
    pub w: Weight,
    pub b: Option<Tensor>,
    /// true = `[in, out]` (Conv1D), false = `[out, in]` (nn.Linear).
    pub in_out: bool,
}

impl Linear {
    /// An f32 in-memory weight.
    #[cfg(test)]
    pub fn from_tensor(w: Tensor, b: Option<Tensor>, in_out: bool) -> Result<Linear> {
        Ok(Linear {
            w: Weight::from_tensor(w)?,
            b,
            in_out,
        })
    }

    /// The tensor form (a whole f32 weight per call when it is not f32 in memory: GPT-2's MLP).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if self.w.input_int8_block().is_some() {
            // the int8 input path lives in forward_rows; one implementation of it
            let mut dims = x.dims().to_vec();
            let inp = dims.last().copied().unwrap_or(1).max(1);
            let rows = x.elem_count() / inp;
            let y = self.forward_rows(&x.flatten_all()?.to_vec1()?, rows)?;
            if let Some(last) = dims.last_mut() {
                *last = y.len() / rows.max(1);
            }
            return Ok(Tensor::from_vec(y, dims, x.device())?);
        }
        let w = self.w.to_tensor()?;
        let y = if self.in_out {
            x.matmul(&w)?
        } else {
            x.matmul(&w.t()?)?
        };
        Ok(match &self.b {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }

    /// `forward` on `rows` row-major input rows held in a slice: the same product as `forward`
    /// (see `matmul`), bias added the same way.
    pub fn forward_rows(&self, x: &[f32], rows: usize) -> Result<Vec<f32>> {
        let inp = x.len() / rows.max(1);
        // a declared int8 input path (MatMulNBits accuracy_level 4) reads its rows on that grid
        let quantised;
        let x = match self.w.input_int8_block() {
            Some(block) if !self.in_out => {
                quantised = crate::blockquant::quantise_input_rows(x, inp, block);
                &quantised[..]
            }
            _ => x,
        };
        let (kind, out) = if self.in_out {
            (Rhs::Plain, self.w.cols())
        } else {
            (Rhs::Transposed, self.w.rows())
        };
        // one row (a decode step) of a weight dequantised at load: read from its blocks, with
        // the f32 product's bits (block_gemv)
        if rows == 1 && !self.in_out {
            if let Some(y) = self.w.one_row_from_blocks(x, inp) {
                return self.add_bias(y, out);
            }
        }
        let direct = self
            .w
            .with_f32(|w| matmul::batched(x, w, kind, 1, rows, inp, out));
        let y = match direct {
            Some(y) => y?,
            None if !self.in_out => {
                let w = &self.w;
                let fill = |r0: usize, r1: usize, buf: &mut Vec<f32>| w.rows_into(r0, r1, buf);
                // one row (a decode step): the weight converted a few rows at a time in L1 and
                // summed there, instead of tiles written out to L2/L3 and read back by gemm (bf16
                // 1.5B decode step 0.6 → 0.25 s); the sums' order differs from gemm's by an f32
                // rounding, within the 1e-6 of an f32 copy (tests/storage.rs)
                if rows == 1 && w.is_half() {
                    streamed_gemv(x, inp, out, &fill)?
                } else {
                    matmul::tiled_transposed(x, rows, inp, out, &fill)?
                }
            }
            None => {
                // Conv1D rows are input features: a tile of them would split the sums over k
                let mut w = Vec::new();
                self.w.rows_into(0, self.w.rows(), &mut w)?;
                matmul::batched(x, &w, kind, 1, rows, inp, out)?
            }
        };
        self.add_bias(y, out)
    }

    /// The bias added to every row of `out` values.
    fn add_bias(&self, mut y: Vec<f32>, out: usize) -> Result<Vec<f32>> {
        if let Some(b) = &self.b {
            let b: Vec<f32> = b.to_vec1()?;
            for r in y.chunks_exact_mut(out) {
                for (v, &bb) in r.iter_mut().zip(&b) {
                    *v += bb;
                }
            }
        }
        Ok(y)
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
    /// The tensor form, kept as the independent check of `forward_rows` in the tests.
    #[cfg(test)]
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(match self {
            Norm::Rms { w, eps } => {
                let ms = x.sqr()?.mean_keepdim(candle_core::D::Minus1)?;
                let inv = (ms + *eps)?.sqrt()?.recip()?;
                x.broadcast_mul(&inv)?.broadcast_mul(w)?
            }
            Norm::Layer { w, b, eps } => {
                let mean = x.mean_keepdim(candle_core::D::Minus1)?;
                let xc = x.broadcast_sub(&mean)?;
                let var = xc.sqr()?.mean_keepdim(candle_core::D::Minus1)?;
                let inv = (var + *eps)?.sqrt()?.recip()?;
                xc.broadcast_mul(&inv)?.broadcast_mul(w)?.broadcast_add(b)?
            }
        })
    }

    /// `forward_rows` in the arithmetic `rnd` declares: under fp16, RMSNorm rounds every
    /// intermediate its graph holds (arith.rs); LayerNorm (GPT-2) rounds its output only.
    pub fn forward_rows_in(
        &self,
        name: &'static str,
        x: &[f32],
        n: usize,
        rnd: &Rounder,
    ) -> Result<Vec<f32>> {
        if let Norm::Rms { w, eps } = self {
            if let Some(y) = rnd.rms_norm(name, x, n, &w.to_vec1::<f32>()?, *eps as f32) {
                return Ok(y);
            }
        }
        let mut y = self.forward_rows(x, n)?;
        rnd.round_norm_output(name, &mut y);
        Ok(y)
    }

    /// `forward` on row-major rows of `n` features held in a slice (the same f32 formula as the
    /// tensor form, one row at a time).
    pub fn forward_rows(&self, x: &[f32], n: usize) -> Result<Vec<f32>> {
        let mut out = vec![0f32; x.len()];
        match self {
            Norm::Rms { w, eps } => {
                let w: Vec<f32> = w.to_vec1()?;
                let eps = *eps as f32;
                for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
                    let ms = xr.iter().map(|v| v * v).sum::<f32>() / n as f32;
                    let inv = (ms + eps).sqrt().recip();
                    for ((o, &v), &g) in or.iter_mut().zip(xr).zip(&w) {
                        *o = v * inv * g;
                    }
                }
            }
            Norm::Layer { w, b, eps } => {
                let w: Vec<f32> = w.to_vec1()?;
                let b: Vec<f32> = b.to_vec1()?;
                let eps = *eps as f32;
                for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
                    let mean = xr.iter().sum::<f32>() / n as f32;
                    for (o, &v) in or.iter_mut().zip(xr) {
                        *o = v - mean;
                    }
                    let var = or.iter().map(|v| v * v).sum::<f32>() / n as f32;
                    let inv = (var + eps).sqrt().recip();
                    for ((o, &g), &bb) in or.iter_mut().zip(&w).zip(&b) {
                        *o = *o * inv * g + bb;
                    }
                }
            }
        }
        Ok(out)
    }
}

/// Values from which an elementwise pass is split over the threads (a decode step's 8960 stay on
/// one: the split would cost more than the pass).
const PARALLEL_VALUES: usize = 1 << 16;

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

    /// `forward_rows` in the arithmetic `rnd` declares: under fp16 SwiGLU rounds gate and up,
    /// SiLU and the product (the down projection's output is the caller's); GELU is not split.
    pub fn forward_rows_in(&self, x: &[f32], rows: usize, rnd: &Rounder) -> Result<Vec<f32>> {
        match self {
            Mlp::SwiGlu { gate, up, down } if rnd.per_site() => {
                let mut g = gate.forward_rows(x, rows)?;
                let mut u = up.forward_rows(x, rows)?;
                rnd.round(&mut g, "gate_proj");
                rnd.round(&mut u, "up_proj");
                for a in g.iter_mut() {
                    *a /= 1.0 + (-*a).exp();
                }
                rnd.round(&mut g, "silu");
                for (a, &b) in g.iter_mut().zip(&u) {
                    *a *= b;
                }
                rnd.round(&mut g, "silu·up");
                down.forward_rows(&g, rows)
            }
            _ => self.forward_rows(x, rows),
        }
    }

    /// `forward` on `rows` row-major rows held in a slice.
    pub fn forward_rows(&self, x: &[f32], rows: usize) -> Result<Vec<f32>> {
        match self {
            Mlp::SwiGlu { gate, up, down } => {
                let mut g = gate.forward_rows(x, rows)?;
                let u = up.forward_rows(x, rows)?;
                // candle's silu: x / (1 + exp(-x)); one exp per value of a prefill's 64 × 8960
                // rows ran on one core while the other waited for the down projection
                let silu = |g: &mut [f32], u: &[f32]| {
                    for (a, &b) in g.iter_mut().zip(u) {
                        *a = *a / (1.0 + (-*a).exp()) * b;
                    }
                };
                if g.len() >= PARALLEL_VALUES {
                    use rayon::prelude::*;
                    g.par_chunks_mut(PARALLEL_VALUES / 4)
                        .zip(u.par_chunks(PARALLEL_VALUES / 4))
                        .for_each(|(g, u)| silu(g, u));
                } else {
                    silu(&mut g, &u);
                }
                down.forward_rows(&g, rows)
            }
            Mlp::Gelu { .. } => {
                let n = x.len() / rows.max(1);
                let xt = Tensor::from_slice(x, (rows, n), &Device::Cpu)?;
                Ok(self.forward(&xt)?.flatten_all()?.to_vec1()?)
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
    /// Qwen3 QK-norm: RMSNorm over each head of q / k, before RoPE.
    pub q_norm: Option<Norm>,
    pub k_norm: Option<Norm>,
    pub norm1: Norm,
    pub qkv: Qkv,
    pub o: Linear,
    pub norm2: Norm,
    pub mlp: Mlp,
}

impl Block {
    /// `qkv` on `rows` row-major rows held in a slice: q `[T*q_dim]`, k and v `[T*kv_dim]`.
    pub fn qkv_rows(
        &self,
        h: &[f32],
        rows: usize,
        q_dim: usize,
        kv_dim: usize,
    ) -> Result<(Vec<f32>, Vec<f32>, Vec<f32>)> {
        Ok(match &self.qkv {
            // one row (a decode step): k and v are too narrow to split by columns without
            // changing gemm's kernel (SmolLM2: 192 outputs, see matmul::GEMV_PART_COLUMNS), so
            // the three products run beside each other on the threads, each the same call as
            // alone and so the same bits; more rows: gemm threads each product itself
            Qkv::Separate { q, k, v } if rows == 1 => {
                let (q, (k, v)) = rayon::join(
                    || q.forward_rows(h, rows),
                    || rayon::join(|| k.forward_rows(h, rows), || v.forward_rows(h, rows)),
                );
                (q?, k?, v?)
            }
            Qkv::Separate { q, k, v } => (
                q.forward_rows(h, rows)?,
                k.forward_rows(h, rows)?,
                v.forward_rows(h, rows)?,
            ),
            Qkv::Fused(lin) => {
                let all = lin.forward_rows(h, rows)?;
                let width = q_dim + 2 * kv_dim;
                let (mut q, mut k, mut v) = (
                    Vec::with_capacity(rows * q_dim),
                    Vec::with_capacity(rows * kv_dim),
                    Vec::with_capacity(rows * kv_dim),
                );
                for r in all.chunks_exact(width) {
                    q.extend_from_slice(&r[..q_dim]);
                    k.extend_from_slice(&r[q_dim..q_dim + kv_dim]);
                    v.extend_from_slice(&r[q_dim + kv_dim..]);
                }
                (q, k, v)
            }
        })
    }

    /// Per-head norms on `[T, heads, hd]` rows of q and k (a no-op without QK-norm).
    pub fn qk_norm_rows(&self, q: &mut Vec<f32>, k: &mut Vec<f32>, hd: usize) -> Result<()> {
        if let Some(n) = &self.q_norm {
            *q = n.forward_rows(q, hd)?;
        }
        if let Some(n) = &self.k_norm {
            *k = n.forward_rows(k, hd)?;
        }
        Ok(())
    }

    pub fn linears(&self) -> Vec<&Linear> {
        let mut v: Vec<&Linear> = match &self.qkv {
            Qkv::Separate { q, k, v } => vec![q, k, v],
            Qkv::Fused(l) => vec![l],
        };
        v.push(&self.o);
        v.extend(match &self.mlp {
            Mlp::SwiGlu { gate, up, down } => vec![gate, up, down],
            Mlp::Gelu { fc, proj, .. } => vec![fc, proj],
        });
        v
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
            fc: Linear::from_tensor(eye(4), None, true).unwrap(),
            proj: Linear::from_tensor(eye(4), None, true).unwrap(),
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
        let rows = n.forward_rows(&[1.0, 2.0, 3.0, 4.0], 4).unwrap();
        let s = 1.25f32.sqrt();
        let want = [-1.5 / s, -0.5 / s, 2.0 * 0.5 / s, 1.5 / s + 1.0];
        for ((a, r), b) in y[0].iter().zip(&rows).zip(want) {
            assert!((a - b).abs() < 1e-6, "{:?}", y[0]);
            assert!((r - b).abs() < 1e-6, "{rows:?}");
        }
    }

    #[test]
    fn rms_norm_by_hand() {
        // x = [1, 2, 2, 4]: mean square 25/4, 1/sqrt(6.25) = 0.4; eps 0.
        let n = Norm::Rms {
            w: Tensor::new(&[1.0f32, 2.0, 1.0, 0.5], &Device::Cpu).unwrap(),
            eps: 0.0,
        };
        let y = n
            .forward_rows(&[1.0, 2.0, 2.0, 4.0, 0.0, 0.0, 0.0, 3.0], 4)
            .unwrap();
        let want = [0.4, 1.6, 0.8, 0.8, 0.0, 0.0, 0.0, 1.0];
        for (a, b) in y.iter().zip(want) {
            assert!((a - b).abs() < 1e-6, "{y:?}");
        }
    }

    #[test]
    fn linear_layouts() {
        // nn.Linear [out, in] computes x Wᵀ; Conv1D [in, out] computes x W.
        let w = Tensor::new(&[[1.0f32, 2.0], [3.0, 4.0], [5.0, 6.0]], &Device::Cpu).unwrap();
        let x = Tensor::new(&[[1.0f32, 10.0]], &Device::Cpu).unwrap();
        let lin = Linear::from_tensor(w.clone(), None, false).unwrap();
        assert_eq!(
            lin.forward(&x).unwrap().to_vec2::<f32>().unwrap(),
            vec![vec![21.0, 43.0, 65.0]]
        );
        let x3 = Tensor::new(&[[1.0f32, 10.0, 100.0]], &Device::Cpu).unwrap();
        let b = Tensor::new(&[0.5f32, -0.5], &Device::Cpu).unwrap();
        let conv = Linear::from_tensor(w, Some(b), true).unwrap();
        assert_eq!(
            conv.forward(&x3).unwrap().to_vec2::<f32>().unwrap(),
            vec![vec![531.5, 641.5]]
        );
    }
}
