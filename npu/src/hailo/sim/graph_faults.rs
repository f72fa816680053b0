//! The graph faults' math: the compiled graph's attention under `tbt-attn-scale`,
//! `prefill-attn-scale`, `gqa-repeat=block` and `softmax=shared-across-heads`, plugged into the
//! reference model through its [`GraphOptions`] seam (the reference itself stays clean).

use kvprobe_reference::{GraphOptions, HeadWiring};
use kvprobe_schema::GroupKind;

use super::{FaultKind, SimDevice};

/// `gqa-repeat=block`: query head q reads KV head `q % n_kv` (ABAB) instead of `q / n_rep` (AABB).
fn block_order(q: usize, n_kv: usize, _n_rep: usize) -> usize {
    q % n_kv
}

/// `softmax=shared-across-heads` (F11): one softmax over all heads' score rows of a query.
fn one_softmax_over_heads(n_heads: usize) -> Vec<Vec<usize>> {
    vec![(0..n_heads).collect()]
}

impl SimDevice {
    /// The graph options group `g` computes with under the faults.
    pub(super) fn graph_options(&self, g: GroupKind) -> GraphOptions {
        let attn_scale = self
            .faults
            .iter()
            .find_map(|f| match (f.kind.clone(), g) {
                (FaultKind::TbtAttnScale(x), GroupKind::Tbt)
                | (FaultKind::PrefillAttnScale(x), GroupKind::Prefill) => Some(x),
                _ => None,
            })
            .unwrap_or(1.0);
        let mut heads = HeadWiring::CLEAN;
        if self.find_fault(g, |k| *k == FaultKind::GqaBlock).is_some() {
            heads.kv_head = block_order;
        }
        if self
            .find_fault(g, |k| *k == FaultKind::SharedSoftmax)
            .is_some()
        {
            heads.softmax_groups = one_softmax_over_heads;
        }
        GraphOptions {
            attn_scale,
            heads,
            ..GraphOptions::default()
        }
    }
}
