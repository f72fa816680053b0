//! Checks of the groups' inputs and outputs against the config and the shipped resources.

use std::collections::BTreeSet;

use kvprobe_schema::InputRole;

use super::{Facts, Out};
use crate::hailo::hef::model::Group;
use crate::hailo::hef::{config, roles};

pub(super) fn io_checks(facts: &Facts, out: &mut Out) {
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
        if let Some(f) = group_inputs(facts, g, t, what, out) {
            f_seen.push((what, f));
        }
        let width = group_outputs(g, what, out);
        widths.push((what, width));
    }
    resources(facts, &f_seen, widths, out);
}

/// One LLM group's inputs: suffixes, embeddings, mask and RoPE widths. Returns the embeddings
/// input's features.
fn group_inputs(facts: &Facts, g: &Group, t: usize, what: &str, out: &mut Out) -> Option<usize> {
    let cfg = facts.config();
    let (nh, nkv, kv) = (facts.nh(), facts.nkv(), facts.kv());
    let d = facts.theta.as_ref().map(|t| t.len());
    let mut features = None;
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
        features = Some(e.shape[2] as usize);
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
    features
}

/// One LLM group's outputs: one position each, equal frames, all in the sorted list. Returns
/// the logits width.
fn group_outputs(g: &Group, what: &str, out: &mut Out) -> usize {
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
    g.outputs.iter().map(|o| o.shape[2] as usize).sum()
}

/// The shipped embeddings table and vocabulary against the groups.
fn resources(facts: &Facts, f_seen: &[(&str, usize)], widths: Vec<(&str, usize)>, out: &mut Out) {
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
