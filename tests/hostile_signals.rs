//! SIGINT/SIGTERM during a run (issue 19): the run ends with `verdict: incomplete` and exit 3, and
//! leaves no hidden temporary folder or file and no half-written report, whenever it arrives.

use crate::common;
use common::*;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Hidden files or folders kvprobe makes while writing (`.kvprobe-out-*`, `.kvprobe-old-*`,
/// `.NAME.tmp`) anywhere under `dir`.
fn leftovers(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                found.push(e.path().display().to_string());
            }
            if e.path().is_dir() {
                stack.push(e.path());
            }
        }
    }
    found
}

/// Runs `diagnose` on `model` into `parent/run` and sends `sig` after `delay`; returns (exit code,
/// stderr).
fn interrupted_run(
    parent: &Path,
    model: &Path,
    sig: libc::c_int,
    delay: Duration,
) -> (i32, String) {
    let child = spawn_run(parent, model);
    std::thread::sleep(delay);
    // SAFETY: signalling our own child by its pid.
    unsafe {
        libc::kill(child.id() as libc::pid_t, sig);
    }
    let o = child.wait_with_output().unwrap();
    // killed by the signal's default action: only possible before main installed the handler,
    // when nothing can have been written yet (checked by the caller like any other end)
    let code = o.status.code().unwrap_or(-1);
    (code, String::from_utf8_lossy(&o.stderr).into_owned())
}

/// `diagnose --all-probes` on `model` into `parent/run`.
fn spawn_run(parent: &Path, model: &Path) -> std::process::Child {
    let out = parent.join("run");
    let mut args = vec![
        "diagnose".to_string(),
        "--sim".into(),
        "--model".into(),
        model.display().to_string(),
        "--out".into(),
        out.display().to_string(),
        "--all-probes".into(),
    ];
    args.extend(
        geometry("32", "8", IDS_REMAINDER, "8")
            .into_iter()
            .map(String::from),
    );
    Command::new(env!("CARGO_BIN_EXE_kvprobe"))
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run kvprobe")
}

/// Whether the main thread of `pid` blocks SIGINT, i.e. kvprobe's main took the signals over
/// (`SigBlk` in /proc: a hex mask, bit n-1 for signal n).
fn handler_installed(pid: u32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigBlk:"))
        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        .is_some_and(|m| m & (1 << (libc::SIGINT - 1)) != 0)
}

/// SIGHUP (the terminal closed) and SIGQUIT end a run as SIGTERM does (issue 38: they killed it,
/// and a SIGHUP during the write left a hidden `.kvprobe-out-*` folder nothing cleaned). Sent
/// once the handler is installed, so the default action would show as a kill.
#[test]
fn sighup_and_sigquit_end_a_run_like_sigterm() {
    let model = fixture("llama", 7);
    for sig in [libc::SIGHUP, libc::SIGQUIT] {
        let parent = tempfile::tempdir().unwrap();
        let mut child = spawn_run(parent.path(), &model);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !handler_installed(child.id()) && Instant::now() < deadline {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        // SAFETY: signalling our own child by its pid.
        unsafe {
            libc::kill(child.id() as libc::pid_t, sig);
        }
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        let code = o.status.code();
        assert!(
            matches!(code, Some(0 | 1 | 3)),
            "signal {sig}: {:?}: {err}",
            o.status
        );
        if code == Some(3) {
            assert!(err.contains("verdict: incomplete"), "{err}");
        }
        let left = leftovers(parent.path());
        assert!(left.is_empty(), "signal {sig} left {left:?}");
    }
}

/// Interrupts one run after each delay and checks how it ended; returns how many ended as
/// interrupted (exit 3).
fn interrupt_at(model: &Path, delays: &[Duration]) -> usize {
    let mut interrupted = 0;
    for (k, &delay) in delays.iter().enumerate() {
        let parent = tempfile::tempdir().unwrap();
        let sig = if k % 2 == 0 {
            libc::SIGTERM
        } else {
            libc::SIGINT
        };
        let (code, err) = interrupted_run(parent.path(), model, sig, delay);
        assert_ne!(code, 101, "panicked: {err}");
        let left = leftovers(parent.path());
        assert!(left.is_empty(), "left behind after exit {code}: {left:?}");
        let out = parent.path().join("run");
        if code == -1 {
            assert!(
                !out.exists(),
                "killed before main, yet {} exists",
                out.display()
            );
        } else if code == 3 {
            interrupted += 1;
            assert!(err.contains("verdict: incomplete"), "{err}");
            assert!(!out.exists(), "an interrupted run wrote {}", out.display());
        } else {
            // finished before the signal: the folder is whole
            assert!(code == 0 || code == 1, "exit {code}: {err}");
            assert!(out.join("report.html").is_file() && out.join("results.json").is_file());
        }
    }
    interrupted
}

/// Signals spread over a whole fixture run (about 0.1 s), so some land while the report is
/// written; how many interrupt depends on the machine's load, so only how each run ends is
/// checked here.
#[test]
fn an_interrupt_at_any_time_leaves_nothing_half_written() {
    let model = fixture("llama", 7);
    let t = Instant::now();
    let whole = tempfile::tempdir().unwrap();
    let (code, err) = interrupted_run(whole.path(), &model, 0, Duration::ZERO);
    assert!(code == 0 || code == 1, "{err}");
    let span = t.elapsed();
    // from 30 ms on: the process has usually reached main and taken the signals over
    let delays: Vec<Duration> = (0..8u32)
        .map(|k| Duration::from_millis(30) + span * k / 8)
        .collect();
    interrupt_at(&model, &delays);
}

/// SmolLM2's run lasts seconds, so signals from 0.2 s on land inside it whatever the load: each
/// must end as an interrupted run (exit 3, verdict incomplete, nothing written).
#[test]
fn an_interrupt_during_a_real_model_run_is_incomplete() {
    let Some(model) = smollm2() else { return };
    let delays: Vec<Duration> = [200, 400, 700, 1000, 1500, 2000]
        .into_iter()
        .map(Duration::from_millis)
        .collect();
    let interrupted = interrupt_at(&model, &delays);
    assert_eq!(
        interrupted,
        delays.len(),
        "only {interrupted} of {} runs were interrupted",
        delays.len()
    );
}
