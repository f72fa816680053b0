//! `kvprobe report` through the binary: re-render, before/after page, refused folders (exit 2).

use kvprobe_reports::fixtures::{faulty_results, healthy_results};
use kvprobe_reports::write_artifacts;
use std::path::Path;
use std::process::{Command, Output};

fn kvprobe(args: &[&Path]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvprobe"))
        .args(args)
        .output()
        .expect("run kvprobe")
}

fn stderr_line(out: &Output) -> String {
    let s = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(s.trim_end().lines().count(), 1, "not one line: {s:?}");
    s
}

#[test]
fn report_rerenders_a_run_folder_byte_identically() {
    let dir = tempfile::tempdir().unwrap();
    write_artifacts(&faulty_results(), &[], dir.path()).unwrap();
    let page = dir.path().join("report.html");
    let original = std::fs::read(&page).unwrap();
    std::fs::remove_file(&page).unwrap();
    let out = kvprobe(&[Path::new("report"), dir.path()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        std::fs::read(&page).unwrap() == original,
        "re-rendered page differs"
    );
}

#[test]
fn report_compare_writes_one_page_with_both_verdicts() {
    let (before, after, out_dir) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    write_artifacts(&faulty_results(), &[], before.path()).unwrap();
    write_artifacts(&healthy_results(), &[], after.path()).unwrap();
    let target = out_dir.path().join("cmp");
    let out = kvprobe(&[
        Path::new("report"),
        Path::new("--compare"),
        before.path(),
        after.path(),
        Path::new("--out"),
        &target,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let html = std::fs::read_to_string(target.join("compare.html")).unwrap();
    assert!(html.contains("Verdict: cache-layout-mismatch") && html.contains("Verdict: healthy"));
}

#[test]
fn report_refuses_bad_folders_with_exit_2() {
    let empty = tempfile::tempdir().unwrap();
    let out = kvprobe(&[Path::new("report"), empty.path()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr_line(&out).contains("results.json"));
    assert!(!empty.path().join("report.html").exists());

    let mut v = serde_json::to_value(healthy_results()).unwrap();
    v["schema_version"] = serde_json::json!(kvprobe_schema::SCHEMA_VERSION + 1);
    std::fs::write(empty.path().join("results.json"), v.to_string()).unwrap();
    let out = kvprobe(&[Path::new("report"), empty.path()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr_line(&out).contains("schema_version"));
    assert!(!empty.path().join("report.html").exists());

    std::fs::write(empty.path().join("results.json"), b"\xff\xfe not json").unwrap();
    let out = kvprobe(&[Path::new("report"), empty.path()]);
    assert_eq!(out.status.code(), Some(2));
    stderr_line(&out);

    let out = kvprobe(&[Path::new("report")]);
    assert_eq!(out.status.code(), Some(2));
}

/// `kvprobe report DIR` under a 1 GB address-space limit.
fn report_limited(dir: &Path) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 1000000 && exec \"$0\" report \"$1\"")
        .arg(env!("CARGO_BIN_EXE_kvprobe"))
        .arg(dir)
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("run kvprobe")
}

/// A run folder of the faulty fixture whose results.json `edit` changed; no report.html.
fn edited_run(edit: impl FnOnce(&mut serde_json::Value)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_artifacts(&faulty_results(), &[], dir.path()).unwrap();
    std::fs::remove_file(dir.path().join("report.html")).unwrap();
    let path = dir.path().join("results.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&path, v.to_string()).unwrap();
    dir
}

/// Exit 2, one stderr line naming results.json and `needle`, no panic, nothing written.
fn assert_refused(out: &Output, dir: &Path, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let line = stderr_line(out);
    assert!(!line.contains("panicked"), "{line}");
    assert!(
        line.contains("results.json") && line.contains(needle),
        "{line}"
    );
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(!dir.join("report.html").exists(), "partial output");
}

#[test]
fn report_refuses_a_matrix_that_does_not_match_its_axes() {
    // issue 19: a colmap matrix with more rows than entries panicked in the heatmap's pooling
    for extra in [5usize, 300] {
        let dir = edited_run(|v| {
            let m = v["probes"]["colmap"]["matrix"].as_array_mut().unwrap();
            let row = m[0].clone();
            m.extend(std::iter::repeat_n(row, extra));
        });
        assert_refused(&report_limited(dir.path()), dir.path(), "colmap matrix");
    }
    let dir = edited_run(|v| {
        v["probes"]["colmap"]["matrix"]
            .as_array_mut()
            .unwrap()
            .pop();
    });
    assert_refused(&report_limited(dir.path()), dir.path(), "colmap matrix");
}

#[test]
fn report_refuses_sizes_its_data_cannot_back_within_1_gb() {
    // issue 19: declared sizes were believed; each of these aborted on a multi-GB allocation
    let dir = edited_run(|v| {
        // a prompt declared a billion tokens long under three rows of data
        let rows: Vec<_> = (0..3)
            .map(|k| {
                let c = kvprobe_schema::test_findings::comparison(0.9);
                serde_json::json!({"split": k, "prefill_continue": null, "decode_cosines": [0.9], "decode_final": c})
            })
            .collect();
        let s = kvprobe_schema::test_findings::splits(1_000_000_000, Vec::new(), 0.9, 0.9, 0.9);
        v["probes"]["splits"] = serde_json::to_value(s).unwrap();
        v["probes"]["splits"]["rows"] = rows.into();
    });
    assert_refused(&report_limited(dir.path()), dir.path(), "splits matrix");
    // 1.4 MB asking for 7 GB: a thousand empty caches × 150 000 shifts × 3 layouts of f64
    let dir = edited_run(|v| {
        let l = &mut v["probes"]["layout"];
        l["shifts"] = (0..150_000).collect::<Vec<i64>>().into();
        let mut cache = l["caches"][0].clone();
        cache["scores"] = serde_json::json!([]);
        l["caches"] = vec![cache; 1000].into();
    });
    let size = std::fs::metadata(dir.path().join("results.json"))
        .unwrap()
        .len();
    assert!(size < 2_000_000, "{size} bytes");
    assert_refused(
        &report_limited(dir.path()),
        dir.path(),
        "layout correlation matrix",
    );
}
