//! The corpus itself: what each hostile input looks like and what kvprobe must answer.

use super::{s, strings, Corpus};
use crate::hostile_corpus::hef_encoder;

/// A GGUF v3 header: magic, version, tensor and metadata counts, then raw metadata bytes.
fn gguf_bytes(version: u32, n_tensors: u64, n_kv: u64, kv: &[u8]) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(version.to_le_bytes());
    b.extend(n_tensors.to_le_bytes());
    b.extend(n_kv.to_le_bytes());
    b.extend(kv);
    b
}

/// One metadata pair: key, type code, value bytes.
fn kv(key: &str, ty: u32, value: &[u8]) -> Vec<u8> {
    let mut b = (key.len() as u64).to_le_bytes().to_vec();
    b.extend(key.as_bytes());
    b.extend(ty.to_le_bytes());
    b.extend(value);
    b
}

fn gguf_str(v: &str) -> Vec<u8> {
    let mut b = (v.len() as u64).to_le_bytes().to_vec();
    b.extend(v.as_bytes());
    b
}

const U32: u32 = 4;
const STR: u32 = 8;
const ARR: u32 = 9;

pub fn gguf_files(c: &mut Corpus) {
    let arch = kv("general.architecture", STR, &gguf_str("llama"));
    let mut huge_key = u64::MAX.to_le_bytes().to_vec();
    huge_key.extend(b"abc");
    let mut huge_str = b"general.name".len().to_le_bytes().to_vec();
    huge_str.truncate(8);
    let huge_str = [
        (12u64).to_le_bytes().to_vec(),
        b"general.name".to_vec(),
        STR.to_le_bytes().to_vec(),
        (1u64 << 62).to_le_bytes().to_vec(),
    ]
    .concat();
    let mut huge_arr = STR.to_le_bytes().to_vec();
    huge_arr.extend((1u64 << 61).to_le_bytes());
    let align0 = [
        arch.clone(),
        kv("general.alignment", U32, &0u32.to_le_bytes()),
    ]
    .concat();
    let layers = [
        arch.clone(),
        kv("llama.block_count", U32, &u32::MAX.to_le_bytes()),
    ]
    .concat();
    let mut noise = b"GGUF\x03\0\0\0".to_vec();
    let mut x = 0x9e3779b97f4a7c15u64;
    for _ in 0..4096 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        noise.push(x as u8);
    }
    let files: Vec<(&str, Vec<u8>, &'static str)> = vec![
        ("empty", Vec::new(), "gguf"),
        ("magic-only", b"GGUF".to_vec(), "gguf"),
        (
            "wrong-magic",
            b"GGMLxxxxxxxxxxxxxxxxxxxxxxxx".to_vec(),
            "gguf",
        ),
        ("version-99", gguf_bytes(99, 0, 0, &[]), "gguf"),
        ("tensor-count-max", gguf_bytes(3, u64::MAX, 0, &[]), "gguf"),
        ("kv-count-max", gguf_bytes(3, 0, u64::MAX, &[]), "gguf"),
        ("key-length-max", gguf_bytes(3, 0, 1, &huge_key), "gguf"),
        ("string-length-2e62", gguf_bytes(3, 0, 1, &huge_str), "gguf"),
        (
            "array-2e61",
            gguf_bytes(3, 0, 1, &kv("tokenizer.ggml.tokens", ARR, &huge_arr)),
            "gguf",
        ),
        ("alignment-0", gguf_bytes(3, 0, 2, &align0), "gguf"),
        ("block-count-4e9", gguf_bytes(3, 0, 2, &layers), "gguf"),
        ("no-architecture", gguf_bytes(3, 0, 0, &[]), "gguf"),
        ("noise", noise, "gguf"),
    ];
    for (name, bytes, _) in files {
        let p = c.file(&format!("{name}.gguf"), &bytes);
        c.refused_model(&format!("gguf {name}"), &p, None);
    }
    // tensor dimensions that multiply past 2^64 or hold a zero (found by examples/fuzz: an
    // overflow, and undefined behaviour reading an empty tensor)
    let vocab = crate::hostile_corpus::gguf_support::vocab().0.len();
    for (name, dims) in [
        ("tensor-dims-overflow", vec![1u64 << 33, 1 << 33, 4]),
        ("tensor-dim-zero", vec![0, 32]),
    ] {
        let mut tensors = crate::hostile_corpus::gguf_support::base_tensors(vocab, true);
        tensors[1].dims = dims;
        let bytes = crate::hostile_corpus::gguf_support::encode(
            &crate::hostile_corpus::gguf_support::base_meta("llama", vocab),
            &tensors,
        );
        let p = c.file(&format!("{name}.gguf"), &bytes);
        c.refused_model(&format!("gguf {name}"), &p, None);
    }
    let dir = c.root().join("folder.gguf");
    std::fs::create_dir(&dir).unwrap();
    c.refused_model("gguf a folder named .gguf", &dir, None);
    let p = c.fifo("pipe.gguf");
    c.refused_model("gguf a pipe", &p, None);
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn write(dir: &std::path::Path, name: &str, bytes: &[u8]) {
    std::fs::write(dir.join(name), bytes).unwrap();
}

/// config.json of the fixture with `key` set to `value`.
fn config_with(dir: &std::path::Path, key: &str, value: serde_json::Value) {
    let p = dir.join("config.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    v[key] = value;
    std::fs::write(p, v.to_string()).unwrap();
}

pub fn hf_folders(c: &mut Corpus) {
    let empty = c.root().join("empty-model");
    std::fs::create_dir(&empty).unwrap();
    c.refused_model("hf empty folder", &empty, Some("config.json"));
    let m = c.model_copy("no-config", |d| {
        std::fs::remove_file(d.join("config.json")).unwrap()
    });
    c.refused_model("hf no config.json", &m, Some("config.json"));
    let m = c.model_copy("config-garbage", |d| {
        write(d, "config.json", b"{\"a\": [1, 2")
    });
    c.refused_model("hf config.json not JSON", &m, Some("config.json"));
    let m = c.model_copy("config-array", |d| write(d, "config.json", b"[]"));
    c.refused_model("hf config.json an array", &m, Some("config.json"));
    let m = c.model_copy("config-dir", |d| {
        std::fs::remove_file(d.join("config.json")).unwrap();
        std::fs::create_dir(d.join("config.json")).unwrap();
    });
    c.refused_model("hf config.json a folder", &m, Some("config.json"));
    // a tensor renamed inside the safetensors header (same length, so the file stays valid):
    // the untied lm_head (it used to fall back to the embedding without a word) and a layer's
    // weight (a checkpoint with a missing tensor)
    for (name, tensor, needle) in [
        ("no-lm-head", "lm_head.weight", "lm_head.weight"),
        (
            "missing-up-proj",
            "model.layers.1.mlp.up_proj.weight",
            "up_proj",
        ),
    ] {
        let m = c.model_copy(name, |d| {
            let p = d.join("model.safetensors");
            let mut b = std::fs::read(&p).unwrap();
            let from = format!("\"{tensor}\"");
            let to = format!("\"{}x\"", &tensor[..tensor.len() - 1]);
            let at = b
                .windows(from.len())
                .position(|w| w == from.as_bytes())
                .expect("tensor in the header");
            b[at..at + to.len()].copy_from_slice(to.as_bytes());
            std::fs::write(p, b).unwrap();
        });
        c.refused_model(&format!("hf {name}"), &m, Some(needle));
    }
    for (key, value) in [
        ("num_hidden_layers", serde_json::json!(1_000_000_000u64)),
        ("hidden_size", serde_json::json!(0)),
        ("num_attention_heads", serde_json::json!(0)),
        ("num_key_value_heads", serde_json::json!(3)),
        ("vocab_size", serde_json::json!(1u64 << 62)),
        ("intermediate_size", serde_json::json!(-5)),
        ("max_position_embeddings", serde_json::json!(0)),
        ("head_dim", serde_json::json!(1u64 << 40)),
        ("architectures", serde_json::json!(["BertModel"])),
    ] {
        let m = c.model_copy(&format!("cfg-{key}"), |d| config_with(d, key, value));
        c.refused_model(&format!("hf config {key} hostile"), &m, None);
    }
    // a field of the wrong type used to fall back to its default silently (another model)
    for (i, (key, value)) in [
        ("rope_theta", serde_json::json!("1e4")),
        ("rope_theta", serde_json::json!(0)),
        ("rms_norm_eps", serde_json::json!("tiny")),
        ("tie_word_embeddings", serde_json::json!("yes")),
        ("hidden_act", serde_json::json!(7)),
    ]
    .into_iter()
    .enumerate()
    {
        let m = c.model_copy(&format!("cfg-typed-{i}"), |d| config_with(d, key, value));
        c.refused_model(&format!("hf config {key} wrong type"), &m, Some(key));
    }
    // config files are kilobytes: a huge one, or a device, is refused before it is read
    let big = {
        let mut b = b"{\"a\": \"".to_vec();
        b.resize(17 << 20, b'x');
        b.extend(b"\"}");
        b
    };
    let m = c.model_copy("config-huge", |d| write(d, "config.json", &big));
    c.refused_model("hf config.json of 17 MiB", &m, Some("config.json"));
    let m = c.model_copy("tokcfg-huge", |d| write(d, "tokenizer_config.json", &big));
    c.refused_model(
        "hf tokenizer_config.json of 17 MiB",
        &m,
        Some("tokenizer_config.json"),
    );
    let m = c.model_copy("config-dev-zero", |d| {
        std::fs::remove_file(d.join("config.json")).unwrap();
        std::os::unix::fs::symlink("/dev/zero", d.join("config.json")).unwrap();
    });
    c.refused_model("hf config.json -> /dev/zero", &m, Some("config.json"));
}

fn safetensors_bytes(header_len: u64, header: &[u8], data: &[u8]) -> Vec<u8> {
    let mut b = header_len.to_le_bytes().to_vec();
    b.extend(header);
    b.extend(data);
    b
}

pub fn safetensors(c: &mut Corpus) {
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", Vec::new()),
        ("header-length-max", safetensors_bytes(u64::MAX, b"{}", &[])),
        ("header-past-end", safetensors_bytes(1 << 20, b"{}", &[])),
        ("header-not-json", safetensors_bytes(5, b"{{{{{", &[])),
        (
            "offsets-out-of-range",
            safetensors_bytes(
                70,
                br#"{"model.norm.weight":{"dtype":"F32","shape":[64],"data_offsets":[0,99999999]}}"#,
                &[0; 16],
            ),
        ),
        (
            "unknown-dtype",
            safetensors_bytes(
                64,
                br#"{"model.norm.weight":{"dtype":"Q9","shape":[1],"data_offsets":[0,4]}}"#,
                &[0; 4],
            ),
        ),
    ];
    for (name, bytes) in cases {
        let m = c.model_copy(&format!("st-{name}"), |d| {
            write(d, "model.safetensors", &bytes)
        });
        c.refused_model(&format!("safetensors {name}"), &m, None);
    }
    for (name, shard) in [
        ("parent", "../escape.safetensors"),
        ("absolute", "/etc/passwd"),
    ] {
        let m = c.model_copy(&format!("index-{name}"), |d| {
            std::fs::remove_file(d.join("model.safetensors")).unwrap();
            let index = serde_json::json!({"weight_map": {"model.norm.weight": shard}});
            write(
                d,
                "model.safetensors.index.json",
                index.to_string().as_bytes(),
            );
        });
        c.refused_model(&format!("safetensors index shard {name}"), &m, None);
    }
}

pub fn tokenizers(c: &mut Corpus) {
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("not-json", b"{\"model\": ".to_vec()),
        ("empty-object", b"{}".to_vec()),
        ("wrong-model", br#"{"model": {"type": "Nope"}}"#.to_vec()),
        ("null", b"null".to_vec()),
    ];
    for (name, bytes) in cases {
        let m = c.model_copy(&format!("tok-{name}"), |d| {
            write(d, "tokenizer.json", &bytes)
        });
        c.refused_model(&format!("tokenizer {name}"), &m, None);
    }
    // tokenizers 0.23 panicked on it (found by the fuzzer)
    let m = c.model_copy("tok-decoder-utf8", |d| {
        let mut b = std::fs::read(d.join("tokenizer.json")).unwrap();
        let at = find(&b, b"\"decoder\"").expect("a decoder");
        let s = at + find(&b[at..], b"\"type\"").unwrap() + 2;
        b[s] = 0xff;
        write(d, "tokenizer.json", &b);
    });
    c.refused_model(
        "tokenizer decoder with invalid UTF-8",
        &m,
        Some("tokenizer.json"),
    );
    // inputs on which tokenizers 0.23 panicked, kept as the fuzzer saved them
    for name in ["tokenizer-bpe-merge-panic", "tokenizer-template-panic"] {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(format!("tests/hostile_cases/inputs/{name}.json"));
        let m = c.model_copy(name, |d| {
            std::fs::copy(&src, d.join("tokenizer.json")).unwrap();
        });
        c.refused_model(
            &format!("tokenizer fuzz finding {name}"),
            &m,
            Some("tokenizer.json"),
        );
    }
    let m = c.model_copy("tok-missing", |d| {
        std::fs::remove_file(d.join("tokenizer.json")).unwrap()
    });
    c.refused_model("tokenizer missing", &m, Some("tokenizer.json"));
}

fn inspect(c: &mut Corpus, name: &str, code: i32, path: &std::path::Path, extra: &[&str]) {
    let mut a = strings(&["inspect", &s(path)]);
    a.extend(strings(extra));
    c.add(&format!("hef {name}"), code, None, &a);
}

pub fn hefs(c: &mut Corpus) {
    let healthy = hef_encoder::encode(&hef_encoder::healthy());
    let p = c.file("healthy.hef", &healthy);
    inspect(c, "healthy (control)", 0, &p, &[]);
    for (name, bytes) in [
        ("empty", Vec::new()),
        ("garbage", b"this is not a HEF file at all".repeat(10)),
        ("truncated", healthy[..healthy.len() / 2].to_vec()),
        ("version 9", {
            let mut b = healthy.clone();
            b[7] = 9;
            b
        }),
    ] {
        let p = c.file(&format!("{name}.hef"), &bytes);
        inspect(c, name, 2, &p, &[]);
    }
    // a flipped resource byte is no read error: the lint's resource hash check (exit 1)
    let mut b = healthy.clone();
    let n = b.len();
    b[n - 10] ^= 0xff;
    let p = c.file("resource-flipped.hef", &b);
    inspect(c, "resource byte flipped (lint error)", 1, &p, &[]);
    let pipe = c.fifo("pipe.hef");
    inspect(c, "a pipe", 2, &pipe, &[]);
    let dir = c.root().join("folder.hef");
    std::fs::create_dir(&dir).unwrap();
    inspect(c, "a folder", 2, &dir, &[]);
    inspect(c, "/dev/zero", 2, std::path::Path::new("/dev/zero"), &[]);
    let big = c.sparse("sparse.hef", 10 << 30);
    inspect(c, "10 GB sparse", 2, &big, &[]);
    let mut spec = hef_encoder::healthy();
    for g in &mut spec.groups {
        for cache in &mut g.caches {
            cache.padded[0] = u32::MAX;
            cache.padded[1] = u32::MAX;
        }
    }
    let p = c.file("huge-cache.hef", &hef_encoder::encode(&spec));
    inspect(c, "cache length near 2^64 (lint error)", 1, &p, &[]);
    inspect(
        c,
        "cache length near 2^64 --emit-sim",
        2,
        &p,
        &["--emit-sim", "huge-cache-manifest.json"],
    );
}

pub use super::more::{cli_values, manifests, out_folders, results};
