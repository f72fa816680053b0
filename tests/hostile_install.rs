//! An installed kvprobe (`cargo install`, run outside the checkout) finds its model through
//! `$KVPROBE_MODEL` or the user cache `scripts/fetch-model.sh` fills, and ships completions and a
//! man page (issue 19).

use crate::common;
use common::*;

use std::path::Path;
use std::process::{Command, Output};

/// `kvprobe args` from `cwd` (outside the checkout) with `env` set and no inherited model hints.
fn installed(cwd: &Path, env: &[(&str, &Path)], args: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kvprobe"));
    c.args(args)
        .current_dir(cwd)
        .env_remove("KVPROBE_MODEL")
        .env_remove("XDG_CACHE_HOME")
        .env("HOME", cwd);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run kvprobe")
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

#[test]
fn model_from_env_or_user_cache_outside_the_checkout() {
    let model = fixture("llama", 7);
    let gen = ["ref", "generate", "--prompt", "hi", "--max-new", "1"];
    let away = tempfile::tempdir().unwrap();

    let o = installed(away.path(), &[], &gen);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("KVPROBE_MODEL") && err.contains("fetch-model.sh"),
        "{err}"
    );

    let missing = away.path().join("nope.gguf");
    let o = installed(away.path(), &[("KVPROBE_MODEL", &missing)], &gen);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("$KVPROBE_MODEL=") && err.trim().lines().count() == 1,
        "{err}"
    );

    let o = installed(away.path(), &[("KVPROBE_MODEL", &model)], &gen);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );

    // the user cache (an HF folder under the default model's name loads like the GGUF would)
    let cache = away.path().join("xdg");
    copy_dir(
        &model,
        &cache.join("kvprobe/models/smollm2-135m-instruct-q4_1.gguf"),
    );
    let o = installed(away.path(), &[("XDG_CACHE_HOME", &cache)], &gen);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn completions_and_man_page() {
    let away = tempfile::tempdir().unwrap();
    for shell in ["bash", "zsh", "fish"] {
        let o = installed(away.path(), &[], &["completions", shell]);
        assert_eq!(o.status.code(), Some(0));
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(
            text.contains("kvprobe") && text.contains("diagnose"),
            "{shell}"
        );
    }
    let o = installed(away.path(), &[], &["completions", "tcsh"]);
    assert_eq!(o.status.code(), Some(2));
    let o = installed(away.path(), &[], &["man"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains(".TH kvprobe 1") && text.contains("diagnose"));
}

/// `--help` groups the device flags under headings and lists each choice flag's values; a typo
/// in a choice is refused by the parser (exit 2) naming the valid values, and the libraries'
/// aliases still parse.
#[test]
fn help_lists_choices_under_headings() {
    let away = tempfile::tempdir().unwrap();
    let o = installed(away.path(), &[], &["greedy", "--help"]);
    assert_eq!(o.status.code(), Some(0));
    let help = String::from_utf8_lossy(&o.stdout);
    for heading in [
        "Model and prompt:",
        "Device:",
        "Hailo emulator (--sim):",
        "ANE emulator (--device ane-sim):",
        "ONNX Runtime (--onnx):",
        "Output:",
    ] {
        assert!(help.contains(heading), "no heading {heading} in\n{help}");
    }
    for value in ["sign-folded", "un-expanded", "int8", "openvino", "vitisai"] {
        assert!(help.contains(value), "{value} not listed in\n{help}");
    }
    assert!(
        help.contains("uint16 cache edges"),
        "--sim-cache-bits lists no choices in\n{help}"
    );
    let o = installed(
        away.path(),
        &[],
        &["greedy", "--sim", "--sim-cache-bits", "12"],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("[possible values: 8, 16]"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = installed(
        away.path(),
        &[],
        &["greedy", "--sim", "--sim-weights", "int4"],
    );
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("int4") && err.contains("f32") && err.contains("int8"),
        "{err}"
    );
    // `int` is an alias the manifest parser accepts for `edges`; the flag takes it too (it
    // fails later only for want of a model here, not as a bad value)
    let o = installed(away.path(), &[], &["greedy", "--sim", "--sim-quant", "int"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("invalid value"), "{err}");
}

/// `kvprobe report DIR --markdown` writes summary.md beside report.html.
#[test]
fn report_markdown_writes_the_summary() {
    let dir = tempfile::tempdir().unwrap();
    let r = kvprobe_reports::fixtures::faulty_results();
    std::fs::write(
        dir.path().join("results.json"),
        serde_json::to_string(&r).unwrap(),
    )
    .unwrap();
    let d = dir.path().display().to_string();
    let o = installed(dir.path(), &[], &["report", &d, "--markdown"]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let md = std::fs::read_to_string(dir.path().join("summary.md")).unwrap();
    assert!(
        md.starts_with("## kvprobe: `") && md.contains("**Command**"),
        "{md}"
    );
    assert!(dir.path().join("report.html").is_file());
}
