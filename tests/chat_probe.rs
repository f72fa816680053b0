//! `kvprobe chat` through the binary on the Core ML ANE emulator with SmolLM2: a healthy
//! four-turn conversation appended to one state agrees turn by turn with the reference; the
//! failing control, a state that silently wraps at 48 positions (`ane-state-wrap=48`, a
//! capacity bug the conversation crosses in its third turn), is caught at that turn and not
//! before, and the fresh-request control (the same history as one prompt) diverges too, so the
//! finding does not blame the appending. OpenVINO's plugins run the probe in openvino_cli.rs.

use crate::common;
use common::*;

fn chat(m: &str, out: &str, fault: Option<&str>) -> (i32, serde_json::Value, String) {
    let mut a = vec![
        "chat",
        "--device",
        "ane-sim",
        "--model",
        m,
        "--max-ctx",
        "96",
        "--steps",
        "4",
        "--out",
        out,
    ];
    if let Some(f) = fault {
        a.extend(["--fault", f]);
    }
    kvprobe_json(&a)
}

#[test]
fn a_healthy_chat_agrees_and_a_wrapping_state_diverges_at_the_turn_it_wraps() {
    let Some(m) = smollm2() else { return };
    let m = m.display().to_string();
    let dir = tempfile::tempdir().unwrap();
    let (healthy, wrap) = (dir.path().join("healthy"), dir.path().join("wrap"));
    let runs = par_map(&[None, Some("ane-state-wrap=48")], |f| {
        let out = if f.is_none() { &healthy } else { &wrap };
        chat(&m, out.to_str().unwrap(), *f)
    });
    let (code, v, err) = &runs[0];
    assert_eq!(*code, 0, "{err}");
    let c = &v["probes"]["extra"]["chat"];
    assert_eq!(c["turns"].as_array().map(Vec::len), Some(4), "{c}");
    assert!(c["first_divergence"].is_null(), "{c}");
    // every turn after the first was appended: its first position is where the last one ended
    let turns = c["turns"].as_array().unwrap();
    for w in turns.windows(2) {
        let end = w[0]["first_position"].as_u64().unwrap() + w[0]["fed"].as_u64().unwrap() + 3;
        assert_eq!(w[1]["first_position"].as_u64(), Some(end), "{c}");
    }
    section_rerenders(&healthy, "chat");

    let (code, v, err) = &runs[1];
    assert_eq!(*code, 0, "a probe that ran exits 0: {err}");
    let c = &v["probes"]["extra"]["chat"];
    let d = &c["first_divergence"];
    assert_eq!(d["turn"], 3, "{c}");
    assert!(d["position"].as_u64().unwrap() >= 48, "{c}");
    assert_eq!(c["fresh"]["fresh_agrees"], false, "{c}");
}
