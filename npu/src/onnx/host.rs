//! The host side of ONNX Runtime GenAI's default decoder, rule by rule (docs/onnx-genai.md
//! "Host rules", contract doc §2 with its sources G:pos, G:cpu, G:kv): what `Generator` builds
//! before each run of a batch-1 request. Pure functions, unit-tested without ONNX Runtime.
//!
//! kvprobe's generic stateful driver speaks embedding rows, absolute positions and an additive
//! mask over `max_ctx` columns; a GenAI model takes token ids and a `[1, total]` mask. This file
//! also holds the two translations between them ([`TokenLookup`], [`attention_mask_from_rows`]),
//! each refusing what GenAI cannot express instead of guessing.

pub use crate::token_rows::{attention_mask_from_rows, rows_from_additive, TokenLookup};

/// `attention_mask` of a batch-1 request: `[1, total]`, all ones, rebuilt every run (G:pos
/// `PositionInputs::CreateAndInitializeAttentionMask` / `UpdateAttentionMask`; G:cpu).
pub fn attention_mask(total: usize) -> Vec<i64> {
    vec![1; total]
}

/// `position_ids` of a batch-1 request: `[1, new]` = `total − new … total − 1` (G:pos: the
/// prompt gets `0..n`, each later run continues from the current length).
pub fn position_ids(total: usize, new: usize) -> Vec<i64> {
    (total - new..total).map(|p| p as i64).collect()
}

/// The default KV cache without a shared buffer (G:kv `DefaultKeyValueCache`): the first run's
/// past is empty (`S = 0`), every present is `[1, H, total, D]` and becomes the next past.
/// Here the past is kept per cache as host `[H, len, D]` f32; this is its length after a run.
pub fn present_length(past_len: usize, new: usize) -> usize {
    past_len + new
}

/// The rows of `[H, len, D]` kept by `RewindTo(new_len)` (G:kv `DefaultKeyValueCache::RewindTo`:
/// the past is cut to its first `new_len` positions).
pub fn rewind(past: &[f32], heads: usize, len: usize, hd: usize, new_len: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(heads * new_len * hd);
    for h in 0..heads {
        let o = h * len * hd;
        out.extend_from_slice(&past[o..o + new_len * hd]);
    }
    out
}

/// GenAI's shared buffer after a run (H12): past and present are one `[H, len, D]` buffer that
/// the graph writes in place, so it holds what the run's present holds over the request's first
/// `total` positions; the positions past it are not part of the request and keep what they held
/// (kvprobe feeds the past and reads the present as two tensors, so this copy is the in-place
/// write).
pub fn write_in_place(
    buf: &mut [f32],
    present: &[f32],
    heads: usize,
    len: usize,
    hd: usize,
    total: usize,
) {
    for h in 0..heads {
        let o = h * len * hd;
        buf[o..o + total * hd].copy_from_slice(&present[o..o + total * hd]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn genai_inputs_of_a_prompt_then_a_step() {
        // prompt of 5: mask [1,5] ones, positions 0..5; then one token: [1,6], position 5
        assert_eq!(attention_mask(5), vec![1; 5]);
        assert_eq!(position_ids(5, 5), vec![0, 1, 2, 3, 4]);
        assert_eq!(position_ids(6, 1), vec![5]);
        assert_eq!(present_length(5, 1), 6);
    }

    #[test]
    fn rewind_keeps_the_first_positions_of_every_head() {
        // H=2, len=3, D=2: values encode (h, t, d)
        let past: Vec<f32> = (0..12).map(|x| x as f32).collect();
        assert_eq!(rewind(&past, 2, 3, 2, 1), vec![0.0, 1.0, 6.0, 7.0]);
    }
}
