//! "Refuse what you do not compute" (issue 21): every config.json field and GGUF key or tensor in
//! the support tables that changes the math is refused at a non-neutral value with one line that
//! names the file and the key; the tests walk the tables themselves, so a row added there is
//! tested here.

mod gguf_support;

use std::path::Path;

use gguf_support::{base_meta, base_tensors, encode, vocab, Meta, RawTensor};
use kvprobe_reference::fixtures::{write_tiny_gpt2, write_tiny_llama};
use kvprobe_reference::support::{GgufKey, Neutral, GGUF_KEYS, HF_GPT2_REFUSED, HF_REFUSED};
use kvprobe_reference::{gguf, Error, Model};
use serde_json::{json, Value};

fn set_config(dir: &Path, key: &str, value: Value) {
    let p = dir.join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    v[key] = value;
    std::fs::write(&p, serde_json::to_string(&v).unwrap()).unwrap();
}

/// The load fails with Unsupported, on one line naming the file and every needle.
fn refused(dir: &Path, file: &str, needles: &[&str]) -> String {
    let e = match Model::load(dir) {
        Ok(_) => panic!("{needles:?}: loaded, expected a refusal"),
        Err(e) => e,
    };
    let msg = e.to_string();
    assert!(matches!(e, Error::Unsupported { .. }), "{msg}");
    assert!(!msg.contains('\n'), "multi-line: {msg}");
    assert!(msg.contains(file), "does not name {file}: {msg}");
    for n in needles {
        assert!(msg.contains(n), "does not name `{n}`: {msg}");
    }
    msg
}

/// A value the rule does not accept.
fn non_neutral(n: Neutral) -> Value {
    match n {
        Neutral::False => json!(true),
        Neutral::True => json!(false),
        Neutral::One => json!(0.5),
        Neutral::Null => json!(30.0),
        Neutral::Zero => json!(8),
    }
}

/// A value the rule accepts (other than absence).
fn neutral(n: Neutral) -> Value {
    match n {
        Neutral::False => json!(false),
        Neutral::True => json!(true),
        Neutral::One => json!(1.0),
        Neutral::Null => Value::Null,
        Neutral::Zero => json!(0),
    }
}

#[test]
fn every_refused_hf_field_is_refused_and_its_neutral_value_loads() {
    let cases = [
        ("llama", HF_REFUSED),
        ("gpt2", HF_GPT2_REFUSED),
        ("gpt2", HF_REFUSED),
    ];
    for (family, table) in cases {
        for (key, rule, _) in table {
            let dir = tempfile::tempdir().unwrap();
            match family {
                "llama" => write_tiny_llama(dir.path(), 1).unwrap(),
                _ => write_tiny_gpt2(dir.path(), 1).unwrap(),
            }
            set_config(dir.path(), key, neutral(*rule));
            Model::load(dir.path()).unwrap_or_else(|e| panic!("{family} {key} neutral: {e}"));
            set_config(dir.path(), key, non_neutral(*rule));
            refused(dir.path(), "config.json", &[key]);
        }
    }
}

#[test]
fn rope_scaling_types_other_than_llama3_are_refused() {
    for kind in ["linear", "dynamic", "yarn", "longrope", "su", "mrope"] {
        let dir = tempfile::tempdir().unwrap();
        write_tiny_llama(dir.path(), 2).unwrap();
        set_config(
            dir.path(),
            "rope_scaling",
            json!({"rope_type": kind, "factor": 4.0}),
        );
        refused(dir.path(), "config.json", &[kind, "llama3"]);
    }
    // the legacy spelling `type` and transformers' newer `rope_parameters`
    for (key, v) in [
        ("rope_scaling", json!({"type": "yarn", "factor": 4.0})),
        (
            "rope_parameters",
            json!({"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}),
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        write_tiny_llama(dir.path(), 2).unwrap();
        set_config(dir.path(), key, v);
        refused(dir.path(), "config.json", &["rope_scaling", "llama3"]);
    }
    // a default-type block that carries anything else (e.g. Qwen2-VL's mrope_section)
    let dir = tempfile::tempdir().unwrap();
    write_tiny_llama(dir.path(), 2).unwrap();
    set_config(
        dir.path(),
        "rope_scaling",
        json!({"rope_type": "default", "mrope_section": [16, 24, 24]}),
    );
    refused(dir.path(), "config.json", &["rope_scaling.mrope_section"]);
}

#[test]
fn unsupported_hf_architecture_names_it_and_the_supported_ones() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_llama(dir.path(), 3).unwrap();
    set_config(dir.path(), "architectures", json!(["Gemma2ForCausalLM"]));
    refused(
        dir.path(),
        "config.json",
        &["Gemma2ForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"],
    );
}

#[test]
fn a_checkpoint_tensor_the_forward_does_not_use_is_refused() {
    // QK-norm weights in a plain Llama checkpoint: computing without them would be wrong
    let dir = tempfile::tempdir().unwrap();
    write_tiny_llama(dir.path(), 4).unwrap();
    let st = dir.path().join("model.safetensors");
    let mut w = candle_core::safetensors::load(&st, &candle_core::Device::Cpu).unwrap();
    let extra = "model.layers.0.self_attn.q_norm.weight";
    w.insert(
        extra.into(),
        candle_core::Tensor::ones(16, candle_core::DType::F32, &candle_core::Device::Cpu).unwrap(),
    );
    candle_core::safetensors::save(&w, &st).unwrap();
    refused(dir.path(), "", &[extra, "Qwen3"]);
}

// ---- GGUF --------------------------------------------------------------------------------

fn gguf_refused(meta: &[(&str, Meta)], tensors: &[RawTensor], needles: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.gguf");
    std::fs::write(&p, encode(meta, tensors)).unwrap();
    let e = match gguf::load(&p) {
        Ok(_) => panic!("{needles:?}: loaded, expected a refusal"),
        Err(e) => e,
    };
    let msg = e.to_string();
    assert!(matches!(e, Error::Unsupported { .. }), "{msg}");
    assert!(!msg.contains('\n') && msg.contains("m.gguf"), "{msg}");
    for n in needles {
        assert!(msg.contains(n), "does not name `{n}`: {msg}");
    }
    msg
}

fn gguf_loads(meta: &[(&str, Meta)], tensors: &[RawTensor]) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.gguf");
    std::fs::write(&p, encode(meta, tensors)).unwrap();
    gguf::load(&p).unwrap_or_else(|e| panic!("{e}"));
}

fn n_vocab() -> usize {
    vocab().0.len()
}

fn with(extra: Vec<(&'static str, Meta)>) -> Vec<(&'static str, Meta)> {
    let mut m = base_meta("llama", n_vocab());
    m.extend(extra);
    m
}

#[test]
fn every_neutral_only_gguf_key_is_refused_off_its_neutral_value() {
    let t = base_tensors(n_vocab(), false);
    for (short, rule) in GGUF_KEYS {
        let key: &'static str = Box::leak(format!("llama.{short}").into_boxed_str());
        match rule {
            GgufKey::Used => {}
            GgufKey::NeutralNumber(n) => {
                gguf_loads(&with(vec![(key, Meta::F32(*n as f32))]), &t);
                gguf_refused(&with(vec![(key, Meta::F32(4.0))]), &t, &[key]);
            }
            GgufKey::NeutralString(s) => {
                gguf_loads(&with(vec![(key, Meta::Str(s.to_string()))]), &t);
                for v in ["linear", "yarn", "longrope"] {
                    gguf_refused(&with(vec![(key, Meta::Str(v.into()))]), &t, &[key, v]);
                }
            }
        }
    }
}

#[test]
fn unknown_arch_keys_are_refused_naming_the_key() {
    let t = base_tensors(n_vocab(), false);
    for key in [
        "llama.attn_logit_softcapping",
        "llama.final_logit_softcapping",
        "llama.attention.sliding_window",
        "llama.attention.scale",
        "llama.rope.scaling.yarn_log_multiplier",
        "llama.attention.layer_norm_epsilon",
        "llama.use_parallel_residual",
    ] {
        gguf_refused(&with(vec![(key, Meta::F32(1.0))]), &t, &[key]);
    }
    // keys of another architecture's namespace and general.* are not ours to judge
    gguf_loads(&with(vec![("general.name", Meta::Str("x".into()))]), &t);
}

#[test]
fn partial_rotary_and_unequal_value_heads_are_refused() {
    let t = base_tensors(n_vocab(), false);
    let key = "llama.rope.dimension_count";
    gguf_refused(&with(vec![(key, Meta::U32(8))]), &t, &[key, "partial"]);
    let key = "llama.attention.value_length";
    gguf_refused(&with(vec![(key, Meta::U32(8))]), &t, &[key]);
}

#[test]
fn unknown_tensors_are_refused_naming_them() {
    let n = n_vocab();
    for name in [
        "blk.0.attn_rot_embd.weight",
        "token_embd_norm.weight",
        "blk.0.ffn_gate_inp.weight",
    ] {
        let mut t = base_tensors(n, false);
        t.push(RawTensor::f32(name, &[4], &[1.0; 4]));
        gguf_refused(&base_meta("llama", n), &t, &[name]);
    }
    // QK-norm tensors in a llama file map to names the llama forward never asks for
    let mut t = base_tensors(n, false);
    t.push(RawTensor::f32(
        "blk.0.attn_q_norm.weight",
        &[16],
        &[1.0; 16],
    ));
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.gguf");
    std::fs::write(&p, encode(&base_meta("llama", n), &t)).unwrap();
    let e = Model::load(&p).unwrap_err();
    assert!(e.to_string().contains("q_norm"), "{e}");
    // rope_freqs outside llama: llama.cpp's qwen2 graph ignores it, so we refuse it
    let q = base_meta("qwen2", n);
    let mut t = base_tensors(n, false);
    t.push(RawTensor::f32("rope_freqs.weight", &[8], &[1.0; 8]));
    gguf_refused(&q, &t, &["rope_freqs.weight"]);
}

#[test]
fn unsupported_gguf_architecture_names_the_supported_ones() {
    let n = n_vocab();
    let msg = gguf_refused(
        &base_meta("gemma2", n),
        &base_tensors(n, false),
        &["gemma2"],
    );
    for a in ["llama", "qwen2", "qwen3"] {
        assert!(msg.contains(a), "{msg}");
    }
}
