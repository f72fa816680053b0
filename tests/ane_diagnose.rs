//! `--device ane-sim` end to end through the binary (issue 9): healthy and every ane fault get
//! their verdict on the Llama fixture and SmolLM2; bad input is one line and exit 2.

use crate::common;
use common::*;

const FAULTS: [(&str, &str); 6] = [
    ("", "healthy"),
    ("ane-write-offset", "cache-offset"),
    ("ane-state-layout", "cache-layout-mismatch"),
    ("ane-mask-01", "mask-convention"),
    ("ane-scale-after-qk", "numeric-overflow"),
    ("ane-stale-state", "stale-cache"),
];

#[test]
fn the_matrix_is_the_coreml_fault_table() {
    let table = &kvprobe_npu::coreml::FAMILY.faults;
    for (fault, want) in FAULTS.iter().filter(|(f, _)| !f.is_empty()) {
        let declared = table.expected(fault).map(|v| v.name());
        assert_eq!(declared.ok(), Some(*want), "{fault}");
    }
    // issue 20's faults run in their own end-to-end tests: the capacity faults in
    // tests/capacity_faults.rs; the others need their own geometries (a call of more than 16
    // rows, a norm gain for the fixture), tests/determinism_ane.rs
    const ELSEWHERE: [&str; 5] = [
        "ane-state-wrap",
        "ane-query-truncate",
        "ane-mask-fp32-min",
        "ane-norm-fp16",
        "ane-state-race",
    ];
    for d in table.faults.iter().filter(|d| !ELSEWHERE.contains(&d.name)) {
        assert!(
            FAULTS.iter().any(|(f, _)| *f == d.name),
            "{} is declared but not in the matrix",
            d.name
        );
    }
}

/// `COMMAND --device ane-sim --model MODEL REST…`
fn ane<'a>(command: &'a str, model: &'a str, rest: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec![command, "--device", "ane-sim", "--model", model];
    a.extend_from_slice(rest);
    a
}

/// The Llama fixture every test here runs on.
fn llama() -> std::path::PathBuf {
    fixture("llama", 11)
}

/// Misses as text (empty = all verdicts right).
fn matrix(model: &str, geometry: &[&str], prompt: &[&str]) -> Vec<String> {
    par_map(&FAULTS, |&(fault, want)| {
        one(model, geometry, prompt, fault, want)
    })
    .into_iter()
    .flatten()
    .collect()
}

/// The misses of one fault (or of the healthy run).
fn one(model: &str, geometry: &[&str], prompt: &[&str], fault: &str, want: &str) -> Vec<String> {
    let mut misses = Vec::new();
    let mut args = ane("diagnose", model, &["--steps", "8"]);
    args.extend_from_slice(geometry);
    args.extend_from_slice(prompt);
    if !fault.is_empty() {
        args.extend_from_slice(&["--fault", fault]);
    }
    let (code, v, stderr) = kvprobe_json(&args);
    let got = verdict(&v);
    let want_code = if want == "healthy" { 0 } else { 1 };
    if got != want || code != want_code {
        misses.push(format!(
            "{fault:?}: got {got} (exit {code}), want {want}; evidence {:?}; stderr {stderr}",
            v["evidence"]
        ));
    }
    // every ring probe says why it does not apply
    let na = v["probes"]["not_applicable"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if na.len() < 10
        || na
            .iter()
            .any(|n| !n["why"].as_str().unwrap_or("").contains("not"))
    {
        misses.push(format!("{fault:?}: not_applicable list {na:?}"));
    }
    if want == "numeric-overflow" {
        let o = &v["probes"]["overflow"];
        if !(o["layer"].is_u64() && o["position"].is_u64()) {
            misses.push(format!("overflow finding names no layer/position: {o}"));
        }
    }
    misses
}

#[test]
fn every_ane_fault_gets_its_verdict_on_the_llama_fixture() {
    let fx = llama();
    let m = fx.to_str().unwrap();
    let mut misses = matrix(
        m,
        &["--max-ctx", "96", "--max-query", "8"],
        &["--ids", "5,17,99,3,250,41,7,8,120,64,33,2,90"],
    );
    misses.extend(matrix(
        m,
        &["--max-ctx", "64", "--max-query", "32"],
        &["--ids", "12,7,200,45,9,31"],
    ));
    assert!(misses.is_empty(), "{misses:#?}");
}

#[test]
fn every_ane_fault_gets_its_verdict_on_smollm2() {
    let Some(m) = smollm2() else { return };
    let misses = matrix(m.to_str().unwrap(), &["--max-ctx", "128"], &[]);
    assert!(misses.is_empty(), "{misses:#?}");
}

#[test]
fn bad_input_is_one_line_and_exit_2() {
    let fx = llama();
    let m = fx.to_str().unwrap();
    // prompt does not fit the context
    let a = ane(
        "greedy",
        m,
        &["--max-ctx", "4", "--max-query", "2", "--ids", "1,2,3,4"],
    );
    one_line_exit_2(&a, "--max-ctx");
    // a Hailo emulator fault on ane-sim, and an ane fault on the Hailo emulator
    one_line_exit_2(&ane("greedy", m, &["--fault", "kv-swap"]), "--sim");
    one_line_exit_2(
        &["greedy", "--sim", "--model", m, "--fault", "ane-mask-01"],
        "--device ane-sim",
    );
    // unknown device, a Hailo-only geometry flag, a ring probe
    one_line_exit_2(
        &["greedy", "--device", "tpu-sim", "--model", m],
        "--device tpu-sim",
    );
    one_line_exit_2(&ane("greedy", m, &["--max-query", "200"]), "--max-query");
    one_line_exit_2(
        &ane("colmap", m, &[]),
        "not applicable on a stateful device",
    );
    // GPT-2 is not emulated as ane
    let g = fixture("gpt2", 3);
    one_line_exit_2(&ane("greedy", g.to_str().unwrap(), &[]), "--sim");
}

#[test]
fn manifests_reproduce_and_belong_to_one_device() {
    let fx = llama();
    let m = fx.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let o = out.to_str().unwrap();
    let run = ["--steps", "4", "--ids", "3,9,27,81,243,7"];
    let mut a = ane("diagnose", m, &run);
    a.extend(["--max-ctx", "48", "--fault", "ane-write-offset", "--out", o]);
    let r = kvprobe(&a);
    assert_eq!(
        r.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&r.stderr)
    );
    let manifest = out.join("sim-manifest.json");
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("not applicable on a stateful device"));
    assert!(html.contains("cache-offset"));
    // the manifest alone reproduces geometry and fault
    let mut a = ane("diagnose", m, &run);
    a.extend(["--sim-manifest", manifest.to_str().unwrap()]);
    let (code, v, _) = kvprobe_json(&a);
    assert_eq!((code, verdict(&v)), (1, "cache-offset".to_string()));
    assert_eq!(v["provenance"]["cache_len"], 48);
    // `--fault` beside it replaces its fault (a hypothesis on the device it describes, as on the
    // Hailo emulator; it was exit 2): the verdict is the new fault's, and the manifest the run
    // writes records it
    let replaced = dir.path().join("replaced");
    let mut a = ane("diagnose", m, &run);
    a.extend(["--sim-manifest", manifest.to_str().unwrap()]);
    a.extend([
        "--fault",
        "ane-mask-01",
        "--out",
        replaced.to_str().unwrap(),
    ]);
    let (code, v, stderr) = kvprobe_json(&a);
    assert_eq!(
        (code, verdict(&v).as_str()),
        (1, "mask-convention"),
        "{stderr}"
    );
    assert_eq!(v["provenance"]["cache_len"], 48);
    let written: serde_json::Value =
        serde_json::from_slice(&std::fs::read(replaced.join("sim-manifest.json")).unwrap())
            .unwrap();
    assert_eq!(
        written["faults"],
        serde_json::json!(["ane-mask-01"]),
        "{written}"
    );
    // the Hailo emulator refuses it, and ane-sim refuses a Hailo manifest
    one_line_exit_2(
        &[
            "greedy",
            "--sim",
            "--model",
            m,
            "--sim-manifest",
            manifest.to_str().unwrap(),
        ],
        "ane-sim",
    );
    let text = std::fs::read_to_string(&manifest)
        .unwrap()
        .replace("\"ane-sim\"", "\"hailo-sim\"");
    let hailo = dir.path().join("hailo.json");
    std::fs::write(&hailo, text).unwrap();
    one_line_exit_2(
        &ane("greedy", m, &["--sim-manifest", hailo.to_str().unwrap()]),
        "--sim",
    );
}

#[test]
fn greedy_on_the_fixture_matches_the_reference_under_fp16() {
    let fx = llama();
    let (code, v, stderr) = kvprobe_json(&ane(
        "greedy",
        fx.to_str().unwrap(),
        &[
            "--steps",
            "12",
            "--max-ctx",
            "64",
            "--max-query",
            "4",
            "--ids",
            "5,17,99,3,250,41,7,8,120",
        ],
    ));
    assert_eq!(code, 0, "{stderr}");
    let g = &v["probes"]["greedy"];
    assert!(g["min_cosine"].as_f64().unwrap() >= 0.99, "{g}");
    assert_eq!(g["top1_agreement"].as_f64(), Some(1.0), "{g}");
    assert_eq!(v["provenance"]["backend"], "ane-emulator");
}
