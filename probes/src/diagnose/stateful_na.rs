//! What `diagnose` on a stateful device does not run, and why (reported, never skipped
//! silently): the probes that need the genai ring, and the state checks on a device that does
//! not expose its K/V states.

use kvprobe_schema::NotApplicable;

/// Probes that need the genai ring, with the reason (reported, never skipped silently).
pub const NOT_APPLICABLE: &[(&str, &str)] = &[
    ("quant", "the states and inputs are fp16/f32 without quant infos; there is nothing to compare"),
    ("colmap", "single-key columns of a ring window; a stateful device's mask columns are absolute positions (the layout and mask state checks cover this)"),
    ("ztap", "the device exposes no graph taps"),
    ("maskconv", "the uint8 mask conventions of the genai server; the fp16 additive mask is checked by the self-only state check"),
    ("positions", "ring read-offset/position wiring; positions are absolute inputs of every run"),
    ("layout", "ring entry layouts written by the prefill group; the state layout check writes reference K/V in both state orders instead"),
    ("inject", "golden ring windows at a read offset; the state layout check injects reference K/V into the states instead"),
    ("stale", "ring slots outside the read window; the back-to-back rerun of the prefill check covers stale state"),
    ("causality", "ring entries by slot; stateful slots are positions, checked by the occupancy state check"),
    ("splits", "the handover between the genai prefill and tbt groups at every split; one graph serves both here (chunk continuation is the chunked-prefill property of npu/tests/ane_sim.rs)"),
];

pub(super) fn na() -> Vec<NotApplicable> {
    NOT_APPLICABLE
        .iter()
        .map(|(p, why)| NotApplicable {
            probe: p.to_string(),
            why: format!("not applicable on a stateful device: {why}"),
        })
        .collect()
}

/// The checks that read the states, on a device whose K/V states are out of reach.
pub(super) fn hidden_state_probes() -> Vec<NotApplicable> {
    ["overflow", "state", "kvdiff"]
        .iter()
        .map(|probe| NotApplicable {
            probe: probe.to_string(),
            why: "not applicable: the device does not expose its K/V states (read_cache is false; docs/openvino.md)".into(),
        })
        .collect()
}
