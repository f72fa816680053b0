//! The compact text summary a run prints: the verdict and its evidence, or the summary lines of
//! the probe that ran, then the warnings.

use kvprobe_schema::Results;

use crate::sections;

pub fn text(r: &Results) -> String {
    let mut s = String::new();
    match r.verdict {
        Some(v) => {
            s += &format!(
                "verdict: {} (confidence {:.2})\n",
                v.name(),
                r.confidence.unwrap_or(0.0)
            );
            if !r.also.is_empty() {
                let also: Vec<&str> = r.also.iter().map(|v| v.name()).collect();
                s += &format!("also: {}\n", also.join(", "));
            }
            if let Some(st) = r.stage {
                s += &format!("stage (stale, causality, splits): {}\n", st.name());
            }
            for e in &r.evidence {
                s += &format!("  - {e}\n");
            }
        }
        // the probes' own lines only for a single probe: a verdict's evidence already says it
        None => s += &sections::summaries(r),
    }
    for w in &r.warnings {
        s += &format!("warning: {w}\n");
    }
    s
}
