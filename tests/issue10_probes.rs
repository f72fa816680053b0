//! The stale, causality and splits probes through the binary on the Llama fixture: a healthy
//! device shows nothing, and each fault class shows its own signature (issue 10).

use crate::common;
use common::*;

const GEO: [&str; 8] = [
    "--cache-len",
    "24",
    "--prefill-len",
    "8",
    "--ids",
    "1,5,9,22,41,17,3,99,150,200,12,7,8",
    "--steps",
    "4",
];

fn probe(name: &str, fault: Option<&str>) -> serde_json::Value {
    let f = fixture("llama", 7);
    let mut a = vec![name, "--sim", "--model", f.to_str().unwrap()];
    a.extend_from_slice(&GEO);
    if let Some(x) = fault {
        a.extend_from_slice(&["--fault", x]);
    }
    let (code, v, stderr) = kvprobe_json(&a);
    assert_eq!(code, 0, "{name} {fault:?}: {stderr}");
    v["probes"][name].clone()
}

#[test]
fn healthy_device_shows_no_poison_no_leak() {
    let st = probe("stale", None);
    assert!(st["first_moved_step"].is_null(), "{st}");
    assert_eq!(st["back_to_back"]["depends_with_reset"], false, "{st}");
    // without a reset the second request continues the first: it must depend on it
    assert_eq!(st["back_to_back"]["depends_without_reset"], true, "{st}");
    let ca = probe("causality", None);
    assert_eq!(ca["leak_cells"], 0, "{ca}");
    assert_eq!(ca["first_layer_shift"], 0, "{ca}");
}

#[test]
fn faults_show_their_signature() {
    // a tbt mask read mirrored: poison in never-written slots becomes visible at step 0
    let st = probe("stale", Some("mask=left-valid"));
    assert_eq!(st["first_moved_step"], 0, "{st}");
    assert!(!st["leaks"].as_array().unwrap().is_empty(), "{st}");
    // a scrambled prefill writer puts later tokens' first-layer bytes into earlier slots
    let ca = probe("causality", Some("prefill-write-layout=feature-major"));
    assert!(ca["first_layer_leak_cells"].as_u64().unwrap() > 0, "{ca}");
    // K/V bound crosswise by tbt: tbt reads its own writes fine, prefill's wrong
    let sp = probe("splits", Some("kv-swap"));
    let pure = sp["pure_decode_min"].as_f64().unwrap();
    let mixed = sp["mixed_decode_min"].as_f64().unwrap();
    assert!(pure > 0.94 && mixed < pure - 0.1, "{sp}");
}
