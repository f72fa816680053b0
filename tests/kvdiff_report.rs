//! `kvdiff --out DIR`: results.json, the CSV table, the two `[layers, positions]` arrays and the
//! K and V heatmaps agree with one another and with the run's geometry.

use crate::common;
use common::*;

use ndarray_npy::ReadNpyExt;

fn npy(dir: &std::path::Path, name: &str) -> ndarray::ArrayD<f32> {
    let f = std::fs::File::open(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    ndarray::ArrayD::<f32>::read_npy(f).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn kvdiff_artefacts_follow_the_geometry() {
    let f = fixture("llama", 7);
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let mut args = vec!["kvdiff", "--sim", "--model", f.to_str().unwrap()];
    // 13 prompt tokens and 4 comparison points: the last holds positions 0..=15
    args.extend(geometry("24", "8", IDS_REMAINDER, "4"));
    args.extend([
        "--fault",
        "truncate-entry=16@v,layer=1",
        "--out",
        out.to_str().unwrap(),
    ]);
    let o = kvprobe(&args);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    let k = &r["probes"]["kvdiff"];
    // fixture: 2 layers, 2 KV heads of 16; uint8 entries of 32 bytes, 16 kept: KV head 1 of
    // layer 1's V is lost (layer 0 and K untouched)
    let d = &k["first_divergent"];
    assert_eq!(
        (
            d["layer"].as_u64(),
            d["kv_head"].as_u64(),
            d["kind"].as_str()
        ),
        (Some(1), Some(1), Some("v")),
        "{k}"
    );
    for name in ["kvdiff_k.npy", "kvdiff_v.npy"] {
        assert_eq!(npy(&out, name).shape(), &[2, 16], "{name}");
    }
    // one CSV row per step × layer × head × kind
    let csv = std::fs::read_to_string(out.join("kvdiff.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + 4 * 2 * 2 * 2);
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    for svg in ["kvdiff_k.svg", "kvdiff_v.svg"] {
        assert!(out.join(svg).is_file(), "{svg}");
    }
    assert!(html.contains("kvdiff: K cache, layer × position"));
    assert!(html.contains("kvdiff: V cache, layer × position"));
}
