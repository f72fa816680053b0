//! What a device declares about its limits (issue 20): [`Device::limits`](super::Device::limits)
//! returns one [`DeviceLimit`] per limit, with what the documented runtime does past it. The
//! default reads the description by runtime; a family whose runtime has more limits (an ONNX
//! window, a compiled prompt length) overrides it.

use kvprobe_schema::{DeviceDescription, DeviceLimit, LimitKind, PastLimit, RuntimeKind};

/// A limit with its documented behaviour; `source` says where that behaviour is written down.
pub fn limit(
    kind: LimitKind,
    value: usize,
    prompt: Option<PastLimit>,
    generation: Option<PastLimit>,
    source: &str,
) -> DeviceLimit {
    DeviceLimit {
        kind,
        value,
        prompt,
        generation,
        source: source.to_string(),
    }
}

/// The host's check of a prompt against the prompt length the device declares it refuses past
/// (`limits`: its [`Device::limits`](super::Device::limits)): a prompt of `value` tokens or more
/// is the user's input past a declared configuration, refused before anything runs, so a refusal
/// the device gives later is its own behaviour, not the user's.
pub fn check_prompt(limits: &[DeviceLimit], tokens: usize) -> crate::Result<()> {
    let refused = limits
        .iter()
        .filter(|l| l.kind == LimitKind::PromptLen && l.prompt == Some(PastLimit::Refused));
    match refused.map(|l| l.value).min() {
        Some(max_ctx) if tokens >= max_ctx => Err(crate::Error::ContextTooLong { tokens, max_ctx }),
        _ => Ok(()),
    }
}

/// The limits every device of a runtime has, read from its description: the prefill rows
/// (`prefill_len`) and the cache (`cache_len`); `stateful` is the device's
/// `Capabilities::stateful` (a state does not wrap).
pub fn declared(desc: &DeviceDescription, stateful: bool) -> Vec<DeviceLimit> {
    let (l, p) = (desc.cache_len, desc.prefill_len);
    let prefill = limit(
        LimitKind::PrefillLen,
        p,
        Some(PastLimit::Split),
        None,
        "the host splits a longer prompt into runs of at most this many rows (contract §2.3; a Core ML host runs chunks of the graph's largest query)",
    );
    if stateful || desc.runtime != RuntimeKind::GenaiRing {
        return vec![
            prefill,
            limit(
                LimitKind::MaxContext,
                l,
                Some(PastLimit::Refused),
                Some(PastLimit::Refused),
                "a state of this many positions does not wrap: a prompt that reaches it and a step past it are typed errors (docs/design.md, Stateful devices)",
            ),
        ];
    }
    vec![
        prefill,
        limit(
            LimitKind::CacheLen,
            l,
            Some(PastLimit::Refused),
            Some(PastLimit::Slides),
            "a prompt of L tokens or more is refused by the host (the first tbt window must still see it); generation has no hard stop: the ring wraps, the mask saturates and each step sees the newest L tokens, with the server's context-full flag set (contract §2.5, §2.9)",
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_slides_and_a_state_refuses() {
        let mut desc = crate::contract::describe::unit_description(RuntimeKind::GenaiRing, 128, 32);
        let ring = declared(&desc, false);
        assert_eq!(
            ring.iter()
                .map(|l| (l.kind, l.value, l.prompt, l.generation))
                .collect::<Vec<_>>(),
            [
                (LimitKind::PrefillLen, 32, Some(PastLimit::Split), None),
                (
                    LimitKind::CacheLen,
                    128,
                    Some(PastLimit::Refused),
                    Some(PastLimit::Slides)
                ),
            ]
        );
        desc.runtime = RuntimeKind::Stateful;
        let state = declared(&desc, true);
        assert_eq!(state[1].kind, LimitKind::MaxContext);
        assert_eq!(state[1].generation, Some(PastLimit::Refused));
    }
}
