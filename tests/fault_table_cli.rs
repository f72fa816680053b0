//! Faults added through the fault tables (issue 17), end to end through the binary: each gets
//! the verdict its table row declares.

use crate::common;
use common::*;

use kvprobe_npu::families;

/// `diagnose --sim --fault FAULT` on the Llama fixture (remainder chunk), against the table.
fn declared_verdict_is_diagnosed(fault: &str) {
    let want = families::family("hailo-sim")
        .expect("the Hailo emulator is registered")
        .faults
        .expected(fault)
        .unwrap_or_else(|e| panic!("{fault}: {e}"));
    let f = fixture("llama", 7);
    let mut args = vec!["diagnose", "--sim", "--model", f.to_str().unwrap()];
    args.extend(geometry("24", "8", IDS_REMAINDER, "16"));
    args.extend(["--fault", fault]);
    let (code, v, stderr) = kvprobe_json(&args);
    assert_eq!(
        (verdict(&v).as_str(), code),
        (want.name(), 1),
        "{fault}: {stderr}; evidence {}",
        v["evidence"]
    );
}

#[test]
fn prefill_position_is_a_position_mismatch() {
    declared_verdict_is_diagnosed("prefill-position=+2");
    declared_verdict_is_diagnosed("prefill-position=-3");
}
