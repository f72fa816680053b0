//! Contract lint: every check has an id, a severity, a one-line message and a one-line fix hint,
//! with the prior-art finding (F1…F17) or contract section it comes from.

mod caches;
mod container;
mod genai_config;
mod io;

use super::config::{self, GenaiConfig};
use super::model::{Group, Hef};
use super::roles::{self, GroupRoles};
use kvprobe_schema::InputRole;
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Warning,
    Error,
}

#[derive(Debug, Clone, Serialize)]
pub struct Lint {
    pub id: &'static str,
    pub severity: Severity,
    pub message: String,
    pub fix: String,
    /// Prior-art findings (`F5`) and contract sections (`§5.7.3`) behind the check.
    pub refs: &'static [&'static str],
}

/// One registered check: id, severity, what it checks, references.
pub struct Check {
    pub id: &'static str,
    pub severity: Severity,
    pub what: &'static str,
    pub refs: &'static [&'static str],
}

use Severity::{Error as E, Warning as W};

/// Every check the inspector runs (pairing checks are in `pairing::CHECKS`).
pub const CHECKS: &[Check] = &[
    Check { id: "header-size", severity: E, what: "the container size equation of the header version holds", refs: &["§5.1", "§5.7.1"] },
    Check { id: "header-padding", severity: E, what: "v3: ccws_size_with_padding >= hef_padding_size", refs: &["§5.1"] },
    Check { id: "header-file-hash", severity: W, what: "v3 with proto_xxh3: the whole-file XXH3 HailoRT takes as the HEF hash verifies", refs: &["§5.1"] },
    Check { id: "header-version", severity: W, what: "container version 3 (the hRPC path of a Hailo-10H accepts only v3)", refs: &["§5.1", "§6.1"] },
    Check { id: "hw-arch", severity: W, what: "compiled for HAILO1XH (arch 103), which runs on Hailo-10H", refs: &["§5.4"] },
    Check { id: "extension-unsupported", severity: E, what: "mandatory extensions are all supported by HailoRT 5.2", refs: &["§5.4", "§5.7.1"] },
    Check { id: "extension-periph", severity: E, what: "mandatory extension PERIPH_CALCULATION_IN_HAILORT (26) present", refs: &["§5.4"] },
    Check { id: "resource-range", severity: E, what: "every external resource lies inside the file", refs: &["§5.6", "§5.7.1"] },
    Check { id: "resource-hash", severity: E, what: "every external resource's XXH3 verifies", refs: &["§5.6", "§5.7.1"] },
    Check { id: "resource-missing", severity: E, what: "hailo-config.json, tokenizer.json, embeddings.bin and rope_theta_data.bin are embedded", refs: &["§5.6"] },
    Check { id: "group-naming", severity: E, what: "the suffix rules resolve a prefill group", refs: &["§3.2", "§5.7.7"] },
    Check { id: "group-ambiguous", severity: W, what: "exactly one group matches each suffix (the server silently takes the last)", refs: &["§3.2", "§5.7.7"] },
    Check { id: "group-no-tbt", severity: W, what: "a tbt group exists (else every step runs through prefill)", refs: &["§3.2"] },
    Check { id: "group-scope", severity: W, what: "groups are named <scope>__prefill / <scope>__tbt with one scope", refs: &["§3.2"] },
    Check { id: "core-op-duplicate", severity: E, what: "core-op names are distinct across groups (the CacheManager keys state by it)", refs: &["§5.2"] },
    Check { id: "core-op-name", severity: W, what: "each core-op name equals its group name", refs: &["§5.2"] },
    Check { id: "group-single-context", severity: E, what: "a group with caches has more than one dynamic context", refs: &["§1.1", "§5.7.2", "F13"] },
    Check { id: "cache-missing", severity: E, what: "the LLM groups have KV-cache edges", refs: &["§1.1"] },
    Check { id: "cache-pairing", severity: E, what: "each cache_id has exactly one input and one output edge per group", refs: &["§1.3", "§5.7.2"] },
    Check { id: "cache-negative-id", severity: E, what: "cache ids are non-negative", refs: &["§1.1", "§5.7.2"] },
    Check { id: "cache-edge-invalid", severity: E, what: "cache edges are INFO layers with data_bytes 1 or 2, a valid format code, 8-bit sys_index/engine_id", refs: &["§1.1", "§5.7.2"] },
    Check { id: "cache-entry-size", severity: E, what: "E_in == E_out per id, and one E per id across groups", refs: &["§1.3", "§5.7.3", "§5.7.4"] },
    Check { id: "cache-window", severity: E, what: "0 < in, out <= 65535 and Ep <= 65535", refs: &["§1.2", "§1.3", "§5.7.3"] },
    Check { id: "cache-stride", severity: E, what: "each side's descriptor page keeps the slot stride at Ep", refs: &["§1.2", "§5.7.3"] },
    Check { id: "cache-length", severity: E, what: "one L = in + out for every cache and group", refs: &["§1.3", "§5.7.4"] },
    Check { id: "cache-id-set", severity: E, what: "prefill and tbt use the same cache_id set", refs: &["§1.3", "§5.7.4"] },
    Check { id: "cache-kv-size", severity: E, what: "L == kv_cache_size", refs: &["§2.5", "§5.7.5", "F5"] },
    Check { id: "cache-prefill-out", severity: E, what: "prefill writes P = prefill_input_tokens_count entries per run", refs: &["§2.5", "§5.7.5", "F5"] },
    Check { id: "cache-tbt-out", severity: E, what: "tbt writes 1 entry per run", refs: &["§2.5", "§5.7.5"] },
    Check { id: "layout-mismatch", severity: E, what: "the four edges of a cache_id share format code and data_bytes", refs: &["§7.4", "§5.7.6", "F9"] },
    Check { id: "layout-not-ring-safe", severity: E, what: "cache edges are token-major (NHWC, or any order with padded width 1)", refs: &["§7.4", "§5.7.6", "F9"] },
    Check { id: "cache-quant-mismatch", severity: E, what: "the four edges of a cache_id declare the same scale and zero point", refs: &["§4", "§5.7.6", "F9"] },
    Check { id: "config-invalid", severity: E, what: "hailo-config.json is a JSON object with the types the server reads", refs: &["§3.1"] },
    Check { id: "config-key-size", severity: E, what: "no prefill_input_tokens_size (ignored; the server reads prefill_input_tokens_count)", refs: &["§3.1", "F5"] },
    Check { id: "config-unknown-key", severity: W, what: "no keys the server ignores", refs: &["§3.1", "F5"] },
    Check { id: "config-missing-key", severity: E, what: "eos_token_id present (required); kv_cache_size, head counts and prefill_input_tokens_count given, not defaulted", refs: &["§3.1", "F5"] },
    Check { id: "input-suffix", severity: E, what: "every input suffix resolves in prefill and tbt", refs: &["§3.1", "§5.7.7"] },
    Check { id: "output-width", severity: E, what: "the logits width equals the vocabulary (embedding rows / tokenizer)", refs: &["§2.8", "F1", "F12"] },
    Check { id: "output-shape", severity: E, what: "each output holds one position ([1,1,width])", refs: &["§2.8", "F2"] },
    Check { id: "output-shards", severity: E, what: "all output frames have equal size (the server lays them back to back)", refs: &["§2.1", "§5.7.5", "F12"] },
    Check { id: "output-order", severity: E, what: "every output is named in the sorted output list", refs: &["§2.1", "§5.2", "F12"] },
    Check { id: "rope-width", severity: E, what: "pe_q frames T·NH·D and pe_k frames T·NKV·D", refs: &["§2.6", "§5.7.5", "F3"] },
    Check { id: "rope-theta", severity: E, what: "rope_theta_data.bin holds an even number D of float32", refs: &["§2.1", "§5.7.5"] },
    Check { id: "mask-shape", severity: E, what: "the mask input is uint8 with frame T·NH·KV", refs: &["§2.5", "§5.7.5", "F4"] },
    Check { id: "embeddings-input", severity: E, what: "the embeddings input is uint16 with T rows and F features in both groups", refs: &["§2.1", "§5.7.5", "F5"] },
    Check { id: "embeddings-table", severity: E, what: "embeddings.bin size is a multiple of 2F", refs: &["§2.11", "§5.7.5"] },
    Check { id: "quant-scale", severity: E, what: "every edge's quantisation scale is a positive finite number", refs: &["§4"] },
];

/// The genai resources the server loads (contract §5.6).
pub const RESOURCE_NAMES: [&str; 4] = [
    "hailo-config.json",
    "tokenizer.json",
    "embeddings.bin",
    "rope_theta_data.bin",
];

pub fn check(id: &str) -> Option<&'static Check> {
    CHECKS.iter().find(|c| c.id == id)
}

/// Facts several checks need, derived once.
pub struct Facts<'a> {
    pub roles: GroupRoles,
    pub config: Option<std::result::Result<GenaiConfig, String>>,
    pub prefill: Option<&'a Group>,
    pub tbt: Option<&'a Group>,
    /// Rows of `embeddings.bin` (needs F from the prefill embeddings input).
    pub embedding_rows: Option<usize>,
    pub embedding_bytes: Option<usize>,
    pub tokenizer_vocab: Option<usize>,
    /// `rope_theta_data.bin` as float32 (native = little-endian on the targets, §2.1).
    pub theta: Option<Vec<f32>>,
}

impl<'a> Facts<'a> {
    pub fn new(hef: &'a Hef) -> Facts<'a> {
        let names: Vec<&str> = hef.groups.iter().map(|g| g.name.as_str()).collect();
        let roles = roles::resolve_groups(&names);
        let config = hef.resource("hailo-config.json").map(config::parse);
        let prefill = roles.prefill.map(|i| &hef.groups[i]);
        let tbt = roles.tbt.map(|i| &hef.groups[i]);
        let cfg = config.as_ref().and_then(|c| c.as_ref().ok());
        let f = prefill
            .and_then(|g| roles::input_for(g, cfg, InputRole::Embeddings))
            .map(|l| l.shape[2] as usize)
            .filter(|&f| f > 0);
        let embedding_rows = match (hef.resource("embeddings.bin"), f) {
            (Some(b), Some(f)) => Some(b.len() / f.saturating_mul(2)),
            _ => None,
        };
        let tokenizer_vocab = hef
            .resource("tokenizer.json")
            .and_then(tokenizer_vocab_size);
        let theta = hef.resource("rope_theta_data.bin").map(|b| {
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        });
        let embedding_bytes = hef.resource("embeddings.bin").map(<[u8]>::len);
        Facts {
            roles,
            config,
            prefill,
            tbt,
            embedding_rows,
            embedding_bytes,
            tokenizer_vocab,
            theta,
        }
    }

    pub fn config(&self) -> Option<&GenaiConfig> {
        self.config.as_ref().and_then(|c| c.as_ref().ok())
    }

    pub fn kv(&self) -> usize {
        self.config()
            .map(|c| c.kv_cache_size.0)
            .unwrap_or(config::DEFAULT_KV_CACHE_SIZE) as usize
    }
    pub fn p(&self) -> usize {
        self.config()
            .map(|c| c.prefill_input_tokens_count.0)
            .unwrap_or(config::DEFAULT_PREFILL_TOKENS) as usize
    }
    pub fn nh(&self) -> usize {
        self.config()
            .map(|c| c.num_attention_heads.0)
            .unwrap_or(config::DEFAULT_NUM_ATTENTION_HEADS) as usize
    }
    pub fn nkv(&self) -> usize {
        self.config()
            .map(|c| c.num_key_value_heads.0)
            .unwrap_or(config::DEFAULT_NUM_KV_HEADS) as usize
    }
    /// The LLM groups, with their token rows T.
    pub fn llm_groups(&self) -> Vec<(&'a Group, usize, &'static str)> {
        let mut v = Vec::new();
        if let Some(g) = self.prefill {
            v.push((g, self.p(), "prefill"));
        }
        if let Some(g) = self.tbt {
            v.push((g, 1, "tbt"));
        }
        v
    }
}

/// Vocabulary size of a HuggingFace tokenizer.json: max id + 1 over `model.vocab` and `added_tokens`.
pub fn tokenizer_vocab_size(bytes: &[u8]) -> Option<usize> {
    let v: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    let mut max: Option<u64> = None;
    let mut bump = |id: Option<u64>| {
        if let Some(id) = id {
            max = Some(max.map_or(id, |m| m.max(id)));
        }
    };
    match v.get("model").and_then(|m| m.get("vocab")) {
        Some(serde_json::Value::Object(m)) => m.values().for_each(|x| bump(x.as_u64())),
        // Unigram: a list of [piece, score]; ids are positions.
        Some(serde_json::Value::Array(a)) if !a.is_empty() => bump(Some(a.len() as u64 - 1)),
        _ => {}
    }
    if let Some(serde_json::Value::Array(a)) = v.get("added_tokens") {
        a.iter()
            .for_each(|t| bump(t.get("id").and_then(|x| x.as_u64())));
    }
    max.map(|m| m as usize + 1)
}

struct Out(Vec<Lint>);

impl Out {
    fn push(&mut self, id: &'static str, message: String, fix: &str) {
        let c = check(id).unwrap_or(&CHECKS[0]);
        self.0.push(Lint {
            id,
            severity: c.severity,
            message,
            fix: fix.to_string(),
            refs: c.refs,
        });
    }
    fn push_sev(&mut self, id: &'static str, severity: Severity, message: String, fix: &str) {
        let refs = check(id).map(|c| c.refs).unwrap_or(&[]);
        self.0.push(Lint {
            id,
            severity,
            message,
            fix: fix.to_string(),
            refs,
        });
    }
}

/// Runs every structural check on a readable HEF.
pub fn lint(hef: &Hef) -> Vec<Lint> {
    let facts = Facts::new(hef);
    let mut out = Out(Vec::new());
    container::container(hef, &mut out);
    container::naming(hef, &facts, &mut out);
    caches::caches(hef, &facts, &mut out);
    genai_config::config_checks(&facts, &mut out);
    io::io_checks(&facts, &mut out);
    quant_scales(hef, &mut out);
    out.0
}

/// A NaN, infinite, zero or negative scale dequantises every value of the edge to garbage (or
/// NaN) on the device and in the emulator (issue 38: such a HEF linted clean).
/// An edge without quantisation parameters reads as scale 0 (a mask input is not dequantised),
/// so a zero scale is an error only on a cache edge that declares its parameters.
fn quant_scales(hef: &Hef, out: &mut Out) {
    let corrupt = |x: f32| !x.is_finite() || x < 0.0;
    for g in &hef.groups {
        let layers = g.inputs.iter().chain(&g.outputs);
        let mut bad: Vec<String> = layers
            .filter(|l| corrupt(l.quant.scale))
            .map(|l| format!("{}/{}: {}", g.name, l.name, l.quant.scale))
            .collect();
        bad.extend(
            g.cache_edges
                .iter()
                .filter(|e| corrupt(e.quant.scale) || (e.numeric.is_some() && e.quant.scale == 0.0))
                .map(|e| format!("{}/{}: {}", g.name, e.name, e.quant.scale)),
        );
        if !bad.is_empty() {
            out.push(
                "quant-scale",
                format!(
                    "{} edge(s) with a scale that is not a positive finite number: {}",
                    bad.len(),
                    bad.join(", ")
                ),
                "recompile the HEF; its quantisation parameters are corrupt",
            );
        }
    }
}
