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

/// The middle value (the mean of the two middle ones for an even count); `None` for none.
pub fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// The healthy hypothesis fails a point (a greedy step, a capacity request): it leaves the
/// device there by `PRECISION_RATIO` times what the declared precision costs that point
/// (floored at `STEP_NOISE_FLOOR`) — the test a stage fails by, taken one point at a time.
pub fn departs(healthy_miss: f64, precision: Option<f64>) -> bool {
    healthy_miss >= PRECISION_RATIO * precision.unwrap_or(0.0).max(STEP_NOISE_FLOOR)
}

/// What the healthy hypothesis says of each compared point: its miss against the device, the
/// declared precision there, and whether the point is one the device garbled (`departs`, or the
/// failing control's own verdict on it).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    pub healthy: Option<f64>,
    pub precision: Option<f64>,
    pub garbled: bool,
}

impl Point {
    /// A point judged by [`departs`] (no healthy miss: nothing to depart from).
    pub fn of(healthy: Option<f64>, precision: Option<f64>) -> Self {
        Point {
            healthy,
            precision,
            garbled: healthy.is_some_and(|h| departs(h, precision)),
        }
    }
}

/// A hypothesis' replay judged against the healthy one over the compared points.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Judgement {
    /// Its median miss on the garbled points it reached (on every point it reached when the
    /// device garbled none: what the closest tried reports).
    pub replay_miss: f64,
    /// The healthy hypothesis' median miss on the garbled points (on every point when none is).
    pub healthy_miss: Option<f64>,
    /// The declared precision's median on the same points.
    pub precision: Option<f64>,
    pub reproduces: bool,
}

/// The rule of evidence over points (docs/diagnosis.md "One criterion"): a hypothesis reproduces
/// the device when, on the points the device garbled, its median miss [`beats_healthy`], and on
/// no point the healthy hypothesis accounts for does the healthy hypothesis beat it the same way
/// (a hypothesis that breaks what the device did right contradicts a passing control). The
/// garbled points decide because a fault may show on a few of them only: a median over every
/// point lets the many it leaves alone outvote them. A device that garbled no point is the
/// healthy hypothesis' to explain. `replay[i]` is the miss at point i; a replay may stop short,
/// and the points it does not reach are not judged, but the healthy hypothesis and the
/// precision are the medians over every garbled point, so a replay decided early meets the same
/// bar as a whole one. No garbled point reached is the largest miss, 2.
pub fn judge_points(replay: &[f64], points: &[Point]) -> Judgement {
    let garbled: Vec<usize> = (0..points.len()).filter(|&i| points[i].garbled).collect();
    let over = |idx: &[usize], v: &dyn Fn(usize) -> Option<f64>| {
        median(idx.iter().filter_map(|&i| v(i)).collect())
    };
    if garbled.is_empty() {
        let all: Vec<usize> = (0..points.len()).collect();
        return Judgement {
            replay_miss: median(replay.to_vec()).unwrap_or(2.0),
            healthy_miss: over(&all, &|i| points[i].healthy),
            precision: over(&all, &|i| points[i].precision),
            reproduces: false,
        };
    }
    let replay_miss = over(&garbled, &|i| replay.get(i).copied()).unwrap_or(2.0);
    let healthy_miss = over(&garbled, &|i| points[i].healthy);
    let precision = over(&garbled, &|i| points[i].precision);
    let contradicts = replay.iter().zip(points).any(|(&r, p)| {
        !p.garbled
            && p.healthy
                .is_some_and(|h| beats_healthy(h, r, p.precision.unwrap_or(0.0)))
    });
    Judgement {
        replay_miss,
        healthy_miss,
        precision,
        reproduces: !contradicts
            && beats_healthy(
                replay_miss,
                healthy_miss.unwrap_or(f64::INFINITY),
                precision.unwrap_or(0.0),
            ),
    }
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

    fn pts(v: &[(f64, f64)]) -> Vec<Point> {
        v.iter()
            .map(|&(h, p)| Point::of(Some(h), Some(p)))
            .collect()
    }

    #[test]
    fn a_point_is_garbled_when_healthy_leaves_it_by_the_ratio_of_its_precision() {
        assert!(departs(2.5e-3, Some(1e-3)));
        assert!(!departs(2.4e-3, Some(1e-3)));
        // the floor: a precision below it counts as the floor
        assert!(!departs(2e-4, Some(1e-6)) && departs(2.5e-4, None));
    }

    #[test]
    fn a_fault_that_garbles_few_steps_is_judged_on_them() {
        // three of ten steps garbled (5e-3 against a precision of 1e-3): the healthy hypothesis'
        // median over all ten (1e-5) would hide them; an exact replay reproduces them
        let mut v = vec![(1e-5, 1e-3); 10];
        for i in [1, 5, 9] {
            v[i] = (5e-3, 1e-3);
        }
        let points = pts(&v);
        let j = judge_points(&[0.0; 10], &points);
        assert!(j.reproduces && j.healthy_miss == Some(5e-3) && j.precision == Some(1e-3));
        // a replay that reproduces them but breaks a step the device got right contradicts a
        // passing control: not a cause
        let mut broken = [0.0; 10];
        broken[2] = 5e-3;
        assert!(!judge_points(&broken, &points).reproduces);
        // closer than healthy on the garbled steps, but not by the ratio
        let mut near = [0.0; 10];
        for i in [1, 5, 9] {
            near[i] = 2.5e-3;
        }
        assert!(!judge_points(&near, &points).reproduces);
    }

    #[test]
    fn a_device_that_garbles_nothing_is_the_healthy_hypothesis() {
        let points = pts(&[(1e-5, 1e-3); 4]);
        let j = judge_points(&[0.0; 4], &points);
        assert!(!j.reproduces && j.replay_miss == 0.0 && j.healthy_miss == Some(1e-5));
    }
}
