//! Checks of the KV-cache edges: each edge, each cache's pair, the ring shared across groups,
//! the LLM contract HailoRT does not check, and agreement of layout and quant across edges.

use std::collections::{BTreeMap, BTreeSet};

use kvprobe_schema::CacheDirection;

use super::{Facts, Out};
use crate::hailo::hef::formats;
use crate::hailo::hef::geometry::{self, DescStride};
use crate::hailo::hef::model::{CacheEdge, Group, Hef};

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

pub(super) fn caches(hef: &Hef, facts: &Facts, out: &mut Out) {
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
        edge_checks(g, out);
        pair_checks(g, out, &mut lengths, &mut entry);
    }
    shared_ring(&lengths, &entry, out);
    presence(facts, out);
    llm_contract(facts, out);
    edge_agreement(facts, out);
}

/// One group's cache edges, each on its own: what HailoRT refuses at load.
fn edge_checks(g: &Group, out: &mut Out) {
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
}

/// Each cache's read/write pair in one group: pairing, entry size, window and descriptor stride;
/// records the ring length and entry size for the cross-group checks.
fn pair_checks(
    g: &Group,
    out: &mut Out,
    lengths: &mut Vec<(String, i32, usize)>,
    entry: &mut BTreeMap<i32, Vec<(String, usize)>>,
) {
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
        if i.length == 0 || o.length == 0 || i.length > 65535 || o.length > 65535 || ep > 65535 {
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
        lengths.push((g.name.clone(), id, i.length.saturating_add(o.length)));
    }
}

/// The groups share the ring bytes by cache_id: one entry size per id and one L.
fn shared_ring(
    lengths: &[(String, i32, usize)],
    entry: &BTreeMap<i32, Vec<(String, usize)>>,
    out: &mut Out,
) {
    for (id, v) in entry {
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
}

/// Both LLM groups have caches, and the same ones.
fn presence(facts: &Facts, out: &mut Out) {
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
}

/// LLM contract (§5.7.5), which HailoRT does not check: L = kv_cache_size, out = T.
fn llm_contract(facts: &Facts, out: &mut Out) {
    let llm = facts.llm_groups();
    let kv = facts.kv();
    for (g, t, what) in &llm {
        for (id, (ins, outs)) in by_id(g) {
            if ins.len() != 1 || outs.len() != 1 {
                continue;
            }
            let l = ins[0].length.saturating_add(outs[0].length);
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
}

/// Layout and quant across the four edges of each id (§5.7.6).
fn edge_agreement(facts: &Facts, out: &mut Out) {
    let llm = facts.llm_groups();
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
