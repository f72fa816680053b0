//! Evidence text for the stateful rules: what the device's description declares about its cache
//! edges, and the state positions a prefill wrote.

use super::engine::Cause;
use super::stateful_facts::StatefulFacts;

/// The device answered a greedy step with inf or NaN logits after a finite prefill: it failed
/// mid-generation (an overflow in the decode graph or a non-finite K/V entry it wrote), named
/// with its step.
pub(super) fn non_finite_decode(f: &StatefulFacts) -> Option<Cause> {
    let step = f.non_finite_step?;
    let at = if step == 0 {
        "the prefill's last row (greedy step 0)".to_string()
    } else {
        format!("greedy step {step} (every earlier step finite)")
    };
    Some(Cause::new(0.9).line(format!(
        "→ numeric-overflow: the device's logits at {at} hold inf/NaN; the comparisons count them as no agreement, so no later rule can tell more"
    )))
}

/// `0..4, 7` style list.
pub(super) fn ranges(v: &[usize]) -> String {
    if v.is_empty() {
        return "none".into();
    }
    let mut out = Vec::new();
    let mut start = v[0];
    let mut prev = v[0];
    for &x in &v[1..] {
        if x != prev + 1 {
            out.push(if start == prev {
                format!("{start}")
            } else {
                format!("{start}..={prev}")
            });
            start = x;
        }
        prev = x;
    }
    out.push(if start == prev {
        format!("{start}")
    } else {
        format!("{start}..={prev}")
    });
    out.join(", ")
}
