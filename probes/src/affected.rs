//! Which rings a cache-path cause touches, per cache, and how the evidence names them
//! ("only V rings of layers 0, 2"): users' bugs are often scoped to K or V, or to some layers.

use kvprobe_schema::{CacheKind, LayoutCache, ZtapCache};

use crate::thresholds::{LAYOUT_CLEAN, LAYOUT_MARGIN};

/// A ring by layer and kind.
pub type Ring = (Option<usize>, Option<CacheKind>);

/// Caches whose writer data decode cleanly as a layout other than token-major (same criteria as
/// the majority rule, applied per cache).
pub fn misplaced_layout(caches: &[LayoutCache]) -> Vec<Ring> {
    caches
        .iter()
        .filter(|c| {
            c.best_layout != kvprobe_schema::Layout::TokenMajor
                && c.best_score >= LAYOUT_CLEAN
                && c.best_score >= c.token_major_score + LAYOUT_MARGIN
        })
        .map(|c| (c.layer, c.kind))
        .collect()
}

/// Caches whose written entries all end in the same zero tail.
pub fn truncated(caches: &[ZtapCache]) -> Vec<Ring> {
    caches
        .iter()
        .filter(|c| c.interpretation == "truncation")
        .map(|c| (c.layer, c.kind))
        .collect()
}

/// "every ring", "only K rings (all layers)", "only V rings of layers 0, 2", "K rings of
/// layer 1 and V rings of layers 0, 1".
pub fn describe(rings: &[Ring], total: usize) -> String {
    if rings.len() == total {
        return "every ring".into();
    }
    let layers = |kind: CacheKind| -> Vec<usize> {
        let mut v: Vec<usize> = rings
            .iter()
            .filter(|(_, k)| *k == Some(kind))
            .filter_map(|(l, _)| *l)
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    let per_kind = total / 2;
    let part = |name: &str, ls: &[usize]| -> Option<String> {
        match ls.len() {
            0 => None,
            n if n == per_kind => Some(format!("{name} rings (all layers)")),
            1 => Some(format!("{name} rings of layer {}", ls[0])),
            _ => Some(format!(
                "{name} rings of layers {}",
                ls.iter()
                    .map(usize::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    };
    let parts: Vec<String> = [
        part("K", &layers(CacheKind::K)),
        part("V", &layers(CacheKind::V)),
    ]
    .into_iter()
    .flatten()
    .collect();
    if parts.is_empty() {
        return format!("{} rings", rings.len());
    }
    format!("only {}", parts.join(" and "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_kinds_and_layers() {
        let v = |l| (Some(l), Some(CacheKind::V));
        let k = |l| (Some(l), Some(CacheKind::K));
        assert_eq!(describe(&[v(0), v(2)], 8), "only V rings of layers 0, 2");
        assert_eq!(describe(&[k(1)], 8), "only K rings of layer 1");
        assert_eq!(
            describe(&[k(0), k(1), k(2), k(3)], 8),
            "only K rings (all layers)"
        );
        assert_eq!(
            describe(&[k(1), v(0), v(1)], 8),
            "only K rings of layer 1 and V rings of layers 0, 1"
        );
        assert_eq!(describe(&[k(0), v(0)], 2), "every ring");
    }
}
