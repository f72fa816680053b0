//! Stage from the stale, causality and splits probes alone (issue 10), kept apart from the named
//! rules in `diagnose.rs`. Not yet called by `diagnose`.
//!
//! Order of the rules = how direct the evidence is:
//! 1. first-layer causality leaks: a later token's bytes were written into an earlier slot
//!    (the first layer's K/V depend on the token alone) → prefill writer, or offset when every
//!    token moved by the same slot shift;
//! 2. later-layer causality leaks or stale poison seen by a step → mask;
//! 3. pure decode clean but decode after a prefill fails → tbt reader (tbt disagrees with what
//!    prefill wrote);
//! 4. pure decode fails too → graph.

use kvprobe_schema::{CausalityFinding, SplitsFinding, Stage, StaleFinding};

use crate::thresholds::STAGE_MIN_COSINE;

pub fn stage_from(
    stale: Option<&StaleFinding>,
    causality: Option<&CausalityFinding>,
    splits: Option<&SplitsFinding>,
) -> Option<Stage> {
    if let Some(c) = causality {
        if c.first_layer_leak_cells > 0 || c.first_layer_shift.is_some_and(|s| s != 0) {
            return Some(match c.first_layer_shift {
                Some(s) if s != 0 => Stage::Offset,
                _ => Stage::PrefillWriter,
            });
        }
        if c.leak_cells > 0 {
            return Some(Stage::Mask);
        }
    }
    if stale.is_some_and(|s| s.first_moved_step.is_some()) {
        return Some(Stage::Mask);
    }
    let sp = splits?;
    if sp.pure_decode_min >= STAGE_MIN_COSINE && sp.mixed_decode_min < STAGE_MIN_COSINE {
        return Some(Stage::TbtReader);
    }
    if sp.pure_decode_min < STAGE_MIN_COSINE {
        return Some(Stage::Graph);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvprobe_schema::LogitComparison;

    fn cmp(c: f64) -> LogitComparison {
        LogitComparison {
            cosine: c,
            kl: 0.0,
            device_top1: 0,
            reference_top1: 0,
            top1_match: true,
        }
    }

    fn splits(pure: f64, mixed: f64) -> SplitsFinding {
        SplitsFinding {
            prompt_len: 4,
            prefill_len: 2,
            rows: Vec::new(),
            whole_prefill: cmp(1.0),
            pure_decode_min: pure,
            mixed_decode_min: mixed,
            prefill_continue_min: 1.0,
            failing_splits: Vec::new(),
        }
    }

    fn causality(first: usize, all: usize, shift: Option<i64>) -> CausalityFinding {
        CausalityFinding {
            slots: Vec::new(),
            slot_positions: Vec::new(),
            perturbed: Vec::new(),
            replacement_tokens: Vec::new(),
            matrix: Vec::new(),
            first_layer_matrix: Vec::new(),
            final_logits_cosine: Vec::new(),
            leaks: Vec::new(),
            leak_cells: all,
            first_layer_leak_cells: first,
            stray_cells: 0,
            first_layer_shift: shift,
        }
    }

    #[test]
    fn stages_by_signature() {
        // kv-swap on SmolLM2 (measured): pure decode 0.98, decode after prefill −0.83
        let ok = causality(0, 0, Some(0));
        assert_eq!(
            stage_from(None, Some(&ok), Some(&splits(0.9785, -0.83))),
            Some(Stage::TbtReader)
        );
        assert_eq!(
            stage_from(None, Some(&ok), Some(&splits(0.5, 0.5))),
            Some(Stage::Graph)
        );
        assert_eq!(stage_from(None, Some(&ok), Some(&splits(0.99, 0.99))), None);
        assert_eq!(
            stage_from(None, Some(&causality(59, 59, None)), None),
            Some(Stage::PrefillWriter)
        );
        assert_eq!(
            stage_from(None, Some(&causality(5, 5, Some(-1))), None),
            Some(Stage::Offset)
        );
        assert_eq!(
            stage_from(None, Some(&causality(0, 3, Some(0))), None),
            Some(Stage::Mask)
        );
    }
}
