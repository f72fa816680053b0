//! The value of a factor fault fitted by replay (issue 34, docs/diagnosis.md "Replay"): no
//! probe fits a cache scale, and the attention fits stop at the first tbt step and the prompt's
//! prefill, so when no replay of a factor cause at the table's values reproduces, the replay
//! itself is the fit.

use kvprobe_npu::contract::faults::{FaultTable, FaultText, SweepValue};
use kvprobe_schema::{FaultHypothesis, FaultValue, Replay};

/// Evaluations of the value fit by replay: golden-section steps that narrow ln(value) over
/// [1/4, 4] (width ln 16) below the grammar's resolution, 0.01 on values up to 4 (a budget).
const REFINE_STEPS: usize = 16;

pub(super) fn is_factor(table: &FaultTable, h: &FaultHypothesis) -> bool {
    table
        .decl(&FaultText::split(&h.text()))
        .is_ok_and(|d| matches!(d.sweep, SweepValue::Factor))
}

/// `h` at the factor whose replay over the first `k` steps comes closest to the device: a
/// golden-section search over ln(factor) in [1/4, 4], each value at the grammar's resolution
/// (two decimals). No probe fits a cache scale, and the attention fits stop at the first tbt
/// step and the prompt's prefill: the replay itself is the fit.
pub(super) fn refine(
    h: &FaultHypothesis,
    k: usize,
    run: &dyn Fn(&FaultHypothesis, usize) -> Result<Replay, String>,
) -> Option<FaultHypothesis> {
    let at = |x: f64| FaultHypothesis {
        value: FaultValue::Number((x.exp() * 100.0).round() / 100.0),
        ..h.clone()
    };
    let cost = |x: f64| {
        run(&at(x), k).map_or(f64::INFINITY, |r| {
            r.steps.iter().map(|s| s.replay_miss).sum::<f64>()
        })
    };
    let g = (5f64.sqrt() - 1.0) / 2.0;
    let (mut a, mut b) = (0.25f64.ln(), 4f64.ln());
    let (mut c, mut d) = (b - g * (b - a), a + g * (b - a));
    let (mut fc, mut fd) = (cost(c), cost(d));
    for _ in 0..REFINE_STEPS {
        if fc < fd {
            (b, d, fd) = (d, c, fc);
            c = b - g * (b - a);
            fc = cost(c);
        } else {
            (a, c, fc) = (c, d, fd);
            d = a + g * (b - a);
            fd = cost(d);
        }
    }
    let best = if fc < fd { c } else { d };
    (fc.min(fd).is_finite()).then(|| at(best))
}
