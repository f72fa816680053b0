//! GGUF loading: dequantisation per the ggml block layouts, HF naming, q/k un-permutation, metadata,
//! and one-line typed errors for bad files. Expected values are derived by hand from the GGUF spec,
//! never read back from the loader.

mod gguf_support;

use gguf_support::*;
use kvprobe_reference::{gguf, Error};

fn vocab_len() -> usize {
    vocab().0.len()
}

fn load_ok(meta: &[(&str, Meta)], tensors: &[RawTensor]) -> kvprobe_reference::LoadedParts {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.gguf");
    write(&p, meta, tensors);
    match gguf::load(&p) {
        Ok(parts) => parts,
        Err(e) => panic!("load failed: {e}"),
    }
}

fn load_err(bytes: &[u8]) -> Error {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.gguf");
    std::fs::write(&p, bytes).unwrap();
    match gguf::load(&p) {
        Ok(_) => panic!("expected an error"),
        Err(e) => {
            let msg = e.to_string();
            assert!(!msg.contains('\n'), "multi-line error: {msg}");
            assert!(
                msg.contains("bad.gguf"),
                "error does not name the file: {msg}"
            );
            e
        }
    }
}

fn rows(t: &candle_core::Tensor) -> Vec<Vec<f32>> {
    t.to_vec2::<f32>().unwrap()
}

#[test]
fn config_comes_from_metadata_with_any_integer_width() {
    let n = vocab_len();
    let parts = load_ok(&base_meta("llama", n), &base_tensors(n, false));
    let c = &parts.config;
    assert_eq!(c.architecture, "gguf:llama");
    assert_eq!(
        (c.vocab_size, c.hidden_size, c.n_layers),
        (n, HIDDEN, LAYERS)
    );
    assert_eq!(
        (c.n_heads, c.n_kv_heads, c.head_dim),
        (HEADS, KV_HEADS, HEAD_DIM)
    );
    assert_eq!(c.intermediate_size, FFN);
    assert_eq!(c.max_position, 64);
    assert_eq!(c.rope_theta, 50000.0);
    assert!((c.norm_eps - 1e-5).abs() < 1e-9);
    assert!(c.tie_embeddings);
    assert!(!c.qkv_bias);
    assert_eq!(
        (c.bos_token_id, c.eos_token_id, c.add_bos),
        (Some(1), Some(0), true)
    );
    // Tied: no lm_head tensor is invented.
    assert!(!parts.weights.contains_key("lm_head.weight"));
    let expected: Vec<String> = [
        "model.embed_tokens.weight",
        "model.norm.weight",
        "model.layers.0.input_layernorm.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.v_proj.weight",
        "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.post_attention_layernorm.weight",
        "model.layers.0.mlp.gate_proj.weight",
        "model.layers.0.mlp.up_proj.weight",
        "model.layers.0.mlp.down_proj.weight",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut got: Vec<String> = parts.weights.keys().cloned().collect();
    got.sort();
    let mut want = expected.clone();
    want.sort();
    assert_eq!(got, want);
}

#[test]
fn untied_output_becomes_lm_head_and_f32_values_pass_through() {
    let n = vocab_len();
    let tensors = base_tensors(n, true);
    let parts = load_ok(&base_meta("llama", n), &tensors);
    assert!(!parts.config.tie_embeddings);
    let out = tensors.iter().find(|t| t.name == "output.weight").unwrap();
    let want: Vec<f32> = out
        .data
        .chunks(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let got: Vec<f32> = rows(&parts.weights["lm_head.weight"]).concat();
    assert_eq!(got, want);
}

/// llama.cpp's converter: inside each head, HF row `half * hd/2 + i` is stored at file row
/// `2 * i + half`. Rows filled with their own file index show where each landed.
#[test]
fn q_and_k_rows_are_restored_to_hf_order() {
    let n = vocab_len();
    let mut tensors = base_tensors(n, false);
    for t in tensors.iter_mut() {
        let (nrows, name) = if t.name == "blk.0.attn_q.weight" {
            (HEADS * HEAD_DIM, "q")
        } else if t.name == "blk.0.attn_k.weight" {
            (KV_HEADS * HEAD_DIM, "k")
        } else {
            continue;
        };
        let vals: Vec<f32> = (0..nrows)
            .flat_map(|r| std::iter::repeat_n(r as f32, HIDDEN))
            .collect();
        *t = RawTensor::f32(&t.name.clone(), &[nrows, HIDDEN], &vals);
        let _ = name;
    }
    let parts = load_ok(&base_meta("llama", n), &tensors);
    for (hf, heads) in [
        ("model.layers.0.self_attn.q_proj.weight", HEADS),
        ("model.layers.0.self_attn.k_proj.weight", KV_HEADS),
    ] {
        let r = rows(&parts.weights[hf]);
        for h in 0..heads {
            for half in 0..2 {
                for i in 0..HEAD_DIM / 2 {
                    let hf_row = h * HEAD_DIM + half * HEAD_DIM / 2 + i;
                    let file_row = h * HEAD_DIM + 2 * i + half;
                    assert!(
                        r[hf_row].iter().all(|&v| v == file_row as f32),
                        "{hf} row {hf_row}"
                    );
                }
            }
        }
    }
    // v is not permuted by the converter.
    let v = rows(&parts.weights["model.layers.0.self_attn.v_proj.weight"]);
    let raw = tensors
        .iter()
        .find(|t| t.name == "blk.0.attn_v.weight")
        .unwrap();
    let first = f32::from_le_bytes([raw.data[0], raw.data[1], raw.data[2], raw.data[3]]);
    assert_eq!(v[0][0], first);
}

const F16_HALF: u16 = 0x3800; // 0.5
const F16_MINUS_ONE: u16 = 0xBC00; // -1.0
const F16_QUARTER: u16 = 0x3400; // 0.25

/// Q4_1 block (ggml): f16 d, f16 m, 16 bytes; element j < 16 = (byte j & 15) * d + m,
/// element j + 16 = (byte j >> 4) * d + m.
#[test]
fn q4_1_and_q8_0_blocks_dequantise_per_spec() {
    let n = vocab_len();
    let mut tensors = base_tensors(n, true);
    let byte =
        |r: usize, j: usize| -> u8 { (((j + r) % 16) | (((15 + r - j % 16) % 16) << 4)) as u8 };
    let mut q41 = Vec::new();
    for r in 0..n {
        q41.extend(F16_HALF.to_le_bytes());
        q41.extend(F16_MINUS_ONE.to_le_bytes());
        for j in 0..16 {
            q41.push(byte(r, j));
        }
    }
    // Q8_0 block: f16 d, 32 signed bytes; element j = q[j] * d.
    let mut q80 = Vec::new();
    for r in 0..n {
        q80.extend(F16_QUARTER.to_le_bytes());
        for j in 0..32i32 {
            q80.push(((j - 16 + r as i32 % 3) as i8) as u8);
        }
    }
    for t in tensors.iter_mut() {
        if t.name == "token_embd.weight" {
            t.type_id = 3;
            t.data = q41.clone();
        } else if t.name == "output.weight" {
            t.type_id = 8;
            t.data = q80.clone();
        }
    }
    let parts = load_ok(&base_meta("llama", n), &tensors);
    let emb = rows(&parts.weights["model.embed_tokens.weight"]);
    let out = rows(&parts.weights["lm_head.weight"]);
    for r in 0..n {
        for j in 0..16 {
            let b = byte(r, j);
            assert_eq!(emb[r][j], (b & 15) as f32 * 0.5 - 1.0, "row {r} elem {j}");
            assert_eq!(
                emb[r][j + 16],
                (b >> 4) as f32 * 0.5 - 1.0,
                "row {r} elem {}",
                j + 16
            );
        }
        for (j, &v) in out[r].iter().enumerate() {
            assert_eq!(v, (j as i32 - 16 + r as i32 % 3) as f32 * 0.25);
        }
    }
}

#[test]
fn not_gguf_is_a_format_error() {
    let e = load_err(b"{\"this is\": \"json, not gguf\"}");
    assert!(matches!(e, Error::Format { .. }), "{e}");
    assert!(e.to_string().contains("not a GGUF"), "{e}");
    let e = load_err(b"");
    assert!(e.to_string().contains("not a GGUF"), "{e}");
}

#[test]
fn truncated_files_are_reported_as_truncated() {
    let n = vocab_len();
    let bytes = encode(&base_meta("llama", n), &base_tensors(n, false));
    for cut in [bytes.len() - 7, bytes.len() / 2, 64, 9] {
        let e = load_err(&bytes[..cut]);
        assert!(matches!(e, Error::Format { .. }), "cut {cut}: {e}");
        assert!(e.to_string().contains("truncated"), "cut {cut}: {e}");
    }
}

#[test]
fn unsupported_architecture_is_named() {
    let n = vocab_len();
    let e = load_err(&encode(&base_meta("gpt2", n), &base_tensors(n, false)));
    assert!(matches!(e, Error::Unsupported { .. }), "{e}");
    assert!(e.to_string().contains("`gpt2`"), "{e}");
}

#[test]
fn unsupported_quant_types_name_the_tensor_and_type() {
    let n = vocab_len();
    // 20 = IQ4_NL: candle cannot even parse the header; 9 = Q8_1: parsed but not a storage format.
    for (type_id, type_name) in [(20u32, "IQ4_NL"), (9, "Q8_1")] {
        let mut tensors = base_tensors(n, false);
        let t = tensors
            .iter_mut()
            .find(|t| t.name == "blk.0.ffn_up.weight")
            .unwrap();
        t.type_id = type_id;
        if type_id == 9 {
            // Q8_1 stores 36 bytes per 32 values: its data sized so, or the next tensor's
            // offset is what llama.cpp (and the loader) refuses first
            let (row, rows) = (t.dims[0] as usize, t.dims[1] as usize);
            t.data.truncate(row / 32 * 36 * rows);
        }
        let e = load_err(&encode(&base_meta("llama", n), &tensors));
        let msg = e.to_string();
        assert!(matches!(e, Error::Unsupported { .. }), "{msg}");
        assert!(msg.contains("blk.0.ffn_up.weight"), "{msg}");
        assert!(msg.contains(type_name), "{msg}");
    }
}

#[test]
fn missing_tensor_is_named_in_gguf_terms() {
    let n = vocab_len();
    let tensors: Vec<RawTensor> = base_tensors(n, false)
        .into_iter()
        .filter(|t| t.name != "blk.0.ffn_gate.weight")
        .collect();
    let e = load_err(&encode(&base_meta("llama", n), &tensors));
    assert!(matches!(e, Error::MissingTensor { .. }), "{e}");
    assert!(e.to_string().contains("blk.0.ffn_gate.weight"), "{e}");
}

#[test]
fn missing_required_metadata_is_a_format_error() {
    let n = vocab_len();
    let meta: Vec<(&str, Meta)> = base_meta("llama", n)
        .into_iter()
        .filter(|(k, _)| *k != "llama.block_count")
        .collect();
    let e = load_err(&encode(&meta, &base_tensors(n, false)));
    assert!(e.to_string().contains("llama.block_count"), "{e}");
}

#[test]
fn missing_path_is_not_found() {
    let e = gguf::load(std::path::Path::new("/nonexistent/model.gguf"))
        .err()
        .unwrap();
    assert!(matches!(e, Error::NotFound { .. }), "{e}");
}

/// Published facts of SmolLM2-135M-Instruct (its HF config.json): 30 layers, hidden 576, 9 heads,
/// 3 KV heads, FFN 1536, vocab 49152, rope_theta 100000, rms eps 1e-5, tied embeddings, 8192 context.
#[test]
fn smollm2_config_matches_published_values() {
    let Some(p) = smollm2() else { return };
    let parts = gguf::load(&p).unwrap();
    let c = &parts.config;
    assert_eq!(
        (
            c.n_layers,
            c.hidden_size,
            c.n_heads,
            c.n_kv_heads,
            c.head_dim
        ),
        (30, 576, 9, 3, 64)
    );
    assert_eq!(
        (c.intermediate_size, c.vocab_size, c.max_position),
        (1536, 49152, 8192)
    );
    assert_eq!(c.rope_theta, 100000.0);
    assert!((c.norm_eps - 1e-5).abs() < 1e-9);
    assert!(c.tie_embeddings);
    assert_eq!(
        (c.bos_token_id, c.eos_token_id, c.add_bos),
        (Some(1), Some(2), false)
    );
    assert_eq!(parts.weights.len(), 2 + 30 * 9);
}

/// The tiny model's metadata with `key` set to `value` (added when absent).
fn meta_with(key: &'static str, value: Meta) -> Vec<(&'static str, Meta)> {
    let mut meta = base_meta("llama", vocab_len());
    meta.retain(|(k, _)| *k != key);
    meta.push((key, value));
    meta
}

#[test]
fn zero_alignment_is_a_format_error_not_a_panic() {
    // issue 19: candle divides by `general.alignment` and panicked on 0
    let n = vocab_len();
    for value in [Meta::U32(0), Meta::I32(0)] {
        let bytes = encode(
            &meta_with("general.alignment", value),
            &base_tensors(n, false),
        );
        let e = load_err(&bytes);
        assert!(matches!(e, Error::Format { .. }), "{e}");
        assert!(e.to_string().contains("general.alignment"), "{e}");
    }
}

/// What llama.cpp's gguf.cpp refuses is refused, naming the key or tensor (issue 38: candle kept
/// the later duplicate and the output changed).
#[test]
fn files_llama_cpp_refuses_are_refused() {
    let n = vocab_len();
    /// metadata, tensors, what the error must say
    type Case = (Vec<(&'static str, Meta)>, Vec<RawTensor>, &'static str);
    let cases: Vec<Case> = vec![
        (
            meta_with("general.alignment", Meta::U32(3)),
            base_tensors(n, false),
            "is 3 of type 4",
        ),
        (
            meta_with("general.alignment", Meta::I32(32)),
            base_tensors(n, false),
            "must be a uint32",
        ),
        // the writer pads to 32: the second tensor starts off a 1 MiB alignment
        (
            meta_with("general.alignment", Meta::U32(1 << 20)),
            base_tensors(n, false),
            "not a multiple of the alignment 1048576",
        ),
        (
            {
                let mut m = base_meta("llama", n);
                m.push(("llama.block_count", Meta::U32(2)));
                m
            },
            base_tensors(n, false),
            "key `llama.block_count` appears twice",
        ),
        (
            base_meta("llama", n),
            {
                let mut t = base_tensors(n, false);
                let dup = RawTensor {
                    name: t[1].name.clone(),
                    dims: t[1].dims.clone(),
                    type_id: t[1].type_id,
                    data: t[1].data.clone(),
                };
                t.push(dup);
                t
            },
            "appears twice",
        ),
    ];
    for (meta, tensors, needle) in cases {
        let e = load_err(&encode(&meta, &tensors));
        assert!(matches!(e, Error::Format { .. }), "{e}");
        assert!(e.to_string().contains(needle), "`{needle}` not in {e}");
    }
    // the control: the same writer's file at its own alignment loads
    let ok = encode(
        &meta_with("general.alignment", Meta::U32(32)),
        &base_tensors(n, false),
    );
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("ok.gguf");
    std::fs::write(&p, ok).unwrap();
    kvprobe_reference::Model::load(&p).expect("alignment 32 loads");
}

#[test]
fn embedding_without_dimensions_is_a_bad_tensor_not_a_panic() {
    // issue 19: a tensor with no dimensions where a matrix is expected indexed dims()[0]
    let n = vocab_len();
    let mut tensors = base_tensors(n, false);
    tensors[0] = RawTensor {
        name: "token_embd.weight".into(),
        dims: vec![],
        type_id: 0,
        data: 0f32.to_le_bytes().to_vec(),
    };
    let e = load_err(&encode(&base_meta("llama", n), &tensors));
    assert!(matches!(e, Error::BadTensor { .. }), "{e}");
    assert!(e.to_string().contains("token_embd.weight"), "{e}");
}

#[test]
fn millions_of_claimed_layers_fail_at_the_first_missing_one() {
    // issue 19: the expected-tensor list was built for every claimed layer first (13 GB for 1e7)
    let n = vocab_len();
    let bytes = encode(
        &meta_with("llama.block_count", Meta::U32(10_000_000)),
        &base_tensors(n, false),
    );
    let e = load_err(&bytes);
    assert!(matches!(e, Error::MissingTensor { .. }), "{e}");
    assert!(e.to_string().contains("blk.1.attn_q.weight"), "{e}");
}
