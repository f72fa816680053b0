//! Attention-scale fit: a device output against references whose attention scale is multiplied
//! by `s`. A graph with another attention scale is matched at the device's healthy precision by
//! one `s ≠ 1`; a position shift or a mask variant mimics it only partly, and a wiring offset or
//! a wrong mask is matched by no scale, so the fit separates what the position and mask sweeps
//! confuse (docs/diagnosis.md). Two outputs are fitted: the first tbt step (server position,
//! ring mask; the tbt graph's scale) and the prompt's prefill (the prefill graph's scale).

use kvprobe_reference::{mask, GraphInput, GraphOptions, KvState, Model, PositionInput};
use kvprobe_schema::ScaleFit;

use crate::matched_fit::FirstTbt;
use crate::metrics::cosine;
use crate::session::window_step_with;
use crate::thresholds::FIT_MIN_GAIN;
use crate::Result;

/// Coarse grid 2^(k/8) for k = −8..=8 (×0.5 .. ×2), the range of scale bugs that a control does
/// not already catch outright.
const GRID_STEPS: i32 = 8;
/// Golden-section refinements (in log scale) around the best grid point: 0.618^6 of one grid
/// interval ≈ 1 % resolution on the multiplier.
const REFINE: usize = 6;

fn with_scale(log2s: f64) -> GraphOptions {
    GraphOptions {
        attn_scale: 2f64.powf(log2s) as f32,
        ..GraphOptions::default()
    }
}

/// The first tbt step: `token` at `position` over the last `window` entries of `state`;
/// `unit_reference` is the reference at the model's own scale (the caller has it).
pub fn tbt(
    model: &Model,
    state: &KvState,
    token: u32,
    position: usize,
    window: usize,
    device: &[f32],
    unit_reference: &[f32],
) -> Result<ScaleFit> {
    fit(device, unit_reference, |g| {
        Ok(window_step_with(model, state, token, position, window, g)?.0)
    })
}

/// [`tbt`] against the precision-matched reference's first tbt step (`matched_fit`): the
/// multiplier the graph computes with, where the f32 fit measures it times what the declared
/// precision does to the step. Returns (multiplier, cosine).
pub fn tbt_matched(first: &FirstTbt, device: &[f32]) -> Result<(f64, f64)> {
    let fit = fit(device, &first.logits(1.0)?, |g| first.logits(g.attn_scale))?;
    Ok((fit.best_scale, fit.best_cosine))
}

/// The prefill of `ids` at positions 0..n (its last row, what a genai prefill emits).
pub fn prefill(
    model: &Model,
    ids: &[u32],
    device: &[f32],
    unit_reference: &[f32],
) -> Result<ScaleFit> {
    let t = ids.len();
    let nh = model.config().n_heads;
    let hidden = model.embed(ids)?;
    let heads_mask = mask::per_head(&mask::causal(t), t, nh);
    fit(device, unit_reference, |graph| {
        Ok(model
            .run_graph(&GraphInput {
                hidden: hidden.clone(),
                positions: PositionInput::Ids((0..t).map(|p| p as f32).collect()),
                past: Vec::new(),
                mask: heads_mask.clone(),
                graph,
                last_only: true,
            })?
            .logits)
    })
}

/// Whether [`fit`] searches for `device` against `unit_reference`: not when the device is within
/// `FIT_MIN_GAIN` of it at ×1 (`positions` asks first, to run the matched search beside it).
pub(crate) fn searches(device: &[f32], unit_reference: &[f32]) -> bool {
    let unit = cosine(device, unit_reference);
    // (a cosine may pass 1 by rounding: keep a margin so the shortcut stays exact)
    let near = 1.0 - unit < FIT_MIN_GAIN - 1e-9;
    !near
}

/// Grid then golden-section search for the multiplier whose reference best matches `device`.
/// A device within `FIT_MIN_GAIN` of the reference at ×1 is left at ×1 alone: no multiplier can
/// then gain what `fit_repairs` asks, so the 24 forwards of the search could change no verdict
/// (at 1.5B they were a third of a healthy `diagnose`).
fn fit(
    device: &[f32],
    unit_reference: &[f32],
    reference: impl Fn(GraphOptions) -> Result<Vec<f32>> + Sync,
) -> Result<ScaleFit> {
    let eval = |log2s: f64| -> Result<f64> {
        if log2s == 0.0 {
            return Ok(cosine(device, unit_reference));
        }
        Ok(cosine(device, &reference(with_scale(log2s))?))
    };
    let unit = cosine(device, unit_reference);
    if !searches(device, unit_reference) {
        return Ok(ScaleFit {
            points: vec![(1.0, unit)],
            best_scale: 1.0,
            best_cosine: unit,
            unit_cosine: unit,
            against_matched: None,
        });
    }
    // The grid's forwards are independent: one per core (each a single-row forward, which uses
    // the second core only for its widest products); the same values in the same order.
    let mut points: Vec<(f64, f64)> = {
        use rayon::prelude::*;
        (-GRID_STEPS..=GRID_STEPS)
            .into_par_iter()
            .map(|k| {
                let x = f64::from(k) / f64::from(GRID_STEPS);
                Ok((x, eval(x)?))
            })
            .collect::<Result<_>>()?
    };
    let unit_cosine = points[GRID_STEPS as usize].1;
    let best_k = (0..points.len())
        .max_by(|&a, &b| points[a].1.total_cmp(&points[b].1))
        .unwrap_or(GRID_STEPS as usize);
    let (mut a, mut b) = (
        points[best_k.saturating_sub(1)].0,
        points[(best_k + 1).min(points.len() - 1)].0,
    );
    let phi = (5f64.sqrt() - 1.0) / 2.0;
    let mut c = b - phi * (b - a);
    let mut d = a + phi * (b - a);
    let (fc, fd) = rayon::join(|| eval(c), || eval(d));
    let (mut fc, mut fd) = (fc?, fd?);
    points.push((c, fc));
    points.push((d, fd));
    for _ in 0..REFINE {
        if fc >= fd {
            b = d;
            d = c;
            fd = fc;
            c = b - phi * (b - a);
            fc = eval(c)?;
            points.push((c, fc));
        } else {
            a = c;
            c = d;
            fc = fd;
            d = a + phi * (b - a);
            fd = eval(d)?;
            points.push((d, fd));
        }
    }
    let mut pts: Vec<(f64, f64)> = points.into_iter().map(|(x, c)| (2f64.powf(x), c)).collect();
    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (best_scale, best_cosine) = pts
        .iter()
        .copied()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap_or((1.0, unit_cosine));
    Ok(ScaleFit {
        points: pts,
        best_scale,
        best_cosine,
        unit_cosine,
        against_matched: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit_vs(miss_dims: f32) -> (Vec<f32>, Vec<f32>) {
        let reference: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut device = reference.clone();
        device[0] += miss_dims;
        (device, reference)
    }

    #[test]
    fn a_device_already_at_the_reference_runs_no_search() {
        let (device, reference) = unit_vs(0.0);
        let fit = fit(&device, &reference, |_| {
            Err(crate::Error::Input("no reference may run".into()))
        })
        .expect("no reference call");
        assert_eq!(fit.points.len(), 1);
        assert_eq!(fit.best_scale, 1.0);
        assert!(!crate::thresholds::fit_repairs(fit.unit_cosine, 1.0));
    }

    #[test]
    fn a_miss_a_fit_could_repair_runs_the_search() {
        let (device, reference) = unit_vs(3.0);
        assert!(1.0 - cosine(&device, &reference) > FIT_MIN_GAIN);
        // the grid runs its forwards in parallel: the count is atomic
        let calls = std::sync::atomic::AtomicUsize::new(0);
        let fit = fit(&device, &reference, |_| {
            calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok(reference.clone())
        })
        .expect("fit");
        let calls = calls.into_inner();
        assert_eq!(calls, 2 * GRID_STEPS as usize + 2 + REFINE);
        assert_eq!(fit.points.len(), calls + 1);
    }
}
