//! A `tokenizers::Tokenizer` built from GGUF `tokenizer.ggml.*` metadata.
//!
//! candle's own GGUF tokenizer helper adds a prefix space for `pre = "smollm"` and reads the wrong
//! unknown-token key (dependency notes), so the pipeline is assembled here from its parts:
//! byte-level BPE from `tokens` + `merges`, the pre-tokenizer that `tokenizer.ggml.pre` names, a
//! byte-level decoder, and control tokens (`token_type == 3`) as special tokens matched whole.

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::Value;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::SplitDelimiterBehavior;
use tokenizers::{AddedToken, Tokenizer};

use crate::error::one_line;
use crate::gguf_meta::{value_i64, Meta};
use crate::{Error, Result, TextTokenizer};

/// llama.cpp's token types (`llama_token_type`).
const TOKEN_TYPE_USER_DEFINED: i64 = 4;
const TOKEN_TYPE_CONTROL: i64 = 3;

/// Build the tokenizer of a GGUF file from its metadata map.
pub fn from_metadata(map: &HashMap<String, Value>, path: &Path) -> Result<TextTokenizer> {
    let meta = Meta { map, path };
    let err = |detail: String| Error::Tokenizer {
        path: path.to_path_buf(),
        detail,
    };
    let model = meta.opt_string("tokenizer.ggml.model").unwrap_or_default();
    if model != "gpt2" {
        return Err(Error::Unsupported {
            path: path.to_path_buf(),
            what: format!(
                "GGUF tokenizer model `{model}` (only byte-level BPE, `gpt2`, is supported); use the model's Hugging Face folder with its tokenizer.json"
            ),
        });
    }
    let pre = meta
        .opt_string("tokenizer.ggml.pre")
        .unwrap_or_else(|| "default".into());
    let pre_tokenizer = pre_tokenizer_for(&pre).ok_or_else(|| Error::Unsupported {
        path: path.to_path_buf(),
        what: format!(
            "GGUF pre-tokenizer `{pre}` (supported: smollm, gpt2, default, qwen2, llama-bpe); use the model's Hugging Face folder with its tokenizer.json"
        ),
    })?;

    let tokens = string_array(&meta, "tokenizer.ggml.tokens")
        .ok_or_else(|| err("metadata `tokenizer.ggml.tokens` is missing; the GGUF has no vocabulary, convert it again".into()))?;
    let merges = string_array(&meta, "tokenizer.ggml.merges")
        .ok_or_else(|| err("metadata `tokenizer.ggml.merges` is missing; a BPE GGUF needs merges, convert it again".into()))?;
    let types: Vec<i64> = match meta.get("tokenizer.ggml.token_type") {
        Some(Value::Array(v)) => v.iter().map(|x| value_i64(x).unwrap_or(1)).collect(),
        _ => vec![1; tokens.len()],
    };

    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    let mut merge_pairs = Vec::with_capacity(merges.len());
    for m in &merges {
        let (a, b) = m
            .split_once(' ')
            .ok_or_else(|| err(format!("merge `{m}` is not two tokens separated by a space; the GGUF is corrupt, convert it again")))?;
        merge_pairs.push((a.to_string(), b.to_string()));
    }
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merge_pairs)
        .build()
        .map_err(|e| {
            err(format!(
                "building BPE failed ({}); convert the GGUF again",
                one_line(&e.to_string())
            ))
        })?;

    let mut tok = Tokenizer::new(bpe);
    tok.with_pre_tokenizer(Some(pre_tokenizer));
    tok.with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevel::default())));

    // Control tokens (<|im_start|>, ...) are matched whole in the text and kept when decoding, as
    // llama.cpp does with `parse_special`; user-defined tokens are matched whole but not special.
    let specials: Vec<AddedToken> = tokens
        .iter()
        .zip(types.iter())
        .filter(|(_, t)| **t == TOKEN_TYPE_CONTROL)
        .map(|(s, _)| AddedToken::from(s.clone(), true))
        .collect();
    let user: Vec<AddedToken> = tokens
        .iter()
        .zip(types.iter())
        .filter(|(_, t)| **t == TOKEN_TYPE_USER_DEFINED)
        .map(|(s, _)| AddedToken::from(s.clone(), false))
        .collect();
    tok.add_special_tokens(specials)
        .map_err(|e| err(one_line(&e.to_string())))?;
    tok.add_tokens(user)
        .map_err(|e| err(one_line(&e.to_string())))?;

    // llama.cpp's default for BPE vocabularies when the key is absent: no BOS.
    let add_bos = meta
        .opt_bool("tokenizer.ggml.add_bos_token")
        .unwrap_or(false);
    let bos = meta
        .opt_i64("tokenizer.ggml.bos_token_id")
        .and_then(|v| u32::try_from(v).ok());
    Ok(TextTokenizer::from_tokenizer(tok, add_bos, bos).with_source(path))
}

/// The pre-tokenizer llama.cpp applies for a `tokenizer.ggml.pre` name.
fn pre_tokenizer_for(pre: &str) -> Option<PreTokenizerWrapper> {
    // Byte-level with GPT-2's split regex and no prefix space (`add_space_prefix` is false for
    // these vocabularies).
    let byte_level = ByteLevel::new(false, true, true);
    match pre {
        // SmolLM: every digit is its own pre-token, then GPT-2's regex (HF tokenizer.json of
        // SmolLM2: Sequence[Digits(individual), ByteLevel]).
        "smollm" => Some(PreTokenizerWrapper::Sequence(Sequence::new(vec![
            PreTokenizerWrapper::Digits(Digits::new(true)),
            PreTokenizerWrapper::ByteLevel(byte_level),
        ]))),
        "gpt2" | "gpt-2" | "default" => Some(PreTokenizerWrapper::ByteLevel(byte_level)),
        // the split regexes of llama.cpp's `LLAMA_VOCAB_PRE_TYPE_QWEN2` / `_LLAMA3` (the same as
        // the models' tokenizer.json Split pre-tokenizers), then byte-level without its own regex
        "qwen2" => regex_then_bytes(QWEN2_SPLIT),
        "llama-bpe" | "llama3" => regex_then_bytes(LLAMA3_SPLIT),
        _ => None,
    }
}

const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn regex_then_bytes(pattern: &str) -> Option<PreTokenizerWrapper> {
    let split = Split::new(
        SplitPattern::Regex(pattern.to_string()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .ok()?;
    Some(PreTokenizerWrapper::Sequence(Sequence::new(vec![
        PreTokenizerWrapper::Split(split),
        PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, false)),
    ])))
}

fn string_array(meta: &Meta<'_>, key: &str) -> Option<Vec<String>> {
    match meta.get(key)? {
        Value::Array(v) => v
            .iter()
            .map(|x| match x {
                Value::String(s) => Some(s.clone()),
                _ => None,
            })
            .collect(),
        _ => None,
    }
}
