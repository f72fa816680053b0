//! Hugging Face model folders: config.json, model.safetensors (or sharded with
//! model.safetensors.index.json), tokenizer.json (+ tokenizer_config.json for `add_bos_token`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::Device;
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

use crate::store::{Bytes, Kind, Weight};
use crate::weights::StoredWeights;
use crate::{
    gpt2, support, Error, Family, LoadedParts, ModelConfig, Result, StoredParts, TextTokenizer,
    Weights,
};

const FOLDER_FIX: &str =
    "pass a Hugging Face model folder (config.json, *.safetensors, tokenizer.json) or a .gguf file";

/// Load a whole HF folder into parts for [`crate::Model::from_parts`] (every weight as f32).
pub fn load(dir: &Path) -> Result<LoadedParts> {
    load_stored(dir)?.into_loaded()
}

/// [`load`] with the weights left in the mapped safetensors files, in their storage type.
pub(crate) fn load_stored(dir: &Path) -> Result<StoredParts> {
    // a folder kvprobe cannot list is not one without config.json
    if let Err(e) = std::fs::read_dir(dir) {
        return Err(Error::Format {
            path: dir.to_path_buf(),
            detail: format!("cannot read the model folder ({e}); make it readable"),
        });
    }
    let cfg_path = dir.join("config.json");
    if !file_at(&cfg_path)? {
        return Err(missing(dir, "config.json", FOLDER_FIX));
    }
    let mut config = parse_config(&read_json(&cfg_path)?, &cfg_path)?;
    let tok_path = dir.join("tokenizer.json");
    if !file_at(&tok_path)? {
        return Err(missing(
            dir,
            "tokenizer.json",
            "copy the model's tokenizer.json into the folder",
        ));
    }
    let mut tokenizer = TextTokenizer::from_file(&tok_path)?;
    // tokenizer_config.json's add_bos_token wins over what the post-processor suggests.
    let tc = dir.join("tokenizer_config.json");
    let explicit_bos = if file_at(&tc)? {
        read_json(&tc)?
            .get("add_bos_token")
            .and_then(Value::as_bool)
    } else {
        None
    };
    let add_bos = explicit_bos.unwrap_or(tokenizer.default_add_bos());
    let bos_id = config.bos_token_id.or(tokenizer.bos_id());
    tokenizer.set_bos(add_bos, bos_id);
    config.add_bos = add_bos && bos_id.is_some();
    if config.bos_token_id.is_none() {
        config.bos_token_id = bos_id;
    }
    let mut weights = load_stored_weights(dir)?;
    if config.family == Family::Gpt2 {
        weights = weights
            .into_iter()
            .map(|(k, v)| (gpt2::canonical_name(&k).to_string(), v))
            .collect();
    }
    Ok(StoredParts {
        config,
        weights,
        tokenizer,
    })
}

/// Whether a regular file is at `p` (links followed): `false` when nothing is there, an error
/// naming what is there instead (a folder, a device, a link that does not resolve), which "missing"
/// would misname.
fn file_at(p: &Path) -> Result<bool> {
    let bad = |detail: String| Error::Format {
        path: p.to_path_buf(),
        detail,
    };
    match std::fs::symlink_metadata(p) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(bad(format!("cannot read it ({e})"))),
        Ok(_) => {}
    }
    match std::fs::metadata(p) {
        Ok(m) if m.is_file() => Ok(true),
        Ok(m) if m.is_dir() => Err(bad("is a folder, not a file; put the file itself there".into())),
        Ok(_) => Err(bad(
            "is not a regular file (a device, FIFO or socket); put the file itself there".into(),
        )),
        Err(e) => Err(bad(format!(
            "is a link that does not resolve ({e}); point it at the file or put the file itself there"
        ))),
    }
}

fn missing(dir: &Path, file: &str, fix: &str) -> Error {
    Error::MissingFile {
        dir: dir.to_path_buf(),
        file: file.to_string(),
        fix: fix.to_string(),
    }
}

/// config.json and tokenizer_config.json are kilobytes (a chat template and the added tokens of a
/// 150k vocabulary stay under a few megabytes); a larger one, or a device file, is refused before
/// it is read, so a lying file cannot grow memory.
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;

fn read_json(path: &Path) -> Result<Value> {
    let meta = std::fs::metadata(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    if !meta.is_file() || meta.len() > MAX_CONFIG_BYTES {
        return Err(Error::Format {
            path: path.to_path_buf(),
            detail: format!(
                "not a regular file of at most {MAX_CONFIG_BYTES} bytes; restore the original file"
            ),
        });
    }
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| Error::Format {
        path: path.to_path_buf(),
        detail: format!("not valid JSON ({e}); restore the original file"),
    })
}

/// config.json → [`ModelConfig`] for the supported architectures.
pub fn parse_config(v: &Value, path: &Path) -> Result<ModelConfig> {
    let arch = v
        .get("architectures")
        .and_then(|a| a.get(0))
        .and_then(Value::as_str)
        .map(str::to_string)
        .or_else(|| {
            let mt = v.get("model_type").and_then(Value::as_str)?;
            Some(
                match mt {
                    "llama" => "LlamaForCausalLM",
                    "mistral" => "MistralForCausalLM",
                    "qwen2" => "Qwen2ForCausalLM",
                    "qwen3" => "Qwen3ForCausalLM",
                    "gpt2" => "GPT2LMHeadModel",
                    other => other,
                }
                .to_string(),
            )
        })
        .unwrap_or_default();
    let f = Fields { v, path };
    match arch.as_str() {
        "LlamaForCausalLM" | "MistralForCausalLM" | "Qwen2ForCausalLM" | "Qwen3ForCausalLM" => {
            llama_config(&f, &arch)
        }
        "GPT2LMHeadModel" => {
            let act = f.str_or("activation_function", "gelu_new")?;
            if act != "gelu_new" && act != "gelu_pytorch_tanh" {
                return Err(f.unsupported(format!(
                    "activation_function `{act}` (only the tanh GELU gelu_new is implemented)"
                )));
            }
            support::check_hf_fields(v, path, support::HF_GPT2_REFUSED)?;
            support::check_hf_fields(v, path, support::HF_REFUSED)?;
            let hidden = f.usize("n_embd")?;
            let n_heads = f.usize("n_head")?;
            let max_position = match f.opt_usize("n_positions")? {
                Some(p) => p,
                None => f.usize("n_ctx")?,
            };
            Ok(ModelConfig {
                family: Family::Gpt2,
                architecture: arch.clone(),
                vocab_size: f.usize("vocab_size")?,
                hidden_size: hidden,
                n_layers: f.usize("n_layer")?,
                n_heads,
                n_kv_heads: n_heads,
                head_dim: hidden / n_heads.max(1),
                intermediate_size: f.opt_usize("n_inner")?.unwrap_or(hidden.saturating_mul(4)),
                norm_eps: f.f64_or("layer_norm_epsilon", 1e-5)?,
                rope_theta: 0.0,
                max_position,
                tie_embeddings: true,
                qkv_bias: true,
                bos_token_id: f.token_id("bos_token_id"),
                eos_token_id: f.token_id("eos_token_id"),
                add_bos: false,
                qk_norm: false,
                rope_freq_factors: None,
            })
        }
        "" => Err(f.unsupported(format!(
            "config without `architectures` or `model_type`; supported: {}",
            support::HF_ARCHITECTURES.join(", ")
        ))),
        other => Err(f.unsupported(format!(
            "architecture {other}; supported: {}",
            support::HF_ARCHITECTURES.join(", ")
        ))),
    }
}

/// The Llama-family branch of [`parse_config`]: Llama (Llama-3 RoPE scaling included), Mistral,
/// Qwen2 (q/k/v biases), Qwen3 (QK-norm).
fn llama_config(f: &Fields<'_>, arch: &str) -> Result<ModelConfig> {
    let (v, path) = (f.v, f.path);
    let act = f.str_or("hidden_act", "silu")?;
    if act != "silu" {
        return Err(f.unsupported(format!(
            "config.json `hidden_act: {act}` is not implemented; supported: silu"
        )));
    }
    support::check_hf_fields(v, path, support::HF_REFUSED)?;
    let hidden = f.usize("hidden_size")?;
    let n_heads = f.usize("num_attention_heads")?;
    let head_dim = match f.opt_usize("head_dim")? {
        Some(h) => h,
        None => hidden / n_heads.max(1),
    };
    let (rope_theta, rope_freq_factors) = support::hf_rope(v, path, head_dim)?;
    let qkv_bias = arch == "Qwen2ForCausalLM" || f.bool_or("attention_bias", false)?;
    // Sliding-window attention is not modelled: cap the context at the window instead of
    // silently computing full attention beyond it (Mistral always, Qwen2/Qwen3 when enabled or
    // when `layer_types` names a sliding layer).
    let sliding_layers = v
        .get("layer_types")
        .and_then(Value::as_array)
        .is_some_and(|a| a.iter().any(|t| t.as_str() == Some("sliding_attention")));
    let window = match arch {
        "MistralForCausalLM" => f.opt_usize("sliding_window")?,
        "Qwen2ForCausalLM" | "Qwen3ForCausalLM"
            if f.bool_or("use_sliding_window", false)? || sliding_layers =>
        {
            f.opt_usize("sliding_window")?
        }
        _ => None,
    };
    let max_position = f.opt_usize("max_position_embeddings")?.unwrap_or(2048);
    let max_position = window.map_or(max_position, |w| w.min(max_position));
    Ok(ModelConfig {
        family: Family::Llama,
        architecture: arch.to_string(),
        vocab_size: f.usize("vocab_size")?,
        hidden_size: hidden,
        n_layers: f.usize("num_hidden_layers")?,
        n_heads,
        n_kv_heads: f.opt_usize("num_key_value_heads")?.unwrap_or(n_heads),
        head_dim,
        intermediate_size: f.usize("intermediate_size")?,
        norm_eps: f.f64_or("rms_norm_eps", 1e-6)?,
        rope_theta,
        max_position,
        tie_embeddings: f.bool_or("tie_word_embeddings", false)?,
        qkv_bias,
        bos_token_id: f.token_id("bos_token_id"),
        eos_token_id: f.token_id("eos_token_id"),
        add_bos: false,
        qk_norm: arch == "Qwen3ForCausalLM",
        rope_freq_factors,
    })
}

/// `v[key]` read with `get`: `None` when absent or null, an error naming the field and the
/// expected type when present with another type.
pub(crate) fn typed<'v, T>(
    v: &'v Value,
    key: &str,
    path: &Path,
    get: impl Fn(&'v Value) -> Option<T>,
    expected: &str,
) -> Result<Option<T>> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => get(x).map(Some).ok_or_else(|| Error::Format {
            path: path.to_path_buf(),
            detail: format!("field `{key}` is {x}, expected {expected}; fix the config"),
        }),
    }
}

struct Fields<'a> {
    v: &'a Value,
    path: &'a Path,
}

impl Fields<'_> {
    fn unsupported(&self, what: String) -> Error {
        Error::Unsupported {
            path: self.path.to_path_buf(),
            what,
        }
    }

    fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.v.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(x) => x
                .as_u64()
                .map(|n| Some(n as usize))
                .ok_or_else(|| Error::Format {
                    path: self.path.to_path_buf(),
                    detail: format!(
                        "field `{key}` is {x}, expected a whole number; fix the config"
                    ),
                }),
        }
    }

    fn usize(&self, key: &str) -> Result<usize> {
        self.opt_usize(key)?.ok_or_else(|| Error::Format {
            path: self.path.to_path_buf(),
            detail: format!("field `{key}` is missing; use the model's original config.json"),
        })
    }

    // A field of the wrong type is refused: falling back to the default would compute another
    // model than the file describes.
    fn f64_or(&self, key: &str, d: f64) -> Result<f64> {
        Ok(typed(self.v, key, self.path, Value::as_f64, "a number")?.unwrap_or(d))
    }

    fn bool_or(&self, key: &str, d: bool) -> Result<bool> {
        Ok(typed(self.v, key, self.path, Value::as_bool, "true or false")?.unwrap_or(d))
    }

    fn str_or(&self, key: &str, d: &str) -> Result<String> {
        Ok(typed(self.v, key, self.path, Value::as_str, "a string")?
            .unwrap_or(d)
            .to_string())
    }

    /// An id or a list of ids (some configs list several EOS ids): the first one.
    fn token_id(&self, key: &str) -> Option<u32> {
        let x = self.v.get(key)?;
        x.as_u64()
            .or_else(|| x.get(0).and_then(Value::as_u64))
            .map(|n| n as u32)
    }
}

/// Every tensor of the folder's safetensors, converted to f32 (bf16/f16 checkpoints included).
pub fn load_weights(dir: &Path) -> Result<Weights> {
    load_stored_weights(dir)?
        .into_iter()
        .map(|(k, w)| Ok((k, w.to_tensor()?)))
        .collect()
}

/// Every float tensor of the folder's safetensors: f32/f16/bf16 left in the mapped file, other
/// float types converted to f32.
fn load_stored_weights(dir: &Path) -> Result<StoredWeights> {
    let single = dir.join("model.safetensors");
    let index = dir.join("model.safetensors.index.json");
    let files: Vec<PathBuf> = if file_at(&single)? {
        vec![single]
    } else if file_at(&index)? {
        let v = read_json(&index)?;
        let map = v
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| Error::Format {
                path: index.clone(),
                detail: "has no `weight_map` object; restore the original index file".into(),
            })?;
        let mut names = BTreeSet::new();
        for (tensor, file) in map {
            let file = file.as_str().ok_or_else(|| Error::Format {
                path: index.clone(),
                detail: format!("weight_map entry `{tensor}` is not a file name; restore the original index file"),
            })?;
            names.insert(file.to_string());
        }
        let mut files = Vec::new();
        for n in names {
            // a shard is a file of the model folder: an absolute path or `..` would let a
            // downloaded index open any file on the machine
            let plain = Path::new(&n)
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)));
            if !plain {
                return Err(Error::Format {
                    path: index.clone(),
                    detail: format!(
                        "shard `{n}` is not a file name inside the model folder; restore the original index file"
                    ),
                });
            }
            let p = dir.join(&n);
            if !file_at(&p)? {
                return Err(missing(
                    dir,
                    &n,
                    "download every shard listed in model.safetensors.index.json",
                ));
            }
            files.push(p);
        }
        files
    } else if dir.join("pytorch_model.bin").is_file() {
        return Err(Error::Unsupported {
            path: dir.join("pytorch_model.bin"),
            what: "PyTorch pickle weights; convert them to model.safetensors".into(),
        });
    } else {
        return Err(missing(
            dir,
            "model.safetensors (or model.safetensors.index.json)",
            "download the model's safetensors weights into the folder",
        ));
    };
    let mut weights = StoredWeights::new();
    for f in files {
        map_safetensors(&f, &mut weights)?;
    }
    Ok(weights)
}

fn map_safetensors(f: &Path, weights: &mut StoredWeights) -> Result<()> {
    let unreadable = |detail: String| Error::Format {
        path: f.to_path_buf(),
        detail: format!(
            "not a readable safetensors file ({}); it is truncated or corrupt, download it again",
            crate::error::one_line(&detail)
        ),
    };
    let file = std::fs::File::open(f).map_err(|source| Error::Io {
        path: f.to_path_buf(),
        source,
    })?;
    // SAFETY: a read-only mapping; like candle's own mmap loader, the tool does not support a
    // checkpoint rewritten while it runs.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|source| Error::Io {
        path: f.to_path_buf(),
        source,
    })?;
    let map = Arc::new(map);
    let st = SafeTensors::deserialize(&map[..]).map_err(|e| unreadable(e.to_string()))?;
    for (name, view) in st.tensors() {
        // Buffers are not weights: GPT-2's causal-mask `h.N.attn.bias` / `attn.masked_bias`
        // (4 MB each in float checkpoints) and any integer/bool tensor.
        if name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias") {
            continue;
        }
        let kind = match view.dtype() {
            Dtype::F32 => Kind::F32,
            Dtype::F16 => Kind::F16,
            Dtype::BF16 => Kind::Bf16,
            Dtype::BOOL
            | Dtype::U8
            | Dtype::I8
            | Dtype::I16
            | Dtype::U16
            | Dtype::I32
            | Dtype::U32
            | Dtype::I64
            | Dtype::U64 => {
                // an integer buffer (position ids, masks) is not a weight, but a parameter
                // stored as integers (a `.weight`, a GPTQ/AWQ `.qweight`) is one the forward
                // would report as "missing" (issue 38)
                let last = name.rsplit('.').next().unwrap_or("");
                if matches!(last, "weight" | "bias" | "qweight") {
                    return Err(Error::Unsupported {
                        path: f.to_path_buf(),
                        what: format!(
                            "tensor `{name}` is stored as {:?}, an integer type; the reference computes with float weights (F32, F16, BF16), convert the checkpoint to one of them",
                            view.dtype()
                        ),
                    });
                }
                continue;
            }
            _ => {
                // rarer float types (f64, fp8): an f32 copy, as before
                let t = candle_core::safetensors::Load::load(&view, &Device::Cpu)
                    .map_err(|e| unreadable(e.to_string()))?;
                weights.insert(name, Weight::from_tensor(t)?);
                continue;
            }
        };
        let data = view.data();
        // the view borrows the mapping: its offset inside it is the tensor's byte range
        let start = data.as_ptr() as usize - map.as_ptr() as usize;
        let bytes = Bytes::Mapped {
            map: map.clone(),
            start,
            len: data.len(),
        };
        weights.insert(name, Weight::raw(bytes, kind, view.shape().to_vec()));
    }
    Ok(())
}
