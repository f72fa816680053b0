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
