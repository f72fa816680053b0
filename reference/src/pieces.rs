//! A long causal (or sliding-window) forward computed piece by piece, each piece attending to the
//! keys and values of the earlier ones: the same rows as [`Model::forward`] in memory that grows
//! with the piece, not with the square of the sequence (issue 38: SmolLM2's 8192 positions in one
//! piece need 2.4 GB of scores per layer and 1.6 GB of logits).

use candle_core::Tensor;

use crate::graph::{GraphInput, GraphOptions, PositionInput};
use crate::kv::{KvState, LayerKv};
use crate::{Error, Model, Result};

/// Rows of one piece: scores are `PIECE × n_heads × (earlier + PIECE)` f32, 80 MB for SmolLM2 at
/// 8192 positions.
const PIECE: usize = 256;

/// What [`Model::rows_in_pieces`] returns.
#[derive(Debug, Clone)]
pub struct PiecedRows {
    /// `(row, logits)` for every asked row, in row order.
    pub rows: Vec<(usize, Vec<f32>)>,
    /// Keys and values of the first `keep` tokens (per layer `[n_kv_heads, keep, head_dim]`).
    pub prefix: KvState,
}

impl Model {
    /// Logits of the rows `want` of a forward over `ids` at positions 0.., each row seeing the
    /// newest `window` tokens itself included (all earlier ones when `None`), and the keys and
    /// values of the first `keep` tokens. Only the asked rows go through the output head.
    pub fn rows_in_pieces(
        &self,
        ids: &[u32],
        want: &[usize],
        window: Option<usize>,
        keep: usize,
    ) -> Result<PiecedRows> {
        self.rows_in_pieces_of(ids, want, window, keep, PIECE)
    }

    pub(crate) fn rows_in_pieces_of(
        &self,
        ids: &[u32],
        want: &[usize],
        window: Option<usize>,
        keep: usize,
        piece: usize,
    ) -> Result<PiecedRows> {
        let t = ids.len();
        if t == 0 || piece == 0 || window == Some(0) {
            return Err(Error::InvalidInput(
                "a pieced forward needs tokens, a piece and a window of at least one".into(),
            ));
        }
        if let Some(&r) = want.iter().find(|&&r| r >= t) {
            return Err(Error::InvalidInput(format!(
                "row {r} asked of a {t}-token forward"
            )));
        }
        let keep = keep.min(t);
        // a piece ends at every asked row (its logits are the piece's last row), at `keep` (the
        // prefix is the stored keys then) and every `piece` rows
        let mut ends: Vec<usize> = want.iter().map(|&r| r + 1).collect();
        ends.extend((1..=t.div_ceil(piece)).map(|i| (i * piece).min(t)));
        ends.push(keep);
        ends.retain(|&e| e > 0);
        ends.sort_unstable();
        ends.dedup();
        let nh = self.config.n_heads;
        let mut stored: Vec<LayerKv> = Vec::new();
        let mut prefix = None;
        let mut rows = Vec::with_capacity(want.len());
        let mut start: usize = 0;
        for end in ends {
            // the oldest key the piece's first row may see
            let lo = window.map_or(0, |w| (start + 1).saturating_sub(w));
            let past = stored
                .iter()
                .map(|l| -> Result<LayerKv> {
                    Ok(LayerKv {
                        k: l.k.narrow(1, lo, start - lo)?,
                        v: l.v.narrow(1, lo, start - lo)?,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            let mut mask = Vec::with_capacity((end - start) * nh * (end - lo));
            for i in start..end {
                let row: Vec<bool> = (lo..end)
                    .map(|j| j <= i && window.is_none_or(|w| i - j < w))
                    .collect();
                for _ in 0..nh {
                    mask.extend_from_slice(&row);
                }
            }
            let out = self.run_graph(&GraphInput {
                hidden: self.embed(&ids[start..end])?,
                positions: PositionInput::Ids((start..end).map(|p| p as f32).collect()),
                past,
                mask,
                graph: GraphOptions::default(),
                last_only: true,
            })?;
            if want.contains(&(end - 1)) {
                rows.push((end - 1, out.logits));
            }
            stored = if stored.is_empty() {
                out.new_kv
            } else {
                stored
                    .iter()
                    .zip(&out.new_kv)
                    .map(|(a, b)| -> Result<LayerKv> {
                        Ok(LayerKv {
                            k: Tensor::cat(&[&a.k, &b.k], 1)?,
                            v: Tensor::cat(&[&a.v, &b.v], 1)?,
                        })
                    })
                    .collect::<Result<_>>()?
            };
            if end == keep {
                // a cheap handle: later pieces concatenate into new tensors
                prefix = Some(stored.clone());
            }
            start = end;
        }
        let layers = match prefix {
            Some(p) => p,
            None => self.empty_state()?.layers,
        };
        Ok(PiecedRows {
            rows,
            prefix: KvState {
                layers,
                positions: (0..keep).collect(),
                ids: ids[..keep].to_vec(),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::fixtures::write_tiny_llama;
    use crate::{ForwardOptions, Model};

    fn tiny() -> Model {
        let dir = tempfile::tempdir().expect("tempdir");
        write_tiny_llama(dir.path(), 38).expect("fixture");
        Model::load(dir.path()).expect("load")
    }

    fn max_diff(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    }

    /// Pieces of 1, 3, 7 and more than the sequence give the one-piece forward's rows and keys
    /// (summation order over the key columns differs, hence the tolerance, not bit equality).
    #[test]
    fn pieces_give_the_one_piece_forwards_rows_and_keys() {
        let m = tiny();
        let ids: Vec<u32> = (0..23).map(|i| (i * 7 + 3) % 50).collect();
        let want = [0, 4, 11, 22];
        for window in [None, Some(5)] {
            let mask = window.map(|w| crate::mask::banded(ids.len(), w - 1));
            let whole = m
                .forward(
                    &ids,
                    &ForwardOptions {
                        mask,
                        taps: true,
                        ..Default::default()
                    },
                )
                .expect("forward");
            for piece in [1, 3, 7, 64] {
                let p = m
                    .rows_in_pieces_of(&ids, &want, window, 9, piece)
                    .expect("pieces");
                assert_eq!(p.rows.iter().map(|r| r.0).collect::<Vec<_>>(), want);
                for (r, logits) in &p.rows {
                    let d = max_diff(logits, whole.row(*r));
                    assert!(d < 1e-4, "row {r} piece {piece} {window:?}: {d}");
                }
                if window.is_none() {
                    let taps = whole.taps.as_ref().expect("taps");
                    for (a, b) in p.prefix.layers.iter().zip(taps) {
                        let bk = b.k.narrow(1, 0, 9).expect("narrow");
                        let ak: Vec<f32> = a.k.flatten_all().unwrap().to_vec1().unwrap();
                        let bk: Vec<f32> = bk.flatten_all().unwrap().to_vec1().unwrap();
                        assert!(max_diff(&ak, &bk) < 1e-5);
                    }
                    assert_eq!(p.prefix.ids, ids[..9]);
                }
            }
        }
    }

    #[test]
    fn a_row_past_the_sequence_is_an_error() {
        let m = tiny();
        assert!(m.rows_in_pieces(&[1, 2, 3], &[3], None, 0).is_err());
        assert!(m.rows_in_pieces(&[], &[], None, 0).is_err());
    }
}
