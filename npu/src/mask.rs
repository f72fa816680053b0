//! The attention-mask input of the genai server (contract §2.5) and the alternatives probes send.
//!
//! Buffer: `T × NH × KV` uint8, row-major `[token row][head][key column]`; raw 0 = blocked,
//! `M1` = the quantised 1.0 = allowed. The server computes head 0 and copies it to every head.

/// Which mask a tbt step sends (probes); prefill always uses the server's ring mask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MaskMode {
    /// What the server sends (contract §2.5).
    Ring,
    /// Only the last column (the token itself).
    SelfOnly,
    /// Read-window entry `j` (column `j`) and self.
    SingleKey(usize),
    /// Per-head allowed columns, each `KV` long; one bitmap is used for every head.
    Custom(Vec<Vec<bool>>),
}

/// The server's ring mask for one head, `[T][KV]` "allowed" (contract §2.5): with
/// `Um = min(U, KV)`, `b1 = max(T − Um, 0)`, `b2 = min(Um, T)`: rows `< b1` (padding) all allowed;
/// real rows: columns `[0, KV − Um)` blocked, `[KV − Um, KV − b2)` allowed, and a lower-triangular
/// `b2 × b2` block (diagonal included) in the last `b2` columns.
pub fn ring_rows(rows: usize, keys: usize, usage: usize) -> Vec<bool> {
    let um = usage.min(keys);
    let b1 = rows.saturating_sub(um);
    let b2 = um.min(rows);
    let mut m = vec![false; rows * keys];
    for r in 0..rows {
        let row = &mut m[r * keys..(r + 1) * keys];
        if r < b1 {
            row.fill(true);
            continue;
        }
        row[keys - um..keys - b2].fill(true);
        // real row i of the b2 block sees the block's columns 0..=i
        let i = r - b1;
        row[keys - b2..keys - b2 + i + 1].fill(true);
    }
    m
}

/// A tbt row under the "valid entries on the left" convention a graph might assume (prior art
/// §2.4): the `Um − 1` cached tokens in columns `[0, Um − 1)`, self in the last column.
pub fn left_valid_row(keys: usize, usage: usize) -> Vec<bool> {
    let um = usage.min(keys);
    let mut row = vec![false; keys];
    row[..um.saturating_sub(1)].fill(true);
    row[keys - 1] = true;
    row
}

/// Tile one head's `[T][KV]` pattern over `NH` heads and encode: allowed → `m1`, blocked → raw 0.
pub fn encode_tiled(
    head_rows: &[bool],
    rows: usize,
    heads: usize,
    keys: usize,
    m1: u8,
    out: &mut Vec<u8>,
) {
    out.clear();
    out.reserve(rows * heads * keys);
    for r in 0..rows {
        let src = &head_rows[r * keys..(r + 1) * keys];
        for _ in 0..heads {
            out.extend(src.iter().map(|&a| if a { m1 } else { 0 }));
        }
    }
}

/// Encode a `[T][KV]` pattern per head (`heads` of them) as the `[T][NH][KV]` buffer.
pub fn encode_heads(per_head: &[Vec<bool>], rows: usize, keys: usize, m1: u8, out: &mut Vec<u8>) {
    out.clear();
    out.reserve(rows * per_head.len() * keys);
    for r in 0..rows {
        for h in per_head {
            out.extend(
                h[r * keys..(r + 1) * keys]
                    .iter()
                    .map(|&a| if a { m1 } else { 0 }),
            );
        }
    }
}

/// Encode per-head single-row patterns (`heads` bitmaps of `KV`, or one broadcast) for `T = 1`.
pub fn encode_per_head(
    bitmaps: &[Vec<bool>],
    heads: usize,
    keys: usize,
    m1: u8,
    out: &mut Vec<u8>,
) {
    out.clear();
    for h in 0..heads {
        let b = if bitmaps.len() == 1 {
            &bitmaps[0]
        } else {
            &bitmaps[h]
        };
        out.extend(b.iter().take(keys).map(|&a| if a { m1 } else { 0 }));
    }
}

/// The single tbt row of a [`MaskMode`] for one head (`Custom` is per head, see
/// [`encode_per_head`]).
pub fn tbt_row(mode: &MaskMode, keys: usize, usage: usize) -> Option<Vec<bool>> {
    match mode {
        MaskMode::Ring => Some(ring_rows(1, keys, usage)),
        MaskMode::SelfOnly => {
            let mut r = vec![false; keys];
            r[keys - 1] = true;
            Some(r)
        }
        MaskMode::SingleKey(j) => {
            let mut r = vec![false; keys];
            r[*j] = true;
            r[keys - 1] = true;
            Some(r)
        }
        MaskMode::Custom(_) => None,
    }
}

/// Additive fp16 mask value of an allowed / blocked column.
pub fn additive_fp16(allowed: bool) -> u16 {
    if allowed {
        half::f16::ZERO.to_bits()
    } else {
        half::f16::NEG_INFINITY.to_bits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn show(row: &[bool]) -> String {
        row.iter().map(|&a| if a { '#' } else { '.' }).collect()
    }

    #[test]
    fn prior_art_worked_example_l24_p16() {
        // prefill, 16 tokens, U = 16: row r allows cols 8..8+r (prior art §2.6)
        let m = ring_rows(16, 24, 16);
        assert_eq!(show(&m[0..24]), "........#...............");
        assert_eq!(show(&m[7 * 24..8 * 24]), "........########........");
        assert_eq!(show(&m[15 * 24..16 * 24]), "........################");
        // tbt rows, U = 17 + k
        assert_eq!(show(&ring_rows(1, 24, 17)), ".......#################");
        assert_eq!(show(&ring_rows(1, 24, 20)), "....####################");
        assert_eq!(show(&ring_rows(1, 24, 24)), "########################");
        assert_eq!(show(&ring_rows(1, 24, 40)), "########################");
        assert_eq!(
            show(&tbt_row(&MaskMode::SingleKey(9), 24, 17).unwrap()),
            ".........#.............#"
        );
        assert_eq!(
            show(&tbt_row(&MaskMode::SelfOnly, 24, 17).unwrap()),
            ".......................#"
        );
    }

    #[test]
    fn remainder_chunk_has_padding_rows() {
        // contract §2.7 chunk A scaled down: P = 4, KV = 8, 1 real token: rows 0-2 padding
        let m = ring_rows(4, 8, 1);
        assert_eq!(show(&m[0..8]), "########");
        assert_eq!(show(&m[16..24]), "########");
        assert_eq!(show(&m[24..32]), ".......#");
        // chunk B: U = 5, all 4 rows real, 1 older token before the triangle
        let m = ring_rows(4, 8, 5);
        assert_eq!(show(&m[0..8]), "...##...");
        assert_eq!(show(&m[24..32]), "...#####");
    }

    #[test]
    fn tiling_and_values() {
        let mut out = Vec::new();
        encode_tiled(&ring_rows(1, 4, 2), 1, 3, 4, 255, &mut out);
        assert_eq!(out, vec![0, 0, 255, 255, 0, 0, 255, 255, 0, 0, 255, 255]);
        assert_eq!(show(&left_valid_row(6, 3)), "##...#");
    }
}
