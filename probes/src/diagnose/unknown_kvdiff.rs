//! An `unknown` on a stateful device still says where its cache first goes wrong (issue 35).
//!
//! A cause's verdict carries kvdiff's first divergent layer (`stateful.rs` `cache_kvdiff`); an
//! `unknown` did not, so a graph that writes one layer's cache wrong in a way no rule names (the
//! builder exports' graph-level faults: a present written in another layout, a K/V pair swapped
//! on one layer) ended with no layer at all. The evidence that is left to give is the layer where
//! the device's cache first leaves the reference's, so kvdiff runs on every stateful `unknown`
//! whose states can be read. It names no cause and changes no verdict.

use kvprobe_schema::{KvdiffFinding, Timing, Verdict};

use super::outcome::{timed, Diagnosis};
use crate::session::Session;
use crate::Result;

/// Runs kvdiff on a stateful `unknown` that has none yet, and records it like a cause's.
pub(super) fn attach(s: &mut Session, d: &mut Diagnosis) -> Result<()> {
    let caps = s.dev.capabilities();
    if d.verdict != Verdict::Unknown
        || d.probes.kvdiff.is_some()
        || !caps.stateful
        || !caps.read_cache
    {
        return Ok(());
    }
    let (k, line) = run_for_evidence(s, &mut d.timings)?;
    d.evidence.push(match &k {
        Some(_) => format!(
            "{line} (on an unknown: where the cache first leaves the reference, no cause named)"
        ),
        None => line,
    });
    d.probes.kvdiff = k;
    Ok(())
}

/// kvdiff as diagnose's evidence (a cause's, `stateful.rs`, and an unknown's): the finding and
/// its line, or the line saying why it did not run.
pub(super) fn run_for_evidence(
    s: &mut Session,
    timings: &mut Vec<Timing>,
) -> Result<(Option<KvdiffFinding>, String)> {
    let opts = crate::kvdiff::KvdiffOptions {
        steps: crate::kvdiff::DIAGNOSE_STEPS,
    };
    match timed(timings, "kvdiff", || crate::kvdiff::run(s, &opts)) {
        Ok(k) => {
            let line = crate::kvdiff::verdict_line(&k);
            Ok((Some(k), line))
        }
        // a cache kvdiff cannot compare (ONNX windowed): said, not fatal
        Err(crate::Error::Input(why)) => Ok((None, format!("kvdiff not run: {why}"))),
        // the device failed a request the verdict already explains (a stale state running out
        // of context): evidence beside the verdict, not the run's end
        Err(crate::Error::Npu(e)) if e.origin() == kvprobe_npu::Origin::Device => {
            Ok((None, format!("kvdiff not run: {}", e.what_device_did())))
        }
        Err(e) => Err(e),
    }
}
