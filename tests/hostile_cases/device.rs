//! Corpus cases of issue 38: what a device did is a finding or `incomplete` (exit 3), never an
//! exit-2 message about the user's flags; and what the user gave is refused before any work.

use std::path::{Path, PathBuf};

use serde_json::json;

use super::{s, strings, Corpus};

/// `diagnose --device ane-sim` on the fixture with `rest`.
fn ane(c: &Corpus, rest: &[&str]) -> Vec<String> {
    let mut a = strings(&["diagnose", "--device", "ane-sim", "--model", &s(c.model())]);
    a.extend(strings(rest));
    a
}

pub fn device_failures(c: &mut Corpus) {
    // a stale state runs the next request out of context: the device's bug, found as such at
    // every context length where it happens (it was exit 2 "use a larger --max-ctx")
    for ctx in ["24", "32", "40"] {
        let a = ane(
            c,
            &[
                "--max-ctx",
                ctx,
                "--max-query",
                "8",
                "--steps",
                "4",
                "--ids",
                "5,17,99,3,250,41,7,8,120,64,33,2,90",
                "--fault",
                "ane-stale-state",
            ],
        );
        c.add(&format!("ane stale state at max-ctx {ctx}"), 1, None, &a);
        c.expect_stdout("verdict: stale-cache");
    }
}

/// A control GGUF (loads) and copies with one metadata value or one tensor value replaced.
fn gguf(c: &Corpus, name: &str, key: Option<(&str, f32)>, tensor: Option<(&str, f32)>) -> PathBuf {
    use crate::hostile_corpus::gguf_support::{base_meta, base_tensors, encode, vocab, Meta};
    let n = vocab().0.len();
    let mut meta = base_meta("llama", n);
    if let Some((k, v)) = key {
        let m = meta.iter_mut().find(|(n, _)| *n == k).expect("a base key");
        m.1 = Meta::F32(v);
    }
    let mut tensors = base_tensors(n, true);
    if let Some((t, v)) = tensor {
        let t = tensors
            .iter_mut()
            .find(|x| x.name == t)
            .expect("a base tensor");
        t.data[4..8].copy_from_slice(&v.to_le_bytes());
    }
    c.file(&format!("{name}.gguf"), &encode(&meta, &tensors))
}

/// The fixture's `model.safetensors` with value 1 of `tensor` set to `v`.
fn poke_safetensors(dir: &Path, tensor: &str, v: f32) {
    let p = dir.join("model.safetensors");
    let mut b = std::fs::read(&p).unwrap();
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let h: serde_json::Value = serde_json::from_slice(&b[8..8 + n]).unwrap();
    assert_eq!(h[tensor]["dtype"], "F32", "{tensor}");
    let at = 8 + n + h[tensor]["data_offsets"][0].as_u64().unwrap() as usize + 4;
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
    std::fs::write(p, b).unwrap();
}

/// Non-finite numbers are refused on load, naming the tensor or key (they were accepted: NUL
/// tokens with exit 0, a `prefill-graph` verdict on a healthy emulator).
pub fn non_finite(c: &mut Corpus) {
    let ok = gguf(c, "finite-control", None, None);
    let a = strings(&[
        "ref",
        "generate",
        "--model",
        &s(&ok),
        "--prompt",
        "hi",
        "--max-new",
        "1",
    ]);
    c.add("gguf finite (control)", 0, None, &a);
    for (name, key, v, needle) in [
        (
            "rope-base-nan",
            "llama.rope.freq_base",
            f32::NAN,
            "rope.freq_base",
        ),
        (
            "rope-base-negative",
            "llama.rope.freq_base",
            -10000.0,
            "rope.freq_base",
        ),
        (
            "eps-nan",
            "llama.attention.layer_norm_rms_epsilon",
            f32::NAN,
            "epsilon",
        ),
        (
            "eps-negative",
            "llama.attention.layer_norm_rms_epsilon",
            -1.0,
            "epsilon",
        ),
        (
            "eps-zero",
            "llama.attention.layer_norm_rms_epsilon",
            0.0,
            "epsilon",
        ),
    ] {
        let p = gguf(c, name, Some((key, v)), None);
        c.refused_model(&format!("gguf {name}"), &p, Some(needle));
    }
    // named by the canonical (Hugging Face) name the loader maps GGUF names to
    for (name, tensor, v, needle) in [
        (
            "weight-nan",
            "blk.0.attn_q.weight",
            f32::NAN,
            "layers.0.self_attn.q_proj",
        ),
        (
            "norm-inf",
            "output_norm.weight",
            f32::INFINITY,
            "model.norm.weight",
        ),
    ] {
        let p = gguf(c, name, None, Some((tensor, v)));
        c.refused_model(&format!("gguf {name}"), &p, Some(needle));
    }
    for (name, tensor, v) in [
        (
            "st-weight-nan",
            "model.layers.0.self_attn.q_proj.weight",
            f32::NAN,
        ),
        ("st-norm-inf", "model.norm.weight", f32::INFINITY),
        (
            "st-embed-neg-inf",
            "model.embed_tokens.weight",
            f32::NEG_INFINITY,
        ),
    ] {
        let m = c.model_copy(name, |d| poke_safetensors(d, tensor, v));
        let needle: &'static str = Box::leak(tensor.to_string().into_boxed_str());
        c.refused_model(&format!("safetensors {name}"), &m, Some(needle));
    }
    for (name, v) in [("eps-negative", json!(-1.0)), ("eps-zero", json!(0.0))] {
        let m = c.model_copy(&format!("cfg-{name}"), |d| {
            config_with(d, "rms_norm_eps", v)
        });
        c.refused_model(&format!("hf {name}"), &m, Some("rms_norm_eps"));
    }
    let m = c.model_copy("cfg-theta-negative", |d| {
        config_with(d, "rope_theta", json!(-5.0))
    });
    c.refused_model("hf rope_theta negative", &m, Some("rope_theta"));
    // a fault value whose numbers are not finite in f32
    let a = c.sim_args("fault-huge-scale", &["--fault", "tbt-cache-scale=1e38"]);
    c.add("fault tbt-cache-scale=1e38", 2, Some("tbt-cache-scale"), &a);
}

/// config.json of the copy with `key` set to `value`.
fn config_with(dir: &Path, key: &str, value: serde_json::Value) {
    let p = dir.join("config.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    v[key] = value;
    std::fs::write(p, v.to_string()).unwrap();
}

/// The fixture's tokenizer.json with `edit` applied.
fn tokenizer_with(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("tokenizer.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(p, v.to_string()).unwrap();
}

/// Every size a file implies is bounded before allocation (issue 38: padding to 1e8 aborted at
/// 1.9 GB, 2M merges peaked at 1.6 GB).
pub fn sizes(c: &mut Corpus) {
    let pad = |strategy: serde_json::Value, multiple: serde_json::Value| {
        json!({"direction": "Right", "strategy": strategy, "pad_to_multiple_of": multiple,
               "pad_id": 0, "pad_type_id": 0, "pad_token": "<pad>"})
    };
    for (name, padding) in [
        ("fixed-1e8", pad(json!({"Fixed": 100_000_000}), json!(null))),
        (
            "multiple-1e8",
            pad(json!("BatchLongest"), json!(100_000_000)),
        ),
    ] {
        let m = c.model_copy(&format!("tok-pad-{name}"), |d| {
            tokenizer_with(d, |v| v["padding"] = padding)
        });
        c.refused_model(&format!("tokenizer padding {name}"), &m, Some("padding"));
    }
    let m = c.model_copy("tok-pad-longest", |d| {
        tokenizer_with(d, |v| {
            v["padding"] = pad(json!("BatchLongest"), json!(null));
        })
    });
    let a = strings(&[
        "ref",
        "generate",
        "--model",
        &s(&m),
        "--prompt",
        "hi",
        "--max-new",
        "1",
    ]);
    c.add(
        "tokenizer padding to the longest of one (control)",
        0,
        None,
        &a,
    );
    let m = c.model_copy("tok-merges-1m", |d| {
        tokenizer_with(d, |v| {
            let merges: Vec<serde_json::Value> = (0..1_000_001).map(|_| json!("a b")).collect();
            v["model"]["merges"] = serde_json::Value::Array(merges);
        })
    });
    c.refused_model("tokenizer 1000001 merges", &m, Some("merges"));
}

/// `--cache-len` against the model's own context (65535 on a 512-context model ran forever).
pub fn cache_len(c: &mut Corpus) {
    let mut a = c.sim_args("cache-len-past-context", &[]);
    let i = a
        .iter()
        .position(|x| x == "--cache-len")
        .expect("a default flag");
    a[i + 1] = "300".into(); // the fixture's context is 256
    c.add(
        "cache-len past the model context",
        2,
        Some("context of 256"),
        &a,
    );
}

/// Flags a manifest or the device would not use are refused, never ignored (issue 38).
pub fn unused_flags(c: &mut Corpus) {
    let good = s(&c.root().join("good-manifest.json")); // written by `manifests`
    let a = c.sim_args("ep-without-onnx", &["--ep", "qnn"]);
    c.add("cli ep without onnx", 2, Some("--ep qnn"), &a);
    // `--fault` beside a manifest replaces its faults on both emulators (a reproducer's
    // hypothesis; tests/ane_diagnose.rs runs it), but a fault must be the manifest's device's
    let ane_good = c.file(
        "ane-good-manifest.json",
        c.ane_manifest().to_string().as_bytes(),
    );
    let a = ane(
        c,
        &[
            "--ids",
            "1,5,9",
            "--steps",
            "2",
            "--sim-manifest",
            &s(&ane_good),
            "--fault",
            "kv-swap",
        ],
    );
    c.add("cli ane manifest with a Hailo fault", 2, Some("--sim"), &a);
    let mut a = c.sim_args("manifest-other-cache-len", &["--sim-manifest", &good]);
    let i = a
        .iter()
        .position(|x| x == "--cache-len")
        .expect("a default flag");
    a[i + 1] = "40".into();
    c.add(
        "cli manifest with another --cache-len",
        2,
        Some("cache_len 32"),
        &a,
    );
    let a = ane(c, &["--cache-len", "64", "--ids", "1,5,9", "--steps", "2"]);
    c.add("cli --cache-len on ane-sim", 2, Some("--max-ctx"), &a);
}

/// HEF edges whose scales are NaN, infinite, zero or negative lint as errors (exit 1), and
/// `--emit-sim` writes no manifest from them (it wrote `"scale": null`).
pub fn hef_scales(c: &mut Corpus) {
    use crate::hostile_corpus::hef_encoder;
    for (name, scale) in [
        ("nan", f32::NAN),
        ("inf", f32::INFINITY),
        ("zero", 0.0),
        ("negative", -0.5),
    ] {
        let mut spec = hef_encoder::healthy();
        for g in &mut spec.groups {
            for cache in &mut g.caches {
                cache.quant.scale = scale;
            }
        }
        let p = c.file(&format!("scale-{name}.hef"), &hef_encoder::encode(&spec));
        let a = strings(&["inspect", &s(&p)]);
        c.add(&format!("hef cache scale {name} (lint error)"), 1, None, &a);
        let out = format!("scale-{name}-manifest.json");
        let a = strings(&["inspect", &s(&p), "--emit-sim", &out]);
        c.add(&format!("hef cache scale {name} --emit-sim"), 2, None, &a);
    }
}
