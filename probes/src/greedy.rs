//! `greedy` (kv_greedy): prefill plus tbt steps through the server's `Ring` mask, exactly as the
//! genai server generates (prior art §1.3), compared at every step with the reference on the same
//! prefix — the same sliding window once the ring wraps (contract §2.9) — teacher-forced on the
//! device's own tokens so that one divergence does not cascade.

use kvprobe_npu::MaskMode;
use kvprobe_schema::{GreedyFinding, GreedyStep};

use crate::metrics::{compare, summarise, top1};
use crate::session::{append, window_step, Session};
use crate::Result;

pub fn run(s: &mut Session, steps: usize) -> Result<GreedyFinding> {
    let steps = steps.max(1);
    if steps > 1 {
        s.require_tbt("greedy")?;
    }
    let g = s.geometry();
    let n = g.prompt_len;
    s.progress.phase("greedy", steps as u64);
    let prompt = s.prompt_ref()?;
    let out = s.prefill_prompt()?;
    s.progress.inc(1);
    let mut device_ids = vec![top1(&out.logits)];
    let mut out_steps = vec![GreedyStep {
        step: 0,
        position: n - 1,
        input_token: s.ids[n - 1],
        visible_keys: n - 1,
        comparison: compare(&out.logits, prompt.row(n - 1)),
    }];
    let mut state = prompt.state.clone();
    let mut first_divergence = (!out_steps[0].comparison.top1_match).then_some(0);
    // The reference's own greedy continuation equals the device's tokens until the first
    // divergence; from there it runs free on a copy of the teacher-forced state.
    let mut free: Option<(Vec<u32>, kvprobe_reference::KvState)> = None;
    if first_divergence.is_some() {
        free = Some((vec![out_steps[0].comparison.reference_top1], state.clone()));
    }
    for step in 1..steps {
        let token = device_ids[step - 1];
        let position = n + step - 1;
        let usage = n + step;
        let window = usage.min(g.cache_len) - 1;
        let dev = s.driver.step(s.dev, token, &MaskMode::Ring)?;
        let (logits, kv) = window_step(s.model, &state, token, position, window)?;
        append(&mut state, &kv, token, position)?;
        let c = compare(&dev.logits, &logits);
        if !c.top1_match && first_divergence.is_none() {
            first_divergence = Some(step);
            let mut ids = device_ids.clone();
            ids.push(c.reference_top1);
            free = Some((ids, state.clone()));
        }
        device_ids.push(top1(&dev.logits));
        out_steps.push(GreedyStep {
            step,
            position,
            input_token: token,
            visible_keys: window,
            comparison: c,
        });
        s.progress.inc(1);
    }
    let reference_ids = match free {
        None => device_ids.clone(),
        Some((mut ids, mut st)) => {
            while ids.len() < steps {
                let step = ids.len();
                let token = ids[step - 1];
                let position = n + step - 1;
                let window = (n + step).min(g.cache_len) - 1;
                let (logits, kv) = window_step(s.model, &st, token, position, window)?;
                append(&mut st, &kv, token, position)?;
                ids.push(top1(&logits));
            }
            ids
        }
    };
    let tok = s.model.tokenizer();
    let device_text = tok.decode(&device_ids).unwrap_or_default();
    let reference_text = tok.decode(&reference_ids).unwrap_or_default();
    let (mean_cosine, min_cosine, top1_agreement) =
        summarise(out_steps.iter().map(|x| &x.comparison));
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
    })
}

/// Top-1 agreement over tbt steps only (step ≥ 1); `None` without tbt steps.
pub fn tbt_top1(f: &GreedyFinding) -> Option<f64> {
    (f.steps.len() > 1).then(|| summarise(f.steps[1..].iter().map(|x| &x.comparison)).2)
}

/// Minimum cosine over tbt steps only.
pub fn tbt_min(f: &GreedyFinding) -> Option<f64> {
    (f.steps.len() > 1).then(|| summarise(f.steps[1..].iter().map(|x| &x.comparison)).1)
}
