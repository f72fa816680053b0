//! The K/V binding hypotheses of a stateful device (issue 35): what a writer or a binder can do
//! to the state. A runner that binds a past by a wrong layer index, an export that wires one
//! layer's past to another layer's cache, a present whose K and V edges are exchanged, a present
//! written in another layout than the past is read. Fitted from the states, judged by a replay
//! under the rule of evidence (`diagnose::evidence::beats_healthy`), never by a rule for one
//! fault.
//!
//! 1. **Fit.** Each stored state (the K and the V of each layer) at the prompt's positions, read
//!    under each layout the layout probe knows (the state's documented head-major order and
//!    `Layout::ALL`), is compared with every reference layer's prompt K *and* V (cosine; the
//!    reference at the precision the device declares, its int4 blocks or fp16 weights); a slot
//!    binds to the reference slot and layout it holds best, strictly better than its own in the
//!    documented order and at least `REPRODUCES_COSINE` (the bar a repaired step meets). A state
//!    that holds nothing well keeps its own: that is for the layout and reader rules. The fit is
//!    made twice: on the states after the prompt's prefill (what the first decode step reads: a
//!    writer's fault shows there) and after the first decode step (which writes back what it
//!    read: a binder's fault shows there). A healthy device holds its own everywhere: the
//!    identity, and nothing to replay.
//! 2. **Replay.** The reference's first decode step, computed with the weights the device
//!    declares (its int4 blocks, its fp16 weights), with each moved slot reading what its state
//!    holds in the documented order (the device's own values: what the graph reads), against the
//!    device's own step. The healthy hypothesis is the same step over the right K/V. The declared
//!    precision is what the declared weights cost that step against the f32 checkpoint, at least
//!    the cache-free controls' miss the caller passes. Of the two fits, the replay that misses the
//!    device least is the hypothesis.

use kvprobe_npu::layout::{check_supported, decode, StreamShape};
use kvprobe_npu::MaskMode;
use kvprobe_reference::{KeySet, KvState};
use kvprobe_schema::Layout;

use crate::cache_io;
use crate::metrics::cosine;
use crate::session::Session;
use crate::thresholds::REPRODUCES_COSINE;
use crate::{Error, Result};

/// The two states of a layer, in slot order (`2·layer + kind`, the device's state ids).
const KINDS: [&str; 2] = ["K", "V"];

/// A stored state that holds another reference slot's prompt K/V, or its own in another layout.
#[derive(Debug, Clone, PartialEq)]
pub struct Holding {
    /// The state: layer and kind ("K" or "V").
    pub layer: usize,
    pub kind: &'static str,
    /// The reference prompt K/V it holds: layer, kind, and the layout it holds them in.
    pub from_layer: usize,
    pub from_kind: &'static str,
    pub layout: Layout,
}

impl Holding {
    /// Its own values, only not in the documented order: a writer's layout, not a binding.
    pub fn layout_only(&self) -> bool {
        self.layer == self.from_layer && self.kind == self.from_kind
    }

    fn describe(&self) -> String {
        let how = if self.layout == DOCUMENTED {
            String::new()
        } else {
            format!(" written {}", self.layout.name())
        };
        format!(
            "layer {}'s {} holds layer {}'s {}{how}",
            self.layer, self.kind, self.from_layer, self.from_kind
        )
    }
}

/// The order the stateful graph reads its `[kv_heads, ctx, head_dim]` state in.
const DOCUMENTED: Layout = Layout::HeadMajor;

/// What the binding experiment measured.
#[derive(Debug, Clone, PartialEq)]
pub struct BindingFit {
    /// Which states the fit was made on ("after the prompt's prefill" / "after the first decode step").
    pub when: &'static str,
    /// The states that hold another reference slot's prompt K/V, or their own in another layout.
    pub moved: Vec<Holding>,
    /// 1 − cosine of the replay over the moved states against the device's step.
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
        let moved: Vec<String> = self.moved.iter().map(Holding::describe).collect();
        format!(
            "K/V binding: {} {} prompt K/V; the first step replayed with each layer reading what its state holds misses the device by {:.1e}, the right K/V by {:.1e} (declared precision {:.1e})",
            self.when,
            moved.join(", "),
            self.replay_miss,
            self.healthy_miss,
            self.precision
        )
    }

    /// Every moved state holds its own values in another layout (a writer's layout fault).
    pub fn layout_only(&self) -> bool {
        !self.moved.is_empty() && self.moved.iter().all(Holding::layout_only)
    }
}

/// The geometry of one stored state: `[kv, ctx, hd]` fp16, the prompt's `n` positions.
#[derive(Debug, Clone, Copy)]
struct Geometry {
    kv: usize,
    ctx: usize,
    hd: usize,
    n: usize,
}

/// A state's bytes read under `layout` over its `ctx` positions → the first `n` positions as
/// `[kv, n, hd]` f32 (the reference's K/V shape).
fn view(bytes: &[u8], layout: Layout, g: Geometry) -> Result<Vec<f32>> {
    let Geometry { kv, ctx, hd, n } = g;
    if bytes.len() != 2 * kv * ctx * hd {
        return Err(Error::Device(format!(
            "a state of {} bytes where [kv_heads {kv}, ctx {ctx}, head_dim {hd}] fp16 takes {}",
            bytes.len(),
            2 * kv * ctx * hd
        )));
    }
    let shape = StreamShape {
        tokens: ctx,
        features: kv * hd,
        elem_bytes: 2,
        head_dim: hd,
    };
    let mut block = Vec::new();
    decode(layout, shape, bytes, &mut block);
    let mut out = Vec::with_capacity(kv * n * hd);
    for h in 0..kv {
        for t in 0..n {
            let at = 2 * (t * kv * hd + h * hd);
            out.extend(
                block[at..at + 2 * hd]
                    .chunks_exact(2)
                    .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()),
            );
        }
    }
    Ok(out)
}

/// The layouts a state is read under: the documented order first, then the layout probe's.
fn layouts(features: usize) -> Vec<Layout> {
    std::iter::once(DOCUMENTED)
        .chain(
            Layout::ALL
                .into_iter()
                .filter(|&l| check_supported(l, features).is_ok()),
        )
        .collect()
}

fn flat(t: &candle_core::Tensor) -> Result<Vec<f32>> {
    Ok(t.flatten_all()?.to_vec1()?)
}

/// The reference's prompt K/V in slot order.
fn slots(state: &KvState) -> Result<Vec<Vec<f32>>> {
    let mut out = Vec::with_capacity(2 * state.layers.len());
    for kv in &state.layers {
        out.push(flat(&kv.k)?);
        out.push(flat(&kv.v)?);
    }
    Ok(out)
}

/// The fit: `views[slot][i]` is the state read under `layouts[i]` (`layouts[0]` documented);
/// for each slot, `None` when it holds its own K/V in the documented order (or nothing well),
/// else the reference slot and layout index it holds, strictly best.
fn fit(views: &[Vec<Vec<f32>>], refs: &[Vec<f32>]) -> Vec<Option<(usize, usize)>> {
    views
        .iter()
        .enumerate()
        .map(|(s, per_layout)| {
            // ties keep the slot's own values in the documented order
            let mut best = ((s, 0), cosine(&per_layout[0], &refs[s]));
            for (li, v) in per_layout.iter().enumerate() {
                for (r, reference) in refs.iter().enumerate() {
                    let c = cosine(v, reference);
                    if c > best.1 {
                        best = ((r, li), c);
                    }
                }
            }
            (best.0 != (s, 0) && best.1 >= REPRODUCES_COSINE).then_some(best.0)
        })
        .collect()
}

/// Each slot's views under `layouts`, read from the device's states.
fn read_views(
    bufs: &cache_io::Rings,
    g: Geometry,
    layouts: &[Layout],
    slots: usize,
) -> Result<Vec<Vec<Vec<f32>>>> {
    (0..slots)
        .map(|s| {
            let bytes = bufs
                .get(&(s as u32))
                .ok_or_else(|| Error::Device(format!("the device exposes no state {s}")))?;
            layouts.iter().map(|&l| view(bytes, l, g)).collect()
        })
        .collect()
}

/// One fit's hypothesis: the moved states, and the reference state with each moved slot
/// replaced by what the device's state holds in the documented order.
fn hypothesis(
    views: &[Vec<Vec<f32>>],
    refs: &[Vec<f32>],
    layouts: &[Layout],
    state: &KvState,
    g: Geometry,
) -> Result<Option<(Vec<Holding>, KvState)>> {
    let bound = fit(views, refs);
    let mut moved = Vec::new();
    let mut replay = state.clone();
    for (s, b) in bound.iter().enumerate() {
        let Some((r, li)) = *b else { continue };
        moved.push(Holding {
            layer: s / 2,
            kind: KINDS[s % 2],
            from_layer: r / 2,
            from_kind: KINDS[r % 2],
            layout: layouts[li],
        });
        let layer = &mut replay.layers[s / 2];
        let slot = if s % 2 == 0 {
            &mut layer.k
        } else {
            &mut layer.v
        };
        *slot =
            candle_core::Tensor::from_vec(views[s][0].clone(), (g.kv, g.n, g.hd), slot.device())?;
    }
    Ok((!moved.is_empty()).then_some((moved, replay)))
}

/// The experiment: the two fits, and the replay of the one that misses the device least
/// (`None` when both fits are the identity). Leaves the device after a decode step; callers
/// that need the prompt's prefill run it again.
pub fn run(s: &mut Session, controls_miss: f64) -> Result<Option<BindingFit>> {
    let first = s.first_step()?;
    let prompt = s.prompt_ref()?;
    let prefilled = cache_io::read(s.dev, "after the prompt's prefill (K/V binding)")?;
    let out = s.driver.step(s.dev, first.query, &MaskMode::Ring)?;
    let stepped = cache_io::read(s.dev, "after the first decode step (K/V binding)")?;
    let d = s.describe();
    let g = Geometry {
        kv: d.shape.n_kv_heads,
        ctx: d.cache_len,
        hd: d.shape.head_dim,
        n: s.ids.len(),
    };
    let n_slots = 2 * d.shape.n_layers;
    let layouts = layouts(g.kv * g.hd);
    let declared = crate::matched::Precision::of(s.describe(), s.model)?;
    let model = declared.as_ref().map_or(s.model, |p| p.model(s.model));
    let state = if std::ptr::eq(model, s.model) {
        prompt.state.clone()
    } else {
        crate::session::PromptRef::of(model, &s.ids)?.state
    };
    // the states hold K/V computed at the precision the device declares: fitted against those
    let refs = slots(&state)?;
    let miss = |a: &[f32], b: &[f32]| 1.0 - cosine(a, b);
    let healthy = model.step(&state, first.query, g.n, &KeySet::All)?;
    let precision = miss(&healthy, &first.reference).max(controls_miss);
    let healthy_miss = miss(&healthy, &out.logits);
    let mut best: Option<BindingFit> = None;
    for (when, bufs) in [
        ("after the prompt's prefill", &prefilled),
        ("after the first decode step", &stepped),
    ] {
        let views = read_views(bufs, g, &layouts, n_slots)?;
        let Some((moved, rebound)) = hypothesis(&views, &refs, &layouts, &state, g)? else {
            continue;
        };
        let replay = model.step(&rebound, first.query, g.n, &KeySet::All)?;
        let replay_miss = miss(&replay, &out.logits);
        if best.as_ref().is_some_and(|b| b.replay_miss <= replay_miss) {
            continue;
        }
        best = Some(BindingFit {
            when,
            moved,
            replay_miss,
            healthy_miss,
            precision,
            reproduces: crate::diagnose::evidence::beats_healthy(
                replay_miss,
                healthy_miss,
                precision,
            ),
        });
    }
    Ok(best)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16_bytes(x: &[f32]) -> Vec<u8> {
        x.iter()
            .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
            .collect()
    }

    #[test]
    fn a_view_cuts_each_head_to_the_prompt_in_the_layout_asked() {
        // kv 2, ctx 3, hd 1, head-major: head 0 = [1, 2, 3], head 1 = [4, 5, 6]
        let bytes = f16_bytes(&[1., 2., 3., 4., 5., 6.]);
        let g = Geometry {
            kv: 2,
            ctx: 3,
            hd: 1,
            n: 2,
        };
        assert_eq!(
            view(&bytes, Layout::HeadMajor, g).unwrap(),
            [1., 2., 4., 5.]
        );
        // the same bytes written token-major: token 0 = [1, 2], token 1 = [3, 4]
        assert_eq!(
            view(&bytes, Layout::TokenMajor, g).unwrap(),
            [1., 3., 2., 4.]
        );
        assert!(view(&bytes[2..], Layout::HeadMajor, g).is_err());
    }

    #[test]
    fn the_fit_binds_a_state_to_the_slot_and_layout_it_holds_and_nothing_else() {
        // slots of 4 values, far apart from each other; one layout view per slot, or two
        let refs = vec![
            vec![1., 0., 0., 0.],
            vec![0., 1., 0., 0.],
            vec![0., 0., 1., 1.],
            vec![1., -1., 0., 0.],
        ];
        let own = |s: usize| vec![refs[s].clone()];
        // layer 0's K and V exchanged (K↔V on one layer), layer 1 its own
        assert_eq!(
            fit(&[own(1), own(0), own(2), own(3)], &refs),
            [Some((1, 0)), Some((0, 0)), None, None]
        );
        // layer 1's K read in the second layout is its own: a writer's layout
        let garbage = vec![0.5, 0.5, -0.5, 0.1];
        let writer = vec![garbage.clone(), refs[2].clone()];
        assert_eq!(
            fit(&[own(0), own(1), writer, own(3)], &refs),
            [None, None, Some((2, 1)), None]
        );
        // a state that holds no slot's K/V well keeps its own
        assert_eq!(
            fit(&[vec![garbage], own(1), own(2), own(3)], &refs),
            [None, None, None, None]
        );
    }
}
