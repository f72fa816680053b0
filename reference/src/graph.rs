//! The one forward engine: T new rows attending over W cached keys plus themselves under an explicit
//! per-head mask. `Model::forward`, `prefix_state`, `step` and `step_many` all go through here so the
//! KV path and the full path share the same math (design.md "reference crate API").

use candle_core::Tensor;

use crate::kv::LayerKv;

/// What one compiled-graph run computes: T new rows attending over W cached keys + themselves.
#[derive(Debug, Clone)]
pub struct GraphInput {
    /// `[T, hidden]` input embeddings (already dequantised). GPT-2: token embeddings only; the
    /// learned positions are added from `positions`.
    pub hidden: Tensor,
    pub positions: PositionInput,
    /// Per layer `[h, W, head_dim]`, h = n_kv_heads or n_heads (already expanded).
    pub past: Vec<LayerKv>,
    /// `[T, n_heads, W + T]` "may attend"; key columns are the W past keys then the T new ones.
    pub mask: Vec<bool>,
    pub graph: GraphOptions,
    /// Logits for the last row only (genai groups emit one position).
    pub last_only: bool,
}

#[derive(Debug, Clone)]
pub enum PositionInput {
    /// Absolute positions, one per row: RoPE from inv_freq (Llama) or learned positions (GPT-2).
    Ids(Vec<f32>),
    /// Ready cos/sin tables as the genai `pe_*` inputs: q `[T][n_heads][hd]`, k `[T][n_kv][hd]`,
    /// used as `x*cos + rotate_half(x)*sin`. Llama family only.
    Rope {
        q_cos: Vec<f32>,
        q_sin: Vec<f32>,
        k_cos: Vec<f32>,
        k_sin: Vec<f32>,
    },
}

/// Default = correct math; the emulator's graph faults set the other values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GraphOptions {
    /// Multiplier on 1/sqrt(head_dim).
    pub attn_scale: f32,
    /// One softmax over the concatenation of all heads' score rows of a query (Hailo SDK bug F11).
    pub shared_softmax: bool,
    /// KV head for query head q is `q % n_kv` (ABAB) instead of HF repeat_kv `q / n_rep` (AABB).
    pub gqa_block_order: bool,
}

impl Default for GraphOptions {
    fn default() -> Self {
        Self {
            attn_scale: 1.0,
            shared_softmax: false,
            gqa_block_order: false,
        }
    }
}

#[derive(Debug, Clone)]
pub struct GraphOutput {
    /// `[rows, vocab]` row-major.
    pub logits: Vec<f32>,
    pub rows: usize,
    /// Per layer, the new rows' K (after RoPE) and V, `[n_kv, T, hd]`.
    pub new_kv: Vec<LayerKv>,
}

use candle_core::{DType, Device};

use crate::llama::{apply_rope, rope_tables};
use crate::{Error, Family, Model, Result};

/// cos/sin tensors for q `[T, nh|1, hd]` and k `[T, nkv|1, hd]`.
struct RopeTensors {
    q_cos: Tensor,
    q_sin: Tensor,
    k_cos: Tensor,
    k_sin: Tensor,
}

impl Model {
    /// The graph entry the emulator uses; every other forward path is a wrapper over it.
    pub fn run_graph(&self, input: &GraphInput) -> Result<GraphOutput> {
        let cfg = &self.config;
        let (nh, nkv, hd) = (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim);
        let (t, hidden) = input.hidden.dims2().map_err(|_| {
            bad(format!(
                "hidden must be [T, {}], got {:?}",
                cfg.hidden_size,
                input.hidden.dims()
            ))
        })?;
        if t == 0 || hidden != cfg.hidden_size {
            return Err(bad(format!(
                "hidden must be [T>0, {}], got {:?}",
                cfg.hidden_size,
                input.hidden.dims()
            )));
        }
        let w = self.check_past(&input.past)?;
        let cols = w + t;
        if input.mask.len() != t * nh * cols {
            return Err(bad(format!(
                "mask has {} entries, expected T*n_heads*(W+T) = {t}*{nh}*{cols}",
                input.mask.len()
            )));
        }
        let mut x = input.hidden.to_dtype(DType::F32)?;
        let rope = match cfg.family {
            Family::Llama => Some(self.rope_tensors(&input.positions, t)?),
            Family::Gpt2 => {
                x = (x + self.learned_positions(&input.positions, t)?)?;
                None
            }
        };
        let kv_map: Vec<u32> = (0..nh)
            .map(|q| {
                if input.graph.gqa_block_order {
                    (q % nkv) as u32
                } else {
                    (q / cfg.n_rep()) as u32
                }
            })
            .collect();
        let kv_map = Tensor::from_vec(kv_map, nh, &Device::Cpu)?;
        let attn = AttnCtx {
            nh,
            hd,
            t,
            w,
            mask: &input.mask,
            kv_map: &kv_map,
            scale: input.graph.attn_scale / (hd as f32).sqrt(),
            shared: input.graph.shared_softmax,
        };

        let mut new_kv = Vec::with_capacity(self.blocks.len());
        for (li, blk) in self.blocks.iter().enumerate() {
            let h = blk.norm1.forward(&x)?;
            let (q, k, v) = blk.qkv(&h, nh * hd, nkv * hd)?;
            let mut q = q.contiguous()?.reshape((t, nh, hd))?;
            let mut k = k.contiguous()?.reshape((t, nkv, hd))?;
            let v = v.contiguous()?.reshape((t, nkv, hd))?;
            if let Some(r) = &rope {
                q = apply_rope(&q, &r.q_cos, &r.q_sin)?;
                k = apply_rope(&k, &r.k_cos, &r.k_sin)?;
            }
            let k_new = k.transpose(0, 1)?.contiguous()?;
            let v_new = v.transpose(0, 1)?.contiguous()?;
            let past = if w > 0 { input.past.get(li) } else { None };
            let o = attn.run(&q, &k_new, &v_new, past)?;
            x = (x + blk.o.forward(&o)?)?;
            let h2 = blk.norm2.forward(&x)?;
            x = (x + blk.mlp.forward(&h2)?)?;
            new_kv.push(LayerKv { k: k_new, v: v_new });
        }
        let x = if input.last_only {
            x.narrow(0, t - 1, 1)?
        } else {
            x
        };
        let x = self.final_norm.forward(&x)?;
        let logits = self.lm_head.forward(&x)?;
        let rows = logits.dim(0)?;
        Ok(GraphOutput {
            logits: logits.flatten_all()?.to_vec1::<f32>()?,
            rows,
            new_kv,
        })
    }

    /// Width W of the past (0 when empty); every layer must agree and have n_kv or n_heads heads.
    fn check_past(&self, past: &[LayerKv]) -> Result<usize> {
        let cfg = &self.config;
        if past.is_empty() {
            return Ok(0);
        }
        if past.len() != cfg.n_layers {
            return Err(bad(format!(
                "past has {} layers, the model {}",
                past.len(),
                cfg.n_layers
            )));
        }
        let w = past[0].k.dims().get(1).copied().unwrap_or(0);
        for (i, l) in past.iter().enumerate() {
            for (name, x) in [("k", &l.k), ("v", &l.v)] {
                let d = x.dims();
                let ok = d.len() == 3
                    && (d[0] == cfg.n_kv_heads || d[0] == cfg.n_heads)
                    && d[1] == w
                    && d[2] == cfg.head_dim;
                if !ok {
                    return Err(bad(format!(
                        "past layer {i} {name} has shape {d:?}, expected [{} or {}, {w}, {}]",
                        cfg.n_kv_heads, cfg.n_heads, cfg.head_dim
                    )));
                }
            }
        }
        Ok(w)
    }

    fn rope_tensors(&self, pos: &PositionInput, t: usize) -> Result<RopeTensors> {
        let (nh, nkv, hd) = (
            self.config.n_heads,
            self.config.n_kv_heads,
            self.config.head_dim,
        );
        let dev = &Device::Cpu;
        match pos {
            PositionInput::Ids(p) => {
                self.check_graph_positions(p, t)?;
                let inv = self
                    .inv_freq
                    .as_ref()
                    .ok_or_else(|| bad("model has no RoPE frequencies".into()))?;
                let (c, s) = rope_tables(p, inv);
                let c = Tensor::from_vec(c, (t, 1, hd), dev)?;
                let s = Tensor::from_vec(s, (t, 1, hd), dev)?;
                Ok(RopeTensors {
                    q_cos: c.clone(),
                    q_sin: s.clone(),
                    k_cos: c,
                    k_sin: s,
                })
            }
            PositionInput::Rope {
                q_cos,
                q_sin,
                k_cos,
                k_sin,
            } => {
                let (qn, kn) = (t * nh * hd, t * nkv * hd);
                if q_cos.len() != qn || q_sin.len() != qn || k_cos.len() != kn || k_sin.len() != kn
                {
                    return Err(bad(format!(
                        "RoPE tables must hold T*n_heads*hd = {qn} (q) and T*n_kv*hd = {kn} (k) values"
                    )));
                }
                let mk = |v: &Vec<f32>, h: usize| Tensor::from_vec(v.clone(), (t, h, hd), dev);
                Ok(RopeTensors {
                    q_cos: mk(q_cos, nh)?,
                    q_sin: mk(q_sin, nh)?,
                    k_cos: mk(k_cos, nkv)?,
                    k_sin: mk(k_sin, nkv)?,
                })
            }
        }
    }

    fn check_graph_positions(&self, p: &[f32], t: usize) -> Result<()> {
        if p.len() != t {
            return Err(bad(format!("{} positions for {t} rows", p.len())));
        }
        for &x in p {
            if !x.is_finite() || x < 0.0 {
                return Err(bad(format!("position {x} is not a non-negative number")));
            }
            if x as usize >= self.config.max_position {
                return Err(Error::TooLong {
                    path: self.source.clone(),
                    position: x as usize,
                    max: self.config.max_position,
                });
            }
        }
        Ok(())
    }

    /// GPT-2: wpe rows for integer positions (error beyond n_positions).
    fn learned_positions(&self, pos: &PositionInput, t: usize) -> Result<Tensor> {
        let PositionInput::Ids(p) = pos else {
            return Err(bad(
                "GPT-2 has learned positions: pass PositionInput::Ids, not RoPE tables".into(),
            ));
        };
        self.check_graph_positions(p, t)?;
        if p.iter().any(|x| x.fract() != 0.0) {
            return Err(bad("GPT-2 positions must be whole numbers".into()));
        }
        let wpe = self
            .wpe
            .as_ref()
            .ok_or_else(|| bad("model has no learned positions".into()))?;
        let idx: Vec<u32> = p.iter().map(|&x| x as u32).collect();
        Ok(wpe.index_select(&Tensor::from_vec(idx, t, &Device::Cpu)?, 0)?)
    }
}

fn bad(msg: String) -> Error {
    Error::InvalidInput(msg)
}

/// Everything one layer's attention needs besides its tensors.
struct AttnCtx<'a> {
    nh: usize,
    hd: usize,
    t: usize,
    w: usize,
    mask: &'a [bool],
    kv_map: &'a Tensor,
    scale: f32,
    shared: bool,
}

impl AttnCtx<'_> {
    /// q `[T, nh, hd]`, new k/v `[nkv, T, hd]`, past `[nkv|nh, W, hd]` → output `[T, nh*hd]`.
    fn run(
        &self,
        q: &Tensor,
        k_new: &Tensor,
        v_new: &Tensor,
        past: Option<&LayerKv>,
    ) -> Result<Tensor> {
        let (nh, t, hd) = (self.nh, self.t, self.hd);
        let k_new = self.expand(k_new)?;
        let v_new = self.expand(v_new)?;
        let (k, v) = match past {
            Some(p) => (
                Tensor::cat(&[&self.expand(&p.k)?, &k_new], 1)?,
                Tensor::cat(&[&self.expand(&p.v)?, &v_new], 1)?,
            ),
            None => (k_new, v_new),
        };
        let q = q.transpose(0, 1)?.contiguous()?; // [nh, T, hd]
        let scores = q.matmul(&k.t()?)?; // [nh, T, W+T]
        let mut s = scores.flatten_all()?.to_vec1::<f32>()?;
        self.masked_softmax(&mut s);
        let p = Tensor::from_vec(s, (nh, t, self.w + t), &Device::Cpu)?;
        let o = p.matmul(&v)?; // [nh, T, hd]
        Ok(o.transpose(0, 1)?.contiguous()?.reshape((t, nh * hd))?)
    }

    /// [nkv, n, hd] → [nh, n, hd] in the configured order; already-expanded inputs pass through.
    fn expand(&self, x: &Tensor) -> Result<Tensor> {
        if x.dim(0)? == self.nh {
            return Ok(x.clone());
        }
        Ok(x.index_select(self.kv_map, 0)?.contiguous()?)
    }

    /// Scores `[nh, T, C]` (C = W+T) → probabilities in place, mask `[T, nh, C]`.
    ///
    /// A row (per-head mode) or a query (shared mode) whose mask allows nothing gets all-zero
    /// probabilities, so its attention output is zero and never NaN (design.md).
    fn masked_softmax(&self, s: &mut [f32]) {
        let (nh, t, c) = (self.nh, self.t, self.w + self.t);
        let sidx = |h: usize, i: usize, j: usize| (h * t + i) * c + j;
        let midx = |h: usize, i: usize, j: usize| (i * nh + h) * c + j;
        // Groups of (head) rows normalised together: one head, or all heads of the query (F11).
        let groups: Vec<Vec<usize>> = if self.shared {
            vec![(0..nh).collect()]
        } else {
            (0..nh).map(|h| vec![h]).collect()
        };
        for i in 0..t {
            for heads in &groups {
                let mut m = f32::NEG_INFINITY;
                for &h in heads {
                    for j in 0..c {
                        if self.mask[midx(h, i, j)] {
                            m = m.max(s[sidx(h, i, j)] * self.scale);
                        }
                    }
                }
                let mut sum = 0f64;
                for &h in heads {
                    for j in 0..c {
                        let k = sidx(h, i, j);
                        s[k] = if self.mask[midx(h, i, j)] {
                            let e = (s[k] * self.scale - m).exp();
                            sum += e as f64;
                            e
                        } else {
                            0.0
                        };
                    }
                }
                if sum > 0.0 {
                    let inv = (1.0 / sum) as f32;
                    for &h in heads {
                        for j in 0..c {
                            s[sidx(h, i, j)] *= inv;
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx<'a>(
        nh: usize,
        t: usize,
        w: usize,
        mask: &'a [bool],
        map: &'a Tensor,
        shared: bool,
    ) -> AttnCtx<'a> {
        AttnCtx {
            nh,
            hd: 4,
            t,
            w,
            mask,
            kv_map: map,
            scale: 1.0,
            shared,
        }
    }

    #[test]
    fn softmax_by_hand() {
        let map = Tensor::new(&[0u32, 0], &Device::Cpu).unwrap();
        // One head, one row, scores [1, 0, 5], third key masked out.
        let mask = [true, true, false];
        let mut s = [1.0f32, 0.0, 5.0];
        ctx(1, 1, 2, &mask, &map, false).masked_softmax(&mut s);
        let e = std::f32::consts::E;
        assert!((s[0] - e / (e + 1.0)).abs() < 1e-6);
        assert!((s[1] - 1.0 / (e + 1.0)).abs() < 1e-6);
        assert_eq!(s[2], 0.0);
        // A single allowed key gets weight exactly 1.
        let mask = [false, true, false];
        let mut s = [3.0f32, -7.0, 2.0];
        ctx(1, 1, 2, &mask, &map, false).masked_softmax(&mut s);
        assert_eq!(s, [0.0, 1.0, 0.0]);
        // Nothing allowed: all zero, no NaN.
        let mask = [false; 3];
        let mut s = [3.0f32, -7.0, 2.0];
        ctx(1, 1, 2, &mask, &map, false).masked_softmax(&mut s);
        assert_eq!(s, [0.0, 0.0, 0.0]);
    }

    #[test]
    fn shared_softmax_splits_mass_over_heads() {
        let map = Tensor::new(&[0u32, 0], &Device::Cpu).unwrap();
        // Two heads, one row, two keys, equal scores: per head 1/2 each, shared 1/4 each.
        let mask = [true; 4];
        let mut per = [0.0f32; 4];
        ctx(2, 1, 1, &mask, &map, false).masked_softmax(&mut per);
        assert_eq!(per, [0.5; 4]);
        let mut sh = [0.0f32; 4];
        ctx(2, 1, 1, &mask, &map, true).masked_softmax(&mut sh);
        assert_eq!(sh, [0.25; 4]);
        // Head 1 scores higher: the joint distribution favours head 1's keys (mask layout
        // [T, nh, C], scores [nh, T, C]).
        let mut s = [0.0f32, 0.0, 1.0, 1.0];
        ctx(2, 1, 1, &mask, &map, true).masked_softmax(&mut s);
        let e = std::f32::consts::E;
        let z = 2.0 + 2.0 * e;
        assert!((s[0] - 1.0 / z).abs() < 1e-6 && (s[2] - e / z).abs() < 1e-6);
    }
}
