//! Contract lint: every check has an id, a severity, a one-line message and a one-line fix hint,
//! with the prior-art finding (F1…F17) or contract section it comes from.

use super::config::{self, GenaiConfig};
use super::formats;
use super::geometry::{self, DescStride};
use super::model::{CacheEdge, Group, Hef};
use super::roles::{self, GroupRoles};
use kvprobe_schema::{CacheDirection, InputRole};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

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
    container(hef, &mut out);
    naming(hef, &facts, &mut out);
    caches(hef, &facts, &mut out);
    config_checks(&facts, &mut out);
    io_checks(&facts, &mut out);
    out.0
}

fn container(hef: &Hef, out: &mut Out) {
    let hc = &hef.header_checks;
    if !hc.size_ok {
        out.push(
            "header-size",
            format!("container v{} size equation fails: {}", hef.header.version, hc.size_detail.clone().unwrap_or_default()),
            "re-export the HEF; a truncated or hand-edited container is refused by HailoRT's header validation",
        );
    }
    if !hc.padding_ok {
        out.push(
            "header-padding",
            format!(
                "ccws_size_with_padding {} < hef_padding_size {}",
                hef.header.ccws_size, hef.header.padding_size
            ),
            "re-export the HEF; the in-memory loader rejects this header",
        );
    }
    if hc.file_hash_ok == Some(false) {
        out.push(
            "header-file-hash",
            "header XXH3 does not match the file (HailoRT trusts it unverified because proto_xxh3 is set)".into(),
            "recompute the header hash after editing the file, or re-export; saved contexts key on this hash",
        );
    }
    if hef.header.version != 3 {
        out.push(
            "header-version",
            format!(
                "container version {} (Hailo-10H transfers only v3 HEFs over hRPC)",
                hef.header.version
            ),
            "recompile with Dataflow Compiler 5.0 or later, which writes v3",
        );
    }
    if hef.hw_arch != formats::HW_ARCH_HAILO1XH {
        out.push(
            "hw-arch",
            format!(
                "compiled for {} (arch {}), not HAILO1XH (103)",
                hef.hw_arch_name, hef.hw_arch
            ),
            "compile with --hw-arch hailo10h",
        );
    }
    let bad: Vec<u32> = hef
        .extensions
        .iter()
        .copied()
        .filter(|&i| !formats::extension_supported(i))
        .collect();
    if !bad.is_empty() {
        out.push(
            "extension-unsupported",
            format!("mandatory extension indices {bad:?} are refused by HailoRT 5.2"),
            "compile with a Dataflow Compiler matching the installed HailoRT",
        );
    }
    if hef.proto_version > 0
        && !hef
            .extensions
            .contains(&formats::EXT_PERIPH_CALCULATION_IN_HAILORT)
    {
        out.push(
            "extension-periph",
            "mandatory extension PERIPH_CALCULATION_IN_HAILORT (26) is missing".into(),
            "compile with a Dataflow Compiler that emits extension 26 (any 5.x)",
        );
    }
    for name in RESOURCE_NAMES {
        if !hef.resources.iter().any(|r| r.name == name) {
            out.push(
                "resource-missing",
                format!("external resource {name} is not embedded"),
                "embed the genai resources (hailo-config.json, tokenizer.json, embeddings.bin, rope_theta_data.bin) when compiling",
            );
        }
    }
    for r in &hef.resources {
        if r.range.is_none() {
            out.push(
                "resource-range",
                format!(
                    "resource {} (offset {}, {} bytes) lies outside the {}-byte file",
                    r.name, r.offset, r.size, hef.file_len
                ),
                "the file is truncated or the descriptor is wrong; copy or re-export the HEF",
            );
        } else if r.hash_ok == Some(false) {
            out.push(
                "resource-hash",
                format!("resource {} fails its XXH3 check ({:016x})", r.name, r.xxhash),
                "the resource was edited without updating its hash; rewrite it with a tool that updates xxhash",
            );
        }
    }
}

fn naming(hef: &Hef, facts: &Facts, out: &mut Out) {
    let roles = &facts.roles;
    if roles.prefill.is_none() {
        let names: Vec<&str> = hef.groups.iter().map(|g| g.name.as_str()).collect();
        out.push(
            "group-naming",
            format!(
                "no group name ends with \"{}\" (groups: {names:?})",
                roles.prefill_suffix
            ),
            "name the groups <scope>__prefill and <scope>__tbt when compiling",
        );
    }
    for (what, m) in [
        ("prefill", &roles.prefill_matches),
        ("tbt", &roles.tbt_matches),
    ] {
        if m.len() > 1 {
            let names: Vec<&str> = m.iter().map(|&i| hef.groups[i].name.as_str()).collect();
            out.push(
                "group-ambiguous",
                format!(
                    "{} groups match the {what} suffix {names:?}; the server takes the last",
                    m.len()
                ),
                "keep exactly one group per suffix",
            );
        }
    }
    if roles.prefill.is_some() && roles.tbt.is_none() {
        out.push(
            "group-no-tbt",
            format!(
                "no tbt group (suffix \"{}\"): every step runs through prefill",
                roles.tbt_suffix
            ),
            "compile a <scope>__tbt group next to <scope>__prefill",
        );
    }
    if let (Some(p), Some(t)) = (facts.prefill, facts.tbt) {
        let ok = p.name.ends_with("__prefill")
            && t.name.ends_with("__tbt")
            && roles::scope(&p.name) == roles::scope(&t.name);
        if !ok {
            out.push(
                "group-scope",
                format!("groups \"{}\" and \"{}\" do not share one <scope>__prefill / <scope>__tbt naming", p.name, t.name),
                "name both groups from one model scope",
            );
        }
    }
    let mut seen: BTreeMap<&str, &str> = BTreeMap::new();
    for g in &hef.groups {
        if let Some(other) = seen.insert(&g.core_op_name, &g.name) {
            out.push(
                "core-op-duplicate",
                format!("core op \"{}\" appears in groups \"{other}\" and \"{}\"; the cache manager keeps only the first's state", g.core_op_name, g.name),
                "give each group's core op a distinct name",
            );
        }
        if g.core_op_name != g.name {
            out.push(
                "core-op-name",
                format!("group \"{}\" has core op \"{}\"", g.name, g.core_op_name),
                "keep core-op and group names equal so layer network names resolve",
            );
        }
    }
}

/// Per group, per cache id: (input edges, output edges).
fn by_id(g: &Group) -> BTreeMap<i32, (Vec<&CacheEdge>, Vec<&CacheEdge>)> {
    let mut m: BTreeMap<i32, (Vec<&CacheEdge>, Vec<&CacheEdge>)> = BTreeMap::new();
    for e in &g.cache_edges {
        let slot = m.entry(e.cache_id).or_default();
        match e.direction {
            CacheDirection::Input => slot.0.push(e),
            CacheDirection::Output => slot.1.push(e),
        }
    }
    m
}

fn caches(hef: &Hef, facts: &Facts, out: &mut Out) {
    // Ring length per (group, id), for the cross checks.
    let mut lengths: Vec<(String, i32, usize)> = Vec::new();
    let mut entry: BTreeMap<i32, Vec<(String, usize)>> = BTreeMap::new();
    for g in &hef.groups {
        if g.cache_edges.is_empty() {
            continue;
        }
        if g.contexts <= 1 {
            out.push(
                "group-single-context",
                format!(
                    "group \"{}\" has caches but {} dynamic context(s)",
                    g.name, g.contexts
                ),
                "caches need a multi-context core op; let the compiler split the group",
            );
        }
        for e in &g.cache_edges {
            if e.cache_id < 0 {
                out.push(
                    "cache-negative-id",
                    format!(
                        "group \"{}\" edge \"{}\" has cache_id {}",
                        g.name, e.name, e.cache_id
                    ),
                    "cache ids must be >= 0; recompile",
                );
            }
            let mut why = Vec::new();
            if e.edge_layer_type != formats::EDGE_TYPE_INFO {
                why.push(format!("edge type {} is not INFO", e.edge_layer_type));
            }
            if e.data_bytes != 1 && e.data_bytes != 2 {
                why.push(format!("data_bytes {}", e.data_bytes));
            }
            if e.format_name.is_none() {
                why.push(format!("format code {} is invalid", e.format_code));
            }
            if e.host_argmax {
                why.push("host_argmax is set".into());
            }
            if e.sys_index > 255 || e.engine_id > 255 {
                why.push("sys_index/engine_id exceed 8 bits".into());
            }
            if !why.is_empty() {
                out.push(
                    "cache-edge-invalid",
                    format!(
                        "group \"{}\" cache {} edge \"{}\": {}",
                        g.name,
                        e.cache_id,
                        e.name,
                        why.join(", ")
                    ),
                    "HailoRT refuses this HEF at load; recompile",
                );
            }
        }
        for (id, (ins, outs)) in by_id(g) {
            if ins.len() != 1 || outs.len() != 1 {
                out.push(
                    "cache-pairing",
                    format!(
                        "group \"{}\" cache {id} has {} input and {} output edge(s), need 1 and 1",
                        g.name,
                        ins.len(),
                        outs.len()
                    ),
                    "every cache needs exactly one read and one write edge per group",
                );
                continue;
            }
            let (i, o) = (ins[0], outs[0]);
            if i.entry_size != o.entry_size {
                out.push(
                    "cache-entry-size",
                    format!(
                        "group \"{}\" cache {id}: input E={} but output E={}",
                        g.name, i.entry_size, o.entry_size
                    ),
                    "both edges of a cache must have the same padded_features",
                );
            }
            entry
                .entry(id)
                .or_default()
                .push((g.name.clone(), i.entry_size));
            let ep = i.padded_entry_size;
            if i.length == 0 || o.length == 0 || i.length > 65535 || o.length > 65535 || ep > 65535
            {
                out.push(
                    "cache-window",
                    format!("group \"{}\" cache {id}: in={} out={} Ep={} (need 0 < in, out <= 65535, Ep <= 65535)", g.name, i.length, o.length, ep),
                    "choose a cache length and entry size inside HailoRT's 16-bit limits",
                );
            }
            for (side, n) in [("input", i.length), ("output", o.length)] {
                match geometry::desc_stride(i.entry_size, n) {
                    DescStride::Ep(_) => {}
                    DescStride::Doubled { page, stride } => out.push(
                        "cache-stride",
                        format!("group \"{}\" cache {id} {side}: {n} entries double the descriptor page to {page}, slot stride {stride} != Ep {ep}", g.name),
                        "reduce the cache length or pick an entry size that is a multiple of the doubled page",
                    ),
                    DescStride::TooManyDescriptors => out.push(
                        "cache-stride",
                        format!("group \"{}\" cache {id} {side}: {n} entries of {} bytes exceed the descriptor budget", g.name, i.entry_size),
                        "reduce the cache length",
                    ),
                }
            }
            lengths.push((g.name.clone(), id, i.length + o.length));
        }
    }
    for (id, v) in &entry {
        let sizes: BTreeSet<usize> = v.iter().map(|x| x.1).collect();
        if sizes.len() > 1 {
            out.push(
                "cache-entry-size",
                format!("cache {id} has entry sizes {sizes:?} across groups {:?}", v.iter().map(|x| &x.0).collect::<Vec<_>>()),
                "the groups share the ring bytes by cache_id; compile them with the same cache geometry",
            );
        }
    }
    let ls: BTreeSet<usize> = lengths.iter().map(|x| x.2).collect();
    if ls.len() > 1 {
        let detail: Vec<String> = lengths
            .iter()
            .map(|(g, id, l)| format!("{g}/{id}={l}"))
            .collect();
        out.push(
            "cache-length",
            format!("cache lengths differ: {}", detail.join(" ")),
            "every cache of every group must have one L = in + out (configure fails otherwise)",
        );
    }
    let llm = facts.llm_groups();
    if llm.iter().any(|(g, _, _)| g.cache_edges.is_empty()) {
        let names: Vec<&str> = llm
            .iter()
            .filter(|(g, _, _)| g.cache_edges.is_empty())
            .map(|(g, _, _)| g.name.as_str())
            .collect();
        out.push(
            "cache-missing",
            format!("group(s) {names:?} have no KV-cache edges"),
            "compile the model with the KV-cache enabled in both groups",
        );
    }
    if let (Some(p), Some(t)) = (facts.prefill, facts.tbt) {
        let a: BTreeSet<i32> = p.cache_edges.iter().map(|e| e.cache_id).collect();
        let b: BTreeSet<i32> = t.cache_edges.iter().map(|e| e.cache_id).collect();
        if a != b && !a.is_empty() && !b.is_empty() {
            out.push(
                "cache-id-set",
                format!(
                    "prefill cache ids {:?} != tbt cache ids {:?}",
                    a.symmetric_difference(&b).collect::<Vec<_>>(),
                    "(symmetric difference)"
                ),
                "both groups must declare the same caches",
            );
        }
    }
    // LLM contract (§5.7.5), which HailoRT does not check.
    let kv = facts.kv();
    for (g, t, what) in &llm {
        for (id, (ins, outs)) in by_id(g) {
            if ins.len() != 1 || outs.len() != 1 {
                continue;
            }
            let l = ins[0].length + outs[0].length;
            if l != kv {
                out.push(
                    "cache-kv-size",
                    format!("{what} cache {id}: L = {l} but kv_cache_size = {kv}; the mask columns will not match the ring"),
                    "set pre_process_params.kv_cache_size to the compiled cache length",
                );
                break;
            }
            let o = outs[0].length;
            if o != *t {
                let (id_, fix) = if *what == "prefill" {
                    ("cache-prefill-out", "set pre_process_params.prefill_input_tokens_count to the compiled prefill length")
                } else {
                    (
                        "cache-tbt-out",
                        "compile the tbt group for exactly one token",
                    )
                };
                out.push(
                    id_,
                    format!("{what} cache {id} writes {o} entries per run, expected {t}"),
                    fix,
                );
                break;
            }
        }
    }
    // Layout and quant across the four edges of each id (§5.7.6).
    let mut edges: BTreeMap<i32, Vec<(&str, &CacheEdge)>> = BTreeMap::new();
    for (g, _, _) in &llm {
        for e in &g.cache_edges {
            edges
                .entry(e.cache_id)
                .or_default()
                .push((g.name.as_str(), e));
        }
    }
    for (id, v) in &edges {
        let codes: BTreeSet<(u32, u32)> = v
            .iter()
            .map(|(_, e)| (e.format_code, e.data_bytes))
            .collect();
        if codes.len() > 1 {
            out.push(
                "layout-mismatch",
                format!("cache {id} edges disagree on (format code, data_bytes): {codes:?}"),
                "put the same explicit format conversion on every cache edge of both groups",
            );
        }
        let unsafe_edges: Vec<String> = v
            .iter()
            .filter(|(_, e)| !formats::ring_safe(e.format_code, e.padded_shape[1]))
            .map(|(g, e)| {
                format!(
                    "{g}/{}({}, pW={})",
                    e.name,
                    e.format_name.unwrap_or("?"),
                    e.padded_shape[1]
                )
            })
            .collect();
        if !unsafe_edges.is_empty() {
            out.push(
                "layout-not-ring-safe",
                format!(
                    "cache {id}: edges not token-major: {}",
                    unsafe_edges.join(", ")
                ),
                "convert cache edges to tf_rgb (NHWC) in both groups so each entry holds one token",
            );
        }
        let q: BTreeSet<(u32, u32)> = v
            .iter()
            .map(|(_, e)| (e.quant.scale.to_bits(), e.quant.zero_point.to_bits()))
            .collect();
        if q.len() > 1 {
            let detail: Vec<String> = v
                .iter()
                .map(|(g, e)| {
                    format!(
                        "{g}/{}: scale {} zp {}",
                        e.name, e.quant.scale, e.quant.zero_point
                    )
                })
                .collect();
            out.push(
                "cache-quant-mismatch",
                format!(
                    "cache {id} edges declare different quantisation: {}",
                    detail.join("; ")
                ),
                "calibrate writer and reader of each cache together (shared scale and zero point)",
            );
        }
    }
}

fn config_checks(facts: &Facts, out: &mut Out) {
    let Some(cfg) = &facts.config else { return };
    let cfg = match cfg {
        Ok(c) => c,
        Err(e) => {
            out.push(
                "config-invalid",
                format!("hailo-config.json: {e}"),
                "rewrite hailo-config.json as a JSON object",
            );
            return;
        }
    };
    for (k, t) in &cfg.bad_types {
        out.push(
            "config-invalid",
            format!("hailo-config.json: {k} is not a {t}"),
            "fix the value type; the server ignores or rejects it",
        );
    }
    for k in &cfg.unknown_keys {
        if k == "pre_process_params.prefill_input_tokens_size" {
            out.push(
                "config-key-size",
                "pre_process_params.prefill_input_tokens_size is ignored by the server".into(),
                "rename it to prefill_input_tokens_count",
            );
        } else {
            out.push(
                "config-unknown-key",
                format!("hailo-config.json key {k} is not read by the server"),
                "remove it or fix its spelling",
            );
        }
    }
    if cfg.eos_token_id.is_none() {
        out.push(
            "config-missing-key",
            "eos_token_id is missing (required by the server)".into(),
            "add eos_token_id to hailo-config.json",
        );
    }
    for (name, (_, given)) in [
        ("kv_cache_size", cfg.kv_cache_size),
        ("num_attention_heads", cfg.num_attention_heads),
        ("num_key_value_heads", cfg.num_key_value_heads),
        ("prefill_input_tokens_count", cfg.prefill_input_tokens_count),
    ] {
        if !given {
            out.push_sev(
                "config-missing-key",
                Severity::Warning,
                format!("pre_process_params.{name} is absent; the server uses its default"),
                "write the compiled value explicitly",
            );
        }
    }
}

fn io_checks(facts: &Facts, out: &mut Out) {
    let cfg = facts.config();
    let (nh, nkv, kv) = (facts.nh(), facts.nkv(), facts.kv());
    let d = facts.theta.as_ref().map(|t| t.len());
    if let Some(t) = &facts.theta {
        if t.is_empty() || t.len() % 2 != 0 {
            out.push(
                "rope-theta",
                format!(
                    "rope_theta_data.bin holds {} float32 values; D must be even and non-zero",
                    t.len()
                ),
                "write head_dim float32 values",
            );
        }
    }
    let mut widths: Vec<(&str, usize)> = Vec::new();
    let mut f_seen: Vec<(&str, usize)> = Vec::new();
    for (g, t, what) in facts.llm_groups() {
        // Input suffixes resolve (§5.7.7).
        for (_, role, _) in config::SUFFIX_KEYS {
            if roles::input_for(g, cfg, role).is_none() {
                out.push(
                    "input-suffix",
                    format!(
                        "{what} group \"{}\": no input ends with \"{}\" ({role:?})",
                        g.name,
                        roles::suffix_for(cfg, role).unwrap_or_default()
                    ),
                    "fix input_layers_names_suffixes or the input layer names",
                );
            }
        }
        if let Some(e) = roles::input_for(g, cfg, InputRole::Embeddings) {
            let mut why = Vec::new();
            if e.data_bytes != 2 {
                why.push(format!(
                    "data_bytes {} (server requires uint16)",
                    e.data_bytes
                ));
            }
            if e.rows() != t {
                why.push(format!("{} rows, expected T = {t}", e.rows()));
            }
            if !why.is_empty() {
                out.push(
                    "embeddings-input",
                    format!("{what} embeddings input \"{}\": {}", e.name, why.join(", ")),
                    "compile the embeddings input as uint16 with T rows (P for prefill, 1 for tbt)",
                );
            }
            f_seen.push((what, e.shape[2] as usize));
        }
        if let Some(m) = roles::input_for(g, cfg, InputRole::AttentionMask) {
            let frame = m.elements();
            if m.data_bytes != 1 || frame != t.saturating_mul(nh).saturating_mul(kv) {
                out.push(
                    "mask-shape",
                    format!("{what} mask \"{}\": {} bytes/elem, frame {frame}, expected uint8 frame T·NH·KV = {t}·{nh}·{kv} = {}", m.name, m.data_bytes, t.saturating_mul(nh).saturating_mul(kv)),
                    "declare the mask input as uint8 [T, NH, KV] with the config's heads and kv_cache_size",
                );
            }
        }
        for (role, heads, label) in [
            (InputRole::PeQCos, nh, "NH"),
            (InputRole::PeQSin, nh, "NH"),
            (InputRole::PeKCos, nkv, "NKV"),
            (InputRole::PeKSin, nkv, "NKV"),
        ] {
            let Some(l) = roles::input_for(g, cfg, role) else {
                continue;
            };
            let frame = l.elements();
            let bad = match d {
                Some(d) => frame != t.saturating_mul(heads).saturating_mul(d),
                None => t.saturating_mul(heads) == 0 || frame % t.saturating_mul(heads) != 0,
            };
            if bad {
                out.push(
                    "rope-width",
                    format!(
                        "{what} {role:?} input \"{}\": frame {frame}, expected T·{label}·D = {t}·{heads}·{}",
                        l.name,
                        d.map(|d| d.to_string()).unwrap_or_else(|| "D".into())
                    ),
                    "declare the final tiled width (heads × head_dim) and attach theta once",
                );
            }
        }
        // Outputs: one position each, equal frames, all in the sorted list, total = vocabulary.
        let mut frames = BTreeSet::new();
        for o in &g.outputs {
            if o.rows() != 1 {
                out.push(
                    "output-shape",
                    format!(
                        "{what} output \"{}\" has shape {:?}: logits for {} positions",
                        o.name,
                        o.shape,
                        o.rows()
                    ),
                    "slice the last position before the lm_head so the output is [1,1,vocab]",
                );
            }
            frames.insert(o.elements());
            if !g.sorted_output_names.contains(&o.name) {
                out.push(
                    "output-order",
                    format!(
                        "{what} output \"{}\" is missing from the sorted output names ({})",
                        o.name, g.sorted_output_source
                    ),
                    "recompile; HailoRT refuses outputs missing from the sorted list",
                );
            }
        }
        if frames.len() > 1 {
            out.push(
                "output-shards",
                format!("{what} outputs have unequal frame sizes {frames:?}; the server concatenates assuming equal shards"),
                "split the lm_head into equal-width shards",
            );
        }
        let width: usize = g.outputs.iter().map(|o| o.shape[2] as usize).sum();
        widths.push((what, width));
    }
    if f_seen.len() == 2 && f_seen[0].1 != f_seen[1].1 {
        out.push(
            "embeddings-input",
            format!(
                "embeddings features differ: prefill {} vs tbt {}",
                f_seen[0].1, f_seen[1].1
            ),
            "both groups read the same embeddings table; use one F",
        );
    }
    if let (Some(&(_, f)), Some(len)) = (f_seen.first(), facts.embedding_bytes) {
        if f > 0 && len % f.saturating_mul(2) != 0 {
            out.push(
                "embeddings-table",
                format!(
                    "embeddings.bin is {len} bytes, not a multiple of 2F = {}",
                    2 * f
                ),
                "write the table as rows of F uint16 values",
            );
        }
    }
    for (what, width) in widths {
        let (expected, source) = match (facts.embedding_rows, facts.tokenizer_vocab) {
            (Some(r), _) => (Some(r), "embeddings.bin rows"),
            (None, Some(v)) => (Some(v), "tokenizer.json vocabulary"),
            _ => (None, ""),
        };
        let tok_too_big = facts.tokenizer_vocab.is_some_and(|v| v > width);
        if expected.is_some_and(|e| e != width) || tok_too_big {
            out.push(
                "output-width",
                format!(
                    "{what} logits width {width} != vocabulary {} ({source}{})",
                    expected.unwrap_or(0),
                    facts
                        .tokenizer_vocab
                        .map(|v| format!(", tokenizer {v}"))
                        .unwrap_or_default()
                ),
                "end the graph with the model's lm_head so the outputs cover the whole vocabulary",
            );
        }
    }
}
