//! Corpus cases of issue 38 on the real ONNX Runtime: a graph that fails at one step (a run
//! error, inf or NaN in the logits or in a K/V output it writes) is the device's failure,
//! named with its step: a finding (exit 1) or `incomplete` (exit 3), never exit 2 "fix the
//! probe" or a silent `unknown`.

use super::Corpus;

#[cfg(not(feature = "onnx"))]
pub fn device_outputs(_c: &mut Corpus) {}

#[cfg(feature = "onnx")]
pub fn device_outputs(c: &mut Corpus) {
    use super::{s, strings};
    use std::path::{Path, PathBuf};

    let (root, model) = (c.root().to_path_buf(), c.model().to_path_buf());
    let clean = root.join("onnx-clean");
    crate::common::export_onnx(&model, &clean, &[]);
    // tests/fixtures/onnx-poison.py: ONNX Runtime computes the value itself, at the run whose
    // attention mask is 12 long — greedy step 4 of the 8-token prompt, the query at position 11
    let poison = |name: &str, output: &str, value: &str| -> PathBuf {
        let out = root.join(format!("onnx-{name}"));
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/onnx-poison.py");
        let o = std::process::Command::new("python3")
            .arg(script)
            .args([&clean, &out])
            .args(["--output", output, "--at-length", "12", "--value", value])
            .output()
            .expect("python3");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        out
    };
    let run = |cmd: &str, dir: &Path, out: &str| {
        strings(&[
            cmd,
            "--onnx",
            &s(dir),
            "--model",
            &s(&model),
            "--ids",
            "1,2,3,4,5,6,7,8",
            "--steps",
            "8",
            "--out",
            out,
        ])
    };
    let a = run("diagnose", &clean, "out-onnx-clean");
    c.add("onnx graph unchanged (control)", 0, None, &a);
    c.expect_stdout("verdict: healthy");
    // it was `unknown (0.30)`: the NaN step read as one more miss
    for value in ["nan", "inf"] {
        let dir = poison(&format!("logits-{value}"), "logits", value);
        let a = run("diagnose", &dir, &format!("out-onnx-logits-{value}"));
        c.add(
            &format!("onnx logits {value} at greedy step 4"),
            1,
            None,
            &a,
        );
        c.expect_stdout("logits at greedy step 4 (every earlier step finite) hold inf/NaN");
    }
    // a K/V output the graph writes non-finite: kvdiff names the entry (it was exit 2 "a probe
    // produced a NaN … fix the probe" when results.json was written)
    let dir = poison("v-nan", "present.1.value", "nan");
    let a = run("kvdiff", &dir, "out-onnx-v-nan");
    c.add("onnx V cache NaN at step 4: kvdiff", 0, None, &a);
    c.expect_stdout(
        "layer 1 (KV head 0, V) after greedy step 4 at position 11: relative L2 non-finite",
    );
    let a = run("diagnose", &dir, "out-onnx-v-nan-diagnose");
    c.add("onnx V cache NaN at step 4: diagnose", 1, None, &a);
    c.expect_stdout("logits at greedy step 4 (every earlier step finite) hold inf/NaN");
    // a folder GenAI runs on another provider is never run on the CPU without a word: refused
    // without --ep (it ran silently), said in every output with it
    for (ep, needle) in [
        ("qnn", "pass --ep qnn to run it there"),
        ("cuda", "kvprobe has no --ep for cuda"),
    ] {
        let dir = root.join(format!("onnx-declares-{ep}"));
        copy_with_provider(&clean, &dir, ep);
        let mut a = run("diagnose", &dir, &format!("out-onnx-declares-{ep}"));
        c.add(
            &format!("onnx folder declaring {ep}, no --ep"),
            2,
            Some(needle),
            &a,
        );
        a.extend(strings(&["--ep", "cpu"]));
        c.add(
            &format!("onnx folder declaring {ep}, --ep cpu"),
            0,
            None,
            &a,
        );
        c.expect_stdout("warning: substitute execution provider");
    }
    // a run ONNX Runtime refuses mid-generation: incomplete, the step named, one line (the
    // runtime's own log line made it two)
    let dir = poison("run-error", "logits", "error");
    for cmd in ["greedy", "diagnose"] {
        let a = run(cmd, &dir, &format!("out-onnx-run-error-{cmd}"));
        c.add(
            &format!("onnx run error at greedy step 4: {cmd}"),
            3,
            Some("the decode step at position 11"),
            &a,
        );
        if cmd == "diagnose" {
            // the stages before the failure, marked partial (issue 35)
            c.expect_stdout("verdict: incomplete (partial results");
        }
    }
}

/// A copy of the GenAI folder `src` whose genai_config.json declares the `ep` provider, as the
/// builder writes it for `-e ep`.
#[cfg(feature = "onnx")]
fn copy_with_provider(src: &std::path::Path, dst: &std::path::Path, ep: &str) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap().flatten() {
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
    let p = dst.join("genai_config.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    v["model"]["decoder"]["session_options"]["provider_options"] = serde_json::json!([{ ep: {} }]);
    std::fs::write(p, v.to_string()).unwrap();
}
