//! Token ids from the generic driver's inputs, for families whose graph gathers its own
//! embedding table by id (ONNX Runtime GenAI, OpenVINO): the stateful driver speaks embedding
//! rows, absolute positions and an additive mask over `max_ctx` columns, these graphs take
//! `input_ids` and a `[1, total]` attention_mask. Each translation refuses what such a graph
//! cannot express instead of guessing.

use std::collections::HashMap;

use kvprobe_reference::EmbeddingRows;

use crate::{Error, Result};

/// The 2-D `attention_mask` that reproduces the driver's per-row masks, or an error when no
/// `[1, total]` mask does. `rows[i]` are the allowed absolute columns (of `max_ctx`) of the query
/// at position `first + i`; the graph applies `mask[j] ∧ j ≤ position` (causal), so the rows must
/// all be that shared mask cut at their own position. The ring mask of the generic driver (the
/// request's context and the row itself) gives GenAI's all-ones mask.
pub fn attention_mask_from_rows(rows: &[Vec<bool>], first: usize) -> Result<Vec<i64>> {
    let total = first + rows.len();
    let last = rows
        .last()
        .ok_or_else(|| Error::InvalidArgument("a run with no query rows".into()))?;
    if let Some(j) = (total..last.len()).find(|&j| last[j]) {
        return Err(Error::InvalidArgument(format!(
            "mask allows column {j}, past the {total} positions of the request; a GenAI attention_mask is [1, total]"
        )));
    }
    let mask: Vec<i64> = (0..total)
        .map(|j| i64::from(last.get(j).copied().unwrap_or(false)))
        .collect();
    for (i, row) in rows.iter().enumerate() {
        let pos = first + i;
        let ok =
            (0..total).all(|j| row.get(j).copied().unwrap_or(false) == (mask[j] == 1 && j <= pos));
        if !ok {
            return Err(Error::InvalidArgument(format!(
                "query row at position {pos} has a mask that is not the shared [1, total] attention_mask cut causally; a GenAI decoder cannot express it"
            )));
        }
    }
    Ok(mask)
}

/// fp16 additive mask rows `[q, max_ctx]` (0 attends, −inf blocks) as booleans.
pub fn rows_from_additive(bits: &[u16], q: usize) -> Result<Vec<Vec<bool>>> {
    if q == 0 || !bits.len().is_multiple_of(q) {
        return Err(Error::InvalidArgument(format!(
            "mask of {} values is not {q} whole rows",
            bits.len()
        )));
    }
    let w = bits.len() / q;
    Ok(bits
        .chunks_exact(w)
        .map(|r| {
            r.iter()
                .map(|&b| half::f16::from_bits(b) == half::f16::ZERO)
                .collect()
        })
        .collect())
}

/// Embedding row → token id. The generic driver sends the rows of the reference's embedding
/// table; a GenAI graph gathers its own table by id. Rows are matched bit for bit. Two ids
/// with bit-identical rows are interchangeable for the graph only when its table has them equal
/// too, which holds for an export of the same weights (scripts/export-onnx.py); the first id
/// wins.
pub struct TokenLookup {
    hidden: usize,
    by_hash: HashMap<u64, u32>,
    /// The reference's own table (a shared handle, no copy): a hash hit is checked against it.
    table: EmbeddingRows,
}

fn row_hash(row: &[f32]) -> u64 {
    // FNV-1a over the bit patterns: exact equality is checked after the lookup
    row.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, x| {
        (h ^ u64::from(x.to_bits())).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Rows hashed per read of the table: a block's f32 copy stays small (a 151936 × 1536 table
/// would otherwise take 0.9 GB for the moment of the build).
const HASH_BLOCK_ROWS: usize = 1024;

impl TokenLookup {
    pub fn new(table: EmbeddingRows) -> Result<TokenLookup> {
        let (rows, hidden) = table.dims();
        if hidden == 0 {
            return Err(Error::InvalidArgument(
                "embedding table with rows of no values".into(),
            ));
        }
        let mut by_hash = HashMap::with_capacity(rows);
        let mut block = Vec::new();
        for r0 in (0..rows).step_by(HASH_BLOCK_ROWS) {
            let r1 = (r0 + HASH_BLOCK_ROWS).min(rows);
            table.rows_into(r0, r1, &mut block)?;
            for (i, row) in block.chunks_exact(hidden).enumerate() {
                by_hash.entry(row_hash(row)).or_insert((r0 + i) as u32);
            }
        }
        Ok(TokenLookup {
            hidden,
            by_hash,
            table,
        })
    }

    pub fn hidden(&self) -> usize {
        self.hidden
    }

    /// The ids of `rows` (`[q, hidden]`), or an error naming the first row of no token.
    pub fn ids(&self, rows: &[f32]) -> Result<Vec<u32>> {
        if !rows.len().is_multiple_of(self.hidden) {
            return Err(Error::InvalidArgument(format!(
                "embedding input of {} values is not whole rows of {}",
                rows.len(),
                self.hidden
            )));
        }
        let mut known = vec![0f32; self.hidden];
        rows.chunks_exact(self.hidden)
            .enumerate()
            .map(|(i, row)| {
                if let Some(&id) = self.by_hash.get(&row_hash(row)) {
                    self.table.row_into(id as usize, &mut known)?;
                    if known.as_slice() == row {
                        return Ok(id);
                    }
                }
                Err(Error::InvalidArgument(format!(
                    "embedding row {i} is no row of the model's table; a GenAI decoder takes token ids only"
                )))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_rows_give_the_all_ones_mask_and_others_are_translated_or_refused() {
        let ctx = 8;
        // prefill of 3 at 0: row p allows j <= p
        let rows: Vec<Vec<bool>> = (0..3).map(|p| (0..ctx).map(|j| j <= p).collect()).collect();
        assert_eq!(attention_mask_from_rows(&rows, 0).unwrap(), vec![1, 1, 1]);
        // a step at 3 seeing itself only: holes in the past are expressible
        let own: Vec<bool> = (0..ctx).map(|j| j == 3).collect();
        assert_eq!(
            attention_mask_from_rows(&[own], 3).unwrap(),
            vec![0, 0, 0, 1]
        );
        // two rows that disagree on the past: not one shared mask
        let a: Vec<bool> = (0..ctx).map(|j| j == 0 || j == 2).collect();
        let b: Vec<bool> = (0..ctx).map(|j| j == 1 || j == 3).collect();
        assert!(attention_mask_from_rows(&[a, b], 2).is_err());
        // a column past the request
        let c: Vec<bool> = (0..ctx).map(|j| j == 6 || j == 2).collect();
        let e = attention_mask_from_rows(&[c], 2).unwrap_err();
        assert!(e.to_string().contains("column 6"), "{e}");
    }

    #[test]
    fn rows_map_back_to_ids_and_strangers_are_refused() {
        let table: Vec<f32> = vec![1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 0.5, -0.0];
        let l = TokenLookup::new(EmbeddingRows::from_f32(table, 2).unwrap()).unwrap();
        // row 2 equals row 0: the first id wins; -0.0 is not 0.0 bit for bit
        assert_eq!(
            l.ids(&[3.0, 4.0, 1.0, 2.0, 0.5, -0.0]).unwrap(),
            vec![1, 0, 3]
        );
        assert!(l.ids(&[0.5, 0.0]).is_err());
        let bits = [0u16, half::f16::NEG_INFINITY.to_bits(), 0, 0];
        assert_eq!(
            rows_from_additive(&bits, 2).unwrap(),
            vec![vec![true, false], vec![true, true]]
        );
    }
}
