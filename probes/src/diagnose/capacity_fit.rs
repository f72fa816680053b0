//! A capacity limit inside the session's own request (issue 34, docs/diagnosis.md "A capacity
//! limit inside the request"). A device whose rings hold fewer entries than it declares garbles
//! the session's prompt already when the prompt spans more than one prefill window: the padding
//! rows of its last window write slots past the real limit, which alias the prompt's own. No
//! prompt shorter than the limit then agrees with the fault-free emulator either (session 32
//! measured it: every shorter prompt's step departs), so bisecting prompts cannot find it, and
//! the limit is a number no probe fits.
//!
//! What shows the limit cleanly is generation: a prompt of exactly one prefill window writes no
//! padding row, and each generation step after it writes one entry; the first step whose write
//! wraps onto an earlier entry is the first that departs from the fault-free emulator fed the
//! same tokens. A ring of `N` entries puts position `N` on slot 0: a graph that reads its window
//! before it writes departs first at position `N + 1`, one that writes first at `N` (measured:
//! `ring-capacity=24` at L 32 / P 16 departs at 25). The capacity faults are hypothesised at
//! the departure and one either side (`at_limit`), replayed like any other hypothesis on the
//! session's own request, and judged by the rule of evidence.

use kvprobe_npu::MaskMode;

use super::capacity_replay::{at_limit, point_miss as answer_miss};
use crate::capacity_record::refusal_is_none as answer;
use crate::session::Session;
use kvprobe_npu::contract::faults::FaultTable;
use kvprobe_schema::FaultHypothesis;

/// Where generation from one whole prefill window departs, and how many steps showed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct GenerationDeparture {
    /// Position of the first generation step that departs (the ring's real entry count, or one
    /// past it).
    pub position: usize,
    /// Generation steps compared (the departing one included).
    pub steps: usize,
}

/// Drives `device` and `healthy` (the fault-free emulator) from a fresh start through a prompt
/// of `seq[..window]` and then one generation step per token of `seq[window..]`, and returns
/// the first step whose answers part by more than `tol` (1 − cosine). `None` when the prompt
/// itself departs (a fault that shows inside one window is no capacity limit), when nothing
/// departs, or when both refuse the same step (the declared end: no limit below it).
pub(super) fn generation_departure(
    device: &mut Session,
    healthy: &mut Session,
    seq: &[u32],
    window: usize,
    tol: f64,
) -> crate::Result<Option<GenerationDeparture>> {
    if window == 0 || seq.len() <= window {
        return Ok(None);
    }
    let prompt = |s: &mut Session| -> crate::Result<Option<Vec<f32>>> {
        crate::determinism::fresh_start(s)?;
        answer(s.driver.prefill(s.dev, &seq[..window]))
    };
    let (d, h) = (prompt(device)?, prompt(healthy)?);
    if d.is_none() || answer_miss(d.as_ref(), h.as_ref()) > tol {
        return Ok(None);
    }
    for (k, &token) in seq[window..].iter().enumerate() {
        let d = answer(device.driver.step(device.dev, token, &MaskMode::Ring))?;
        let h = answer(healthy.driver.step(healthy.dev, token, &MaskMode::Ring))?;
        if d.is_none() && h.is_none() {
            return Ok(None);
        }
        if answer_miss(d.as_ref(), h.as_ref()) > tol {
            return Ok(Some(GenerationDeparture {
                position: window + k,
                steps: k + 1,
            }));
        }
    }
    Ok(None)
}

/// The token sequence the measurement feeds: the session's prompt, then the device's greedy
/// tokens, repeated until `len` tokens (a teacher-forced sequence: both sides get the same
/// tokens, whatever they would have chosen).
pub(super) fn sequence(ids: &[u32], tokens: &[u32], len: usize) -> Vec<u32> {
    ids.iter()
        .chain(tokens)
        .copied()
        .cycle()
        .take(if ids.is_empty() && tokens.is_empty() {
            0
        } else {
            len
        })
        .collect()
}

/// A measured departure, none, or why it could not be measured.
pub(super) type Measured = Result<Option<GenerationDeparture>, String>;

/// The evidence line of the measurement (said whenever the family has capacity faults).
pub(super) fn said(m: &Measured) -> String {
    match m {
        Ok(Some(d)) => format!(
            "capacity limit inside the request: generation after one whole prefill window \
             departs from the fault-free emulator first at position {} ({} steps compared): the \
             capacity faults were hypothesised at {}±1",
            d.position, d.steps, d.position
        ),
        Ok(None) => "capacity limit inside the request: generation after one whole prefill \
                     window follows the fault-free emulator to the declared context (or the \
                     window itself departs): no limit to hypothesise"
            .into(),
        Err(e) => format!("capacity limit inside the request not measured: {e}"),
    }
}

/// The capacity faults of `table` at a departure's position (and one either side: the step
/// that departs may be the one after the first wrapped write, `at_limit`).
pub(super) fn hypotheses(table: &FaultTable, d: GenerationDeparture) -> Vec<FaultHypothesis> {
    at_limit(table, d.position)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sequence_is_the_prompt_then_the_tokens_repeated() {
        assert_eq!(sequence(&[1, 2], &[3], 7), vec![1, 2, 3, 1, 2, 3, 1]);
        assert_eq!(sequence(&[1, 2, 3], &[], 2), vec![1, 2]);
        assert!(sequence(&[], &[], 5).is_empty());
    }

    #[test]
    fn a_refusal_against_an_answer_is_the_largest_miss() {
        let (a, b) = (vec![1.0f32, 0.0], vec![0.0f32, 1.0]);
        assert_eq!(answer_miss(None, None), 0.0);
        assert_eq!(answer_miss(Some(&a), None), 2.0);
        assert!(answer_miss(Some(&a), Some(&a)).abs() < 1e-9);
        assert!((answer_miss(Some(&a), Some(&b)) - 1.0).abs() < 1e-9);
    }
}
