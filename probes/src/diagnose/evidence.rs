//! The rule of evidence (issue 34, docs/diagnosis.md "One criterion"): when a fault hypothesis'
//! replay counts as the cause, against the healthy hypothesis. One criterion for the replays of a
//! named verdict (`replay`) and of the mild faults on a healthy one (`score`).

use crate::thresholds::{PRECISION_RATIO, STEP_NOISE_FLOOR};

/// The factors a mild factor fault is tried at (beside the fitted attention scales): the
/// catalogue's mild range, 15 % either side of 1 in two steps.
pub const MILD_FACTORS: [f64; 4] = [0.9, 1.1, 0.85, 1.15];

/// A fault hypothesis beats the healthy one: its median miss reproduces the device within the
/// declared precision and `PRECISION_RATIO` times more closely than the healthy hypothesis'.
pub fn beats_healthy(fault_miss: f64, healthy_miss: f64, precision: f64) -> bool {
    fault_miss <= precision.max(STEP_NOISE_FLOOR)
        && fault_miss.max(STEP_NOISE_FLOOR) * PRECISION_RATIO <= healthy_miss
}

/// The graph's own arithmetic as a hypothesis' band may count it (docs/diagnosis.md, "A
/// hypothesis' band"): over cache-free rows `(f32 vs matched, matched vs device)` cosines, the
/// mean miss against the precision-matched reference with each row's miss capped at
/// `PRECISION_RATIO` × that row's declared precision (the matched reference's own miss against
/// f32, floored at `STEP_NOISE_FLOOR`). The cap is computed from the references alone, so a fault
/// that breaks those rows (a prefill mask that lets every slot through: rows at 0.44) cannot
/// widen the band a competing hypothesis is judged by past what the declaration allows; a
/// healthy row inside its precision counts in full. 0 without rows.
pub fn band_noise(rows: impl IntoIterator<Item = (f64, f64)>) -> f64 {
    let (mut sum, mut n) = (0.0, 0usize);
    for (rm, md) in rows {
        let cap = PRECISION_RATIO * (1.0 - rm).max(STEP_NOISE_FLOOR);
        let miss = 1.0 - md;
        sum += if miss.is_nan() { cap } else { miss.min(cap) };
        n += 1;
    }
    if n == 0 {
        0.0
    } else {
        sum / n as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_row_widens_the_band_only_up_to_its_declared_precision() {
        // an f32 row inside the floor counts in full
        assert!((band_noise([(1.0, 1.0 - 5e-5)]) - 5e-5).abs() < 1e-12);
        // a prefill broken to 0.56 on a float32 device: 2.5 × the floor, not 0.44
        assert!((band_noise([(1.0, 0.56)]) - 2.5e-4).abs() < 1e-12);
        // an fp16 row whose declared precision costs 1e-3 may miss up to 2.5e-3
        assert!((band_noise([(1.0 - 1e-3, 0.99)]) - 2.5e-3).abs() < 1e-12);
        // a mean over rows, NaN at the cap, none = 0
        assert!((band_noise([(1.0, 1.0), (1.0, f64::NAN)]) - 1.25e-4).abs() < 1e-12);
        assert_eq!(band_noise([]), 0.0);
    }

    #[test]
    fn a_fault_beats_healthy_only_within_precision_and_by_the_ratio() {
        // exact replay, healthy misses by 1e-3: named
        assert!(beats_healthy(0.0, 1e-3, 1e-3));
        // an exact replay cannot beat a healthy hypothesis inside the ratio times the floor
        assert!(!beats_healthy(0.0, 2e-4, 1e-3));
        // closer, but not by the ratio
        assert!(!beats_healthy(5e-4, 1e-3, 1e-3));
        // by the ratio, but outside the declared precision
        assert!(!beats_healthy(2e-3, 1e-2, 1e-3));
    }
}
