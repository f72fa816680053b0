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

use half::f16;

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
            layer: Cell::new(None),
            within: Cell::new(None),
            first: Cell::new(None),
        }
    }

    pub fn is_fp16(&self) -> bool {
        self.fp16.is_some()
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

    /// The RoPE tables in the declared arithmetic.
    pub fn rope_tables(&self, t: &mut [f32]) {
        if self.fp16.is_some_and(|f| f.rope_tables_fp16) {
            for v in t {
                *v = f16::from_f32(*v).to_f32();
            }
        }
    }

    /// The op output `xs`, named `op`, in the declared arithmetic.
    pub fn round(&self, xs: &mut [f32], op: &'static str) {
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
        let f = self.fp16?;
        self.within.set(Some(name));
        let mut out = vec![0f32; x.len()];
        for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
            let den = match f.norm {
                NormStatistic::Fused => {
                    let ms = mean(xr.iter().map(|v| v * v));
                    (ms + eps).sqrt()
                }
                NormStatistic::Squares => {
                    let mut sq: Vec<f32> = xr.iter().map(|v| v * v).collect();
                    self.round(&mut sq, "x·x");
                    let ms = self.one(mean(sq.iter().copied()), "mean(x·x)");
                    self.one(self.one(ms + eps, "mean + eps").sqrt(), "sqrt")
                }
                NormStatistic::MaxScaled => {
                    let m = xr.iter().fold(2f32.powi(-14), |a, v| a.max(v.abs()));
                    let r = self.one(m.sqrt(), "sqrt(max)");
                    let mut sq: Vec<f32> = xr.iter().map(|v| self.one(v / r, "x/√m")).collect();
                    for s in &mut sq {
                        *s *= *s;
                    }
                    self.round(&mut sq, "y·y");
                    let ms = self.one(mean(sq.iter().copied()), "mean(y·y)");
                    let e = self.one(eps / m, "eps/m");
                    let s = self.one(self.one(ms + e, "mean + eps").sqrt(), "sqrt");
                    self.one(r * s, "denominator")
                }
            };
            if f.norm == NormStatistic::Fused {
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
mod tests {
    use super::*;

    #[test]
    fn fp16_rounding_and_the_two_overflows_by_hand() {
        // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even = 1
        assert_eq!(
            round_fp16(1.0 + 2f32.powi(-11), Overflow::Infinite),
            (1.0, false)
        );
        assert_eq!(round_fp16(65504.0, Overflow::Infinite), (65504.0, false));
        assert_eq!(round_fp16(7.0e4, Overflow::Infinite), (f32::INFINITY, true));
        // under saturation at 131008, 7e4 keeps 11 bits (a step of 64 there) and 5.9e5 clamps
        assert_eq!(
            round_fp16(70_000.0, Overflow::Saturate(131_008.0)),
            (70_016.0, false)
        );
        assert_eq!(
            round_fp16(-5.9e5, Overflow::Saturate(131_008.0)),
            (-131_008.0, true)
        );
    }

    #[test]
    fn the_first_overflow_is_the_one_recorded() {
        let r = Rounder::new(Arithmetic::Fp16(Fp16::every_op(
            Overflow::Saturate(131_008.0),
            NormStatistic::Squares,
        )));
        r.at_layer(Some(3));
        // a row whose squares reach 769² = 5.9e5: the norm's x·x is the first op that loses it
        let x = [769.0f32, 1.0, -2.0, 0.5];
        let y = r
            .rms_norm("input_layernorm", &x, 4, &[1.0; 4], 1e-5)
            .unwrap();
        let at = r.first_overflow().unwrap();
        assert_eq!(
            (at.layer, at.within, at.op, at.value),
            (Some(3), Some("input_layernorm"), "x·x", 769.0 * 769.0)
        );
        // the mean is a quarter of 131008 instead of 5.9e5 / 4: the output is ~2.1× too large
        assert!((y[0] / (769.0 / (769.0f32 * 769.0 / 4.0).sqrt()) - 2.125).abs() < 0.01);
        r.at_layer(Some(4));
        r.round(&mut [1e6], "later");
        assert_eq!(r.first_overflow().unwrap().layer, Some(3));
    }

    #[test]
    fn the_max_scaled_statistic_stays_in_range_where_the_squares_do_not() {
        let r = Rounder::new(Arithmetic::Fp16(Fp16::every_op(
            Overflow::Infinite,
            NormStatistic::MaxScaled,
        )));
        let x = [2.5e4f32, 1.0, -3.0, 700.0];
        let y = r.rms_norm("norm", &x, 4, &[1.0; 4], 1e-5).unwrap();
        assert_eq!(r.first_overflow(), None);
        let ms = x.iter().map(|v| v * v).sum::<f32>() / 4.0;
        for (a, b) in y.iter().zip(&x) {
            assert!((a - b / ms.sqrt()).abs() <= 2e-3 * (b / ms.sqrt()).abs().max(1e-3));
        }
        assert_eq!(
            Rounder::new(Arithmetic::F32).rms_norm("norm", &x, 4, &[1.0; 4], 1e-5),
            None
        );
    }

    #[test]
    fn declared_sites_round_only_there() {
        let mut f = Fp16::every_op(Overflow::Infinite, NormStatistic::Fused);
        f.sites = Some(Sites::of(&["norm output", "logits"]).unwrap());
        let r = Rounder::new(Arithmetic::Fp16(f));
        let v = 1.0 + 2f32.powi(-12); // not an fp16 value
        let mut q = [v];
        r.round(&mut q, "q_proj");
        assert_eq!(q, [v], "q_proj is not a declared site");
        let mut l = [v];
        r.round(&mut l, "logits");
        assert_eq!(l, [1.0]);
        // a norm's output is the `norm output` site
        let y = r.rms_norm("norm", &[v, -v], 2, &[1.0, 1.0], 0.0).unwrap();
        assert_eq!(y, [1.0, -1.0]);
        assert_eq!(Sites::of(&["logits", "cosine"]), Err("cosine".to_string()));
        // fp16 RoPE tables and the float32 skip sum are declared separately
        assert!(!r.skip_sum_f32());
        let mut t = [v];
        r.rope_tables(&mut t);
        assert_eq!(t, [v]);
        f.rope_tables_fp16 = true;
        f.skip_sum_f32 = true;
        let r = Rounder::new(Arithmetic::Fp16(f));
        r.rope_tables(&mut t);
        assert!(t == [1.0] && r.skip_sum_f32());
    }
}
