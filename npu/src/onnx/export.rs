//! The reference's float32 Llama-family weights as a Hugging Face folder (config.json,
//! model.safetensors, tokenizer.json), the input of `scripts/export-onnx.py` (issue 22). The ONNX
//! export then holds exactly the weights the candle reference computes with (a GGUF dequantised
//! and its q/k rows un-permuted by the reference loader), so a device-against-reference comparison
//! measures the runtime and the host side, not two dequantisers.

use std::collections::HashMap;
use std::path::Path;

use candle_core::Tensor;
use kvprobe_reference::Model;

use crate::{Error, Result};

fn io(out: &Path, e: impl std::fmt::Display) -> Error {
    Error::Io {
        path: out.to_path_buf(),
        detail: format!("cannot write the weights folder ({e})"),
    }
}

/// Writes `model` (from `source`, named in errors) into `out` as an f32 Hugging Face folder.
pub fn write_hf_folder(model: &Model, out: &Path) -> Result<()> {
    let c = model.config();
    let ex = model.llama_export()?.ok_or_else(|| Error::Io {
        path: model.source().to_path_buf(),
        detail: "not a Llama-family model; the ONNX exporter writes Llama-family decoders only"
            .into(),
    })?;
    std::fs::create_dir_all(out).map_err(|e| io(out, e))?;
    let mut w: HashMap<String, Tensor> = HashMap::new();
    w.insert("model.embed_tokens.weight".into(), ex.embed.to_tensor()?);
    for (i, l) in ex.layers.iter().enumerate() {
        let p = format!("model.layers.{i}");
        w.insert(format!("{p}.input_layernorm.weight"), l.attn_norm.clone());
        w.insert(
            format!("{p}.post_attention_layernorm.weight"),
            l.mlp_norm.clone(),
        );
        for (name, lin) in [
            ("self_attn.q_proj", &l.q),
            ("self_attn.k_proj", &l.k),
            ("self_attn.v_proj", &l.v),
            ("self_attn.o_proj", &l.o),
            ("mlp.gate_proj", &l.gate),
            ("mlp.up_proj", &l.up),
            ("mlp.down_proj", &l.down),
        ] {
            w.insert(format!("{p}.{name}.weight"), lin.to_tensor()?);
            if let Some(b) = &lin.b {
                w.insert(format!("{p}.{name}.bias"), b.clone());
            }
        }
    }
    w.insert("model.norm.weight".into(), ex.final_norm.clone());
    // always written, tied or not: the exporter then needs no tie rule
    w.insert("lm_head.weight".into(), ex.lm_head.to_tensor()?);
    candle_core::safetensors::save(&w, out.join("model.safetensors"))?;
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads,
        "num_key_value_heads": c.n_kv_heads,
        "head_dim": c.head_dim,
        "rms_norm_eps": ex.norm_eps,
        "rope_theta": c.rope_theta,
        "max_position_embeddings": c.max_position,
        "vocab_size": c.vocab_size,
        "tie_word_embeddings": false,
        "bos_token_id": c.bos_token_id,
        "eos_token_id": c.eos_token_id,
        "add_bos_token": c.add_bos,
        "torch_dtype": "float32",
        // the reference's own f32 inv_freq, so the export's RoPE tables use the same numbers
        "kvprobe_inv_freq": ex.inv_freq,
        "kvprobe_source": model.source().display().to_string(),
    });
    let text = serde_json::to_string_pretty(&config).map_err(|e| io(out, e))?;
    std::fs::write(out.join("config.json"), text).map_err(|e| io(out, e))?;
    model
        .tokenizer()
        .inner()
        .save(out.join("tokenizer.json"), false)
        .map_err(|e| io(out, e))
}
