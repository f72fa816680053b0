//! `kvprobe determinism` through the binary (issue 20): the same request twice in this process
//! and once in a second OS process (the CLI re-running itself), bit for bit, with its CSV, NPY,
//! HTML section and text summary.

use crate::common;
use common::*;

const IDS_20: &str = "5,17,99,3,250,41,7,8,120,64,33,2,90,11,13,19,23,29,31,37";

fn ane<'a>(model: &'a str, rest: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec![
        "determinism",
        "--device",
        "ane-sim",
        "--model",
        model,
        "--max-ctx",
        "64",
        "--max-query",
        "32",
        "--ids",
        IDS_20,
        "--steps",
        "4",
    ];
    a.extend_from_slice(rest);
    a
}

fn comparisons(v: &serde_json::Value) -> Vec<serde_json::Value> {
    v["probes"]["determinism"]["comparisons"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[test]
fn healthy_devices_repeat_bit_for_bit_here_and_in_a_second_process() {
    let fx = fixture("llama", 7);
    let m = fx.to_str().unwrap();
    let mut sim = vec!["determinism", "--sim", "--model", m];
    sim.extend(geometry("24", "8", IDS_REMAINDER, "5"));
    for args in [ane(m, &[]), sim] {
        let (code, v, err) = kvprobe_json(&args);
        assert_eq!(code, 0, "{err}");
        assert_eq!(v["command"], "determinism");
        assert!(v["verdict"].is_null());
        let d = &v["probes"]["determinism"];
        assert_eq!(d["caches_compared"], true, "{d}");
        assert!(d["second_process_skipped"].is_null(), "{d}");
        let c = comparisons(&v);
        let against: Vec<&str> = c.iter().filter_map(|c| c["against"].as_str()).collect();
        assert_eq!(against, ["same process", "second process"]);
        for c in &c {
            assert_eq!(c["identical"], true, "{c}");
            assert_eq!(
                c["step_max_abs_diff"].as_array().map(Vec::len),
                Some(d["steps"].as_u64().unwrap_or(0) as usize)
            );
        }
    }
    let Some(s) = smollm2() else { return };
    let (code, v, err) = kvprobe_json(&[
        "determinism",
        "--device",
        "ane-sim",
        "--model",
        s.to_str().unwrap(),
        "--steps",
        "3",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(
        comparisons(&v).iter().all(|c| c["identical"] == true),
        "{v}"
    );
}

#[test]
fn a_state_race_differs_in_both_and_names_step_layer_and_slot() {
    let fx = fixture("llama", 7);
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("run");
    let m = fx.to_str().unwrap();
    let (code, v, err) = kvprobe_json(&ane(m, &["--fault", "ane-state-race"]));
    assert_eq!(code, 0, "{err}");
    for c in comparisons(&v) {
        assert_eq!(c["identical"], false, "{c}");
        let f = &c["first"];
        // the prompt's one call writes rows 0..20; rows past the 16th race: state row 16
        assert_eq!(
            (f["step"].as_u64(), f["layer"].as_u64(), f["slot"].as_u64()),
            (Some(0), Some(0), Some(16)),
            "{c}"
        );
        // at the prefill, layer 0's K/V differ in exactly the 4 raced rows
        assert_eq!(c["slots_differing"][0][0], 4, "{c}");
    }
    // artefacts: CSV, NPY [comparisons, steps, layers], the HTML section, a byte-identical re-render
    let a = ane(
        m,
        &["--fault", "ane-state-race", "--out", dir.to_str().unwrap()],
    );
    let text = kvprobe(&a);
    let stdout = String::from_utf8_lossy(&text.stdout);
    assert!(
        stdout.starts_with("determinism: 4 steps; same process: differs first at step 0"),
        "{stdout}"
    );
    assert!(
        stdout.contains("second process: differs first at step 0"),
        "{stdout}"
    );
    let csv = std::fs::read_to_string(dir.join("determinism.csv")).unwrap();
    assert!(
        csv.starts_with("against,step,max_abs_diff,slots_differing\nsame process,0,"),
        "{csv}"
    );
    assert_eq!(csv.lines().count(), 1 + 2 * 4, "{csv}");
    let npy = std::fs::read(dir.join("determinism_slots.npy")).unwrap();
    assert!(String::from_utf8_lossy(&npy[..128]).contains("'shape': (2, 4, 2)"));
    section_rerenders(&dir, "determinism");
}

/// The ring family's race (`ring-write-race`): both runs start from cleared rings (the host
/// zeroes them and reads them back), so the difference is the device's; `diagnose` names it.
#[test]
fn a_ring_write_race_differs_from_cleared_rings_and_diagnose_names_it() {
    let fx = fixture("llama", 7);
    let m = fx.to_str().unwrap();
    let mut args = vec!["determinism", "--sim", "--model", m];
    args.extend(geometry("24", "8", IDS_REMAINDER, "5"));
    args.extend(["--fault", "ring-write-race"]);
    let (code, v, err) = kvprobe_json(&args);
    assert_eq!(code, 0, "{err}");
    assert_eq!(v["probes"]["determinism"]["clean_reset"], true, "{v}");
    for c in comparisons(&v) {
        assert_eq!(c["identical"], false, "{c}");
        // the first chunk (the 5-token remainder) already writes raced bytes into layer 0
        assert_eq!(c["first"]["step"].as_u64(), Some(0), "{c}");
        assert_eq!(c["first"]["layer"].as_u64(), Some(0), "{c}");
    }
    args[0] = "diagnose";
    let (_, v, err) = kvprobe_json(&args);
    assert_eq!(verdict(&v), "nondeterministic", "{err} {:?}", evidence(&v));
    // the healthy emulator repeats bit for bit from cleared rings and says so
    args.truncate(args.len() - 2);
    let (_, v, err) = kvprobe_json(&args);
    assert_eq!(verdict(&v), "healthy", "{err}");
    assert!(
        evidence(&v)
            .iter()
            .any(|l| l.starts_with("repeat:") && l.contains("bit-identical")),
        "{:?}",
        evidence(&v)
    );
}

#[test]
fn the_second_process_is_a_fresh_device() {
    // a state kept across requests differs in this process, never in a new one
    let fx = fixture("llama", 7);
    let (code, v, err) = kvprobe_json(&ane(fx.to_str().unwrap(), &["--fault", "ane-stale-state"]));
    assert_eq!(code, 0, "{err}");
    let c = comparisons(&v);
    assert_eq!(c[0]["identical"], false, "{}", c[0]);
    assert_eq!(c[1]["identical"], true, "{}", c[1]);
    assert_eq!(v["probes"]["determinism"]["clean_reset"], false);
}

#[test]
fn the_record_subcommand_is_hidden() {
    let out = kvprobe(&["--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("determinism"), "{help}");
    assert!(!help.contains("determinism-record"), "{help}");
}
