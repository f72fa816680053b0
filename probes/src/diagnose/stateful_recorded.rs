//! Recorded cases of the stateful rules (issue 34): the facts rebuilt from a results.json that a
//! run of the binary wrote, and the rules run on them. Fixtures in `probes/tests/recorded/`
//! (each a results.json as written, the `kvdiff` probe cut out for size: no stateful rule reads
//! it).
//!
//! What is rebuilt: the controls' summaries (against the precision-matched reference where the
//! file holds it, as `stateful::controls_and_state` takes them), each greedy step's band
//! (`footing::band`), the graph's noise from the self-only steps, and the state experiments
//! verbatim. Not rebuilt: the repeat, back-to-back and overflow checks (the recorded run passed
//! them, said in its evidence), the host fits that did not fire.

use kvprobe_schema::{ProbeFindings, Verdict};

use super::engine::{Controls, Engine};
use super::stateful::{StatefulFacts, TABLE};

/// The results.json's probes and the facts the stateful rules read, rebuilt from them; `jitter`
/// whether the jitter control judged the device (the file does not say what the device
/// declares).
fn rebuild(json: &str, jitter: bool) -> (serde_json::Value, StatefulFacts) {
    let v: serde_json::Value = serde_json::from_str(json).expect("a results.json");
    let p: ProbeFindings = serde_json::from_value(v["probes"].clone()).expect("its probes");
    let mut f = StatefulFacts::first(p.determinism.clone(), None);
    f.overflow = p.overflow.clone();
    let matched = |pts: Vec<(Option<&kvprobe_schema::MatchedStep>, u32)>| {
        crate::matched::against_matched(pts.into_iter())
    };
    if let Some(pf) = &p.prefill {
        let rows = pf.rows.iter();
        f.prefill = matched(
            rows.map(|r| (r.matched.as_ref(), r.comparison.device_top1))
                .collect(),
        )
        .or(Some([pf.mean_cosine, pf.min_cosine, pf.top1_agreement]));
    }
    if let Some(gr) = &p.greedy {
        let steps = gr.steps.iter();
        f.greedy = matched(
            steps
                .map(|s| (s.matched.as_ref(), s.comparison.device_top1))
                .collect(),
        )
        .or(Some([gr.mean_cosine, gr.min_cosine, gr.top1_agreement]));
        f.greedy_steps = super::stateful_facts::greedy_rows(gr, jitter);
    }
    // the self-only steps' miss on the control where one ran (stateful::graph_noise)
    if let Some(m) = &p.selfmask {
        let c = match (m.control_matched_mean_cosine, m.matched_mean_cosine) {
            (Some(c), _) | (None, Some(c)) if jitter => c,
            _ => m.mean_cosine,
        };
        f.graph_noise = (1.0 - c).max(crate::thresholds::REL_NOISE_FLOOR);
    }
    f.state = p.state.clone();
    (v, f)
}

fn fired(f: &StatefulFacts) -> (Verdict, Vec<&'static str>) {
    let mut e = Engine::new();
    for phase in TABLE {
        e.apply(phase, f);
    }
    let fired = e.fired().to_vec();
    (e.conclude().verdict, fired)
}

/// SmolLM2 QDQ on QNN HTP, "Give me three tips for better sleep.", 4 steps, the CPU EP control
/// on (session 29, debug build of main d141a36, `/work/s29/qdqp17/stdout.json`): recorded as
/// `mask-convention` by `self-only-mask`, a false alarm (docs/qnn.md). The device's self-only
/// row is 0.28 from the token alone at the declared precision and 0.31 from its control's row,
/// and the control's own row is 0.80 from the token alone; the old rule named the mask because
/// 0.28 and 0.80 are both below `REPRODUCES_COSINE`. The file holds no replay of a mask
/// hypothesis (it was written before there was one), so what this checks is what the rule of
/// evidence makes of the recorded numbers: no fixed cosine names a mask, the verdict is what
/// the other rules give on the same facts, and — with any replay that reproduced the device's
/// row exactly — the control's recorded row, which no mask hypothesis was shown to reproduce,
/// still contradicts it. Whether a replay reproduces that row is the lead's rerun of the prompt
/// on HTP with this binary.
#[test]
fn the_htp_sleep_prompt_names_no_mask_without_a_replay_that_reproduces() {
    let (v, f) = rebuild(
        include_str!("../../tests/recorded/htp-qdq-sleep-s29.json"),
        true,
    );
    assert_eq!(v["verdict"], "mask-convention", "the recorded verdict");
    assert_eq!(v["hypothesis"]["rule"], "self-only-mask");
    let st = f.state.as_ref().expect("the state experiments ran");
    assert!((st.selfonly_cosine.unwrap_or(1.0) - 0.2792).abs() < 1e-4);
    assert!(st.selfonly_fit.is_none(), "recorded before the mask replay");
    // the recorded run's controls, rebuilt: the greedy control failed (no `healthy`)
    assert!(
        f.fails(super::engine::Control::Greedy),
        "{:?}",
        f.greedy_steps
    );
    let (verdict, fired) = fired(&f);
    assert!(fired.contains(&"mask-cosines"), "{fired:?}");
    assert!(!fired.contains(&"self-only-mask"), "{fired:?}");
    assert_eq!(verdict, Verdict::Unknown, "{fired:?}");
    // a replay that reproduced the device's row exactly, whose control's row is as far from
    // it as the recorded control's is from the token alone: the control contradicts it
    let mut g = f.clone();
    if let Some(st) = &mut g.state {
        st.selfonly_fit = Some(kvprobe_schema::SelfOnlyFit {
            hypotheses: vec![kvprobe_schema::MaskReplay {
                bias: 0.0,
                empty: 0,
                miss: 0.0,
                control_miss: Some(1.0 - 0.8000),
                device_step: false,
            }],
            healthy_miss: 1.0 - 0.2792,
            declared: 0.0,
            ids: Vec::new(),
            model: String::new(),
        });
    }
    assert!(!fired_rules(&g).contains(&"self-only-mask"));
}

fn fired_rules(f: &StatefulFacts) -> Vec<&'static str> {
    fired(f).1
}
