//! `--onnx DIR` end to end through the binary on the real ONNX Runtime (issue 22): healthy
//! diagnoses on the exported fixture and SmolLM2, and bad input as one line with exit 2 or 3.
#![cfg(feature = "onnx")]

use crate::common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::Command;

/// The Llama fixture of `seed` exported as a GenAI folder (once per target dir).
pub(crate) fn genai_fixture(seed: u64) -> (PathBuf, PathBuf) {
    let hf = fixture("llama", seed);
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("onnx-genai-llama-{seed}"));
    exported_once(&out, || export_onnx(&hf, &out, &[]));
    (hf, out)
}

/// Every file of an export has what a plain create gives (0666 less the umask): onnx wrote
/// model.onnx.data 0600, so the folder's group could not read the weights (issue 38).
#[test]
fn export_files_have_the_umask_mode() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("genai");
    export_onnx(&fixture("llama", 7), &out, &[]);
    let plain = tmp.path().join("plain");
    std::fs::write(&plain, "").unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    for f in ["model.onnx", "model.onnx.data", "genai_config.json"] {
        assert_eq!(mode(&out.join(f)), mode(&plain), "{f}");
    }
}

/// SmolLM2 as a GenAI folder under .cache/onnx (what scripts/export-onnx.sh writes; exported
/// here the same way when absent: the reference's f32 weights, then export-onnx.py).
pub(crate) fn smollm2_genai(gguf: &Path) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(".cache/onnx/smollm2-135m-genai");
    exported_once(&dir, || {
        let model = kvprobe_reference::Model::load(gguf).expect("SmolLM2");
        let hf = tempfile::tempdir().unwrap();
        kvprobe_npu::onnx::export::write_hf_folder(&model, hf.path()).expect("weights");
        export_onnx(hf.path(), &dir, &["--max-length", "2048"]);
    });
    dir
}

/// A copy of the exported folder with genai_config.json edited by `edit` (or removed).
fn variant(src: &Path, name: &str, edit: impl Fn(&mut serde_json::Value) -> bool) -> PathBuf {
    let dst = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("onnx-variant-{name}"));
    std::fs::create_dir_all(&dst).unwrap();
    for f in ["model.onnx", "model.onnx.data", "tokenizer.json"] {
        std::fs::copy(src.join(f), dst.join(f)).unwrap();
    }
    let cfg = dst.join("genai_config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("genai_config.json")).unwrap())
            .unwrap();
    if edit(&mut v) {
        std::fs::write(&cfg, v.to_string()).unwrap();
    } else {
        let _ = std::fs::remove_file(&cfg);
    }
    dst
}

fn args(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn run_env(args: &[&str], env: (&str, &str)) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kvprobe"))
        .args(args)
        .env(env.0, env.1)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run kvprobe")
}

fn one_line(out: &std::process::Output, code: i32, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains(needle), "`{needle}` not in {err}");
}

#[test]
fn fixture_diagnoses_healthy_on_the_real_runtime() {
    let (hf, dir) = genai_fixture(5);
    let (hf, dir) = (hf.to_str().unwrap(), dir.to_str().unwrap());
    for ids in [
        IDS_REMAINDER,
        "1,2,3",
        "7,99,150,200,12,7,8,40,41,42,43,44,45,46,47,48,49,50",
    ] {
        let (code, v, err) = kvprobe_json(&[
            "diagnose", "--onnx", dir, "--model", hf, "--ids", ids, "--steps", "8",
        ]);
        assert_eq!(
            (code, verdict(&v).as_str()),
            (0, "healthy"),
            "{ids}: {err} {v}"
        );
    }
    let (code, v, err) = kvprobe_json(&[
        "greedy", "--onnx", dir, "--model", hf, "--ids", "1,2,3", "--steps", "6",
    ]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(v["provenance"]["backend"], "onnx-genai", "{v}");
    // the bug write-up's runtime line: the loaded library's build, its file and the provider
    let versions = &v["provenance"]["versions"];
    assert!(
        versions["onnxruntime"]
            .as_str()
            .is_some_and(|s| s.contains("commit")),
        "{versions}"
    );
    assert!(
        versions["onnxruntime library"]
            .as_str()
            .is_some_and(|s| s.starts_with('/') && s.contains("libonnxruntime")),
        "{versions}"
    );
    assert_eq!(versions["execution provider"], "cpu", "{versions}");
}

#[test]
fn bad_folders_and_libraries_are_one_line() {
    let (hf, dir) = genai_fixture(5);
    let hf = hf.to_str().unwrap();
    let base = |d: &Path| {
        vec![
            "greedy".to_string(),
            "--onnx".into(),
            d.to_str().unwrap().to_string(),
            "--model".into(),
            hf.to_string(),
            "--ids".into(),
            "1,2,3".into(),
        ]
    };
    // no genai_config.json
    let d = variant(&dir, "noconfig", |_| false);
    one_line_exit_2(&args(&base(&d)), "genai_config.json: cannot read it");
    // a name the graph does not have
    let d = variant(&dir, "names", |v| {
        v["model"]["decoder"]["inputs"]["input_ids"] = "tokens".into();
        true
    });
    one_line_exit_2(&args(&base(&d)), "names input `tokens`, which");
    // KV heads the graph's past inputs disagree with
    let d = variant(&dir, "kvheads", |v| {
        v["model"]["decoder"]["num_key_value_heads"] = 4.into();
        true
    });
    one_line_exit_2(&args(&base(&d)), "num_key_value_heads 4 and head_size 16");
    // a config that lies about a size is refused before anything is sized from it
    let d = variant(&dir, "layers", |v| {
        v["model"]["decoder"]["num_hidden_layers"] = 1_000_000_000.into();
        true
    });
    one_line_exit_2(&args(&base(&d)), "is 1000000000, more than the 65536");
    // a folder that is not an export of --model (the graph agrees with the config)
    let d = variant(&dir, "heads", |v| {
        v["model"]["decoder"]["num_attention_heads"] = 8.into();
        true
    });
    one_line_exit_2(
        &args(&base(&d)),
        "num_attention_heads 8 but the reference model",
    );
    // no library / not a library
    let a = base(&dir);
    let out = run_env(
        &args(&a),
        ("ORT_DYLIB_PATH", "/nonexistent/libonnxruntime.so"),
    );
    one_line(
        &out,
        3,
        "libonnxruntime not found; run scripts/fetch-onnxruntime.sh",
    );
    let not_lib = Path::new(hf).join("config.json");
    let out = run_env(&args(&a), ("ORT_DYLIB_PATH", not_lib.to_str().unwrap()));
    one_line(&out, 3, "cannot load ONNX Runtime");
    // --ep qnn without the onnxruntime-qnn plugin's libraries (an empty KVPROBE_QNN_DIR)
    let empty = tempfile::tempdir().unwrap();
    let mut a = base(&dir);
    a.extend(["--ep".into(), "qnn".into()]);
    let out = run_env(
        &args(&a),
        ("KVPROBE_QNN_DIR", empty.path().to_str().unwrap()),
    );
    one_line(&out, 3, "the QNN execution provider plugin not found");
    // an execution provider the CPU-only library lacks
    let mut a = base(&dir);
    a.extend(["--ep".into(), "openvino".into()]);
    let out = kvprobe(&args(&a));
    one_line(&out, 3, "without the OpenVINO execution provider");
    let mut a = base(&dir);
    a.extend(["--fault".into(), "kv-swap".into()]);
    one_line_exit_2(&args(&a), "belongs to --sim");
}

#[test]
fn smollm2_diagnoses_healthy_on_three_prompts() {
    let Some(gguf) = smollm2() else { return };
    let dir = smollm2_genai(&gguf);
    let (m, d) = (gguf.to_str().unwrap(), dir.to_str().unwrap());
    for prompt in [
        "Once upon a time there was a little girl who lived in a small house near the woods.",
        "The capital of France is Paris. The capital of Italy is",
        "def fibonacci(n):\n    if n < 2:\n        return n\n",
    ] {
        let (code, v, err) = kvprobe_json(&[
            "diagnose", "--onnx", d, "--model", m, "--prompt", prompt, "--steps", "16",
        ]);
        assert_eq!(
            (code, verdict(&v).as_str()),
            (0, "healthy"),
            "{prompt}: {err} {v}"
        );
    }
}

/// A folder whose genai_config.json declares another execution provider than the run uses is
/// never a silent CPU run (issue 38: a QNN folder ran on the CPU without a word): refused
/// without `--ep`, and with `--ep cpu` every output says the provider was substituted.
#[test]
fn a_declared_provider_is_never_a_silent_cpu_run() {
    let (hf, dir) = genai_fixture(5);
    let d = variant(&dir, "qnn-declared", |v| {
        v["model"]["decoder"]["session_options"]["provider_options"] =
            serde_json::json!([{"qnn": {"backend_path": "libQnnHtp.so"}}]);
        true
    });
    let base = |extra: &[&str]| {
        let mut a = vec!["diagnose", "--onnx", d.to_str().unwrap()];
        a.extend([
            "--model",
            hf.to_str().unwrap(),
            "--ids",
            "1,2,3",
            "--steps",
            "4",
        ]);
        a.extend(extra);
        kvprobe(&a)
    };
    one_line(&base(&[]), 2, "declares the qnn execution provider");
    one_line(&base(&[]), 2, "pass --ep qnn to run it there, or --ep cpu");
    let tmp = tempfile::tempdir().unwrap();
    let o = tmp.path().join("run");
    let out = base(&["--ep", "cpu", "--json", "--out", o.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let w = v["warnings"][0].as_str().unwrap_or("");
    assert!(
        w.starts_with("substitute execution provider: ") && w.contains("ONNX Runtime's CPU EP"),
        "{v}"
    );
    for f in ["results.json", "report.html"] {
        let saved = std::fs::read_to_string(o.join(f)).unwrap();
        assert!(saved.contains("substitute execution provider: "), "{f}");
    }
    let text = base(&["--ep", "cpu"]);
    assert!(
        String::from_utf8_lossy(&text.stdout).contains("warning: substitute execution provider")
    );
}

/// GroupQueryAttention (the model builder's exports) reads the mask as a length, so a self-only
/// or single-key mask cannot be expressed: the probes that need one are `not_applicable` with
/// that reason, never a pass for the wrong reason (issue 35: selfmask passed on builder exports,
/// the op having written the token at position 0 and read it alone). Our exporter's graph, which
/// applies the mask per key column, is the control: selfmask still runs there.
#[test]
fn a_length_only_mask_makes_the_self_only_probes_not_applicable() {
    let (hf, dir) = tiny_builder_export("fp32");
    let (hf, dir) = (hf.to_str().unwrap(), dir.to_str().unwrap());
    let ids = "1,5,9,22,7,3";
    let (code, v, err) = kvprobe_json(&[
        "diagnose", "--onnx", dir, "--model", hf, "--ids", ids, "--steps", "6",
    ]);
    assert_eq!(code, 0, "{err} {v}");
    let na = v["probes"]["not_applicable"].as_array().expect("a list");
    let why = na
        .iter()
        .find(|n| n["probe"] == "selfmask")
        .and_then(|n| n["why"].as_str())
        .unwrap_or_else(|| panic!("selfmask not listed as not applicable: {na:?}"));
    assert!(
        why.contains("GroupQueryAttention") && why.contains("length"),
        "{why}"
    );
    assert!(
        v["probes"]["selfmask"].is_null(),
        "{}",
        v["probes"]["selfmask"]
    );
    let out = kvprobe(&["selfmask", "--onnx", dir, "--model", hf, "--ids", ids]);
    one_line(&out, 2, "`selfmask` is not applicable");
    one_line(&out, 2, "GroupQueryAttention");
    let (own_hf, own) = genai_fixture(5);
    let out = kvprobe(&[
        "selfmask",
        "--onnx",
        own.to_str().unwrap(),
        "--model",
        own_hf.to_str().unwrap(),
        "--ids",
        ids,
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A host fault on top of the model builder's exports (issue 35): the clean fp32 and int4 exports
/// are healthy against the precision-matched reference, and the runner binding layers 0 and 1 to
/// each other's pasts (`dec-layer-swap`) is named kv-binding by the stateful rules' binding
/// hypothesis (its replay beats the right K/V), with kvdiff's first divergent layer where the
/// cache first goes wrong: layer 0. A win-* fault there is one line.
#[test]
fn a_host_fault_on_the_builders_exports_is_named_kv_binding() {
    for precision in ["fp32", "int4"] {
        let (hf, dir) = tiny_builder_export(precision);
        let (hf, dir) = (hf.to_str().unwrap(), dir.to_str().unwrap());
        let run = |extra: &[&str]| {
            let mut a = vec![
                "diagnose",
                "--onnx",
                dir,
                "--model",
                hf,
                "--ids",
                "1,5,9,22,7,3",
                "--steps",
                "6",
            ];
            a.extend_from_slice(extra);
            kvprobe_json(&a)
        };
        let (code, v, err) = run(&[]);
        assert_eq!((code, verdict(&v).as_str()), (0, "healthy"), "{err} {v}");
        let (code, v, err) = run(&["--fault", "dec-layer-swap"]);
        assert_eq!(
            (code, verdict(&v).as_str()),
            (1, "kv-binding"),
            "{precision}: {err} {v}"
        );
        let binding = evidence(&v)
            .into_iter()
            .find(|e| e.starts_with("K/V binding:"))
            .unwrap_or_else(|| panic!("no binding line: {v}"));
        assert!(
            [
                "layer 0's K holds layer 1's K",
                "layer 1's V holds layer 0's V"
            ]
            .iter()
            .all(|h| binding.contains(h)),
            "{binding}"
        );
        let first = &v["probes"]["kvdiff"]["first_divergent"];
        assert_eq!(first["layer"].as_u64(), Some(0), "{precision}: {v}");
    }
    let (hf, dir) = tiny_builder_export("int4");
    let out = kvprobe(&[
        "diagnose",
        "--onnx",
        dir.to_str().unwrap(),
        "--model",
        hf.to_str().unwrap(),
        "--fault",
        "win-write-left",
    ]);
    one_line(
        &out,
        2,
        "the win-* faults of this family act on the windowed cache",
    );
}

/// The builder's fp16 CPU export fails its first token run inside ONNX Runtime (a Cast whose
/// declared shape disagrees with what it computes; GenAI fails the same run): `diagnose` is
/// `incomplete`, exit 3, and still reports the stage that ran before, the prefill judged with
/// its cosines, and the step that failed — in stdout, results.json (no verdict, `incomplete`),
/// report.html and summary.md, each marked partial (issue 35).
#[test]
fn a_device_failure_keeps_the_stages_before_it_marked_partial() {
    let (hf, dir) = tiny_builder_export("fp16");
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let (hf, dir, o) = (
        hf.to_str().unwrap(),
        dir.to_str().unwrap(),
        out.to_str().unwrap(),
    );
    let ids = ["--ids", "1,5,9,22,7,3", "--steps", "6"];
    let mut a = vec!["diagnose", "--onnx", dir, "--model", hf, "--out", o];
    a.extend_from_slice(&ids);
    let (code, v, err) = kvprobe_json(&a);
    assert_eq!(code, 3, "{err} {v}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(v["verdict"].is_null(), "{v}");
    let why = v["incomplete"].as_str().unwrap_or_default();
    assert!(why.contains("the decode step at position 6"), "{v}");
    let prefill = &v["probes"]["prefill"];
    assert!(
        prefill["mean_cosine"].as_f64().unwrap_or(0.0) > 0.999,
        "{v}"
    );
    let ev = evidence(&v);
    assert!(
        ev.iter().any(
            |e| e.starts_with("prefill (the stage before the failing step")
                && e.contains("passes the prefill control")
        ),
        "{ev:#?}"
    );
    let saved: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("results.json")).unwrap()).unwrap();
    assert_eq!(saved["incomplete"], v["incomplete"]);
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("Verdict: incomplete"), "report.html");
    let md = kvprobe(&["report", o, "--markdown"]);
    assert_eq!(md.status.code(), Some(0));
    let md = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(
        md.starts_with("## kvprobe: `incomplete` (partial results"),
        "{md}"
    );
    // the text summary on stdout without --json
    let mut a = vec!["diagnose", "--onnx", dir, "--model", hf];
    a.extend_from_slice(&ids);
    let text = kvprobe(&a);
    assert_eq!(text.status.code(), Some(3));
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.starts_with("verdict: incomplete (partial results"),
        "{text}"
    );
    assert!(text.contains("mean cosine"), "{text}");
}

/// The reference fixture the tiny builder exports were made from, and the builder's folder of
/// `precision` (CI writes them: scripts/export-builder.sh tiny fp32 fp16 int4).
pub(crate) fn tiny_builder_export(precision: &str) -> (PathBuf, PathBuf) {
    let dir =
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!(".cache/builder/tiny-{precision}"));
    assert!(
        dir.join("genai_config.json").is_file(),
        "{}: run scripts/export-builder.sh tiny {precision} first",
        dir.display()
    );
    (fixture("llama", 13), dir)
}
