//! The KV inputs a graph declares, checked against genai_config.json before any run: element
//! type and [B, H, S, D] (or the windowed cache's [H, 1, D, S] / [H, 1, S, D]) dims.

use std::path::Path;

use ort::value::{TensorElementType, ValueType};

use super::config::GenaiConfig;
use crate::{Error, Result};

pub(super) fn check_kv(
    v: &ValueType,
    name: &str,
    cfg: &GenaiConfig,
    model: &Path,
    key: bool,
) -> Result<()> {
    let bad = |what: String| Error::Io {
        path: cfg.path.clone(),
        detail: format!("{what}; genai_config.json and {} disagree", model.display()),
    };
    if let Some(w) = &cfg.window {
        return check_window_kv(v, name, cfg, w.pad_value, key).map_err(bad);
    }
    if !matches!(
        v.tensor_type(),
        Some(TensorElementType::Float32 | TensorElementType::Float16 | TensorElementType::Bfloat16)
    ) {
        return Err(bad(format!(
            "KV input `{name}` is {:?}; kvprobe drives a float32, float16 or bfloat16 cache (a quantised KV cache is not computed)",
            v.tensor_type()
        )));
    }
    let dims: Vec<i64> = v.tensor_shape().map(|s| s.to_vec()).unwrap_or_default();
    if dims.len() != 4 {
        return Err(bad(format!(
            "KV input `{name}` has {} dims, GenAI's are [B, H, S, D]",
            dims.len()
        )));
    }
    let (h, d) = (dims[1], dims[3]);
    if (h >= 0 && h as usize != cfg.n_kv_heads) || (d >= 0 && d as usize != cfg.head_size) {
        return Err(bad(format!(
            "KV input `{name}` is [B, {h}, S, {d}] but the config says num_key_value_heads {} and head_size {}",
            cfg.n_kv_heads, cfg.head_size
        )));
    }
    Ok(())
}

/// Convention (b): uint8 (GenAI's windowed cache needs it, G:wkv) or float32 (kvprobe's fp32
/// variant, which GenAI itself refuses), `[H, 1, D, S]` for K and `[H, 1, S, D]` for V.
fn check_window_kv(
    v: &ValueType,
    name: &str,
    cfg: &GenaiConfig,
    pad_value: u8,
    key: bool,
) -> std::result::Result<(), String> {
    match v.tensor_type() {
        Some(TensorElementType::Uint8) => {}
        Some(TensorElementType::Float32) if pad_value == 0 => {}
        t => {
            return Err(format!(
                "windowed KV input `{name}` is {t:?}; the windowed cache is uint8 (or float32 with pad_value 0)"
            ))
        }
    }
    let dims: Vec<i64> = v.tensor_shape().map(|s| s.to_vec()).unwrap_or_default();
    let want_d = if key { 2 } else { 3 };
    let ok = dims.len() == 4
        && (dims[0] < 0 || dims[0] as usize == cfg.n_kv_heads)
        && (dims[1] < 0 || dims[1] == 1)
        && (dims[want_d] < 0 || dims[want_d] as usize == cfg.head_size);
    if !ok {
        return Err(format!(
            "windowed KV input `{name}` is {dims:?}, GenAI's windowed cache is {} with num_key_value_heads {} and head_size {}",
            if key { "[H, 1, D, S]" } else { "[H, 1, S, D]" },
            cfg.n_kv_heads,
            cfg.head_size
        ));
    }
    Ok(())
}
