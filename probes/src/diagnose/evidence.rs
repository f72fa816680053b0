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

#[cfg(test)]
mod tests {
    use super::*;

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
