//! Issue 9 additions stay serde compatible: older JSON (no runtime, no device, no new findings)
//! still reads, and the new verdicts round-trip by name.

use kvprobe_schema::{ProbeFindings, RuntimeKind, SimManifest, Verdict};

#[test]
fn new_verdicts_have_kebab_names_and_parse_back() {
    for (v, name) in [
        (Verdict::NumericOverflow, "numeric-overflow"),
        (Verdict::StaleCache, "stale-cache"),
    ] {
        assert_eq!(v.name(), name);
        assert_eq!(Verdict::parse(name), Some(v));
        assert!(Verdict::ALL.contains(&v));
        assert_eq!(serde_json::to_string(&v).unwrap(), format!("\"{name}\""));
    }
}

#[test]
fn older_json_reads_with_defaults() {
    let p: ProbeFindings = serde_json::from_str("{}").unwrap();
    assert!(p.overflow.is_none() && p.state.is_none() && p.not_applicable.is_empty());
    // and an empty list is not written, so older readers see the same keys as before
    assert_eq!(serde_json::to_string(&p).unwrap(), "{}");
    let m = r#"{"schema_version":1,"model":{"path":"m","sha256":"x","architecture":"a"},
        "cache_len":128,"prefill_len":32,"cache_quant":"uint8","cache_heads":"un-expanded",
        "weights":"f32","taps":false,"layouts":[],"calibration_prompts":[],"quant":[],"faults":[]}"#;
    let m: SimManifest = serde_json::from_str(m).unwrap();
    assert_eq!(m.device, "hailo-sim");
    assert_eq!(RuntimeKind::default(), RuntimeKind::GenaiRing);
    assert_eq!(
        serde_json::to_string(&RuntimeKind::Stateful).unwrap(),
        "\"stateful\""
    );
}
