//! What the probes found: one serialisable type per probe, the diagnosis, and the run record.
//!
//! `Results` is the single object behind `results.json` and `--json`; the HTML report is rendered
//! from it alone (plus nothing that depends on render time).

mod cache;
mod capacity;
mod determinism;
mod hypothesis;
mod kvdiff;
mod logits;
mod stage;
mod stateful;
mod verdict;

pub use cache::*;
pub use capacity::*;
pub use determinism::*;
pub use hypothesis::*;
pub use kvdiff::*;
pub use logits::*;
pub use stage::*;
pub use stateful::*;
pub use verdict::*;

use std::collections::BTreeMap;

use crate::manifest::SimManifest;
use serde::{Deserialize, Serialize};

/// Per-probe results; a probe that did not run is `None`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProbeFindings {
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub prefill: Option<PrefillFinding>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub greedy: Option<GreedyFinding>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub selfmask: Option<SelfmaskFinding>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub colmap: Option<ColmapFinding>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub ztap: Option<ZtapFinding>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub quant: Option<QuantFinding>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub maskconv: Option<MaskconvFinding>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub positions: Option<PositionsFinding>,
    /// The theta table's sign convention against the other one (RoPE models only). Its own
    /// field: `diagnose` runs it without the position sweep where single-chunk prefill fails.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub theta: Option<ThetaCheck>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub layout: Option<LayoutFinding>,
    /// `layout --infer` (older results.json files have none).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub layout_infer: Option<crate::layout_infer::LayoutInferFinding>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub inject: Option<InjectFinding>,
    /// diagnose: the reference's first tbt step over the prompt's K/V rounded through the rings'
    /// quantisation, the cache's precision floor (older results.json files have none).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub cache_precision: Option<LogitComparison>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub stale: Option<StaleFinding>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub causality: Option<CausalityFinding>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub splits: Option<SplitsFinding>,
    /// Stateful devices (issue 9): where fp16 overflow first shows.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub overflow: Option<OverflowFinding>,
    /// Stateful devices (issue 9): the state checks.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub state: Option<StateFinding>,
    /// The same request again in-process and in a second process (issue 20).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub determinism: Option<DeterminismFinding>,
    /// `kvdiff` (issue 20): the device's cache against the reference per layer × head ×
    /// position (older results.json files have none).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub kvdiff: Option<KvdiffFinding>,
    /// Probes that cannot run on this device, each with the reason (never a silent skip).
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub not_applicable: Vec<NotApplicable>,
    /// Findings of probes without a field of their own, by probe name: a probe module and its
    /// report section agree on the JSON, so adding a probe touches neither this crate nor the
    /// CLI (issue 17).
    #[serde(skip_serializing_if = "BTreeMap::is_empty", default)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    pub what: String,
    pub seconds: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Provenance {
    /// Exact command line, argv.
    pub command: Vec<String>,
    pub kvprobe_version: String,
    pub git_hash: Option<String>,
    pub model_path: String,
    pub model_sha256: String,
    pub model_architecture: String,
    /// "emulator" or "hailo".
    pub backend: String,
    pub hef_path: Option<String>,
    pub hef_sha256: Option<String>,
    pub sim_manifest: Option<SimManifest>,
    pub cache_len: usize,
    pub prefill_len: usize,
    pub prompt: String,
    pub prompt_ids: Vec<u32>,
    pub prompt_tokens: Vec<String>,
    pub timings: Vec<Timing>,
    /// e.g. "linux x86_64, 2 cpus".
    pub host: String,
    /// What a bug write-up needs of the runtime: e.g. `hailort`, `firmware`, `board`,
    /// `hef sdk`, `hef architecture` for a Hailo device; the emulator's name and version for an
    /// emulator. A value the device could not read says why instead of a version.
    #[serde(default)]
    pub versions: BTreeMap<String, String>,
}

/// Everything a run produced: the object of `results.json` and of `--json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Results {
    pub schema_version: u32,
    /// Which command produced it: "diagnose" or a single probe's name.
    pub command: String,
    /// `None` for a single probe.
    pub verdict: Option<Verdict>,
    pub confidence: Option<f64>,
    pub evidence: Vec<String>,
    /// Further root causes found besides the headline verdict.
    pub also: Vec<Verdict>,
    /// Observations that change no output (e.g. placement off with consistent windows).
    #[serde(default)]
    pub warnings: Vec<String>,
    /// Pipeline stage the stale/causality/splits probes point at (diagnose only; older
    /// results.json files have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<Stage>,
    /// The cause as a typed hypothesis: the rule that named it, its decisive lines, the fault
    /// the replay tested (diagnose only; schema 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hypothesis: Option<Hypothesis>,
    /// The emulator command that reproduces a fault verdict, and how close its replay came
    /// (diagnose only; schema 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reproducer: Option<Reproducer>,
    /// The device failure that ended a diagnosis before any verdict (exit 3): `verdict` is
    /// `None` and the findings are partial, the stages that ran before it (issue 35).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incomplete: Option<String>,
    pub probes: ProbeFindings,
    pub provenance: Provenance,
}
