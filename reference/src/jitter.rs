//! The healthy hypothesis' own spread (issue 34, the band question): the model with every norm
//! weight moved by at most one unit in the last place of the arithmetic a device declares.
//!
//! Two correct kernels for one op (another summation order, FMA, vector width) differ by about an
//! ulp in each output. A device whose graph rounds at declared points (int8 activations inside
//! MatMulNBits at `accuracy_level` 4, a QDQ graph's uint8 / uint16 grids) turns such a difference
//! into a whole grid step wherever a value sits near a rounding boundary, so a healthy device
//! strays from the reference as far as the graph amplifies an ulp: its conditioning
//! (docs/diagnosis.md, "The jitter control"). A norm weight scales every norm's output, i.e. the
//! input of every quantised projection after it, so moving each weight by ≤ 1 ulp moves the
//! values the declared rounding sees by as much as a healthy device's own kernels do; the model
//! run so is one draw of what a healthy device may compute.

use crate::blocks::Norm;
use crate::model::Model;
use crate::Result;

impl Model {
    /// This model with every norm weight (each layer's two, Qwen3's q/k norms, the final norm)
    /// multiplied element-wise by `1 + u·ulp`, `u` uniform in [−1, 1] drawn from `seed`, `ulp`
    /// the declared arithmetic's unit in the last place at 1 (`f32::EPSILON` for float32). The
    /// weights are shared with `self` (only the norm vectors are new).
    pub fn jittered(&self, seed: u64, ulp: f32) -> Result<Model> {
        let mut rng = SplitMix(seed);
        let mut m = self.clone();
        for b in &mut m.blocks {
            for n in [&mut b.norm1, &mut b.norm2]
                .into_iter()
                .chain(b.q_norm.as_mut())
                .chain(b.k_norm.as_mut())
            {
                jitter(n, &mut rng, ulp)?;
            }
        }
        jitter(&mut m.final_norm, &mut rng, ulp)?;
        Ok(m)
    }
}

fn jitter(n: &mut Norm, rng: &mut SplitMix, ulp: f32) -> Result<()> {
    let w = match n {
        Norm::Rms { w, .. } | Norm::Layer { w, .. } => w,
    };
    let mut v: Vec<f32> = w.flatten_all()?.to_vec1()?;
    for x in &mut v {
        *x *= 1.0 + rng.unit() * ulp;
    }
    *w = candle_core::Tensor::from_vec(v, w.dims(), w.device())?;
    Ok(())
}

/// SplitMix64: a fixed, seedable draw (the same spread on every run of one case).
struct SplitMix(u64);

impl SplitMix {
    /// Uniform in [−1, 1).
    fn unit(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_stay_within_one_unit_and_cover_both_signs() {
        let mut r = SplitMix(7);
        let u: Vec<f32> = (0..4096).map(|_| r.unit()).collect();
        assert!(u.iter().all(|x| (-1.0..1.0).contains(x)));
        assert!(u.iter().any(|&x| x < -0.9) && u.iter().any(|&x| x > 0.9));
        // a weight of 1 moves by at most one f32 ulp, and most weights move
        let moved: Vec<f32> = u.iter().map(|x| 1.0 + x * f32::EPSILON).collect();
        assert!(moved.iter().all(|&m| (m - 1.0).abs() <= f32::EPSILON));
        assert!(moved.iter().filter(|&&m| m != 1.0).count() > 1000);
    }
}
