//! The probe subcommands with `--hef` (issue 6). A default build refuses `--hef` with exit 3
//! before anything else, `--model` included. A `--features hailo` build needs `--model` (exit 2),
//! refuses a HEF that does not pair with the model (exit 2, the lint message), and reports a device
//! it cannot open as exit 3. The feature tests link libhailort, so they run only where it exists,
//! or against the emulator-backed stand-in of `scripts/build-standin.sh` (`.ci/run` does this;
//! without `KVPROBE_STANDIN_MANIFEST` the stand-in has no device, so "reaches the device" is
//! HAILO_OUT_OF_PHYSICAL_DEVICES, exit 3).

mod common;
use common::*;

/// Exit code and the single stderr line.
fn run(args: &[&str]) -> (i32, String) {
    let r = kvprobe(args);
    let stderr = String::from_utf8_lossy(&r.stderr).into_owned();
    assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    (r.status.code().unwrap_or(-1), stderr)
}

/// Without the feature, "rebuild with --features hailo" comes first: before the missing
/// `--model` (which would otherwise be a usage error) and before a bad `--out`.
#[cfg(not(feature = "hailo"))]
#[test]
fn default_build_reports_the_missing_feature_first() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("missing-parent/out");
    let o = out.to_str().unwrap();
    let cases: [&[&str]; 4] = [
        &["diagnose", "--hef", "model.hef"],
        &["greedy", "--hef", "model.hef", "--model", "/no/such/model"],
        &["prefill", "--hef", "model.hef", "--out", o],
        &["colmap", "--hef", "/no/such.hef", "--ids", "1,2,3"],
    ];
    for a in cases {
        let (code, stderr) = run(a);
        assert_eq!(code, 3, "{a:?}: {stderr}");
        assert!(
            stderr.contains("built without HailoRT support: rebuild with --features hailo"),
            "{a:?}: {stderr}"
        );
    }
    assert!(!out.exists());
}

#[cfg(feature = "hailo")]
mod with_feature {
    use super::*;
    use std::path::{Path, PathBuf};

    fn hef_fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("npu/tests/fixtures/hef")
            .join(name)
    }

    #[test]
    fn hef_needs_an_explicit_model() {
        let hef = hef_fixture("healthy.hef");
        let (code, stderr) = run(&["greedy", "--hef", hef.to_str().unwrap()]);
        assert_eq!(code, 2, "{stderr}");
        assert!(stderr.contains("--model"), "{stderr}");
    }

    #[test]
    fn a_model_that_does_not_pair_is_an_input_error() {
        // healthy.hef: vocab 64, hidden 32; the tiny Llama: 300 and 64.
        let f = fixture("llama", 7);
        let hef = hef_fixture("healthy.hef");
        let (code, stderr) = run(&[
            "diagnose",
            "--hef",
            hef.to_str().unwrap(),
            "--model",
            f.to_str().unwrap(),
        ]);
        assert_eq!(code, 2, "{stderr}");
        assert!(stderr.contains("does not pair"), "{stderr}");
        assert!(stderr.contains("[pair-vocab]"), "{stderr}");
        assert!(stderr.contains("[pair-hidden]"), "{stderr}");
    }

    #[test]
    fn an_unreadable_hef_is_an_input_error() {
        let f = fixture("llama", 7);
        let (code, stderr) = run(&[
            "greedy",
            "--hef",
            "/no/such/model.hef",
            "--model",
            f.to_str().unwrap(),
        ]);
        assert_eq!(code, 2, "{stderr}");
        assert!(stderr.contains("/no/such/model.hef"), "{stderr}");
    }

    /// A model that pairs with healthy.hef gets past the pairing check to the device, which
    /// this machine cannot open: exit 3 (without the shim, the message says how to build it).
    #[test]
    fn a_paired_model_reaches_the_device() {
        let dir = tempfile::tempdir().unwrap();
        let hef = hef_fixture("healthy.hef");
        write_model_paired_with_healthy_hef(&hef, dir.path());
        let out = dir.path().join("out");
        let (code, stderr) = run(&[
            "greedy",
            "--hef",
            hef.to_str().unwrap(),
            "--model",
            dir.path().to_str().unwrap(),
            "--prompt",
            "w1 w2 w3",
            "--out",
            out.to_str().unwrap(),
        ]);
        assert_eq!(code, 3, "{stderr}");
        if !kvprobe_npu::hailo::SHIM_BUILT {
            assert!(stderr.contains("HailoRT C++ shim"), "{stderr}");
        }
        assert!(!out.exists());
    }

    /// A Llama folder matching healthy.hef (`inspect` prints: L 32, P 8, vocab 64, hidden 32,
    /// 2 layers, heads 4/2, head_dim 8, theta base 10000): the HEF's own tokenizer.json, its
    /// embeddings.bin dequantised with the embeddings input's quant (scale 1e-4, zp 32768) as the
    /// token table, arbitrary other weights, hand-written safetensors.
    fn write_model_paired_with_healthy_hef(hef_path: &Path, dir: &Path) {
        let hef = kvprobe_npu::hef::Hef::open(hef_path).unwrap();
        let (hidden, inter, layers, heads, kv_heads, head_dim, vocab) = (32, 64, 2, 4, 2, 8, 64);
        std::fs::write(
            dir.join("tokenizer.json"),
            hef.resource("tokenizer.json").unwrap(),
        )
        .unwrap();
        let config = serde_json::json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": hidden,
            "intermediate_size": inter,
            "num_hidden_layers": layers,
            "num_attention_heads": heads,
            "num_key_value_heads": kv_heads,
            "head_dim": head_dim,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "max_position_embeddings": 64,
            "vocab_size": vocab,
            "tie_word_embeddings": true,
            "hidden_act": "silu",
            "torch_dtype": "float32",
        });
        std::fs::write(dir.join("config.json"), config.to_string()).unwrap();

        let table: Vec<f32> = hef
            .resource("embeddings.bin")
            .unwrap()
            .chunks_exact(2)
            .map(|b| (f32::from(u16::from_le_bytes([b[0], b[1]])) - 32768.0) * 1e-4)
            .collect();
        assert_eq!(table.len(), vocab * hidden);
        let mut seed = 0x9e37_79b9_u32;
        let mut arbitrary = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    (seed >> 8) as f32 / (1u32 << 24) as f32 * 0.2 - 0.1
                })
                .collect()
        };
        let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = vec![(
            "model.embed_tokens.weight".into(),
            vec![vocab, hidden],
            table,
        )];
        for l in 0..layers {
            let p = format!("model.layers.{l}");
            for (name, rows, cols) in [
                ("self_attn.q_proj", heads * head_dim, hidden),
                ("self_attn.k_proj", kv_heads * head_dim, hidden),
                ("self_attn.v_proj", kv_heads * head_dim, hidden),
                ("self_attn.o_proj", hidden, heads * head_dim),
                ("mlp.gate_proj", inter, hidden),
                ("mlp.up_proj", inter, hidden),
                ("mlp.down_proj", hidden, inter),
            ] {
                tensors.push((
                    format!("{p}.{name}.weight"),
                    vec![rows, cols],
                    arbitrary(rows * cols),
                ));
            }
            for norm in ["input_layernorm", "post_attention_layernorm"] {
                tensors.push((
                    format!("{p}.{norm}.weight"),
                    vec![hidden],
                    vec![1.0; hidden],
                ));
            }
        }
        tensors.push(("model.norm.weight".into(), vec![hidden], vec![1.0; hidden]));
        write_safetensors(&dir.join("model.safetensors"), &tensors);
    }

    /// The safetensors layout: u64 LE header length, JSON header, then the raw LE data.
    fn write_safetensors(path: &Path, tensors: &[(String, Vec<usize>, Vec<f32>)]) {
        let mut header = serde_json::Map::new();
        let mut data = Vec::new();
        for (name, shape, values) in tensors {
            let start = data.len();
            data.extend(values.iter().flat_map(|v| v.to_le_bytes()));
            header.insert(
                name.clone(),
                serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [start, data.len()]}),
            );
        }
        let mut h = serde_json::Value::Object(header).to_string().into_bytes();
        while !h.len().is_multiple_of(8) {
            h.push(b' ');
        }
        let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
        bytes.extend(h);
        bytes.extend(data);
        std::fs::write(path, bytes).unwrap();
    }
}
