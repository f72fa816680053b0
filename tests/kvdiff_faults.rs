//! `kvdiff` and the issue-20 RoPE faults end to end through the binary: a healthy cache stays
//! inside its precision band; a fault confined to one layer is named at the layer its definition
//! says; the two RoPE faults are diagnosed as their fault-table row declares, with kvdiff's
//! first-layer evidence; a cache-path verdict carries kvdiff's first divergent layer.

use crate::common;
use common::*;

use kvprobe_npu::families;

fn expected(fault: &str) -> String {
    families::family("hailo-sim")
        .expect("the Hailo emulator is registered")
        .faults
        .expected(fault)
        .unwrap_or_else(|e| panic!("{fault}: {e}"))
        .name()
        .to_string()
}

fn kvdiff_of(args: &[&str]) -> serde_json::Value {
    let (code, v, stderr) = kvprobe_json(args);
    assert_eq!(code, 0, "{args:?}: {stderr}");
    v["probes"]["kvdiff"].clone()
}

fn smollm2_args<'a>(probe: &'a str, m: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec![probe, "--sim", "--model", m];
    a.extend(SMOLLM2_L64);
    a.extend_from_slice(extra);
    a
}

fn fixture_args<'a>(probe: &'a str, f: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec![probe, "--sim", "--model", f];
    a.extend(geometry("24", "8", IDS_REMAINDER, "8"));
    a.extend_from_slice(extra);
    a
}

#[test]
fn healthy_uint8_caches_stay_inside_the_band() {
    let f = fixture("llama", 7);
    let k = kvdiff_of(&fixture_args("kvdiff", f.to_str().unwrap(), &[]));
    assert!(k["first_divergent"].is_null(), "fixture: {k}");
    assert_eq!(k["steps"].as_array().map(Vec::len), Some(8));
    let Some(m) = smollm2() else { return };
    // L 64 with 8 steps after a 13-token prompt, and a wrapping run (40 steps past L = 24)
    let k = kvdiff_of(&smollm2_args("kvdiff", m.to_str().unwrap(), &[]));
    assert!(
        k["first_divergent"].is_null(),
        "SmolLM2: {}",
        k["first_divergent"]
    );
    let mut wrap = vec!["kvdiff", "--sim", "--model", m.to_str().unwrap()];
    wrap.extend([
        "--cache-len",
        "24",
        "--prefill-len",
        "8",
        "--prompt",
        "Name a color.",
        "--steps",
        "20",
    ]);
    let k = kvdiff_of(&wrap);
    assert!(
        k["first_divergent"].is_null(),
        "SmolLM2 wrapping: {}",
        k["first_divergent"]
    );
}

/// `truncate-entry=N@k,layer=L` keeps the first N bytes of layer L's K entries (uint8: N
/// elements), so layer L is the first whose cache differs, in K, at KV head ⌊N / head_dim⌋ (the
/// first head losing elements). `tbt-cache-scale=0.5@layer=L` leaves every cache byte as written
/// but makes the tbt graph read layer L's cache at half scale: layer L's own entries stay right,
/// and the first entries to differ are layer L + 1's, written by the tbt steps.
#[test]
fn a_fault_confined_to_one_layer_is_named_at_that_layer() {
    let Some(m) = smollm2() else { return };
    let m = m.to_str().unwrap();
    // SmolLM2: head_dim 64, 3 KV heads (192 bytes per uint8 entry); 96 bytes cut heads 1 and 2
    let k = kvdiff_of(&smollm2_args(
        "kvdiff",
        m,
        &["--fault", "truncate-entry=96@k,layer=5"],
    ));
    let d = &k["first_divergent"];
    assert_eq!(
        (
            d["layer"].as_u64(),
            d["kv_head"].as_u64(),
            d["kind"].as_str(),
            d["step"].as_u64()
        ),
        (Some(5), Some(1), Some("k"), Some(0)),
        "{k}"
    );
    let k = kvdiff_of(&smollm2_args(
        "kvdiff",
        m,
        &["--fault", "tbt-cache-scale=0.5@layer=2"],
    ));
    let d = &k["first_divergent"];
    assert_eq!(d["layer"].as_u64(), Some(3), "{k}");
    assert!(
        d["step"].as_u64().unwrap_or(0) >= 1,
        "only tbt-written entries move: {d}"
    );
}

fn rope_fault_is_a_position_mismatch(args: &[&str], fault: &str) {
    let (code, v, stderr) = kvprobe_json(args);
    assert_eq!(
        (verdict(&v), code),
        (expected(fault), 1),
        "{fault}: {stderr}; evidence {}",
        v["evidence"]
    );
    let ev = evidence(&v);
    assert!(
        ev.iter()
            .any(|e| e.contains("first divergent layer 0 (KV head 0, K)")),
        "{fault}: {ev:?}"
    );
    assert!(
        ev.iter().any(|e| e.contains("layer 0's K leaves")),
        "{fault}: {ev:?}"
    );
}

#[test]
fn rope_faults_are_position_mismatches_on_smollm2() {
    let Some(m) = smollm2() else { return };
    let m = m.to_str().unwrap();
    // head_dim 64: K heads repeat their first 16 elements
    for fault in ["rope-k-tile=16", "rope-scaling=2"] {
        rope_fault_is_a_position_mismatch(&smollm2_args("diagnose", m, &["--fault", fault]), fault);
    }
}

#[test]
fn rope_faults_are_position_mismatches_on_the_llama_fixture() {
    let f = fixture("llama", 7);
    let f = f.to_str().unwrap();
    // head_dim 16: K heads repeat their first 4 elements
    for fault in ["rope-k-tile=4", "rope-scaling=4"] {
        rope_fault_is_a_position_mismatch(&fixture_args("diagnose", f, &["--fault", fault]), fault);
    }
}

#[test]
fn rope_faults_that_change_nothing_are_refused() {
    let f = fixture("llama", 7);
    let f = f.to_str().unwrap();
    // a head's table has equal halves: half-width tiling repeats it unchanged
    one_line_exit_2(
        &fixture_args("kvdiff", f, &["--fault", "rope-k-tile=8"]),
        "rope-k-tile=8",
    );
    one_line_exit_2(
        &fixture_args("kvdiff", f, &["--fault", "rope-scaling=1"]),
        "rope-scaling=1",
    );
    let g = fixture("gpt2", 7);
    let mut a = vec!["kvdiff", "--sim", "--model", g.to_str().unwrap()];
    a.extend(geometry("24", "8", IDS_REMAINDER, "4"));
    a.extend(["--fault", "rope-scaling=2"]);
    one_line_exit_2(&a, "learned positions");
}

#[test]
fn a_cache_path_verdict_names_kvdiffs_first_divergent_layer() {
    let f = fixture("llama", 7);
    let (code, v, stderr) = kvprobe_json(&fixture_args(
        "diagnose",
        f.to_str().unwrap(),
        &["--fault", "tbt-cache-scale=0.5@layer=0"],
    ));
    assert_eq!(
        (verdict(&v).as_str(), code),
        ("cache-quantization", 1),
        "{stderr}"
    );
    let ev = evidence(&v);
    assert!(
        ev.iter()
            .any(|e| e.starts_with("kvdiff (run for cache-path verdicts")
                && e.contains("first divergent layer 1")),
        "{ev:?}"
    );
    assert!(v["probes"]["kvdiff"].is_object());
}
