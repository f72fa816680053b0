//! The reader-side cache rules: golden rings re-encoded for another reader layout or read under
//! another mask, the column map's mixing rows, and the eliminations that blame the tbt reader
//! (docs/diagnosis.md, cache rules b', d'', f, g). The rule tables stay in `cache.rs`.

use kvprobe_schema::{CacheKind, InjectFinding, Layout, ReaderEdgeLayout, Verdict};

use super::facts::RingFacts;
use crate::diagnose::engine::Cause;
use crate::thresholds::*;

/// Never-written entries are the decisive rows (fault signatures): identical = token-local,
/// different = a reader layout spreading real data over them. Row classes decide only when no
/// never-written entry was covered: single-key responses of a real model share a common
/// component, so its rows look mixed.
pub(super) fn reader_mixes(f: &RingFacts) -> Option<bool> {
    let (cm, zt) = (f.colmap.as_ref()?, f.ztap.as_ref()?);
    Some(match cm.empty_rows_identical {
        Some(identical) => !identical,
        None => cm.mixture_rows > cm.clean_rows || zt.interpretation == "transposition",
    })
}

/// b'. Golden rings re-encoded over the tbt read window for a reader that decodes some edges in
/// another named layout reproduce the reference, as precisely as the controls, where
/// token-major golden rings do not (whatever `inject` blamed: golden rings that beat the
/// device's without reaching the reference blame the writer; a binding only when a partial
/// swap, not the whole-device one or crossed writes, blamed it): that repair names the
/// reader's layout, before any output-level discriminator (a K read in feature-major on one
/// layer can look like a position shift).
pub(super) fn reader_layout_repair(f: &RingFacts) -> Option<Cause> {
    let inj = f.inject.as_ref().filter(|i| i.crossed_writes.is_empty())?;
    let r = inj.reader_layout.as_ref()?;
    if !golden_variant_repairs(f, inj, r.comparison.cosine) {
        return None;
    }
    // a binding blamed on a partial swap only: the more precise of the two repairs names it,
    // at the healthy step's precision whatever the controls' noise (a tbt graph repeating the
    // KV heads in blocks fails its self-only steps too, 0.958, and the f8cr reader reached
    // 0.970 there: both fits, neither the cause)
    if inj.blame == "binding"
        && !inj.partial_swap.as_ref().is_some_and(|p| {
            p.comparison.cosine < r.comparison.cosine && 1.0 - r.comparison.cosine <= REL_TBT_GAP
        })
    {
        return None;
    }
    Some(Cause::new(0.9).line(format!(
        "→ cache-layout-mismatch (reader): golden token-major rings fail ({:.4}, device rings {:.4}) but reproduce the reference ({:.4}) re-encoded for a tbt reader that decodes {}",
        inj.golden.cosine,
        inj.device_rings.cosine,
        r.comparison.cosine,
        reader_edges(&r.edges, layers_seen(f))
    )))
}

/// A variant of the golden rings (another reader layout, another mask) repairs the step that
/// the device's and the golden rings leave, as precisely as the device's controls: the layout
/// search tries up to 4 candidates per layer, and a wrong one reached 0.976 against a right
/// one's 0.99999.
pub(super) fn golden_variant_repairs(f: &RingFacts, inj: &InjectFinding, c: f64) -> bool {
    let precise = 1.0 - c <= (REL_RATIO * f.cache_noise()).max(REL_TBT_GAP);
    precise && rings_repair(inj.golden.cosine.max(inj.device_rings.cosine), c)
}

/// d''. Golden rings read with the left-valid mask reproduce the reference where both the
/// device's rings under every mask and the golden rings under the ring mask fail: the tbt
/// graph takes the left-valid convention, and the prefill wrote its cache under it too (so no
/// mask over the device's own rings reproduces).
pub(super) fn golden_left_valid(f: &RingFacts) -> Option<Cause> {
    let inj = f.inject.as_ref().filter(|i| i.blame != "binding")?;
    let c = inj.golden_left_valid.as_ref()?;
    if !golden_variant_repairs(f, inj, c.cosine) {
        return None;
    }
    Some(Cause::new(0.85).line(format!(
        "→ mask-convention: golden token-major rings read with the `left-valid` mask reproduce the reference ({:.4}) where the ring mask gives {:.4} on them and no mask reproduces on the device's own rings: the tbt graph takes the left-valid convention (and the prefill's multi-chunk rows, where they fail, wrote under it)",
        c.cosine, inj.golden.cosine
    )))
}

/// Layers the `layout` probe decoded (every layer with a cache edge).
fn layers_seen(f: &RingFacts) -> usize {
    f.layout
        .as_ref()
        .and_then(|l| l.caches.iter().filter_map(|c| c.layer).max())
        .map_or(0, |m| m + 1)
}

/// "K in f8cr on every layer", "K of layers 0, 3 in feature-major; V of layer 1 in f8cr".
fn reader_edges(edges: &[ReaderEdgeLayout], n_layers: usize) -> String {
    let mut groups: Vec<(CacheKind, Layout, Vec<usize>)> = Vec::new();
    for e in edges {
        match groups.iter_mut().find(|g| g.0 == e.kind && g.1 == e.layout) {
            Some(g) => g.2.push(e.layer),
            None => groups.push((e.kind, e.layout, vec![e.layer])),
        }
    }
    groups
        .iter()
        .map(|(kind, layout, layers)| {
            let kind = if *kind == CacheKind::K { "K" } else { "V" };
            if n_layers > 1 && layers.len() == n_layers {
                format!("{kind} in {} on every layer", layout.name())
            } else {
                let list: Vec<String> = layers.iter().map(usize::to_string).collect();
                let noun = if layers.len() == 1 { "layer" } else { "layers" };
                format!("{kind} of {noun} {} in {}", list.join(", "), layout.name())
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn reader_blamed(f: &RingFacts) -> bool {
    f.inject.as_ref().is_some_and(|i| i.blame == "reader")
}

pub(super) fn reader_layout(f: &RingFacts) -> Option<Cause> {
    let (inj, cm) = (f.inject.as_ref()?, f.colmap.as_ref()?);
    if !reader_blamed(f) || reader_mixes(f) != Some(true) {
        return None;
    }
    Some(Cause::new(0.85).line(format!(
        "→ cache-layout-mismatch (reader): golden token-major rings fail too ({:.4}) and column-map rows mix tokens ({} of {} mixtures; never-written rows differ): the tbt reader uses another layout",
        inj.golden.cosine, cm.mixture_rows, cm.rows.len()
    )))
}

/// The reader's elimination: a crossed layer whose single swap moves the step by less than
/// inject's per-layer screen escapes it, hence `also` kv-binding. A late rule, after kvdiff
/// and `tbt-k-rotated`: the rotation rule reads the cache and names a cause this one only
/// eliminates to (SmolLM2 `rope-k-tile=8@tbt` on a 5-token prompt ended `tbt-graph` here).
pub(super) fn reader_elimination(f: &RingFacts) -> Option<Cause> {
    let (inj, cm) = (f.inject.as_ref()?, f.colmap.as_ref()?);
    if !reader_blamed(f) || reader_mixes(f) != Some(false) || f.controls_pass() {
        return None;
    }
    Some(Cause::new(0.65).also(Verdict::KvBinding, 0.5).line(format!(
        "→ tbt-graph (by elimination): golden rings fail ({:.4}), the column map stays diagonal ({:.3}), positions, masks, quant and placement are clean; the self-only control is blind to the attention scale",
        inj.golden.cosine, cm.diagonal_strength
    )))
}
