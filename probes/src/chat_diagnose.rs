//! The cheap chat `diagnose` runs when every control passed (issue 37): the session's prompt and
//! one follow-up turn appended to the same state without a reset, a few greedy steps each
//! ([`crate::chat`]). Every control of a diagnosis runs one request from a reset; a device that
//! is right on a fresh request and wrong once a turn is appended to what it kept (a chat
//! pipeline's position ids restarted for the new turn, a host that drops or reorders the appended
//! piece) passes them all. When the chat diverges the healthy verdict does not stand: the
//! diagnosis becomes `unknown` with the chat's line first (where it diverged, and whether the
//! same history as one prompt on a fresh request agrees, which puts the fault on the appending).

use std::time::Instant;

use kvprobe_schema::{Hypothesis, ProbeFindings, Timing, Verdict};

use crate::chat;
use crate::session::Session;
use crate::{Error, Result};

/// Turns of diagnose's chat: the prompt and one appended follow-up, the least that crosses a
/// turn boundary.
pub const TURNS: usize = 2;

/// Greedy rows a turn (its prefill row and two generated tokens).
pub const STEPS: usize = 3;

/// The rule id results.json's `hypothesis.rule` carries when the chat overrides a healthy
/// verdict: the chat's wiring fit named the cause (its cause line is the decisive one), or the
/// chat diverged and no wiring reproduced it (`unknown`). Neither is a rule of the tables: the
/// chat runs after them, like `replay-score`.
pub const RULE_WIRING: &str = "chat-wiring";
pub const RULE_DIVERGED: &str = "chat-diverged";

/// A diagnosis's parts the chat reads and writes (diagnose's `Diagnosis`, which this module does
/// not import: diagnose calls it).
pub struct Outcome<'a> {
    pub verdict: &'a mut Verdict,
    pub confidence: &'a mut f64,
    /// The healthy rule's hypothesis, replaced by the chat's when it overrides the verdict.
    pub hypothesis: &'a mut Option<Hypothesis>,
    pub evidence: &'a mut Vec<String>,
    pub probes: &'a mut ProbeFindings,
    pub timings: &'a mut Vec<Timing>,
}

/// Runs the chat on a healthy diagnosis of a device that can append, and records it: the finding
/// in `probes.extra["chat"]`, its line in the evidence, its time in the timings.
pub fn attach(s: &mut Session, d: Outcome<'_>) -> Result<()> {
    if *d.verdict != Verdict::Healthy {
        return Ok(());
    }
    if !s.has_tbt() {
        d.evidence
            .push("chat not run: the device has no token-by-token path to append a turn to".into());
        return Ok(());
    }
    let t = Instant::now();
    let f = match chat::run_turns(s, STEPS, TURNS) {
        Ok(f) => f,
        // the prompt leaves no room for a second turn: said, the verdict stands
        Err(Error::Input(why)) => {
            d.evidence.push(format!("chat not run: {why}"));
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    d.timings.push(Timing {
        what: "chat".into(),
        seconds: t.elapsed().as_secs_f64(),
    });
    crate::probe::store_extra(d.probes, "chat", &f)?;
    // a host wiring that reproduces the diverging turns within the declared precision
    let named = f
        .fit
        .as_ref()
        .and_then(|w| w.cause().map(|c| (w.wiring.verdict(), c)));
    let line = chat::evidence(&f);
    match (line, named) {
        (Some(line), Some((verdict, cause))) => {
            *d.verdict = verdict;
            *d.confidence = 0.8;
            *d.hypothesis = Some(Hypothesis {
                rule: RULE_WIRING.into(),
                decisive: vec![cause.clone()],
                fault: None,
            });
            d.evidence.insert(0, format!("→ chat: {cause}"));
            d.evidence.insert(
                1,
                format!("{line}; every single-request control passed, so `healthy` does not stand"),
            );
        }
        (Some(line), None) => {
            *d.verdict = Verdict::Unknown;
            *d.confidence = 0.3;
            let head =
                format!("{line}; every single-request control passed, so `healthy` does not stand");
            *d.hypothesis = Some(Hypothesis {
                rule: RULE_DIVERGED.into(),
                decisive: vec![head.clone()],
                fault: None,
            });
            d.evidence.insert(0, head);
        }
        (None, _) if f.turns.len() < 2 => d.evidence.push(format!(
            "chat: only the first turn ran, nothing was appended ({})",
            f.not_run.as_deref().unwrap_or("the context is full")
        )),
        (None, _) => {
            let rows: usize = f.turns.iter().map(|t| t.steps.len()).sum();
            let min = f.turns.iter().map(|t| t.min_cosine).fold(1.0, f64::min);
            // judged against the declared precision where the matched reference models it
            // (chat::against_declared); the min is the f32 reference's
            let judged = f
                .matched
                .as_deref()
                .filter(|_| crate::matched::models_everything(s.describe()))
                .map(|m| format!(" at the declared precision ({m})"))
                .unwrap_or_default();
            d.evidence.push(format!(
                "chat: {} turns appended to one state without a reset agree with the reference{judged} ({rows} rows, min cosine against the f32 reference {min:.4})",
                f.turns.len()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use kvprobe_npu::coreml::{AneDevice, AneOptions, POSITION_IDS};
    use kvprobe_npu::{Buffer, Device, RunOutput};
    use kvprobe_reference::Model;
    use kvprobe_schema::{DeviceDescription, GroupKind};

    use crate::diagnose::{diagnose, DiagnoseOptions, Diagnosis};
    use crate::progress::NoProgress;

    use super::*;

    /// A chat pipeline's fault at a turn boundary: the host counts a new turn's position ids
    /// from the prompts it fed, forgetting the tokens generated since the reset, so a multi-row
    /// call after token-by-token steps starts that many positions early (its K/V overwrite the
    /// generated tokens'). A fresh request, a prompt fed in chunks and every step are untouched.
    struct RestartedTurn<'d> {
        inner: &'d mut dyn Device,
        generated: usize,
        /// Fail (as the device) the first multi-row call after token steps instead: a runtime
        /// that cannot append a turn to the state it kept.
        fails: bool,
    }

    impl Device for RestartedTurn<'_> {
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
            let mut inputs = inputs.to_vec();
            for (name, b) in &mut inputs {
                if let Buffer::F32(p) = b {
                    if name.as_str() == POSITION_IDS {
                        if p.len() == 1 {
                            self.generated += 1;
                        } else if self.fails && self.generated > 0 {
                            return Err(kvprobe_npu::Error::Device(
                                "the appended turn's run was refused".into(),
                            ));
                        } else {
                            let back = self.generated as f32;
                            p.iter_mut().for_each(|x| *x -= back);
                        }
                    }
                }
            }
            self.inner.run(group, &inputs)
        }
        fn init_cache(&mut self, read_offset: u32) -> kvprobe_npu::Result<()> {
            self.generated = 0;
            self.inner.init_cache(read_offset)
        }
        fn update_cache_offset(&mut self, delta: i32) -> kvprobe_npu::Result<()> {
            self.inner.update_cache_offset(delta)
        }
        fn cache_buffers(&mut self) -> kvprobe_npu::Result<BTreeMap<u32, Vec<u8>>> {
            self.inner.cache_buffers()
        }
        fn write_cache_buffer(&mut self, id: u32, bytes: &[u8]) -> kvprobe_npu::Result<()> {
            self.inner.write_cache_buffer(id, bytes)
        }
    }

    fn diagnosed(faulty: bool) -> Diagnosis {
        run_wrapped(faulty, false).expect("diagnose")
    }

    fn run_wrapped(faulty: bool, fails: bool) -> crate::Result<Diagnosis> {
        let dir = tempfile::tempdir().expect("tempdir");
        kvprobe_reference::fixtures::write_tiny_llama(dir.path(), 7).expect("fixture");
        let model = Arc::new(Model::load(dir.path()).expect("load"));
        let opts = AneOptions {
            max_ctx: 96,
            max_query: 32,
            ..AneOptions::default()
        };
        let mut ane = AneDevice::new(model.clone(), opts).expect("device");
        let mut wrapped = RestartedTurn {
            inner: &mut ane,
            generated: 0,
            fails,
        };
        let dev: &mut dyn Device = if faulty { &mut wrapped } else { &mut ane };
        let ids: Vec<u32> = (0..12).map(|i| 3 + 11 * i).collect();
        let mut s = Session::new(&model, dev, ids, &NoProgress).expect("session");
        let opts = DiagnoseOptions {
            steps: 6,
            ..DiagnoseOptions::default()
        };
        diagnose(&mut s, &opts)
    }

    /// A device failure in the chat is evidence, not the run's error: the single-request
    /// controls' findings are kept and the result is `incomplete` (exit 3, partial), never the
    /// healthy verdict the controls alone gave.
    #[test]
    fn a_device_failure_in_the_chat_keeps_the_controls_marked_incomplete() {
        let d = run_wrapped(true, true).expect("a partial diagnosis, not an error");
        let failure = d.incomplete.as_deref().unwrap_or_default();
        assert!(failure.contains("appended turn"), "{failure}");
        assert!(d.hypothesis.is_none(), "{:?}", d.hypothesis);
        assert!(d.probes.greedy.is_some(), "the controls' findings are kept");
        let last = d.evidence.last().map(String::as_str).unwrap_or_default();
        assert!(
            last.starts_with("stopped: ") && last.contains("partial results"),
            "{last}"
        );
    }

    #[test]
    fn a_fault_at_the_turn_boundary_is_named_by_the_chat_and_the_healthy_device_passes() {
        let healthy = diagnosed(false);
        assert_eq!(healthy.verdict, Verdict::Healthy, "{:?}", healthy.evidence);
        let c = &healthy.probes.extra["chat"];
        assert_eq!(c["turns"].as_array().map(Vec::len), Some(2), "{c}");
        assert!(c["first_divergence"].is_null(), "{c}");
        assert!(
            healthy
                .evidence
                .iter()
                .any(|e| e.starts_with("chat: 2 turns")),
            "{:?}",
            healthy.evidence
        );

        let faulty = diagnosed(true);
        assert_eq!(faulty.verdict, Verdict::Unknown, "{:?}", faulty.evidence);
        let c = &faulty.probes.extra["chat"];
        assert_eq!(c["first_divergence"]["turn"], 2, "{c}");
        assert_eq!(c["fresh"]["fresh_agrees"], true, "{c}");
        let rule = faulty.hypothesis.as_ref().map(|h| h.rule.as_str());
        assert_eq!(rule, Some(RULE_DIVERGED), "{:?}", faulty.hypothesis);
        let first = &faulty.evidence[0];
        assert!(
            first.contains("at turn 2 of 2")
                && first.contains("appending to the kept state is at fault"),
            "{first}"
        );
    }
}
