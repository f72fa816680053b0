//! The process side of hostile input (issue 38): arguments that are not UTF-8, and a standard
//! output that is closed early or cannot be written. Each case used to panic (exit 101).

use crate::common;
use common::*;

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn sim_run(model: &Path, out: &Path) -> Vec<OsString> {
    let mut a: Vec<OsString> = ["diagnose", "--sim", "--model"]
        .into_iter()
        .map(OsString::from)
        .collect();
    a.push(model.as_os_str().to_owned());
    a.extend(
        geometry("32", "8", "1,5,9,22", "2")
            .into_iter()
            .map(OsString::from),
    );
    a.push("--out".into());
    a.push(out.as_os_str().to_owned());
    a
}

/// `ref generate` of two tokens on the model at `m`.
fn generate(m: &str) -> Vec<OsString> {
    [
        "ref",
        "generate",
        "--model",
        m,
        "--prompt",
        "hi",
        "--max-new",
        "2",
    ]
    .map(OsString::from)
    .to_vec()
}

fn run_with_stdout(args: &[OsString], stdout: Stdio) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvprobe"))
        .args(args)
        .stdout(stdout)
        .stderr(Stdio::piped())
        .output()
        .expect("run kvprobe")
}

/// A byte that is not UTF-8 in `--out` and in the `--model` path: the run works (std::env::args
/// panicked after the whole run).
#[test]
fn non_utf8_paths_in_arguments_do_not_panic() {
    let tmp = tempfile::tempdir().unwrap();
    let odd = |name: &str| {
        let mut b = name.as_bytes().to_vec();
        b.push(0xff);
        tmp.path().join(OsString::from_vec(b))
    };
    let model = odd("model");
    std::fs::create_dir(&model).unwrap();
    for e in std::fs::read_dir(fixture("llama", 7)).unwrap().flatten() {
        std::fs::copy(e.path(), model.join(e.file_name())).unwrap();
    }
    let out = odd("run");
    let o = run_with_stdout(&sim_run(&model, &out), Stdio::null());
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(out.join("results.json").is_file());
}

/// A reader that went away before kvprobe printed: the command ends quietly with its own code
/// (`| head`, `| true`), where it panicked or said "usage or input error".
#[test]
fn a_closed_stdout_ends_quietly() {
    let tmp = tempfile::tempdir().unwrap();
    let model = fixture("llama", 7);
    let run = tmp.path().join("run");
    let o = run_with_stdout(&sim_run(&model, &run), Stdio::null());
    assert_eq!(o.status.code(), Some(0));
    let m = model.display().to_string();
    let cases: Vec<(Vec<OsString>, i32)> = vec![
        (generate(&m), 0),
        (vec!["report".into(), run.as_os_str().to_owned()], 0),
        (sim_run(&model, &tmp.path().join("run2")), 0),
    ];
    for (args, code) in cases {
        // a pipe whose read end is closed before the child writes
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let o = run_with_stdout(&args, Stdio::from(writer));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {err}");
        assert!(err.trim().is_empty(), "{args:?}: {err}");
    }
}

/// A standard output that cannot take the bytes (`> /dev/full`): one line, exit 2, no panic.
#[test]
fn an_unwritable_stdout_is_one_line() {
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        eprintln!("skipped: no /dev/full on this machine");
        return;
    };
    let m = fixture("llama", 7).display().to_string();
    let args = generate(&m);
    let o = run_with_stdout(&args, Stdio::from(full));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("standard output"), "{err}");
}

/// A model folder, or one of its files, that the user may not read is named as unreadable, with
/// the cause once: the folder said "missing config.json", tokenizer.json said "replace
/// tokenizer.json with the model's original file", config.json and model.safetensors printed
/// "Permission denied" twice (issue 38). As root, whom mode 000 stops from nothing, kvprobe runs
/// as `nobody` through setpriv; without setpriv the test says so and passes.
#[test]
fn unreadable_model_files_are_named_as_unreadable() {
    use std::os::unix::fs::PermissionsExt;
    let root = unsafe { libc::geteuid() } == 0;
    if root && Command::new("setpriv").arg("--version").output().is_err() {
        eprintln!("skipped: running as root without setpriv");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let mode =
        |p: &Path, m: u32| std::fs::set_permissions(p, PermissionsExt::from_mode(m)).unwrap();
    mode(tmp.path(), 0o755);
    let m = tmp.path().join("model");
    std::fs::create_dir(&m).unwrap();
    for e in std::fs::read_dir(fixture("llama", 7)).unwrap().flatten() {
        std::fs::copy(e.path(), m.join(e.file_name())).unwrap();
        mode(&m.join(e.file_name()), 0o644);
    }
    for (locked, needle) in [
        (m.clone(), "cannot read the model folder"),
        (m.join("config.json"), "config.json: could not read"),
        (m.join("tokenizer.json"), "tokenizer.json: could not read"),
        (
            m.join("model.safetensors"),
            "model.safetensors: could not read",
        ),
    ] {
        let was = std::fs::metadata(&locked).unwrap().permissions().mode();
        mode(&locked, 0);
        let mut cmd = Command::new(if root {
            "setpriv"
        } else {
            env!("CARGO_BIN_EXE_kvprobe")
        });
        if root {
            cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
                .arg(env!("CARGO_BIN_EXE_kvprobe"));
        }
        let r = cmd.args(generate(m.to_str().unwrap())).output().unwrap();
        mode(&locked, was & 0o777);
        let err = String::from_utf8_lossy(&r.stderr);
        assert_eq!(r.status.code(), Some(2), "{}: {err}", locked.display());
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(needle), "{needle}: {err}");
        assert_eq!(err.matches("Permission denied").count(), 1, "{err}");
    }
}
