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

/// The first cache whose edges disagree on element size or quantisation, as evidence text.
pub(super) fn declared_quant_mismatch(d: &kvprobe_schema::DeviceDescription) -> Option<String> {
    let edges: Vec<_> = d.groups.iter().flat_map(|g| g.cache_edges.iter()).collect();
    edges.iter().find_map(|a| {
        let b = edges.iter().find(|b| {
            b.cache_id == a.cache_id
                && (b.data_bytes != a.data_bytes
                    || b.quant.scale != a.quant.scale
                    || b.quant.zero_point != a.quant.zero_point)
        })?;
        Some(format!(
            "cache {}: {:?} edge {} byte(s), scale {}, zero point {} vs {:?} edge {} byte(s), scale {}, zero point {}",
            a.cache_id,
            a.direction,
            a.data_bytes,
            a.quant.scale,
            a.quant.zero_point,
            b.direction,
            b.data_bytes,
            b.quant.scale,
            b.quant.zero_point
        ))
    })
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
