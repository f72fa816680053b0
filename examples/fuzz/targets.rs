//! The parsers of untrusted bytes, each called the way kvprobe reads that input (through a file
//! where kvprobe reads a file), with the valid seeds their mutations start from.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::{gguf_support, hef_encoder};

/// Parses one input (`bytes`, the `i`-th of the run); a panic in it is a finding.
pub type Parse = Box<dyn Fn(&[u8], u64)>;

pub struct Target {
    pub name: &'static str,
    pub seeds: Vec<Vec<u8>>,
    /// Whether the JSON-number mutation applies.
    pub json: bool,
    pub run: Parse,
}

pub const NAMES: [&str; 8] = [
    "hef",
    "manifest",
    "results",
    "gguf",
    "config",
    "tokenizer",
    "safetensors",
    "genai",
];

/// The target `name`, its scratch files under `scratch` (a tmpfs folder is fastest).
pub fn target(name: &str, scratch: &Path) -> Option<Target> {
    let scratch = scratch.to_path_buf();
    Some(match name {
        "hef" => hef(),
        "manifest" => manifest(scratch),
        "results" => results(scratch),
        "gguf" => gguf(scratch),
        "config" => config(),
        "tokenizer" => tokenizer(scratch),
        "safetensors" => safetensors(scratch),
        "genai" => genai(scratch),
        _ => return None,
    })
}

fn hef() -> Target {
    let spec = hef_encoder::healthy();
    let mut seeds = vec![hef_encoder::encode(&spec)];
    for version in [0, 1, 2] {
        let mut s = spec.clone();
        s.container_version = version;
        seeds.push(hef_encoder::encode(&s));
    }
    let (proto, info) = hef_encoder::encode_proto(&spec);
    seeds.push(proto.clone());
    Target {
        name: "hef",
        seeds,
        json: false,
        run: Box::new(move |bytes, i| {
            // every other input is a mutated protobuf in a container with valid checksums, so
            // the mutations get past the hash checks to the decoder and the lint
            let file = if i % 2 == 0 {
                hef_encoder::container(2, false, bytes, &[], &info)
            } else {
                bytes.to_vec()
            };
            if let Ok(h) = kvprobe_npu::hef::Hef::parse(file) {
                let lints = kvprobe_npu::hef::lint(&h);
                let _ = kvprobe_npu::hef::describe::to_device_description(&h);
                let id = kvprobe_schema::ModelIdentity {
                    path: String::new(),
                    sha256: String::new(),
                    architecture: String::new(),
                };
                let _ = kvprobe_npu::hef::describe::to_sim_manifest(&h, id);
                let _ = kvprobe_npu::hef::summary::text(&kvprobe_npu::hef::summary::Inspection {
                    hef: &h,
                    lints: &lints,
                    pairing: &[],
                    extracted: &[],
                });
            }
        }),
    }
}

fn tiny_model() -> (tempfile::TempDir, Arc<kvprobe_reference::Model>) {
    let d = tempfile::tempdir().unwrap();
    kvprobe_reference::fixtures::write_tiny_llama(d.path(), 7).unwrap();
    let m = Arc::new(kvprobe_reference::Model::load(d.path()).unwrap());
    (d, m)
}

fn manifest(scratch: PathBuf) -> Target {
    let (dir, model) = tiny_model();
    let opts = kvprobe_npu::sim::SimOptions {
        cache_len: 32,
        prefill_len: 8,
        faults: vec!["tbt-read-layout=f8cr@k".into()],
        ..Default::default()
    };
    let dev = kvprobe_npu::sim::SimDevice::new(model.clone(), opts).unwrap();
    let seed = serde_json::to_vec_pretty(dev.manifest()).unwrap();
    let path = scratch.join("sim-manifest.json");
    Target {
        name: "manifest",
        seeds: vec![seed],
        json: true,
        run: Box::new(move |bytes, i| {
            let _keep = &dir;
            std::fs::write(&path, bytes).unwrap();
            // the read checks every input; building the emulator from it (rings, faults,
            // quant) is slower and runs on one in 16 of those the read accepts
            if kvprobe_npu::contract::manifest::read(&path).is_ok() && i % 16 == 0 {
                let o = kvprobe_npu::sim::SimOptions {
                    manifest: Some(path.clone()),
                    ..Default::default()
                };
                let _ = kvprobe_npu::sim::SimDevice::new(model.clone(), o);
            }
        }),
    }
}

fn results(scratch: PathBuf) -> Target {
    let seeds = [
        kvprobe_reports::fixtures::faulty_results(),
        kvprobe_reports::fixtures::healthy_results(),
    ]
    .iter()
    .map(|r| serde_json::to_vec(r).unwrap())
    .collect();
    let dir = scratch.join("run");
    std::fs::create_dir_all(&dir).unwrap();
    Target {
        name: "results",
        seeds,
        json: true,
        run: Box::new(move |bytes, i| {
            std::fs::write(dir.join("results.json"), bytes).unwrap();
            // drawing every chart is the slow part: one in 8 accepted files is drawn
            if kvprobe_reports::load_results(&dir).is_ok() && i % 8 == 0 {
                let _ = kvprobe_reports::render_report(&dir);
            }
        }),
    }
}

fn gguf(scratch: PathBuf) -> Target {
    let vocab = gguf_support::vocab().0.len();
    let seeds = vec![
        gguf_support::encode(
            &gguf_support::base_meta("llama", vocab),
            &gguf_support::base_tensors(vocab, true),
        ),
        gguf_support::encode(
            &gguf_support::base_meta("llama", vocab),
            &gguf_support::base_tensors(vocab, false),
        ),
    ];
    let path = scratch.join("model.gguf");
    Target {
        name: "gguf",
        seeds,
        json: false,
        run: Box::new(move |bytes, _| {
            std::fs::write(&path, bytes).unwrap();
            let _ = kvprobe_reference::gguf::load(&path);
        }),
    }
}

fn config() -> Target {
    let d = tempfile::tempdir().unwrap();
    kvprobe_reference::fixtures::write_tiny_llama(d.path(), 7).unwrap();
    let llama = std::fs::read(d.path().join("config.json")).unwrap();
    kvprobe_reference::fixtures::write_tiny_gpt2(d.path(), 7).unwrap();
    let gpt2 = std::fs::read(d.path().join("config.json")).unwrap();
    let path = PathBuf::from("config.json");
    Target {
        name: "config",
        seeds: vec![llama, gpt2],
        json: true,
        run: Box::new(move |bytes, _| {
            if let Ok(v) = serde_json::from_slice::<serde_json::Value>(bytes) {
                let _ = kvprobe_reference::hf::parse_config(&v, &path);
            }
        }),
    }
}

fn tokenizer(scratch: PathBuf) -> Target {
    let d = tempfile::tempdir().unwrap();
    kvprobe_reference::fixtures::write_tiny_llama(d.path(), 7).unwrap();
    let seed = std::fs::read(d.path().join("tokenizer.json")).unwrap();
    let path = scratch.join("tokenizer.json");
    Target {
        name: "tokenizer",
        seeds: vec![seed],
        json: true,
        run: Box::new(move |bytes, _| {
            std::fs::write(&path, bytes).unwrap();
            if let Ok(t) = kvprobe_reference::tokenizer::TextTokenizer::from_file(&path) {
                if let Ok(ids) = t.encode("hello, world", true) {
                    let _ = t.decode(&ids);
                }
            }
        }),
    }
}

/// A safetensors file of a few small tensors in the dtypes kvprobe converts.
fn safetensors_seed() -> Vec<u8> {
    let header = serde_json::json!({
        "__metadata__": {"format": "pt"},
        "a.weight": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
        "b.weight": {"dtype": "BF16", "shape": [4], "data_offsets": [24, 32]},
        "c.weight": {"dtype": "F16", "shape": [2, 2], "data_offsets": [32, 40]},
    })
    .to_string();
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend(header.as_bytes());
    b.extend((0..40u8).map(|x| x.wrapping_mul(37)));
    b
}

fn safetensors(scratch: PathBuf) -> Target {
    let dir = scratch.join("st");
    std::fs::create_dir_all(&dir).unwrap();
    Target {
        name: "safetensors",
        seeds: vec![safetensors_seed()],
        json: true,
        run: Box::new(move |bytes, _| {
            std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
            let _ = kvprobe_reference::hf::load_weights(&dir);
        }),
    }
}

/// genai_config.json as `scripts/export-onnx.py` writes it: the default decoder and the windowed
/// NPU style (sliding_window section, a provider option).
fn genai_seeds() -> Vec<Vec<u8>> {
    let plain = serde_json::json!({
        "model": {"type": "llama", "context_length": 128, "vocab_size": 300, "bos_token_id": 1,
            "eos_token_id": [2], "pad_token_id": 0,
            "decoder": {"filename": "model.onnx", "head_size": 16, "hidden_size": 64,
                "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
                "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                    "position_ids": "position_ids", "past_key_names": "past_key_values.%d.key",
                    "past_value_names": "past_key_values.%d.value"},
                "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value"},
                "session_options": {"provider_options": []}}},
        "search": {"max_length": 128, "past_present_share_buffer": false}
    });
    let mut windowed = plain.clone();
    windowed["model"]["decoder"]["sliding_window"] = serde_json::json!({"window_size": 8, "pad_value": 128, "alignment": "right", "slide_key_value_cache": true});
    windowed["model"]["decoder"]["session_options"]["provider_options"] =
        serde_json::json!([{"qnn": {"backend_path": "libQnnHtp.so"}}]);
    [plain, windowed]
        .iter()
        .map(|v| serde_json::to_vec_pretty(v).unwrap())
        .collect()
}

fn genai(scratch: PathBuf) -> Target {
    let dir = scratch.join("genai");
    std::fs::create_dir_all(&dir).unwrap();
    Target {
        name: "genai",
        seeds: genai_seeds(),
        json: true,
        run: Box::new(move |bytes, _| {
            std::fs::write(dir.join("genai_config.json"), bytes).unwrap();
            let _ = kvprobe_npu::onnx::GenaiConfig::load(&dir);
        }),
    }
}
