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

/// Default = the clean model's math. The seam a device graph plugs its variants into: the score
/// scale (a probe's scale fit also varies it to explain a failure) and the [`HeadWiring`].
#[derive(Debug, Clone, Copy)]
pub struct GraphOptions {
    /// Multiplier on 1/sqrt(head_dim).
    pub attn_scale: f32,
    pub heads: HeadWiring,
    /// float32, or fp16 as a device declares it (arith.rs: which op outputs are rounded).
    pub arithmetic: Arithmetic,
    /// What a blocked column's score gets instead of −inf (`None`: the clean mask, blocked
    /// columns excluded). A mask hypothesis of the diagnosis (`probes/src/selfonly_fit.rs`).
    pub blocked: Option<Blocked>,
}

/// A mask not applied as 0 / −inf: every column the mask blocks enters the softmax with its
/// scaled score plus `bias` (0: the mask not applied at all; +1: a 0 / +1 convention), and
/// `empty` more columns per row that the mask covers but no entry fills (a state's
/// never-written slots: key and value zero, so score `bias` and nothing added to the output).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Blocked {
    pub bias: f32,
    pub empty: usize,
}

impl Default for GraphOptions {
    fn default() -> Self {
        Self {
            attn_scale: 1.0,
            heads: HeadWiring::CLEAN,
            arithmetic: Arithmetic::F32,
            blocked: None,
        }
    }
}

/// How query heads meet KV heads and softmax rows: the reference holds only the clean wiring; a
/// device family's emulator supplies others for its compile bugs.
#[derive(Debug, Clone, Copy)]
pub struct HeadWiring {
    /// `kv_head(q, n_kv, n_rep)`: the KV head query head `q` reads.
    pub kv_head: fn(usize, usize, usize) -> usize,
    /// `softmax_groups(n_heads)`: query heads whose score rows one softmax normalises together.
    pub softmax_groups: fn(usize) -> Vec<Vec<usize>>,
}

impl HeadWiring {
    /// HF `repeat_kv` (query head q reads KV head `q / n_rep`) and one softmax per head.
    pub const CLEAN: HeadWiring = HeadWiring {
        kv_head: repeat_kv_head,
        softmax_groups: softmax_per_head,
    };
}

fn repeat_kv_head(q: usize, _n_kv: usize, n_rep: usize) -> usize {
    q / n_rep
}

fn softmax_per_head(n_heads: usize) -> Vec<Vec<usize>> {
    (0..n_heads).map(|h| vec![h]).collect()
}

impl PositionInput {
    /// Its kind (0: ids, 1: RoPE tables) and its value lists in order: what a memory of runs
    /// keys a run's positions by.
    pub fn lists(&self) -> (u8, [&[f32]; 4]) {
        match self {
            PositionInput::Ids(p) => (0, [p, &[], &[], &[]]),
            PositionInput::Rope {
                q_cos,
                q_sin,
                k_cos,
                k_sin,
            } => (1, [q_cos, q_sin, k_cos, k_sin]),
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
    /// Under fp16, the first op output that left the declared range.
    pub overflow: Option<OverflowAt>,
}

use candle_core::{DType, Device};

use crate::arith::{Arithmetic, OverflowAt, Rounder};
use crate::llama::rope_tables;
use crate::{Error, Family, Model, Result};

/// cos/sin tables `[T][heads][hd]`, `heads` = 1 when every head shares a row (position ids).
struct RopeTable {
    cos: Vec<f32>,
    sin: Vec<f32>,
    heads: usize,
}

impl RopeTable {
    /// `x*cos + rotate_half(x)*sin` in place on `[T, nx, hd]` rows (rotate_half(x) = [-x2, x1]);
    /// the same f32 products and sum as the tensor form, so the same bits.
    /// Under a QDQ graph's grids (`g`: [`crate::qdq::RopeGrids`]) each product and the rotated
    /// half are fake-quantised as the graph quantises them.
    fn apply(&self, x: &mut [f32], nx: usize, hd: usize, g: Option<&crate::qdq::RopeGrids>) {
        use crate::qdq::fake_all;
        let half = hd / 2;
        let mut tmp = vec![0f32; hd];
        for (r, xr) in x.chunks_exact_mut(hd).enumerate() {
            let (i, h) = (r / nx, r % nx);
            let o = if self.heads == 1 { i } else { i * nx + h } * hd;
            let (c, s) = (&self.cos[o..o + hd], &self.sin[o..o + hd]);
            tmp.copy_from_slice(xr);
            for j in 0..hd {
                let rot = if j < half {
                    -tmp[j + half]
                } else {
                    tmp[j - half]
                };
                xr[j] = match g {
                    None => tmp[j] * c[j] + rot * s[j],
                    Some([x_cos, neg, rotated, x_sin]) => {
                        let rot = if j < half { fake_all(neg, rot) } else { rot };
                        let rot = fake_all(rotated, rot);
                        fake_all(x_cos, tmp[j] * c[j]) + fake_all(x_sin, rot * s[j])
                    }
                };
            }
        }
    }
}

/// `[T, heads, hd]` rows → `[heads, T, hd]`.
fn rows_to_heads(x: &[f32], t: usize, heads: usize, hd: usize) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    for i in 0..t {
        for h in 0..heads {
            let src = (i * heads + h) * hd;
            let dst = (h * t + i) * hd;
            out[dst..dst + hd].copy_from_slice(&x[src..src + hd]);
        }
    }
    out
}

fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += *b;
    }
}

/// The residual add of a block's output `y` (op `op`, rounded first), itself rounded. Returns
/// the sum before its rounding when the next norm reads that (a fused skip-norm computing in
/// float32, [`Rounder::skip_sum_f32`]).
fn add_rounded(
    x: &mut [f32],
    mut y: Vec<f32>,
    op: &'static str,
    rnd: &Rounder,
) -> Option<Vec<f32>> {
    rnd.round(&mut y, op);
    add_in_place(x, &y);
    let sum = rnd.skip_sum_f32().then(|| x.to_vec());
    rnd.round(x, "residual add");
    sum
}

impl Model {
    /// The graph entry the emulator uses; every other forward path is a wrapper over it.
    ///
    /// The residual stream lives in a plain `Vec` between the weight products: norms, RoPE, the
    /// residual adds and the SwiGLU product are simple loops, and attention multiplies each query
    /// group by its KV head's keys directly (no expanded or concatenated key copies).
    pub fn run_graph(&self, input: &GraphInput) -> Result<GraphOutput> {
        Ok(self.run_graph_resumed(input, None, false)?.0)
    }

    /// [`Model::run_graph`] started at layer `from.layer` from the streams of an earlier run whose
    /// input equals `input` up to that layer (see [`Resume`]), and with this run's own streams
    /// when `keep` (what a later run resumes from). Both only for a plain float32 run
    /// ([`Model::resumable`]): an error otherwise.
    pub fn run_graph_resumed(
        &self,
        input: &GraphInput,
        from: Option<Resume<'_>>,
        keep: bool,
    ) -> Result<(GraphOutput, Option<Streams>)> {
        let cfg = &self.config;
        let (nh, nkv, hd) = (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim);
        let (t, w) = self.check_input(input)?;
        if (from.is_some() || keep) && !self.resumable(input) {
            return Err(bad(
                "only a plain float32 graph run resumes or keeps its streams".into(),
            ));
        }
        let hidden = cfg.hidden_size;
        let mut x: Vec<f32> = input
            .hidden
            .to_dtype(DType::F32)?
            .flatten_all()?
            .to_vec1()?;
        let rnd = Rounder::new(input.graph.arithmetic).with_grids(self.qdq.clone(), t);
        rnd.round(&mut x, "embeddings");
        let rope = match cfg.family {
            Family::Llama => {
                let (mut qr, mut kr) = self.rope_tables_for(&input.positions, t)?;
                let tables = [&mut qr.cos, &mut qr.sin, &mut kr.cos, &mut kr.sin];
                for (tab, name) in tables.into_iter().zip(["cos", "sin", "cos", "sin"]) {
                    rnd.rope_tables(tab, name);
                }
                Some((qr, kr))
            }
            Family::Gpt2 => {
                let wpe = self.learned_positions(&input.positions, t)?;
                add_in_place(&mut x, &wpe);
                None
            }
        };
        let kv_map: Vec<usize> = (0..nh)
            .map(|q| (input.graph.heads.kv_head)(q, nkv, cfg.n_rep()))
            .collect();
        let softmax_groups = (input.graph.heads.softmax_groups)(nh);
        let layer = LayerCtx {
            attn: AttnCtx {
                nh,
                hd,
                t,
                w,
                mask: &input.mask,
                kv_map: &kv_map,
                scale: input.graph.attn_scale / (hd as f32).sqrt(),
                softmax_groups: &softmax_groups,
                blocked: input.graph.blocked,
            },
            rope: rope.as_ref(),
            rnd: &rnd,
            past: if w > 0 { &input.past } else { &[] },
        };
        // what the next norm reads when it is not the rounded residual stream x
        let mut stream = Stream { x, norm_in: None };
        let mut new_kv = Vec::with_capacity(self.blocks.len());
        let mut kept = keep.then(|| Streams(Vec::with_capacity(self.blocks.len())));
        let start = match &from {
            Some(r) => r.start(&mut stream, &mut new_kv, kept.as_mut(), self.blocks.len())?,
            None => 0,
        };
        for (li, blk) in self.blocks.iter().enumerate().skip(start) {
            if let Some(k) = kept.as_mut() {
                k.0.push(stream.clone());
            }
            new_kv.push(self.layer(&layer, li, blk, &mut stream)?);
        }
        let x = stream.norm_in.as_deref().unwrap_or(&stream.x);
        let (x, rows) = if input.last_only {
            (&x[(t - 1) * hidden..], 1)
        } else {
            (x, t)
        };
        rnd.at_layer(None);
        let x = self.final_norm.forward_rows_in("norm", x, hidden, &rnd)?;
        let mut logits = self.lm_head.forward_rows(&x, rows)?;
        rnd.round(&mut logits, "logits");
        let out = GraphOutput {
            logits,
            rows,
            new_kv,
            overflow: rnd.first_overflow(),
        };
        Ok((out, kept))
    }

    /// Whether a graph run of `input` may resume or keep its streams: plain float32 (no fp16
    /// rounding, no QDQ grids), where the rounder is the identity and records nothing (no
    /// overflow) that a layer skipped on resuming would have recorded.
    pub fn resumable(&self, input: &GraphInput) -> bool {
        self.qdq.is_none() && matches!(input.graph.arithmetic, Arithmetic::F32)
    }

    /// One decoder layer `li` of a graph run on the residual stream `s`: its new rows' K and V.
    fn layer(
        &self,
        c: &LayerCtx<'_>,
        li: usize,
        blk: &crate::blocks::Block,
        s: &mut Stream,
    ) -> Result<LayerKv> {
        let cfg = &self.config;
        let (nh, nkv, hd, t) = (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, c.attn.t);
        let (hidden, rnd) = (cfg.hidden_size, c.rnd);
        rnd.at_layer(Some(li));
        let h = blk.norm1.forward_rows_in(
            "input_layernorm",
            s.norm_in.as_deref().unwrap_or(&s.x),
            hidden,
            rnd,
        )?;
        let (mut q, mut k, mut v) = blk.qkv_rows(&h, t, nh * hd, nkv * hd)?;
        for (y, op) in [(&mut q, "q_proj"), (&mut k, "k_proj"), (&mut v, "v_proj")] {
            rnd.round(y, op);
        }
        blk.qk_norm_rows(&mut q, &mut k, hd)?;
        if let Some((qr, kr)) = c.rope {
            qr.apply(&mut q, nh, hd, rnd.rope_grids("rope q").as_ref());
            kr.apply(&mut k, nkv, hd, rnd.rope_grids("rope k").as_ref());
            rnd.round(&mut q, "rope q");
            rnd.round(&mut k, "rope k");
        }
        let mut k_new = rows_to_heads(&k, t, nkv, hd);
        let mut v_new = rows_to_heads(&v, t, nkv, hd);
        let mut o = c.attn.run(&q, &k_new, &v_new, nkv, c.past.get(li), rnd)?;
        rnd.round(&mut o, "attention output");
        s.norm_in = add_rounded(&mut s.x, blk.o.forward_rows(&o, t)?, "o_proj", rnd);
        let h2 = blk.norm2.forward_rows_in(
            "post_attention_layernorm",
            s.norm_in.as_deref().unwrap_or(&s.x),
            hidden,
            rnd,
        )?;
        s.norm_in = add_rounded(
            &mut s.x,
            blk.mlp.forward_rows_in(&h2, t, rnd)?,
            "down_proj",
            rnd,
        );
        // the present outputs as the graph writes them (this run read k/v as above)
        rnd.round(&mut k_new, "present k");
        rnd.round(&mut v_new, "present v");
        Ok(LayerKv {
            k: Tensor::from_vec(k_new, (nkv, t, hd), &Device::Cpu)?,
            v: Tensor::from_vec(v_new, (nkv, t, hd), &Device::Cpu)?,
        })
    }

    /// The rows T of `input` and the width W of its past, after checking the hidden rows are
    /// `[T > 0, hidden_size]` and the mask covers `T · n_heads · (W + T)` entries.
    fn check_input(&self, input: &GraphInput) -> Result<(usize, usize)> {
        let cfg = &self.config;
        let shape = || {
            bad(format!(
                "hidden must be [T>0, {}], got {:?}",
                cfg.hidden_size,
                input.hidden.dims()
            ))
        };
        let (t, hidden) = input.hidden.dims2().map_err(|_| shape())?;
        if t == 0 || hidden != cfg.hidden_size {
            return Err(shape());
        }
        let w = self.check_past(&input.past)?;
        let (nh, cols) = (cfg.n_heads, w + t);
        if input.mask.len() != t * nh * cols {
            return Err(bad(format!(
                "mask has {} entries, expected T*n_heads*(W+T) = {t}*{nh}*{cols}",
                input.mask.len()
            )));
        }
        Ok((t, w))
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

    /// (q, k) RoPE tables.
    fn rope_tables_for(&self, pos: &PositionInput, t: usize) -> Result<(RopeTable, RopeTable)> {
        let (nh, nkv, hd) = (
            self.config.n_heads,
            self.config.n_kv_heads,
            self.config.head_dim,
        );
        match pos {
            PositionInput::Ids(p) => {
                self.check_graph_positions(p, t)?;
                let (c, s) = match &self.stored_rope {
                    Some(r) => r.tables(p).ok_or_else(|| {
                        bad(format!(
                            "a position past the {} rows of the device's RoPE tables",
                            r.cos.len() / r.half
                        ))
                    })?,
                    None => rope_tables(
                        p,
                        self.inv_freq
                            .as_ref()
                            .ok_or_else(|| bad("model has no RoPE frequencies".into()))?,
                    ),
                };
                Ok((
                    RopeTable {
                        cos: c.clone(),
                        sin: s.clone(),
                        heads: 1,
                    },
                    RopeTable {
                        cos: c,
                        sin: s,
                        heads: 1,
                    },
                ))
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
                Ok((
                    RopeTable {
                        cos: q_cos.clone(),
                        sin: q_sin.clone(),
                        heads: nh,
                    },
                    RopeTable {
                        cos: k_cos.clone(),
                        sin: k_sin.clone(),
                        heads: nkv,
                    },
                ))
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

    /// GPT-2: wpe rows `[T, hidden]` for integer positions (error beyond n_positions).
    fn learned_positions(&self, pos: &PositionInput, t: usize) -> Result<Vec<f32>> {
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
        Ok(wpe
            .index_select(&Tensor::from_vec(idx, t, &Device::Cpu)?, 0)?
            .flatten_all()?
            .to_vec1()?)
    }
}

fn bad(msg: String) -> Error {
    Error::InvalidInput(msg)
}

mod attn;
mod resume;
use attn::AttnCtx;
use resume::LayerCtx;
pub use resume::{Resume, Stream, Streams};

#[cfg(test)]
mod tests;
