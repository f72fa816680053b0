//! Drawing faults, scopes, values, geometries and prompts for the cases.

use kvprobe_npu::contract::faults::{FaultDecl, FaultTable, ScopeKind, SweepValue};

use kvprobe_schema::Geometry;

use super::case::{Case, ModelSpec};
use super::rng::Rng;

/// The emulator's fault table, which the sweep draws from and judges against.
fn table() -> &'static FaultTable {
    &kvprobe_npu::hailo::sim::FAMILY.faults
}

/// Expected verdict per fault, from the emulator's fault table (the README table is generated
/// from the same rows): graph faults a user scopes to one group are expected at that group's
/// stage (`softmax=…@tbt` → `tbt-graph`; `@prefill` or both → `prefill-graph`).
pub fn expected(fault: &str) -> &'static str {
    table().expected(fault).map_or("unknown", |v| v.name())
}

/// The sweep's fault families in table order: a fault name, or `name=value` where the table
/// declares one name once per value (`mask=left-valid`, `mask=repeat`). Rows marked
/// `SweepValue::NotSampled` are left out.
pub fn families() -> Vec<String> {
    table()
        .faults
        .iter()
        .filter(|d| d.sweep != SweepValue::NotSampled)
        .map(|d| family_label(d.name, fixed_value(d)))
        .collect()
}

fn fixed_value(d: &FaultDecl) -> Option<&'static str> {
    match d.sweep {
        SweepValue::Fixed(v) => Some(v),
        _ => None,
    }
}

fn declared_once(name: &str) -> bool {
    table().faults.iter().filter(|d| d.name == name).count() == 1
}

fn family_label(name: &str, value: Option<&str>) -> String {
    match value {
        Some(v) if !declared_once(name) => format!("{name}={v}"),
        _ => name.to_string(),
    }
}

/// Draws a geometry; `multi_chunk` forces at least two prefill chunks (faults that act only on
/// cache reads inside prefill are no-ops on a single chunk).
/// Returns the ring geometry and the number of steps.
fn draw_geometry(rng: &mut Rng, m: &ModelSpec, multi_chunk: bool) -> (Geometry, usize) {
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
        let g = Geometry {
            cache_len: l,
            prefill_len: p,
            prompt_len: n,
        };
        return (g, steps);
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

/// One fault of `family` with random value and scope, drawn as its table row says; `None` when
/// the model cannot take it (the emulator would refuse it as a no-op, e.g. block GQA order
/// without grouped heads). Returns the fault text and whether it needs a multi-chunk prompt.
fn draw_fault(rng: &mut Rng, family: &str, m: &ModelSpec) -> Option<(String, bool)> {
    let decl = table().faults.iter().find(|d| {
        d.sweep != SweepValue::NotSampled && family_label(d.name, fixed_value(d)) == family
    })?;
    if decl.name == "gqa-repeat" && (m.n_kv_heads == m.n_heads || m.n_kv_heads == 1) {
        // the block order equals the HF order without grouped heads
        return None;
    }
    let value = draw_value(rng, decl.sweep, m)?;
    let scope = draw_scope(rng, decl.scopes, m);
    // a prefill-only mask convention needs cached columns inside prefill: two chunks at least
    let multi = decl.name == "mask" && scope == ["prefill"];
    let value = value.map_or(String::new(), |v| format!("={v}"));
    Some((format!("{}{value}{}", decl.name, scope_text(scope)), multi))
}

/// The value part (`None` inside: the fault takes none); `None`: the model cannot take it.
fn draw_value(rng: &mut Rng, sweep: SweepValue, m: &ModelSpec) -> Option<Option<String>> {
    Some(Some(match sweep {
        SweepValue::None | SweepValue::NotSampled => return Some(None),
        SweepValue::Fixed(v) => v.to_string(),
        SweepValue::OneOf(values) => {
            // f8cr groups 8 bytes: only where an entry is a whole number of groups
            let fits: Vec<&str> = values
                .iter()
                .copied()
                .filter(|v| *v != "f8cr" || m.entry_bytes.is_multiple_of(8))
                .collect();
            if fits.len() > 1 {
                rng.pick(&fits).to_string()
            } else {
                fits.first()?.to_string()
            }
        }
        SweepValue::Factor => draw_scale(rng),
        SweepValue::SmallSigned => {
            let n = rng.range(1, 4) as i64 * if rng.coin(0.5) { 1 } else { -1 };
            format!("{n:+}")
        }
        SweepValue::EntryFraction => {
            let e = m.entry_bytes;
            let n = match rng.range(0, 3) {
                0 => e / 2,
                1 => e / 4,
                2 => 3 * e / 4,
                _ => rng.range(1, e - 1),
            };
            n.to_string()
        }
        SweepValue::HeadFraction => {
            let head_dim = m.entry_bytes / m.n_kv_heads;
            let widths: Vec<usize> = [head_dim / 4, head_dim / 8]
                .into_iter()
                .filter(|&w| m.rope && w >= 2)
                .collect();
            if widths.is_empty() {
                return None;
            }
            rng.pick(&widths).to_string()
        }
        SweepValue::RopeFactor => {
            if !m.rope {
                return None;
            }
            rng.pick(&["2", "4", "8"]).to_string()
        }
        SweepValue::OtherRopeConvention => {
            if !m.rope {
                return None;
            }
            // the sweep runs the emulator's default graph: the table ships in the other
            // convention (the same one is a no-op the emulator refuses)
            kvprobe_npu::sim::SimOptions::default()
                .rope_theta
                .other()
                .name()
                .to_string()
        }
    }))
}

/// The scope parts for the scopes a fault accepts.
fn draw_scope(rng: &mut Rng, scopes: &[ScopeKind], m: &ModelSpec) -> Vec<String> {
    use ScopeKind::{Group, Kv, Layer};
    match scopes {
        [Kv, Layer] => kv_layer_scope(rng, m),
        [Group] => group_scope(rng),
        [Layer] => {
            if rng.coin(0.5) {
                draw_layers(rng, m.n_layers)
                    .into_iter()
                    .map(|l| format!("layer={l}"))
                    .collect()
            } else {
                vec![]
            }
        }
        [Group, Kv, Layer] => {
            let mut parts = kv_layer_scope(rng, m);
            match rng.range(0, 3) {
                0 => parts.insert(0, "prefill".into()),
                1 => parts.insert(0, "tbt".into()),
                _ => {}
            }
            parts
        }
        _ => vec![],
    }
}

/// `faulty` fault cases spread round-robin over the families and models, then `healthy` cases.
pub fn generate(seed: u64, models: &[ModelSpec], faulty: usize, healthy: usize) -> Vec<Case> {
    let families = families();
    let names: Vec<&str> = families.iter().map(String::as_str).collect();
    generate_families(seed, models, &names, faulty, healthy)
}

/// [`generate`] over some of the [`families`] only (the sweep's `--family`). Stops early when
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
    let (g, steps) = draw_geometry(rng, m, multi);
    let prompt = rng.pick(&m.prompts);
    let start = rng.range(0, prompt.len().saturating_sub(g.prompt_len));
    let ids: Vec<u32> = prompt[start..]
        .iter()
        .chain(prompt.iter().cycle())
        .take(g.prompt_len)
        .copied()
        .collect();
    let (expect, family) = match &fault {
        Some(f) => {
            let name = f.split(['=', '@']).next().unwrap_or(f);
            let family = if declared_once(name) {
                name.to_string()
            } else {
                f.split('@').next().unwrap_or(f).to_string()
            };
            (expected(f), family)
        }
        None => ("healthy", "healthy".to_string()),
    };
    Case {
        id,
        model: m.label.clone(),
        model_path: m.path.clone(),
        cache_len: g.cache_len,
        prefill_len: g.prefill_len,
        ids,
        steps,
        fault,
        expect,
        family,
        device: None,
        onnx: None,
    }
}
