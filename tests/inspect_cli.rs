//! `kvprobe inspect` end to end: exit codes 0 / 1 / 2, JSON output, --extract, --emit-sim, --model.

use std::path::{Path, PathBuf};
use std::process::Command;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("npu/tests/fixtures/hef")
        .join(name)
}

fn kvprobe(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kvprobe"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn healthy_hef_exits_zero() {
    let hef = fixture("healthy.hef");
    let (code, out, err) = kvprobe(&["inspect", hef.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("group m__prefill"), "{out}");
    assert!(out.contains("0 error(s), 0 warning(s)"), "{out}");
}

#[test]
fn json_output_is_one_document() {
    let hef = fixture("healthy.hef");
    let (code, out, _) = kvprobe(&["inspect", hef.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["errors"], 0);
    assert_eq!(v["hef"]["groups"][1]["name"], "m__tbt");
    assert_eq!(v["device"]["cache_len"], 32);
    assert_eq!(v["hef"]["groups"][0]["cache_edges"][0]["entry_size"], 16);
}

#[test]
fn error_lint_exits_one() {
    let hef = fixture("broken_output_width.hef");
    let (code, out, _) = kvprobe(&["inspect", hef.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("error[output-width]"), "{out}");
    assert!(out.contains("F1"), "{out}");
}

#[test]
fn unreadable_input_exits_two_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.hef");
    std::fs::write(
        &junk,
        b"definitely not a hef file, but long enough to have a header .......",
    )
    .unwrap();
    for path in [junk.clone(), dir.path().join("missing.hef")] {
        let (code, out, err) = kvprobe(&["inspect", path.to_str().unwrap()]);
        assert_eq!(code, 2, "{out}{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(
            err.contains(path.file_name().unwrap().to_str().unwrap()),
            "{err}"
        );
    }
    // truncated real HEF
    let bytes = std::fs::read(fixture("healthy.hef")).unwrap();
    let cut = dir.path().join("cut.hef");
    std::fs::write(&cut, &bytes[..bytes.len() / 3]).unwrap();
    let (code, _, err) = kvprobe(&["inspect", cut.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
}

#[test]
fn extract_and_emit_sim() {
    let dir = tempfile::tempdir().unwrap();
    let hef = fixture("healthy.hef");
    let res = dir.path().join("res");
    let sim = dir.path().join("sim.json");
    let (code, out, err) = kvprobe(&[
        "inspect",
        hef.to_str().unwrap(),
        "--extract",
        res.to_str().unwrap(),
        "--emit-sim",
        sim.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    for name in [
        "hailo-config.json",
        "tokenizer.json",
        "embeddings.bin",
        "rope_theta_data.bin",
    ] {
        assert!(res.join(name).is_file(), "{name}");
    }
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(res.join("hailo-config.json")).unwrap()).unwrap();
    assert_eq!(cfg["pre_process_params"]["kv_cache_size"], 32);
    // 64 rows × 32 uint16
    assert_eq!(
        std::fs::metadata(res.join("embeddings.bin")).unwrap().len(),
        64 * 32 * 2
    );
    let m: kvprobe_schema::SimManifest =
        serde_json::from_slice(&std::fs::read(&sim).unwrap()).unwrap();
    assert_eq!((m.cache_len, m.prefill_len), (32, 8));
    assert_eq!(m.layouts.len(), 16);
}

#[test]
fn model_pairing_mismatch_exits_one() {
    let dir = tempfile::tempdir().unwrap();
    kvprobe_reference::fixtures::write_tiny_llama(dir.path(), 3).unwrap();
    let hef = fixture("healthy.hef");
    let (code, out, err) = kvprobe(&[
        "inspect",
        hef.to_str().unwrap(),
        "--model",
        dir.path().to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{out}{err}");
    // the fixture HEF has vocab 64 and hidden 32, the tiny Llama 300 and 64
    assert!(out.contains("error[pair-vocab]"), "{out}");
    assert!(out.contains("error[pair-hidden]"), "{out}");
    let (code, _, err) = kvprobe(&[
        "inspect",
        hef.to_str().unwrap(),
        "--model",
        "/no/such/model",
    ]);
    assert_eq!(code, 2, "{err}");
}
