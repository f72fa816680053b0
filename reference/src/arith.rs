//! The arithmetic a graph run computes in: float32 (the clean model) or fp16 as a device declares
//! it (issue 36: HTP's fp16; issue 35: a builder's fp16 export on ONNX Runtime's CPU).
//!
//! fp16 here means what these runtimes do, not fp16 everywhere: every op *output* is rounded to
//! fp16 (round to nearest even), while the sums inside an op (a product's dot products, a
//! norm's mean, softmax's sum) accumulate in float32 — ONNX Runtime's CPU fp16 kernels convert
//! to float32, compute and convert back (MLAS has no fp16 GEMM on x86), and HTP's fp16 MatMul
//! accumulates wider than its output. Which outputs are rounded is listed at [`Rounder`]'s
//! call sites in `graph.rs`: the input embeddings, each norm's intermediate outputs (per
//! [`NormStatistic`]), q/k/v after the projection and after RoPE, the raw scores, the softmax
//! probabilities, the attention output, every projection output, SiLU and the gate product,
//! every residual add, the final norm and the logits. The weights are rounded by the caller
//! (the model it runs with), not here.
//!
//! What happens to a value beyond fp16's largest finite 65504 is a declared parameter
//! ([`Overflow`]); the first op that loses a value that way is recorded ([`OverflowAt`]).
//!
//! A runtime that keeps only some values in fp16 declares which ([`Fp16::sites`], named by
//! [`SITES`]): ONNX Runtime's CPU EP runs an fp16 graph mostly in float32 and rounds only where an
//! fp16 kernel or a graph output sits (issue 35; npu/src/onnx/ort_cpu_fp16.rs derives the sites
//! from the graph). Two more of its kernels' habits are declared with them: a fused
//! skip-norm that normalises the float32 sum of its inputs ([`Fp16::skip_sum_f32`]), and fp16
//! RoPE tables ([`Fp16::rope_tables_fp16`]).

use std::cell::Cell;
use std::sync::Arc;

use half::f16;

use crate::qdq::QdqGrids;

/// The largest finite fp16.
pub const FP16_MAX: f32 = 65504.0;

/// The arithmetic of a graph run.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Arithmetic {
    #[default]
    F32,
    Fp16(Fp16),
}

/// fp16 as a device computes it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fp16 {
    pub overflow: Overflow,
    pub norm: NormStatistic,
    /// The op outputs held in fp16; None = every op output (HTP).
    pub sites: Option<Sites>,
    /// Each norm after a residual add reads the float32 sum, while the sum carried on is
    /// rounded (ONNX Runtime's fp16 SkipSimplifiedLayerNormalization kernel).
    pub skip_sum_f32: bool,
    /// The RoPE cos/sin tables are fp16 values (the graph's fp16 cos/sin caches).
    pub rope_tables_fp16: bool,
    /// The sums inside a norm's mean and softmax's denominator accumulate in fp16, one term at a
    /// time in index order (the ANE emulator's fp16 reductions); matrix products still
    /// accumulate wider. Small terms after a large one are lost: a row with a massive
    /// activation gets a smaller mean of squares than its exact one.
    pub fp16_sums: bool,
}

impl Fp16 {
    /// Every op output rounded (the declaration of sessions 20-22: HTP).
    pub fn every_op(overflow: Overflow, norm: NormStatistic) -> Fp16 {
        Fp16 {
            overflow,
            norm,
            sites: None,
            skip_sum_f32: false,
            rope_tables_fp16: false,
            fp16_sums: false,
        }
    }
}

/// The reference's rounding sites, as [`Rounder::round`]'s callers name them (a norm's output is
/// `norm output`; the norm's inner ops are rounded only when every op output is).
pub const SITES: [&str; 20] = [
    "embeddings",
    "norm output",
    "q_proj",
    "k_proj",
    "v_proj",
    "rope q",
    "rope k",
    "scores",
    "softmax",
    "attention output",
    "o_proj",
    "residual add",
    "gate_proj",
    "up_proj",
    "silu",
    "silu·up",
    "down_proj",
    "logits",
    "present k",
    "present v",
];

/// A set of [`SITES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sites(u32);

impl Sites {
    /// The set of `names`; a name that is no site is returned as the error.
    pub fn of<S: AsRef<str>>(names: &[S]) -> Result<Sites, String> {
        let mut bits = 0u32;
        for n in names {
            let i = SITES
                .iter()
                .position(|s| *s == n.as_ref())
                .ok_or_else(|| n.as_ref().to_string())?;
            bits |= 1 << i;
        }
        Ok(Sites(bits))
    }

    pub fn holds(&self, site: &str) -> bool {
        SITES
            .iter()
            .position(|s| *s == site)
            .is_some_and(|i| self.0 & (1 << i) != 0)
    }
}

/// What an op's output beyond fp16's range becomes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Overflow {
    /// IEEE: rounds to ±inf (ONNX Runtime's CPU casts).
    Infinite,
    /// Clamped to ±`limit`; values up to `limit` keep fp16's 11 significant bits (HTP: 131008,
    /// twice fp16's max, measured by scripts/htp-bisect.py; docs/qnn.md).
    Saturate(f32),
}

/// How the graph computes RMSNorm's statistic, which decides where fp16 can overflow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormStatistic {
    /// mean(x·x) from the squares of x themselves (the textbook graph).
    Squares,
    /// The squares of x / √m, m = the row's max |x| (scripts/export-onnx.py's default).
    MaxScaled,
    /// One fused op computing the statistic in float32 (`SimplifiedLayerNormalization`): only
    /// its output is rounded.
    Fused,
    /// y = x / m, m = the row's max |x| (at least 1e-4), then y / sqrt(mean(y·y) + eps / m²):
    /// the form ANE ports use (npu/src/coreml/graph.rs), op by op as that graph computes it.
    MaxDivided,
}

/// The first op whose output left the declared fp16 range.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OverflowAt {
    /// The block, or None for the final norm / logits / input.
    pub layer: Option<usize>,
    /// The norm the op belongs to (`input_layernorm`, `post_attention_layernorm`, `norm`).
    pub within: Option<&'static str>,
    pub op: &'static str,
    /// The exact (float32) value that did not fit.
    pub value: f32,
}

/// Rounds op outputs as the arithmetic says and remembers the first overflow.
pub(crate) struct Rounder {
    fp16: Option<Fp16>,
    /// A QDQ graph's activation grids (the model's, qdq.rs) and this run's row count: a site
    /// with a grid is fake-quantised there instead of rounded.
    grids: Option<(Arc<QdqGrids>, usize)>,
    /// The op rounded last: a residual add's grid is the one after `o_proj` or `down_proj`.
    last: Cell<&'static str>,
    layer: Cell<Option<usize>>,
    within: Cell<Option<&'static str>>,
    first: Cell<Option<OverflowAt>>,
}

impl Rounder {
    pub fn new(a: Arithmetic) -> Rounder {
        Rounder {
            fp16: match a {
                Arithmetic::F32 => None,
                Arithmetic::Fp16(f) => Some(f),
            },
            grids: None,
            last: Cell::new(""),
            layer: Cell::new(None),
            within: Cell::new(None),
            first: Cell::new(None),
        }
    }

    pub fn is_fp16(&self) -> bool {
        self.fp16.is_some()
    }

    /// This rounder with a QDQ model's grids for a run of `rows` rows.
    pub fn with_grids(mut self, grids: Option<Arc<QdqGrids>>, rows: usize) -> Rounder {
        self.grids = grids.map(|g| (g, rows));
        self
    }

    /// Whether the sites inside an op (the MLP's gate, SiLU and product) are rounded or
    /// quantised apart.
    pub fn per_site(&self) -> bool {
        self.fp16.is_some() || self.grids.is_some()
    }

    /// The grids inside RoPE `site` (`rope q` / `rope k`) at the current layer, when the graph
    /// quantises all four.
    pub fn rope_grids(&self, site: &str) -> Option<crate::qdq::RopeGrids> {
        let (g, rows) = self.grids.as_ref()?;
        let grids = g.for_rows(*rows);
        let get = |op: &str| {
            grids
                .get(&(self.layer.get(), format!("{site} {op}")))
                .cloned()
        };
        Some([get("x·cos")?, get("−x₂")?, get("rotated")?, get("x·sin")?])
    }

    /// Whether the grids hold norm `name`'s inner ops at the current layer.
    fn norm_on_grids(&self, name: &str) -> bool {
        self.grids.as_ref().is_some_and(|(g, rows)| {
            g.for_rows(*rows)
                .contains_key(&(self.layer.get(), format!("{name} x/√m")))
        })
    }

    /// `xs` on its site's QDQ grids; false when no grids are declared.
    fn quantise(&self, xs: &mut [f32], op: &'static str) -> bool {
        let Some((g, rows)) = &self.grids else {
            return false;
        };
        let site = match (self.within.get(), op) {
            (Some(norm), "output") => norm.to_string(),
            (Some(norm), _) => format!("{norm} {op}"),
            (None, "residual add") => format!("residual add after {}", self.last.get()),
            _ => op.to_string(),
        };
        if let Some(grids) = g.for_rows(*rows).get(&(self.layer.get(), site)) {
            crate::qdq::apply(grids, xs);
        }
        true
    }

    pub fn at_layer(&self, layer: Option<usize>) {
        self.layer.set(layer);
    }

    pub fn first_overflow(&self) -> Option<OverflowAt> {
        self.first.get()
    }

    /// Whether the declared arithmetic keeps a norm's statistic in float32 while the sum it
    /// reads is rounded (see [`Fp16::skip_sum_f32`]).
    pub fn skip_sum_f32(&self) -> bool {
        self.fp16.is_some_and(|f| f.skip_sum_f32)
    }

    /// Whether softmax's denominator accumulates in fp16 (see [`Fp16::fp16_sums`]).
    pub fn fp16_sums(&self) -> bool {
        self.fp16.is_some_and(|f| f.fp16_sums)
    }

    /// The mean of the op output `xs` (already rounded) as the declared arithmetic sums it:
    /// in fp16 term by term then times 1/n in fp16 (candle's f16 `mean`), else in f64.
    fn mean_of(&self, xs: &[f32]) -> f32 {
        if !self.fp16_sums() {
            return mean(xs.iter().copied());
        }
        let sum = fp16_sum(xs.iter().copied());
        f16::from_f32(sum * f16::from_f32(1.0 / xs.len() as f32).to_f32()).to_f32()
    }

    /// The RoPE table `name` (`cos` / `sin`) in the declared arithmetic.
    pub fn rope_tables(&self, t: &mut [f32], name: &str) {
        if let Some((g, rows)) = &self.grids {
            if let Some(grids) = g.for_rows(*rows).get(&(None, format!("rope {name}"))) {
                crate::qdq::apply(grids, t);
            }
            return;
        }
        if self.fp16.is_some_and(|f| f.rope_tables_fp16) {
            for v in t {
                *v = f16::from_f32(*v).to_f32();
            }
        }
    }

    /// The op output `xs`, named `op`, in the declared arithmetic.
    pub fn round(&self, xs: &mut [f32], op: &'static str) {
        let quantised = self.quantise(xs, op);
        self.last.set(op);
        if quantised {
            return;
        }
        let Some(f) = self.fp16 else { return };
        if let Some(sites) = f.sites {
            let site = match (self.within.get(), op) {
                (Some(_), "output") => "norm output",
                (Some(_), _) => return,
                _ => op,
            };
            if !sites.holds(site) {
                return;
            }
        }
        let mut worst = 0f32;
        for v in xs.iter_mut() {
            let (r, lost) = round_fp16(*v, f.overflow);
            if lost && v.abs() > worst.abs() {
                worst = *v;
            }
            *v = r;
        }
        if worst == 0.0 {
            return;
        }
        let at = OverflowAt {
            layer: self.layer.get(),
            within: self.within.get(),
            op,
            value: worst,
        };
        // the first op that loses a value, with the largest value it loses (over every row)
        match self.first.get() {
            None => self.first.set(Some(at)),
            Some(f) if (f.layer, f.within, f.op) == (at.layer, at.within, op) => {
                if worst.abs() > f.value.abs() {
                    self.first.set(Some(at));
                }
            }
            Some(_) => {}
        }
    }

    fn one(&self, v: f32, op: &'static str) -> f32 {
        let mut x = [v];
        self.round(&mut x, op);
        x[0]
    }

    /// Rounds the output of a norm that is not computed op by op (`name`'s output only).
    pub fn round_norm_output(&self, name: &'static str, xs: &mut [f32]) {
        self.within.set(Some(name));
        self.round(xs, "output");
        self.within.set(None);
    }

    /// RMSNorm `name`, `x / sqrt(mean(x²) + eps) * w` over rows of `n`, with every intermediate the graph
    /// holds (per [`NormStatistic`]) rounded; `None` in float32 (the caller's own norm runs).
    pub fn rms_norm(
        &self,
        name: &'static str,
        x: &[f32],
        n: usize,
        w: &[f32],
        eps: f32,
    ) -> Option<Vec<f32>> {
        // a QDQ graph's norm whose ops are on grids is computed op by op in the form its graph
        // holds (scripts/export-onnx.py's max-scaled statistic)
        let norm = match (self.fp16, self.norm_on_grids(name)) {
            (Some(f), _) => f.norm,
            (None, true) => NormStatistic::MaxScaled,
            (None, false) => return None,
        };
        self.within.set(Some(name));
        let mut out = vec![0f32; x.len()];
        for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
            if norm == NormStatistic::MaxDivided {
                self.max_divided(xr, w, eps, or);
                continue;
            }
            let den = match norm {
                NormStatistic::Fused => {
                    let ms = mean(xr.iter().map(|v| v * v));
                    (ms + eps).sqrt()
                }
                NormStatistic::Squares => {
                    let mut sq: Vec<f32> = xr.iter().map(|v| v * v).collect();
                    self.round(&mut sq, "x·x");
                    let ms = self.one(self.mean_of(&sq), "mean(x·x)");
                    self.one(self.one(ms + eps, "mean + eps").sqrt(), "sqrt")
                }
                NormStatistic::MaxScaled => {
                    let m = xr.iter().fold(2f32.powi(-14), |a, v| a.max(v.abs()));
                    let m = self.one(m, "max");
                    let r = self.one(m.sqrt(), "sqrt(max)");
                    let mut sq: Vec<f32> = xr.iter().map(|v| self.one(v / r, "x/√m")).collect();
                    for s in &mut sq {
                        *s *= *s;
                    }
                    self.round(&mut sq, "y·y");
                    let ms = self.one(self.mean_of(&sq), "mean(y·y)");
                    let e = self.one(eps / m, "eps/m");
                    let s = self.one(self.one(ms + e, "mean + eps").sqrt(), "sqrt");
                    self.one(r * s, "denominator")
                }
                NormStatistic::MaxDivided => unreachable!("computed above"),
            };
            if norm == NormStatistic::Fused {
                for ((o, &v), &g) in or.iter_mut().zip(xr).zip(w) {
                    *o = v / den * g;
                }
                self.round(or, "output");
            } else {
                for (o, &v) in or.iter_mut().zip(xr) {
                    *o = v / den;
                }
                self.round(or, "x/den");
                for (o, &g) in or.iter_mut().zip(w) {
                    *o *= g;
                }
                self.round(or, "output");
            }
        }
        self.within.set(None);
        Some(out)
    }
}

impl Rounder {
    /// [`NormStatistic::MaxDivided`] on one row `xr` into `or`, every op's output rounded.
    fn max_divided(&self, xr: &[f32], w: &[f32], eps: f32, or: &mut [f32]) {
        let m = xr
            .iter()
            .fold(f16::from_f32(1e-4).to_f32(), |a, v| a.max(v.abs()));
        for (o, &v) in or.iter_mut().zip(xr) {
            *o = v / m;
        }
        self.round(or, "x/m");
        let mut sq: Vec<f32> = or.iter().map(|y| y * y).collect();
        self.round(&mut sq, "y·y");
        let ms = self.one(self.mean_of(&sq), "mean(y·y)");
        // m² is inf past 256 by design: its reciprocal is then 0, which eps / m² rounds to in
        // fp16 anyway, so that inf loses nothing and is not recorded as an overflow
        let inv_m2 = f16::from_f32(1.0 / f16::from_f32(m * m).to_f32()).to_f32();
        let e = self.one(inv_m2 * f16::from_f32(eps).to_f32(), "eps/m²");
        let s = self.one(self.one(ms + e, "mean + eps").sqrt(), "sqrt");
        let inv = self.one(1.0 / s, "1/sqrt");
        for o in or.iter_mut() {
            *o *= inv;
        }
        self.round(or, "x/den");
        for (o, &g) in or.iter_mut().zip(w) {
            *o *= g;
        }
        self.round(or, "output");
    }
}

/// The sum of fp16 values accumulated in fp16, one term at a time in order (each partial sum
/// the f32 sum of two fp16 values rounded to fp16, as `half`'s addition computes it).
pub(crate) fn fp16_sum(xs: impl Iterator<Item = f32>) -> f32 {
    xs.fold(f16::ZERO, |acc, v| {
        f16::from_f32(acc.to_f32() + f16::from_f32(v).to_f32())
    })
    .to_f32()
}

/// A norm's mean, accumulated in f64 (ONNX Runtime's CPU LayerNormalization kernels accumulate
/// in double; an order-independent sum also keeps two implementations' roundings equal).
fn mean(xs: impl ExactSizeIterator<Item = f32>) -> f32 {
    let n = xs.len() as f64;
    (xs.map(f64::from).sum::<f64>() / n) as f32
}

/// `v` in fp16 under `overflow`, and whether the value was lost (became ±inf or was clamped).
/// Below 65504 (and up to where IEEE rounds to inf) this is `half`'s round to nearest even;
/// above it, under saturation, the value keeps 11 significant bits up to the limit.
pub fn round_fp16(v: f32, overflow: Overflow) -> (f32, bool) {
    if !v.is_finite() {
        return (v, false);
    }
    let r = f16::from_f32(v).to_f32();
    if r.is_finite() {
        return (r, false);
    }
    match overflow {
        Overflow::Infinite => (r, true),
        Overflow::Saturate(limit) => {
            // 11 significant bits at v's own exponent: round v / 2^k in fp16, k the halvings
            // that bring it into range
            let mut k = 0;
            let mut s = v;
            while s.abs() > FP16_MAX {
                s *= 0.5;
                k += 1;
            }
            let kept = f16::from_f32(s).to_f32() * 2f32.powi(k);
            if kept.abs() > limit {
                (limit.copysign(v), true)
            } else {
                (kept, false)
            }
        }
    }
}

#[cfg(test)]
mod tests;
