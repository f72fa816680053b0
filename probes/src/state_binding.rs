//! The K/V binding hypothesis of a stateful device (issue 35): the graph's layer l reads the K/V
//! that another layer wrote — a runner that binds a past by a wrong layer index, an export that
//! wires one layer's past input to another layer's cache. Fitted from the states, judged by a
//! replay under the rule of evidence (`diagnose::evidence::beats_healthy`), never by a rule for
//! one fault.
//!
//! 1. **Fit.** After the prompt's prefill and the device's first decode step (the first run that
//!    reads the prompt's K/V back and writes them out again as its present), each layer's state
//!    at the prompt's positions is compared with every reference layer's prompt K/V (cosine of
//!    K and of V, their mean); the binding maps each layer to the reference layer whose K/V it
//!    holds. A healthy device holds its own everywhere: the identity, and nothing to replay.
//! 2. **Replay.** The reference's first decode step with every layer reading the prompt K/V of
//!    the layer it is bound to, computed with the weights the device declares (its int4 blocks,
//!    its fp16 weights), against the device's own step. The healthy hypothesis is the same step
//!    over the right K/V. The declared precision is what the declared weights cost that step
//!    against the f32 checkpoint, at least the cache-free controls' miss the caller passes.

use kvprobe_npu::MaskMode;
use kvprobe_reference::{KeySet, LayerKv};

use crate::cache_io;
use crate::metrics::cosine;
use crate::session::Session;
use crate::thresholds::REPRODUCES_COSINE;
use crate::{Error, Result};

/// What the binding experiment measured.
#[derive(Debug, Clone, PartialEq)]
pub struct BindingFit {
    /// `(layer, bound)`: the layers whose state holds another reference layer's prompt K/V.
    pub moved: Vec<(usize, usize)>,
    /// 1 − cosine of the replay over the fitted binding against the device's step.
    pub replay_miss: f64,
    /// 1 − cosine of the same step over the right K/V (the healthy hypothesis).
    pub healthy_miss: f64,
    /// The declared precision's cost of the step (1 − cosine, declared weights vs f32).
    pub precision: f64,
    /// The replay beats the healthy hypothesis at the declared precision.
    pub reproduces: bool,
}

impl BindingFit {
    pub fn evidence(&self) -> String {
        let moved: Vec<String> = self
            .moved
            .iter()
            .map(|(l, b)| format!("layer {l} holds layer {b}'s"))
            .collect();
        format!(
            "K/V binding: after the first decode step {} prompt K/V; the first step replayed with each layer reading the K/V it holds misses the device by {:.1e}, the right K/V by {:.1e} (declared precision {:.1e})",
            moved.join(", "),
            self.replay_miss,
            self.healthy_miss,
            self.precision
        )
    }
}

/// `[kv, ctx, hd]` little-endian fp16 state → the first `n` positions as `[kv, n, hd]` f32.
fn prompt_rows(bytes: &[u8], kv: usize, ctx: usize, hd: usize, n: usize) -> Result<Vec<f32>> {
    if bytes.len() != 2 * kv * ctx * hd {
        return Err(Error::Device(format!(
            "a state of {} bytes where [kv_heads {kv}, ctx {ctx}, head_dim {hd}] fp16 takes {}",
            bytes.len(),
            2 * kv * ctx * hd
        )));
    }
    let mut out = Vec::with_capacity(kv * n * hd);
    for h in 0..kv {
        let at = 2 * h * ctx * hd;
        out.extend(
            bytes[at..at + 2 * n * hd]
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()),
        );
    }
    Ok(out)
}

fn flat(t: &candle_core::Tensor) -> Result<Vec<f32>> {
    Ok(t.flatten_all()?.to_vec1()?)
}

/// The binding each layer's state shows: the reference layer whose prompt K/V it holds best,
/// where it holds them (mean cosine ≥ `REPRODUCES_COSINE`, the bar a repaired step meets); a
/// state that holds no layer's K/V (garbage, another arrangement) keeps its own index: that is
/// for the layout and reader rules, not a binding.
fn fit(states: &[(Vec<f32>, Vec<f32>)], reference: &[LayerKv]) -> Result<Vec<usize>> {
    let refs: Vec<(Vec<f32>, Vec<f32>)> = reference
        .iter()
        .map(|kv| Ok((flat(&kv.k)?, flat(&kv.v)?)))
        .collect::<Result<_>>()?;
    Ok(states
        .iter()
        .enumerate()
        .map(|(l, (k, v))| {
            let score = |m: usize| (cosine(k, &refs[m].0) + cosine(v, &refs[m].1)) / 2.0;
            // ties keep the layer's own index: only a strictly better layer moves it
            let best = (0..refs.len()).fold(l, |b, m| if score(m) > score(b) { m } else { b });
            if score(best) >= REPRODUCES_COSINE {
                best
            } else {
                l
            }
        })
        .collect())
}

/// The experiment: the fit, and the replay when the fit is not the identity (`None` then).
/// Leaves the device after a decode step; callers that need the prompt's prefill run it again.
pub fn run(s: &mut Session, controls_miss: f64) -> Result<Option<BindingFit>> {
    let first = s.first_step()?;
    let prompt = s.prompt_ref()?;
    let n = s.ids.len();
    let out = s.driver.step(s.dev, first.query, &MaskMode::Ring)?;
    let bufs = cache_io::read(s.dev, "after the first decode step (K/V binding)")?;
    let d = s.describe();
    let (layers, kv, hd, ctx) = (
        d.shape.n_layers,
        d.shape.n_kv_heads,
        d.shape.head_dim,
        d.cache_len,
    );
    let mut states = Vec::with_capacity(layers);
    for l in 0..layers {
        let get = |id: u32| {
            bufs.get(&id)
                .ok_or_else(|| Error::Device(format!("the device exposes no state {id}")))
        };
        states.push((
            prompt_rows(get(2 * l as u32)?, kv, ctx, hd, n)?,
            prompt_rows(get(2 * l as u32 + 1)?, kv, ctx, hd, n)?,
        ));
    }
    let bound = fit(&states, &prompt.state.layers)?;
    let moved: Vec<(usize, usize)> = bound
        .iter()
        .enumerate()
        .filter(|(l, b)| l != *b)
        .map(|(l, &b)| (l, b))
        .collect();
    if moved.is_empty() {
        return Ok(None);
    }
    let declared = crate::matched::Precision::of(s.describe(), s.model)?;
    let model = declared.as_ref().map_or(s.model, |p| p.model(s.model));
    let state = if std::ptr::eq(model, s.model) {
        prompt.state.clone()
    } else {
        crate::session::PromptRef::of(model, &s.ids)?.state
    };
    let mut rebound = state.clone();
    rebound.layers = bound.iter().map(|&b| state.layers[b].clone()).collect();
    let healthy = model.step(&state, first.query, n, &KeySet::All)?;
    let replay = model.step(&rebound, first.query, n, &KeySet::All)?;
    let miss = |a: &[f32], b: &[f32]| 1.0 - cosine(a, b);
    let precision = miss(&healthy, &first.reference).max(controls_miss);
    let (replay_miss, healthy_miss) = (miss(&replay, &out.logits), miss(&healthy, &out.logits));
    Ok(Some(BindingFit {
        moved,
        replay_miss,
        healthy_miss,
        precision,
        reproduces: crate::diagnose::evidence::beats_healthy(replay_miss, healthy_miss, precision),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_rows_cut_each_head_to_the_prompt() {
        // kv 2, ctx 3, hd 1: head 0 = [1, 2, 3], head 1 = [4, 5, 6]
        let bytes: Vec<u8> = [1f32, 2., 3., 4., 5., 6.]
            .iter()
            .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
            .collect();
        assert_eq!(prompt_rows(&bytes, 2, 3, 1, 2).unwrap(), [1., 2., 4., 5.]);
        assert!(prompt_rows(&bytes[2..], 2, 3, 1, 2).is_err());
    }

    #[test]
    fn the_fit_binds_a_layer_to_the_k_v_it_holds_and_nothing_else() {
        // three layers of [kv 1, n 2, hd 2] K/V, far apart from each other
        let kv = |x: [f32; 4]| {
            let t = |v: [f32; 4]| {
                candle_core::Tensor::from_vec(v.to_vec(), (1, 2, 2), &candle_core::Device::Cpu)
                    .unwrap()
            };
            LayerKv {
                k: t(x),
                v: t([x[3], x[2], x[1], x[0]]),
            }
        };
        let reference = [
            kv([1., 0., 0., 0.]),
            kv([0., 1., 0., 0.]),
            kv([0., 0., 1., 1.]),
        ];
        let held = |l: usize| {
            (
                flat(&reference[l].k).unwrap(),
                flat(&reference[l].v).unwrap(),
            )
        };
        // layers 0 and 1 hold each other's, layer 2 its own
        assert_eq!(
            fit(&[held(1), held(0), held(2)], &reference).unwrap(),
            [1, 0, 2]
        );
        // a state that holds no layer's K/V well keeps its own index
        let garbage = (vec![0.5, 0.5, -0.5, 0.1], vec![0.3, -0.2, 0.1, 0.4]);
        assert_eq!(
            fit(&[garbage, held(1), held(2)], &reference).unwrap(),
            [0, 1, 2]
        );
    }
}
