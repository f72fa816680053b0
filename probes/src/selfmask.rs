//! `selfmask`: tbt steps whose mask allows only the token itself, against reference single-token
//! steps with no prefix keys at the same position (prior art §2.3, kv_greedy `--mask-mode self`).
//!
//! It isolates the tbt graph from the cache. With one visible key per head the softmax weight is
//! exactly 1, so this control is blind to positions and to the attention scale (fault signatures).

use kvprobe_npu::MaskMode;
use kvprobe_reference::ForwardOptions;
use kvprobe_schema::{SelfmaskFinding, SelfmaskStep};

use crate::metrics::{compare, summarise, top1};
use crate::session::Session;
use crate::Result;

/// `steps` self-only steps; queries = the device's prefill argmax, then the prompt's tokens
/// (varied, real tokens of this prompt).
pub fn run(s: &mut Session, steps: usize) -> Result<SelfmaskFinding> {
    s.require_tbt("selfmask")?;
    if let Some(why) = s.dev.mask_by_length() {
        return Err(crate::Error::Input(format!(
            "`selfmask` is not applicable on this device: {why}"
        )));
    }
    let steps = steps.max(1);
    s.progress.phase("selfmask", steps as u64 + 1);
    let n = s.ids.len();
    let out = s.prefill_prompt()?;
    s.progress.inc(1);
    let mut tokens = vec![top1(&out.logits)];
    tokens.extend(s.ids.iter().copied().cycle().take(steps - 1));
    let positions: Vec<usize> = (n..n + steps).collect();
    // One batched reference pass: each row sees only itself (identity mask).
    let t = tokens.len();
    let mask: Vec<bool> = (0..t * t).map(|i| i / t == i % t).collect();
    let reference = s.model.forward(
        &tokens,
        &ForwardOptions {
            mask: Some(mask),
            positions: Some(positions.clone()),
            ..Default::default()
        },
    )?;
    let mut rows = Vec::with_capacity(steps);
    let mut devs = Vec::with_capacity(steps);
    for (i, &token) in tokens.iter().enumerate() {
        let dev = s.driver.step(s.dev, token, &MaskMode::SelfOnly)?;
        rows.push(SelfmaskStep {
            step: i,
            position: positions[i],
            input_token: token,
            comparison: compare(&dev.logits, reference.row(i)),
        });
        devs.push(dev.logits);
        s.progress.inc(1);
    }
    let (mean_cosine, min_cosine, top1_agreement) = summarise(rows.iter().map(|r| &r.comparison));
    // where the matched reference computes every op, the same rows at the declared precision
    let pairs: Vec<(u32, usize)> = tokens
        .iter()
        .copied()
        .zip(positions.iter().copied())
        .collect();
    let matched = crate::matched_jitter::self_only(s.model, s.describe(), &pairs)?;
    let mean = |rows: &[Vec<f32>], m: &[Vec<f32>]| {
        let c = rows
            .iter()
            .zip(m)
            .map(|(d, r)| crate::metrics::cosine(d, r));
        c.sum::<f64>() / m.len().max(1) as f64
    };
    let matched_mean_cosine = matched.as_ref().map(|m| mean(&devs, m));
    // the graph's own self-only rows, where the device runs a control (crate::device_stray)
    let control: Option<Vec<Vec<f32>>> = devs.iter().map(|d| s.dev.control_logits(d)).collect();
    let control_matched_mean_cosine = matched.zip(control).map(|(m, c)| mean(&c, &m));
    let token_texts = s.token_texts(rows.iter().flat_map(|r| {
        [
            r.input_token,
            r.comparison.device_top1,
            r.comparison.reference_top1,
        ]
    }));
    Ok(SelfmaskFinding {
        token_texts,
        steps: rows,
        mean_cosine,
        matched_mean_cosine,
        control_matched_mean_cosine,
        min_cosine,
        top1_agreement,
    })
}

/// `kvprobe selfmask`.
pub struct SelfmaskProbe;

impl crate::probe::Probe for SelfmaskProbe {
    fn name(&self) -> &'static str {
        "selfmask"
    }

    fn about(&self) -> &'static str {
        "tbt steps that see only themselves: the tbt graph without the cache"
    }

    fn run(
        &self,
        s: &mut crate::session::Session,
        opts: &crate::probe::ProbeOptions,
        into: &mut kvprobe_schema::ProbeFindings,
    ) -> Result<()> {
        into.selfmask = Some(run(s, opts.steps.min(16))?);
        Ok(())
    }
}
