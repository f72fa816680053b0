//! Lookups the sections make over input-sized lists, built once so a long results.json costs
//! linear time: a label search per row was quadratic in a file's entries.

use std::collections::HashMap;
use std::hash::Hash;

/// Where each key first occurs in `items` (what `iter().position` answers, for every key at once).
pub fn first_index<T, K: Hash + Eq>(items: &[T], key: impl Fn(&T) -> K) -> HashMap<K, usize> {
    let mut at = HashMap::with_capacity(items.len());
    for (i, x) in items.iter().enumerate() {
        at.entry(key(x)).or_insert(i);
    }
    at
}

/// Whether one of the positions `first ..= last` lands on ring slot `slot` of a `len`-slot ring
/// (position mod len): answered without walking the positions, which a file can make billions.
pub fn ring_written(first: usize, last: usize, len: usize, slot: usize) -> bool {
    let len = len.max(1);
    if last < first || slot >= len {
        return false;
    }
    let span = last - first;
    span >= len - 1 || (slot + len - first % len) % len <= span
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_index_keeps_the_first() {
        let at = first_index(&[5, 7, 5, 9], |x| *x);
        assert_eq!((at[&5], at[&7], at[&9]), (0, 1, 3));
    }

    #[test]
    fn ring_written_matches_the_walk() {
        for len in 1..7 {
            for first in 0..15 {
                for last in 0..15 {
                    for slot in 0..8 {
                        let walk =
                            last >= first && slot < len && (first..=last).any(|p| p % len == slot);
                        assert_eq!(
                            ring_written(first, last, len, slot),
                            walk,
                            "{first}..={last} L={len} slot {slot}"
                        );
                    }
                }
            }
        }
        assert!(ring_written(usize::MAX - 3, usize::MAX, 8, usize::MAX % 8));
    }
}
