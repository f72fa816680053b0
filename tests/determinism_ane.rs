//! Issue 20's ANE faults end to end through the binary, on the Llama fixture and SmolLM2: the
//! fp32-minimum mask and the fp16 RMSNorm → numeric-overflow naming the mask or the layer, the
//! state race past 16 rows per call → nondeterministic; healthy stays healthy.

use crate::common;
use common::*;

/// Declared in the ANE fault table with these verdicts (tests/ane_diagnose.rs runs the others).
const FAULTS: [(&str, &str); 3] = [
    ("ane-mask-fp32-min", "numeric-overflow"),
    ("ane-norm-fp16", "numeric-overflow"),
    ("ane-state-race", "nondeterministic"),
];

/// 20 fixture ids: one call of up to 32 rows writes four rows past the 16th.
const IDS_20: &str = "5,17,99,3,250,41,7,8,120,64,33,2,90,11,13,19,23,29,31,37";
/// Its first 16: no call writes past the 16th row.
const IDS_16: &str = "5,17,99,3,250,41,7,8,120,64,33,2,90,11,13,19";

fn diagnose(model: &str, rest: &[&str]) -> (i32, serde_json::Value, String) {
    let mut a = vec![
        "diagnose", "--device", "ane-sim", "--model", model, "--steps", "6",
    ];
    a.extend_from_slice(rest);
    kvprobe_json(&a)
}

fn args<'a>(geometry: &[&'a str], ids: &'a str, fault: &'a str) -> Vec<&'a str> {
    let mut a = geometry.to_vec();
    a.extend(["--ids", ids, "--fault", fault]);
    a
}

const Q8: [&str; 4] = ["--max-ctx", "96", "--max-query", "8"];
const Q32: [&str; 4] = ["--max-ctx", "64", "--max-query", "32"];

#[test]
fn the_fault_table_declares_them_with_these_verdicts() {
    let table = &kvprobe_npu::coreml::FAMILY.faults;
    for (fault, want) in FAULTS {
        assert_eq!(
            table.expected(fault).map(|v| v.name()).ok(),
            Some(want),
            "{fault}"
        );
    }
}

#[test]
fn fp32_minimum_mask_is_numeric_overflow_naming_the_mask() {
    let fx = fixture("llama", 11);
    let m = fx.to_str().unwrap();
    // 13 tokens in calls of 8 then 5: the second call's pad rows start at position 13;
    // 20 tokens in one call of up to 32: at position 20
    for (geometry, ids, pad) in [(Q8, IDS_REMAINDER, 13), (Q32, IDS_20, 20)] {
        let (code, v, err) = diagnose(m, &args(&geometry, ids, "ane-mask-fp32-min"));
        assert_eq!((code, verdict(&v)), (1, "numeric-overflow".into()), "{err}");
        assert_eq!(
            v["probes"]["overflow"]["position"], pad,
            "{}",
            v["probes"]["overflow"]
        );
        // layer 0's own K/V come from the embeddings: the first NaN state is layer 1's
        assert_eq!(v["probes"]["overflow"]["layer"], 0);
        let e = evidence(&v).join("\n");
        assert!(
            e.contains(&format!("past the {pad} positions the host sent")),
            "{e}"
        );
        assert!(e.contains("the mask"), "{e}");
    }
    let Some(s) = smollm2() else { return };
    let (code, v, err) = diagnose(
        s.to_str().unwrap(),
        &["--max-ctx", "128", "--fault", "ane-mask-fp32-min"],
    );
    assert_eq!((code, verdict(&v)), (1, "numeric-overflow".into()), "{err}");
    let n = v["provenance"]["prompt_ids"].as_array().map_or(0, Vec::len);
    assert_eq!(v["probes"]["overflow"]["position"], n);
    assert!(evidence(&v).join("\n").contains("the mask"));
}

#[test]
fn fp16_rmsnorm_is_numeric_overflow_naming_the_layer() {
    let fx = fixture("llama", 11);
    let m = fx.to_str().unwrap();
    // GAIN 24 stands in for larger activations: the fixture's layer-1 inputs pass 65504 in
    // their sum of squares, its embeddings do not (≥ 40 collapses layer 0 and the head too)
    for (geometry, ids) in [(Q8, IDS_REMAINDER), (Q32, IDS_20)] {
        let (code, v, err) = diagnose(m, &args(&geometry, ids, "ane-norm-fp16=24"));
        assert_eq!((code, verdict(&v)), (1, "numeric-overflow".into()), "{err}");
        assert_eq!(
            v["probes"]["overflow"]["zero_rows"][0], 1,
            "{}",
            v["probes"]["overflow"]
        );
        assert!(evidence(&v)
            .join("\n")
            .contains("the input norm of layer 1"));
    }
    let Some(s) = smollm2() else { return };
    // the literal fault: SmolLM2's own activations overflow
    let (code, v, err) = diagnose(
        s.to_str().unwrap(),
        &["--max-ctx", "128", "--fault", "ane-norm-fp16"],
    );
    assert_eq!((code, verdict(&v)), (1, "numeric-overflow".into()), "{err}");
    let l = v["probes"]["overflow"]["zero_rows"][0]
        .as_u64()
        .expect("a zeroed layer");
    assert!(l >= 1);
    assert!(evidence(&v)
        .join("\n")
        .contains(&format!("the input norm of layer {l}")));
}

#[test]
fn a_state_race_past_16_rows_is_nondeterministic() {
    let fx = fixture("llama", 11);
    let m = fx.to_str().unwrap();
    let (code, v, err) = diagnose(m, &args(&Q32, IDS_20, "ane-state-race"));
    assert_eq!((code, verdict(&v)), (1, "nondeterministic".into()), "{err}");
    let e = evidence(&v).join("\n");
    // rows 0..16 of the call are exact: the first differing state row is the 17th, slot 16
    assert!(e.contains("differs first at step 0 (logit"), "{e}");
    assert!(e.contains("cache 0 of layer 0, slot 16"), "{e}");
    assert!(e.contains("no second process inside diagnose"), "{e}");
    // 16 rows per call (a short prompt, or calls of 8) never race: the device is healthy
    for (geometry, ids) in [(Q32, IDS_16), (Q8, IDS_20)] {
        let (code, v, err) = diagnose(m, &args(&geometry, ids, "ane-state-race"));
        assert_eq!((code, verdict(&v)), (0, "healthy".into()), "{err}");
    }
    let Some(s) = smollm2() else { return };
    let (code, v, err) = diagnose(
        s.to_str().unwrap(),
        &["--max-ctx", "128", "--fault", "ane-state-race"],
    );
    assert_eq!((code, verdict(&v)), (1, "nondeterministic".into()), "{err}");
    assert!(evidence(&v).join("\n").contains("slot 16"));
}

#[test]
fn faults_compose_and_healthy_stays_healthy() {
    let fx = fixture("llama", 11);
    let m = fx.to_str().unwrap();
    // the race comes first: a run that differs makes every later comparison moot
    let mut a = args(&Q32, IDS_20, "ane-state-race");
    a.extend(["--fault", "ane-mask-fp32-min"]);
    let (code, v, err) = diagnose(m, &a);
    assert_eq!((code, verdict(&v)), (1, "nondeterministic".into()), "{err}");
    for (geometry, ids) in [(Q8, IDS_REMAINDER), (Q32, IDS_20)] {
        let mut a = geometry.to_vec();
        a.extend(["--ids", ids]);
        let (code, v, err) = diagnose(m, &a);
        assert_eq!((code, verdict(&v)), (0, "healthy".into()), "{err}");
        assert!(evidence(&v)
            .join("\n")
            .contains("same process: bit-identical"));
    }
}
