//! Reference logits of known tokens fed after a state, as a decode loop would give them: the
//! capacity probe's generation is teacher-forced on the device's tokens, so the reference need
//! not run them one at a time (the test is `capacity::tests::step_rows_are_the_full_forwards_rows`).

use candle_core::Tensor;
use kvprobe_reference::{GraphInput, GraphOptions, KvState, Model, PositionInput};

use crate::Result;

/// Rows of one batched teacher-forced run in [`step_rows`]: bounds the `[rows, vocab]` logits
/// and `[rows, heads, keys]` scores buffers.
const STEP_CHUNK: usize = 32;

/// Reference logits of `tokens` fed one at a time after `state`, the first at position
/// `state.len()`, each step seeing the newest `window` tokens itself included (all when `None`):
/// the rows a windowed forward over the whole sequence gives there. The tokens are known
/// (teacher-forced on the device's), so they run `STEP_CHUNK` at a time with a causal mask over
/// the chunk: the same rows as one run a token, without reading every weight once per token (a
/// 63-step NPUW capacity run: 3.5 s of one-token runs at load 12).
pub(crate) fn step_rows(
    model: &Model,
    state: KvState,
    tokens: &[u32],
    window: Option<usize>,
) -> Result<Vec<Vec<f32>>> {
    step_rows_in(model, state, tokens, window, STEP_CHUNK)
}

pub(crate) fn step_rows_in(
    model: &Model,
    mut state: KvState,
    tokens: &[u32],
    window: Option<usize>,
    chunk: usize,
) -> Result<Vec<Vec<f32>>> {
    let max_pos = model.config().max_position;
    let nh = model.config().n_heads;
    let vocab = model.config().vocab_size;
    let fit = max_pos.saturating_sub(state.len()).min(tokens.len());
    let mut rows = Vec::with_capacity(fit);
    for piece in tokens[..fit].chunks(chunk.max(1)) {
        let n = state.len();
        let r = piece.len();
        let cols = n + r;
        // row i (at position n + i) sees key j (at position j) when j <= n + i and within the window
        let mut mask = vec![false; r * nh * cols];
        for i in 0..r {
            for j in 0..=n + i {
                if window.is_none_or(|w| n + i - j < w) {
                    for h in 0..nh {
                        mask[(i * nh + h) * cols + j] = true;
                    }
                }
            }
        }
        let out = model.run_graph(&GraphInput {
            hidden: model.embed(piece)?,
            positions: PositionInput::Ids((n..n + r).map(|p| p as f32).collect()),
            past: if n > 0 {
                state.layers.clone()
            } else {
                Vec::new()
            },
            mask,
            graph: GraphOptions::default(),
            last_only: false,
        })?;
        rows.extend(out.logits.chunks(vocab).map(<[f32]>::to_vec));
        for (l, kv) in state.layers.iter_mut().zip(&out.new_kv) {
            l.k = Tensor::cat(&[&l.k, &kv.k], 1)?;
            l.v = Tensor::cat(&[&l.v, &kv.v], 1)?;
        }
        state.positions.extend(n..n + r);
        state.ids.extend_from_slice(piece);
    }
    Ok(rows)
}
