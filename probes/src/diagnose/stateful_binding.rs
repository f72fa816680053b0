//! The stateful rules' K/V binding hypothesis (issue 35): a layer that reads another layer's
//! K/V, named when the replay over the binding the states show reproduces the device's first
//! decode step better than the healthy hypothesis at the declared precision
//! (`crate::state_binding`, `super::evidence::beats_healthy`).

use super::engine::Cause;
use super::stateful_facts::StatefulFacts;

/// The fitted binding and its replay, whatever the rule of evidence says.
pub(super) fn binding_fit(f: &StatefulFacts) -> Option<Cause> {
    Some(Cause::note(f.binding.as_ref()?.evidence()))
}

pub(super) fn kv_binding(f: &StatefulFacts) -> Option<Cause> {
    let b = f
        .binding
        .as_ref()
        .filter(|b| b.reproduces && !b.layout_only())?;
    let h = b.moved.iter().find(|h| !h.layout_only())?;
    Some(Cause::new(0.85).line(format!(
        "→ the replay reproduces the device: layer {}'s attention reads layer {}'s {} as its {} (a past bound to the wrong state, or a present written to it)",
        h.layer, h.from_layer, h.from_kind, h.kind
    )))
}

/// Every moved state holds its own K/V, written in another layout than the graph reads: the
/// writer's layout, the state's counterpart of the rings' `writer-layout`.
pub(super) fn state_writer_layout(f: &StatefulFacts) -> Option<Cause> {
    let b = f
        .binding
        .as_ref()
        .filter(|b| b.reproduces && b.layout_only())?;
    let h = b.moved.first()?;
    Some(Cause::new(0.85).line(format!(
        "→ the replay reproduces the device: layer {}'s {} is written {} and read in the documented [kv_heads, ctx, head_dim] order (a present written in another layout than its past is read)",
        h.layer,
        h.kind,
        h.layout.name()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state_binding::{BindingFit, Holding};
    use kvprobe_schema::Layout;

    fn fit(reproduces: bool, from_layer: usize, layout: Layout) -> BindingFit {
        BindingFit {
            when: "after the first decode step",
            moved: vec![Holding {
                layer: 0,
                kind: "K",
                from_layer,
                from_kind: "K",
                layout,
            }],
            replay_miss: 1e-6,
            healthy_miss: 0.3,
            precision: 1e-4,
            reproduces,
        }
    }

    #[test]
    fn named_only_when_the_replay_reproduces() {
        let mut f = crate::diagnose::stateful::tests::healthy_facts();
        assert!(kv_binding(&f).is_none() && binding_fit(&f).is_none());
        f.binding = Some(fit(false, 1, Layout::HeadMajor));
        assert!(kv_binding(&f).is_none() && state_writer_layout(&f).is_none());
        assert!(binding_fit(&f)
            .is_some_and(|c| c.evidence[0].contains("layer 0's K holds layer 1's K")));
        f.binding = Some(fit(true, 1, Layout::HeadMajor));
        let c = kv_binding(&f).expect("reproduced binding");
        assert!(c.evidence[0].contains("layer 0's attention reads layer 1's K as its K"));
        assert!(state_writer_layout(&f).is_none());
        // its own K, written token-major: the writer's layout, not a binding
        f.binding = Some(fit(true, 0, Layout::TokenMajor));
        assert!(kv_binding(&f).is_none());
        let c = state_writer_layout(&f).expect("reproduced writer layout");
        assert!(c.evidence[0].contains("layer 0's K is written token-major"));
    }
}
