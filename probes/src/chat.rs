//! `chat`: a multi-turn conversation appended to the same device state without a reset, the way
//! a chat pipeline keeps its KV-cache between prompts: turn 1 is the session's prompt, each later
//! turn a short user message (fed after the last generated token of the turn before), each
//! followed by greedy steps on the device's own tokens. The reference runs the whole conversation
//! teacher-forced on the device's tokens, so each turn is compared with what the model gives on
//! the same history; the finding names the turn and step where the two first part ways.
//!
//! The control at that turn: the same history replayed as one prompt on a fresh request (reset,
//! one prefill; what openvino.genai's NPU pipeline does for a chat). When the fresh request
//! agrees with the reference and the appended one did not, the appending is at fault, not the
//! history's content. A field bug this probe is for: OpenVINO's NPU chat output differing from
//! the stateful pipeline from the third prompt on.
//!
//! Its finding sits in `ProbeFindings::extra["chat"]`; [`evidence`] is its one line.
//! `diagnose` runs a two-turn version when every control passed (`crate::chat_diagnose`).

use kvprobe_npu::MaskMode;
use kvprobe_reference::ForwardOptions;
use kvprobe_schema::GreedyStep;
use serde::{Deserialize, Serialize};

use crate::matched;
use crate::metrics::{compare, cosine, summarise, top1};
use crate::session::Session;
use crate::thresholds::{STAGE_MEAN_COSINE, STAGE_MIN_COSINE, TOP1_IRRELEVANT_ABOVE};
use crate::{Error, Result};

/// The later turns' user messages: everyday follow-ups, short so that four turns fit a small
/// context (the NPU pipeline's default here is 128 positions).
pub const FOLLOW_UPS: [&str; 3] = ["Why?", "Tell me more.", "And then what happened?"];

/// Greedy steps per turn at the most (`--steps` is clipped to it): the conversation has to fit
/// the device's context without wrapping.
pub const MAX_STEPS: usize = 8;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatTurn {
    /// 1-based.
    pub turn: usize,
    /// Position of the turn's first fed token.
    pub first_position: usize,
    /// Tokens the turn's prefill fed (the previous turn's last generated token, then the message).
    pub fed: usize,
    /// Step 0: the turn's prefill (its last row); then each generated token's row.
    pub steps: Vec<GreedyStep>,
    pub device_ids: Vec<u32>,
    pub device_text: String,
    pub mean_cosine: f64,
    pub min_cosine: f64,
    pub top1_agreement: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatDivergence {
    pub turn: usize,
    pub step: usize,
    pub position: usize,
    /// What crossed: a top-1 flip outside the precision band, or a cosine under the stage floors.
    pub why: String,
}

/// The history up to the diverging row, replayed on a fresh request as one prompt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FreshControl {
    pub tokens: usize,
    /// The appended run's cosine at that row, and the fresh request's.
    pub appended_cosine: f64,
    pub fresh_cosine: Option<f64>,
    pub fresh_top1_match: Option<bool>,
    /// The fresh row agrees: its top-1 matches and its cosine reaches `STAGE_MEAN_COSINE`.
    pub fresh_agrees: Option<bool>,
    /// Why the control did not run (the device refused a prompt that long).
    pub not_run: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatFinding {
    pub turns: Vec<ChatTurn>,
    /// Turns the conversation has; fewer ran when they did not fit the context (`not_run`).
    pub turns_planned: usize,
    pub not_run: Option<String>,
    pub steps_per_turn: usize,
    /// Tokens the device held at the end.
    pub total_tokens: usize,
    /// The first row that does not agree ([`disagrees`]).
    pub first_divergence: Option<ChatDivergence>,
    pub fresh: Option<FreshControl>,
    /// The precision-matched reference's description, when the device declares one.
    pub matched: Option<String>,
    /// At a divergence: the host wiring that reproduces the diverging turns best, on the
    /// reference side (`crate::wiring_fit`, over the rows from the diverging turn on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fit: Option<crate::wiring_fit::WiringFit>,
}

/// The later turns' tokens: chat-template wrapped when the vocabulary has ChatML's markers.
fn follow_up_ids(s: &Session) -> Result<Vec<Vec<u32>>> {
    let chatml = s.model.encode("<|im_start|>", Some(false))?.len() == 1;
    FOLLOW_UPS
        .iter()
        .map(|m| {
            let text = if chatml {
                format!("<|im_end|>\n<|im_start|>user\n{m}<|im_end|>\n<|im_start|>assistant\n")
            } else {
                format!("\nUser: {m}\nAssistant:")
            };
            Ok(s.model.encode(&text, Some(false))?)
        })
        .collect()
}

/// One compared row of the device.
struct Row {
    turn: usize,
    step: usize,
    position: usize,
    logits: Vec<f32>,
}

pub fn run(s: &mut Session, steps: usize) -> Result<ChatFinding> {
    run_turns(s, steps, 1 + FOLLOW_UPS.len())
}

/// [`run`] with the conversation cut to its first `turns` turns (diagnose's cheap chat).
pub fn run_turns(s: &mut Session, steps: usize, turns: usize) -> Result<ChatFinding> {
    let steps = steps.clamp(1, MAX_STEPS);
    if steps > 1 {
        s.require_tbt("chat")?;
    }
    let mut messages = vec![s.ids.clone()];
    messages.extend(follow_up_ids(s)?);
    messages.truncate(turns.max(1));
    let turns_planned = messages.len();
    // each turn feeds its message (after turn 1, with the last generated token in front) and
    // steps − 1 generated tokens; the device holds at most cache_len − 1 without wrapping
    let room = s.geometry().cache_len - 1;
    let mut used = 0;
    let mut fits = 0;
    for (t, m) in messages.iter().enumerate() {
        let need = m.len() + usize::from(t > 0) + steps - 1;
        if used + need > room {
            break;
        }
        used += need;
        fits += 1;
    }
    if fits == 0 {
        return Err(Error::Input(format!(
            "chat: the prompt and {steps} steps do not fit the device's {room} positions; pass a shorter prompt or fewer --steps"
        )));
    }
    let not_run = (fits < turns_planned).then(|| {
        format!(
            "turns {}..{turns_planned} not run: they do not fit the device's {room} positions with {steps} steps a turn",
            fits + 1
        )
    });
    messages.truncate(fits);
    s.progress.phase("chat", (fits * steps) as u64 + 2);

    // the device: one reset, then every turn appended
    let (seq, rows, starts) = converse(s, &messages, steps)?;
    let reference = s.model.forward(&seq, &ForwardOptions::default())?;
    s.progress.inc(1);
    let ref_rows: Vec<&[f32]> = rows.iter().map(|r| reference.row(r.position)).collect();
    let mut all: Vec<GreedyStep> = rows
        .iter()
        .zip(&ref_rows)
        .map(|(r, rr)| GreedyStep {
            step: r.step,
            position: r.position,
            input_token: seq[r.position],
            visible_keys: r.position,
            comparison: compare(&r.logits, rr),
            reference_margin: 0.0,
            near_tie: false,
            matched: None,
        })
        .collect();
    let positions: Vec<usize> = rows.iter().map(|r| r.position).collect();
    let device: Vec<Vec<f32>> = rows.iter().map(|r| r.logits.clone()).collect();
    let summary = matched::three_way_at(
        (s.model, &s.matched_runs),
        s.describe(),
        &seq,
        messages[0].len(),
        &positions,
        &device,
        &ref_rows,
        &mut all,
    )?;
    // with a control: the graph judged by the control, the device by its distance from it
    let at = (s.describe(), &seq[..], messages[0].len());
    let memo = (s.model, &s.matched_runs);
    crate::device_stray::fill_at(&*s.dev, memo, at, &positions, &device, &mut all)?;
    let first = divergence(s.describe(), &rows, &all);
    let first_divergence = first.map(|(i, why)| ChatDivergence {
        turn: rows[i].turn,
        step: rows[i].step,
        position: rows[i].position,
        why,
    });
    let first = first_divergence
        .as_ref()
        .and_then(|d| rows.iter().position(|r| r.position == d.position))
        .map(|i| (&rows[i], &all[i]));
    let fresh = match first {
        Some((r, st)) if r.turn > 1 => Some(fresh_control(
            s,
            &seq[..=r.position],
            reference.row(r.position),
            st.comparison.cosine,
        )?),
        _ => None,
    };
    s.progress.inc(1);
    let fit = match &first_divergence {
        Some(d) => wiring_fit(s, &seq, &rows, &all, &starts, d.turn)?,
        None => None,
    };
    let turns = split_turns(s, &rows, all, &starts, &messages);
    Ok(ChatFinding {
        turns,
        turns_planned,
        not_run,
        steps_per_turn: steps,
        total_tokens: seq.len(),
        first_divergence,
        fresh,
        matched: summary.map(|m| m.precision),
        fit,
    })
}

/// The first compared row that disagrees, with why: against the declared precision, and where a
/// control ran the graph by the control and the device by its distance from it.
fn divergence(
    desc: &kvprobe_schema::DeviceDescription,
    rows: &[Row],
    all: &[GreedyStep],
) -> Option<(usize, String)> {
    // with a control the healthy graph has two implementations (the matched reference, the CPU
    // EP): a conversation the device follows directly against the matched reference is
    // explained, as the stage floors read the better account (`device_stray::better_explained`)
    let control = all
        .iter()
        .any(|st| st.matched.is_some_and(|m| m.control_vs_matched.is_some()));
    if control && first_disagreement(rows, &against_declared(desc, all, false)).is_none() {
        return None;
    }
    let judged = against_declared(desc, all, true);
    let own = crate::device_stray::against_control(all)
        .and_then(|d| first_disagreement(rows, &d))
        .map(|(i, why)| (i, format!("the device against its control (the same graph on the CPU EP with the same feeds: the device's own arithmetic): {why}")));
    let graph = first_disagreement(rows, &judged).map(|(i, why)| {
        match all[i].matched.and_then(|m| m.control_vs_matched) {
            Some(_) => (
                i,
                format!("the graph (its control against the precision-matched reference): {why}"),
            ),
            None => (i, why),
        }
    });
    graph.into_iter().chain(own).min_by_key(|(i, _)| *i)
}

/// The wiring fit over the rows from the diverging turn `from` on, replayed and judged as the
/// greedy control judges a device (`crate::footing`: on the matched reference, each row's band
/// the jitter control's spread over the conversation, where that control applies); the graph's
/// own arithmetic is the miss of the conversation's first row (the prompt's prefill from a reset
/// reads no cache) against the reference the hypotheses run on.
fn wiring_fit(
    s: &Session,
    seq: &[u32],
    rows: &[Row],
    all: &[GreedyStep],
    starts: &[usize],
    from: usize,
) -> Result<Option<crate::wiring_fit::WiringFit>> {
    use crate::wiring_fit::{chat, fit, healthy_and_precision, Rows};
    // an appended turn's piece runs from its start to its first generated row
    let turns: Vec<(usize, usize)> = (1..starts.len())
        .filter_map(|t| {
            let first = rows.iter().find(|r| r.turn == t + 1)?;
            Some((starts[t], first.position + 1 - starts[t]))
        })
        .collect();
    let layout = Rows {
        // turn 1's first row is the prompt's last
        prompt: rows.first().map_or(seq.len(), |r| r.position + 1),
        t: seq.len(),
        window: seq.len(),
        turns: &turns,
    };
    let compared: Vec<usize> = (0..rows.len()).filter(|&i| rows[i].turn >= from).collect();
    let mut steps: Vec<GreedyStep> = compared.iter().map(|&i| all[i].clone()).collect();
    let device: Vec<(usize, &[f32])> = compared
        .iter()
        .map(|&i| (rows[i].position, rows[i].logits.as_slice()))
        .collect();
    let footing = crate::footing::Footing::of(s)?;
    let first = all.first();
    let noise = match first
        .and_then(|x| x.matched)
        .filter(|_| footing.matched.is_some())
    {
        Some(m) => 1.0 - m.matched_vs_device,
        None => first.map_or(0.0, |x| 1.0 - x.comparison.cosine),
    };
    if footing.jitter() {
        let positions: Vec<usize> = compared.iter().map(|&i| rows[i].position).collect();
        crate::matched_jitter::fill_steps_at(
            (s.model, &s.matched_runs),
            s.describe(),
            (seq, layout.prompt),
            &positions,
            &mut steps,
        )?;
    }
    fit(
        (s.model, footing.matched.as_ref()),
        seq,
        &layout,
        &chat(),
        &device,
        healthy_and_precision(&steps.iter().collect::<Vec<_>>(), noise, footing.jitter()),
    )
}

/// Why a compared row does not agree with the reference, if it does not: a top-1 flip the
/// declared precision cannot explain (not a near tie) in a turn whose mean cosine is at most
/// `TOP1_IRRELEVANT_ABOVE` (above it the flip is a near tie, as diagnose reads greedy: the CPU
/// plugin flipped one at 0.999), or a cosine under the stages' floors (a
/// row under `STAGE_MIN_COSINE`, or under `STAGE_MEAN_COSINE` in a turn whose mean is too).
fn disagrees(st: &GreedyStep, turn_mean: f64) -> Option<String> {
    let c = &st.comparison;
    // as diagnose reads greedy: above TOP1_IRRELEVANT_ABOVE mean cosine a flip is a near tie
    if !c.top1_match && !st.near_tie && turn_mean <= TOP1_IRRELEVANT_ABOVE {
        return Some(format!(
            "top-1 {} where the reference gives {}, outside the precision band",
            c.device_top1, c.reference_top1
        ));
    }
    let low = c.cosine < STAGE_MIN_COSINE
        || (turn_mean < STAGE_MEAN_COSINE && c.cosine < STAGE_MEAN_COSINE);
    low.then(|| {
        format!(
            "cosine {:.4} (turn mean {turn_mean:.4}; a stage agrees at mean ≥ {STAGE_MEAN_COSINE}, every row ≥ {STAGE_MIN_COSINE})",
            c.cosine
        )
    })
}

/// The rows as the divergence is judged: against the precision-matched reference where it
/// computes everything the device declares (`matched::models_everything`: int4 / fp16 weights of
/// an ONNX export), as the stateful rules read prefill and greedy (`diagnose::stateful`
/// `matched_facts`); else as compared with the f32 reference. Without it an int4 export's first
/// row (0.53 against f32 on SmolLM2, 0.99 against its declared weights) ended every healthy
/// diagnosis `unknown`.
fn against_declared(
    desc: &kvprobe_schema::DeviceDescription,
    all: &[GreedyStep],
    graph_by_control: bool,
) -> Vec<GreedyStep> {
    let declared = matched::models_everything(desc);
    all.iter()
        .map(|st| match (&st.matched, declared) {
            (Some(m), true) => against_matched(st, m, graph_by_control),
            _ => st.clone(),
        })
        .collect()
}

/// One row judged against the matched reference: its cosine and top-1, and the near tie judged
/// against the same reference as the flip (the f32 one's margin says nothing when f32 and the
/// device agree and the matched one does not: SmolLM2 QDQ on the HTP simulator, "How do I boil
/// an egg?", f32 and the device 198, the matched reference 1, band 31.5).
fn against_matched(
    st: &GreedyStep,
    m: &kvprobe_schema::MatchedStep,
    graph_by_control: bool,
) -> GreedyStep {
    let mut st = st.clone();
    // with a control and `graph_by_control`, the graph: the control against the matched
    // reference; else the device against it
    st.comparison.cosine = m
        .control_vs_matched
        .filter(|_| graph_by_control)
        .unwrap_or(m.matched_vs_device);
    st.comparison.reference_top1 = m.matched_top1;
    st.comparison.top1_match = st.comparison.device_top1 == m.matched_top1;
    st.reference_margin = m.matched_margin;
    st.near_tie = !st.comparison.top1_match && m.matched_margin <= m.band;
    st
}

/// The first row that disagrees, in conversation order, with why.
fn first_disagreement(rows: &[Row], steps: &[GreedyStep]) -> Option<(usize, String)> {
    let turns = rows.last().map_or(0, |r| r.turn);
    let means: Vec<f64> = (1..=turns)
        .map(|t| {
            let c = rows.iter().zip(steps).filter(|(r, _)| r.turn == t);
            summarise(c.map(|(_, st)| &st.comparison)).0
        })
        .collect();
    rows.iter()
        .zip(steps)
        .enumerate()
        .find_map(|(i, (r, st))| disagrees(st, means[r.turn - 1]).map(|why| (i, why)))
}

/// The conversation on the device: the fed sequence, every compared row, each turn's first
/// position.
fn converse(
    s: &mut Session,
    messages: &[Vec<u32>],
    steps: usize,
) -> Result<(Vec<u32>, Vec<Row>, Vec<usize>)> {
    s.driver.reset(s.dev)?;
    let mut seq: Vec<u32> = Vec::new();
    let mut rows: Vec<Row> = Vec::new();
    let mut starts = Vec::new();
    let mut last: Option<u32> = None;
    for (t, m) in messages.iter().enumerate() {
        let fed: Vec<u32> = last.into_iter().chain(m.iter().copied()).collect();
        starts.push(seq.len());
        seq.extend_from_slice(&fed);
        // appended to the state the previous turns left: no reset
        let out = s.driver.prefill(s.dev, &fed)?;
        rows.push(Row {
            turn: t + 1,
            step: 0,
            position: seq.len() - 1,
            logits: out.logits,
        });
        s.progress.inc(1);
        for step in 1..steps {
            let token = top1(rows.last().map_or(&[][..], |r| &r.logits));
            seq.push(token);
            let out = s.driver.step(s.dev, token, &MaskMode::Ring)?;
            rows.push(Row {
                turn: t + 1,
                step,
                position: seq.len() - 1,
                logits: out.logits,
            });
            s.progress.inc(1);
        }
        last = rows.last().map(|r| top1(&r.logits));
    }
    Ok((seq, rows, starts))
}

/// The history replayed on a fresh request as one prompt: its last row against the reference.
fn fresh_control(
    s: &mut Session,
    history: &[u32],
    reference: &[f32],
    appended_cosine: f64,
) -> Result<FreshControl> {
    let mut c = FreshControl {
        tokens: history.len(),
        appended_cosine,
        fresh_cosine: None,
        fresh_top1_match: None,
        fresh_agrees: None,
        not_run: None,
    };
    match s.prefill(history) {
        Ok(out) => {
            let (cos, top1_match) = (
                cosine(&out.logits, reference),
                top1(&out.logits) == top1(reference),
            );
            c.fresh_cosine = Some(cos);
            c.fresh_top1_match = Some(top1_match);
            c.fresh_agrees = Some(top1_match && cos >= STAGE_MEAN_COSINE);
        }
        // a prompt past the device's declared prompt limit: the control cannot run here
        Err(Error::Npu(e)) if e.exit_code() == 2 => {
            c.not_run = Some(format!(
                "the device does not take a {}-token prompt: {e}",
                history.len()
            ));
        }
        Err(e) => return Err(e),
    }
    Ok(c)
}

fn split_turns(
    s: &Session,
    rows: &[Row],
    steps: Vec<GreedyStep>,
    starts: &[usize],
    messages: &[Vec<u32>],
) -> Vec<ChatTurn> {
    let tok = s.model.tokenizer();
    let mut per: Vec<Vec<GreedyStep>> = vec![Vec::new(); messages.len()];
    for (r, st) in rows.iter().zip(steps) {
        per[r.turn - 1].push(st);
    }
    per.into_iter()
        .enumerate()
        .map(|(t, steps)| {
            let device_ids: Vec<u32> = steps.iter().map(|x| x.comparison.device_top1).collect();
            let (mean_cosine, min_cosine, _) = summarise(steps.iter().map(|x| &x.comparison));
            ChatTurn {
                turn: t + 1,
                first_position: starts[t],
                fed: messages[t].len() + usize::from(t > 0),
                device_text: tok.decode(&device_ids).unwrap_or_default(),
                device_ids,
                mean_cosine,
                min_cosine,
                top1_agreement: crate::greedy::agreement(&steps),
                steps,
            }
        })
        .collect()
}

/// One line for a diagnosis or a summary: where the chat diverged, and what the fresh-request
/// control says; `None` when every turn agreed.
pub fn evidence(f: &ChatFinding) -> Option<String> {
    let d = f.first_divergence.as_ref()?;
    let mut line = format!(
        "chat: diverges from the reference at turn {} of {}, step {} (position {}): {}",
        d.turn,
        f.turns.len(),
        d.step,
        d.position,
        d.why
    );
    match &f.fresh {
        Some(FreshControl {
            fresh_agrees: Some(true),
            fresh_cosine: Some(c),
            tokens,
            ..
        }) => line.push_str(&format!(
            "; the same {tokens}-token history as one prompt on a fresh request agrees (cosine {c:.4}): appending to the kept state is at fault"
        )),
        Some(FreshControl {
            fresh_agrees: Some(false),
            fresh_cosine: Some(c),
            tokens,
            ..
        }) => line.push_str(&format!(
            "; the same {tokens}-token history as one prompt on a fresh request diverges too (cosine {c:.4}): not the appending alone"
        )),
        Some(FreshControl {
            not_run: Some(why), ..
        }) => line.push_str(&format!("; fresh-request control not run ({why})")),
        _ => {}
    }
    if let Some(fit) = &f.fit {
        line.push_str(&format!("; {}", fit.line()));
    }
    Some(line)
}

/// `kvprobe chat`.
pub struct ChatProbe;

impl crate::probe::Probe for ChatProbe {
    fn name(&self) -> &'static str {
        "chat"
    }

    fn about(&self) -> &'static str {
        "A multi-turn chat appended to the same state without a reset, against the reference on the whole conversation"
    }

    fn run(
        &self,
        s: &mut Session,
        opts: &crate::probe::ProbeOptions,
        into: &mut kvprobe_schema::ProbeFindings,
    ) -> Result<()> {
        let f = run(s, opts.steps)?;
        crate::probe::store_extra(into, self.name(), &f)
    }
}

#[cfg(test)]
mod tests {
    use kvprobe_schema::{LogitComparison, MatchedStep};

    use super::*;

    /// The recorded row (QDQ SmolLM2 on HTP, position 7): the device and f32 agree on 198, the
    /// matched reference gives 1; f32 cosine 0.2956, matched 0.9815, band 31.48.
    fn recorded(matched_margin: f64) -> (GreedyStep, MatchedStep) {
        let m = MatchedStep {
            reference_vs_matched: 0.4250,
            matched_vs_device: 0.9815,
            matched_top1: 1,
            band: 31.48,
            matched_margin,
            jitter: None,
            stray: None,
            control_vs_matched: None,
        };
        let st = GreedyStep {
            step: 1,
            position: 7,
            input_token: 2,
            visible_keys: 7,
            comparison: LogitComparison {
                cosine: 0.2956,
                kl: 0.0,
                device_top1: 198,
                reference_top1: 198,
                top1_match: true,
            },
            reference_margin: 0.0,
            near_tie: false,
            matched: Some(m),
        };
        (st, m)
    }

    #[test]
    fn a_flip_against_the_matched_reference_is_a_near_tie_only_inside_its_band() {
        // inside the band the declared precision decides the order either way: no divergence
        let (st, m) = recorded(2.0);
        let j = against_matched(&st, &m, true);
        assert!(!j.comparison.top1_match && j.near_tie, "{j:?}");
        assert_eq!(disagrees(&j, 0.98), None);
        // the old judgement kept f32's "no flip, margin 0" beside matched's flip: a divergence
        let mut old = j.clone();
        old.near_tie = false;
        assert!(disagrees(&old, 0.98).is_some());
        // a gap wider than the band is a flip the declared precision cannot explain
        let (st, m) = recorded(40.0);
        let j = against_matched(&st, &m, true);
        assert!(!j.near_tie, "{j:?}");
        let why = disagrees(&j, 0.98).unwrap_or_default();
        assert!(
            why.starts_with("top-1 198 where the reference gives 1"),
            "{why}"
        );
    }
}
