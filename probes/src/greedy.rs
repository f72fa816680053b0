//! `greedy` (kv_greedy): prefill plus tbt steps through the server's `Ring` mask, exactly as the
//! genai server generates (prior art §1.3), compared at every step with the reference on the same
//! prefix — the same sliding window once the ring wraps (contract §2.9) — teacher-forced on the
//! device's own tokens so that one divergence does not cascade.

use kvprobe_npu::MaskMode;
use kvprobe_reference::ForwardOptions;
use kvprobe_schema::{GreedyFinding, GreedyStep};

use crate::matched;
use crate::metrics::{compare, summarise, top1};
use crate::session::{append, window_step, ComparedLogits, Session};
use crate::Result;

pub fn run(s: &mut Session, steps: usize) -> Result<GreedyFinding> {
    run_with(s, steps, None)
}

/// `run`, with the reference's free-running continuation stopped `reference_tail` tokens after
/// the first divergence (`None`: as long as the device's). Each of those tokens is a sequential
/// reference decode step that no diagnosis rule reads, only the report's text: `diagnose` keeps
/// a few to show where the two part ways. A shorter `reference_ids` than `device_ids` says so.
pub fn run_with(
    s: &mut Session,
    steps: usize,
    reference_tail: Option<usize>,
) -> Result<GreedyFinding> {
    let steps = steps.max(1);
    if steps > 1 {
        s.require_tbt("greedy")?;
    }
    let g = s.geometry();
    let n = g.prompt_len;
    let l = g.cache_len;
    s.progress.phase("greedy", steps as u64 + 1);
    let (device_logits, device_ids) = device_run(s, steps)?;
    // Reference teacher-forced on the device's tokens, all steps in one forward: row i may see
    // positions i − (L − 1) … i, the window a ring of L entries leaves a tbt step (contract §2.9);
    // earlier layers are windowed the same way, as on the device.
    let mut seq = s.ids.clone();
    seq.extend_from_slice(&device_ids[..steps - 1]);
    let t = seq.len();
    let mask: Vec<bool> = (0..t * t)
        .map(|k| (k % t) <= (k / t) && (k / t) - (k % t) < l)
        .collect();
    let reference = s.model.forward(
        &seq,
        &ForwardOptions {
            mask: Some(mask),
            ..Default::default()
        },
    )?;
    s.progress.inc(1);
    let mut out_steps = Vec::with_capacity(steps);
    for (step, logits) in device_logits.iter().enumerate() {
        let position = n - 1 + step;
        out_steps.push(GreedyStep {
            step,
            position,
            input_token: seq[position],
            visible_keys: position.min(l - 1),
            comparison: compare(logits, reference.row(position)),
            reference_margin: 0.0,
            near_tie: false,
            matched: None,
        });
    }
    let rows: Vec<&[f32]> = (0..steps).map(|i| reference.row(n - 1 + i)).collect();
    let matched = matched::three_way(
        (s.model, &s.matched_runs),
        s.describe(),
        &seq,
        n,
        &device_logits,
        &rows,
        &mut out_steps,
    )?;
    // the healthy hypothesis' own spread per step, where the matched reference computes every op
    crate::matched_jitter::fill_steps(
        (s.model, &s.matched_runs),
        s.describe(),
        &seq,
        n,
        &mut out_steps,
    )?;
    // the device's own arithmetic per step, where a control measures it
    crate::device_stray::fill_steps(
        &*s.dev,
        (s.model, &s.matched_runs),
        (s.describe(), &seq[..], n),
        &device_logits,
        &mut out_steps,
    )?;
    let first_divergence = out_steps
        .iter()
        .position(|x| !x.comparison.top1_match && !x.near_tie);
    // The reference's own greedy continuation equals the device's tokens up to the first
    // divergence; from there it runs free on the reference's KV state.
    let reference_ids = match first_divergence {
        None => device_ids.clone(),
        Some(d) => {
            let stop = reference_tail.map_or(steps, |t| steps.min(d + 1 + t));
            let diverged = out_steps[d].comparison.reference_top1;
            reference_continuation(s, &device_ids[..d], diverged, stop)?
        }
    };
    let vocab = device_logits.first().map_or(0, Vec::len);
    let mut reference_rows = Vec::with_capacity(steps * vocab);
    for step in 0..steps {
        reference_rows.extend_from_slice(reference.row(n - 1 + step));
    }
    keep_compared(s, steps, vocab, device_logits.concat(), reference_rows);
    let tok = s.model.tokenizer();
    let device_text = tok.decode(&device_ids).unwrap_or_default();
    let reference_text = tok.decode(&reference_ids).unwrap_or_default();
    let (mean_cosine, min_cosine, _) = summarise(out_steps.iter().map(|x| &x.comparison));
    let top1_agreement = agreement(&out_steps);
    let near_tie_flips = out_steps.iter().filter(|x| x.near_tie).count();
    let token_texts = token_texts(s, &out_steps);
    let tbt_mean_cosine =
        (steps > 1).then(|| summarise(out_steps[1..].iter().map(|x| &x.comparison)).0);
    Ok(GreedyFinding {
        steps: out_steps,
        first_divergence,
        device_ids,
        device_text,
        reference_ids,
        reference_text,
        mean_cosine,
        min_cosine,
        top1_agreement,
        tbt_mean_cosine,
        near_tie_flips,
        matched,
        token_texts,
    })
}

/// Device first: prefill, then tbt steps on its own argmax, exactly as the server. Returns each
/// step's logits and argmax.
fn device_run(s: &mut Session, steps: usize) -> Result<(Vec<Vec<f32>>, Vec<u32>)> {
    let out = s.prefill_prompt()?;
    s.progress.inc(1);
    let mut device_logits = vec![out.logits];
    let mut device_ids = vec![top1(&device_logits[0])];
    for step in 1..steps {
        let dev = s
            .driver
            .step(s.dev, device_ids[step - 1], &MaskMode::Ring)?;
        device_ids.push(top1(&dev.logits));
        device_logits.push(dev.logits);
        s.progress.inc(1);
    }
    Ok((device_logits, device_ids))
}

/// The reference's greedy tokens: the device's `agreed` ones, the reference's own `diverged`
/// token, then free-running on the reference's KV state until `stop` tokens.
fn reference_continuation(
    s: &Session,
    agreed: &[u32],
    diverged: u32,
    stop: usize,
) -> Result<Vec<u32>> {
    let g = s.geometry();
    let (n, l) = (g.prompt_len, g.cache_len);
    let d = agreed.len();
    let mut ids = agreed.to_vec();
    ids.push(diverged);
    let prefix: Vec<u32> = s.ids.iter().chain(&ids[..d]).copied().collect();
    let mut st = s
        .model
        .prefix_state(&prefix, &(0..prefix.len()).collect::<Vec<_>>())?;
    // (a wrapped prefix would need its own windows; keep the state to the ring's reach)
    while ids.len() < stop {
        let step = ids.len();
        let token = ids[step - 1];
        let position = n + step - 1;
        let window = (n + step).min(l) - 1;
        let (logits, kv) = window_step(s.model, &st, token, position, window)?;
        append(&mut st, &kv, token, position)?;
        ids.push(top1(&logits));
    }
    Ok(ids)
}

/// The readable piece of every id the step table shows.
fn token_texts(s: &Session, steps: &[GreedyStep]) -> std::collections::BTreeMap<u32, String> {
    s.token_texts(steps.iter().flat_map(|x| {
        let c = &x.comparison;
        [x.input_token, c.device_top1, c.reference_top1]
            .into_iter()
            .chain(x.matched.map(|m| m.matched_top1))
    }))
}

/// The first greedy step (0 = the prefill's last row) whose device logits, as the session kept
/// them, hold inf or NaN: the comparisons count such a step as a plain miss (metrics), so the
/// diagnosis reads the logits themselves.
pub fn first_non_finite_step(s: &Session) -> Option<usize> {
    let c = s
        .compared
        .iter()
        .find(|c| c.name == "greedy_device_logits")?;
    c.data
        .chunks(c.cols.max(1))
        .position(|row| row.iter().any(|x| !x.is_finite()))
}

/// The compared logits, `[steps, vocab]` each, for the run's `.npy` files.
fn keep_compared(
    s: &mut Session,
    steps: usize,
    vocab: usize,
    device: Vec<f32>,
    reference: Vec<f32>,
) {
    s.compared.push(ComparedLogits {
        name: "greedy_device_logits".into(),
        rows: steps,
        cols: vocab,
        data: device,
    });
    s.compared.push(ComparedLogits {
        name: "greedy_reference_logits".into(),
        rows: steps,
        cols: vocab,
        data: reference,
    });
}

/// Top-1 agreement over tbt steps only (step ≥ 1), near-tie flips left out; `None` without
/// tbt steps.
pub fn tbt_top1(f: &GreedyFinding) -> Option<f64> {
    (f.steps.len() > 1).then(|| agreement(&f.steps[1..]))
}

/// Top-1 agreement of the steps that are not near-tie flips (1 when every flip is a near tie).
pub fn agreement(steps: &[GreedyStep]) -> f64 {
    let counted = steps.iter().filter(|x| !x.near_tie).count();
    let agree = steps.iter().filter(|x| x.comparison.top1_match).count();
    if counted == 0 {
        1.0
    } else {
        agree as f64 / counted as f64
    }
}

/// Minimum cosine over tbt steps only.
pub fn tbt_min(f: &GreedyFinding) -> Option<f64> {
    (f.steps.len() > 1).then(|| summarise(f.steps[1..].iter().map(|x| &x.comparison)).1)
}

/// `kvprobe greedy`.
pub struct GreedyProbe;

impl crate::probe::Probe for GreedyProbe {
    fn name(&self) -> &'static str {
        "greedy"
    }

    fn about(&self) -> &'static str {
        "Greedy generation through the server's ring mask, teacher-forced comparison per step"
    }

    fn run(
        &self,
        s: &mut crate::session::Session,
        opts: &crate::probe::ProbeOptions,
        into: &mut kvprobe_schema::ProbeFindings,
    ) -> Result<()> {
        into.greedy = Some(run(s, opts.steps)?);
        Ok(())
    }
}
