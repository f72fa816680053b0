//! The wiring fit (`crate::wiring_fit`) on a stateful diagnosis's greedy run: the tbt steps the
//! device gave, against the reference recomputed under each hypothesis of how the host feeds the
//! runs after the prompt. Only run when the greedy control already failed (no verdict without a
//! failing control); rules `output-position` / `output-mask` of [`super::stateful`] read it.

use kvprobe_schema::GreedyFinding;

use crate::footing::Footing;
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
    // replayed and judged as the greedy control judged the device (`crate::footing`): on the f32
    // reference a fault's own hypothesis would pay the declared precision's cost that the healthy
    // one, on the matched reference, does not (QDQ `rope-offset`: position +1 at 5.7e-3 in f32)
    let footing = Footing::of(s)?;
    s.progress.phase("output fit", 1);
    let out = fit(
        (s.model, footing.matched.as_ref()),
        &seq,
        &layout,
        &REQUEST,
        &rows,
        healthy_and_precision(&tbt, graph_noise, footing.jitter()),
    );
    s.progress.inc(1);
    out
}
