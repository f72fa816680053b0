//! `capacity` (issue 20): prompts swept up to and past every limit the device declares
//! (`Device::limits`), and generation run past the end of the context, each against the
//! reference the documented behaviour gives: the full causal forward inside the limits, the
//! sliding window where the runtime documents one, a typed refusal where it documents one. A
//! request that answers with logits far from that reference, and no refusal, is silent garbage
//! (openvino.genai#3255: prompts past a compiled limit garbled, no error).
//!
//! Prompts are prefixes of one sequence (the session's prompt, then prose), so one reference
//! forward gives every prompt's last row. Generation is teacher-forced on the device's own
//! tokens (as `greedy`), so one divergence does not cascade.

use kvprobe_npu::{MaskMode, RunOutput};
use kvprobe_reference::{KvState, Model, PiecedRows};
use kvprobe_schema::{
    CapacityFinding, CapacityOutcome, CapacityPhase, CapacityPoint, DeviceLimit, LimitKind,
    LogitComparison, PastLimit, ProbeFindings,
};

pub use crate::capacity_record::CapacityRecord;
use crate::metrics::compare;
use crate::session::Session;
use crate::teacher_steps::step_rows;
use crate::thresholds::{REL_NOISE_FLOOR, REL_RATIO, STAGE_MEAN_COSINE, STAGE_MIN_COSINE};
use crate::Result;

/// Prompts evenly spread between the prefill rows and the cache in the full sweep: a device
/// that holds less than it declares goes wrong somewhere inside, not only at the edge.
const INSIDE_POINTS: usize = 4;
/// Generation: steps before the end of the context and past it (full sweep, quick check).
const STEPS_BEFORE: [usize; 2] = [4, 1];
const STEPS_PAST: [usize; 2] = [4, 2];

/// Least miss (1 − cosine) the relative test calls garbage: healthy emulators stay below 0.004
/// on the cheap check's rows (SmolLM2 L128/P32 INT8: 0.0037 at the step that fills the ring),
/// the capacity faults on the random-weight fixture miss by 0.04-1 (docs/diagnosis.md).
pub const CAPACITY_GAP: f64 = 0.02;

/// A row the device answered that misses its reference: below the stage floor per row (a
/// healthy INT8 device dips to 0.85 on an unlucky token, thresholds.rs), below the stage mean
/// with another top-1, or, relative to the device's own miss on its shortest prompt
/// (`noise`, 1 − cosine), `REL_RATIO` × further and by at least [`CAPACITY_GAP`]: a
/// random-weight fixture's flat logits keep even garbage above the absolute floors.
pub fn garbled(c: &LogitComparison, noise: f64) -> bool {
    let miss = 1.0 - c.cosine;
    c.cosine < STAGE_MIN_COSINE
        || (c.cosine < STAGE_MEAN_COSINE && !c.top1_match)
        || (miss >= REL_RATIO * noise.max(REL_NOISE_FLOOR) && miss >= CAPACITY_GAP)
}

/// The device's own miss on its shortest answered prompt (the session's, or the shortest the
/// sweep ran): one prefill run inside every limit, the cleanest control of the sweep. A longer
/// one may already sit past a limit the device does not declare.
fn own_noise(points: &[CapacityPoint]) -> f64 {
    points
        .iter()
        .filter(|x| x.phase == CapacityPhase::Prompt)
        .filter_map(|x| x.comparison.as_ref().map(|c| (x.tokens, 1.0 - c.cosine)))
        .min_by_key(|&(t, _)| t)
        .map_or(0.0, |(_, m)| m)
}

/// Marks the answered points that miss their reference (see [`garbled`]) and, where the
/// precision-matched reference was computed, miss it as well: a step where uint8 cache rounding
/// moves the device and the matched reference alike (a healthy SmolLM2 ring at the step that
/// fills it: 0.9725 against f32, 1.0000 against matched) is the precision's, not garbage.
///
/// A generation step past a limit must also jump away from the generation steps inside every
/// limit (`OVERFLOW_JUMP` × their worst miss, each against its nearer reference): a device whose
/// tbt steps already miss by 0.018 inside the cache and by 0.040 one step past it (SmolLM2,
/// positions shifted by one) has a tbt fault, not an overflow; a real overflow goes from ≈ 0.999
/// to ≈ 0.5.
fn classify(points: &mut [CapacityPoint]) {
    let noise = own_noise(points);
    for x in points.iter_mut() {
        if x.outcome == CapacityOutcome::Matches
            && x.comparison.as_ref().is_some_and(|c| garbled(c, noise))
            && x.matched.as_ref().is_none_or(|m| garbled(m, noise))
        {
            x.outcome = CapacityOutcome::Garbled;
        }
    }
    let inside = points
        .iter()
        .filter(|x| x.phase == CapacityPhase::Generation && x.beyond.is_empty())
        .filter(|x| x.outcome == CapacityOutcome::Matches)
        .filter_map(least_miss)
        .fold(0.0, f64::max);
    for x in points.iter_mut() {
        let past = x.phase == CapacityPhase::Generation && !x.beyond.is_empty();
        let miss = least_miss(x).unwrap_or(0.0);
        if past && x.outcome == CapacityOutcome::Garbled && miss < OVERFLOW_JUMP * inside {
            x.outcome = CapacityOutcome::Matches;
        }
    }
}

/// A point's miss against the nearer of its references (f32, precision-matched when computed):
/// the healthy ring step the cache rounding moves (f32 0.9725, matched 1.0) has none.
fn least_miss(x: &CapacityPoint) -> Option<f64> {
    let f32 = 1.0 - x.comparison.as_ref()?.cosine;
    Some(x.matched.as_ref().map_or(f32, |m| f32.min(1.0 - m.cosine)))
}

/// How many times the worst miss of the in-limit generation steps a step past a limit must miss
/// to count as an overflow (see [`classify`]).
pub const OVERFLOW_JUMP: f64 = 3.0;

/// The strongest documented behaviour among the limits a length reaches: a refusal decides,
/// then a window, then a split (which changes nothing the reference sees).
fn strongest(b: impl Iterator<Item = PastLimit>) -> Option<PastLimit> {
    b.max_by_key(|x| match x {
        PastLimit::Split => 0,
        PastLimit::Slides => 1,
        PastLimit::Refused => 2,
    })
}

/// Limits a prompt of `t` tokens reaches, what the runtime documents there, and its window.
fn prompt_rule(
    limits: &[DeviceLimit],
    t: usize,
) -> (Vec<LimitKind>, Option<PastLimit>, Option<usize>) {
    let hit: Vec<&DeviceLimit> = limits
        .iter()
        .filter(|l| l.prompt.is_some() && t >= l.value)
        .collect();
    let documented = strongest(hit.iter().filter_map(|l| l.prompt));
    let window = hit
        .iter()
        .filter(|l| l.prompt == Some(PastLimit::Slides))
        .map(|l| l.value)
        .min();
    (hit.iter().map(|l| l.kind).collect(), documented, window)
}

/// Limits a step whose query sees `c` tokens passes.
fn step_rule(limits: &[DeviceLimit], c: usize) -> (Vec<LimitKind>, Option<PastLimit>) {
    let hit: Vec<&DeviceLimit> = limits
        .iter()
        .filter(|l| l.generation.is_some() && c > l.value)
        .collect();
    (
        hit.iter().map(|l| l.kind).collect(),
        strongest(hit.iter().filter_map(|l| l.generation)),
    )
}

/// The longest prompt the limits accept (one below the smallest refusing prompt limit).
pub fn longest_prompt(limits: &[DeviceLimit]) -> Option<usize> {
    limits
        .iter()
        .filter(|l| l.prompt == Some(PastLimit::Refused))
        .map(|l| l.value.saturating_sub(1))
        .min()
}

/// Prompt lengths of the full sweep: the session's prompt, each limit −1/0/+1, and
/// [`INSIDE_POINTS`] between the prefill rows and the longest accepted prompt.
pub fn prompt_lengths(limits: &[DeviceLimit], session_len: usize) -> Vec<usize> {
    let mut ks = vec![session_len];
    for l in limits {
        ks.extend([l.value.saturating_sub(1), l.value, l.value + 1]);
    }
    let lo = limits
        .iter()
        .filter(|l| l.kind == LimitKind::PrefillLen)
        .map(|l| l.value + 1)
        .min()
        .unwrap_or(1);
    if let Some(hi) = longest_prompt(limits).filter(|&hi| hi > lo) {
        ks.extend((1..=INSIDE_POINTS).map(|i| lo + i * (hi - lo) / (INSIDE_POINTS + 1)));
    }
    ks.retain(|&k| k >= 1);
    ks.sort_unstable();
    ks.dedup();
    ks
}

/// Ordinary prose a long prompt continues the session's with (written for this probe): a
/// capacity fault shows where earlier context matters, and text keeps the attention ordinary,
/// unlike one token repeated (whose degenerate attention the healthy fp16 ane-sim misses by
/// 0.05) or random ids (whose flat context hides a lost beginning).
const FILLER: &str = "The old lighthouse keeper climbed the stairs every evening at dusk. \
He counted the steps out loud, one hundred and twelve of them, and at the top he wiped the \
glass, trimmed the wick and wrote the weather in a small green notebook. Ships passed far out \
at sea, and sometimes one of them answered his light with a short blast of its horn. In the \
winter the wind came from the north and the waves broke white against the rocks below the \
tower. His daughter lived in the town across the bay, where she taught arithmetic and \
geography to thirty children in a school with a red roof. On Sundays she rowed over with \
bread, apples and the newspaper, and they ate lunch at the wooden table by the window while \
gulls argued on the railing outside. She asked him once why he never left the island. He said \
that somebody had to keep the light, and that the sea was never the same two days in a row. \
When the new electric lamp arrived by boat, he read the manual twice, checked every wire and \
still climbed the stairs each evening, because habits, like lighthouses, are built to last.";

/// The session's prompt, then [`FILLER`] (repeated as needed), `len` tokens in all.
fn long_ids(s: &Session, len: usize) -> Result<Vec<u32>> {
    let filler = s.model.encode(FILLER, Some(false))?;
    if filler.is_empty() {
        return Err(crate::Error::Input(
            "the model's tokenizer turns the capacity probe's prose into no tokens; use a model whose tokenizer encodes English text".into(),
        ));
    }
    let mut out: Vec<u32> = s.ids.iter().copied().take(len).collect();
    out.extend(filler.iter().copied().cycle().take(len - out.len()));
    Ok(out)
}

/// Reference logits of the rows `want` of `seq` (those inside the model's context, in order),
/// each row seeing the newest `window` tokens (all when `None`). Computed in pieces: a one-piece
/// forward over the model's whole context holds its square in scores and every row's logits.
fn reference_rows(
    model: &Model,
    seq: &[u32],
    window: Option<usize>,
    want: impl IntoIterator<Item = usize>,
) -> Result<Vec<Vec<f32>>> {
    Ok(causal_rows_and_prefix(model, seq, window, want, 0)?
        .rows
        .into_iter()
        .map(|(_, r)| r)
        .collect())
}

/// The reference rows `want` of `seq` (as [`reference_rows`], with their row numbers) and the
/// keys and values of its first `keep` tokens, from one pass (generation continues from them
/// instead of a second forward over the prompt).
fn causal_rows_and_prefix(
    model: &Model,
    seq: &[u32],
    window: Option<usize>,
    want: impl IntoIterator<Item = usize>,
    keep: usize,
) -> Result<PiecedRows> {
    let t = seq.len().min(model.config().max_position);
    let mut want: Vec<usize> = want.into_iter().filter(|&r| r < t).collect();
    want.sort_unstable();
    want.dedup();
    Ok(model.rows_in_pieces(&seq[..t], &want, window, keep)?)
}

/// Refusal or output of one request.
fn outcome(
    r: kvprobe_npu::Result<RunOutput>,
    reference: Option<&Vec<f32>>,
    documented: Option<PastLimit>,
) -> Result<(Option<String>, Option<LogitComparison>, CapacityOutcome)> {
    match r {
        // where the runtime documents a refusal an answer is the failure itself; elsewhere
        // provisional: `classify` marks the garbled ones once the device's own miss is known
        Ok(out) => Ok((
            None,
            reference.map(|r| compare(&out.logits, r)),
            if documented == Some(PastLimit::Refused) {
                CapacityOutcome::Unrefused
            } else {
                CapacityOutcome::Matches
            },
        )),
        Err(e) if e.is_capacity_refusal() => {
            let o = if documented == Some(PastLimit::Refused) {
                CapacityOutcome::Refused
            } else {
                CapacityOutcome::RefusedEarly
            };
            Ok((Some(e.to_string()), None, o))
        }
        Err(e) => Err(e.into()),
    }
}

/// One prompt after a reset.
fn prompt_point(
    s: &mut Session,
    limits: &[DeviceLimit],
    seq: &[u32],
    causal: &[(usize, Vec<f32>)],
    t: usize,
) -> Result<(CapacityPoint, Option<RunOutput>, Option<Vec<f32>>)> {
    let (beyond, documented, window) = prompt_rule(limits, t);
    s.driver.reset(s.dev)?;
    let r = s.driver.prefill(s.dev, &seq[..t]);
    let kept = r.as_ref().ok().cloned();
    let windowed;
    let reference = match window {
        Some(w) => {
            windowed = reference_rows(s.model, &seq[..t], Some(w), [t - 1])?;
            windowed.first()
        }
        None => causal.iter().find(|(r, _)| *r == t - 1).map(|(_, r)| r),
    };
    let (refusal, comparison, outcome) = outcome(r, reference, documented)?;
    s.progress.inc(1);
    // the prompt at the declared precision, as the generation steps have it, where the f32
    // comparison misses by more than any noise (a declared int4 model's 7-token prompt: 0.85)
    let matched = match (&kept, &comparison) {
        (Some(out), Some(c)) if garbled(c, 0.0) => {
            let desc = s.dev.describe();
            match crate::matched::Precision::of(desc, s.model)? {
                Some(p) => crate::matched::greedy_logits(
                    s.model,
                    &p,
                    &seq[..t],
                    t,
                    1,
                    desc.cache_len,
                    desc.prefill_len,
                )?
                .first()
                .map(|m| compare(&out.logits, m)),
                None => None,
            }
        }
        _ => None,
    };
    let point = CapacityPoint {
        phase: CapacityPhase::Prompt,
        tokens: t,
        beyond,
        documented,
        window,
        refusal,
        comparison,
        matched,
        outcome,
    };
    Ok((point, kept, reference.cloned()))
}

/// Where generation starts and ends, the reference's keys and values of `seq[..g0]`, and the
/// device's own miss on its shortest prompt.
struct Generation {
    g0: usize,
    end: usize,
    prefix: KvState,
    noise: f64,
}

/// Greedy steps from the device's state right after the prefill of `seq[..g0]` (whose logits
/// are `first`), until `past` steps beyond the smallest generation limit or a refusal.
fn generation(
    s: &mut Session,
    limits: &[DeviceLimit],
    seq: &[u32],
    first: &RunOutput,
    gen: Generation,
    record: &mut CapacityRecord,
) -> Result<Vec<CapacityPoint>> {
    let Generation {
        g0,
        end,
        prefix,
        noise,
    } = gen;
    let max_pos = s.model.config().max_position;
    let mut toks = vec![kvprobe_npu::argmax(&first.logits)];
    let mut answered: Vec<(usize, RunOutput)> = Vec::new();
    let mut refused: Option<(usize, String)> = None;
    for c in g0 + 1..=end.min(max_pos) {
        let last = *toks.last().unwrap_or(&0);
        match s.driver.step(s.dev, last, &MaskMode::Ring) {
            Ok(out) => {
                toks.push(kvprobe_npu::argmax(&out.logits));
                answered.push((c, out));
            }
            Err(e) if e.is_capacity_refusal() => {
                refused = Some((c, e.to_string()));
                break;
            }
            Err(e) => return Err(e.into()),
        }
        s.progress.inc(1);
    }
    let window = limits
        .iter()
        .filter(|l| l.generation == Some(PastLimit::Slides))
        .map(|l| l.value)
        .min();
    let mut teacher = seq[..g0].to_vec();
    teacher.extend_from_slice(&toks[..answered.len()]);
    // the prompt's keys are the causal forward's unless a window already cut into the prompt
    let reference = if window.is_some_and(|w| g0 > w) {
        reference_rows(s.model, &teacher, window, g0..teacher.len())?
    } else {
        step_rows(s.model, prefix, &toks[..answered.len()], window)?
    };
    let missed = answered.iter().any(|(c, out)| {
        reference
            .get(c - 1 - g0)
            .is_some_and(|r| garbled(&compare(&out.logits, r), noise))
    });
    // the same steps at the declared precision, driven as the runtime drives them: step t of
    // greedy_logits is the row at position g0 − 1 + t, the step that sees g0 + t tokens. Only a
    // step that misses f32 needs it (`classify`): a whole second forward otherwise.
    let desc = s.dev.describe();
    let matched = match crate::matched::Precision::of(desc, s.model)? {
        Some(p) if missed => Some(crate::matched::greedy_logits(
            s.model,
            &p,
            &teacher,
            g0,
            answered.len() + 1,
            desc.cache_len,
            desc.prefill_len,
        )?),
        _ => None,
    };
    let answered_len = answered.len();
    let mut points = Vec::new();
    for (c, out) in answered {
        let (beyond, documented) = step_rule(limits, c);
        let vs_matched = matched
            .as_ref()
            .and_then(|m| m.get(c - g0))
            .map(|m| compare(&out.logits, m));
        let row = reference.get(c - 1 - g0);
        record.device.push(Some(out.logits.clone()));
        record.reference.push(row.cloned());
        let (refusal, comparison, outcome) = outcome(Ok(out), row, documented)?;
        points.push(CapacityPoint {
            phase: CapacityPhase::Generation,
            tokens: c,
            beyond,
            window: window.filter(|&w| c > w),
            documented,
            refusal,
            comparison,
            matched: vs_matched,
            outcome,
        });
    }
    record.fed = toks[..(answered_len + usize::from(refused.is_some())).min(toks.len())].to_vec();
    if let Some((c, why)) = refused {
        record.device.push(None);
        record.reference.push(None);
        let (beyond, documented) = step_rule(limits, c);
        let (refusal, comparison, outcome) = outcome(
            Err(kvprobe_npu::Error::ContextFull { max_ctx: c - 1 }),
            None,
            documented,
        )?;
        points.push(CapacityPoint {
            phase: CapacityPhase::Generation,
            tokens: c,
            beyond,
            window: None,
            documented,
            refusal: refusal.map(|_| why),
            comparison,
            matched: None,
            outcome,
        });
    }
    Ok(points)
}

/// The sweep (`quick`: `diagnose`'s cheap check: the session's prompt, one prompt past the
/// longest accepted, the longest accepted, and the steps around the end of the context from it).
pub fn run(s: &mut Session, quick: bool) -> Result<CapacityFinding> {
    Ok(run_recorded(s, quick)?.0)
}

/// [`run`] with what the device answered to each request, for the replays that judge a garbled
/// answer (issue 34, `capacity_record`).
pub fn run_recorded(s: &mut Session, quick: bool) -> Result<(CapacityFinding, CapacityRecord)> {
    let limits = s.dev.limits();
    let n = s.ids.len();
    let longest = longest_prompt(&limits).unwrap_or(n);
    let gen_limit = limits
        .iter()
        .filter(|l| l.generation.is_some())
        .map(|l| l.value)
        .min()
        .unwrap_or(longest + 1);
    let q = usize::from(quick);
    let g0 = gen_limit
        .saturating_sub(STEPS_BEFORE[q])
        .clamp(1, longest.max(1));
    let end = gen_limit + STEPS_PAST[q];
    // the generation starts from the state of the last prompt, g0
    // quick: the session's prompt too (its controls passed: the device's own miss)
    let mut lengths = if quick {
        vec![n, longest + 1]
    } else {
        prompt_lengths(&limits, n)
    };
    lengths.retain(|&t| t != g0);
    lengths.push(g0);
    let top = lengths.iter().copied().max().unwrap_or(n);
    let seq = long_ids(s, top.max(end))?;
    s.progress
        .phase("capacity", (lengths.len() + end.saturating_sub(g0)) as u64);
    let rows = lengths.iter().map(|&t| t.saturating_sub(1));
    let PiecedRows {
        rows: causal,
        prefix,
    } = causal_rows_and_prefix(s.model, &seq[..top], None, rows, g0)?;
    let mut record = CapacityRecord {
        lengths: lengths.clone(),
        ..CapacityRecord::default()
    };
    let mut points = Vec::new();
    let mut start: Option<RunOutput> = None;
    for &t in &lengths {
        let (p, out, reference) = prompt_point(s, &limits, &seq, &causal, t)?;
        record.device.push(out.as_ref().map(|o| o.logits.clone()));
        record.reference.push(reference);
        points.push(p);
        start = out;
    }
    if let Some(first) = start {
        let noise = own_noise(&points);
        let gen = Generation {
            g0,
            end,
            prefix,
            noise,
        };
        points.extend(generation(s, &limits, &seq, &first, gen, &mut record)?);
    }
    record.seq = seq;
    classify(&mut points);
    let first_garbled_prompt = first_garbled(&points, CapacityPhase::Prompt);
    let first_garbled_context = first_garbled(&points, CapacityPhase::Generation);
    let finding = CapacityFinding {
        silent_overflow: points.iter().any(|p| {
            matches!(
                p.outcome,
                CapacityOutcome::Garbled | CapacityOutcome::Unrefused
            )
        }),
        limits,
        points,
        generation_prompt: g0,
        first_garbled_prompt,
        first_garbled_context,
        quick,
    };
    Ok((finding, record))
}

fn first_garbled(points: &[CapacityPoint], phase: CapacityPhase) -> Option<usize> {
    points
        .iter()
        .filter(|p| p.phase == phase && p.outcome == CapacityOutcome::Garbled)
        .map(|p| p.tokens)
        .min()
}

/// `kvprobe capacity`.
pub struct CapacityProbe;

impl crate::probe::Probe for CapacityProbe {
    fn name(&self) -> &'static str {
        "capacity"
    }

    fn about(&self) -> &'static str {
        "Prompts up to and past every limit the device declares, and generation past the end: where the output goes wrong, and whether the runtime refused or garbled silently"
    }

    fn run(
        &self,
        s: &mut Session,
        _opts: &crate::probe::ProbeOptions,
        into: &mut ProbeFindings,
    ) -> Result<()> {
        let f = run(s, false)?;
        crate::probe::store_extra(into, self.name(), &f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvprobe_reference::ForwardOptions;

    /// Generation's reference rows come from the prompt's keys and the steps run in chunks (of
    /// one token, three, and `STEP_CHUNK`);
    /// they must be the rows of one forward over the whole sequence (causal, and windowed as
    /// the runtime slides), the property "a decode step equals the last row of a full forward".
    #[test]
    fn step_rows_are_the_full_forwards_rows() {
        let dir = tempfile::tempdir().expect("tempdir");
        kvprobe_reference::fixtures::write_tiny_llama(dir.path(), 7).expect("fixture");
        let model = Model::load(dir.path()).expect("load");
        let seq: Vec<u32> = (0..30).map(|i| 3 + (i * 37) % 250).collect();
        let g0 = 20;
        for window in [None, Some(24)] {
            let mask = window.map(|w| {
                let t = seq.len();
                (0..t * t)
                    .map(|k| (k % t) <= (k / t) && (k / t) - (k % t) < w)
                    .collect()
            });
            let full = model
                .forward(
                    &seq,
                    &ForwardOptions {
                        mask,
                        ..Default::default()
                    },
                )
                .expect("forward");
            let PiecedRows {
                rows: causal,
                prefix,
            } = causal_rows_and_prefix(&model, &seq, None, 0..seq.len(), g0).expect("prefix");
            assert_eq!(causal.len(), seq.len());
            if window.is_none() {
                for (r, row) in &causal {
                    let worst = row
                        .iter()
                        .zip(full.row(*r))
                        .map(|(a, b)| (a - b).abs())
                        .fold(0f32, f32::max);
                    assert!(worst < 1e-4, "causal row {r}: {worst}");
                }
            }
            let one =
                crate::teacher_steps::step_rows_in(&model, prefix.clone(), &seq[g0..], window, 1)
                    .expect("steps");
            let rows = step_rows(&model, prefix.clone(), &seq[g0..], window).expect("steps");
            let threes = crate::teacher_steps::step_rows_in(&model, prefix, &seq[g0..], window, 3)
                .expect("steps");
            assert_eq!(rows.len(), seq.len() - g0);
            assert_eq!((one.len(), threes.len()), (rows.len(), rows.len()));
            let all = rows.iter().chain(&one).chain(&threes);
            for (k, row) in all.enumerate() {
                let i = k % rows.len();
                let want = full.row(g0 + i);
                let worst = row
                    .iter()
                    .zip(want)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                assert!(worst < 1e-4, "{window:?} row {}: {worst}", g0 + i);
                assert!(crate::metrics::cosine(row, want) > 0.999_999);
            }
        }
    }

    fn lim(
        kind: LimitKind,
        value: usize,
        p: Option<PastLimit>,
        g: Option<PastLimit>,
    ) -> DeviceLimit {
        DeviceLimit {
            kind,
            value,
            prompt: p,
            generation: g,
            source: String::new(),
        }
    }

    fn ring() -> Vec<DeviceLimit> {
        vec![
            lim(LimitKind::PrefillLen, 32, Some(PastLimit::Split), None),
            lim(
                LimitKind::CacheLen,
                128,
                Some(PastLimit::Refused),
                Some(PastLimit::Slides),
            ),
        ]
    }

    #[test]
    fn a_prompt_that_reaches_the_cache_is_refused_and_a_step_past_it_slides() {
        let l = ring();
        assert_eq!(prompt_rule(&l, 31), (vec![], None, None));
        assert_eq!(
            prompt_rule(&l, 33),
            (vec![LimitKind::PrefillLen], Some(PastLimit::Split), None)
        );
        assert_eq!(prompt_rule(&l, 128).1, Some(PastLimit::Refused));
        assert_eq!(step_rule(&l, 128), (vec![], None));
        assert_eq!(
            step_rule(&l, 129),
            (vec![LimitKind::CacheLen], Some(PastLimit::Slides))
        );
        assert_eq!(longest_prompt(&l), Some(127));
    }

    #[test]
    fn the_sweep_brackets_every_limit_and_looks_inside() {
        let ks = prompt_lengths(&ring(), 20);
        for k in [20, 31, 32, 33, 127, 128, 129] {
            assert!(ks.contains(&k), "{k} in {ks:?}");
        }
        // 4 points strictly between 33 and 127
        assert_eq!(ks.iter().filter(|&&k| k > 33 && k < 127).count(), 4);
    }

    /// The healthy SmolLM2 ring of the healthy sweep (L 83, P 73): the step that fills it misses
    /// f32 by 0.0275 and the precision-matched reference by nothing; a dropped entry misses both.
    #[test]
    fn a_miss_the_matched_reference_shares_is_not_garbage() {
        let cmp = |cosine: f64| LogitComparison {
            cosine,
            kl: 0.0,
            device_top1: 1,
            reference_top1: 1,
            top1_match: true,
        };
        let point = |tokens, f32: f64, matched: f64| CapacityPoint {
            phase: if tokens == 64 {
                CapacityPhase::Prompt
            } else {
                CapacityPhase::Generation
            },
            tokens,
            beyond: Vec::new(),
            documented: None,
            window: None,
            refusal: None,
            comparison: Some(cmp(f32)),
            matched: Some(cmp(matched)),
            outcome: CapacityOutcome::Matches,
        };
        let mut pts = vec![
            point(64, 1.0, 1.0),
            point(83, 0.9725, 1.0),
            point(84, 0.9725, 0.97),
        ];
        classify(&mut pts);
        let outcomes: Vec<_> = pts.iter().map(|p| p.outcome).collect();
        assert_eq!(
            outcomes,
            [
                CapacityOutcome::Matches,
                CapacityOutcome::Matches,
                CapacityOutcome::Garbled
            ]
        );
    }

    /// SmolLM2 with every tbt position shifted by one (sweep 7070 #23): the step past the cache
    /// misses 2.2 × the in-cache step (each against its nearer reference), no jump; a dropped
    /// ring entry past a clean cache (0 → 0.03) is one.
    #[test]
    fn a_step_past_the_limit_must_jump_away_from_the_steps_inside() {
        let cmp = |cosine: f64| LogitComparison {
            cosine,
            kl: 0.0,
            device_top1: 1,
            reference_top1: 1,
            top1_match: true,
        };
        let step = |tokens, past: bool, f32: f64, matched: f64| CapacityPoint {
            phase: CapacityPhase::Generation,
            tokens,
            beyond: if past {
                vec![LimitKind::CacheLen]
            } else {
                Vec::new()
            },
            documented: past.then_some(PastLimit::Slides),
            window: None,
            refusal: None,
            comparison: Some(cmp(f32)),
            matched: Some(cmp(matched)),
            outcome: CapacityOutcome::Matches,
        };
        let prompt = CapacityPoint {
            phase: CapacityPhase::Prompt,
            matched: None,
            ..step(48, false, 0.9998, 0.9998)
        };
        let mut pts = vec![
            prompt.clone(),
            step(54, false, 0.9744, 0.9821),
            step(55, true, 0.9602, 0.9569),
        ];
        classify(&mut pts);
        assert_eq!(pts[2].outcome, CapacityOutcome::Matches);
        let mut pts = vec![
            prompt.clone(),
            step(54, false, 0.9725, 1.0),
            step(55, true, 0.9602, 0.97),
        ];
        classify(&mut pts);
        assert_eq!(pts[2].outcome, CapacityOutcome::Garbled);
        // garbage inside the limits is never excused by the jump
        let mut pts = vec![prompt, step(54, false, 0.5, 0.5), step(55, true, 0.5, 0.5)];
        classify(&mut pts);
        assert_eq!(pts[1].outcome, CapacityOutcome::Garbled);
    }

    #[test]
    fn garbled_needs_a_real_miss() {
        let c = |cosine, top1_match| LogitComparison {
            cosine,
            kl: 0.0,
            device_top1: 0,
            reference_top1: 0,
            top1_match,
        };
        // absolute floors, whatever the device's own miss
        assert!(!garbled(&c(0.99, false), 0.01));
        assert!(!garbled(&c(0.9, true), 0.01));
        assert!(garbled(&c(0.9, false), 0.01));
        assert!(garbled(&c(0.5, true), 0.01));
        // relative: 20× the device's own miss and at least 0.02
        assert!(garbled(&c(0.97, true), 1e-5));
        assert!(!garbled(&c(0.99, true), 1e-5));
        assert!(!garbled(&c(0.97, true), 2e-3));
    }
}
