//! A graph run resumed at a layer (issue 34): a run's layers are a chain, layer ℓ reading the
//! residual stream layers 0..ℓ left and its own past; a run whose input (rows, positions, mask,
//! options) equals an earlier run's and whose past equals it on layers 0..ℓ computes the same
//! stream entering layer ℓ and the same new K/V on layers 0..ℓ, bit for bit, so it may start
//! there from what the earlier run kept. The emulator's one-layer variations of a step (a probe's
//! trial that swaps one layer's K and V, a replay of a fault scoped to one layer) then compute
//! only the layers from the first one that differs.

use super::{AttnCtx, RopeTable};
use crate::arith::Rounder;
use crate::kv::LayerKv;
use crate::{Error, Result};

/// The residual stream entering one layer: `x`, and what the next norm reads when it is not
/// `x` (a fused skip-norm's float32 sum; never under the plain float32 a resumed run has).
#[derive(Debug, Clone)]
pub struct Stream {
    pub(super) x: Vec<f32>,
    pub(super) norm_in: Option<Vec<f32>>,
}

/// A run's streams entering each of its layers, in order.
#[derive(Debug, Clone)]
pub struct Streams(pub(super) Vec<Stream>);

impl Streams {
    /// Bytes the streams hold (what a memory of runs counts).
    pub fn bytes(&self) -> usize {
        self.0
            .iter()
            .map(|s| 4 * (s.x.len() + s.norm_in.as_ref().map_or(0, Vec::len)))
            .sum()
    }
}

/// Where a run starts: at `layer`, from an earlier run's `streams` (all its layers) and the new
/// K/V it computed (`new_kv`, at least its first `layer` layers). The caller vouches that the
/// earlier run's input equals this one's up to `layer` (same rows, positions, mask, options,
/// model, and the same past on layers 0..`layer`); the run checks the shapes only.
#[derive(Debug, Clone, Copy)]
pub struct Resume<'a> {
    pub layer: usize,
    pub streams: &'a Streams,
    pub new_kv: &'a [LayerKv],
}

impl Resume<'_> {
    /// Sets `stream` to the one entering `self.layer`, `new_kv` to the earlier run's first
    /// layers and `kept` (when kept) to its first streams; the layer the run continues at.
    pub(super) fn start(
        &self,
        stream: &mut Stream,
        new_kv: &mut Vec<LayerKv>,
        kept: Option<&mut Streams>,
        n_layers: usize,
    ) -> Result<usize> {
        let l = self.layer;
        let Some(entering) = self.streams.0.get(l).filter(|_| l < n_layers) else {
            return Err(Error::InvalidInput(format!(
                "resume at layer {l} of {n_layers} from {} kept streams",
                self.streams.0.len()
            )));
        };
        if self.new_kv.len() < l || entering.x.len() != stream.x.len() {
            return Err(Error::InvalidInput(format!(
                "resume at layer {l}: {} new K/V layers, a stream of {} values for {}",
                self.new_kv.len(),
                entering.x.len(),
                stream.x.len()
            )));
        }
        *stream = entering.clone();
        new_kv.extend_from_slice(&self.new_kv[..l]);
        if let Some(k) = kept {
            k.0.extend_from_slice(&self.streams.0[..l]);
        }
        Ok(l)
    }
}

/// Everything one layer of a run needs besides its weights and stream.
pub(super) struct LayerCtx<'a> {
    pub(super) attn: AttnCtx<'a>,
    pub(super) rope: Option<&'a (RopeTable, RopeTable)>,
    pub(super) rnd: &'a Rounder,
    /// Per layer the past (empty when the run has none).
    pub(super) past: &'a [LayerKv],
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor};

    use crate::{fixtures, GraphInput, GraphOptions, LayerKv, Model, PositionInput};

    /// A one-row step over `w` past columns whose values on layer `changed` (if any) differ.
    fn step(m: &Model, w: usize, changed: Option<usize>) -> GraphInput {
        let c = m.config();
        let (nkv, hd) = (c.n_kv_heads, c.head_dim);
        let past = (0..c.n_layers)
            .map(|l| {
                let shift = if Some(l) == changed { 0.5 } else { 0.0 };
                let vals = |s: usize| -> Tensor {
                    let v: Vec<f32> = (0..nkv * w * hd)
                        .map(|i| ((i * 37 + l * 11 + s) % 19) as f32 / 9.0 - 1.0 + shift)
                        .collect();
                    Tensor::from_vec(v, (nkv, w, hd), &Device::Cpu).unwrap()
                };
                LayerKv {
                    k: vals(1),
                    v: vals(2),
                }
            })
            .collect();
        GraphInput {
            hidden: m.embed(&[3]).unwrap(),
            positions: PositionInput::Ids(vec![w as f32]),
            past,
            mask: vec![true; c.n_heads * (w + 1)],
            graph: GraphOptions::default(),
            last_only: true,
        }
    }

    fn bits(x: &[f32]) -> Vec<u32> {
        x.iter().map(|v| v.to_bits()).collect()
    }

    #[test]
    fn a_run_resumed_at_the_layer_it_changes_gives_the_computed_bits() {
        let dir = tempfile::tempdir().unwrap();
        fixtures::write_tiny_llama(dir.path(), 5).unwrap();
        let m = Model::load(dir.path()).unwrap();
        let golden = step(&m, 6, None);
        let (g, kept) = m.run_graph_resumed(&golden, None, true).unwrap();
        let kept = kept.expect("a plain float32 run keeps its streams");
        assert_eq!(bits(&g.logits), bits(&m.run_graph(&golden).unwrap().logits));
        for l in 0..m.config().n_layers {
            let input = step(&m, 6, Some(l));
            let want = m.run_graph(&input).unwrap();
            let from = super::Resume {
                layer: l,
                streams: &kept,
                new_kv: &g.new_kv,
            };
            let (got, streams) = m.run_graph_resumed(&input, Some(from), true).unwrap();
            assert_eq!(bits(&got.logits), bits(&want.logits), "layer {l}");
            assert_ne!(
                bits(&got.logits),
                bits(&g.logits),
                "layer {l} changes the step"
            );
            for (a, b) in got.new_kv.iter().zip(&want.new_kv) {
                let v = |t: &Tensor| bits(&t.flatten_all().unwrap().to_vec1::<f32>().unwrap());
                assert_eq!((v(&a.k), v(&a.v)), (v(&b.k), v(&b.v)), "layer {l}");
            }
            assert_eq!(streams.map(|s| s.0.len()), Some(m.config().n_layers));
        }
        // past the last layer there is nothing to resume
        let from = super::Resume {
            layer: m.config().n_layers,
            streams: &kept,
            new_kv: &g.new_kv,
        };
        assert!(m.run_graph_resumed(&golden, Some(from), false).is_err());
    }
}
