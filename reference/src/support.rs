//! What the reference computes, as data: the architectures it loads and every config.json field
//! and GGUF metadata key that changes the math, each either implemented (read by the loaders) or
//! refused here with one line naming the file, the key and what is supported (issue 21 "Refuse
//! what you do not compute"). A silently wrong reference is the one failure this tool must not
//! have, so the GGUF side is a whitelist: a key under `<arch>.` that is not listed is refused.

use std::path::Path;

use serde_json::Value;

use crate::{Error, Result};

/// Hugging Face `architectures[0]` values the loader accepts.
pub const HF_ARCHITECTURES: &[&str] = &[
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "GPT2LMHeadModel",
];

/// GGUF `general.architecture` values the loader accepts.
pub const GGUF_ARCHITECTURES: &[&str] = &["llama", "qwen2", "qwen3"];

/// Which values of a field leave the math as we compute it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Neutral {
    /// absent, null or false
    False,
    /// absent, null, or the number 1
    One,
    /// absent or null
    Null,
    /// absent, null, 0 or an empty list
    Zero,
    /// absent, null or true
    True,
}

impl Neutral {
    fn holds(self, v: Option<&Value>) -> bool {
        let Some(v) = v.filter(|v| !v.is_null()) else {
            return true;
        };
        match self {
            Neutral::False => v.as_bool() == Some(false),
            Neutral::True => v.as_bool() == Some(true),
            Neutral::One => v.as_f64() == Some(1.0),
            Neutral::Null => false,
            Neutral::Zero => v.as_f64() == Some(0.0) || v.as_array().is_some_and(Vec::is_empty),
        }
    }

    fn says(self) -> &'static str {
        match self {
            Neutral::False => "absent or false",
            Neutral::One => "absent or 1",
            Neutral::Null => "absent or null",
            Neutral::Zero => "absent or 0",
            Neutral::True => "absent or true",
        }
    }
}

/// config.json fields that change the math and are not implemented: `(field, neutral values,
/// what it would do)`. `rope_scaling` / `rope_parameters` (llama3 implemented), `hidden_act`,
/// `sliding_window` (caps the context) and the GPT-2 options are handled by the loader itself.
pub const HF_REFUSED: &[(&str, Neutral, &str)] = &[
    (
        "partial_rotary_factor",
        Neutral::One,
        "partial rotary embedding",
    ),
    ("rotary_pct", Neutral::One, "partial rotary embedding"),
    (
        "attn_logit_softcapping",
        Neutral::Null,
        "attention logit soft-capping",
    ),
    (
        "final_logit_softcapping",
        Neutral::Null,
        "final logit soft-capping",
    ),
    (
        "query_pre_attn_scalar",
        Neutral::Null,
        "a non-standard attention scale",
    ),
    (
        "attention_multiplier",
        Neutral::Null,
        "a non-standard attention scale",
    ),
    ("embedding_multiplier", Neutral::One, "scaled embeddings"),
    ("residual_multiplier", Neutral::One, "scaled residuals"),
    ("logits_scaling", Neutral::One, "scaled logits"),
    ("mlp_bias", Neutral::False, "MLP biases"),
    ("use_qk_norm", Neutral::False, "QK-norm outside Qwen3"),
    ("qk_layernorm", Neutral::False, "QK-norm outside Qwen3"),
    (
        "use_parallel_residual",
        Neutral::False,
        "parallel residual blocks",
    ),
    ("parallel_attn", Neutral::False, "parallel residual blocks"),
    ("num_experts", Neutral::Zero, "mixture of experts"),
    ("num_local_experts", Neutral::Zero, "mixture of experts"),
    (
        "dual_chunk_attention_config",
        Neutral::Null,
        "dual-chunk attention",
    ),
    ("no_rope_layers", Neutral::Null, "layers without RoPE"),
    ("add_cross_attention", Neutral::False, "cross-attention"),
];

/// GPT-2-only options (config.json) that change the math.
pub const HF_GPT2_REFUSED: &[(&str, Neutral, &str)] = &[
    (
        "scale_attn_weights",
        Neutral::True,
        "unscaled attention scores",
    ),
    (
        "scale_attn_by_inverse_layer_idx",
        Neutral::False,
        "per-layer attention scale",
    ),
    (
        "reorder_and_upcast_attn",
        Neutral::False,
        "reordered attention",
    ),
];

fn unsupported(path: &Path, what: String) -> Error {
    Error::Unsupported {
        path: path.to_path_buf(),
        what,
    }
}

/// Refuse every listed field that is set to a value we do not compute.
pub fn check_hf_fields(v: &Value, path: &Path, table: &[(&str, Neutral, &str)]) -> Result<()> {
    for (key, neutral, what) in table {
        let got = v.get(*key);
        if !neutral.holds(got) {
            let shown = got.map(Value::to_string).unwrap_or_default();
            return Err(unsupported(
                path,
                format!(
                    "config.json `{key}: {shown}` ({what}) is not implemented; supported: `{key}` {}",
                    neutral.says()
                ),
            ));
        }
    }
    Ok(())
}

/// The RoPE description of a Llama-family config.json: `rope_theta` and the per-frequency
/// divisors of `rope_scaling` (or transformers' newer `rope_parameters`). Only `default` and
/// `llama3` are computed; any other type, or an unknown parameter, is refused.
pub fn hf_rope(v: &Value, path: &Path, head_dim: usize) -> Result<(f64, Option<Vec<f32>>)> {
    let params = v.get("rope_parameters").filter(|x| !x.is_null());
    let scaling = v.get("rope_scaling").filter(|x| !x.is_null()).or(params);
    let number = |obj: &Value| crate::hf::typed(obj, "rope_theta", path, Value::as_f64, "a number");
    let theta = match number(v)? {
        Some(t) => Some(t),
        None => params.map(number).transpose()?.flatten(),
    }
    .unwrap_or(10_000.0);
    if !(theta.is_finite() && theta > 0.0) {
        return Err(Error::Format {
            path: path.to_path_buf(),
            detail: format!(
                "field `rope_theta` is {theta}, expected a positive number; fix the config"
            ),
        });
    }
    let Some(s) = scaling else {
        return Ok((theta, None));
    };
    let Some(obj) = s.as_object() else {
        return Err(unsupported(path, format!("config.json `rope_scaling: {s}` is not an object; supported: null, rope_type default or llama3")));
    };
    let kind = obj
        .get("rope_type")
        .or_else(|| obj.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let allowed: &[&str] = match kind {
        "default" => &["rope_type", "type", "rope_theta"],
        "llama3" => &[
            "rope_type",
            "type",
            "rope_theta",
            "factor",
            "low_freq_factor",
            "high_freq_factor",
            "original_max_position_embeddings",
        ],
        other => {
            return Err(unsupported(
                path,
                format!("config.json `rope_scaling` of type `{other}` is not implemented; supported: none (default) and llama3"),
            ))
        }
    };
    if let Some(extra) = obj.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(unsupported(
            path,
            format!("config.json `rope_scaling.{extra}` (with rope_type {kind}) is not implemented; supported keys: {}", allowed.join(", ")),
        ));
    }
    if kind == "default" {
        return Ok((theta, None));
    }
    let num = |key: &str| -> Result<f64> {
        obj.get(key)
            .and_then(Value::as_f64)
            .filter(|x| x.is_finite() && *x > 0.0)
            .ok_or_else(|| Error::Format {
                path: path.to_path_buf(),
                detail: format!("`rope_scaling.{key}` is missing or not a positive number (llama3 needs factor, low_freq_factor, high_freq_factor, original_max_position_embeddings); use the model's original config.json"),
            })
    };
    let (factor, low, high) = (
        num("factor")?,
        num("low_freq_factor")?,
        num("high_freq_factor")?,
    );
    let original = num("original_max_position_embeddings")?;
    if high <= low {
        return Err(Error::Format {
            path: path.to_path_buf(),
            detail: format!("`rope_scaling` high_freq_factor {high} must exceed low_freq_factor {low}; use the model's original config.json"),
        });
    }
    let f = crate::llama::llama3_factors(theta, head_dim, factor, low, high, original);
    Ok((theta, Some(f)))
}

/// How a GGUF `<arch>.` key is treated.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GgufKey {
    /// read by the loader (or harmless to the math)
    Used,
    /// accepted only at its neutral value (a number: 0 or 1 as given; a string: "none")
    NeutralNumber(f64),
    NeutralString(&'static str),
}

/// Every `<arch>.` metadata key the GGUF loader accepts, and how. Anything else under the
/// architecture's prefix is refused: an unknown key may change the math.
pub const GGUF_KEYS: &[(&str, GgufKey)] = &[
    ("block_count", GgufKey::Used),
    ("context_length", GgufKey::Used),
    ("embedding_length", GgufKey::Used),
    ("feed_forward_length", GgufKey::Used),
    ("vocab_size", GgufKey::Used),
    ("attention.head_count", GgufKey::Used),
    ("attention.head_count_kv", GgufKey::Used),
    ("attention.layer_norm_rms_epsilon", GgufKey::Used),
    // checked against the head dimension by the loader
    ("attention.key_length", GgufKey::Used),
    ("attention.value_length", GgufKey::Used),
    ("rope.dimension_count", GgufKey::Used),
    ("rope.freq_base", GgufKey::Used),
    ("rope.scaling.type", GgufKey::NeutralString("none")),
    ("rope.scaling.factor", GgufKey::NeutralNumber(1.0)),
    ("rope.scale_linear", GgufKey::NeutralNumber(1.0)),
    ("rope.scaling.attn_factor", GgufKey::NeutralNumber(1.0)),
    // meaningful only with a scaling type, which is refused above
    ("rope.scaling.original_context_length", GgufKey::Used),
    ("rope.scaling.finetuned", GgufKey::Used),
    ("expert_count", GgufKey::NeutralNumber(0.0)),
    ("expert_used_count", GgufKey::NeutralNumber(0.0)),
];

/// Check the `<arch>.` keys of a GGUF file's metadata; `number` / `string` read a key leniently.
pub fn check_gguf_keys<'a>(
    keys: impl Iterator<Item = &'a String>,
    arch: &str,
    path: &Path,
    number: impl Fn(&str) -> Option<f64>,
    string: impl Fn(&str) -> Option<String>,
) -> Result<()> {
    let prefix = format!("{arch}.");
    let mut keys: Vec<&String> = keys.filter(|k| k.starts_with(&prefix)).collect();
    keys.sort();
    for key in keys {
        let short = &key[prefix.len()..];
        let Some((_, rule)) = GGUF_KEYS.iter().find(|(k, _)| *k == short) else {
            return Err(unsupported(
                path,
                format!("GGUF metadata `{key}` is not a key this tool computes with (it may change the math); supported {prefix}* keys: {}", GGUF_KEYS.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", ")),
            ));
        };
        let neutral = match rule {
            GgufKey::Used => true,
            // 0 is llama.cpp's "unset" for the scale factors
            GgufKey::NeutralNumber(n) => {
                number(key).is_none_or(|x| x == *n || (*n == 1.0 && x == 0.0))
            }
            GgufKey::NeutralString(s) => string(key).is_none_or(|x| x == *s || x.is_empty()),
        };
        if !neutral {
            let shown = string(key)
                .or_else(|| number(key).map(|x| x.to_string()))
                .unwrap_or_default();
            let want = match rule {
                GgufKey::NeutralNumber(n) => format!("{n}"),
                GgufKey::NeutralString(s) => (*s).to_string(),
                GgufKey::Used => String::new(),
            };
            return Err(unsupported(
                path,
                format!("GGUF metadata `{key} = {shown}` is not implemented (only `{want}`); for Llama-3 RoPE scaling the file must carry the `rope_freqs` tensor instead"),
            ));
        }
    }
    Ok(())
}
