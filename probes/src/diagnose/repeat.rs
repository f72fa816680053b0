//! The `nondeterministic` rule's check, shared by the stateful and the genai-ring families: the
//! same request twice in this process from all-zero caches (states zeroed by the reset, rings
//! cleared by the host) gave different bytes.

use kvprobe_schema::DeterminismFinding;

use super::engine::Cause;
use crate::determinism;

/// Identical inputs down to the caches, different outputs: nothing before the request explains it.
pub fn nondeterministic(r: &DeterminismFinding) -> Option<Cause> {
    if !determinism::repeat_differs(r) {
        return None;
    }
    Some(Cause::new(0.9).line(determinism::repeat_evidence(r)).line(
        "→ the device gives different results for identical inputs (`kvprobe determinism` adds a second process and every step)",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnose::engine::{Control, Controls};
    use crate::diagnose::ring::{RingFacts, REPEAT};
    use kvprobe_schema::{Divergence, RunComparison};

    fn finding(clean: Option<bool>, identical: bool) -> DeterminismFinding {
        DeterminismFinding {
            steps: 4,
            caches_compared: true,
            clean_reset: clean,
            comparisons: vec![RunComparison {
                against: "same process".into(),
                identical,
                first: (!identical).then_some(Divergence {
                    step: 1,
                    logit: Some(7),
                    layer: Some(0),
                    cache_id: Some(1),
                    slot: Some(5),
                }),
                step_max_abs_diff: vec![Some(0.0), Some(if identical { 0.0 } else { 0.25 })],
                slots_differing: Vec::new(),
            }],
            second_process_skipped: None,
        }
    }

    #[test]
    fn fires_only_on_different_runs_from_all_zero_caches() {
        let c = nondeterministic(&finding(Some(true), false)).expect("fires");
        assert_eq!(c.confidence, 0.9);
        assert!(
            c.evidence[0].contains("differs first at step 1 (logit 7), cache 1 of layer 0, slot 5"),
            "{:?}",
            c.evidence
        );
        assert!(nondeterministic(&finding(Some(true), true)).is_none());
        // caches not zero after the reset, or not known: not identical inputs
        assert!(nondeterministic(&finding(Some(false), false)).is_none());
        assert!(nondeterministic(&finding(None, false)).is_none());
    }

    #[test]
    fn the_ring_rule_reads_the_repeat_and_fails_the_rerun_control() {
        let rule = &REPEAT[0];
        let mut f = RingFacts::default();
        assert!((rule.check)(&f).is_none());
        assert!(!f.fails(Control::Rerun));
        f.repeat = Some(finding(Some(true), false));
        assert!(f.fails(Control::Rerun) && f.fails(Control::Any));
        assert_eq!(rule.id, "nondeterministic");
        assert!((rule.check)(&f).is_some());
        f.repeat = Some(finding(None, false));
        assert!(!f.fails(Control::Rerun));
        assert!((rule.check)(&f).is_none());
    }
}
