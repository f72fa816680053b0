//! `hailo-config.json` as the genai server reads it (contract §3.1), with the keys it knows so
//! the linter can flag the ones it silently ignores (finding F5).

use kvprobe_schema::InputRole;
use serde::Serialize;
use serde_json::Value;

pub const KNOWN_TOP_KEYS: &[&str] = &[
    "eos_token_id",
    "chat_template",
    "stop_token_id",
    "begin_of_reasoning_token_id",
    "end_of_reasoning_token_id",
    "default_generation_params",
    "pre_process_params",
    "input_layers_names_suffixes",
];
pub const KNOWN_GENERATION_KEYS: &[&str] = &[
    "max_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "repetition_penalty",
    "do_sample",
];
pub const KNOWN_PRE_PROCESS_KEYS: &[&str] = &[
    "kv_cache_size",
    "num_attention_heads",
    "num_key_value_heads",
    "prefill_input_tokens_count",
    "mrope_section",
];
/// Keys seen in the wild that tooling writes but the server does not read; harmless metadata.
pub const TOLERATED_TOP_KEYS: &[&str] = &["model_name"];

/// The six input suffixes and their server defaults (§3.1).
pub const SUFFIX_KEYS: [(&str, InputRole, &str); 6] = [
    ("embeddings", InputRole::Embeddings, "input_layer1"),
    ("attention_mask", InputRole::AttentionMask, "input_layer2"),
    ("pe_q_cos", InputRole::PeQCos, "input_layer3"),
    ("pe_q_sin", InputRole::PeQSin, "input_layer4"),
    ("pe_k_cos", InputRole::PeKCos, "input_layer5"),
    ("pe_k_sin", InputRole::PeKSin, "input_layer6"),
];

pub const DEFAULT_KV_CACHE_SIZE: u64 = 2048;
pub const DEFAULT_NUM_ATTENTION_HEADS: u64 = 12;
pub const DEFAULT_NUM_KV_HEADS: u64 = 2;
pub const DEFAULT_PREFILL_TOKENS: u64 = 96;

#[derive(Debug, Clone, Serialize)]
pub struct GenaiConfig {
    pub eos_token_id: Option<i64>,
    /// Effective values (config or server default) and whether the config gave them.
    pub kv_cache_size: (u64, bool),
    pub num_attention_heads: (u64, bool),
    pub num_key_value_heads: (u64, bool),
    pub prefill_input_tokens_count: (u64, bool),
    pub suffixes: Vec<(InputRole, String)>,
    /// Dotted paths of keys the server does not read.
    pub unknown_keys: Vec<String>,
    /// Keys present with a type the server cannot read (dotted path, expected type).
    pub bad_types: Vec<(String, &'static str)>,
    pub top_level_keys: Vec<String>,
}

pub fn parse(bytes: &[u8]) -> std::result::Result<GenaiConfig, String> {
    let v: Value = serde_json::from_slice(bytes).map_err(|e| format!("not valid JSON: {e}"))?;
    let Value::Object(top) = &v else {
        return Err("top level is not a JSON object".into());
    };
    let mut unknown_keys = Vec::new();
    let mut bad_types = Vec::new();
    for k in top.keys() {
        if !KNOWN_TOP_KEYS.contains(&k.as_str()) && !TOLERATED_TOP_KEYS.contains(&k.as_str()) {
            unknown_keys.push(k.clone());
        }
    }
    let section = |name: &str, known: &[&str], unknown: &mut Vec<String>| {
        if let Some(Value::Object(m)) = top.get(name) {
            for k in m.keys() {
                if !known.contains(&k.as_str()) {
                    unknown.push(format!("{name}.{k}"));
                }
            }
        }
    };
    section(
        "default_generation_params",
        KNOWN_GENERATION_KEYS,
        &mut unknown_keys,
    );
    section(
        "pre_process_params",
        KNOWN_PRE_PROCESS_KEYS,
        &mut unknown_keys,
    );
    let suffix_known: Vec<&str> = SUFFIX_KEYS.iter().map(|s| s.0).collect();
    section(
        "input_layers_names_suffixes",
        &suffix_known,
        &mut unknown_keys,
    );

    let eos_token_id = match top.get("eos_token_id") {
        None => None,
        Some(x) => match x.as_i64() {
            Some(i) => Some(i),
            None => {
                bad_types.push(("eos_token_id".into(), "integer"));
                None
            }
        },
    };
    let pre = top.get("pre_process_params");
    let mut num = |key: &str, default: u64| -> (u64, bool) {
        match pre.and_then(|p| p.get(key)) {
            None => (default, false),
            Some(x) => match x.as_u64().filter(|&n| n <= u64::from(u32::MAX)) {
                Some(n) => (n, true),
                None => {
                    bad_types.push((
                        format!("pre_process_params.{key}"),
                        "unsigned 32-bit integer",
                    ));
                    (default, false)
                }
            },
        }
    };
    let kv_cache_size = num("kv_cache_size", DEFAULT_KV_CACHE_SIZE);
    let num_attention_heads = num("num_attention_heads", DEFAULT_NUM_ATTENTION_HEADS);
    let num_key_value_heads = num("num_key_value_heads", DEFAULT_NUM_KV_HEADS);
    let prefill_input_tokens_count = num("prefill_input_tokens_count", DEFAULT_PREFILL_TOKENS);
    let sfx = top.get("input_layers_names_suffixes");
    let suffixes = SUFFIX_KEYS
        .iter()
        .map(|(key, role, default)| {
            let s = match sfx.and_then(|m| m.get(*key)) {
                Some(Value::String(s)) => s.clone(),
                Some(_) => {
                    bad_types.push((format!("input_layers_names_suffixes.{key}"), "string"));
                    (*default).to_string()
                }
                None => (*default).to_string(),
            };
            (*role, s)
        })
        .collect();
    Ok(GenaiConfig {
        eos_token_id,
        kv_cache_size,
        num_attention_heads,
        num_key_value_heads,
        prefill_input_tokens_count,
        suffixes,
        unknown_keys,
        bad_types,
        top_level_keys: top.keys().cloned().collect(),
    })
}

/// The server's suffix rule (§3.1): the first name in sorted order that ends with the suffix.
pub fn resolve_suffix<'a>(
    names: impl IntoIterator<Item = &'a str>,
    suffix: &str,
) -> Option<&'a str> {
    let mut v: Vec<&str> = names.into_iter().filter(|n| n.ends_with(suffix)).collect();
    v.sort_unstable();
    v.first().copied()
}
