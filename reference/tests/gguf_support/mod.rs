//! A GGUF writer for tests, written from the GGUF specification (independent of candle's writer, so
//! that tests can also write what candle refuses: unknown type ids, truncated files).
#![allow(dead_code)]

use std::path::Path;

pub enum Meta {
    U32(u32),
    I32(i32),
    U64(u64),
    F32(f32),
    Bool(bool),
    Str(String),
    StrArr(Vec<String>),
    I32Arr(Vec<i32>),
}

pub struct RawTensor {
    pub name: String,
    /// ggml order: dims[0] is the contiguous axis.
    pub dims: Vec<u64>,
    pub type_id: u32,
    pub data: Vec<u8>,
}

impl RawTensor {
    /// An F32 tensor given in row-major numpy shape order.
    pub fn f32(name: &str, shape: &[usize], values: &[f32]) -> Self {
        assert_eq!(shape.iter().product::<usize>(), values.len());
        RawTensor {
            name: name.into(),
            dims: shape.iter().rev().map(|&d| d as u64).collect(),
            type_id: 0,
            data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

pub fn encode(meta: &[(&str, Meta)], tensors: &[RawTensor]) -> Vec<u8> {
    const ALIGN: usize = 32;
    let mut out = Vec::new();
    out.extend(b"GGUF");
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend((meta.len() as u64).to_le_bytes());
    for (k, v) in meta {
        put_str(&mut out, k);
        match v {
            Meta::U32(x) => {
                out.extend(4u32.to_le_bytes());
                out.extend(x.to_le_bytes());
            }
            Meta::I32(x) => {
                out.extend(5u32.to_le_bytes());
                out.extend(x.to_le_bytes());
            }
            Meta::F32(x) => {
                out.extend(6u32.to_le_bytes());
                out.extend(x.to_le_bytes());
            }
            Meta::Bool(x) => {
                out.extend(7u32.to_le_bytes());
                out.push(*x as u8);
            }
            Meta::Str(s) => {
                out.extend(8u32.to_le_bytes());
                put_str(&mut out, s);
            }
            Meta::U64(x) => {
                out.extend(10u32.to_le_bytes());
                out.extend(x.to_le_bytes());
            }
            Meta::StrArr(a) => {
                out.extend(9u32.to_le_bytes());
                out.extend(8u32.to_le_bytes());
                out.extend((a.len() as u64).to_le_bytes());
                for s in a {
                    put_str(&mut out, s);
                }
            }
            Meta::I32Arr(a) => {
                out.extend(9u32.to_le_bytes());
                out.extend(5u32.to_le_bytes());
                out.extend((a.len() as u64).to_le_bytes());
                for x in a {
                    out.extend(x.to_le_bytes());
                }
            }
        }
    }
    let mut offset = 0usize;
    let mut offsets = Vec::new();
    for t in tensors {
        put_str(&mut out, &t.name);
        out.extend((t.dims.len() as u32).to_le_bytes());
        for d in &t.dims {
            out.extend(d.to_le_bytes());
        }
        out.extend(t.type_id.to_le_bytes());
        out.extend((offset as u64).to_le_bytes());
        offsets.push(offset);
        offset += t.data.len().div_ceil(ALIGN) * ALIGN;
    }
    while out.len() % ALIGN != 0 {
        out.push(0);
    }
    let base = out.len();
    for (t, off) in tensors.iter().zip(offsets) {
        out.resize(base + off, 0);
        out.extend(&t.data);
    }
    out
}

/// Deterministic pseudo-random values in [-0.5, 0.5) (xorshift; no rand dependency).
pub fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect()
}

/// Shape of the tiny llama model the tests write.
pub const HIDDEN: usize = 32;
pub const HEADS: usize = 2;
pub const KV_HEADS: usize = 1;
pub const HEAD_DIM: usize = 16;
/// 256 = one K-quant super-block per ffn_down row.
pub const FFN: usize = 256;
pub const LAYERS: usize = 1;

/// Byte-level vocabulary: the printable ASCII letters as GPT-2 byte-level symbols, a merge
/// "a b" -> "ab", plus two control tokens.
pub fn vocab() -> (Vec<String>, Vec<i32>, Vec<String>) {
    let mut tokens: Vec<String> = vec!["<|endoftext|>".into(), "<|im_start|>".into()];
    let mut types = vec![3, 3];
    for c in b'a'..=b'z' {
        tokens.push((c as char).to_string());
        types.push(1);
    }
    tokens.push("ab".into());
    types.push(1);
    tokens.push("Ġ".into()); // byte-level space
    types.push(1);
    for d in b'0'..=b'9' {
        tokens.push((d as char).to_string());
        types.push(1);
    }
    (tokens, types, vec!["a b".into()])
}

pub fn base_meta(arch: &str, vocab_len: usize) -> Vec<(&'static str, Meta)> {
    let (tokens, types, merges) = vocab();
    assert_eq!(tokens.len(), vocab_len);
    let mut m = arch_meta(arch);
    m.insert(0, ("general.architecture", Meta::Str(arch.into())));
    m.extend([
        ("tokenizer.ggml.model", Meta::Str("gpt2".into())),
        ("tokenizer.ggml.pre", Meta::Str("smollm".into())),
        ("tokenizer.ggml.tokens", Meta::StrArr(tokens)),
        ("tokenizer.ggml.token_type", Meta::I32Arr(types)),
        ("tokenizer.ggml.merges", Meta::StrArr(merges)),
        ("tokenizer.ggml.bos_token_id", Meta::U32(1)),
        ("tokenizer.ggml.eos_token_id", Meta::I32(0)),
        ("tokenizer.ggml.add_bos_token", Meta::Bool(true)),
    ]);
    m
}

/// The model keys of the tiny model under `<arch>.` (GGUF names them by architecture).
pub fn arch_meta(arch: &str) -> Vec<(&'static str, Meta)> {
    let k = |s: &str| -> &'static str { Box::leak(format!("{arch}.{s}").into_boxed_str()) };
    vec![
        (k("block_count"), Meta::U32(LAYERS as u32)),
        (k("context_length"), Meta::U64(64)),
        (k("embedding_length"), Meta::I32(HIDDEN as i32)),
        (k("feed_forward_length"), Meta::U32(FFN as u32)),
        (k("attention.head_count"), Meta::U32(HEADS as u32)),
        (k("attention.head_count_kv"), Meta::U64(KV_HEADS as u64)),
        (k("rope.freq_base"), Meta::F32(50000.0)),
        (k("attention.layer_norm_rms_epsilon"), Meta::F32(1e-5)),
    ]
}

/// All tensors of the tiny model as F32, in numpy shape order.
pub fn base_tensors(vocab_len: usize, with_output: bool) -> Vec<RawTensor> {
    let q = HEADS * HEAD_DIM;
    let kv = KV_HEADS * HEAD_DIM;
    let mut seed = 1;
    let mut t = |name: &str, shape: &[usize]| {
        seed += 1;
        RawTensor::f32(name, shape, &values(shape.iter().product(), seed))
    };
    let mut v = vec![
        t("token_embd.weight", &[vocab_len, HIDDEN]),
        t("output_norm.weight", &[HIDDEN]),
    ];
    if with_output {
        v.push(t("output.weight", &[vocab_len, HIDDEN]));
    }
    for l in 0..LAYERS {
        v.push(t(&format!("blk.{l}.attn_norm.weight"), &[HIDDEN]));
        v.push(t(&format!("blk.{l}.attn_q.weight"), &[q, HIDDEN]));
        v.push(t(&format!("blk.{l}.attn_k.weight"), &[kv, HIDDEN]));
        v.push(t(&format!("blk.{l}.attn_v.weight"), &[kv, HIDDEN]));
        v.push(t(&format!("blk.{l}.attn_output.weight"), &[HIDDEN, q]));
        v.push(t(&format!("blk.{l}.ffn_norm.weight"), &[HIDDEN]));
        v.push(t(&format!("blk.{l}.ffn_gate.weight"), &[FFN, HIDDEN]));
        v.push(t(&format!("blk.{l}.ffn_up.weight"), &[FFN, HIDDEN]));
        v.push(t(&format!("blk.{l}.ffn_down.weight"), &[HIDDEN, FFN]));
    }
    v
}

pub fn write(path: &Path, meta: &[(&str, Meta)], tensors: &[RawTensor]) {
    std::fs::write(path, encode(meta, tensors)).expect("write test gguf");
}

/// Where scripts/fetch-model.sh puts SmolLM2, if it has been run.
pub fn smollm2() -> Option<std::path::PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../.cache/models/smollm2-135m-instruct-q4_1.gguf");
    if p.exists() {
        Some(p)
    } else {
        eprintln!("SKIP: SmolLM2 not fetched (run scripts/fetch-model.sh)");
        None
    }
}
