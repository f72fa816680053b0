//! Issue 18: the precision-matched reference. Two independent implementations of the HailoRT
//! emulator's declared precision — the emulator itself and `probes/src/matched.rs`, which reads
//! only the device description — agree on a healthy device, and part ways under a fault; the
//! three-way numbers and the near-tie fields reach results.json.

use crate::common;
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

/// Issue 21: `--sim-weights int8` declares per-channel int8 weights; the matched reference
/// computes with them (a fault-free run used to read their cost as a prefill graph fault).
#[test]
fn declared_int8_weights_are_modelled_and_a_fault_still_shows() {
    let m = fixture("llama", 7);
    let m = m.to_str().expect("utf-8 path");
    // float cache and edges: the weights are the only declared lower precision
    let mut args = vec![
        "greedy",
        "--sim",
        "--sim-quant",
        "none",
        "--sim-weights",
        "int8",
        "--model",
        m,
    ];
    args.extend(geometry("16", "8", IDS_REMAINDER, "8"));
    let healthy = greedy(&args);
    let summary = &healthy["matched"];
    assert!(
        summary["precision"].as_str().unwrap_or("").contains("int8"),
        "{summary}"
    );
    let ok = steps_matched_vs_device(&healthy);
    assert!(ok.iter().all(|&c| c >= 0.99999), "{ok:?}");
    // the int8 weights do cost something against f32, which the matched reference carries
    let cost = summary["tbt_reference_vs_matched"].as_f64().expect("cost");
    assert!(cost < 0.99999, "int8 weights move the reference: {cost}");

    args.extend(["--fault", "tbt-position=+2"]);
    let bad = steps_matched_vs_device(&greedy(&args));
    let worse = bad.iter().skip(1).filter(|&&c| c < 0.9999).count();
    assert!(worse >= 4, "{bad:?}");
}

/// The false alarm issue 21 reported: SmolLM2 at L 64 on int8 weights was `prefill-graph` (0.65)
/// with nothing wrong, the int8 weights' cost read as a graph fault. A real fault on the same
/// device is still named.
#[test]
fn a_fault_free_int8_weight_emulator_is_diagnosed_healthy_and_a_faulty_one_is_not() {
    let Some(m) = smollm2() else { return };
    let m = m.to_str().expect("utf-8 path").to_string();
    let cases: [&[&str]; 2] = [&[], &["--fault", "tbt-position=+2"]];
    let got = par_map(&cases, |extra| {
        let mut args = vec!["diagnose", "--sim", "--sim-weights", "int8", "--model", &m];
        args.extend(SMOLLM2_L64);
        args.extend(extra.iter().copied());
        let (_, v, err) = kvprobe_json(&args);
        (verdict(&v), format!("{:?} {err}", evidence(&v)))
    });
    assert_eq!(got[0].0, "healthy", "{}", got[0].1);
    assert_eq!(got[1].0, "position-mismatch", "{}", got[1].1);
}
