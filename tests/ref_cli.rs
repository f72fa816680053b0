//! `kvprobe ref` through the built binary: bad inputs exit with code 2, one line on stderr, no
//! panic and no output file; on SmolLM2 (when fetched) the ids and the greedy continuation match
//! independent implementations (llama.cpp's tokenizer, scripts/np_reference.py's greedy decode).

use std::path::{Path, PathBuf};
use std::process::Command;

use kvprobe_reference::fixtures;

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn kvprobe(args: &[&str]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_kvprobe"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("run kvprobe");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Exit 2, exactly one stderr line mentioning `needle`, no panic, and `out` not created.
fn assert_input_error(r: &Run, needle: &str, out: &Path) {
    assert_eq!(r.code, 2, "exit code; stderr: {}", r.stderr);
    let lines: Vec<&str> = r.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "stderr must be one line: {:?}", r.stderr);
    assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
    assert!(
        r.stderr.contains(needle),
        "stderr {:?} should mention {needle:?}",
        r.stderr
    );
    assert!(!out.exists(), "output file left behind: {}", out.display());
    let leftovers: Vec<_> = std::fs::read_dir(out.parent().unwrap())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(".kvprobe-"))
        .collect();
    assert!(leftovers.is_empty(), "temporary file left behind");
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn tiny_llama(dir: &Path) -> PathBuf {
    let m = dir.join("tiny-llama");
    fixtures::write_tiny_llama(&m, 7).unwrap();
    m
}

#[test]
fn missing_model_path() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("o.npy");
    let r = kvprobe(&[
        "ref",
        "logits",
        "--model",
        "/no/such/model",
        "--ids",
        "1,2",
        "--out",
        s(&out),
    ]);
    assert_input_error(&r, "/no/such/model", &out);
}

#[test]
fn folder_without_config_json() {
    let d = tempfile::tempdir().unwrap();
    let empty = d.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let out = d.path().join("o.npy");
    let r = kvprobe(&[
        "ref",
        "logits",
        "--model",
        s(&empty),
        "--ids",
        "1,2",
        "--out",
        s(&out),
    ]);
    assert_input_error(&r, "config.json", &out);
}

#[test]
fn truncated_gguf() {
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("cut.gguf");
    // A GGUF v3 header announcing 5 tensors and 10 metadata entries, then nothing.
    let mut bytes = b"GGUF".to_vec();
    bytes.extend(3u32.to_le_bytes());
    bytes.extend(5u64.to_le_bytes());
    bytes.extend(10u64.to_le_bytes());
    std::fs::write(&m, bytes).unwrap();
    let out = d.path().join("o.npy");
    let r = kvprobe(&[
        "ref",
        "logits",
        "--model",
        s(&m),
        "--ids",
        "1,2",
        "--out",
        s(&out),
    ]);
    assert_input_error(&r, "cut.gguf", &out);
}

#[test]
fn truncated_real_gguf() {
    let Some(model) = smollm2() else { return };
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("half.gguf");
    let bytes = std::fs::read(model).unwrap();
    std::fs::write(&m, &bytes[..bytes.len() / 2]).unwrap();
    let out = d.path().join("o.npy");
    let r = kvprobe(&[
        "ref",
        "logits",
        "--model",
        s(&m),
        "--ids",
        "1,2",
        "--out",
        s(&out),
    ]);
    assert_input_error(&r, "truncated", &out);
}

/// GGUF v3 magic, version and the two counts.
fn gguf_preamble(n_tensors: usize, n_kv: usize) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend((n_tensors as u64).to_le_bytes());
    b.extend((n_kv as u64).to_le_bytes());
    b
}

/// A GGUF string: u64 length, then the bytes.
fn put(b: &mut Vec<u8>, s: &str) {
    b.extend((s.len() as u64).to_le_bytes());
    b.extend(s.as_bytes());
}

/// A GGUF v3 header: `kv` string metadata and `tensors` (name, ggml type id) of shape [32].
fn gguf_header(kv: &[(&str, &str)], tensors: &[(&str, u32)]) -> Vec<u8> {
    let mut b = gguf_preamble(tensors.len(), kv.len());
    for (k, v) in kv {
        put(&mut b, k);
        b.extend(8u32.to_le_bytes());
        put(&mut b, v);
    }
    for (name, ty) in tensors {
        put(&mut b, name);
        b.extend(1u32.to_le_bytes());
        b.extend(32u64.to_le_bytes());
        b.extend(ty.to_le_bytes());
        b.extend(0u64.to_le_bytes());
    }
    b
}

#[test]
fn unsupported_gguf_architecture_and_quant_type() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("o.npy");
    let m = d.path().join("arch.gguf");
    std::fs::write(&m, gguf_header(&[("general.architecture", "mamba")], &[])).unwrap();
    let r = kvprobe(&[
        "ref",
        "logits",
        "--model",
        s(&m),
        "--ids",
        "1",
        "--out",
        s(&out),
    ]);
    assert_input_error(&r, "mamba", &out);
    let m = d.path().join("quant.gguf");
    // ggml type 20 = IQ4_NL
    let bytes = gguf_header(
        &[("general.architecture", "llama")],
        &[("blk.0.ffn_up.weight", 20)],
    );
    std::fs::write(&m, bytes).unwrap();
    let r = kvprobe(&[
        "ref",
        "logits",
        "--model",
        s(&m),
        "--ids",
        "1",
        "--out",
        s(&out),
    ]);
    assert_input_error(&r, "IQ4_NL", &out);
    assert!(r.stderr.contains("blk.0.ffn_up.weight"), "{}", r.stderr);
}

#[test]
fn corrupt_safetensors() {
    let d = tempfile::tempdir().unwrap();
    let m = tiny_llama(d.path());
    let st = m.join("model.safetensors");
    let bytes = std::fs::read(&st).unwrap();
    std::fs::write(&st, &bytes[..bytes.len() / 3]).unwrap();
    let out = d.path().join("o.npy");
    let r = kvprobe(&[
        "ref",
        "logits",
        "--model",
        s(&m),
        "--ids",
        "1,2",
        "--out",
        s(&out),
    ]);
    assert_input_error(&r, "model.safetensors", &out);
}

#[test]
fn ids_outside_the_vocabulary() {
    let d = tempfile::tempdir().unwrap();
    let m = tiny_llama(d.path());
    let out = d.path().join("o.npy");
    let bad = fixtures::LLAMA_VOCAB.to_string();
    let r = kvprobe(&[
        "ref",
        "logits",
        "--model",
        s(&m),
        "--ids",
        &format!("1,{bad}"),
        "--out",
        s(&out),
    ]);
    assert_input_error(&r, &bad, &out);
}

#[test]
fn malformed_ids_and_single_key_out_of_range() {
    let d = tempfile::tempdir().unwrap();
    let m = tiny_llama(d.path());
    let out = d.path().join("o.npy");
    let r = kvprobe(&[
        "ref",
        "logits",
        "--model",
        s(&m),
        "--ids",
        "1,x",
        "--out",
        s(&out),
    ]);
    assert_input_error(&r, "`x`", &out);
    let r = kvprobe(&[
        "ref",
        "logits",
        "--model",
        s(&m),
        "--ids",
        "1,2,3",
        "--single-key",
        "3",
        "--out",
        s(&out),
    ]);
    assert_input_error(&r, "--single-key", &out);
}

#[test]
fn prompt_longer_than_the_context() {
    let d = tempfile::tempdir().unwrap();
    let m = tiny_llama(d.path());
    let out = d.path().join("o.npy");
    let ids = vec!["5"; fixtures::LLAMA_MAX_POS + 1].join(",");
    let r = kvprobe(&[
        "ref",
        "logits",
        "--model",
        s(&m),
        "--ids",
        &ids,
        "--out",
        s(&out),
    ]);
    assert_input_error(&r, &fixtures::LLAMA_MAX_POS.to_string(), &out);
    // Text too: every character of this prompt is at least one token of the byte-level vocabulary.
    let prompt = "q~".repeat(fixtures::LLAMA_MAX_POS);
    let r = kvprobe(&[
        "ref",
        "logits",
        "--model",
        s(&m),
        "--prompt",
        &prompt,
        "--out",
        s(&out),
    ]);
    assert_input_error(&r, "context", &out);
}

#[test]
fn usage_errors_exit_2() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("o.npy");
    // Neither --prompt nor --ids.
    let r = kvprobe(&["ref", "logits", "--model", "x", "--out", s(&out)]);
    assert_input_error(&r, "--prompt", &out);
    let r = kvprobe(&["ref", "logits", "--no-such-flag"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    // Output folder missing.
    let m = tiny_llama(d.path());
    let out2 = d.path().join("no-such-dir").join("o.npy");
    let r = kvprobe(&[
        "ref",
        "logits",
        "--model",
        s(&m),
        "--ids",
        "1,2",
        "--out",
        s(&out2),
    ]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
}

#[test]
fn logits_file_has_shape_t_by_vocab_and_single_key_changes_only_the_last_row() {
    use ndarray_npy::ReadNpyExt;
    let d = tempfile::tempdir().unwrap();
    let m = tiny_llama(d.path());
    let causal = d.path().join("c.npy");
    let single = d.path().join("s.npy");
    let r = kvprobe(&[
        "ref",
        "logits",
        "--model",
        s(&m),
        "--ids",
        "3,1,4,1,5",
        "--out",
        s(&causal),
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let r = kvprobe(&[
        "ref",
        "logits",
        "--model",
        s(&m),
        "--ids",
        "3,1,4,1,5",
        "--single-key",
        "1",
        "--out",
        s(&single),
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let c = ndarray::Array2::<f32>::read_npy(std::fs::File::open(&causal).unwrap()).unwrap();
    let sk = ndarray::Array2::<f32>::read_npy(std::fs::File::open(&single).unwrap()).unwrap();
    assert_eq!(c.dim(), (5, fixtures::LLAMA_VOCAB));
    for t in 0..4 {
        assert_eq!(c.row(t), sk.row(t), "row {t} must stay causal");
    }
    let diff = (&c.row(4) - &sk.row(4)).mapv(f32::abs).sum();
    assert!(diff > 1e-3, "the last row must see fewer keys");
}

fn smollm2() -> Option<PathBuf> {
    let p =
        Path::new(env!("CARGO_MANIFEST_DIR")).join(".cache/models/smollm2-135m-instruct-q4_1.gguf");
    if p.exists() {
        Some(p)
    } else {
        eprintln!("SKIP: SmolLM2 not fetched (run scripts/fetch-model.sh)");
        None
    }
}

/// Prompt ids: llama.cpp's tokenizer (llama-cpp-python 0.3.36) on this chat prompt. Continuation:
/// greedy decoding by scripts/np_reference.py (float64 numpy) and by llama.cpp on the F32-dequantised
/// GGUF, both "The capital of France is Paris." then <|im_end|>.
#[test]
fn smollm2_generate_matches_independent_references() {
    if smollm2().is_none() {
        return;
    }
    let prompt =
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n";
    // --model omitted: the fetched SmolLM2 is the default.
    let r = kvprobe(&[
        "ref",
        "generate",
        "--prompt",
        prompt,
        "--max-new",
        "12",
        "--json",
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let v: serde_json::Value = serde_json::from_str(r.stdout.trim()).unwrap();
    let ids = |k: &str| -> Vec<u64> {
        v[k].as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect()
    };
    assert_eq!(
        ids("prompt_ids"),
        [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198]
    );
    // Stops at <|im_end|> (eos 2) before --max-new.
    assert_eq!(
        ids("generated_ids"),
        [504, 3575, 282, 4649, 314, 7042, 30, 2]
    );
    assert_eq!(v["text"], "The capital of France is Paris.<|im_end|>");
}

#[test]
#[cfg(unix)]
fn written_files_follow_the_umask_like_any_other_tool() {
    // issue 19: artefacts came out 0600 (the temporary file's mode) under umask 022
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    let m = tiny_llama(d.path());
    let out = d.path().join("o.npy");
    let r = Command::new("sh")
        .arg("-c")
        .arg("umask 022 && exec \"$0\" ref logits --model \"$1\" --ids 1,2 --out \"$2\"")
        .arg(env!("CARGO_BIN_EXE_kvprobe"))
        .arg(&m)
        .arg(&out)
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let mode = std::fs::metadata(&out).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o644, "{mode:o}");
}

enum Kv<'a> {
    Str(&'a str),
    U32(u32),
    F32(f32),
}

/// A GGUF v3 file of llama metadata (plus `extra`, which overrides) and F32 tensors given as
/// (name, ggml dims), their data zeros.
fn llama_gguf(extra: &[(&str, Kv)], tensors: &[(&str, &[u64])]) -> Vec<u8> {
    let base = [
        ("general.architecture", Kv::Str("llama")),
        ("llama.block_count", Kv::U32(1)),
        ("llama.context_length", Kv::U32(64)),
        ("llama.embedding_length", Kv::U32(32)),
        ("llama.feed_forward_length", Kv::U32(64)),
        ("llama.attention.head_count", Kv::U32(2)),
        ("llama.attention.layer_norm_rms_epsilon", Kv::F32(1e-5)),
    ];
    let kv: Vec<&(&str, Kv)> = base
        .iter()
        .filter(|(k, _)| !extra.iter().any(|(e, _)| e == k))
        .chain(extra)
        .collect();
    let mut b = gguf_preamble(tensors.len(), kv.len());
    for (k, v) in kv {
        put(&mut b, k);
        match v {
            Kv::Str(s) => {
                b.extend(8u32.to_le_bytes());
                put(&mut b, s);
            }
            Kv::U32(x) => b.extend(4u32.to_le_bytes().into_iter().chain(x.to_le_bytes())),
            Kv::F32(x) => b.extend(6u32.to_le_bytes().into_iter().chain(x.to_le_bytes())),
        }
    }
    let mut offset = 0u64;
    for (name, dims) in tensors {
        put(&mut b, name);
        b.extend((dims.len() as u32).to_le_bytes());
        for d in *dims {
            b.extend(d.to_le_bytes());
        }
        b.extend(0u32.to_le_bytes());
        b.extend(offset.to_le_bytes());
        offset += (dims.iter().product::<u64>() * 4).div_ceil(32) * 32;
    }
    b.resize(b.len().div_ceil(32) * 32 + offset as usize, 0);
    b
}

/// `kvprobe ref logits` on `bytes` saved as `name`, under a 1 GB address-space limit.
fn ref_logits_limited(name: &str, bytes: &[u8]) -> (Run, tempfile::TempDir) {
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join(name);
    std::fs::write(&m, bytes).unwrap();
    let out = Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 1000000 && exec \"$0\" ref logits --model \"$1\" --ids 1,2 --out \"$2\"")
        .arg(env!("CARGO_BIN_EXE_kvprobe"))
        .arg(&m)
        .arg(d.path().join("o.npy"))
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("run kvprobe");
    let run = Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    (run, d)
}

#[test]
fn hostile_gguf_headers_are_refused_in_one_line() {
    // issue 19: alignment 0 and a dimensionless embedding panicked; a sub-kilobyte header
    // claiming ten million layers used 13 GB before refusing (aborts under the 1 GB limit)
    let embd: &[(&str, &[u64])] = &[("token_embd.weight", &[32, 10])];
    let cases: [(&str, Vec<u8>, &str); 3] = [
        (
            "align0.gguf",
            llama_gguf(&[("general.alignment", Kv::U32(0))], embd),
            "general.alignment",
        ),
        (
            "nodims.gguf",
            llama_gguf(&[], &[("token_embd.weight", &[])]),
            "token_embd.weight",
        ),
        (
            "layers.gguf",
            llama_gguf(&[("llama.block_count", Kv::U32(10_000_000))], embd),
            "is missing",
        ),
    ];
    for (name, bytes, needle) in cases {
        assert!(bytes.len() < 4096, "{name} is {} bytes", bytes.len());
        let (r, d) = ref_logits_limited(name, &bytes);
        assert!(r.stdout.is_empty(), "{name}: {}", r.stdout);
        assert_input_error(&r, needle, &d.path().join("o.npy"));
        assert!(r.stderr.contains(name), "{name}: {}", r.stderr);
    }
}

/// `--genai-window`: the ids fed as GenAI's windowed host feeds them (the `host-feed`
/// reproducer). A pad-valued id in the first window changes the rows from it on; the same id in
/// a later window (W3 feeds it like any other) changes nothing.
#[test]
fn genai_window_feeds_a_first_window_pad_id_as_genai_does() {
    use ndarray_npy::ReadNpyExt;
    let d = tempfile::tempdir().unwrap();
    let m = tiny_llama(d.path());
    let run = |extra: &[&str], name: &str| {
        let out = d.path().join(name);
        let mut a = vec!["ref", "logits", "--model", s(&m), "--ids", "3,1,4,1,5"];
        a.extend_from_slice(extra);
        a.extend_from_slice(&["--out", s(&out)]);
        let r = kvprobe(&a);
        assert_eq!(r.code, 0, "{}", r.stderr);
        ndarray::Array2::<f32>::read_npy(std::fs::File::open(&out).unwrap()).unwrap()
    };
    let window = |n: &'static str| {
        [
            "--genai-window",
            "2",
            "--genai-context",
            "8",
            "--pad-token",
            "1",
            "--prompt-len",
            n,
        ]
    };
    let plain = run(&[], "plain.npy");
    // prompt 3 ids, W 2: one pad in front, the first window holds id 3 alone
    let later = run(&window("3"), "later.npy");
    // prompt 4 ids: the first window is [3, 1], and 1 is the pad id
    let first = run(&window("4"), "first.npy");
    let diff = |a: ndarray::ArrayView1<f32>, b: ndarray::ArrayView1<f32>| {
        (&a - &b).mapv(f32::abs).fold(0f32, |x, y| x.max(*y))
    };
    for t in 0..5 {
        assert!(diff(plain.row(t), later.row(t)) < 1e-5, "row {t}");
    }
    assert!(diff(plain.row(0), first.row(0)) < 1e-5);
    for t in 1..5 {
        assert!(
            diff(plain.row(t), first.row(t)) > 1e-3,
            "row {t} sees the pad-valued id hidden"
        );
    }
    let out = d.path().join("bad.npy");
    let r = kvprobe(&[
        "ref",
        "logits",
        "--model",
        s(&m),
        "--ids",
        "3,1",
        "--genai-window",
        "2",
        "--out",
        s(&out),
    ]);
    assert_eq!(r.code, 2, "{}", r.stderr);
}
