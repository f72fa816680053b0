//! Shared helpers of the probe/diagnose CLI tests: fixture models and running the binary.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A fixture model folder (written once per target dir): "llama" or "gpt2".
pub fn fixture(kind: &str, seed: u64) -> PathBuf {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR"));
    kvprobe_testkit::fixtures::fixture_folder(
        root,
        kvprobe_testkit::fixtures::FixtureKind::named(kind),
        seed,
    )
    .expect("write fixture")
}

/// The fetched SmolLM2, when present (CI always has it); when absent it prints the skip line,
/// so a test reads `let Some(m) = smollm2() else { return };`.
pub fn smollm2() -> Option<PathBuf> {
    let p =
        Path::new(env!("CARGO_MANIFEST_DIR")).join(".cache/models/smollm2-135m-instruct-q4_1.gguf");
    if !p.is_file() {
        eprintln!("SmolLM2 not fetched: skipped (run scripts/fetch-model.sh)");
    }
    p.is_file().then_some(p)
}

/// SmolLM2's short test geometry: L 64, P 16, a 13-token prompt (one chunk), 8 steps.
pub const SMOLLM2_L64: [&str; 8] = [
    "--cache-len",
    "64",
    "--prefill-len",
    "16",
    "--prompt",
    "The capital of France is Paris. The capital of Italy is",
    "--steps",
    "8",
];

/// 13 fixture token ids: with P = 8 the prefill runs a remainder chunk of 5, then 8.
pub const IDS_REMAINDER: &str = "1,5,9,22,41,17,3,99,150,200,12,7,8";

/// `--cache-len L --prefill-len P --ids IDS --steps STEPS`.
pub fn geometry<'a>(l: &'a str, p: &'a str, ids: &'a str, steps: &'a str) -> Vec<&'a str> {
    vec![
        "--cache-len",
        l,
        "--prefill-len",
        p,
        "--ids",
        ids,
        "--steps",
        steps,
    ]
}

/// `f` over `items` on two threads, results in item order. CI has two cores and each case is
/// one run of the binary: a test of several SmolLM2 runs in a row otherwise leaves one idle.
pub fn par_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let next = AtomicUsize::new(0);
    let mut done: Vec<(usize, R)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..2)
            .map(|_| {
                scope.spawn(|| {
                    let mut out = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(item) = items.get(i) else { break out };
                        out.push((i, f(item)));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    done.sort_by_key(|&(i, _)| i);
    done.into_iter().map(|(_, r)| r).collect()
}

pub fn kvprobe(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvprobe"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run kvprobe")
}

/// Run with `--json` and parse stdout; returns (exit code, results JSON, stderr).
pub fn kvprobe_json(args: &[&str]) -> (i32, serde_json::Value, String) {
    let mut a: Vec<&str> = args.to_vec();
    a.push("--json");
    let out = kvprobe(&a);
    let code = out.status.code().unwrap_or(-1);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("kvprobe {args:?}: stdout is not JSON ({e}); exit {code}; stderr: {stderr}")
    });
    (code, v, stderr)
}

pub fn verdict(v: &serde_json::Value) -> String {
    v["verdict"].as_str().unwrap_or("null").to_string()
}

/// The verdict's evidence lines.
pub fn evidence(v: &serde_json::Value) -> Vec<&str> {
    v["evidence"]
        .as_array()
        .map(|a| a.iter().filter_map(|e| e.as_str()).collect())
        .unwrap_or_default()
}

/// A refused command: exit 2, one stderr line holding `needle`, nothing on stdout.
pub fn one_line_exit_2(args: &[&str], needle: &str) {
    let out = kvprobe(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    assert!(err.contains(needle), "{args:?}: `{needle}` not in {err}");
    assert!(out.stdout.is_empty(), "{args:?}");
}

/// `dir/report.html` holds `<section id="ID">` and `kvprobe report DIR` re-renders it
/// byte-identical.
pub fn section_rerenders(dir: &Path, id: &str) {
    let html = std::fs::read_to_string(dir.join("report.html")).expect("report.html");
    assert!(
        html.contains(&format!("<section id=\"{id}\">")),
        "no {id} section"
    );
    let out = kvprobe(&["report", dir.to_str().expect("utf-8 path")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let again = std::fs::read_to_string(dir.join("report.html")).expect("report.html");
    assert!(again == html, "report.html changed on re-render");
}

/// `scripts/export-onnx.py HF OUT [extra]`; fails the test with the script's message.
pub fn export_onnx(hf: &Path, out: &Path, extra: &[&str]) {
    let o = Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/export-onnx.py"))
        .arg(hf)
        .arg(out)
        .args(extra)
        .output()
        .expect("python3");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// Runs `make` to write the GenAI folder `out` unless it already holds a finished export by the
/// exporters as they are now (its genai_config.json, and a stamp of the exporters' sha256 written
/// after `make`). Tests of one binary run on threads and share these folders: one writer at a
/// time, and a test that waited finds the folder finished instead of replacing it under a
/// reader. Keyed by the exporters because a folder kept by presence alone passed here on an
/// export the changed exporter no longer writes, and failed on CI's fresh one.
pub fn exported_once(out: &Path, make: impl FnOnce()) {
    static EXPORTS: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = EXPORTS.lock().unwrap_or_else(|e| e.into_inner());
    let stamp = out.join(".kvprobe-test-stamp");
    let want = exporters_sha256();
    let kept = out.join("genai_config.json").is_file()
        && std::fs::read_to_string(&stamp).is_ok_and(|s| s == want);
    if !kept {
        let _ = std::fs::remove_dir_all(out);
        make();
        std::fs::write(&stamp, want).expect("export stamp");
    }
}

/// The sha256 of every file that decides what an export holds: the two graph writers and the
/// Rust side that writes the weights they read.
fn exporters_sha256() -> String {
    use sha2::{Digest, Sha256};
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut h = Sha256::new();
    for f in [
        "scripts/export-onnx.py",
        "scripts/export-openvino.py",
        "npu/src/onnx/export.rs",
    ] {
        h.update(std::fs::read(root.join(f)).expect("exporter source"));
    }
    format!("{:x}", h.finalize())
}

/// Rows of a `.npy` `[rows, vocab]`.
pub fn npy_rows(p: &Path) -> Vec<Vec<f32>> {
    use ndarray_npy::ReadNpyExt;
    let f = std::fs::File::open(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let a = ndarray::Array2::<f32>::read_npy(f).unwrap();
    a.rows().into_iter().map(|r| r.to_vec()).collect()
}

/// The median of `1 − cosine` over paired rows.
pub fn median_miss(a: &[Vec<f32>], b: &[Vec<f32>]) -> f64 {
    let cosine = |x: &[f32], y: &[f32]| {
        let dot = |p: &[f32], q: &[f32]| {
            p.iter()
                .zip(q)
                .map(|(u, w)| *u as f64 * *w as f64)
                .sum::<f64>()
        };
        dot(x, y) / (dot(x, x) * dot(y, y)).sqrt()
    };
    let mut m: Vec<f64> = a.iter().zip(b).map(|(x, y)| 1.0 - cosine(x, y)).collect();
    m.sort_by(f64::total_cmp);
    m[m.len() / 2]
}

/// Runs the verdict's reproducer (`v["reproducer"]["command"]`, a `kvprobe ref logits` run) with
/// its `--out` in `dir`, and the reference fed as the model reads the same ids (`ref logits
/// --model model`): paired with the device's greedy steps (`run/greedy_device_logits.npy`), the
/// reproducer's rows from `skip.0` must be exactly as many and miss them at least 2.5 × less than
/// the plain reference's rows from `skip.1`. Returns the reproducer's arguments (after `kvprobe`).
pub fn reproducer_beats_the_model_feed(
    v: &serde_json::Value,
    model: &str,
    run: &Path,
    dir: &Path,
    skip: (usize, usize),
) -> Vec<String> {
    let mut args: Vec<String> = v["reproducer"]["command"]
        .as_array()
        .unwrap_or_else(|| panic!("no reproducer: {}", v["evidence"]))
        .iter()
        .skip(1)
        .map(|a| a.as_str().expect("a string argument").to_string())
        .collect();
    assert_eq!(args[..2], ["ref", "logits"], "{args:?}");
    let out = dir.join("reproducer.npy");
    let k = args.iter().position(|a| a == "--out").expect("--out");
    args[k + 1] = out.to_str().expect("utf-8 path").to_string();
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    assert!(kvprobe(&a).status.success(), "{args:?}");
    let ids = &args[args.iter().position(|a| a == "--ids").expect("--ids") + 1];
    let plain = dir.join("plain.npy");
    let p = plain.to_str().expect("utf-8 path");
    let o = kvprobe(&["ref", "logits", "--model", model, "--ids", ids, "--out", p]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let device = npy_rows(&run.join("greedy_device_logits.npy"));
    let fed = npy_rows(&out)[skip.0..].to_vec();
    let model_feed = npy_rows(&plain)[skip.1..].to_vec();
    assert_eq!(fed.len(), device.len());
    let (a, b) = (
        median_miss(&fed, &device),
        median_miss(&model_feed, &device),
    );
    eprintln!("reproducer vs device: median miss {a:.2e}; the reference as the model reads the ids: {b:.2e}");
    assert!(a * 2.5 <= b, "the reproducer {a:e}, the model's feed {b:e}");
    args
}
