//! `genai_config.json`: the fields ONNX Runtime GenAI reads for a decoder model, with its
//! defaults and refusals (docs/onnx-genai.md "Config", contract doc §1, G:cfg). Pure parsing:
//! no ONNX Runtime needed, so the rules are unit-tested in every build.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::{Error, Result};

/// The file every GenAI model folder has.
pub const CONFIG_FILE: &str = "genai_config.json";

/// What kvprobe's host side needs from `genai_config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct GenaiConfig {
    pub path: PathBuf,
    /// `model.type` (`llama`, `phi3`, …; `decoder-pipeline` is refused).
    pub model_type: String,
    /// `model.context_length` (C), required and > 0.
    pub context_length: usize,
    /// `search.max_length` (L): 0 or absent → C; above C is refused (GenAI throws).
    pub max_length: usize,
    /// `search.past_present_share_buffer`.
    pub share_buffer: bool,
    pub vocab_size: usize,
    pub filename: String,
    pub head_size: usize,
    pub hidden_size: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub n_layers: usize,
    pub names: IoNames,
    /// `decoder.sliding_window` (the windowed NPU cache, convention (b)).
    pub window: Option<WindowCfg>,
    /// `model.pad_token_id` (the windowed cache pads the prompt with it).
    pub pad_token_id: u32,
    /// `decoder.session_options.provider_options`: `[{ "<EP>": { key: "string" } }]`.
    pub provider_options: ProviderOptions,
}

/// `decoder.sliding_window` as GenAI reads it (G:cfg): the fields kvprobe's host uses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WindowCfg {
    pub window_size: usize,
    pub pad_value: u8,
}

/// Graph input/output names, GenAI's defaults filled in (G:cfg).
#[derive(Debug, Clone, PartialEq)]
pub struct IoNames {
    pub input_ids: String,
    pub attention_mask: String,
    pub position_ids: String,
    /// Templates with one `%d` (the layer).
    pub past_key: String,
    pub past_value: String,
    pub logits: String,
    pub present_key: String,
    pub present_value: String,
}

impl IoNames {
    pub fn layer(template: &str, l: usize) -> String {
        template.replacen("%d", &l.to_string(), 1)
    }
}

fn bad(path: &Path, detail: impl Into<String>) -> Error {
    Error::Io {
        path: path.to_path_buf(),
        detail: detail.into(),
    }
}

fn uint(v: &Value, key: &str, path: &Path) -> Result<Option<usize>> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x.as_u64().map(|n| Some(n as usize)).ok_or_else(|| {
            bad(
                path,
                format!("`{key}` must be a non-negative integer, found {x}; fix the config"),
            )
        }),
    }
}

/// The largest value a size field may hold: a lying config (a billion layers, a context of
/// 2^60) is refused before anything is sized from it. Generous for every real GenAI model
/// (contexts up to 1 Mi positions, vocabularies up to 16 Mi).
fn ceiling(key: &str) -> usize {
    match key {
        "context_length" | "max_length" | "window_size" => 1 << 20,
        "vocab_size" => 1 << 24,
        _ => 1 << 16,
    }
}

fn need(v: &Value, key: &str, section: &str, path: &Path) -> Result<usize> {
    match uint(v, key, path)? {
        Some(n) if n > ceiling(key) => Err(bad(
            path,
            format!(
                "`{section}.{key}` is {n}, more than the {} kvprobe accepts; the file is damaged, re-export the model",
                ceiling(key)
            ),
        )),
        Some(n) if n > 0 => Ok(n),
        _ => Err(bad(
            path,
            format!("`{section}.{key}` is missing or 0; GenAI needs it (re-export the model)"),
        )),
    }
}

fn name(v: Option<&Value>, key: &str, default: &str) -> String {
    v.and_then(|o| o.get(key))
        .and_then(Value::as_str)
        .unwrap_or(default)
        .to_string()
}

/// The largest genai_config.json read.
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// Options GenAI acts on that kvprobe does not compute, refused in one line naming the option
/// (issue 35): other sessions feeding the decoder (a multimodal model's vision, speech or
/// embedding model) and several sequences at once (beam search, several returned sequences:
/// a batched KV cache GenAI reorders per step). kvprobe drives one greedy sequence through the
/// decoder. Sampling options are not refused: they act on the logits after the graph, and
/// kvprobe compares the logits.
fn not_computed(model: &Value, search: Option<&Value>, path: &Path) -> Result<()> {
    for section in ["vision", "speech", "embedding"] {
        if model.get(section).is_some() {
            return Err(bad(
                path,
                format!("model.{section}: a multimodal model (GenAI runs the {section} session and feeds the decoder its output); kvprobe drives the text decoder alone, from token ids: diagnose a text-only export"),
            ));
        }
    }
    for (key, what) in [
        ("num_beams", "beam search"),
        ("num_return_sequences", "several sequences"),
    ] {
        if let Some(n) = search.map(|s| uint(s, key, path)).transpose()?.flatten() {
            if n > 1 {
                return Err(bad(
                    path,
                    format!("search.{key} {n}: {what} (a batch of {n} sequences whose KV cache GenAI reorders each step); kvprobe computes one greedy sequence only: set {key} to 1"),
                ));
            }
        }
    }
    Ok(())
}

impl GenaiConfig {
    /// Reads `DIR/genai_config.json`. A missing file is one line naming it and the fix.
    pub fn load(dir: &Path) -> Result<GenaiConfig> {
        let path = dir.join(CONFIG_FILE);
        if !dir.is_dir() {
            return Err(bad(
                dir,
                "not a folder; --onnx takes an ONNX Runtime GenAI model folder (model.onnx, genai_config.json, tokenizer.json)",
            ));
        }
        // a genai_config.json is a few KiB: a pipe, a device or a huge file is refused before
        // memory grows
        let bytes = crate::contract::manifest::read_capped(&path, MAX_CONFIG_BYTES).map_err(|e| {
            bad(
                &path,
                format!("{e}; --onnx needs a GenAI model folder with genai_config.json (scripts/export-onnx.sh writes one)"),
            )
        })?;
        let v: Value = serde_json::from_slice(&bytes)
            .map_err(|e| bad(&path, format!("not valid JSON ({e}); fix or re-export it")))?;
        Self::parse(&v, &path)
    }

    pub fn parse(v: &Value, path: &Path) -> Result<GenaiConfig> {
        let model = v
            .get("model")
            .ok_or_else(|| bad(path, "no `model` section; not a GenAI config"))?;
        let dec = model.get("decoder").ok_or_else(|| {
            bad(
                path,
                "no `model.decoder` section; not a GenAI decoder model",
            )
        })?;
        let model_type = name(Some(model), "type", "");
        if model_type == "decoder-pipeline" || dec.get("pipeline").is_some() {
            return Err(bad(
                path,
                "a `decoder-pipeline` model (several sessions); kvprobe drives single-decoder GenAI models only",
            ));
        }
        let context_length = need(model, "context_length", "model", path)?;
        let search = v.get("search");
        not_computed(model, search, path)?;
        let max_length = match search.map(|s| uint(s, "max_length", path)).transpose()? {
            None | Some(None) | Some(Some(0)) => context_length,
            Some(Some(n)) if n > context_length => {
                return Err(bad(
                    path,
                    format!("search.max_length {n} exceeds model.context_length {context_length} (GenAI refuses it); lower max_length"),
                ))
            }
            Some(Some(n)) => n,
        };
        let share_buffer = search
            .and_then(|s| s.get("past_present_share_buffer"))
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let (inputs, outputs) = (dec.get("inputs"), dec.get("outputs"));
        let names = IoNames {
            input_ids: name(inputs, "input_ids", "input_ids"),
            attention_mask: name(inputs, "attention_mask", "attention_mask"),
            position_ids: name(inputs, "position_ids", "position_ids"),
            past_key: name(inputs, "past_key_names", "past_key_values.%d.key"),
            past_value: name(inputs, "past_value_names", "past_key_values.%d.value"),
            logits: name(outputs, "logits", "logits"),
            present_key: name(outputs, "present_key_names", "present.%d.key"),
            present_value: name(outputs, "present_value_names", "present.%d.value"),
        };
        for t in [
            &names.past_key,
            &names.past_value,
            &names.present_key,
            &names.present_value,
        ] {
            if !t.contains("%d") {
                return Err(bad(
                    path,
                    format!("KV name template `{t}` has no `%d` for the layer index; fix decoder.inputs / decoder.outputs"),
                ));
            }
        }
        Ok(GenaiConfig {
            path: path.to_path_buf(),
            model_type,
            context_length,
            max_length,
            share_buffer,
            vocab_size: need(model, "vocab_size", "model", path)?,
            filename: name(Some(dec), "filename", "model.onnx"),
            head_size: need(dec, "head_size", "model.decoder", path)?,
            hidden_size: need(dec, "hidden_size", "model.decoder", path)?,
            n_heads: need(dec, "num_attention_heads", "model.decoder", path)?,
            n_kv_heads: need(dec, "num_key_value_heads", "model.decoder", path)?,
            n_layers: need(dec, "num_hidden_layers", "model.decoder", path)?,
            names,
            window: window(dec, context_length, path)?,
            pad_token_id: match uint(model, "pad_token_id", path)? {
                None => 0,
                Some(id) => u32::try_from(id).map_err(|_| {
                    bad(
                        path,
                        format!("model.pad_token_id {id} is not a token id; fix the config"),
                    )
                })?,
            },
            provider_options: provider_options(dec, path)?,
        })
    }
}

/// `decoder.sliding_window`: W > 1 and C ≥ 2W (G:wkv, PR #2181); right alignment and the sliding
/// KV cache are what GenAI's windowed cache does (the defaults); the other modes are refused.
fn window(dec: &Value, context: usize, path: &Path) -> Result<Option<WindowCfg>> {
    let Some(sw) = dec.get("sliding_window") else {
        return Ok(None);
    };
    let w = need(sw, "window_size", "model.decoder.sliding_window", path)?;
    if w <= 1 || context / 2 < w {
        return Err(bad(
            path,
            format!("sliding_window.window_size {w} with context_length {context}: GenAI needs W > 1 and C >= 2W"),
        ));
    }
    let pad_value = match uint(sw, "pad_value", path)? {
        None => 0,
        Some(v) if v <= 255 => v as u8,
        Some(v) => {
            return Err(bad(
                path,
                format!(
                "sliding_window.pad_value {v} is not a byte (GenAI fills the uint8 cache with it)"
            ),
            ))
        }
    };
    let align = name(Some(sw), "alignment", "right");
    let slide_kv = sw
        .get("slide_key_value_cache")
        .and_then(Value::as_bool)
        .unwrap_or(true);
    let slide_inputs = sw
        .get("slide_inputs")
        .and_then(Value::as_bool)
        .unwrap_or(true);
    if align != "right" || !slide_kv || !slide_inputs {
        return Err(bad(
            path,
            format!("sliding_window with alignment `{align}`, slide_key_value_cache {slide_kv}, slide_inputs {slide_inputs}: kvprobe drives the right-aligned sliding KV cache with sliding inputs only (GenAI's QNN convention)"),
        ));
    }
    Ok(Some(WindowCfg {
        window_size: w,
        pad_value,
    }))
}

/// `(EP name, [(key, value)])` in file order.
pub type ProviderOptions = Vec<(String, Vec<(String, String)>)>;

fn provider_options(dec: &Value, path: &Path) -> Result<ProviderOptions> {
    let Some(list) = dec
        .get("session_options")
        .and_then(|s| s.get("provider_options"))
    else {
        return Ok(Vec::new());
    };
    let err = || {
        bad(
            path,
            "decoder.session_options.provider_options must be [ { \"<EP>\": { \"key\": \"string\" } } ] (GenAI's form)",
        )
    };
    let mut out = Vec::new();
    for entry in list.as_array().ok_or_else(err)? {
        for (ep, opts) in entry.as_object().ok_or_else(err)? {
            let mut kv = Vec::new();
            for (k, val) in opts.as_object().ok_or_else(err)? {
                // GenAI's parser takes string values only
                kv.push((k.clone(), val.as_str().ok_or_else(err)?.to_string()));
            }
            out.push((ep.clone(), kv));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> Value {
        serde_json::json!({
            "model": {"type": "llama", "context_length": 256, "vocab_size": 300,
                "decoder": {"filename": "model.onnx", "head_size": 16, "hidden_size": 64,
                    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
                    "session_options": {"provider_options": [{"qnn": {"backend_path": "libQnnHtp.so"}}]}}},
            "search": {"max_length": 0}
        })
    }

    #[test]
    fn defaults_follow_genai() {
        let c = GenaiConfig::parse(&cfg(), Path::new("g.json")).unwrap();
        assert_eq!(c.max_length, 256, "max_length 0 becomes context_length");
        assert_eq!(c.names.past_key, "past_key_values.%d.key");
        assert_eq!(IoNames::layer(&c.names.present_value, 3), "present.3.value");
        assert!(!c.share_buffer && c.window.is_none());
        assert_eq!(
            c.provider_options,
            vec![(
                "qnn".to_string(),
                vec![("backend_path".to_string(), "libQnnHtp.so".to_string())]
            )]
        );
    }

    #[test]
    fn the_shared_buffer_flag_is_read_from_search() {
        let mut v = cfg();
        v["search"]["past_present_share_buffer"] = true.into();
        assert!(
            GenaiConfig::parse(&v, Path::new("g.json"))
                .unwrap()
                .share_buffer
        );
        v["model"]["decoder"]["past_present_share_buffer"] = false.into();
        assert!(
            GenaiConfig::parse(&v, Path::new("g.json"))
                .unwrap()
                .share_buffer,
            "the flag lives under search (G:cfg), a decoder key does not turn it off"
        );
    }

    #[test]
    fn the_window_section_follows_genai() {
        let mut v = cfg();
        v["model"]["decoder"]["sliding_window"] =
            serde_json::json!({"window_size": 16, "pad_value": 128, "alignment": "right"});
        let c = GenaiConfig::parse(&v, Path::new("g.json")).unwrap();
        assert_eq!(
            c.window,
            Some(WindowCfg {
                window_size: 16,
                pad_value: 128
            })
        );
        v["model"]["decoder"]["sliding_window"]["window_size"] = 129.into();
        let e = GenaiConfig::parse(&v, Path::new("g.json")).unwrap_err();
        assert!(e.to_string().contains("C >= 2W"), "{e}");
        v["model"]["decoder"]["sliding_window"] =
            serde_json::json!({"window_size": 16, "alignment": "left"});
        let e = GenaiConfig::parse(&v, Path::new("g.json")).unwrap_err();
        assert!(e.to_string().contains("alignment `left`"), "{e}");
    }

    /// Options kvprobe does not compute are refused naming the option (issue 35); sampling and
    /// a single beam are not.
    #[test]
    fn options_kvprobe_does_not_compute_are_named() {
        for (edit, needle) in [
            (
                ("search", "num_beams", serde_json::json!(4)),
                "search.num_beams 4",
            ),
            (
                ("search", "num_return_sequences", serde_json::json!(2)),
                "search.num_return_sequences 2",
            ),
            (
                ("model", "vision", serde_json::json!({"filename": "v.onnx"})),
                "model.vision: a multimodal model",
            ),
        ] {
            let mut v = cfg();
            v[edit.0][edit.1] = edit.2;
            let e = GenaiConfig::parse(&v, Path::new("g.json")).unwrap_err();
            assert!(
                e.to_string().starts_with(&format!("g.json: {needle}")),
                "{e}"
            );
            assert_eq!(e.to_string().lines().count(), 1);
        }
        let mut v = cfg();
        v["search"]["num_beams"] = 1.into();
        v["search"]["do_sample"] = true.into();
        GenaiConfig::parse(&v, Path::new("g.json")).unwrap();
    }

    #[test]
    fn refusals_are_one_line_and_name_the_file() {
        let mut v = cfg();
        v["search"]["max_length"] = 512.into();
        let e = GenaiConfig::parse(&v, Path::new("g.json")).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("g.json: search.max_length 512 exceeds"),
            "{e}"
        );
        let mut v = cfg();
        v["model"]["decoder"]["head_size"] = 0.into();
        let e = GenaiConfig::parse(&v, Path::new("g.json")).unwrap_err();
        assert!(e.to_string().contains("model.decoder.head_size"), "{e}");
        let mut v = cfg();
        v["model"]["decoder"]["inputs"] = serde_json::json!({"past_key_names": "pk"});
        let e = GenaiConfig::parse(&v, Path::new("g.json")).unwrap_err();
        assert!(e.to_string().contains("`pk` has no `%d`"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let e = GenaiConfig::load(dir.path()).unwrap_err();
        assert!(
            e.to_string().contains("genai_config.json: cannot read it"),
            "{e}"
        );
        assert_eq!(e.exit_code(), 2);
        assert!(!e.to_string().contains('\n'));
    }
}
