//! What the probes measured that gives a fault hypothesis its value and its scope (issue 34,
//! docs/diagnosis.md "Replay"): the fitted attention scale and position shift, the cache scale
//! the declared quant infos imply, the layouts a reader repair decoded, and every set of rings the
//! evidence names (inconsistent quant infos, layers bound crosswise, re-encoded reader edges,
//! truncated or misplaced rings, kvdiff's first divergent ring), and of each set naming several
//! layers its lowest layer alone. A hypothesis at a value or a scope the evidence points at is
//! replayed before the ones the table only allows, and the value search runs at its scope: a
//! fault on two layers is not found by replaying it on every layer.

use kvprobe_npu::contract::faults::{FaultDecl, ScopeKind};
use kvprobe_schema::{CacheKind, FaultHypothesis, FaultValue, GroupKind, ProbeFindings, ZtapCache};

use crate::affected::{self, Ring};
use crate::session::Session;

/// A set of rings as the grammar scopes it (empty lists: every group, both kinds, every layer).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct RingScope {
    pub groups: Vec<GroupKind>,
    pub kinds: Vec<CacheKind>,
    pub layers: Vec<usize>,
}

impl RingScope {
    /// The scope of `rings` on a model of `n_layers` layers: a kind only when one kind is
    /// named, the layers only when not every layer is.
    pub fn of(rings: &[Ring], groups: Vec<GroupKind>, n_layers: usize) -> RingScope {
        let mut kinds: Vec<CacheKind> = Vec::new();
        let mut layers: Vec<usize> = Vec::new();
        let mut every_layer = false;
        for (l, k) in rings {
            if let Some(k) = k.filter(|k| !kinds.contains(k)) {
                kinds.push(k);
            }
            match l {
                Some(l) if !layers.contains(l) => layers.push(*l),
                None => every_layer = true,
                _ => {}
            }
        }
        layers.sort_unstable();
        if kinds.len() > 1 || rings.iter().any(|r| r.1.is_none()) {
            kinds.clear();
        }
        kinds.sort_by_key(|k| *k == CacheKind::V);
        if every_layer || layers.len() >= n_layers {
            layers.clear();
        }
        RingScope {
            groups,
            kinds,
            layers,
        }
    }

    /// This scope as far as `decl` takes it: the items of a kind the fault has no scope for are
    /// dropped (a swap scoped by layer only applies to both kinds).
    fn for_decl(&self, decl: &FaultDecl) -> RingScope {
        // the items of a scope kind the fault takes, none of the others
        fn keep<T: Clone>(takes: bool, items: &[T]) -> Vec<T> {
            if takes {
                items.to_vec()
            } else {
                Vec::new()
            }
        }
        let takes = |s: ScopeKind| decl.scopes.contains(&s);
        RingScope {
            groups: keep(takes(ScopeKind::Group), &self.groups),
            kinds: keep(takes(ScopeKind::Kv), &self.kinds),
            layers: keep(takes(ScopeKind::Layer), &self.layers),
        }
    }
}

/// What the probes fitted or named that can give a hypothesis its value and its scope.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Fits {
    /// Attention-scale multipliers that fit the device better than 1 (tbt step, prefill).
    pub scales: Vec<f64>,
    /// The position offset of the device's graph the position fit implies (0: none): the fit
    /// finds the host-side shift that repairs the first tbt step, the fault is its inverse.
    pub shift: i64,
    /// Cache scales the declared quant infos imply: each disagreeing writer/reader ratio and its
    /// inverse (which side scales is not declared).
    pub cache_scales: Vec<f64>,
    /// Layouts a reader repair decoded the device's rings in (`feature-major`, …).
    pub reader_layouts: Vec<String>,
    /// Layouts the prefill writer's ring bytes decode as, on the rings that are not token-major.
    pub writer_layouts: Vec<String>,
    /// Bytes a truncating writer keeps of each entry, where the zero tap names truncation:
    /// the entry up to its trailing run of all-zero columns (in bytes of `entry_bytes`).
    pub kept_bytes: Vec<f64>,
    /// Every set of rings a probe names, each as the grammar's scope.
    pub rings: Vec<RingScope>,
    /// Rings where the evidence sees a fault first show without naming its extent (kvdiff's
    /// first divergent layer and side): tried after the declared scopes, not pointed at.
    pub hinted: Vec<RingScope>,
    /// Cache entry size in bytes and head dimension (for the byte- and width-valued faults).
    pub entry_bytes: usize,
    pub head_dim: usize,
}

fn push_new(v: &mut Vec<String>, name: &str) {
    if !v.iter().any(|x| x == name) {
        v.push(name.to_string());
    }
}

/// The grammar's resolution: two decimals.
fn two_decimals(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

impl Fits {
    /// What the probes of this session fitted, with its cache entry size and head dimension.
    pub(super) fn of_session(s: &Session, p: &ProbeFindings) -> Fits {
        let desc = s.describe();
        let entry = desc
            .groups
            .iter()
            .flat_map(|g| &g.cache_edges)
            .map(|e| e.entry_size)
            .max()
            .unwrap_or(0);
        Fits::of(p, entry, desc.shape.head_dim, desc.shape.n_layers)
    }

    pub fn of(p: &ProbeFindings, entry_bytes: usize, head_dim: usize, n_layers: usize) -> Fits {
        let mut scales = Vec::new();
        let fits = [
            p.positions.as_ref().and_then(|x| x.scale.as_ref()),
            p.prefill.as_ref().and_then(|x| x.scale.as_ref()),
        ];
        for f in fits.into_iter().flatten() {
            // the multiplier fitted against the healthy hypothesis where there is one: the f32
            // fit's also carries what the declared precision does to the step (matched_fit)
            let s = two_decimals(f.against_matched.map_or(f.best_scale, |m| m.0));
            if f.best_cosine > f.unit_cosine && (s - 1.0).abs() >= 0.01 && !scales.contains(&s) {
                scales.push(s);
            }
        }
        let mut cache_scales = Vec::new();
        let mut named: Vec<(Vec<Ring>, Vec<GroupKind>)> = Vec::new();
        if let Some(q) = &p.quant {
            let off: Vec<_> = q.caches.iter().filter(|c| !c.consistent).collect();
            for r in off.iter().map(|c| c.max_scale_ratio) {
                for x in [two_decimals(r), two_decimals(1.0 / r)] {
                    if (x - 1.0).abs() >= 0.01 && x.is_finite() && !cache_scales.contains(&x) {
                        cache_scales.push(x);
                    }
                }
            }
            named.push((off.iter().map(|c| (c.layer, c.kind)).collect(), vec![]));
        }
        let mut reader_layouts = Vec::new();
        if let Some(i) = &p.inject {
            let both = |ls: &[usize]| -> Vec<Ring> {
                ls.iter()
                    .flat_map(|&l| [(Some(l), Some(CacheKind::K)), (Some(l), Some(CacheKind::V))])
                    .collect()
            };
            if let Some(s) = &i.partial_swap {
                named.push((both(&s.layers), vec![]));
            }
            named.push((both(&i.crossed_writes), vec![]));
            if let Some(r) = &i.reader_layout {
                named.push((
                    r.edges
                        .iter()
                        .map(|e| (Some(e.layer), Some(e.kind)))
                        .collect(),
                    vec![],
                ));
                for e in &r.edges {
                    push_new(&mut reader_layouts, e.layout.name());
                }
            }
        }
        let mut kept_bytes = Vec::new();
        if let Some(z) = &p.ztap {
            for c in z.caches.iter().chain(&z.tbt_written) {
                if let Some(x) = kept(c, entry_bytes).filter(|x| !kept_bytes.contains(x)) {
                    kept_bytes.push(x);
                }
            }
            let cut = affected::truncated(&z.caches);
            let tbt_cut = affected::truncated(&z.tbt_written);
            // entries only the tbt steps wrote are cut: the tbt writer's fault; the tbt steps'
            // entries examined and whole while the prompt's are cut: the prefill writer's
            if tbt_cut.is_empty() && !z.tbt_written.is_empty() {
                named.push((cut.clone(), vec![GroupKind::Prefill]));
            }
            named.push((cut, vec![]));
            named.push((tbt_cut, vec![GroupKind::Tbt]));
        }
        let mut writer_layouts = Vec::new();
        if let Some(l) = &p.layout {
            let off = affected::misplaced_layout(&l.caches);
            for c in l.caches.iter().filter(|c| off.contains(&(c.layer, c.kind))) {
                push_new(&mut writer_layouts, c.best_layout.name());
            }
            named.push((off, vec![]));
        }
        let mut rings: Vec<RingScope> = Vec::new();
        for (r, groups) in named.into_iter().filter(|(r, _)| !r.is_empty()) {
            let first = first_layer(&r);
            let scopes = [
                Some(RingScope::of(&r, groups.clone(), n_layers)),
                first.map(|f| RingScope::of(&f, groups, n_layers)),
            ];
            for scope in scopes.into_iter().flatten() {
                if !rings.contains(&scope) {
                    rings.push(scope);
                }
            }
        }
        // kvdiff's first divergent ring: where the cache first leaves its band. A candidate
        // scope, but not a pointed one: a fault on every layer diverges first at layer 0 too
        let mut hinted: Vec<RingScope> = Vec::new();
        if let Some(k) = p.kvdiff.as_ref().and_then(|k| k.first_divergent.as_ref()) {
            for r in kvdiff_rings(k.layer, k.kind) {
                let scope = RingScope::of(&r, vec![], n_layers);
                if !rings.contains(&scope) && !hinted.contains(&scope) {
                    hinted.push(scope);
                }
            }
        }
        Fits {
            scales,
            shift: p.positions.as_ref().map_or(0, |x| -x.best_delta),
            cache_scales,
            reader_layouts,
            writer_layouts,
            kept_bytes,
            rings,
            hinted,
            entry_bytes,
            head_dim,
        }
    }

    /// Whether a hypothesis of `decl` at `value` takes it from a fit (not from the table).
    pub fn fitted(&self, decl: &FaultDecl, value: &FaultValue) -> bool {
        match value {
            FaultValue::Number(x) if decl.name.ends_with("attn-scale") => self.scales.contains(x),
            FaultValue::Number(x) if decl.name.ends_with("cache-scale") => {
                self.cache_scales.contains(x)
            }
            FaultValue::Number(x) if decl.name.ends_with("-position") => {
                self.shift != 0 && *x == self.shift as f64
            }
            FaultValue::Number(x) if decl.name == "truncate-entry" => self.kept_bytes.contains(x),
            FaultValue::Word(w) if decl.name.ends_with("-read-layout") => {
                self.reader_layouts.contains(w)
            }
            FaultValue::Word(w) if decl.name.ends_with("-write-layout") => {
                self.writer_layouts.contains(w)
            }
            _ => false,
        }
    }
}

/// The rings of `rings` on its lowest layer, when it names more than one layer: a fault on one
/// layer changes what every later layer computes and writes, never an earlier one, so evidence
/// read from what the rings hold (a reader repair, a quant check, a zero tap) can name the
/// layers after the faulty one too; the lowest named layer alone is then the fault's scope.
fn first_layer(rings: &[Ring]) -> Option<Vec<Ring>> {
    let lowest = rings.iter().filter_map(|r| r.0).min()?;
    let more = rings.iter().any(|r| r.0 != Some(lowest));
    more.then(|| {
        rings
            .iter()
            .filter(|r| r.0 == Some(lowest))
            .copied()
            .collect()
    })
}

/// The rings kvdiff's first divergent ring (`layer`, `kind`) points at: that ring, and the
/// layer before it with either kind or both. kvdiff reads what the rings store, and a layer's
/// reader fault (a layout, a scale, a binding it reads with) leaves that layer's own stored K/V
/// right and changes what every later layer computes and stores: the first ring out of band is
/// then the faulty reader's next layer, whichever of its K or V the reader got wrong.
fn kvdiff_rings(layer: usize, kind: CacheKind) -> Vec<Vec<Ring>> {
    let mut out = vec![vec![(Some(layer), Some(kind))]];
    if let Some(before) = layer.checked_sub(1) {
        let (k, v) = (Some(CacheKind::K), Some(CacheKind::V));
        out.push(vec![(Some(before), k), (Some(before), v)]);
        out.push(vec![(Some(before), k)]);
        out.push(vec![(Some(before), v)]);
    }
    out
}

/// The bytes a truncating writer kept of `c`'s entries: the columns before its trailing run
/// of all-zero columns, in bytes of an `entry_bytes` entry (the taps count features).
fn kept(c: &ZtapCache, entry_bytes: usize) -> Option<f64> {
    if c.interpretation != "truncation" || c.width == 0 {
        return None;
    }
    let tail = c.zero_map.iter().rev().take_while(|&&z| z).count();
    let kept = (c.width - tail) * entry_bytes / c.width;
    (kept > 0 && kept < entry_bytes).then_some(kept as f64)
}

/// The scopes a hypothesis of `decl` tries, each with whether the evidence names it: first the
/// scopes of the rings the probes named (as far as the fault takes them), then the declared
/// default, each group and each of K, V.
pub fn scopes(decl: &FaultDecl, fits: &Fits) -> Vec<(RingScope, bool)> {
    let mut out: Vec<(RingScope, bool)> = Vec::new();
    let ringed = decl.scopes.contains(&ScopeKind::Kv) || decl.scopes.contains(&ScopeKind::Layer);
    if ringed {
        for r in &fits.rings {
            let s = r.for_decl(decl);
            if !out.iter().any(|(x, _)| *x == s) {
                out.push((s, true));
            }
        }
    }
    let groups: Vec<Vec<GroupKind>> = if decl.scopes.contains(&ScopeKind::Group) {
        vec![
            vec![],
            vec![GroupKind::Prefill],
            vec![GroupKind::Tbt],
            vec![GroupKind::Prefill, GroupKind::Tbt],
        ]
    } else {
        vec![vec![]]
    };
    let kinds: Vec<Vec<CacheKind>> = if decl.scopes.contains(&ScopeKind::Kv) {
        vec![vec![], vec![CacheKind::K], vec![CacheKind::V]]
    } else {
        vec![vec![]]
    };
    for g in &groups {
        for k in &kinds {
            let s = RingScope {
                groups: g.clone(),
                kinds: k.clone(),
                layers: vec![],
            };
            if !out.iter().any(|(x, _)| *x == s) {
                out.push((s, false));
            }
        }
    }
    if ringed {
        for r in &fits.hinted {
            let s = r.for_decl(decl);
            if !out.iter().any(|(x, _)| *x == s) {
                out.push((s, false));
            }
        }
    }
    out
}

/// The scopes of `decl` the evidence names (each with whether a probe named it, not only kvdiff
/// hinted it): the rings a probe named, then kvdiff's, as far as the fault takes them; none for
/// a fault the grammar does not scope by ring, nor a scope the fault drops to every ring.
pub fn evidence_scopes(decl: &FaultDecl, fits: &Fits) -> Vec<(RingScope, bool)> {
    let ringed = decl.scopes.contains(&ScopeKind::Kv) || decl.scopes.contains(&ScopeKind::Layer);
    let mut out: Vec<(RingScope, bool)> = Vec::new();
    if !ringed {
        return out;
    }
    let named = fits.rings.iter().map(|r| (r, true));
    for (r, was_named) in named.chain(fits.hinted.iter().map(|r| (r, false))) {
        let s = r.for_decl(decl);
        let everywhere = s.kinds.is_empty() && s.layers.is_empty();
        if !everywhere && !out.iter().any(|(x, _)| *x == s) {
            out.push((s, was_named));
        }
    }
    out
}

/// `decl` at `value` and `scope`.
pub fn hypothesis(decl: &FaultDecl, value: FaultValue, scope: &RingScope) -> FaultHypothesis {
    FaultHypothesis {
        name: decl.name.to_string(),
        value,
        groups: scope.groups.clone(),
        kinds: scope.kinds.clone(),
        layers: scope.layers.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvprobe_schema::ProbeFindings;

    #[test]
    fn a_ring_set_becomes_the_grammars_scope() {
        let k = Some(CacheKind::K);
        let v = Some(CacheKind::V);
        // both kinds of layers 1, 2 of 30: a layer scope, no kind
        let s = RingScope::of(
            &[(Some(1), k), (Some(1), v), (Some(2), k), (Some(2), v)],
            vec![],
            30,
        );
        assert_eq!((s.kinds.clone(), s.layers.clone()), (vec![], vec![1, 2]));
        // K of every layer: a kind scope, no layer
        let s = RingScope::of(&[(Some(0), k), (Some(1), k)], vec![], 2);
        assert_eq!((s.kinds, s.layers), (vec![CacheKind::K], vec![]));
        // a ring without a layer (an unlabelled cache) is every layer
        let s = RingScope::of(&[(None, v)], vec![], 30);
        assert_eq!((s.kinds, s.layers), (vec![CacheKind::V], vec![]));
    }

    #[test]
    fn the_named_rings_come_first_as_far_as_the_fault_takes_them() {
        let table = kvprobe_npu::sim::FAMILY.faults;
        let decl = |n: &str| table.faults.iter().find(|d| d.name == n).unwrap();
        let fits = Fits {
            rings: vec![RingScope {
                groups: vec![],
                kinds: vec![CacheKind::K],
                layers: vec![0],
            }],
            ..Fits::default()
        };
        let read = scopes(decl("tbt-read-layout"), &fits);
        assert_eq!(read[0], (fits.rings[0].clone(), true));
        assert!(read[1..].iter().all(|(_, named)| !named));
        // a swap takes layers only: the kind is dropped
        let swap = scopes(decl("kv-swap"), &fits);
        assert_eq!(swap[0].0.layers, vec![0]);
        assert!(swap[0].0.kinds.is_empty());
        // a fault without ring scopes is not pointed at by rings
        assert!(scopes(decl("tbt-attn-scale"), &fits)
            .iter()
            .all(|(_, named)| !named));
    }

    #[test]
    fn a_set_of_several_layers_also_names_its_lowest_layer_alone() {
        let k = Some(CacheKind::K);
        let rings = [(Some(1), k), (Some(0), k)];
        let first = first_layer(&rings).expect("two layers named");
        assert_eq!(first, vec![(Some(0), k)]);
        // on a two-layer model the set is K of every layer, its lowest layer alone layer 0
        assert!(RingScope::of(&rings, vec![], 2).layers.is_empty());
        assert_eq!(RingScope::of(&first, vec![], 2).layers, vec![0]);
        // one layer named (both kinds) or no layer at all: nothing narrower
        assert_eq!(
            first_layer(&[(Some(3), k), (Some(3), Some(CacheKind::V))]),
            None
        );
        assert_eq!(first_layer(&[(None, k)]), None);
    }

    #[test]
    fn kvdiffs_first_ring_also_names_the_layer_before_it() {
        let kvdiff = |layer: usize, kind: CacheKind| kvprobe_schema::KvdiffFinding {
            source: String::new(),
            layout: String::new(),
            precision: String::new(),
            layers: 30,
            kv_heads: 3,
            prompt_len: 6,
            steps: vec![],
            first_divergent: Some(kvprobe_schema::KvdiffDivergence {
                step: 5,
                layer,
                kv_head: 0,
                kind,
                position: 13,
                rel_l2: 0.39,
                matched_rel_l2: 0.4,
                band: 0.03,
                positions_outside: 5,
            }),
            k_map: vec![],
            v_map: vec![],
            outside_map: vec![],
            first_layer_rotation: None,
        };
        let scope = |kinds: Vec<CacheKind>, layers: Vec<usize>| RingScope {
            groups: vec![],
            kinds,
            layers,
        };
        // layer 7's K first out of band: that ring, and layer 6 with K, V or both (a reader's
        // fault there shows in layer 7's stored K and V)
        let p = ProbeFindings {
            kvdiff: Some(kvdiff(7, CacheKind::K)),
            ..ProbeFindings::default()
        };
        let f = Fits::of(&p, 64, 64, 30);
        assert!(f.rings.is_empty(), "kvdiff hints, it does not name: {f:?}");
        assert_eq!(
            f.hinted,
            vec![
                scope(vec![CacheKind::K], vec![7]),
                scope(vec![], vec![6]),
                scope(vec![CacheKind::K], vec![6]),
                scope(vec![CacheKind::V], vec![6]),
            ]
        );
        // layer 0 has no layer before it
        let p = ProbeFindings {
            kvdiff: Some(kvdiff(0, CacheKind::V)),
            ..ProbeFindings::default()
        };
        assert_eq!(
            Fits::of(&p, 64, 64, 30).hinted,
            vec![scope(vec![CacheKind::V], vec![0])]
        );
    }

    #[test]
    fn evidence_scopes_are_the_named_and_hinted_rings_the_fault_takes() {
        let table = kvprobe_npu::sim::FAMILY.faults;
        let decl = |n: &str| table.faults.iter().find(|d| d.name == n).unwrap();
        let fits = Fits {
            rings: vec![RingScope {
                kinds: vec![CacheKind::K],
                ..RingScope::default()
            }],
            hinted: vec![
                RingScope {
                    kinds: vec![CacheKind::V],
                    layers: vec![7],
                    ..RingScope::default()
                },
                RingScope {
                    layers: vec![6],
                    ..RingScope::default()
                },
            ],
            ..Fits::default()
        };
        let read = evidence_scopes(decl("tbt-read-layout"), &fits);
        assert_eq!(read.len(), 3, "{read:?}");
        assert_eq!(read[0], (fits.rings[0].clone(), true));
        assert!(read[1..].iter().all(|(_, named)| !named));
        // a swap takes layers only: K of every layer is every ring to it, so no scope
        let swap = evidence_scopes(decl("kv-swap"), &fits);
        let layers: Vec<Vec<usize>> = swap.iter().map(|(s, _)| s.layers.clone()).collect();
        assert_eq!(layers, vec![vec![7], vec![6]]);
        // a fault without ring scopes has none
        assert!(evidence_scopes(decl("tbt-attn-scale"), &fits).is_empty());
    }

    #[test]
    fn a_truncated_entry_names_the_bytes_its_writer_kept() {
        let cache = |zero_map: Vec<bool>, interpretation: &str| ZtapCache {
            cache_id: 0,
            layer: Some(0),
            kind: Some(CacheKind::V),
            entries: 8,
            width: zero_map.len(),
            zero_columns: zero_map.iter().filter(|&&z| z).count(),
            zero_map,
            empty_entries: 0,
            expected_transposed_zero_columns: 0.0,
            interpretation: interpretation.into(),
        };
        // 12 of 16 columns before the zero tail (a zero column inside the kept part counts)
        let mut map = vec![false; 16];
        map[3] = true;
        map[12..].iter_mut().for_each(|z| *z = true);
        assert_eq!(kept(&cache(map.clone(), "truncation"), 16), Some(12.0));
        // taps count features: 12 of 16 features of a 32-byte entry are 24 bytes
        assert_eq!(kept(&cache(map.clone(), "truncation"), 32), Some(24.0));
        // only a truncation reading names bytes, and never the whole entry or none of it
        assert_eq!(kept(&cache(map, "transposition"), 16), None);
        assert_eq!(kept(&cache(vec![false; 16], "truncation"), 16), None);
        assert_eq!(kept(&cache(vec![true; 16], "truncation"), 16), None);
    }
}
