//! Issue 18: the precision-matched reference. Two independent implementations of the HailoRT
//! emulator's declared precision — the emulator itself and `probes/src/matched.rs`, which reads
//! only the device description — agree on a healthy device, and part ways under a fault; the
//! three-way numbers and the near-tie fields reach results.json.

mod common;
use common::*;

fn greedy(args: &[&str]) -> serde_json::Value {
    let (code, v, err) = kvprobe_json(args);
    assert_eq!(code, 0, "{err}");
    v["probes"]["greedy"].clone()
}

fn steps_matched_vs_device(g: &serde_json::Value) -> Vec<f64> {
    g["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|s| s["matched"]["matched_vs_device"].as_f64().expect("matched"))
        .collect()
}

#[test]
fn the_matched_reference_reproduces_the_healthy_emulator_and_not_a_faulty_one() {
    let m = fixture("llama", 7);
    let m = m.to_str().expect("utf-8 path");
    // L 16 < n + steps: the ring wraps during the steps; P 8 with a remainder chunk
    let mut args = vec!["greedy", "--sim", "--model", m];
    args.extend(geometry("16", "8", IDS_REMAINDER, "10"));
    let healthy = greedy(&args);
    let ok = steps_matched_vs_device(&healthy);
    assert_eq!(ok.len(), 10);
    assert!(ok.iter().all(|&c| c >= 0.99999), "{ok:?}");
    let summary = &healthy["matched"];
    assert!(summary["precision"]
        .as_str()
        .unwrap_or("")
        .contains("cache uint8"));
    assert!(summary["tbt_reference_vs_matched"].as_f64().is_some());

    args.extend(["--fault", "tbt-position=+2"]);
    let faulty = greedy(&args);
    let bad = steps_matched_vs_device(&faulty);
    let worse = bad.iter().skip(1).filter(|&&c| c < 0.9999).count();
    assert!(
        worse >= 5,
        "a position fault moves most tbt steps away: {bad:?}"
    );
}

#[test]
fn float_edges_need_no_matched_reference() {
    let m = fixture("llama", 7);
    let mut args = vec![
        "greedy",
        "--sim",
        "--sim-quant",
        "none",
        "--model",
        m.to_str().expect("utf-8"),
    ];
    args.extend(geometry("16", "8", IDS_REMAINDER, "6"));
    let g = greedy(&args);
    assert!(g.get("matched").is_none_or(|m| m.is_null()), "{g}");
    // without a declared lower precision only exact ties count as near ties
    assert_eq!(g["near_tie_flips"].as_u64(), Some(0));
}
