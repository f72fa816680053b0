//! Drawing faults, scopes, values, geometries and prompts for the cases.

use super::case::{Case, ModelSpec};
use super::rng::Rng;

/// Expected verdict per fault: the README table. Graph faults the user scopes to one group are
/// expected at that group's stage (`softmax=…@tbt` → `tbt-graph`; `@prefill` or both →
/// `prefill-graph`, the earliest stage).
pub fn expected(fault: &str) -> &'static str {
    let (body, scope) = fault.split_once('@').unwrap_or((fault, ""));
    let name = body.split('=').next().unwrap_or(body);
    let groups: Vec<&str> = scope
        .split(',')
        .filter(|s| *s == "prefill" || *s == "tbt")
        .collect();
    let prefill_in = |default_prefill: bool| {
        if groups.is_empty() {
            default_prefill
        } else {
            groups.contains(&"prefill")
        }
    };
    match name {
        "tbt-read-layout" | "prefill-write-layout" => "cache-layout-mismatch",
        "mask" => "mask-convention",
        "offset" => "cache-offset",
        "tbt-cache-scale" => "cache-quantization",
        "tbt-position" => "position-mismatch",
        "kv-swap" => "kv-binding",
        "gqa-repeat" | "softmax" => {
            // gqa-repeat defaults to tbt only, softmax to both groups
            if prefill_in(name == "softmax") {
                "prefill-graph"
            } else {
                "tbt-graph"
            }
        }
        "tbt-attn-scale" => "tbt-graph",
        "prefill-attn-scale" => "prefill-graph",
        "truncate-entry" => "cache-truncation",
        "rope-theta" => "position-mismatch",
        _ => "unknown",
    }
}

/// Prompt length, prefill length, cache length and steps for one case.
struct Geo {
    l: usize,
    p: usize,
    n: usize,
    steps: usize,
}

/// Draws a geometry; `multi_chunk` forces at least two prefill chunks (faults that act only on
/// cache reads inside prefill are no-ops on a single chunk).
fn draw_geometry(rng: &mut Rng, m: &ModelSpec, multi_chunk: bool) -> Geo {
    loop {
        let l = rng.range(24, m.max_cache_len.min(m.max_position / 2).max(24));
        let p = rng.range(4, 32.min(l - 2));
        let remainder = rng.coin(0.5);
        let wrap = rng.coin(0.4);
        let max_chunks = (l - 1) / p;
        if max_chunks == 0 {
            continue;
        }
        let lo_chunks = if multi_chunk { 2 } else { 1 };
        if max_chunks < lo_chunks {
            continue;
        }
        let chunks = rng.range(lo_chunks, max_chunks.min(4));
        // with a remainder the prompt is (chunks − 1) full chunks plus a partial one
        let n = if remainder {
            (chunks - 1) * p + rng.range(1, p - 1)
        } else {
            chunks * p
        };
        if n < 2 || n >= l {
            continue;
        }
        let steps = if wrap {
            // the steps must run past the end of the ring
            let need = l - n + 1;
            if need + 2 > m.max_steps {
                continue;
            }
            rng.range(need + 1, m.max_steps)
        } else {
            let room = (l - n).min(m.max_steps);
            if room < 4 {
                continue;
            }
            rng.range(4, room)
        };
        return Geo { l, p, n, steps };
    }
}

pub(super) fn draw_scale(rng: &mut Rng) -> String {
    // [0.5, 2] without 1, in steps of 0.05, away from 1 by at least 0.1 on either side
    loop {
        let f = 0.5 + 0.05 * rng.range(0, 30) as f64;
        if (f - 1.0).abs() >= 0.1 - 1e-9 {
            return format!("{f:.2}").trim_end_matches('0').to_string();
        }
    }
}

/// 1-3 distinct layers, sorted.
fn draw_layers(rng: &mut Rng, n_layers: usize) -> Vec<usize> {
    let k = rng.range(1, 3.min(n_layers));
    let mut ls: Vec<usize> = Vec::new();
    while ls.len() < k {
        let l = rng.range(0, n_layers - 1);
        if !ls.contains(&l) {
            ls.push(l);
        }
    }
    ls.sort_unstable();
    ls
}

fn scope_text(parts: Vec<String>) -> String {
    if parts.is_empty() {
        String::new()
    } else {
        format!("@{}", parts.join(","))
    }
}

/// K/V and layer scope parts.
fn kv_layer_scope(rng: &mut Rng, m: &ModelSpec) -> Vec<String> {
    let mut parts = Vec::new();
    match rng.range(0, 2) {
        0 => {}
        1 => parts.push("k".into()),
        _ => parts.push("v".into()),
    }
    if rng.coin(0.4) {
        parts.extend(
            draw_layers(rng, m.n_layers)
                .into_iter()
                .map(|l| format!("layer={l}")),
        );
    }
    parts
}

fn group_scope(rng: &mut Rng) -> Vec<String> {
    match rng.range(0, 3) {
        0 => vec![],
        1 => vec!["tbt".into()],
        2 => vec!["prefill".into()],
        _ => vec!["prefill".into(), "tbt".into()],
    }
}

/// The fault names of the README table; the sweep spreads cases evenly over them.
pub const FAMILIES: &[&str] = &[
    "tbt-read-layout",
    "prefill-write-layout",
    "mask=left-valid",
    "mask=repeat",
    "offset",
    "tbt-cache-scale",
    "tbt-position",
    "kv-swap",
    "gqa-repeat",
    "tbt-attn-scale",
    "prefill-attn-scale",
    "softmax",
    "truncate-entry",
    "rope-theta",
];

/// One fault of `family` with random value and scope; `None` when the model cannot take it (the
/// emulator would refuse it as a no-op, e.g. block GQA order without grouped heads).
/// Returns the fault text and whether it needs a multi-chunk prompt.
fn draw_fault(rng: &mut Rng, family: &str, m: &ModelSpec) -> Option<(String, bool)> {
    let layouts = ["feature-major", "f8cr"];
    Some(match family {
        "tbt-read-layout" | "prefill-write-layout" => {
            let lay = if m.entry_bytes.is_multiple_of(8) {
                *rng.pick(&layouts)
            } else {
                "feature-major"
            };
            (
                format!("{family}={lay}{}", scope_text(kv_layer_scope(rng, m))),
                false,
            )
        }
        "mask=left-valid" | "mask=repeat" => {
            let g = group_scope(rng);
            // left-valid defaults to tbt; a prefill-only mask fault needs cached columns in prefill
            let prefill_only = g == ["prefill"];
            (format!("{family}{}", scope_text(g)), prefill_only)
        }
        "offset" => ("offset=after-run".into(), false),
        "tbt-cache-scale" => (
            format!(
                "tbt-cache-scale={}{}",
                draw_scale(rng),
                scope_text(kv_layer_scope(rng, m))
            ),
            false,
        ),
        "tbt-position" => {
            let n = rng.range(1, 4) as i64 * if rng.coin(0.5) { 1 } else { -1 };
            (format!("tbt-position={n:+}"), false)
        }
        "kv-swap" => {
            let parts = if rng.coin(0.5) {
                draw_layers(rng, m.n_layers)
                    .into_iter()
                    .map(|l| format!("layer={l}"))
                    .collect()
            } else {
                vec![]
            };
            (format!("kv-swap{}", scope_text(parts)), false)
        }
        "gqa-repeat" => {
            if m.n_kv_heads == m.n_heads || m.n_kv_heads == 1 {
                return None;
            }
            (
                format!("gqa-repeat=block{}", scope_text(group_scope(rng))),
                false,
            )
        }
        "tbt-attn-scale" | "prefill-attn-scale" => (format!("{family}={}", draw_scale(rng)), false),
        "softmax" => (
            format!(
                "softmax=shared-across-heads{}",
                scope_text(group_scope(rng))
            ),
            false,
        ),
        "truncate-entry" => {
            let e = m.entry_bytes;
            let n = match rng.range(0, 3) {
                0 => e / 2,
                1 => e / 4,
                2 => 3 * e / 4,
                _ => rng.range(1, e - 1),
            };
            let mut parts = kv_layer_scope(rng, m);
            match rng.range(0, 3) {
                0 => parts.insert(0, "prefill".into()),
                1 => parts.insert(0, "tbt".into()),
                _ => {}
            }
            (format!("truncate-entry={n}{}", scope_text(parts)), false)
        }
        "rope-theta" => {
            if !m.rope {
                return None;
            }
            // the sweep runs the emulator's default graph: the table ships in the other
            // convention (the same one is a no-op the emulator refuses)
            let graph = kvprobe_npu::sim::SimOptions::default().rope_theta;
            (format!("rope-theta={}", graph.other().name()), false)
        }
        _ => return None,
    })
}

/// `faulty` fault cases spread round-robin over the families and models, then `healthy` cases.
pub fn generate(seed: u64, models: &[ModelSpec], faulty: usize, healthy: usize) -> Vec<Case> {
    generate_families(seed, models, FAMILIES, faulty, healthy)
}

/// [`generate`] over some of the [`FAMILIES`] only (the sweep's `--family`). Stops early when
/// no model can take any of them (e.g. `rope-theta` on learned positions only).
pub fn generate_families(
    seed: u64,
    models: &[ModelSpec],
    families: &[&str],
    faulty: usize,
    healthy: usize,
) -> Vec<Case> {
    let mut rng = Rng::new(seed);
    let mut cases = Vec::new();
    let mut k = 0usize;
    let mut misses = 0usize;
    while cases.len() < faulty && misses < families.len() * models.len() {
        let family = families[k % families.len()];
        let m = &models[(k / families.len()) % models.len()];
        k += 1;
        let Some((fault, multi)) = draw_fault(&mut rng, family, m) else {
            misses += 1;
            continue;
        };
        misses = 0;
        cases.push(make_case(&mut rng, m, Some(fault), multi, cases.len()));
    }
    for i in 0..healthy {
        let m = &models[i % models.len()];
        let id = cases.len();
        cases.push(make_case(&mut rng, m, None, false, id));
    }
    cases
}

fn make_case(rng: &mut Rng, m: &ModelSpec, fault: Option<String>, multi: bool, id: usize) -> Case {
    let g = draw_geometry(rng, m, multi);
    let prompt = rng.pick(&m.prompts);
    let start = rng.range(0, prompt.len().saturating_sub(g.n));
    let ids: Vec<u32> = prompt[start..]
        .iter()
        .chain(prompt.iter().cycle())
        .take(g.n)
        .copied()
        .collect();
    let (expect, family) = match &fault {
        Some(f) => {
            let name = f.split(['=', '@']).next().unwrap_or(f);
            let family = if name == "mask" {
                f.split('@').next().unwrap_or(f).to_string()
            } else {
                name.to_string()
            };
            (expected(f), family)
        }
        None => ("healthy", "healthy".to_string()),
    };
    Case {
        id,
        model: m.label.clone(),
        model_path: m.path.clone(),
        cache_len: g.l,
        prefill_len: g.p,
        ids,
        steps: g.steps,
        fault,
        expect,
        family,
    }
}
