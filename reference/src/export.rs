//! The Llama-family weights for devices that run their own graph (the fp16 stateful emulator of
//! issue 9) instead of [`Model::run_graph`]. The linear weights and the embedding table are the
//! model's own stored weights, shared (issue 21: an emulator never holds a second copy); norms
//! and biases are small f32 tensors.

use candle_core::Tensor;

use crate::blocks::{Linear, Mlp, Norm, Qkv};
use crate::store::{EmbeddingRows, Weight};
use crate::streamed_gemv::streamed_gemv;
use crate::{matmul, Family, Model, Result};

/// `y = x Wᵀ + b` with `W` in `[out, in]` (nn.Linear) order, `W` as the checkpoint stores it.
#[derive(Debug, Clone)]
pub struct LinearExport {
    w: Weight,
    pub b: Option<Tensor>,
}

/// f32 values copied and mapped together (16 KiB).
const MAP_CHUNK: usize = 4096;

/// What a device does to each weight value before its product (fp16 rounding on the ANE),
/// applied to f32 rows a tile at a time.
pub type ValueMap<'a> = dyn Fn(&mut [f32]) + Sync + 'a;

impl LinearExport {
    /// `(out, in)`.
    pub fn dims(&self) -> (usize, usize) {
        (self.w.rows(), self.w.cols())
    }

    /// The whole weight as an f32 `[out, in]` tensor (a copy: for writers of weight files).
    pub fn to_tensor(&self) -> Result<Tensor> {
        self.w.to_tensor()
    }

    /// The largest |w| (NaN ignored), read a tile of rows at a time.
    pub fn max_abs(&self) -> Result<f32> {
        self.w.max_abs()
    }

    /// `x Wᵀ` (no bias) for `rows` rows of `in` values, each tile of `W` converted to f32 and
    /// passed through `map` before its product; sums in f32 (one row: a streamed dot product per
    /// weight row, see `streamed_gemv`; more rows: gemm on tiles).
    pub fn product_mapped(&self, x: &[f32], rows: usize, map: &ValueMap<'_>) -> Result<Vec<f32>> {
        let (out, inp) = self.dims();
        let fill = |r0: usize, r1: usize, buf: &mut Vec<f32>| -> Result<()> {
            // An f32 weight is copied and mapped a few KiB at a time, so `map` reads values
            // still in L1 (a whole tile is larger than L2).
            buf.clear();
            let mapped = self.w.with_f32(|v| {
                for part in v[r0 * inp..r1 * inp].chunks(MAP_CHUNK) {
                    let at = buf.len();
                    buf.extend_from_slice(part);
                    map(&mut buf[at..]);
                }
            });
            if mapped.is_none() {
                self.w.rows_into(r0, r1, buf)?;
                map(buf);
            }
            Ok(())
        };
        if rows == 1 {
            return streamed_gemv(x, inp, out, &fill);
        }
        matmul::tiled_transposed(x, rows, inp, out, &fill)
    }
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

/// A Llama-family model's weights (shared with the model) and the numbers its forward needs.
#[derive(Debug, Clone)]
pub struct LlamaExport {
    /// `[vocab, hidden]`.
    pub embed: EmbeddingRows,
    pub layers: Vec<LayerExport>,
    pub final_norm: Tensor,
    pub lm_head: LinearExport,
    pub norm_eps: f64,
    /// HF `inv_freq` (length head_dim / 2).
    pub inv_freq: Vec<f32>,
}

fn linear(l: &Linear) -> Result<LinearExport> {
    let w = if l.in_out {
        // a Conv1D `[in, out]` weight in a Llama-family model (no loader makes one): the only
        // case that copies, since its rows are not the output channels
        Weight::from_tensor(l.w.to_tensor()?.t()?.contiguous()?)?
    } else {
        l.w.clone()
    };
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
            embed: EmbeddingRows(self.embed.clone()),
            layers,
            final_norm,
            lm_head: linear(&self.lm_head)?,
            norm_eps,
            inv_freq,
        }))
    }
}
