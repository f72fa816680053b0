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
    let b = f.binding.as_ref().filter(|b| b.reproduces)?;
    let (l, m) = *b.moved.first()?;
    Some(Cause::new(0.85).line(format!(
        "→ the replay reproduces the device: layer {l}'s attention reads the K/V of layer {m} (a past bound by a wrong layer index)"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state_binding::BindingFit;

    fn fit(reproduces: bool) -> BindingFit {
        BindingFit {
            moved: vec![(0, 1), (1, 0)],
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
        f.binding = Some(fit(false));
        assert!(kv_binding(&f).is_none());
        assert!(binding_fit(&f).is_some_and(|c| c.evidence[0].contains("layer 0 holds layer 1's")));
        f.binding = Some(fit(true));
        let c = kv_binding(&f).expect("reproduced binding");
        assert!(c.evidence[0].contains("layer 0's attention reads the K/V of layer 1"));
    }
}
