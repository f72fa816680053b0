//! The driver's stateful path (issue 9, `Capabilities::stateful`): what a Core ML host does.
//!
//! Positions are absolute and the device writes its states itself, so there is no read offset to
//! move and no host window: every run gets the rows' input embeddings, their position ids and an
//! additive fp16 mask `[q, max_ctx]` (0 attends, −inf blocks). Prefill runs chunks of up to
//! `max_query` rows from the start of the prompt; decode runs one row. The context ends at
//! `max_ctx`: a prompt that does not fit, or a step at position `max_ctx`, is a typed error.

use kvprobe_schema::GroupKind;

use super::{run_batch_on, run_on, Driver, Trial};
use crate::mask::additive_fp16 as mask_value;
use crate::mask::MaskMode;
use crate::{Buffer, Device, Error, Result, RunOutput};

impl Driver {
    pub(super) fn stateful_prefill(
        &mut self,
        dev: &mut dyn Device,
        ids: &[u32],
    ) -> Result<RunOutput> {
        let max_ctx = self.cache_len;
        if self.state.position as usize + ids.len() > max_ctx - 1 {
            return Err(Error::ContextTooLong {
                tokens: self.state.position as usize + ids.len(),
                max_ctx,
            });
        }
        let mut out = RunOutput::default();
        for chunk in ids.chunks(self.prefill_len) {
            let first = self.state.position as usize;
            let positions: Vec<usize> = (first..first + chunk.len()).collect();
            let rows: Vec<Vec<bool>> = positions
                .iter()
                .map(|&p| (0..max_ctx).map(|j| j <= p).collect())
                .collect();
            let inputs = self.stateful_inputs(GroupKind::Prefill, chunk, &positions, &rows)?;
            let step = || {
                format!(
                    "prefill chunk at positions {first}..{}",
                    first + chunk.len()
                )
            };
            out = run_on(dev, GroupKind::Prefill, &inputs, step)?;
            self.state.position += chunk.len() as u64;
            self.state.usage += chunk.len();
        }
        self.saved = None;
        Ok(out)
    }

    /// One decode row at the next position under `mask` (columns = absolute positions).
    pub(super) fn stateful_step(
        &mut self,
        dev: &mut dyn Device,
        token: u32,
        mode: &MaskMode,
    ) -> Result<RunOutput> {
        let saved = self.state.clone();
        let pos = self.state.position as usize;
        let inputs = self.stateful_step_inputs(token, pos, mode)?;
        let out = run_on(dev, GroupKind::Tbt, &inputs, || {
            format!("decode step at position {pos}")
        })?;
        self.state.position += 1;
        self.state.usage += 1;
        self.saved = Some(saved);
        Ok(out)
    }

    fn stateful_step_inputs(
        &self,
        token: u32,
        pos: usize,
        mode: &MaskMode,
    ) -> Result<Vec<(String, Buffer)>> {
        let max_ctx = self.cache_len;
        if pos >= max_ctx {
            return Err(Error::ContextFull { max_ctx });
        }
        let usage = self.state.usage;
        let row: Vec<bool> = match mode {
            MaskMode::Ring => (0..max_ctx).map(|j| j < usage || j == pos).collect(),
            MaskMode::SelfOnly => (0..max_ctx).map(|j| j == pos).collect(),
            MaskMode::SingleKey(k) => {
                if *k >= max_ctx {
                    return Err(Error::InvalidArgument(format!(
                        "single-key column {k} is not a state position (0..{max_ctx})"
                    )));
                }
                (0..max_ctx).map(|j| j == *k || j == pos).collect()
            }
            MaskMode::Custom(maps) => {
                if maps.len() != 1 || maps[0].len() != max_ctx {
                    return Err(Error::InvalidArgument(format!(
                        "a stateful device takes one mask row of {max_ctx} positions shared by all heads ([1,1,q,max_ctx]); per-head masks are not expressible"
                    )));
                }
                maps[0].clone()
            }
        };
        self.stateful_inputs(GroupKind::Tbt, &[token], &[pos], &[row])
    }

    fn stateful_inputs(
        &self,
        group: GroupKind,
        ids: &[u32],
        positions: &[usize],
        rows: &[Vec<bool>],
    ) -> Result<Vec<(String, Buffer)>> {
        self.check_ids(ids)?;
        let g = match group {
            GroupKind::Prefill => &self.prefill,
            GroupKind::Tbt => self
                .tbt
                .as_ref()
                .ok_or_else(|| Error::Device("the stateful device has no 1-row group".into()))?,
        };
        if !self.table.is_float() {
            return Err(Error::Device(
                "a stateful device takes float input embeddings; its embeddings input is not float32".into(),
            ));
        }
        let f = self.features;
        let mut emb = vec![0f32; ids.len() * f];
        for (&id, row) in ids.iter().zip(emb.chunks_exact_mut(f)) {
            self.table.row_f32(id as usize, row)?;
        }
        let mask: Vec<u16> = rows
            .iter()
            .flat_map(|r| r.iter().map(|&a| mask_value(a)))
            .collect();
        let pos_name = g
            .position_ids
            .clone()
            .ok_or_else(|| Error::Device("the stateful device has no position-ids input".into()))?;
        Ok(vec![
            (g.embeddings.name.clone(), Buffer::F32(emb)),
            (
                pos_name,
                Buffer::F32(positions.iter().map(|&p| p as f32).collect()),
            ),
            (g.mask.name.clone(), Buffer::U16(mask)),
        ])
    }

    /// Independent trial rows from the current state, one `run_batch`: each writes its own slot
    /// (the next position, shifted by `position_shift`) and reads the request's context.
    pub(super) fn stateful_trial_batch(
        &mut self,
        dev: &mut dyn Device,
        trials: &[Trial],
    ) -> Result<Vec<RunOutput>> {
        let mut batch = Vec::with_capacity(trials.len());
        for t in trials {
            let pos = self.state.position as i64 + t.position_shift;
            if pos < 0 {
                return Err(Error::InvalidArgument(format!(
                    "trial position {pos} is negative"
                )));
            }
            batch.push(self.stateful_step_inputs(t.token, pos as usize, &t.mode)?);
        }
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        self.saved = None;
        let at = self.state.position;
        run_batch_on(dev, GroupKind::Tbt, &batch, || {
            format!(
                "batch of {} trial decode steps at position {at}",
                batch.len()
            )
        })
    }
}
