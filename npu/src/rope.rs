//! The two RoPE theta sign conventions (contract §2.6) and the conversions between them.

/// A RoPE sign convention: of a theta table, and of the compiled graph built to read it
/// (contract §2.6: the embedded `rope_theta_data.bin` decides; prior art "RoPE table").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeTheta {
    /// Both halves positive; the graph rotates half with the sign (HF `rotate_half`).
    Plain,
    /// First half negated (HailoRT's fallback generator); the graph swaps halves without a sign.
    SignFolded,
}

impl RopeTheta {
    pub fn name(self) -> &'static str {
        match self {
            RopeTheta::Plain => "plain",
            RopeTheta::SignFolded => "sign-folded",
        }
    }
    pub fn parse(s: &str) -> Option<RopeTheta> {
        match s {
            "plain" => Some(RopeTheta::Plain),
            "sign-folded" => Some(RopeTheta::SignFolded),
            _ => None,
        }
    }
    pub fn other(self) -> RopeTheta {
        match self {
            RopeTheta::Plain => RopeTheta::SignFolded,
            RopeTheta::SignFolded => RopeTheta::Plain,
        }
    }
    /// The convention a theta table is written in: sign-folded when its first half is negative
    /// and its second half is not.
    pub fn of_table(theta: &[f32]) -> RopeTheta {
        let (a, b) = theta.split_at(theta.len() / 2);
        if !a.is_empty() && a.iter().all(|x| *x < 0.0) && b.iter().all(|x| *x >= 0.0) {
            RopeTheta::SignFolded
        } else {
            RopeTheta::Plain
        }
    }
    /// `theta` (plain, both halves the inverse frequencies) written in this convention.
    pub fn table(self, plain: &[f32]) -> Vec<f32> {
        let half = plain.len() / 2;
        plain
            .iter()
            .enumerate()
            .map(|(i, x)| match self {
                RopeTheta::SignFolded if i < half => -x.abs(),
                _ => x.abs(),
            })
            .collect()
    }
}

/// One position's RoPE cos and sin rows (`theta.len()` columns each) as HailoRT's genai server
/// builds them (pre_process.cpp, `angular_positional_embed`): the angle `θ_c · pos` is a float32
/// product and cos/sin are float32 functions of it. An f64 angle gives other bits once `θ_c · pos`
/// is not exact in f32 (checked against the server's own code, docs/hardware.md).
pub fn cos_sin_row(theta: &[f32], pos: u64, cos: &mut [f32], sin: &mut [f32]) {
    let p = pos as f32;
    for ((c, s), &t) in cos.iter_mut().zip(sin.iter_mut()).zip(theta) {
        let a = t * p;
        *c = a.cos();
        *s = a.sin();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_round_trip_and_are_recognised() {
        let plain = [1.0, 0.1, 1.0, 0.1];
        let folded = RopeTheta::SignFolded.table(&plain);
        assert_eq!(folded, vec![-1.0, -0.1, 1.0, 0.1]);
        assert_eq!(RopeTheta::of_table(&folded), RopeTheta::SignFolded);
        assert_eq!(RopeTheta::of_table(&plain), RopeTheta::Plain);
        assert_eq!(RopeTheta::Plain.table(&folded), plain.to_vec());
        assert_eq!(RopeTheta::of_table(&[]), RopeTheta::Plain);
    }
    #[test]
    fn cos_sin_rows_take_the_angle_in_float32() {
        // θ = 3.3f32 (3.2999999523…), pos 29: the exact product 95.69999861… rounds to the f32
        // 95.69999695 (ulp 7.6e-6); the server's cos/sin are of that f32 angle. θ = 0.5, pos 6:
        // the product 3.0 is exact in both.
        let theta = [3.3f32, 0.5];
        let (mut c, mut s) = ([0f32; 2], [0f32; 2]);
        cos_sin_row(&theta, 29, &mut c, &mut s);
        let angle = 95.7_f32; // the f32 nearest 95.7 is 95.69999695
        assert_eq!(angle, (3.3f32 as f64 * 29.0) as f32);
        let ulps = |a: f32, b: f32| (a.to_bits() as i64 - b.to_bits() as i64).abs();
        assert!(ulps(c[0], (angle as f64).cos() as f32) <= 1, "{}", c[0]);
        assert!(ulps(s[0], (angle as f64).sin() as f32) <= 1, "{}", s[0]);
        // control: the f64 angle lands several ulps away
        let f64_cos = (3.3f32 as f64 * 29.0).cos() as f32;
        assert!(ulps(c[0], f64_cos) > 4, "{} vs {f64_cos}", c[0]);
        cos_sin_row(&theta, 6, &mut c, &mut s);
        assert!(ulps(c[1], 3f64.cos() as f32) <= 1 && ulps(s[1], 3f64.sin() as f32) <= 1);
    }
}
