//! What a capacity check asked and what the device answered (issue 34): kept so that a garbled
//! answer is judged by replay. A hypothesis' emulator is sent the same requests — each prompt
//! after a reset, then the generation fed the device's own tokens — and its answers are compared
//! with the device's point by point (`diagnose::capacity_replay`).

use kvprobe_npu::MaskMode;

use crate::session::Session;
use crate::Result;

/// The capacity check that ended a diagnosis and what the device answered to each request:
/// what the verdict's replays are judged on.
#[derive(Debug, Clone)]
pub struct CapacityEvidence {
    pub finding: kvprobe_schema::CapacityFinding,
    pub record: CapacityRecord,
}

/// One capacity check's requests and the device's answers, in the order of its points.
#[derive(Debug, Clone, Default)]
pub struct CapacityRecord {
    /// The token sequence every request reads (each prompt is a prefix of it).
    pub seq: Vec<u32>,
    /// Prompt lengths in the order they ran; the generation continues from the last one.
    pub lengths: Vec<usize>,
    /// The tokens the generation fed, in order: the device's own argmax after each answer.
    pub fed: Vec<u32>,
    /// The device's logits per point (`None`: refused), prompts first, then generation steps.
    pub device: Vec<Option<Vec<f32>>>,
    /// The f32 reference's row per point, where the check compared one.
    pub reference: Vec<Option<Vec<f32>>>,
}

impl CapacityRecord {
    /// The same requests on `s`'s device from a fresh start, answers for the points `..upto`
    /// (fewer when a refusal ends the generation early: the rest are refused too). A refusal is
    /// `None`; any other device error is the replay's error.
    pub fn replay(&self, s: &mut Session, upto: usize) -> Result<Vec<Option<Vec<f32>>>> {
        // from a fresh start (rings cleared, a new process' host window), as the device's own
        // answers are recorded again before any replay is compared with them: a fault that
        // keeps stale bytes (a truncated prefill restores the slots it skipped) reads the same
        // history on both sides
        crate::determinism::fresh_start(s)?;
        let upto = upto.min(self.device.len());
        let mut out: Vec<Option<Vec<f32>>> = Vec::with_capacity(upto);
        let mut last_answered = false;
        for &t in &self.lengths {
            if out.len() >= upto {
                return Ok(out);
            }
            s.driver.reset(s.dev)?;
            let answer = refusal_is_none(s.driver.prefill(s.dev, &self.seq[..t]))?;
            last_answered = answer.is_some();
            out.push(answer);
        }
        for &tok in &self.fed {
            if out.len() >= upto {
                break;
            }
            if !last_answered {
                out.push(None);
                continue;
            }
            let answer = refusal_is_none(s.driver.step(s.dev, tok, &MaskMode::Ring))?;
            last_answered = answer.is_some();
            out.push(answer);
        }
        Ok(out)
    }

    /// A prompt of `t` tokens of the sequence from a fresh start, then one step fed its next token:
    /// both answers (`None`: refused). What measures where a device stops answering as its
    /// healthy hypothesis does (`diagnose::capacity_replay::departure`).
    pub fn prompt_and_step(&self, s: &mut Session, t: usize) -> Result<(Answer, Answer)> {
        let next = *self.seq.get(t).ok_or_else(|| {
            crate::Error::Input(format!(
                "the capacity check's sequence has {} tokens, no token after a prompt of {t}",
                self.seq.len()
            ))
        })?;
        crate::determinism::fresh_start(s)?;
        let prompt = refusal_is_none(s.driver.prefill(s.dev, &self.seq[..t]))?;
        let step = match prompt {
            Some(_) => refusal_is_none(s.driver.step(s.dev, next, &MaskMode::Ring))?,
            None => None,
        };
        Ok((prompt, step))
    }
}

/// One answer's logits; `None`: refused.
pub type Answer = Option<Vec<f32>>;

/// An answer's logits, a capacity refusal as `None`, any other error as the error.
pub(crate) fn refusal_is_none(r: kvprobe_npu::Result<kvprobe_npu::RunOutput>) -> Result<Answer> {
    match r {
        Ok(o) => Ok(Some(o.logits)),
        Err(e) if e.is_capacity_refusal() => Ok(None),
        Err(e) => Err(e.into()),
    }
}
