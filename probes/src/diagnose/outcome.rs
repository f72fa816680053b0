//! What `diagnose` takes and gives, shared by every runtime's orchestration.

use std::time::Instant;

use std::sync::Arc;

use kvprobe_schema::{Hypothesis, ProbeFindings, Reproducer, Stage, Timing, Verdict};

use super::engine::Conclusion;
use super::replayer::Replayer;
use crate::capacity_record::CapacityEvidence;
use crate::colmap::ColmapOptions;
use crate::prefill::PrefillOptions;
use crate::Result;

/// Reference tokens `diagnose` decodes past the first divergence for the report's text.
pub(crate) const REFERENCE_TAIL: usize = 8;

#[derive(Debug, Clone)]
pub struct DiagnoseOptions {
    /// Greedy steps (generated tokens, the prefill token included).
    pub steps: usize,
    pub selfmask_steps: usize,
    pub prefill: PrefillOptions,
    pub colmap: ColmapOptions,
    /// Test/research switch: hide every named-fault rule, so only the stale, causality and
    /// splits probes decide and the verdict carries a stage (`diagnose::stage`).
    pub stage_only: bool,
    /// Run `layout --infer`, stale, causality and splits even when a rule already settled the
    /// verdict (their evidence, artefacts and stage join the named verdict, which they do not
    /// change).
    pub all_probes: bool,
    /// Builds the emulator the verdict's hypothesis is replayed on (the CLI, which knows how the
    /// device was opened); `None`: no replay, and the verdict says so.
    pub replay: Option<Arc<dyn Replayer>>,
}

impl Default for DiagnoseOptions {
    fn default() -> Self {
        DiagnoseOptions {
            steps: 16,
            selfmask_steps: 4,
            prefill: PrefillOptions { max_rows: 6 },
            colmap: ColmapOptions::default(),
            stage_only: false,
            all_probes: false,
            replay: None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Diagnosis {
    pub verdict: Verdict,
    pub confidence: f64,
    pub evidence: Vec<String>,
    pub also: Vec<Verdict>,
    pub warnings: Vec<String>,
    pub probes: ProbeFindings,
    pub timings: Vec<Timing>,
    /// Pipeline stage from the stale/causality/splits probes (on `unknown`, or `stage_only`).
    pub stage: Option<Stage>,
    /// The cause as a typed hypothesis (the rule, its decisive lines, the replayed fault).
    pub hypothesis: Option<Hypothesis>,
    /// The replay's command and how close it came (fault verdicts).
    pub reproducer: Option<Reproducer>,
    /// The device failure that ended the diagnosis before a verdict (`partial.rs`): the
    /// findings are the stages that ran before it, and `verdict` means nothing.
    pub incomplete: Option<String>,
    /// The capacity check that decided the verdict, with the device's answers: what the
    /// verdict's replays are judged on (`capacity_replay`). Not written to results.json.
    pub capacity: Option<CapacityEvidence>,
}

impl Diagnosis {
    /// The engine's conclusion with the findings and timings of the probes that ran.
    pub(crate) fn from_rules(c: Conclusion, probes: ProbeFindings, timings: Vec<Timing>) -> Self {
        let hypothesis = c.rule.map(|rule| Hypothesis {
            rule: rule.to_string(),
            decisive: c.decisive.clone(),
            fault: None,
        });
        Diagnosis {
            verdict: c.verdict,
            confidence: c.confidence,
            evidence: c.evidence,
            also: c.also,
            warnings: c.warnings,
            probes,
            timings,
            stage: None,
            hypothesis,
            reproducer: None,
            incomplete: None,
            capacity: None,
        }
    }

    /// A diagnosis the device ended with `failure`: no verdict, findings to be added.
    pub(crate) fn incomplete(failure: String) -> Self {
        Diagnosis {
            verdict: Verdict::Unknown,
            confidence: 0.0,
            evidence: Vec::new(),
            also: Vec::new(),
            warnings: Vec::new(),
            probes: ProbeFindings::default(),
            timings: Vec::new(),
            stage: None,
            hypothesis: None,
            reproducer: None,
            incomplete: Some(failure),
            capacity: None,
        }
    }
}

/// Runs `f` and records its wall time under `what` (every diagnosis path's timings).
pub(crate) fn timed<T>(
    timings: &mut Vec<Timing>,
    what: &str,
    f: impl FnOnce() -> Result<T>,
) -> Result<T> {
    let t = Instant::now();
    let r = f()?;
    timings.push(Timing {
        what: what.into(),
        seconds: t.elapsed().as_secs_f64(),
    });
    Ok(r)
}
