//! One layer's attention of [`super`]'s graph: each query head group multiplied by its KV head's
//! past and new keys where they lie, under the run's explicit mask.

use candle_core::DType;

use crate::arith::Rounder;
use crate::kv::LayerKv;
use crate::matmul::{self, Rhs};
use crate::Result;

thread_local! {
    /// The grouped keys and values of the last attention this thread ran, kept for the next:
    /// over an 8192-entry window they are megabytes per layer, and fresh ones per layer cost a
    /// page fault per 4 KiB (25 M minor faults in one emulated 8192-entry diagnose).
    static GROUPED: std::cell::RefCell<(Vec<f32>, Vec<f32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

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
    /// Blocked columns entering the softmax ([`crate::Blocked`]); `None` for the clean mask.
    pub(super) blocked: Option<crate::Blocked>,
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
        let (mut kg, mut vg) = GROUPED.with_borrow_mut(std::mem::take);
        kg.clear();
        vg.clear();
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
        let mut s = self.scores(&qg, &kg, g, per * t, rnd)?; // [G, per*T, C]
        rnd.round(&mut s, "scores");
        self.masked_softmax_rows(&mut s, |h, i| (row_of[h] * t + i) * c, rnd.fp16_sums());
        rnd.round(&mut s, "softmax");
        let og = matmul::batched(&s, &vg, Rhs::Plain, g, per * t, c, hd)?; // [G, per*T, hd]
        GROUPED.set((kg, vg));
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

    /// `q·kᵀ` of every group, `[G, m, C]` from q `[G, m, hd]` and keys `[G, C, hd]`: only the
    /// columns from the first one any row may attend to the last are multiplied (a long ring
    /// early in a prompt is mostly columns nothing attends), the others left 0, which the
    /// softmax gives them anyway. Each score is one dot product over `hd` in gemm's order
    /// whatever the column count (one k-block), as long as the narrowed product keeps gemm's
    /// general kernel: more than 16×16 outputs (`matmul::SPLIT_MIN_COLUMNS`), at least 2 rows and
    /// columns (else its gemv). Not under fp16 rounding: a device computes every column's score
    /// before masking, and an overflow there is what the rounder reports.
    pub(super) fn scores(
        &self,
        qg: &[f32],
        kg: &[f32],
        g: usize,
        m: usize,
        rnd: &Rounder,
    ) -> Result<Vec<f32>> {
        let (hd, c) = (self.hd, self.w + self.t);
        let (lo, hi) = self.attended_columns();
        let n = hi.saturating_sub(lo);
        if rnd.is_fp16() || n == c || m < 2 || n < 2 || m * n <= 16 * 16 {
            return matmul::batched(qg, kg, Rhs::Transposed, g, m, hd, c);
        }
        let mut s = vec![0f32; g * m * c];
        for b in 0..g {
            let part = matmul::batched(
                &qg[b * m * hd..(b + 1) * m * hd],
                &kg[(b * c + lo) * hd..(b * c + hi) * hd],
                Rhs::Transposed,
                1,
                m,
                hd,
                n,
            )?;
            for (r, row) in part.chunks_exact(n).enumerate() {
                s[(b * m + r) * c + lo..][..n].copy_from_slice(row);
            }
        }
        Ok(s)
    }

    /// The columns `lo..hi` from the first any row of any head may attend to the last.
    pub(super) fn attended_columns(&self) -> (usize, usize) {
        let c = self.w + self.t;
        let (mut lo, mut hi) = (c, 0);
        for row in self.mask.chunks_exact(c) {
            let (a, b) = span(row);
            if a < b {
                lo = lo.min(a);
                hi = hi.max(b);
            }
        }
        (lo.min(hi), hi)
    }

    /// Scores `[nh, T, C]` (C = W+T) → probabilities in place, mask `[T, nh, C]`.
    #[cfg(test)]
    pub(super) fn masked_softmax(&self, s: &mut [f32]) {
        let (t, c) = (self.t, self.w + self.t);
        self.masked_softmax_rows(s, |h, i| (h * t + i) * c, false);
    }

    /// Scores → probabilities in place; `row(h, i)` is where head h's score row of query i starts,
    /// mask `[T, nh, C]`.
    ///
    /// A softmax group whose mask allows nothing gets all-zero
    /// probabilities, so its attention output is zero and never NaN (design.md).
    ///
    /// `fp16_sums` (a declared fp16 arithmetic, `Fp16::fp16_sums`): `s − max` and each exp are
    /// fp16 values, the denominator accumulates them in fp16 in column order, and each
    /// probability is the fp16 quotient.
    fn masked_softmax_rows(
        &self,
        s: &mut [f32],
        row: impl Fn(usize, usize) -> usize,
        fp16_sums: bool,
    ) {
        if let Some(b) = self.blocked {
            return self.biased_softmax_rows(s, row, b, fp16_sums);
        }
        let (nh, t, c) = (self.nh, self.t, self.w + self.t);
        let midx = |h: usize, i: usize| (i * nh + h) * c;
        for i in 0..t {
            for heads in self.softmax_groups {
                // a ring window is mostly columns nothing attends (an emulated 8192-entry ring
                // early in a long prompt): each row's loops run over its allowed span only, in
                // the same order, so the sum adds the same terms in the same order
                let spans: Vec<(usize, usize)> = heads
                    .iter()
                    .map(|&h| span(&self.mask[midx(h, i)..][..c]))
                    .collect();
                let mut m = f32::NEG_INFINITY;
                for (&h, &(lo, hi)) in heads.iter().zip(&spans) {
                    let (sr, mr) = (row(h, i), midx(h, i));
                    m = m.max(masked_max(
                        &s[sr + lo..sr + hi],
                        &self.mask[mr + lo..mr + hi],
                        self.scale,
                    ));
                }
                let mut sum = 0f64;
                let mut sum16 = half::f16::ZERO;
                for (&h, &(lo, hi)) in heads.iter().zip(&spans) {
                    let (sr, mr) = (row(h, i), midx(h, i));
                    s[sr..sr + lo].fill(0.0);
                    s[sr + hi..sr + c].fill(0.0);
                    for j in lo..hi {
                        let k = sr + j;
                        s[k] = if !self.mask[mr + j] {
                            0.0
                        } else if fp16_sums {
                            let d = half::f16::from_f32(s[k] * self.scale - m).to_f32();
                            let e = half::f16::from_f32(d.exp());
                            sum16 = half::f16::from_f32(sum16.to_f32() + e.to_f32());
                            e.to_f32()
                        } else {
                            let e = (s[k] * self.scale - m).exp();
                            sum += e as f64;
                            e
                        };
                    }
                }
                if fp16_sums && sum16 > half::f16::ZERO {
                    let d = sum16.to_f32();
                    for &h in heads {
                        let sr = row(h, i);
                        for x in &mut s[sr..sr + c] {
                            *x = half::f16::from_f32(*x / d).to_f32();
                        }
                    }
                } else if sum > 0.0 {
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

impl AttnCtx<'_> {
    /// [`AttnCtx::masked_softmax_rows`] under a mask hypothesis: every column enters, a blocked
    /// one with `b.bias` added to its scaled score, and `b.empty` zero-key columns per head
    /// (score `b.bias`, value zero) add to the denominator only. Kept apart so that the clean
    /// mask's loops stay as they are.
    fn biased_softmax_rows(
        &self,
        s: &mut [f32],
        row: impl Fn(usize, usize) -> usize,
        b: crate::Blocked,
        fp16_sums: bool,
    ) {
        let (nh, t, c) = (self.nh, self.t, self.w + self.t);
        let midx = |h: usize, i: usize| (i * nh + h) * c;
        let score = |x: f32, allowed: bool| x * self.scale + if allowed { 0.0 } else { b.bias };
        for i in 0..t {
            for heads in self.softmax_groups {
                let mut m = if b.empty > 0 {
                    b.bias
                } else {
                    f32::NEG_INFINITY
                };
                for &h in heads {
                    let (sr, mr) = (row(h, i), midx(h, i));
                    for j in 0..c {
                        m = m.max(score(s[sr + j], self.mask[mr + j]));
                    }
                }
                let round = |x: f32| {
                    if fp16_sums {
                        half::f16::from_f32(x).to_f32()
                    } else {
                        x
                    }
                };
                let mut sum = 0f64;
                let mut sum16 = half::f16::ZERO;
                let mut add = |e: f32| {
                    if fp16_sums {
                        sum16 = half::f16::from_f32(sum16.to_f32() + e);
                    } else {
                        sum += e as f64;
                    }
                };
                for &h in heads {
                    let (sr, mr) = (row(h, i), midx(h, i));
                    for j in 0..c {
                        let e = round(round(score(s[sr + j], self.mask[mr + j]) - m).exp());
                        add(e);
                        s[sr + j] = e;
                    }
                    let e = round(round(b.bias - m).exp());
                    for _ in 0..b.empty {
                        add(e);
                    }
                }
                let d = if fp16_sums {
                    sum16.to_f32() as f64
                } else {
                    sum
                };
                if d > 0.0 {
                    for &h in heads {
                        let sr = row(h, i);
                        for x in &mut s[sr..sr + c] {
                            *x = round((*x as f64 / d) as f32);
                        }
                    }
                }
            }
        }
    }
}

/// The columns `lo..hi` from a row's first allowed column to its last (`0..0` when none is).
fn span(mask: &[bool]) -> (usize, usize) {
    match mask.iter().position(|&a| a) {
        Some(lo) => (lo, mask.iter().rposition(|&a| a).map_or(lo, |l| l + 1)),
        None => (0, 0),
    }
}

/// The largest `x * scale` over the allowed `x` of `s` (−∞ when none is). Eight running maxima
/// instead of one chain: the maximum of a set does not depend on the order it is taken in
/// (NaN is skipped by `f32::max` either way), and one chain waits on every compare.
fn masked_max(s: &[f32], mask: &[bool], scale: f32) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let (sc, mc) = (s.chunks_exact(8), mask.chunks_exact(8));
    let (sr, mr) = (sc.remainder(), mc.remainder());
    for (xs, ms) in sc.zip(mc) {
        for l in 0..8 {
            if ms[l] {
                lanes[l] = lanes[l].max(xs[l] * scale);
            }
        }
    }
    for (x, &a) in sr.iter().zip(mr) {
        if a {
            lanes[0] = lanes[0].max(x * scale);
        }
    }
    lanes.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x))
}
