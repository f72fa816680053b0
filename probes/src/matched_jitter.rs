//! The jitter control (issue 34, the band question): how far a healthy device at the declared
//! precision may sit from the precision-matched reference on this prompt and model, measured per
//! run instead of assumed.
//!
//! A tbt step's band used to be the matched reference's own miss against f32 (the declared
//! precision's cost), which on a QDQ graph is larger than a RoPE fault (QDQ `rope-offset`,
//! `healthy`), while a floor band fails a healthy SmolLM2 int4 export, whose `accuracy_level` 4
//! turns ulp-level kernel differences into whole int8 steps (docs/diagnosis.md). Here the matched
//! reference is run again with every norm weight moved by ≤ 1 ulp of the declared arithmetic
//! (`Model::jittered`: the size by which two correct kernels of one op differ), and each step's
//! smallest cosine against the unmoved run is the spread a healthy device's own arithmetic may
//! add at that step: small where the graph is well conditioned (QDQ fixture, 1e-5), large where
//! the declared rounding amplifies an ulp (SmolLM2 int4's cactus step 4).

use kvprobe_reference::Model;
use kvprobe_schema::{DeclaredArithmetic, DeviceDescription, GreedyStep};

use crate::matched::{
    chunk_rows, greedy_logits, greedy_logits_shared, run_rows, DriveMemo, Precision, TBT,
};
use crate::matched_store::Store;
use crate::metrics::cosine;
use crate::Result;

/// Draws per run: two, so that one step's band is not one draw's luck (eight draws on SmolLM2
/// int4 put the matched miss at ≤ 1.4× their max and at 0.8 – 0.9× their median per row,
/// docs/diagnosis.md; two draws cost two more matched drives).
pub const DRAWS: u64 = 2;

/// The unit in the last place at 1 of the arithmetic the control covers (float32).
const F32_ULP: f32 = f32::EPSILON;

/// The matched reference computes every op the device declares in float32 (a host cache whose
/// rows it computes as declared): only there is its own miss against f32 a cost the device pays
/// as well, and only there is the spread under an ulp the healthy device's room. Elsewhere (fp16
/// graphs, rings, stateful devices, a host cache whose in-graph uint8 rounding it does not
/// compute) the band stays the declared precision's cost against f32.
pub fn applies(desc: &DeviceDescription) -> bool {
    crate::matched::models_everything(desc)
        && crate::matched::computes_prefill(desc)
        && matches!(desc.arithmetic, DeclaredArithmetic::Float32)
}

impl Precision {
    /// This precision with the model's norm weights moved by ≤ 1 ulp (`draw` seeds them).
    fn jittered(&self, model: &Model, draw: u64) -> Result<Precision> {
        let mut p = self.clone();
        let moved = self.model(model).jittered(draw, F32_ULP)?;
        p.weights = Some(std::sync::Arc::new(moved));
        p.overflow = Default::default();
        Ok(p)
    }
}

/// Per step of `base` (the matched reference's logits over `geometry`, as `greedy_logits`), the
/// smallest cosine of a jittered draw against it.
fn spread(
    model: &Model,
    p: &Precision,
    seq: &[u32],
    (n, steps, cache_len, prefill_len): (usize, usize, usize, usize),
    base: &[Vec<f32>],
) -> Result<Vec<f64>> {
    let mut worst = vec![1.0f64; base.len()];
    for draw in 1..=DRAWS {
        let j = p.jittered(model, draw)?;
        let logits = greedy_logits(model, &j, seq, n, steps, cache_len, prefill_len)?;
        for (w, (a, b)) in worst.iter_mut().zip(logits.iter().zip(base)) {
            *w = w.min(cosine(a, b));
        }
    }
    Ok(worst)
}

/// Sets `matched.jitter` on every greedy step that has a matched comparison, where [`applies`]:
/// the matched logits come from this session's memo (`three_way` drove them), the draws are new.
pub fn fill_steps(
    (model, memo): (&Model, &DriveMemo),
    desc: &DeviceDescription,
    seq: &[u32],
    n: usize,
    steps: &mut [GreedyStep],
) -> Result<()> {
    let positions: Vec<usize> = (0..steps.len()).map(|k| n.saturating_sub(1) + k).collect();
    fill_steps_at((model, memo), desc, (seq, n), &positions, steps)
}

/// [`fill_steps`] for steps compared at `positions` only (rising, each ≥ `n − 1`: a chat's rows,
/// as `matched::three_way_at` compares them): the prompt of `n` tokens of `seq`, then one row at
/// a time up to the last position.
pub fn fill_steps_at(
    (model, memo): (&Model, &DriveMemo),
    desc: &DeviceDescription,
    (seq, n): (&[u32], usize),
    positions: &[usize],
    steps: &mut [GreedyStep],
) -> Result<()> {
    if !applies(desc) || steps.iter().all(|s| s.matched.is_none()) {
        return Ok(());
    }
    let Some(p) = Precision::of(desc, model)? else {
        return Ok(());
    };
    let rows = positions
        .last()
        .map_or(0, |&last| (last + 2).saturating_sub(n));
    let geometry = (n, rows, desc.cache_len, desc.prefill_len);
    let base = greedy_logits_shared((memo, model), &p, seq, geometry)?;
    let worst = spread(model, &p, seq, geometry, &base)?;
    for (st, &pos) in steps.iter_mut().zip(positions) {
        let row = (pos + 1).checked_sub(n).and_then(|k| worst.get(k));
        if let (Some(m), Some(&w)) = (st.matched.as_mut(), row) {
            m.jitter = Some(w);
        }
    }
    Ok(())
}

/// Per row of `base` (the matched reference's `chunk_rows` of `ids`), the smallest cosine of a
/// jittered draw against it: the prefill rows' band under the control.
pub fn row_spread(
    model: &Model,
    p: &Precision,
    ids: &[u32],
    base: &[Vec<f32>],
) -> Result<Vec<f64>> {
    let mut worst = vec![1.0f64; base.len()];
    for draw in 1..=DRAWS {
        let rows = chunk_rows(model, &p.jittered(model, draw)?, ids)?;
        for (w, (a, b)) in worst.iter_mut().zip(rows.iter().zip(base)) {
            *w = w.min(cosine(a, b));
        }
    }
    Ok(worst)
}

/// The matched reference's logits of one tbt row per `(token, position)` that sees only itself
/// (no stored keys), where [`applies`]: the self-only controls' healthy hypothesis at the
/// declared precision.
pub fn self_only(
    model: &Model,
    desc: &DeviceDescription,
    rows: &[(u32, usize)],
) -> Result<Option<Vec<Vec<f32>>>> {
    if !applies(desc) {
        return Ok(None);
    }
    let Some(p) = Precision::of(desc, model)? else {
        return Ok(None);
    };
    let m = p.model(model);
    let mut out = Vec::with_capacity(rows.len());
    for &(token, pos) in rows {
        let seq = vec![token; pos + 1];
        let mut store = Store::new(m);
        out.push(run_rows(
            m,
            &p,
            &mut store,
            (&seq, None),
            pos..pos + 1,
            pos,
            TBT,
            1.0,
        )?);
    }
    Ok(Some(out))
}
