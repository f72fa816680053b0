//! Does this HEF belong to this model? (`kvprobe inspect --model`, finding F6 and friends):
//! vocabulary, hidden size, heads, layers, tokenizer, embedding table and RoPE theta.

use super::lint::{Facts, Lint, Severity};
use super::model::Hef;
use super::roles;
use kvprobe_reference::Model;
use kvprobe_schema::InputRole;

use Severity::{Error as E, Warning as W};

/// Pairing checks, in the same shape as `lint::CHECKS`.
pub const CHECKS: &[super::lint::Check] = &[
    super::lint::Check { id: "pair-vocab", severity: E, what: "HEF logits width and embedding rows equal the model vocabulary", refs: &["F1", "F6", "F12"] },
    super::lint::Check { id: "pair-hidden", severity: E, what: "embeddings input features equal the model hidden size", refs: &["§2.1"] },
    super::lint::Check { id: "pair-heads", severity: E, what: "hailo-config head counts equal the model's", refs: &["§3.1", "F5"] },
    super::lint::Check { id: "pair-head-dim", severity: E, what: "RoPE theta length D equals the model head_dim", refs: &["§2.6", "F3"] },
    super::lint::Check { id: "pair-layers", severity: E, what: "one K and one V cache per model layer, entry size NKV·head_dim·bytes (or NH·… expanded)", refs: &["§1.2"] },
    super::lint::Check { id: "pair-tokenizer", severity: E, what: "the HEF tokenizer.json encodes a sample text like the model's tokenizer", refs: &["§2.11", "F6"] },
    super::lint::Check { id: "pair-bos", severity: W, what: "the model expects a BOS the server never adds", refs: &["§2.11", "F6"] },
    super::lint::Check { id: "pair-embeddings", severity: E, what: "embeddings.bin dequantised with the embeddings input quant matches the model table (cosine)", refs: &["§2.11", "F6"] },
    super::lint::Check { id: "pair-rope-theta", severity: E, what: "rope_theta_data.bin matches the model's inverse frequencies", refs: &["§2.6", "F3"] },
    super::lint::Check { id: "pair-context", severity: W, what: "cache length within the model's position limit", refs: &["§2.9"] },
];

/// Texts the tokenizers are compared on: words, digits, punctuation, spacing and non-ASCII.
pub const SAMPLE_TEXTS: &[&str] = &[
    "Once upon a time, there was a little girl named Lily.",
    "The year 2024 had 366 days; 12 * 34 = 408!",
    "  leading spaces, tabs\tand\nnew lines",
    "naïve café — ünïcödé ✓",
];

/// Minimum mean cosine between dequantised embeddings.bin rows and the model's rows. uint16
/// quantisation of a matching table stays above 0.9999; a different table or zero point falls
/// far below.
pub const EMBEDDING_COSINE_MIN: f64 = 0.99;

fn push(out: &mut Vec<Lint>, id: &'static str, message: String, fix: &str) {
    let c = CHECKS.iter().find(|c| c.id == id).unwrap_or(&CHECKS[0]);
    out.push(Lint {
        id,
        severity: c.severity,
        message,
        fix: fix.into(),
        refs: c.refs,
    });
}

/// Runs every pairing check of `hef` against `model`.
pub fn pair(hef: &Hef, model: &Model) -> Vec<Lint> {
    let facts = Facts::new(hef);
    let cfg = model.config();
    let mut out = Vec::new();
    let prefill = facts.prefill;

    // Vocabulary (F1/F6).
    if let Some(g) = prefill {
        let width: usize = g.outputs.iter().map(|o| o.shape[2] as usize).sum();
        if width != cfg.vocab_size {
            push(
                &mut out,
                "pair-vocab",
                format!(
                    "HEF logits width {width} != model vocab_size {}",
                    cfg.vocab_size
                ),
                "compile the HEF from this model, or pass the model it was compiled from",
            );
        }
    }
    if let Some(rows) = facts.embedding_rows {
        if rows != cfg.vocab_size {
            push(
                &mut out,
                "pair-vocab",
                format!(
                    "embeddings.bin has {rows} rows, model vocab_size {}",
                    cfg.vocab_size
                ),
                "embed this model's token table in the HEF",
            );
        }
    }
    // Hidden size.
    let emb_input =
        prefill.and_then(|g| roles::input_for(g, facts.config(), InputRole::Embeddings));
    if let Some(e) = emb_input {
        if e.shape[2] as usize != cfg.hidden_size {
            push(
                &mut out,
                "pair-hidden",
                format!(
                    "HEF embeddings features {} != model hidden_size {}",
                    e.shape[2], cfg.hidden_size
                ),
                "compile the HEF from this model",
            );
        }
    }
    // Heads.
    if let Some(c) = facts.config() {
        if c.num_attention_heads.0 as usize != cfg.n_heads
            || c.num_key_value_heads.0 as usize != cfg.n_kv_heads
        {
            push(
                &mut out,
                "pair-heads",
                format!(
                    "hailo-config heads {}/{} (attention/kv) != model {}/{}",
                    c.num_attention_heads.0, c.num_key_value_heads.0, cfg.n_heads, cfg.n_kv_heads
                ),
                "write the model's num_attention_heads and num_key_value_heads into hailo-config.json",
            );
        }
    }
    rope(&facts, model, &mut out);
    caches(&facts, cfg, &mut out);
    tokenizer_checks(hef, model, &mut out);
    embedding_checks(hef, &facts, model, &mut out);
    out
}

/// Compares magnitudes only: the sign convention of shipped theta files is not visible (§2.6).
fn theta_mismatch(theta: &[f32], inv: &[f32], base: f64) -> Option<String> {
    let half = theta.len() / 2;
    if inv.len() != half {
        return Some(format!(
            "model has {} inverse frequencies, HEF theta {} (expects D/2)",
            inv.len(),
            theta.len()
        ));
    }
    let worst = (0..half)
        .flat_map(|i| [(theta[i], inv[i]), (theta[i + half], inv[i])])
        .map(|(t, f)| ((t.abs() - f).abs() / f.abs().max(1e-30)) as f64)
        .fold(0.0f64, f64::max);
    if worst <= 1e-3 {
        return None;
    }
    // theta[1] = base^(-1/half) → implied base
    let implied = if half > 1 && theta[1] != 0.0 {
        (theta[1].abs() as f64).powf(-(half as f64))
    } else {
        f64::NAN
    };
    Some(format!("HEF theta differs from the model's inverse frequencies by up to {:.1}% (implied base {implied:.4e}, model rope_theta {base:e})", worst * 100.0))
}

fn tokenizer_checks(hef: &Hef, model: &Model, out: &mut Vec<Lint>) {
    let Some(bytes) = hef.resource("tokenizer.json") else {
        return;
    };
    let tk = match tokenizers::Tokenizer::from_bytes(bytes) {
        Ok(t) => t,
        Err(e) => {
            let first = e.to_string().lines().next().unwrap_or("").to_string();
            push(
                out,
                "pair-tokenizer",
                format!("the HEF tokenizer.json does not load: {first}"),
                "embed the model's tokenizer.json",
            );
            return;
        }
    };
    for text in SAMPLE_TEXTS {
        // The server encodes without special tokens (§2.11).
        let hef_ids = match tk.encode(*text, false) {
            Ok(enc) => enc.get_ids().to_vec(),
            Err(e) => {
                push(
                    out,
                    "pair-tokenizer",
                    format!("the HEF tokenizer fails on {text:?}: {e}"),
                    "embed the model's tokenizer.json",
                );
                return;
            }
        };
        let model_ids = match model.encode(text, Some(false)) {
            Ok(ids) => ids,
            Err(e) => {
                push(
                    out,
                    "pair-tokenizer",
                    format!("the model tokenizer fails on {text:?}: {e}"),
                    "check the model's tokenizer",
                );
                return;
            }
        };
        if hef_ids != model_ids {
            let at = hef_ids
                .iter()
                .zip(&model_ids)
                .position(|(a, b)| a != b)
                .unwrap_or(hef_ids.len().min(model_ids.len()));
            push(
                out,
                "pair-tokenizer",
                format!(
                    "tokenizers disagree on {text:?} from token {at}: HEF {:?} vs model {:?}",
                    &hef_ids[at.min(hef_ids.len())..hef_ids.len().min(at + 4)],
                    &model_ids[at.min(model_ids.len())..model_ids.len().min(at + 4)]
                ),
                "embed the model's own tokenizer.json in the HEF",
            );
            break;
        }
    }
    if model.config().add_bos {
        push(
            out,
            "pair-bos",
            "the model adds a BOS token by default, the genai server adds none".into(),
            "put the BOS text at the start of the chat template",
        );
    }
}

fn embedding_checks(hef: &Hef, facts: &Facts, model: &Model, out: &mut Vec<Lint>) {
    let (Some(bytes), Some(g)) = (hef.resource("embeddings.bin"), facts.prefill) else {
        return;
    };
    let Some(input) = roles::input_for(g, facts.config(), InputRole::Embeddings) else {
        return;
    };
    let f = input.shape[2] as usize;
    let (rows, hidden) = model.embedding_dims();
    if f == 0 || f != hidden || bytes.len() < 2 * f {
        return; // pair-hidden / embeddings-table already say why
    }
    let hef_rows = bytes.len() / (2 * f);
    let n = hef_rows.min(rows);
    let q = input.quant;
    let samples = 256.min(n);
    let mut cos_sum = 0.0f64;
    let mut cos_min = f64::INFINITY;
    let mut worst_row = 0;
    let mut counted = 0usize;
    for k in 0..samples {
        let r = if samples > 1 {
            k * (n - 1) / (samples - 1)
        } else {
            0
        };
        let Ok(model_row) = model.embedding_rows(r, r + 1) else {
            return;
        };
        let off = r * 2 * f;
        let hef_row: Vec<f32> = bytes[off..off + 2 * f]
            .chunks_exact(2)
            .map(|c| (f32::from(u16::from_le_bytes([c[0], c[1]])) - q.zero_point) * q.scale)
            .collect();
        let (mut dot, mut na, mut nb) = (0.0f64, 0.0f64, 0.0f64);
        for (a, b) in hef_row.iter().zip(&model_row) {
            dot += f64::from(*a) * f64::from(*b);
            na += f64::from(*a) * f64::from(*a);
            nb += f64::from(*b) * f64::from(*b);
        }
        if na == 0.0 || nb == 0.0 {
            continue;
        }
        let c = dot / (na.sqrt() * nb.sqrt());
        cos_sum += c;
        counted += 1;
        if c < cos_min {
            cos_min = c;
            worst_row = r;
        }
    }
    if counted == 0 {
        return;
    }
    let mean = cos_sum / counted as f64;
    if mean < EMBEDDING_COSINE_MIN {
        push(
            out,
            "pair-embeddings",
            format!("embeddings.bin vs model table: mean cosine {mean:.4} over {counted} rows (worst {cos_min:.4} at row {worst_row}), dequantised with scale {} zero point {}", q.scale, q.zero_point),
            "embed this model's table, quantised with the embeddings input's scale and zero point",
        );
    }
}

/// Head dim and theta (RoPE models).
fn rope(facts: &Facts, model: &Model, out: &mut Vec<Lint>) {
    let cfg = model.config();
    match (&facts.theta, model.rope_inv_freq()) {
        (Some(theta), Some(inv)) => {
            if theta.len() != cfg.head_dim {
                push(
                    out,
                    "pair-head-dim",
                    format!(
                        "rope_theta_data.bin has D = {} values, model head_dim {}",
                        theta.len(),
                        cfg.head_dim
                    ),
                    "write head_dim theta values",
                );
            } else if let Some(msg) = theta_mismatch(theta, &inv, cfg.rope_theta) {
                push(
                    out,
                    "pair-rope-theta",
                    msg,
                    "regenerate rope_theta_data.bin from the model's rope_theta",
                );
            }
        }
        (Some(_), None) => push(
            out,
            "pair-rope-theta",
            "the HEF carries RoPE theta but the model uses learned positions".into(),
            "pass the model this HEF was compiled from",
        ),
        _ => {}
    }
}

/// Layers, entry size and context of the prefill group's caches.
fn caches(facts: &Facts, cfg: &kvprobe_reference::ModelConfig, out: &mut Vec<Lint>) {
    let prefill = facts.prefill;
    if let Some(g) = prefill {
        let ids: std::collections::BTreeSet<i32> =
            g.cache_edges.iter().map(|e| e.cache_id).collect();
        if !ids.is_empty() && ids.len() != 2 * cfg.n_layers {
            push(
                out,
                "pair-layers",
                format!(
                    "HEF has {} caches, model has {} layers (expects 2 per layer)",
                    ids.len(),
                    cfg.n_layers
                ),
                "compile the HEF from this model",
            );
        }
        if let Some(e) = g.cache_edges.first() {
            let bytes = e.data_bytes.max(1) as usize;
            let un = cfg.n_kv_heads * cfg.head_dim * bytes;
            let ex = cfg.n_heads * cfg.head_dim * bytes;
            if e.entry_size != un && e.entry_size != ex {
                push(out, "pair-layers", format!("cache entry size {} matches neither NKV·hd·bytes = {un} nor NH·hd·bytes = {ex}", e.entry_size), "compile the HEF from this model");
            }
        }
        let l = g
            .cache_edges
            .iter()
            .filter(|e| e.cache_id == g.cache_edges[0].cache_id)
            .fold(0usize, |sum, e| sum.saturating_add(e.length));
        if !g.cache_edges.is_empty() && cfg.max_position > 0 && l > cfg.max_position {
            push(
                out,
                "pair-context",
                format!(
                    "cache length {l} exceeds the model's {} positions",
                    cfg.max_position
                ),
                "compile with a cache no longer than the model's context",
            );
        }
    }
}
