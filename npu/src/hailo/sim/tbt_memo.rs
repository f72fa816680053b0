//! Tbt graph runs remembered layer by layer (issue 34): what a run's output depends on is its
//! input besides the past (rows, positions, mask, options) and, per layer, that layer's past; a
//! run whose input equals a remembered one's returns its output, and one that equals it on the
//! first ℓ layers' past starts at layer ℓ from the streams it kept
//! ([`kvprobe_reference::Resume`]). Either way the output is the same bits as computing it.
//!
//! What repeats in a diagnosis: a replay of the device's own fault repeats the device's
//! re-recorded steps, and that record repeats the greedy probe's steps where no stale slot is
//! read (kv-swap: 32 of 32); a probe's trial that swaps one layer's K and V
//! (`inject::partial_swap`, 30 trials) equals the golden step on every layer below it.
//!
//! Runs are matched by 128-bit XXH3 digests of the f32 bits, not by the values themselves: a
//! step's past is 6 MB at L 128 on SmolLM2, and the matches lie up to ~100 runs apart (the
//! greedy probe's steps and the replays at the end), which values would not fit in memory. Two
//! different inputs with equal digests of both the rest and a layer are a 2⁻¹²⁸ chance per
//! comparison. The past columns no row of the mask attends are left out as the prefill memory
//! leaves them out (`memo.rs`, whose argument holds per layer); a non-finite value there makes
//! the run computed, never remembered.
//!
//! Shared by every emulator of the process on the same weights, as the prefill memory is.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use kvprobe_reference::{GraphInput, GraphOutput, Model, Resume, Streams};
use xxhash_rust::xxh3::Xxh3;

use super::memo::live_columns;
use crate::Result;

/// Bytes the remembered runs may hold: an entry is a step's logits, new K/V and streams (about
/// 0.3 MB on SmolLM2), so about 200 steps, more than lie between a run and its match.
const BUDGET: usize = 64 << 20;

/// One emulator's view of the shared memory: whether it uses it, and its hits.
#[derive(Default)]
pub(super) struct TbtMemo {
    off: bool,
    whole: usize,
    resumed: usize,
}

/// A remembered run: the weights it ran on, its digests, its streams and output.
struct Entry {
    model: Weak<Model>,
    head: u128,
    layers: Vec<u128>,
    streams: Streams,
    out: GraphOutput,
}

impl Entry {
    fn bytes(&self) -> usize {
        let kv: usize = self
            .out
            .new_kv
            .iter()
            .map(|l| l.k.elem_count() + l.v.elem_count())
            .sum();
        16 * self.layers.len() + self.streams.bytes() + 4 * (self.out.logits.len() + kv)
    }
}

#[derive(Default)]
struct Shared {
    entries: VecDeque<Entry>,
    bytes: usize,
}

fn shared() -> &'static Mutex<Shared> {
    static SHARED: OnceLock<Mutex<Shared>> = OnceLock::new();
    SHARED.get_or_init(|| Mutex::new(Shared::default()))
}

/// What a run found remembered: its whole output, or the layer it starts at with the streams
/// and new K/V of the run it resumes.
enum Found {
    Whole(GraphOutput),
    From(usize, Streams, Vec<kvprobe_reference::LayerKv>),
}

impl TbtMemo {
    /// `model.run_graph(input)`, from what a remembered run of an equal input (in whole or on
    /// its first layers) kept.
    pub(super) fn run(&mut self, model: &Arc<Model>, input: &GraphInput) -> Result<GraphOutput> {
        let key = if self.off || !model.resumable(input) {
            None
        } else {
            key(input)?
        };
        let Some((head, layers)) = key else {
            return Ok(model.run_graph(input)?);
        };
        let (out, streams) = match find(model, head, &layers) {
            Some(Found::Whole(out)) => {
                self.whole += 1;
                return Ok(out);
            }
            Some(Found::From(layer, streams, new_kv)) => {
                self.resumed += 1;
                let from = Resume {
                    layer,
                    streams: &streams,
                    new_kv: &new_kv,
                };
                model.run_graph_resumed(input, Some(from), true)?
            }
            None => model.run_graph_resumed(input, None, true)?,
        };
        if let Some(streams) = streams {
            remember(Entry {
                model: Arc::downgrade(model),
                head,
                layers,
                streams,
                out: out.clone(),
            });
        }
        Ok(out)
    }

    pub(super) fn set_enabled(&mut self, on: bool) {
        self.off = !on;
    }

    /// Runs answered whole from memory, and runs resumed at a layer.
    pub(super) fn hits(&self) -> (usize, usize) {
        (self.whole, self.resumed)
    }
}

/// The remembered run on `model` with digests `head` sharing the most layers with `layers` (the
/// latest of equals), moved to the back as the most recently used.
fn find(model: &Arc<Model>, head: u128, layers: &[u128]) -> Option<Found> {
    let same = |w: &Weak<Model>| std::ptr::eq(w.as_ptr(), Arc::as_ptr(model));
    // a poisoned lock (a panic elsewhere while it was held) only costs the memory
    let mut m = shared().lock().ok()?;
    let (i, n) = m
        .entries
        .iter()
        .enumerate()
        .filter(|(_, e)| same(&e.model) && e.head == head && e.layers.len() == layers.len())
        .map(|(i, e)| {
            let n = e.layers.iter().zip(layers).take_while(|(a, b)| a == b);
            (i, n.count())
        })
        .max_by_key(|&(i, n)| (n, i))?;
    if n == 0 {
        return None;
    }
    let e = m.entries.remove(i)?;
    let found = if n == layers.len() {
        Found::Whole(e.out.clone())
    } else {
        Found::From(n, e.streams.clone(), e.out.new_kv.clone())
    };
    m.entries.push_back(e);
    Some(found)
}

/// Keeps `e`, the oldest entries (and those of dropped weights) leaving past the budget.
fn remember(e: Entry) {
    let Ok(mut m) = shared().lock() else { return };
    let Shared { entries, bytes } = &mut *m;
    entries.retain(|x| {
        let live = x.model.strong_count() > 0;
        if !live {
            *bytes -= x.bytes();
        }
        live
    });
    *bytes += e.bytes();
    entries.push_back(e);
    while *bytes > BUDGET && entries.len() > 1 {
        if let Some(x) = entries.pop_front() {
            *bytes -= x.bytes();
        }
    }
}

fn f32_bits(h: &mut Xxh3, xs: &[f32], buf: &mut Vec<u8>) {
    buf.clear();
    buf.extend(xs.iter().flat_map(|x| x.to_bits().to_le_bytes()));
    h.update(&(xs.len() as u64).to_le_bytes());
    h.update(buf);
}

/// The digests of `input`: of everything but the past, and of each layer's live past; `None`
/// when there is no past (nothing to resume by) or a column no row attends holds a non-finite
/// value (module doc).
fn key(input: &GraphInput) -> Result<Option<(u128, Vec<u128>)>> {
    let (t, hidden) = input.hidden.dims2()?;
    let Some(first) = input.past.first() else {
        return Ok(None);
    };
    let w = first.k.dims3()?.1;
    let live = live_columns(input, t, w);
    let mut buf = Vec::new();
    let mut h = Xxh3::new();
    for x in [t, hidden, w, usize::from(input.last_only)] {
        h.update(&(x as u64).to_le_bytes());
    }
    let g = &input.graph;
    h.update(&g.attn_scale.to_bits().to_le_bytes());
    for f in [g.heads.kv_head as usize, g.heads.softmax_groups as usize] {
        h.update(&(f as u64).to_le_bytes());
    }
    match g.blocked {
        None => h.update(&[0]),
        Some(b) => {
            h.update(&[1]);
            h.update(&b.bias.to_bits().to_le_bytes());
            h.update(&(b.empty as u64).to_le_bytes());
        }
    }
    f32_bits(
        &mut h,
        &input.hidden.flatten_all()?.to_vec1::<f32>()?,
        &mut buf,
    );
    let (kind, lists) = input.positions.lists();
    h.update(&[kind]);
    for x in lists {
        f32_bits(&mut h, x, &mut buf);
    }
    h.update(&(input.mask.len() as u64).to_le_bytes());
    buf.clear();
    buf.extend(input.mask.iter().map(|&m| u8::from(m)));
    h.update(&buf);
    let head = h.digest128();
    let mut layers = Vec::with_capacity(input.past.len());
    for l in &input.past {
        let mut h = Xxh3::new();
        for x in [&l.k, &l.v] {
            let (heads, cols, hd) = x.dims3()?;
            for d in [heads, cols, hd] {
                h.update(&(d as u64).to_le_bytes());
            }
            let data = x.flatten_all()?.to_vec1::<f32>()?;
            for (r, row) in data.chunks_exact(hd.max(1)).enumerate() {
                match live.get(r % cols.max(1)) {
                    Some(true) => f32_bits(&mut h, row, &mut buf),
                    // a dead column's finite K and V add exactly nothing (module doc)
                    _ if row.iter().all(|v| v.is_finite()) => {}
                    _ => return Ok(None),
                }
            }
        }
        layers.push(h.digest128());
    }
    Ok(Some((head, layers)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};
    use kvprobe_reference::{GraphOptions, LayerKv, PositionInput};

    /// One row, two past columns on two layers, the first column masked for the only head.
    fn input(dead: f32, live: [f32; 2]) -> GraphInput {
        let kv = |a: f32, b: f32| Tensor::from_vec(vec![a, b], (1, 2, 1), &Device::Cpu).unwrap();
        let layer = |v: f32| LayerKv {
            k: kv(7.0, 3.0),
            v: kv(dead, v),
        };
        GraphInput {
            hidden: Tensor::from_vec(vec![0.5f32, -1.0], (1, 2), &Device::Cpu).unwrap(),
            positions: PositionInput::Ids(vec![2.0]),
            past: vec![layer(live[0]), layer(live[1])],
            mask: vec![false, true, true],
            graph: GraphOptions::default(),
            last_only: true,
        }
    }

    #[test]
    fn a_layer_digest_follows_its_live_past_only() {
        let (head, a) = key(&input(1.0, [2.0, 4.0])).unwrap().expect("finite");
        // a dead column's value changes nothing
        assert_eq!(
            key(&input(-9.0, [2.0, 4.0])).unwrap(),
            Some((head, a.clone()))
        );
        // the second layer's past differs: the first layer's digest stays
        let (head2, b) = key(&input(1.0, [2.0, 5.0])).unwrap().expect("finite");
        assert_eq!((head2, b[0]), (head, a[0]));
        assert_ne!(b[1], a[1]);
        // a non-finite dead value: not remembered
        assert_eq!(key(&input(f32::NAN, [2.0, 4.0])).unwrap(), None);
        // the rest of the input is the head digest
        let mut other = input(1.0, [2.0, 4.0]);
        other.mask = vec![true, true, true];
        assert_ne!(key(&other).unwrap().expect("finite").0, head);
    }
}
