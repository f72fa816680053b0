//! `kvprobe rerun` (the probe added through the registry, issue 17): the same request twice is
//! bit-identical on a healthy emulator, a state left over from the first request shows as a
//! difference, and `diagnose` does not run it.

use crate::common;
use common::*;

const IDS: &str = "1,5,9,22,41,17,3,99,150,200,12,7,8";

#[test]
fn healthy_fixture_reruns_bit_identical_with_artefacts() {
    let f = fixture("llama", 7);
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("run");
    let mut a = vec!["rerun", "--sim", "--model", f.to_str().unwrap()];
    a.extend(geometry("24", "8", IDS, "6"));
    let (code, v, err) = kvprobe_json(&a);
    assert_eq!(code, 0, "{err}");
    assert_eq!(v["command"], "rerun");
    assert!(v["verdict"].is_null());
    let r = &v["probes"]["extra"]["rerun"];
    assert_eq!(r["steps"], 6, "{r}");
    assert_eq!(r["identical"], true, "{r}");
    assert!(r["first_difference"].is_null(), "{r}");
    assert_eq!(r["step_max_abs_diff"].as_array().map(Vec::len), Some(6));

    // text summary, CSV, HTML section, and a byte-identical re-render
    a.extend(["--out", dir.to_str().unwrap()]);
    let text = kvprobe(&a);
    let stdout = String::from_utf8_lossy(&text.stdout);
    assert!(
        stdout.starts_with("rerun: 6 steps twice, bit-identical"),
        "{stdout}"
    );
    let csv = std::fs::read_to_string(dir.join("rerun.csv")).unwrap();
    assert!(csv.starts_with("step,max_abs_diff\n0,0\n"), "{csv}");
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert!(html.contains("<section id=\"rerun\">"), "no rerun section");
    let out = kvprobe(&["report", dir.to_str().unwrap()]);
    assert!(out.status.success());
    assert_eq!(
        std::fs::read_to_string(dir.join("report.html")).unwrap(),
        html
    );
}

#[test]
fn state_kept_across_requests_differs_at_the_prefill() {
    let f = fixture("llama", 7);
    let (code, v, err) = kvprobe_json(&[
        "rerun",
        "--device",
        "ane-sim",
        "--model",
        f.to_str().unwrap(),
        "--max-ctx",
        "96",
        "--max-query",
        "8",
        "--ids",
        IDS,
        "--steps",
        "4",
        "--fault",
        "ane-stale-state",
    ]);
    assert_eq!(code, 0, "{err}");
    let r = &v["probes"]["extra"]["rerun"];
    assert_eq!(r["identical"], false, "{r}");
    assert_eq!(r["first_difference"]["step"], 0, "{r}");
}

#[test]
fn diagnose_does_not_run_it() {
    let f = fixture("llama", 7);
    let mut a = vec!["diagnose", "--sim", "--model", f.to_str().unwrap()];
    a.extend(geometry("24", "8", IDS, "6"));
    let (_, v, _) = kvprobe_json(&a);
    // diagnose's own checks (the capacity check) may add theirs; the rerun probe is not one
    assert!(
        v["probes"]["extra"].get("rerun").is_none(),
        "{}",
        v["probes"]["extra"]
    );
}
