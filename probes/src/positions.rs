//! `positions`: the first tbt step with its positional input at `pos + δ`, δ ∈ [−4, 4]. If some
//! δ ≠ 0 reproduces the reference at `pos`, the tbt graph's positions are wired δ off.
//!
//! The genai driver always sends the server's positions (contract §2.6); the sweep runs every δ as
//! one [`kvprobe_npu::Driver::trial_batch`] whose trials carry a position shift, which moves only
//! the positional inputs. [`PositionShift`] does the same by rewriting a single run's `pe_*` (or
//! position-ids) inputs at the device; it is kept as the independent check of the batched path.

use std::collections::BTreeMap;

use kvprobe_npu::{Buffer, Device, MaskMode, RopeTheta, RunOutput, Trial};
use kvprobe_schema::{
    DeviceDescription, GroupKind, InputRole, PositionPoint, PositionsFinding, ThetaCheck,
};

use crate::matched_fit::FirstTbt;
use crate::metrics::{compare, summarise};
use crate::session::Session;
use crate::Result;

pub const DELTAS: std::ops::RangeInclusive<i64> = -4..=4;

/// A device whose tbt runs get their positional inputs recomputed for `position`.
pub struct PositionShift<'d> {
    pub inner: &'d mut dyn Device,
    pub position: f64,
    names: BTreeMap<String, InputRole>,
}

impl<'d> PositionShift<'d> {
    pub fn new(inner: &'d mut dyn Device, position: f64) -> Self {
        let names = inner
            .describe()
            .group(GroupKind::Tbt)
            .map(|g| {
                g.inputs
                    .iter()
                    .filter_map(|i| i.role.map(|r| (i.name.clone(), r)))
                    .collect()
            })
            .unwrap_or_default();
        PositionShift {
            inner,
            position,
            names,
        }
    }

    fn rewrite(&self, name: &str, buf: &Buffer) -> Option<Buffer> {
        let role = *self.names.get(name)?;
        let s = &self.inner.describe().shape;
        let trig = |heads: usize, sin: bool| -> Option<Buffer> {
            let theta = s.rope_theta.as_ref()?;
            let row: Vec<f32> = theta
                .iter()
                .map(|&t| {
                    let a = t as f64 * self.position;
                    (if sin { a.sin() } else { a.cos() }) as f32
                })
                .collect();
            Some(Buffer::F32(
                row.iter()
                    .copied()
                    .cycle()
                    .take(row.len() * heads)
                    .collect(),
            ))
        };
        let out = match role {
            InputRole::PeQCos => trig(s.n_heads, false),
            InputRole::PeQSin => trig(s.n_heads, true),
            InputRole::PeKCos => trig(s.n_kv_heads, false),
            InputRole::PeKSin => trig(s.n_kv_heads, true),
            InputRole::PositionIds => Some(Buffer::F32(vec![self.position as f32])),
            _ => None,
        }?;
        // Only replace a buffer of the same size (a device with another layout is left alone).
        (out.len() == buf.len()).then_some(out)
    }
}

impl Device for PositionShift<'_> {
    fn describe(&self) -> &DeviceDescription {
        self.inner.describe()
    }
    fn capabilities(&self) -> kvprobe_npu::Capabilities {
        self.inner.capabilities()
    }
    fn run(
        &mut self,
        group: GroupKind,
        inputs: &[(String, Buffer)],
    ) -> kvprobe_npu::Result<RunOutput> {
        if group != GroupKind::Tbt {
            return self.inner.run(group, inputs);
        }
        let rewritten: Vec<(String, Buffer)> = inputs
            .iter()
            .map(|(n, b)| (n.clone(), self.rewrite(n, b).unwrap_or_else(|| b.clone())))
            .collect();
        self.inner.run(group, &rewritten)
    }
    fn init_cache(&mut self, read_offset: u32) -> kvprobe_npu::Result<()> {
        self.inner.init_cache(read_offset)
    }
    fn update_cache_offset(&mut self, delta: i32) -> kvprobe_npu::Result<()> {
        self.inner.update_cache_offset(delta)
    }
    fn cache_buffers(&mut self) -> kvprobe_npu::Result<BTreeMap<u32, Vec<u8>>> {
        self.inner.cache_buffers()
    }
    fn write_cache_buffer(&mut self, cache_id: u32, bytes: &[u8]) -> kvprobe_npu::Result<()> {
        self.inner.write_cache_buffer(cache_id, bytes)
    }
}

pub fn run(s: &mut Session) -> Result<PositionsFinding> {
    s.require_tbt("positions")?;
    s.progress.phase("positions", DELTAS.count() as u64 + 1);
    let first = s.first_step()?;
    s.progress.inc(1);
    let pos = first.position as i64;
    // All shifts in one batched run: a trial's position shift moves only its positional inputs,
    // exactly what `PositionShift` does to a single run.
    let deltas: Vec<i64> = DELTAS.filter(|d| pos + d >= 0).collect();
    let trials: Vec<Trial> = deltas
        .iter()
        .map(|&d| Trial {
            token: first.query,
            mode: MaskMode::Ring,
            position_shift: d,
        })
        .collect();
    let outs = s.driver.trial_batch(s.dev, &trials)?;
    s.progress.inc(trials.len() as u64);
    let points: Vec<PositionPoint> = deltas
        .iter()
        .zip(&outs)
        .map(|(&delta, out)| PositionPoint {
            delta,
            comparison: compare(&out.logits, &first.reference),
        })
        .collect();
    let baseline_cosine = points
        .iter()
        .find(|p| p.delta == 0)
        .map_or(0.0, |p| p.comparison.cosine);
    let best = points
        .iter()
        .max_by(|a, b| {
            a.comparison
                .cosine
                .total_cmp(&b.comparison.cosine)
                .then(b.delta.abs().cmp(&a.delta.abs()))
        })
        .map_or((0, 0.0), |p| (p.delta, p.comparison.cosine));
    // the server-position output against other attention scales (scalefit)
    let scale = match deltas.iter().position(|&d| d == 0) {
        Some(i) => {
            let prompt = s.prompt_ref()?;
            let (state, n, device) = (&prompt.state, first.position, &outs[i].logits);
            let (query, reference) = (first.query, &first.reference);
            let desc = s.describe().clone();
            let (model, memo, ids) = (s.model, &s.matched_runs, &s.ids);
            let f32_fit = || crate::scalefit::tbt(model, state, query, n, n, device, reference);
            // the same search against the healthy hypothesis at the declared precision, when
            // the f32 one searches (a device at f32's precision has nothing to fit): both at
            // once, each search's forwards one after the other only where they must be
            let matched_fit = || -> Result<Option<(f64, f64)>> {
                if !crate::scalefit::searches(device, reference) {
                    return Ok(None);
                }
                match FirstTbt::of((model, memo), &desc, ids, query)? {
                    Some(m) => Ok(Some(crate::scalefit::tbt_matched(&m, device)?)),
                    None => Ok(None),
                }
            };
            let (fit, matched) = rayon::join(f32_fit, matched_fit);
            let mut fit = fit?;
            if fit.points.len() > 1 {
                fit.against_matched = matched?;
            }
            Some(fit)
        }
        None => None,
    };
    Ok(PositionsFinding {
        points,
        best_delta: best.0,
        best_cosine: best.1,
        baseline_cosine,
        scale,
    })
}

/// Prefix lengths of the theta check: single-chunk prefixes (they read no cache, so only the
/// graph's own rotation decides them), longest first.
const THETA_ROWS: usize = 3;

/// Single-chunk prefill rows with the device's theta table and with the same table in the other
/// sign convention; `None` for a device without a theta table (learned positions). The
/// `positions` command runs it after the sweep, `diagnose` on its own where those rows fail.
pub fn theta_check(s: &mut Session) -> Result<Option<ThetaCheck>> {
    let Some(declared) = s.driver.rope_theta().map(<[f32]>::to_vec) else {
        return Ok(None);
    };
    let g = s.geometry();
    let longest = g.prompt_len.min(g.prefill_len);
    // Position 0's rotation is the identity in both conventions: rows start at 2 tokens.
    let mut ks: Vec<usize> = [longest, longest.div_ceil(2), 2]
        .into_iter()
        .filter(|&k| k >= 2 && k <= longest)
        .collect();
    ks.dedup();
    ks.truncate(THETA_ROWS);
    if ks.is_empty() {
        return Ok(None);
    }
    let convention = RopeTheta::of_table(&declared);
    let other = convention.other().table(&declared);
    let reference = s.prompt_ref()?;
    let ids = s.ids.clone();
    let rows = |s: &mut Session| -> Result<f64> {
        let mut cmp = Vec::with_capacity(ks.len());
        for &k in &ks {
            let out = s.prefill(&ids[..k])?;
            cmp.push(compare(&out.logits, reference.row(k - 1)));
        }
        Ok(summarise(cmp.iter()).0)
    };
    let declared_cosine = rows(s)?;
    s.driver.replace_rope_theta(other)?;
    let other_cosine = rows(s);
    // restore before reporting any error: the session keeps driving with the declared table
    s.driver.replace_rope_theta(declared)?;
    Ok(Some(ThetaCheck {
        declared: convention.name().into(),
        rows: ks.len(),
        declared_cosine,
        other_cosine: other_cosine?,
    }))
}

/// `kvprobe positions`.
pub struct PositionsProbe;

impl crate::probe::Probe for PositionsProbe {
    fn name(&self) -> &'static str {
        "positions"
    }

    fn about(&self) -> &'static str {
        "The first tbt step with positions shifted by -4..4"
    }

    fn run(
        &self,
        s: &mut crate::session::Session,
        _opts: &crate::probe::ProbeOptions,
        into: &mut kvprobe_schema::ProbeFindings,
    ) -> Result<()> {
        into.positions = Some(run(s)?);
        into.theta = theta_check(s)?;
        Ok(())
    }
}
