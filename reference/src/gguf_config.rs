//! GGUF metadata → [`ModelConfig`] for the architectures the reference computes (`llama`,
//! `qwen2`, `qwen3`; keys are `<arch>.*`). Every `<arch>.` key is first checked against the
//! whitelist in [`crate::support`]; RoPE scaling arrives later, as the `rope_freqs` tensor.

use candle_core::quantized::gguf_file::{Content, Value};

use crate::gguf_meta::Meta;
use crate::{support, Error, Family, ModelConfig, Result};

/// The architecture named by `general.architecture`, refused unless we compute it.
pub(crate) fn architecture(meta: &Meta<'_>) -> Result<String> {
    let arch = meta.string("general.architecture")?;
    if !support::GGUF_ARCHITECTURES.contains(&arch.as_str()) {
        return Err(Error::Unsupported {
            path: meta.path.to_path_buf(),
            what: format!(
                "GGUF architecture `{arch}`; supported: {}; use one of those or the model's Hugging Face folder",
                support::GGUF_ARCHITECTURES.join(", ")
            ),
        });
    }
    support::check_gguf_keys(
        meta.map.keys(),
        &arch,
        meta.path,
        |k| meta.opt_f64(k),
        |k| meta.opt_string(k),
    )?;
    Ok(arch)
}

pub(crate) fn config_from_meta(
    meta: &Meta<'_>,
    content: &Content,
    arch: &str,
) -> Result<ModelConfig> {
    let path = meta.path;
    let key = |k: &str| format!("{arch}.{k}");
    let hidden_size = meta.usize(&key("embedding_length"))?;
    let n_heads = meta.usize(&key("attention.head_count"))?;
    let n_kv_heads = meta
        .opt_i64(&key("attention.head_count_kv"))
        .map(|v| v as usize)
        .unwrap_or(n_heads);
    if n_heads == 0 || n_kv_heads == 0 || n_heads % n_kv_heads != 0 {
        return Err(Error::Format {
            path: path.to_path_buf(),
            detail: format!("GGUF head counts {n_heads} / {n_kv_heads} (kv) are inconsistent; convert the model again"),
        });
    }
    let head_dim = match meta.opt_i64(&key("attention.key_length")) {
        Some(k) => k as usize,
        // without a key length the heads split the embedding: a count that does not divide it
        // is the file's error, not a partial RoPE further down
        None if !hidden_size.is_multiple_of(n_heads) => {
            return Err(Error::Format {
                path: path.to_path_buf(),
                detail: format!(
                    "GGUF metadata `{}` = {n_heads} heads do not divide `{}` = {hidden_size}; convert the model again",
                    key("attention.head_count"),
                    key("embedding_length")
                ),
            });
        }
        None => hidden_size / n_heads,
    };
    let unsupported = |what: String| Error::Unsupported {
        path: path.to_path_buf(),
        what,
    };
    if let Some(vl) = meta.opt_i64(&key("attention.value_length")) {
        if vl as usize != head_dim {
            return Err(unsupported(format!(
                "GGUF metadata `{}` = {vl} differs from the key length {head_dim}; supported: equal key and value head sizes",
                key("attention.value_length")
            )));
        }
    }
    if let Some(rd) = meta.opt_i64(&key("rope.dimension_count")) {
        if rd as usize != head_dim {
            return Err(unsupported(format!(
                "GGUF metadata `{}` = {rd} (partial RoPE) differs from the head dim {head_dim}; supported: RoPE over the whole head",
                key("rope.dimension_count")
            )));
        }
    }
    // The embedding table is the authority on the vocabulary (<arch>.vocab_size is optional).
    let vocab_size = match content
        .tensor_infos
        .get("token_embd.weight")
        .map(|i| i.shape.dims())
    {
        Some(&[vocab, _]) => vocab,
        Some(dims) => {
            return Err(Error::BadTensor {
                path: path.to_path_buf(),
                name: "token_embd.weight".into(),
                detail: format!(
                    "has {} dimensions where a matrix [vocab, hidden] is expected",
                    dims.len()
                ),
            })
        }
        None => {
            return Err(Error::MissingTensor {
                path: path.to_path_buf(),
                name: "token_embd.weight".into(),
            })
        }
    };
    check_rows_per_token(meta, vocab_size)?;
    let tokenizer_model = meta.opt_string("tokenizer.ggml.model").unwrap_or_default();
    // llama.cpp's defaults when the key is absent: SentencePiece vocabularies add BOS, BPE ones do not.
    let add_bos = meta
        .opt_bool("tokenizer.ggml.add_bos_token")
        .unwrap_or(tokenizer_model == "llama");
    let qkv_bias = content.tensor_infos.contains_key("blk.0.attn_q.bias");
    let eps_key = key("attention.layer_norm_rms_epsilon");
    Ok(ModelConfig {
        family: Family::Llama,
        architecture: format!("gguf:{arch}"),
        vocab_size,
        hidden_size,
        n_layers: meta.usize(&key("block_count"))?,
        n_heads,
        n_kv_heads,
        head_dim,
        intermediate_size: meta.usize(&key("feed_forward_length"))?,
        norm_eps: meta
            .opt_f64(&eps_key)
            .ok_or_else(|| meta.missing(&eps_key))?,
        rope_theta: meta.opt_f64(&key("rope.freq_base")).unwrap_or(10_000.0),
        max_position: meta.usize(&key("context_length"))?,
        tie_embeddings: !content.tensor_infos.contains_key("output.weight"),
        qkv_bias,
        bos_token_id: meta
            .opt_i64("tokenizer.ggml.bos_token_id")
            .map(|v| v as u32),
        eos_token_id: meta
            .opt_i64("tokenizer.ggml.eos_token_id")
            .map(|v| v as u32),
        add_bos,
        qk_norm: arch == "qwen3",
        // set from the `rope_freqs` tensor when the file has one
        rope_freq_factors: None,
    })
}

/// llama.cpp takes the vocabulary from the token list and needs an embedding row per token:
/// a mismatch read as the vocabulary would blame output.weight, the tensor that matches
/// (issue 38); an empty list is the tokenizer's to name.
fn check_rows_per_token(meta: &Meta<'_>, rows: usize) -> Result<()> {
    if let Some(Value::Array(tokens)) = meta.get("tokenizer.ggml.tokens") {
        if !tokens.is_empty() && tokens.len() != rows {
            return Err(Error::Format {
                path: meta.path.to_path_buf(),
                detail: format!(
                    "tensor `token_embd.weight` has {rows} rows but the vocabulary (`tokenizer.ggml.tokens`) has {} tokens; llama.cpp needs one row per token, convert the model again",
                    tokens.len()
                ),
            });
        }
    }
    Ok(())
}
