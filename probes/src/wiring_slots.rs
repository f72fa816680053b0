//! A pipeline that keeps its K/V cache indexed by the position ids it is fed, emulated on the
//! reference for `crate::wiring_fit` (`Wiring::TurnRestartSlots`).
//!
//! Why: a static-shape pipeline that also serves speculative decoding cannot tell a rejected
//! draft from a new token except by the position id, so it cuts what it holds back to the run's
//! first position id and stores the run's K/V there, while the mask it attends with comes from
//! the host and opens as many slots as the host counts. OpenVINO's NPUW LLM pipeline does this
//! (`npuw/llm_infer_request.cpp`: `infer()` sends a one-token run to `infer_generate` after
//! `trim_kvcache_for_speculative_decoding(position_ids)`, which sets `num_stored_tokens` to the
//! position id when it is not past it; the new K/V is written at `num_stored_tokens`; the generate
//! model's past mask is the host's `attention_mask` minus the run). A host that restarts an
//! appended turn's position ids at 0 then overwrites the history from slot 0 on, and the turn's
//! rows read a mix of their own K/V, the history's older slots and slots never written (zeros).
//!
//! The emulation feeds each row after the first appended turn's start as its own one-token run
//! (NPUW's KV-cache model takes `NPUW_LLM_MAX_GENERATION_TOKEN_LEN` = 1 token a run, so a turn is
//! fed a token at a time); the rows before are the causal prefix. It is a hypothesis about the
//! pipeline, fitted like the others; nothing in it names a device.

use candle_core::Tensor;
use kvprobe_reference::{KvState, LayerKv, Model};

use crate::Result;

/// Logits of rows `from..seq.len()` when row `i` is fed alone at position `positions[i]` into a
/// cache of slots indexed by position, the host's mask opening the `i` slots it counts (slots
/// never written hold zeros); the first `from` rows are a causal prefix at positions 0..from.
pub fn rows(model: &Model, seq: &[u32], positions: &[usize], from: usize) -> Result<Vec<Vec<f32>>> {
    let t = seq.len();
    let prefix: Vec<usize> = (0..from).collect();
    let hist = model.prefix_state(&seq[..from], &prefix)?;
    // every slot the host can open (t) is allocated; the unwritten ones stay zero
    let mut slots: Vec<LayerKv> = hist
        .layers
        .iter()
        .map(|l| {
            Ok(LayerKv {
                k: pad_to(&l.k, t)?,
                v: pad_to(&l.v, t)?,
            })
        })
        .collect::<Result<_>>()?;
    let mut stored = from;
    let mut out = Vec::with_capacity(t.saturating_sub(from));
    for row in from..t {
        let p = positions[row];
        // the cache cut back to the run's position id when it is not past what is stored
        if p <= stored {
            stored = p;
        }
        let mut st = KvState {
            layers: slots
                .iter()
                .map(|l| {
                    Ok(LayerKv {
                        k: l.k.narrow(1, 0, row)?,
                        v: l.v.narrow(1, 0, row)?,
                    })
                })
                .collect::<Result<_>>()?,
            positions: vec![0; row],
            ids: vec![0; row],
        };
        out.push(model.decode_step(&mut st, seq[row], p)?);
        for (slot, new) in slots.iter_mut().zip(&st.layers) {
            slot.k = put(&slot.k, &new.k.narrow(1, row, 1)?, stored)?;
            slot.v = put(&slot.v, &new.v.narrow(1, row, 1)?, stored)?;
        }
        stored += 1;
    }
    Ok(out)
}

/// `[h, n, d]` widened to `[h, t, d]` with zeros.
fn pad_to(x: &Tensor, t: usize) -> Result<Tensor> {
    let (h, n, d) = x.dims3()?;
    if n >= t {
        return Ok(x.narrow(1, 0, t)?);
    }
    let z = Tensor::zeros((h, t - n, d), x.dtype(), x.device())?;
    Ok(Tensor::cat(&[x, &z], 1)?)
}

/// `x` `[h, t, d]` with column `at` replaced by `col` `[h, 1, d]`.
fn put(x: &Tensor, col: &Tensor, at: usize) -> Result<Tensor> {
    let t = x.dim(1)?;
    let mut parts = Vec::with_capacity(3);
    if at > 0 {
        parts.push(x.narrow(1, 0, at)?);
    }
    parts.push(col.clone());
    if at + 1 < t {
        parts.push(x.narrow(1, at + 1, t - at - 1)?);
    }
    Ok(Tensor::cat(&parts, 1)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::tiny_llama;
    use kvprobe_reference::ForwardOptions;

    fn miss(a: &[f32], b: &[f32]) -> f64 {
        1.0 - crate::metrics::cosine(a, b)
    }

    #[test]
    fn positions_that_never_restart_are_the_causal_pass() {
        let m = tiny_llama(11);
        let seq = [1u32, 5, 9, 22, 41, 17, 3, 99];
        let pos: Vec<usize> = (0..seq.len()).collect();
        let full = m.forward(&seq, &ForwardOptions::default()).unwrap();
        let got = rows(&m, &seq, &pos, 3).unwrap();
        assert_eq!(got.len(), 5);
        for (i, r) in got.iter().enumerate() {
            assert!(miss(r, full.row(3 + i)) < 1e-9, "row {}", 3 + i);
        }
    }

    #[test]
    fn a_restarted_turn_overwrites_the_history_from_slot_0() {
        let m = tiny_llama(11);
        let seq = [1u32, 5, 9, 22, 41, 17, 3, 99];
        // rows 4.. are a turn fed at positions 0, 1, 2, 3
        let pos = [0, 1, 2, 3, 0, 1, 2, 3];
        let got = rows(&m, &seq, &pos, 4).unwrap();
        // the turn's first row still sees the whole history (nothing overwritten yet): the
        // restarted-positions forward pass gives it
        let restarted = m
            .forward(
                &seq,
                &ForwardOptions {
                    positions: Some(pos.to_vec()),
                    ..Default::default()
                },
            )
            .unwrap();
        assert!(miss(&got[0], restarted.row(4)) < 1e-9);
        // its second row reads slot 0 overwritten by the turn's first token and one zero slot:
        // no longer the restarted forward pass
        assert!(miss(&got[1], restarted.row(5)) > 1e-6);
        // which is the same as attending row 4 in place of row 0, then rows 1..4, then a zero
        // key: check the overwrite by hand with a state built from the causal pass
        let hist = m.prefix_state(&seq[..4], &[0, 1, 2, 3]).unwrap();
        let mut first = hist.clone();
        m.decode_step(&mut first, seq[4], 0).unwrap();
        let k4 = |l: &LayerKv| l.k.narrow(1, 4, 1).unwrap();
        let v4 = |l: &LayerKv| l.v.narrow(1, 4, 1).unwrap();
        let mut st = KvState {
            layers: first
                .layers
                .iter()
                .map(|l| {
                    let z = Tensor::zeros_like(&k4(l)).unwrap();
                    LayerKv {
                        k: Tensor::cat(&[&k4(l), &l.k.narrow(1, 1, 3).unwrap(), &z], 1).unwrap(),
                        v: Tensor::cat(&[&v4(l), &l.v.narrow(1, 1, 3).unwrap(), &z], 1).unwrap(),
                    }
                })
                .collect(),
            positions: vec![0; 5],
            ids: vec![0; 5],
        };
        let by_hand = m.decode_step(&mut st, seq[5], 1).unwrap();
        assert!(miss(&got[1], &by_hand) < 1e-9);
    }
}
