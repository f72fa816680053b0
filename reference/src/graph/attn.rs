//! One layer's attention of [`super`]'s graph: each query head group multiplied by its KV head's
//! past and new keys where they lie, under the run's explicit mask.

use candle_core::DType;

use crate::arith::Rounder;
use crate::kv::LayerKv;
use crate::matmul::{self, Rhs};
use crate::Result;

/// Everything one layer's attention needs besides its tensors.
pub(super) struct AttnCtx<'a> {
    pub(super) nh: usize,
    pub(super) hd: usize,
    pub(super) t: usize,
    pub(super) w: usize,
    pub(super) mask: &'a [bool],
    /// KV head of each query head ([`HeadWiring::kv_head`]).
    pub(super) kv_map: &'a [usize],
    pub(super) scale: f32,
    /// Query heads normalised together ([`HeadWiring::softmax_groups`]).
    pub(super) softmax_groups: &'a [Vec<usize>],
}

impl AttnCtx<'_> {
    /// q `[T, nh*hd]`, new k/v `[nkv, T, hd]`, past `[nkv|nh, W, hd]` → output `[T, nh*hd]`.
    ///
    /// Query heads reading the same (past head, new head) pair form one group; each group's rows
    /// are multiplied by that pair's keys once, so GQA keys are never expanded or concatenated
    /// per query head (the same products as `repeat_kv` + `cat`).
    pub(super) fn run(
        &self,
        q: &[f32],
        k_new: &[f32],
        v_new: &[f32],
        nkv: usize,
        past: Option<&LayerKv>,
        rnd: &Rounder,
    ) -> Result<Vec<f32>> {
        let Some(p) = past else {
            return self.run_on(q, k_new, v_new, nkv, (&[], &[], self.nh), rnd);
        };
        let hp = p.k.dim(0)?;
        // the cached keys and values read where they are (a decode step copied the whole cache
        // of every layer here); a non-contiguous or non-f32 past is copied once
        let direct = matmul::with_slice(&p.k, |pk| {
            matmul::with_slice(&p.v, |pv| {
                self.run_on(q, k_new, v_new, nkv, (pk, pv, hp), rnd)
            })
        });
        match direct {
            Some(Some(o)) => o,
            _ => {
                let pk = p.k.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
                let pv = p.v.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
                self.run_on(q, k_new, v_new, nkv, (&pk, &pv, hp), rnd)
            }
        }
    }

    /// `run` on the past's keys and values `[hp, W, hd]` as slices, `hp` their head count.
    fn run_on(
        &self,
        q: &[f32],
        k_new: &[f32],
        v_new: &[f32],
        nkv: usize,
        (pk, pv, hp): (&[f32], &[f32], usize),
        rnd: &Rounder,
    ) -> Result<Vec<f32>> {
        let (nh, t, hd, w) = (self.nh, self.t, self.hd, self.w);
        let c = w + t;
        // an already-expanded input (nh heads) passes through; otherwise heads go through kv_map
        let src = |heads: usize, h: usize| if heads == nh { h } else { self.kv_map[h] };
        let mut groups: Vec<((usize, usize), Vec<usize>)> = Vec::new();
        for h in 0..nh {
            let key = (src(hp, h), src(nkv, h));
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, hs)) => hs.push(h),
                None => groups.push((key, vec![h])),
            }
        }
        let per = groups[0].1.len();
        if groups.iter().any(|(_, hs)| hs.len() != per) {
            // uneven sharing cannot be one batched product: one group per query head
            groups = (0..nh)
                .map(|h| ((src(hp, h), src(nkv, h)), vec![h]))
                .collect();
        }
        let (g, per) = (groups.len(), groups[0].1.len());
        let mut kg = Vec::with_capacity(g * c * hd);
        let mut vg = Vec::with_capacity(g * c * hd);
        let mut qg = Vec::with_capacity(g * per * t * hd);
        for ((ph, nw), hs) in &groups {
            kg.extend_from_slice(&pk[ph * w * hd..(ph + 1) * w * hd]);
            kg.extend_from_slice(&k_new[nw * t * hd..(nw + 1) * t * hd]);
            vg.extend_from_slice(&pv[ph * w * hd..(ph + 1) * w * hd]);
            vg.extend_from_slice(&v_new[nw * t * hd..(nw + 1) * t * hd]);
            for &h in hs {
                for i in 0..t {
                    qg.extend_from_slice(&q[(i * nh + h) * hd..(i * nh + h + 1) * hd]);
                }
            }
        }
        // row of (head, query) in the grouped score layout [G][per*T][C]
        let mut row_of = vec![0usize; nh];
        for (gi, (_, hs)) in groups.iter().enumerate() {
            for (a, &h) in hs.iter().enumerate() {
                row_of[h] = gi * per + a;
            }
        }
        let mut s = matmul::batched(&qg, &kg, Rhs::Transposed, g, per * t, hd, c)?; // [G, per*T, C]
        rnd.round(&mut s, "scores");
        self.masked_softmax_rows(&mut s, |h, i| (row_of[h] * t + i) * c);
        rnd.round(&mut s, "softmax");
        let og = matmul::batched(&s, &vg, Rhs::Plain, g, per * t, c, hd)?; // [G, per*T, hd]
        let mut o = vec![0f32; t * nh * hd];
        for (h, &r) in row_of.iter().enumerate() {
            for i in 0..t {
                let src = (r * t + i) * hd;
                let dst = (i * nh + h) * hd;
                o[dst..dst + hd].copy_from_slice(&og[src..src + hd]);
            }
        }
        Ok(o)
    }

    /// Scores `[nh, T, C]` (C = W+T) → probabilities in place, mask `[T, nh, C]`.
    #[cfg(test)]
    pub(super) fn masked_softmax(&self, s: &mut [f32]) {
        let (t, c) = (self.t, self.w + self.t);
        self.masked_softmax_rows(s, |h, i| (h * t + i) * c);
    }

    /// Scores → probabilities in place; `row(h, i)` is where head h's score row of query i starts,
    /// mask `[T, nh, C]`.
    ///
    /// A softmax group whose mask allows nothing gets all-zero
    /// probabilities, so its attention output is zero and never NaN (design.md).
    fn masked_softmax_rows(&self, s: &mut [f32], row: impl Fn(usize, usize) -> usize) {
        let (nh, t, c) = (self.nh, self.t, self.w + self.t);
        let midx = |h: usize, i: usize| (i * nh + h) * c;
        for i in 0..t {
            for heads in self.softmax_groups {
                let mut m = f32::NEG_INFINITY;
                for &h in heads {
                    let (sr, mr) = (row(h, i), midx(h, i));
                    for j in 0..c {
                        if self.mask[mr + j] {
                            m = m.max(s[sr + j] * self.scale);
                        }
                    }
                }
                let mut sum = 0f64;
                for &h in heads {
                    let (sr, mr) = (row(h, i), midx(h, i));
                    for j in 0..c {
                        let k = sr + j;
                        s[k] = if self.mask[mr + j] {
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
                        let sr = row(h, i);
                        for x in &mut s[sr..sr + c] {
                            *x *= inv;
                        }
                    }
                }
            }
        }
    }
}
