//! A diagnosis the device ended: what ran before the failure, marked partial (a stateful
//! diagnosis, issue 35; any device's chat, [`after_chat_failure`]).
//!
//! The model builder's fp16 CPU export fails its first token run inside ONNX Runtime (a Cast
//! whose declared shape disagrees with what the graph computes), the run a GenAI user of that
//! folder fails too. The diagnosis then has no verdict to give, but the stage before the
//! failing step did run: the prompt's prefill. It is judged here on its own, from a reset, the
//! way the stateful rules judge it (against the f32 reference and, where the device declares a
//! lower precision the matched reference models, against that), and the failure closes the
//! evidence. The result is `incomplete`, never a verdict: exit 3, every output marked partial.

use kvprobe_npu::Origin;

use super::outcome::{timed, DiagnoseOptions, Diagnosis};
use super::stateful_facts::passes;
use crate::session::Session;
use crate::thresholds::PREFILL_TOP1;
use crate::{prefill, Error, Result};

/// The diagnosis that ended on `e`: a partial one when the device failed a run of a stateful
/// diagnosis (the error itself otherwise).
pub(super) fn after_failure(
    s: &mut Session,
    opts: &DiagnoseOptions,
    e: Error,
) -> Result<Diagnosis> {
    let failure = match &e {
        Error::Npu(f @ kvprobe_npu::Error::ByDevice { .. })
            if f.origin() == Origin::Device && s.dev.capabilities().stateful =>
        {
            f.to_string()
        }
        _ => return Err(e),
    };
    let mut d = Diagnosis::incomplete(failure.clone());
    let popts = prefill::PrefillOptions {
        max_rows: opts.prefill.max_rows.min(4),
    };
    match timed(&mut d.timings, "prefill", || prefill::run(s, &popts)) {
        Ok(pf) => {
            let f32 = [pf.mean_cosine, pf.min_cosine, pf.top1_agreement];
            let matched = crate::matched::models_everything(s.describe())
                .then(|| {
                    crate::matched::against_matched(
                        pf.rows
                            .iter()
                            .map(|r| (r.matched.as_ref(), r.comparison.device_top1)),
                    )
                })
                .flatten();
            let judged = matched.unwrap_or(f32);
            d.evidence.push(format!(
                "prefill (the stage before the failing step, rerun from a reset and judged alone): mean cosine {:.4} (min {:.4}, top-1 {:.0}%) against the f32 reference{}: {}",
                f32[0],
                f32[1],
                100.0 * f32[2],
                matched
                    .map(|m| format!(
                        ", {:.4} (min {:.4}, top-1 {:.0}%) against the precision-matched reference (the precision the device declares)",
                        m[0],
                        m[1],
                        100.0 * m[2]
                    ))
                    .unwrap_or_default(),
                if passes(judged, PREFILL_TOP1) {
                    "passes the prefill control"
                } else {
                    "fails the prefill control"
                }
            ));
            d.probes.prefill = Some(pf);
        }
        Err(Error::Npu(p)) if p.origin() == Origin::Device => d.evidence.push(format!(
            "prefill not judged: the device failed it too ({})",
            p.what_device_did()
        )),
        // anything else (the reference, the host) is no finding about the device: the
        // device's failure stays the run's end, as it was
        Err(_) => return Err(e),
    }
    d.evidence.push(format!(
        "stopped: {failure}; no verdict: the stages after it did not run (partial results)"
    ));
    Ok(d)
}

/// The diagnosis whose chat (the turn appended to the kept state, run only once every
/// single-request control passed) ended on `e`. A device that fails when a turn is appended has
/// not shown itself healthy, and the controls before it are no verdict on the appending, so the
/// result is `incomplete` with everything that ran kept, on any device; anything not caused by
/// the device stays the run's error.
pub(super) fn after_chat_failure(mut d: Diagnosis, e: Error) -> Result<Diagnosis> {
    let failure = match &e {
        Error::Npu(f) if f.origin() == Origin::Device => f.to_string(),
        _ => return Err(e),
    };
    d.evidence.push(format!(
        "stopped: {failure}, during the chat (the prompt, then a turn appended to the state it kept); every single-request control above passed, but no verdict: the device did not complete the chat (partial results)"
    ));
    d.verdict = kvprobe_schema::Verdict::Unknown;
    d.confidence = 0.0;
    d.hypothesis = None;
    d.reproducer = None;
    d.incomplete = Some(failure);
    Ok(d)
}
