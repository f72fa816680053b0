//! What every probe shares: the device, the genai driver, the prompt, and the reference results
//! computed once per run (the prompt's forward with K/V taps, the first tbt step).

use std::rc::Rc;

use candle_core::Tensor;
use kvprobe_npu::{Device, Driver, EmbeddingTable, RunOutput};
use kvprobe_reference::{
    ForwardOptions, GraphInput, GraphOptions, KvState, LayerKv, Model, PositionInput,
};
use kvprobe_schema::{DeviceDescription, GroupKind, InputRole};

use crate::progress::Progress;
use crate::{Error, Result};

/// Ring geometry of one run: defined once, in the schema.
pub use kvprobe_schema::Geometry;

/// The prompt's reference: causal logits at every position and the K/V state.
pub struct PromptRef {
    /// `[n, vocab]` row-major: row i = the logits after prefix `ids[..=i]`.
    pub logits: Vec<f32>,
    pub vocab: usize,
    pub state: KvState,
}

impl PromptRef {
    /// `model`'s causal forward of `ids` with K/V taps.
    pub fn of(model: &Model, ids: &[u32]) -> Result<PromptRef> {
        let out = model.forward(
            ids,
            &ForwardOptions {
                taps: true,
                ..Default::default()
            },
        )?;
        let layers = out
            .taps
            .ok_or_else(|| Error::Candle("reference forward returned no K/V taps".into()))?;
        Ok(PromptRef {
            logits: out.logits,
            vocab: out.vocab,
            state: KvState {
                layers,
                positions: (0..ids.len()).collect(),
                ids: ids.to_vec(),
            },
        })
    }

    pub fn row(&self, i: usize) -> &[f32] {
        &self.logits[i * self.vocab..(i + 1) * self.vocab]
    }
}

/// The first tbt step of the server's path: query = the device's prefill argmax at position n.
pub struct FirstStep {
    pub device_prefill: Vec<f32>,
    pub query: u32,
    pub position: usize,
    /// Reference logits of that step over the whole prompt.
    pub reference: Vec<f32>,
}

/// Logits a probe compared, row-major `[rows][cols]`, kept out of the findings because they are
/// too large for results.json; the CLI writes them as `.npy` next to it.
#[derive(Debug, Clone, PartialEq)]
pub struct ComparedLogits {
    pub name: String,
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f32>,
}

pub struct Session<'a> {
    pub model: &'a Model,
    pub dev: &'a mut dyn Device,
    pub driver: Driver,
    pub ids: Vec<u32>,
    pub progress: &'a dyn Progress,
    /// Compared logits of the probes that ran (device and reference side by side).
    pub compared: Vec<ComparedLogits>,
    /// The matched reference's last greedy drive, shared by the probes that drive the same
    /// prompt and tokens (greedy, the chat's first turn).
    pub matched_runs: crate::matched::DriveMemo,
    prompt: Option<Rc<PromptRef>>,
    first: Option<Rc<FirstStep>>,
}

impl<'a> Session<'a> {
    /// The readable piece of each id, for the tables a report shows beside ids.
    pub fn token_texts(
        &self,
        ids: impl IntoIterator<Item = u32>,
    ) -> std::collections::BTreeMap<u32, String> {
        let tok = self.model.tokenizer();
        ids.into_iter()
            .map(|id| (id, tok.token_piece(id)))
            .collect()
    }

    pub fn new(
        model: &'a Model,
        dev: &'a mut dyn Device,
        ids: Vec<u32>,
        progress: &'a dyn Progress,
    ) -> Result<Self> {
        let desc = dev.describe().clone();
        check_model_matches(model, &desc)?;
        let emb = desc
            .group(GroupKind::Prefill)
            .and_then(|g| {
                g.inputs
                    .iter()
                    .find(|i| i.role == Some(InputRole::Embeddings))
            })
            .ok_or_else(|| {
                Error::Device("the prefill group has no embeddings input (contract §3.1)".into())
            })?
            .clone();
        let table = EmbeddingTable::from_model(model, &emb)?;
        let driver = Driver::new(&*dev, table)?;
        if ids.is_empty() {
            return Err(kvprobe_npu::Error::EmptyPrompt.into());
        }
        if dev.capabilities().stateful && ids.len() >= desc.cache_len {
            return Err(kvprobe_npu::Error::ContextTooLong {
                tokens: ids.len(),
                max_ctx: desc.cache_len,
            }
            .into());
        }
        if ids.len() >= desc.cache_len {
            return Err(kvprobe_npu::Error::PromptTooLong {
                tokens: ids.len(),
                cache_len: desc.cache_len,
            }
            .into());
        }
        let vocab = model.config().vocab_size;
        if let Some(&bad) = ids.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::Input(format!(
                "token id {bad} is outside the model's vocabulary of {vocab}; pass ids below {vocab}"
            )));
        }
        Ok(Session {
            model,
            dev,
            driver,
            ids,
            progress,
            compared: Vec::new(),
            matched_runs: Default::default(),
            prompt: None,
            first: None,
        })
    }

    pub fn describe(&self) -> &DeviceDescription {
        self.dev.describe()
    }

    pub fn geometry(&self) -> Geometry {
        let d = self.dev.describe();
        Geometry {
            cache_len: d.cache_len,
            prefill_len: d.prefill_len,
            prompt_len: self.ids.len(),
        }
    }

    pub fn has_tbt(&self) -> bool {
        self.dev.describe().group(GroupKind::Tbt).is_some()
    }

    pub fn require_tbt(&self, probe: &str) -> Result<()> {
        if self.has_tbt() {
            Ok(())
        } else {
            Err(Error::Device(format!(
                "`{probe}` needs a tbt group; this device has only prefill"
            )))
        }
    }

    /// Reset as the server's clear-context, then prefill `ids` (contract §2.10, §2.3).
    pub fn prefill(&mut self, ids: &[u32]) -> Result<RunOutput> {
        self.driver.reset(self.dev)?;
        Ok(self.driver.prefill(self.dev, ids)?)
    }

    /// Zero every ring (HailoRT `update_cache_buffer`, contract §1.8), as a freshly configured
    /// device; probes that read never-written entries start from here, since a reset keeps the
    /// ring bytes (contract §2.10).
    pub fn clear_rings(&mut self) -> Result<()> {
        let l = self.dev.describe().cache_len;
        for info in crate::rings::cache_infos(self.dev.describe())? {
            let zeros = vec![0u8; l * info.padded_entry_size];
            crate::cache_io::write(self.dev, info.cache_id, &zeros, "zeroing the caches")?;
        }
        Ok(())
    }

    /// Reset and prefill the session's prompt.
    pub fn prefill_prompt(&mut self) -> Result<RunOutput> {
        let ids = self.ids.clone();
        self.prefill(&ids)
    }

    /// The prompt's causal forward with K/V taps (computed once).
    pub fn prompt_ref(&mut self) -> Result<Rc<PromptRef>> {
        if let Some(p) = &self.prompt {
            return Ok(p.clone());
        }
        let p = Rc::new(PromptRef::of(self.model, &self.ids)?);
        self.prompt = Some(p.clone());
        Ok(p)
    }

    /// The device's prefill of the prompt, its argmax (the query token of colmap, maskconv,
    /// positions and inject) and the reference of the first tbt step. Leaves the device right
    /// after that prefill.
    pub fn first_step(&mut self) -> Result<Rc<FirstStep>> {
        let out = self.prefill_prompt()?;
        if let Some(f) = &self.first {
            return Ok(f.clone());
        }
        let query = kvprobe_npu::argmax(&out.logits);
        let prompt = self.prompt_ref()?;
        let n = self.ids.len();
        let reference = window_step(self.model, &prompt.state, query, n, n)?.0;
        let f = Rc::new(FirstStep {
            device_prefill: out.logits,
            query,
            position: n,
            reference,
        });
        self.first = Some(f.clone());
        Ok(f)
    }
}

/// One reference token at `position` attending to the last `window` entries of `state` and
/// itself, as a tbt step sees a (possibly wrapped) ring. Returns the logits and the token's own
/// K/V (`[n_kv, 1, hd]` per layer), computed the way the device computes them: with the same
/// windowed attention in earlier layers.
pub fn window_step(
    model: &Model,
    state: &KvState,
    token: u32,
    position: usize,
    window: usize,
) -> Result<(Vec<f32>, Vec<LayerKv>)> {
    window_step_with(
        model,
        state,
        token,
        position,
        window,
        GraphOptions::default(),
    )
}

/// [`window_step`] with other graph math (the attention-scale fit).
pub fn window_step_with(
    model: &Model,
    state: &KvState,
    token: u32,
    position: usize,
    window: usize,
    graph: GraphOptions,
) -> Result<(Vec<f32>, Vec<LayerKv>)> {
    let n = state.len();
    let w = window.min(n);
    let past: Vec<LayerKv> = if w == 0 {
        Vec::new()
    } else {
        state
            .layers
            .iter()
            .map(|l| -> Result<LayerKv> {
                Ok(LayerKv {
                    k: l.k.narrow(1, n - w, w)?.contiguous()?,
                    v: l.v.narrow(1, n - w, w)?.contiguous()?,
                })
            })
            .collect::<Result<_>>()?
    };
    let nh = model.config().n_heads;
    let out = model.run_graph(&GraphInput {
        hidden: model.embed(&[token])?,
        positions: PositionInput::Ids(vec![position as f32]),
        past,
        mask: vec![true; nh * (w + 1)],
        graph,
        last_only: true,
    })?;
    Ok((out.logits, out.new_kv))
}

/// Append one token's K/V to a state.
pub fn append(state: &mut KvState, kv: &[LayerKv], token: u32, position: usize) -> Result<()> {
    for (l, n) in state.layers.iter_mut().zip(kv) {
        l.k = Tensor::cat(&[&l.k, &n.k], 1)?;
        l.v = Tensor::cat(&[&l.v, &n.v], 1)?;
    }
    state.positions.push(position);
    state.ids.push(token);
    Ok(())
}

/// The model the user passed must be the one the device was compiled from (same shape).
fn check_model_matches(model: &Model, desc: &DeviceDescription) -> Result<()> {
    let c = model.config();
    let s = &desc.shape;
    if c.hidden_size != s.hidden_size
        || c.n_layers != s.n_layers
        || c.n_heads != s.n_heads
        || c.n_kv_heads != s.n_kv_heads
    {
        return Err(Error::Input(format!(
            "the model (hidden {}, {} layers, {}/{} heads) does not match the device (hidden {}, {} layers, {}/{} heads); pass --model the checkpoint the device was compiled from",
            c.hidden_size, c.n_layers, c.n_heads, c.n_kv_heads, s.hidden_size, s.n_layers, s.n_heads, s.n_kv_heads
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_window_prior_art_example() {
        // prior art §2.6: L = 24, P = 16, 16-token prompt: cols 0..6 empty, cols 7..22 = pos 0..15
        let g = Geometry {
            cache_len: 24,
            prefill_len: 16,
            prompt_len: 16,
        };
        assert_eq!(g.tbt_window(), 23);
        assert_eq!(g.first_window_position(6), None);
        assert_eq!(g.first_window_position(7), Some(0));
        assert_eq!(g.first_window_position(22), Some(15));
        assert_eq!(g.first_window_column(0), 7);
        assert_eq!(g.chunks(16), 1);
        assert_eq!(g.chunks(17), 2);
        // one full chunk: nothing below position 0 was written
        assert_eq!(g.padding_floor(), 0);
        assert!(g.first_window_never_written(6) && !g.first_window_never_written(7));
        // 13 tokens, P = 8: remainder chunk of 5 runs 8 rows, positions −3..−1 are padding
        let g = Geometry {
            cache_len: 24,
            prefill_len: 8,
            prompt_len: 13,
        };
        assert_eq!(g.padding_floor(), -3);
        // column j holds position 13 + 1 + j − 24 = j − 10: j = 7 → −3 (padding), j = 6 → −4
        assert!(!g.first_window_never_written(7));
        assert!(g.first_window_never_written(6));
        // 5 tokens, P = 8: one chunk of 5 real + 3 padding rows
        let g = Geometry {
            cache_len: 24,
            prefill_len: 8,
            prompt_len: 5,
        };
        assert_eq!(g.padding_floor(), -3);
    }
}
