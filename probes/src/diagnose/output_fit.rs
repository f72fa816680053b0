//! The wiring fit (`crate::wiring_fit`) on a stateful diagnosis's greedy run: the tbt steps the
//! device gave, against the reference recomputed under each hypothesis of how the host feeds the
//! runs after the prompt. Only run when the greedy control already failed (no verdict without a
//! failing control); rules `output-position` / `output-mask` of [`super::stateful`] read it.

use kvprobe_schema::GreedyFinding;

use crate::matched::Precision;
use crate::session::Session;
use crate::wiring_fit::{fit, healthy_and_precision, Rows, WiringFit, REQUEST};
use crate::Result;

/// Fits every request wiring to the greedy run `g` (whose device logits the session kept);
/// `graph_noise` is the cache-free controls' miss. `None` without tbt steps or kept logits.
pub fn run(s: &mut Session, g: &GreedyFinding, graph_noise: f64) -> Result<Option<WiringFit>> {
    let Some(dev) = s.compared.iter().find(|c| c.name == "greedy_device_logits") else {
        return Ok(None);
    };
    let steps = g.steps.len();
    let n = s.ids.len();
    if steps < 2 || n == 0 || dev.rows != steps || g.device_ids.len() < steps - 1 {
        return Ok(None);
    }
    let mut seq = s.ids.clone();
    seq.extend_from_slice(&g.device_ids[..steps - 1]);
    let layout = Rows {
        prompt: n,
        t: seq.len(),
        window: s.geometry().cache_len,
        turns: &[],
    };
    let tbt: Vec<_> = g.steps[1..].iter().collect();
    let rows: Vec<(usize, &[f32])> = (1..steps)
        .map(|k| (n - 1 + k, &dev.data[k * dev.cols..(k + 1) * dev.cols]))
        .collect();
    // where the jitter control ran, the hypotheses are replayed on the precision-matched
    // reference and judged at the jitter's band: the f32 reference charges a fault's own
    // hypothesis the declared precision's cost (QDQ `rope-offset`: position +1 at 5.7e-3 in f32)
    let desc = s.describe().clone();
    let matched = if crate::matched_jitter::applies(&desc) {
        Precision::of(&desc, s.model)?
    } else {
        None
    };
    s.progress.phase("output fit", 1);
    let out = fit(
        (s.model, matched.as_ref()),
        &seq,
        &layout,
        &REQUEST,
        &rows,
        healthy_and_precision(&tbt, graph_noise, matched.is_some()),
    );
    s.progress.inc(1);
    out
}
