//! The converted model's graph in fp16: every op runs on candle `DType::F16` tensors, so each
//! intermediate (projections, attention scores, softmax terms, norms, residuals) is an fp16 value
//! and overflows to ±inf where the ANE's would (docs/design.md "ane-sim numerics"). Matrix
//! products accumulate wider inside the kernel and round their output to fp16, as the ANE does.
//!
//! RMSNorm uses the scaled form ANE ports use (seed 002): `y = x / max|x|`, then
//! `y / sqrt(mean(y²) + eps / max|x|²)`, equal to `x / sqrt(mean(x²) + eps)` in exact arithmetic
//! but without squaring activations above 256 in fp16.

use candle_core::{DType, Device as CDevice, Tensor, D};
use kvprobe_reference::export::{LinearExport, LlamaExport};

use super::faults::AneFault;
use super::fp16::round_to_f16;
use crate::race::splitmix64;
use crate::Result;

/// A linear layer on the reference's own stored weight (shared, never copied whole): each tile
/// of it is rounded to fp16 as it is converted, the product of fp16 values sums in f32 and its
/// output is rounded to fp16 once, as the ANE's kernel does.
pub(crate) struct Lin {
    w: LinearExport,
    b: Option<Tensor>,
}

impl Lin {
    fn new(l: &LinearExport) -> Result<Lin> {
        Ok(Lin {
            w: l.clone(),
            b: l.b.as_ref().map(|b| b.to_dtype(DType::F16)).transpose()?,
        })
    }
    /// `x Wᵀ + b` for fp16 rows `x` `[q, in]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (q, _) = x.dims2()?;
        let xs: Vec<f32> = x.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
        let (out, _) = self.w.dims();
        let y = self.w.product_mapped(&xs, q, &round_to_f16)?;
        let y = Tensor::from_vec(y, (q, out), &CDevice::Cpu)?.to_dtype(DType::F16)?;
        Ok(match &self.b {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }
}

pub(crate) struct Layer {
    attn_norm: Tensor,
    /// Qwen3 QK-norm gains (fp16), applied per head before RoPE as in the reference.
    q_norm: Option<Tensor>,
    k_norm: Option<Tensor>,
    q: Lin,
    k: Lin,
    v: Lin,
    o: Lin,
    mlp_norm: Tensor,
    gate: Lin,
    up: Lin,
    down: Lin,
}

/// The fp16 weights and shape of the graph.
pub(crate) struct Graph {
    pub layers: Vec<Layer>,
    final_norm: Tensor,
    lm_head: Lin,
    eps: f64,
    inv_freq: Vec<f32>,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub hidden: usize,
}

/// One layer's K and V states, `[kv_heads, max_ctx, head_dim]` fp16 each.
#[derive(Debug, Clone)]
pub(crate) struct LayerState {
    pub k: Vec<half::f16>,
    pub v: Vec<half::f16>,
}

/// What one run gives the graph besides the weights and states.
pub(crate) struct RunSpec<'a> {
    /// `[q, hidden]` input embeddings (rounded to fp16 by the graph).
    pub embeddings: &'a [f32],
    /// Absolute positions of the q rows (state slots written and RoPE angles).
    pub positions: &'a [usize],
    /// Additive mask `[q, max_ctx]` as the graph uses it (fp16 values).
    pub mask: &'a [half::f16],
    pub max_ctx: usize,
    pub faults: &'a [AneFault],
    /// `ane-scale-after-qk=GAIN`: the scale comes after Q·Kᵀ.
    pub scale_after_qk: Option<f64>,
    /// `ane-norm-fp16=GAIN`: every RMSNorm without its fp32 cast.
    pub norm_fp16: Option<f64>,
    /// Rows the host sent (the first ones); rows after them are pad rows whose logits nobody
    /// reads. The logits returned are those of row `real_rows − 1`.
    pub real_rows: usize,
    /// `ane-state-race`: this call's seed for the low bits of the rows written past the 16th.
    pub race_seed: Option<u64>,
}

/// Rows a call writes exactly under `ane-state-race`.
pub(crate) const RACE_FREE_ROWS: usize = 16;

/// The ANE-port RMSNorm, or under `ane-norm-fp16=GAIN` the plain form in fp16 (module doc of
/// `faults`): the sum of squares is an fp16 value, inf past 65504.
fn norm(x: &Tensor, w: &Tensor, eps: f64, fp16: Option<f64>) -> Result<Tensor> {
    let Some(gain) = fp16 else {
        return rms_norm(x, w, eps);
    };
    let xg = (x * gain)?;
    let n = x.dim(D::Minus1)? as f64;
    // every square is fp16; their sum is exact in f32 and rounded once: with positive terms
    // the total is the largest partial sum, so it overflows exactly when an fp16 sum would
    let sum = xg
        .sqr()?
        .to_dtype(DType::F32)?
        .sum_keepdim(D::Minus1)?
        .to_dtype(DType::F16)?;
    let ms = (sum / n)?;
    let inv = (ms + eps * gain * gain)?.sqrt()?.recip()?;
    Ok(xg.broadcast_mul(&inv)?.broadcast_mul(w)?)
}

/// `ane-state-race`: rows `16..` of a call get their two lowest mantissa bits from `seed`.
fn race_bits(vals: &mut [half::f16], rows: usize, hd: usize, seed: u64) {
    let mut st = seed;
    let heads = vals.len() / (rows * hd);
    for g in 0..heads {
        for i in RACE_FREE_ROWS..rows {
            let row = &mut vals[(g * rows + i) * hd..(g * rows + i + 1) * hd];
            for v in row.iter_mut() {
                let bits = (splitmix64(&mut st) & 3) as u16;
                *v = half::f16::from_bits(v.to_bits() ^ bits);
            }
        }
    }
}

fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    let s = x.abs()?.max_keepdim(D::Minus1)?.maximum(1e-4)?;
    let y = x.broadcast_div(&s)?;
    let ms = y.sqr()?.mean_keepdim(D::Minus1)?;
    let eps_term = (s.sqr()?.recip()? * eps)?;
    let inv = (ms + eps_term)?.sqrt()?.recip()?;
    Ok(y.broadcast_mul(&inv)?.broadcast_mul(w)?)
}

/// HF rotate_half RoPE on `[heads, q, hd]` with `cos`/`sin` `[1, q, hd]`.
fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let hd = x.dim(D::Minus1)?;
    let x1 = x.narrow(D::Minus1, 0, hd / 2)?;
    let x2 = x.narrow(D::Minus1, hd / 2, hd / 2)?;
    let rot = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
    Ok((x.broadcast_mul(cos)? + rot.broadcast_mul(sin)?)?)
}

/// The state as the attention reads it when it holds only `wrap` slots: column j is slot
/// j mod wrap (the state itself when `wrap` = ctx).
fn wrapped(
    s: &[half::f16],
    nkv: usize,
    ctx: usize,
    hd: usize,
    wrap: usize,
) -> std::borrow::Cow<'_, [half::f16]> {
    if wrap >= ctx {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = Vec::with_capacity(s.len());
    for g in 0..nkv {
        for j in 0..ctx {
            let o = (g * ctx + j % wrap) * hd;
            out.extend_from_slice(&s[o..o + hd]);
        }
    }
    std::borrow::Cow::Owned(out)
}

fn f16_tensor(v: Vec<half::f16>, shape: (usize, usize, usize)) -> Result<Tensor> {
    Ok(Tensor::from_vec(v, shape, &CDevice::Cpu)?)
}

impl Graph {
    pub fn new(
        e: &LlamaExport,
        n_heads: usize,
        n_kv_heads: usize,
        head_dim: usize,
    ) -> Result<Graph> {
        let mut layers = Vec::with_capacity(e.layers.len());
        for l in &e.layers {
            let f16 = |t: &Option<Tensor>| t.as_ref().map(|t| t.to_dtype(DType::F16)).transpose();
            layers.push(Layer {
                attn_norm: l.attn_norm.to_dtype(DType::F16)?,
                q_norm: f16(&l.q_norm)?,
                k_norm: f16(&l.k_norm)?,
                q: Lin::new(&l.q)?,
                k: Lin::new(&l.k)?,
                v: Lin::new(&l.v)?,
                o: Lin::new(&l.o)?,
                mlp_norm: l.mlp_norm.to_dtype(DType::F16)?,
                gate: Lin::new(&l.gate)?,
                up: Lin::new(&l.up)?,
                down: Lin::new(&l.down)?,
            });
        }
        Ok(Graph {
            layers,
            final_norm: e.final_norm.to_dtype(DType::F16)?,
            lm_head: Lin::new(&e.lm_head)?,
            eps: e.norm_eps,
            inv_freq: e.inv_freq.clone(),
            n_heads,
            n_kv_heads,
            head_dim,
            hidden: e.embed.dims().1,
        })
    }

    pub fn empty_state(&self, max_ctx: usize) -> Vec<LayerState> {
        let n = self.n_kv_heads * max_ctx * self.head_dim;
        (0..self.layers.len())
            .map(|_| LayerState {
                k: vec![half::f16::ZERO; n],
                v: vec![half::f16::ZERO; n],
            })
            .collect()
    }

    /// cos/sin `[1, q, hd]` of the positions, computed in f32 and fed to the graph as fp16 (a
    /// converted model gathers them from an fp16 table).
    fn rope_tables(&self, positions: &[usize]) -> Result<(Tensor, Tensor)> {
        let hd = self.head_dim;
        let mut cos = Vec::with_capacity(positions.len() * hd);
        let mut sin = Vec::with_capacity(positions.len() * hd);
        for &p in positions {
            for i in 0..hd {
                let a = p as f32 * self.inv_freq[i % (hd / 2)];
                cos.push(half::f16::from_f32(a.cos()));
                sin.push(half::f16::from_f32(a.sin()));
            }
        }
        let q = positions.len();
        Ok((f16_tensor(cos, (1, q, hd))?, f16_tensor(sin, (1, q, hd))?))
    }

    /// One run of `q` rows: K/V written into the states (slice_update), attention over the whole
    /// state under the additive mask, logits of the last row (f32).
    pub fn run(&self, states: &mut [LayerState], spec: &RunSpec) -> Result<Vec<f32>> {
        let (nh, nkv, hd, ctx) = (self.n_heads, self.n_kv_heads, self.head_dim, spec.max_ctx);
        let q_rows = spec.positions.len();
        let has = |f: AneFault| spec.faults.contains(&f);
        let mut x = Tensor::from_slice(spec.embeddings, (q_rows, self.hidden), &CDevice::Cpu)?
            .to_dtype(DType::F16)?;
        let (cos, sin) = self.rope_tables(spec.positions)?;
        let mask = f16_tensor(spec.mask.to_vec(), (1, q_rows, ctx))?;
        let scale = 1.0 / (hd as f64).sqrt();
        let write_shift = usize::from(has(AneFault::WriteOffset));
        // ane-state-wrap=N: the state holds N slots; position p lands in slot p mod N and column
        // j of the attention reads slot j mod N
        let wrap = spec
            .faults
            .iter()
            .find_map(|f| match f {
                AneFault::StateWrap(n) => Some(*n),
                _ => None,
            })
            .unwrap_or(ctx);
        let nf = spec.norm_fp16;
        let mut race = spec.race_seed;
        for (layer, st) in self.layers.iter().zip(states.iter_mut()) {
            let h = norm(&x, &layer.attn_norm, self.eps, nf)?;
            let heads = |t: Tensor, n: usize| -> Result<Tensor> {
                Ok(t.reshape((q_rows, n, hd))?.transpose(0, 1)?.contiguous()?)
            };
            // QK-norm (Qwen3) on [heads, q, hd] rows: the norm's last axis is the head's features
            let head_norm = |x: Tensor, w: &Option<Tensor>| -> Result<Tensor> {
                match w {
                    Some(w) => rms_norm(&x, w, self.eps),
                    None => Ok(x),
                }
            };
            let q = head_norm(heads(layer.q.forward(&h)?, nh)?, &layer.q_norm)?;
            let k = head_norm(heads(layer.k.forward(&h)?, nkv)?, &layer.k_norm)?;
            let q = rope(&q, &cos, &sin)?;
            let k = rope(&k, &cos, &sin)?;
            let v = heads(layer.v.forward(&h)?, nkv)?;
            // slice_update: row i of head g goes to slot positions[i] (+1 under the fault; a
            // slot past the end is dropped, as an out-of-range update writes nothing)
            let mut kn: Vec<half::f16> = k.flatten_all()?.to_vec1()?;
            let mut vn: Vec<half::f16> = v.flatten_all()?.to_vec1()?;
            if let Some(seed) = race.as_mut() {
                race_bits(&mut kn, q_rows, hd, splitmix64(seed));
                race_bits(&mut vn, q_rows, hd, splitmix64(seed));
            }
            for g in 0..nkv {
                for (i, &p) in spec.positions.iter().enumerate() {
                    let slot = p + write_shift;
                    if slot >= ctx {
                        continue;
                    }
                    let src = (g * q_rows + i) * hd;
                    let dst = (g * ctx + slot % wrap) * hd;
                    st.k[dst..dst + hd].copy_from_slice(&kn[src..src + hd]);
                    st.v[dst..dst + hd].copy_from_slice(&vn[src..src + hd]);
                }
            }
            let read = |s: &[half::f16]| -> Result<Tensor> {
                let s = wrapped(s, nkv, ctx, hd, wrap);
                if has(AneFault::StateLayout) {
                    // the attention reads the bytes as [ctx, kv_heads, d]
                    Ok(f16_tensor(s.to_vec(), (ctx, nkv, hd))?
                        .transpose(0, 1)?
                        .contiguous()?)
                } else {
                    f16_tensor(s.to_vec(), (nkv, ctx, hd))
                }
            };
            // GQA: query head h reads KV head h / (nh / nkv) (HF repeat_kv)
            let expand = |t: Tensor| -> Result<Tensor> {
                let rep = nh / nkv;
                Ok(t.unsqueeze(1)?
                    .expand((nkv, rep, ctx, hd))?
                    .reshape((nh, ctx, hd))?)
            };
            let ks = expand(read(&st.k)?)?;
            let vs = expand(read(&st.v)?)?;
            let scores = if let Some(gain) = spec.scale_after_qk {
                // the unscaled product of q and k held at `gain` times this model's magnitude
                // (a larger model's activations): fp16 inf where it passes 65504
                let raw = (q * gain)?.matmul(&ks.t()?)?;
                (raw * (scale / gain))?
            } else {
                (q * scale)?.matmul(&ks.t()?)?
            };
            let s = scores.broadcast_add(&mask)?;
            let m = s.max_keepdim(D::Minus1)?;
            let e = s.broadcast_sub(&m)?.exp()?;
            let p = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
            let o = p
                .matmul(&vs)?
                .transpose(0, 1)?
                .contiguous()?
                .reshape((q_rows, nh * hd))?;
            x = (x + layer.o.forward(&o)?)?;
            let h2 = norm(&x, &layer.mlp_norm, self.eps, nf)?;
            let g = layer.gate.forward(&h2)?.silu()?;
            let u = layer.up.forward(&h2)?;
            x = (x + layer.down.forward(&(g * u)?)?)?;
        }
        let last = x.narrow(0, spec.real_rows.clamp(1, q_rows) - 1, 1)?;
        let y = self
            .lm_head
            .forward(&norm(&last, &self.final_norm, self.eps, nf)?)?;
        Ok(y.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?)
    }
}
