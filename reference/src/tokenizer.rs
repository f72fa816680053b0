//! Text <-> token ids, a thin wrapper over `tokenizers::Tokenizer` that owns the BOS decision.
//!
//! Encoding never runs the tokenizer's own post-processor: BOS is prepended here, explicitly, so the
//! `--bos/--no-bos` switch means the same thing for HF folders and GGUF files.

use std::path::{Path, PathBuf};

use crate::error::{one_line, Error, Result};

#[derive(Clone)]
pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
    add_bos: bool,
    bos_id: Option<u32>,
    source: PathBuf,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("add_bos", &self.add_bos)
            .field("bos_id", &self.bos_id)
            .field("source", &self.source)
            .finish()
    }
}

/// The largest tokenizer.json read: real ones are up to a few tens of megabytes.
const MAX_TOKENIZER_BYTES: u64 = 256 << 20;

/// The most BPE merges read: real tokenizers hold up to about half a million (Llama 3: 280k);
/// the tokenizers library needs about 0.8 KB of memory per merge (issue 38: 2M merges in a
/// 34 MB file peaked at 1.6 GB).
const MAX_MERGES: usize = 1_000_000;

/// What the file implies kvprobe would allocate, bounded before the tokenizers library builds
/// it (issue 38): the merges, and padding, which pads every prompt to a length of the file's
/// choosing (1e8 tokens aborted at 1.9 GB). kvprobe runs one prompt as given, so a tokenizer
/// that pads a single prompt is refused rather than run with pad tokens the reference attends to.
fn size_refusal(json: &serde_json::Value) -> Option<String> {
    let merges = json
        .get("model")
        .and_then(|m| m.get("merges"))
        .and_then(|m| m.as_array())
        .map_or(0, Vec::len);
    if merges > MAX_MERGES {
        return Some(format!(
            "{merges} BPE merges, more than the {MAX_MERGES} kvprobe reads (real tokenizers hold up to about half a million); use the model's original tokenizer.json"
        ));
    }
    let padding = json.get("padding").filter(|p| !p.is_null())?;
    let fixed = padding
        .get("strategy")
        .and_then(|s| s.get("Fixed"))
        .and_then(|f| f.as_u64());
    let multiple = padding
        .get("pad_to_multiple_of")
        .and_then(|m| m.as_u64())
        .filter(|&m| m > 1);
    match (fixed, multiple) {
        (Some(n), _) => Some(format!(
            "padding.strategy pads every prompt to {n} tokens; kvprobe runs one prompt unpadded, set \"padding\": null"
        )),
        (None, Some(m)) => Some(format!(
            "padding.pad_to_multiple_of pads every prompt to a multiple of {m} tokens; kvprobe runs one prompt unpadded, set \"padding\": null"
        )),
        (None, None) => None,
    }
}

impl TextTokenizer {
    /// Load a `tokenizer.json`. The BOS default is guessed from the file's post-processor (does it add
    /// a leading special token?); HF loading overrides it with `tokenizer_config.json` when present.
    pub fn from_file(path: &Path) -> Result<Self> {
        if !path.exists() {
            return Err(Error::NotFound {
                path: path.to_path_buf(),
            });
        }
        let bad = |e: &dyn std::fmt::Display| Error::Tokenizer {
            path: path.to_path_buf(),
            detail: format!(
                "{}; replace tokenizer.json with the model's original file",
                one_line(&e.to_string())
            ),
        };
        // a file that cannot be read is not a broken tokenizer: its own error names the fix
        let unreadable = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(unreadable)?;
        if !meta.is_file() || meta.len() > MAX_TOKENIZER_BYTES {
            return Err(bad(&format!(
                "not a regular file of at most {MAX_TOKENIZER_BYTES} bytes"
            )));
        }
        let bytes = std::fs::read(path).map_err(unreadable)?;
        // tokenizers 0.23 panics (`expect("Helper")`) on a decoder holding invalid UTF-8 or a
        // number out of range (found by examples/fuzz): the whole file is checked as JSON first.
        let json = serde_json::from_slice::<serde_json::Value>(&bytes).map_err(|e| bad(&e))?;
        if let Some(merge) = json.get("model").and_then(short_merge) {
            // tokenizers 0.23 subtracts the continuing-subword prefix from every merge's second
            // part and underflows on a shorter one (found by examples/fuzz)
            return Err(bad(&format!(
                "the BPE merge {merge:?} is shorter than the model's continuing_subword_prefix"
            )));
        }
        if let Some(detail) = size_refusal(&json) {
            return Err(Error::Tokenizer {
                path: path.to_path_buf(),
                detail,
            });
        }
        if let Some(missing) = json.get("post_processor").and_then(undefined_special_token) {
            // tokenizers 0.23 indexes its special-token map with every name in the template and
            // panics on a missing one (found by examples/fuzz)
            return Err(bad(&format!(
                "the post_processor's template uses the special token {missing:?}, which its special_tokens do not define"
            )));
        }
        let (inner, (add_bos, bos_id)) = quietly(|| {
            let inner = tokenizers::Tokenizer::from_bytes(&bytes)?;
            let bos = detect_bos(&inner);
            Ok((inner, bos))
        })
        .ok_or_else(|| bad(&"the tokenizers library could not read it"))?
        .map_err(|e: tokenizers::Error| bad(&*e))?;
        let mut t = Self::from_tokenizer(inner, add_bos, bos_id);
        t.source = path.to_path_buf();
        Ok(t)
    }

    pub fn from_tokenizer(
        inner: tokenizers::Tokenizer,
        add_bos: bool,
        bos_id: Option<u32>,
    ) -> Self {
        Self {
            inner,
            add_bos,
            bos_id,
            source: PathBuf::from("(in-memory tokenizer)"),
        }
    }

    /// Name the file the vocabulary came from, so tokenizer errors point at it.
    pub fn with_source(mut self, path: &Path) -> Self {
        self.source = path.to_path_buf();
        self
    }

    /// Encode without the tokenizer's post-processor; prepend BOS when asked and known.
    pub fn encode(&self, text: &str, add_bos: bool) -> Result<Vec<u32>> {
        let enc = self.inner.encode(text, false).map_err(|e| self.err(e))?;
        let mut ids = Vec::with_capacity(enc.len() + 1);
        if add_bos {
            if let Some(b) = self.bos_id {
                ids.push(b);
            }
        }
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, false).map_err(|e| self.err(e))
    }

    /// The token's vocabulary string, or `<id N>` when the id is unknown.
    pub fn token_text(&self, id: u32) -> String {
        self.inner
            .id_to_token(id)
            .unwrap_or_else(|| format!("<id {id}>"))
    }

    /// Readable text of one token for labels: the decoded piece (" upon", not the byte-level
    /// vocabulary string "Ġupon"), or the vocabulary string when the piece alone is not valid text
    /// (one byte of a multi-byte character).
    pub fn token_piece(&self, id: u32) -> String {
        match self.inner.decode(&[id], false) {
            Ok(s) if !s.is_empty() && !s.contains('\u{FFFD}') => s,
            _ => self.token_text(id),
        }
    }

    pub fn default_add_bos(&self) -> bool {
        self.add_bos
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    pub fn set_bos(&mut self, add_bos: bool, bos_id: Option<u32>) {
        self.add_bos = add_bos;
        if bos_id.is_some() {
            self.bos_id = bos_id;
        }
    }

    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Refuse a tokenizer that can produce ids the model has no embedding row for (the wrong
    /// model's tokenizer.json): the forward would fail on the first such token, or worse, a
    /// smaller-vocabulary model would read another token's row.
    pub fn check_fits(&self, model_vocab: usize) -> Result<()> {
        let top = self
            .inner
            .get_vocab(true)
            .into_iter()
            .max_by_key(|(_, id)| *id);
        let fail = |detail: String| Error::Tokenizer {
            path: self.source.clone(),
            detail,
        };
        if top.is_none() {
            // every prompt would encode to nothing, which reads as the user's empty prompt
            return Err(fail(
                "the vocabulary is empty; use the tokenizer that came with the model".into(),
            ));
        }
        if let Some(b) = self.bos_id.filter(|&b| b as usize >= model_vocab) {
            // added before every prompt: it would read as an id the user passed
            return Err(fail(format!(
                "the BOS token id {b} is past the model's embedding of {model_vocab} rows; fix the BOS id (bos_token_id / tokenizer.ggml.bos_token_id)"
            )));
        }
        match top {
            Some((tok, id)) if id as usize >= model_vocab => Err(Error::Tokenizer {
                path: self.source.clone(),
                detail: format!(
                    "token `{tok}` has id {id} but the model's embedding has {model_vocab} rows; use the tokenizer that came with the model"
                ),
            }),
            _ => Ok(()),
        }
    }

    fn err(&self, e: tokenizers::Error) -> Error {
        Error::Tokenizer {
            path: self.source.clone(),
            detail: one_line(&e.to_string()),
        }
    }
}

/// Does the post-processor add a leading token? Compare an encoding with and without special tokens.
/// `f`, with a panic inside it (the tokenizers library panics on some malformed files beyond
/// the checks above: merges longer than any vocabulary entry, found by examples/fuzz) turned
/// into `None` and kept off stderr, so the error stays one line. The hook is swapped only while
/// a model loads, before any worker thread runs.
fn quietly<T>(f: impl FnOnce() -> T) -> Option<T> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).ok();
    std::panic::set_hook(hook);
    out
}

/// The first BPE merge whose second part is shorter than `continuing_subword_prefix`.
fn short_merge(model: &serde_json::Value) -> Option<String> {
    let prefix = model.get("continuing_subword_prefix")?.as_str()?.len();
    let merges = model.get("merges")?.as_array()?;
    merges.iter().find_map(|m| {
        let second = match m {
            serde_json::Value::String(s) => s.split_once(' ').map(|(_, b)| b),
            serde_json::Value::Array(a) => a.get(1).and_then(|b| b.as_str()),
            _ => None,
        };
        second.filter(|b| b.len() < prefix).map(|_| m.to_string())
    })
}

/// The first special token a `TemplateProcessing` post-processor (also inside a `Sequence`)
/// names in its templates without defining it.
fn undefined_special_token(pp: &serde_json::Value) -> Option<String> {
    if let Some(list) = pp.get("processors").and_then(|p| p.as_array()) {
        return list.iter().find_map(undefined_special_token);
    }
    if pp.get("type").and_then(|t| t.as_str()) != Some("TemplateProcessing") {
        return None;
    }
    let defined = pp.get("special_tokens");
    ["single", "pair"]
        .iter()
        .filter_map(|k| pp.get(*k).and_then(|t| t.as_array()))
        .flatten()
        .filter_map(|piece| piece.get("SpecialToken")?.get("id")?.as_str())
        .find(|id| defined.and_then(|d| d.get(*id)).is_none())
        .map(str::to_string)
}

fn detect_bos(t: &tokenizers::Tokenizer) -> (bool, Option<u32>) {
    let plain = t.encode("a", false).ok().map(|e| e.get_ids().to_vec());
    let special = t.encode("a", true).ok().map(|e| e.get_ids().to_vec());
    match (plain, special) {
        (Some(p), Some(s)) if s.len() == p.len() + 1 && s[1..] == p[..] => {
            (true, s.first().copied())
        }
        _ => (false, None),
    }
}
