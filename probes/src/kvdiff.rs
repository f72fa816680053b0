//! `kvdiff` (issue 20): after the prefill and after each greedy step, the device's K/V cache
//! against the reference per layer × KV head × position — relative L2 and cosine — and the
//! first layer (and head) whose cache leaves the band its declared precision allows. What
//! engineers do by hand when they bisect to "a sharp break inside layer 0" (seed 000).
//!
//! Three references: the device's cache ([`crate::kvdiff_cache`]), the f32 reference on the
//! device's own tokens (one windowed forward with K/V taps, as `greedy` compares logits), and
//! the precision-matched reference ([`crate::matched::drive`]), driven as the runtime drives
//! the device. The band comes from the matched one ([`crate::kvdiff_compare`]), so a healthy
//! quantised cache stays inside it.
//!
//! Ring bytes are decoded through the writer layout the description names (token-major where it
//! names none); when the first layer's V — a function of the token alone — leaves its band under
//! that layout, `layout --infer` solves the writer's map and, if it is a named layout, the rings
//! are decoded again through it (said in `layout`).

use kvprobe_npu::MaskMode;
use kvprobe_reference::{ForwardOptions, Model};
use kvprobe_schema::{
    CacheKind, DeviceDescription, KvdiffFinding, KvdiffRotation, KvdiffStep, RuntimeKind,
};

use crate::cache_io;
use crate::kvdiff_cache::{CacheView, KvRef, Rows};
use crate::kvdiff_compare::{self as cmp, Cells, Point, Rounding};
use crate::matched::Precision;
use crate::matched_store::drive_shared;
use crate::metrics::top1;
use crate::rings::cache_infos;
use crate::session::Session;
use crate::{layout_infer, Error, Result};

/// fp16's unit roundoff (2⁻¹¹) and f32's (2⁻²⁴).
const FP16_ROUNDOFF: f64 = 4.8828125e-4;
const F32_ROUNDOFF: f64 = 5.960464477539063e-8;

/// Comparison points `diagnose` asks for on a cache-path verdict: the prefill and 7 greedy steps
/// (bounded so diagnose stays within its time budget).
pub const DIAGNOSE_STEPS: usize = 8;

/// The evidence line `diagnose` adds to a cache-path verdict (and a stateful `unknown`).
pub fn verdict_line(k: &KvdiffFinding) -> String {
    format!(
        "kvdiff (run for cache-path verdicts and unknowns; the prefill and {} greedy steps): {}",
        k.steps.len().saturating_sub(1),
        k.evidence()
    )
}

#[derive(Debug, Clone, Copy)]
pub struct KvdiffOptions {
    /// Comparison points: the prefill plus `steps − 1` greedy steps (at least 1).
    pub steps: usize,
}

/// The device side: each point's K/V rows and the device's tokens.
struct DeviceRun {
    points: Vec<(Rows, Rows)>,
    ids: Vec<u32>,
}

pub fn run(s: &mut Session, opts: &KvdiffOptions) -> Result<KvdiffFinding> {
    let steps = opts.steps.max(1);
    if steps > 1 {
        s.require_tbt("kvdiff")?;
    }
    let desc = s.describe().clone();
    let c = s.model.config().clone();
    let n = s.ids.len();
    // a stateful device stops at its context (a ring wraps)
    let steps = match desc.runtime {
        RuntimeKind::GenaiRing => steps,
        _ => steps.min(desc.cache_len.saturating_sub(n)).max(1),
    };
    s.progress.phase("kvdiff", steps as u64 + 2);
    let mut view = CacheView::of(&desc)?;
    let mut dev = device_run(s, &view, steps)?;
    let mut seq = s.ids.clone();
    seq.extend_from_slice(&dev.ids[..steps - 1]);
    let reference = reference_rows(s.model, &seq, desc.cache_len)?;
    s.progress.inc(1);
    let rounding = rounding(&desc, c.n_layers)?;
    let (n_kv, hd) = (c.n_kv_heads, c.head_dim);
    let cells_of = |dev: &(Rows, Rows), m: KvRef| -> Cells {
        cmp::cells(&Point {
            device: (&dev.0, &dev.1),
            reference: (&reference.0, &reference.1),
            matched: m,
            rounding: &rounding,
            n_kv,
            head_dim: hd,
        })
    };
    let mut layout_note = None;
    if matches!(view, CacheView::Ring { .. })
        && first_layer_v_outside(&cells_of(&dev.points[0], (&reference.0, &reference.1)))
    {
        // V of the first layer is a function of its token: out of its band under the named
        // layout, the bytes may sit in another order; ask the bytes.
        let solved = layout_infer::run(s)?;
        layout_note = Some(solved.evidence());
        let named = solved
            .caches
            .iter()
            .filter(|x| x.explained)
            .find_map(|x| x.named.filter(|_| x.shift == 0));
        if let Some(layout) = named {
            view.set_layout(layout);
            dev = device_run(s, &view, steps)?;
        }
    }
    let mut out_steps: Vec<KvdiffStep> = Vec::with_capacity(steps);
    let mut last_cells = None;
    let mut rotation = None;
    let mut rotation_k_out = false;
    let shared = (s.model, &s.matched_runs);
    each_matched(shared, &desc, &seq, n, steps, &mut |k, (mk, mv)| {
        let point = &dev.points[k];
        let cells = cells_of(point, (mk, mv));
        // the prefill's cache, or else the first step whose layer-0 K leaves its band: a tbt
        // graph that rotates K wrongly writes only the steps' entries wrong
        let k_out = cmp::first_layer_k_outside(&cells);
        if k == 0 || (!rotation_k_out && k_out) {
            rotation_k_out = k_out;
            rotation = cmp::first_layer_rotation(
                &Point {
                    device: (&point.0, &point.1),
                    reference: (&reference.0, &reference.1),
                    matched: (mk, mv),
                    rounding: &rounding,
                    n_kv,
                    head_dim: hd,
                },
                &cells,
            )
            .map(|r| KvdiffRotation { step: k, ..r });
        }
        out_steps.push(cmp::step(k, &cells));
        last_cells = Some(cells);
        Ok(())
    })?;
    s.progress.inc(1);
    let (k_map, v_map, outside_map) = last_cells.as_ref().map(cmp::maps).unwrap_or_default();
    let layout = match layout_note {
        Some(note) => format!(
            "{}; the first layer's V left its band under the named layout, so `layout --infer` ran: {note}",
            view.layout(&desc)
        ),
        None => view.layout(&desc),
    };
    Ok(KvdiffFinding {
        source: view.source(),
        layout,
        precision: precision_line(s.model, &desc),
        layers: c.n_layers,
        kv_heads: n_kv,
        prompt_len: n,
        first_divergent: cmp::first_over_steps(&out_steps),
        steps: out_steps,
        k_map,
        v_map,
        outside_map,
        first_layer_rotation: rotation,
    })
}

fn first_layer_v_outside(c: &Cells) -> bool {
    c.first()
        .is_some_and(|l| l[1].iter().any(|h| cmp::head_outside(h)))
}

/// Prefill, then tbt steps on the device's own argmax (as the server), reading the cache after
/// each.
fn device_run(s: &mut Session, view: &CacheView, steps: usize) -> Result<DeviceRun> {
    let n = s.ids.len();
    let layers = s.model.config().n_layers;
    let out = s.prefill_prompt()?;
    let mut ids = vec![top1(&out.logits)];
    let rings = cache_io::read(s.dev, "after the prompt's prefill (kvdiff probe)")?;
    let mut points = vec![view.rows(&rings, layers, n, n - 1)?];
    s.progress.inc(1);
    for step in 1..steps {
        let o = s.driver.step(s.dev, ids[step - 1], &MaskMode::Ring)?;
        ids.push(top1(&o.logits));
        let rings = cache_io::read(s.dev, &format!("after decode step {step} (kvdiff probe)"))?;
        points.push(view.rows(&rings, layers, n, n - 1 + step)?);
    }
    Ok(DeviceRun { points, ids })
}

/// The f32 reference's K/V of every position of `seq`, each row seeing the last `L` positions
/// (the window a ring leaves a tbt step; contract §2.9), `[layer][position]` rows.
fn reference_rows(model: &Model, seq: &[u32], l: usize) -> Result<(Rows, Rows)> {
    let t = seq.len();
    let mask: Vec<bool> = (0..t * t)
        .map(|k| (k % t) <= (k / t) && (k / t) - (k % t) < l)
        .collect();
    let out = model.forward(
        seq,
        &ForwardOptions {
            mask: Some(mask),
            taps: true,
            ..Default::default()
        },
    )?;
    let taps = out
        .taps
        .ok_or_else(|| Error::Candle("reference forward returned no K/V taps".into()))?;
    let rows = |x: &candle_core::Tensor| -> Result<Vec<Vec<f32>>> {
        let (h, n, d) = x.dims3()?;
        let flat: Vec<f32> = x.flatten_all()?.to_vec1()?;
        Ok((0..n)
            .map(|p| {
                (0..h)
                    .flat_map(|hh| flat[(hh * n + p) * d..(hh * n + p + 1) * d].iter().copied())
                    .collect()
            })
            .collect())
    };
    let mut k = Vec::with_capacity(taps.len());
    let mut v = Vec::with_capacity(taps.len());
    for layer in &taps {
        k.push(rows(&layer.k)?);
        v.push(rows(&layer.v)?);
    }
    Ok((k, v))
}

/// The precision-matched reference's K/V at every comparison point (the f32 reference where the
/// device declares an f32 path everywhere): `each(point, (k, v))`, rows of every position so far
/// (the comparison reads those the device's cache still holds).
fn each_matched(
    (model, memo): (&Model, &crate::matched::DriveMemo),
    desc: &DeviceDescription,
    seq: &[u32],
    n: usize,
    steps: usize,
    each: &mut dyn FnMut(usize, KvRef) -> Result<()>,
) -> Result<()> {
    match Precision::of(desc, model)? {
        Some(p) => {
            let mut step = 0;
            let geometry = (n, steps, desc.cache_len, desc.prefill_len);
            // greedy drove the same prompt and (most often) the same tokens: shared
            let shared = (memo, model);
            drive_shared(shared, &p, seq, geometry, &mut |_, k, v| {
                each(step, (k, v))?;
                step += 1;
                Ok(())
            })
        }
        None => {
            let (k, v) = reference_rows(model, seq, desc.cache_len)?;
            (0..steps).try_for_each(|step| each(step, (&k, &v)))
        }
    }
}

/// Per layer, the rounding of the cache's declared format: a ring's writer scale (integer
/// codes) or float elements; fp16 for stateful states and for the host cache as
/// `cache_buffers()` shows it.
pub(crate) fn rounding(desc: &DeviceDescription, n_layers: usize) -> Result<Vec<[Rounding; 2]>> {
    match desc.runtime {
        RuntimeKind::Stateful => {
            // every layer's fp16 arithmetic adds an independent error of that size to the
            // residual stream the next layers' K/V are projected from
            let r = fp16_graph(desc);
            return Ok((0..n_layers)
                .map(|l| [Rounding::Arithmetic(r * ((l + 1) as f64).sqrt()); 2])
                .collect());
        }
        RuntimeKind::HostCache => {
            // a quantised (windowed) cache's codes step by their declared scale; the fp16 view
            // `cache_buffers()` gives of them adds far less
            let mut out = vec![[Rounding::Relative(FP16_ROUNDOFF); 2]; n_layers];
            for e in desc.groups.iter().flat_map(|g| &g.cache_edges) {
                let (Some(layer), Some(kind)) = (e.layer, e.kind) else {
                    continue;
                };
                if let Some(slot) = out.get_mut(layer) {
                    if e.quant != kvprobe_schema::QuantInfo::IDENTITY {
                        slot[usize::from(kind == CacheKind::V)] =
                            Rounding::Step(e.quant.scale.abs() as f64);
                    }
                }
            }
            return Ok(out);
        }
        RuntimeKind::GenaiRing => {}
    }
    let mut out = vec![[Rounding::Relative(F32_ROUNDOFF); 2]; n_layers];
    for info in cache_infos(desc)? {
        if let Some(slot) = out.get_mut(info.layer) {
            slot[usize::from(info.kind == CacheKind::V)] = match info.elem_bytes {
                1 | 2 => Rounding::Step(info.writer_quant().scale.abs() as f64),
                _ => Rounding::Relative(F32_ROUNDOFF),
            };
        }
    }
    Ok(out)
}

/// A stateful device computes in fp16 (weights and activations; the matched reference rounds
/// only what crosses its edges): a K or V element is a dot product of `hidden` fp16 terms, whose
/// rounding moves it by about 2u·√(hidden/3) of the vector (u = 2⁻¹¹ on each factor, `hidden`
/// terms adding in quadrature against a result √hidden smaller than the sum of their sizes).
fn fp16_graph(desc: &DeviceDescription) -> f64 {
    2.0 * FP16_ROUNDOFF * (desc.shape.hidden_size as f64 / 3.0).sqrt()
}

fn precision_line(model: &Model, desc: &DeviceDescription) -> String {
    let matched = match Precision::of(desc, model) {
        Ok(Some(p)) => p.describe,
        Ok(None) => "no lower precision declared: the f32 reference is the matched one".into(),
        Err(e) => format!("the declared precision could not be modelled ({e})"),
    };
    let format = match desc.runtime {
        RuntimeKind::Stateful => format!(
            "the fp16 graph's K/V projections, {:.4} relative at layer 0, × √(layer + 1) after it",
            fp16_graph(desc)
        ),
        RuntimeKind::HostCache => "fp16 as cache_buffers() shows the f32 host cache".into(),
        RuntimeKind::GenaiRing => "the cache format's rounding".into(),
    };
    format!(
        "band per head vector = max(precision-matched vs f32, {format}) — {matched}; outside = {}× the band on the mean, or at ≥ {:.0}% of the positions",
        cmp::BAND_RATIO,
        100.0 * cmp::OUTSIDE_FRACTION
    )
}

/// `kvprobe kvdiff`.
pub struct KvdiffProbe;

impl crate::probe::Probe for KvdiffProbe {
    fn name(&self) -> &'static str {
        "kvdiff"
    }

    fn about(&self) -> &'static str {
        "The device's K/V cache against the reference per layer × KV head × position, after the prefill and each greedy step: the first layer leaving its precision band"
    }

    fn run(
        &self,
        s: &mut crate::session::Session,
        opts: &crate::probe::ProbeOptions,
        into: &mut kvprobe_schema::ProbeFindings,
    ) -> Result<()> {
        into.kvdiff = Some(run(s, &KvdiffOptions { steps: opts.steps })?);
        Ok(())
    }
}
