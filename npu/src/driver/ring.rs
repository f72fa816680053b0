//! The driver's ring path (`Capabilities::ring_offset`): what the HailoRT genai server does
//! (contract §2). Per run: update the host window, fill embeddings, the ring-buffer mask and
//! positions, `update_cache_offset(+n)`, then run (contract §2.3). Prefill chunks are remainder
//! first, then full chunks of `P`; the prefill embeddings input is the whole `P`-row window.

use kvprobe_schema::GroupKind;

use super::{move_offset, run_batch_on, run_on, Driver, GroupInputs, Trial};
use crate::mask::{encode_heads, encode_per_head, encode_tiled, ring_rows, tbt_row, MaskMode};
use crate::{Buffer, Device, Error, Result, RunOutput};

impl Driver {
    fn check_mask_frame(&self, g: &GroupInputs, rows: usize) -> Result<()> {
        let want = rows * self.n_heads * self.cache_len;
        if g.mask.elements() != want {
            return Err(Error::Device(format!(
                "mask input `{}` has {} elements, the server writes T·NH·KV = {want} (contract §2.5)",
                g.mask.name,
                g.mask.elements()
            )));
        }
        Ok(())
    }

    pub(super) fn run_prefill_chunk(
        &mut self,
        dev: &mut dyn Device,
        chunk: &[u32],
    ) -> Result<RunOutput> {
        let p = self.prefill_len;
        self.push_tokens(chunk)?;
        let g = self.prefill.clone();
        self.check_mask_frame(&g, p)?;
        let mut inputs = Vec::with_capacity(6);
        inputs.push((g.embeddings.name.clone(), self.embeddings_rows(0)));
        let rows = ring_rows(p, self.cache_len, self.state.usage);
        encode_tiled(
            &rows,
            p,
            self.n_heads,
            self.cache_len,
            self.m1,
            &mut self.mask_buf,
        );
        inputs.push((g.mask.name.clone(), Buffer::U8(self.mask_buf.clone())));
        let pos = self.state.window_pos.clone();
        self.position_inputs(&g, &pos, &mut inputs)?;
        let at = self.state.position.saturating_sub(1);
        let step = || {
            format!(
                "prefill chunk of {} tokens ending at position {at}",
                chunk.len()
            )
        };
        move_offset(dev, chunk.len() as i32, step)?;
        run_on(dev, GroupKind::Prefill, &inputs, step)
    }

    /// A new request whose prompt is one prefill chunk sent under a probe's mask: `per_head`
    /// gives each of the `NH` heads its `[P][KV]` rows instead of the server's tiled ring rows
    /// (`ring_rows(P, KV, ids.len())` is what the server sends). The device's caches then hold
    /// that trial's K/V: prefill again before anything else.
    pub fn prefill_chunk_masked(
        &mut self,
        dev: &mut dyn Device,
        ids: &[u32],
        per_head: &[Vec<bool>],
    ) -> Result<RunOutput> {
        let (p, kv) = (self.prefill_len, self.cache_len);
        if !self.caps.ring_offset {
            return Err(Error::InvalidArgument(
                "a masked prefill chunk needs a ring device (the mask input of contract §2.5)"
                    .into(),
            ));
        }
        if ids.is_empty() || ids.len() > p {
            return Err(Error::InvalidArgument(format!(
                "a masked prefill chunk takes 1..={p} tokens, got {}",
                ids.len()
            )));
        }
        if per_head.len() != self.n_heads || per_head.iter().any(|h| h.len() != p * kv) {
            return Err(Error::InvalidArgument(format!(
                "a masked prefill chunk needs {} head patterns of {p} × {kv}",
                self.n_heads
            )));
        }
        self.check_ids(ids)?;
        self.reset(dev)?;
        self.push_tokens(ids)?;
        let g = self.prefill.clone();
        self.check_mask_frame(&g, p)?;
        let mut inputs = Vec::with_capacity(6);
        inputs.push((g.embeddings.name.clone(), self.embeddings_rows(0)));
        encode_heads(per_head, p, kv, self.m1, &mut self.mask_buf);
        inputs.push((g.mask.name.clone(), Buffer::U8(self.mask_buf.clone())));
        let pos = self.state.window_pos.clone();
        self.position_inputs(&g, &pos, &mut inputs)?;
        let step = || format!("masked prefill chunk of {} tokens", ids.len());
        move_offset(dev, ids.len() as i32, step)?;
        let out = run_on(dev, GroupKind::Prefill, &inputs, step);
        self.saved = None;
        out
    }

    pub(super) fn run_tbt(
        &mut self,
        dev: &mut dyn Device,
        token: u32,
        mode: &MaskMode,
    ) -> Result<RunOutput> {
        let inputs = self.tbt_inputs(token, mode)?;
        let at = self.state.position;
        let step = || format!("tbt step at position {}", at.saturating_sub(1));
        move_offset(dev, 1, step)?;
        run_on(dev, GroupKind::Tbt, &inputs, step)
    }

    /// Push `token` into the host window and build its tbt run's inputs under `mode`.
    fn tbt_inputs(&mut self, token: u32, mode: &MaskMode) -> Result<Vec<(String, Buffer)>> {
        let g = self
            .tbt
            .clone()
            .ok_or_else(|| Error::Device("no tbt group".into()))?;
        self.push_tokens(&[token])?;
        self.check_mask_frame(&g, 1)?;
        let kv = self.cache_len;
        let mut inputs = Vec::with_capacity(6);
        inputs.push((
            g.embeddings.name.clone(),
            self.embeddings_rows(self.prefill_len - 1),
        ));
        match mode {
            MaskMode::Custom(maps) => {
                if !(maps.len() == 1 || maps.len() == self.n_heads)
                    || maps.iter().any(|m| m.len() != kv)
                {
                    return Err(Error::InvalidArgument(format!(
                        "custom mask needs 1 or {} bitmaps of {kv} columns",
                        self.n_heads
                    )));
                }
                encode_per_head(maps, self.n_heads, kv, self.m1, &mut self.mask_buf);
            }
            MaskMode::SingleKey(j) if *j + 1 >= kv => {
                return Err(Error::InvalidArgument(format!(
                    "single-key column {j} is not a read-window entry (0..{})",
                    kv - 1
                )));
            }
            _ => {
                let row = tbt_row(mode, kv, self.state.usage).unwrap_or_default();
                encode_tiled(&row, 1, self.n_heads, kv, self.m1, &mut self.mask_buf);
            }
        }
        inputs.push((g.mask.name.clone(), Buffer::U8(self.mask_buf.clone())));
        // contract §2.6: tbt uses the newest position pos[P−1]
        let newest = [self.state.window_pos[self.prefill_len - 1]];
        self.position_inputs(&g, &newest, &mut inputs)?;
        Ok(inputs)
    }

    pub(super) fn ring_prefill(&mut self, dev: &mut dyn Device, ids: &[u32]) -> Result<RunOutput> {
        if ids.len() >= self.cache_len {
            return Err(Error::PromptTooLong {
                tokens: ids.len(),
                cache_len: self.cache_len,
            });
        }
        self.check_ids(ids)?;
        let p = self.prefill_len;
        let r = ids.len() % p;
        let mut chunks: Vec<&[u32]> = Vec::new();
        if r > 0 {
            chunks.push(&ids[..r]);
        }
        chunks.extend(ids[r..].chunks(p));
        let mut out = RunOutput::default();
        for c in chunks {
            out = self.run_prefill_chunk(dev, c)?;
        }
        self.saved = None;
        Ok(out)
    }

    pub(super) fn ring_step(
        &mut self,
        dev: &mut dyn Device,
        token: u32,
        mode: &MaskMode,
    ) -> Result<RunOutput> {
        let saved = self.state.clone();
        let out = if self.tbt.is_some() {
            self.run_tbt(dev, token, mode)?
        } else if *mode == MaskMode::Ring {
            // No tbt group: the server runs a 1-token prefill chunk (contract §3.2).
            self.run_prefill_chunk(dev, &[token])?
        } else {
            return Err(Error::InvalidArgument(
                "this device has no tbt group; only the ring mask is possible".into(),
            ));
        };
        self.saved = Some(saved);
        Ok(out)
    }

    pub(super) fn ring_trial_batch(
        &mut self,
        dev: &mut dyn Device,
        trials: &[Trial],
    ) -> Result<Vec<RunOutput>> {
        let start = self.state.clone();
        if self.tbt.is_none() {
            let mut outs = Vec::with_capacity(trials.len());
            for t in trials {
                self.state = start.clone().with_position_offset(t.position_shift);
                let out = self.trial_step(dev, t.token, &t.mode);
                self.state = start.clone();
                outs.push(out?);
            }
            return Ok(outs);
        }
        let mut batch = Vec::with_capacity(trials.len());
        for t in trials {
            self.state = start.clone().with_position_offset(t.position_shift);
            let inputs = self.tbt_inputs(t.token, &t.mode);
            self.state = start.clone();
            batch.push(inputs?);
        }
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let at = start.position;
        let step = || format!("batch of {} trial tbt steps at position {at}", batch.len());
        move_offset(dev, 1, step)?;
        let outs = run_batch_on(dev, GroupKind::Tbt, &batch, step);
        // every trial advanced R by one and was stepped back: undo the one advance
        move_offset(dev, -1, step)?;
        self.saved = None;
        outs
    }
}
