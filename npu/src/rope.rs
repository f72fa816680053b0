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
}
