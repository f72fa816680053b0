//! The driver: the host side of an LLM runtime, always what the real host does, never a fault.
//! It asks the device's [`Capabilities`] which host path runs: the genai ring (`ring.rs`, what the
//! HailoRT genai server does, contract §2) or stateful (`stateful.rs`, what a Core ML host does).
//! Both share the host window of embedding rows and the position counter (contract §2.4).

use kvprobe_schema::{DType, GroupDescription, GroupKind, InputRole, IoDescription};

mod embeddings;
mod ring;
mod stateful;

pub use embeddings::EmbeddingTable;
use embeddings::Window;

use crate::mask::MaskMode;
use crate::quant::quantize_u8;
use crate::{Buffer, Capabilities, Device, Error, Result, RunOutput};

/// Everything the server keeps on the host between runs.
#[derive(Debug, Clone)]
pub struct HostState {
    window: Window,
    /// Position id of each window row (stale/0 for rows never filled).
    window_pos: Vec<u64>,
    /// `U`: cache_usage_size, tokens processed so far.
    usage: usize,
    /// The position counter: absolute position of the next token.
    position: u64,
}

impl HostState {
    pub fn usage(&self) -> usize {
        self.usage
    }
    pub fn position(&self) -> u64 {
        self.position
    }
    /// What a new host process starts with: the server's window matrix is uninitialised on
    /// first use, so we start from raw zeros; nothing processed, position 0.
    fn fresh(window: Window, rows: usize) -> HostState {
        HostState {
            window,
            window_pos: vec![0; rows],
            usage: 0,
            position: 0,
        }
    }
    /// The same state with the position counter moved by `by` (position sweeps: the next token
    /// gets position `position + by`; usage, window and ring are unchanged).
    pub fn with_position_offset(mut self, by: i64) -> HostState {
        self.position = (self.position as i64 + by).max(0) as u64;
        self
    }
}

/// Input names per role of one group.
#[derive(Debug, Clone)]
struct GroupInputs {
    rows: usize,
    embeddings: IoDescription,
    mask: IoDescription,
    pe: Option<[String; 4]>, // q_cos, q_sin, k_cos, k_sin
    position_ids: Option<String>,
}

fn find_role(g: &GroupDescription, role: InputRole) -> Option<&IoDescription> {
    g.inputs.iter().find(|i| i.role == Some(role))
}

impl GroupInputs {
    fn new(g: &GroupDescription) -> Result<GroupInputs> {
        let need = |role: InputRole, what: &str| {
            find_role(g, role).cloned().ok_or_else(|| {
                Error::Device(format!(
                    "group `{}` has no {what} input; the genai server needs one (contract §3.1)",
                    g.name
                ))
            })
        };
        let embeddings = need(InputRole::Embeddings, "embeddings")?;
        let mask = need(InputRole::AttentionMask, "attention mask")?;
        let pe_roles = [
            InputRole::PeQCos,
            InputRole::PeQSin,
            InputRole::PeKCos,
            InputRole::PeKSin,
        ];
        let pe = if pe_roles.iter().all(|&r| find_role(g, r).is_some()) {
            Some(pe_roles.map(|r| find_role(g, r).map(|i| i.name.clone()).unwrap_or_default()))
        } else {
            None
        };
        let position_ids = find_role(g, InputRole::PositionIds).map(|i| i.name.clone());
        if pe.is_none() && position_ids.is_none() {
            return Err(Error::Device(format!(
                "group `{}` has neither the four pe_* RoPE inputs nor a position-ids input",
                g.name
            )));
        }
        Ok(GroupInputs {
            rows: g.rows,
            embeddings,
            mask,
            pe,
            position_ids,
        })
    }
}

/// The genai server's host side, device-independent.
pub struct Driver {
    /// Which host path runs (ring or stateful).
    caps: Capabilities,
    cache_len: usize,
    prefill_len: usize,
    n_heads: usize,
    n_kv_heads: usize,
    /// RoPE theta vector of length D (contract §2.6), `None` for learned positions.
    theta: Option<Vec<f32>>,
    m1: u8,
    features: usize,
    table: EmbeddingTable,
    prefill: GroupInputs,
    tbt: Option<GroupInputs>,
    state: HostState,
    saved: Option<HostState>,
    mask_buf: Vec<u8>,
}

/// RoPE theta vector in the HF rotate_half convention: `[inv_freq, inv_freq]`.
pub fn theta_from_inv_freq(inv_freq: &[f32]) -> Vec<f32> {
    inv_freq.iter().chain(inv_freq.iter()).copied().collect()
}

impl Driver {
    /// The host side for `dev`, reading embedding rows from `table`.
    pub fn new(dev: &dyn Device, table: EmbeddingTable) -> Result<Driver> {
        let desc = dev.describe();
        let pg = desc.group(GroupKind::Prefill).ok_or_else(|| {
            Error::Device(format!("device `{}` has no prefill group", desc.model_name))
        })?;
        let prefill = GroupInputs::new(pg)?;
        let tbt = desc
            .group(GroupKind::Tbt)
            .map(GroupInputs::new)
            .transpose()?;
        let (l, p) = (desc.cache_len, desc.prefill_len);
        if p == 0 || p >= l {
            return Err(Error::Geometry(format!(
                "prefill rows P = {p} must be at least 1 and below the cache length L = {l}"
            )));
        }
        if prefill.rows != p {
            return Err(Error::Device(format!(
                "prefill group has {} rows but the device says P = {p}",
                prefill.rows
            )));
        }
        // contract §2.1: F = features of the prefill embeddings input; M1 = q(1.0) through the
        // prefill mask input's quant info, reused for tbt.
        let features = prefill.embeddings.shape[2];
        if table.features != features {
            return Err(Error::InvalidArgument(format!(
                "embedding table has {} features, the prefill embeddings input has {features}",
                table.features
            )));
        }
        let want_float = prefill.embeddings.host_dtype == DType::F32;
        if table.is_float() != want_float {
            return Err(Error::InvalidArgument(
                "embedding table type does not match the embeddings input (uint16 codes vs float rows); build it with EmbeddingTable::from_float against this device".into(),
            ));
        }
        let m1 = quantize_u8(1.0, &prefill.mask.quant);
        let window = if want_float {
            Window::F32(vec![0.0; p * features])
        } else {
            Window::U16(vec![0; p * features])
        };
        Ok(Driver {
            caps: dev.capabilities(),
            cache_len: l,
            prefill_len: p,
            n_heads: desc.shape.n_heads,
            n_kv_heads: desc.shape.n_kv_heads,
            theta: desc.shape.rope_theta.clone(),
            m1,
            features,
            table,
            prefill,
            tbt,
            state: HostState::fresh(window, p),
            saved: None,
            mask_buf: Vec::new(),
        })
    }

    /// The RoPE theta table the driver turns into cos/sin (contract §2.6).
    pub fn rope_theta(&self) -> Option<&[f32]> {
        self.theta.as_deref()
    }

    /// Drive with another theta table (same length) from now on; returns the previous one. A
    /// probe uses it to ask whether the graph was compiled for another table than it ships.
    pub fn replace_rope_theta(&mut self, theta: Vec<f32>) -> Result<Vec<f32>> {
        match &mut self.theta {
            Some(t) if t.len() == theta.len() => Ok(std::mem::replace(t, theta)),
            Some(t) => Err(Error::InvalidArgument(format!(
                "theta table of {} values for a device with D = {}",
                theta.len(),
                t.len()
            ))),
            None => Err(Error::InvalidArgument(
                "the device takes position ids, not a RoPE theta table".into(),
            )),
        }
    }

    /// The device's capabilities the host path was chosen by.
    pub fn capabilities(&self) -> Capabilities {
        self.caps
    }
    pub fn cache_len(&self) -> usize {
        self.cache_len
    }
    pub fn prefill_len(&self) -> usize {
        self.prefill_len
    }
    /// `U`: tokens processed since the last reset (grows past `L`, contract §2.9).
    pub fn usage(&self) -> usize {
        self.state.usage
    }
    /// The genai server's "context full" flag of each read reply: `U ≥ L` (contract §2.9); from
    /// here on a ring slides over the newest `L` tokens.
    pub fn context_full(&self) -> bool {
        self.state.usage >= self.cache_len
    }
    /// Absolute position the next token gets.
    pub fn position(&self) -> u64 {
        self.state.position
    }
    /// Position ids of the host window rows, oldest first.
    pub fn window_positions(&self) -> &[u64] {
        &self.state.window_pos
    }
    /// The allowed mask value (contract §2.1).
    pub fn m1(&self) -> u8 {
        self.m1
    }
    pub fn host_state(&self) -> HostState {
        self.state.clone()
    }
    pub fn set_host_state(&mut self, s: HostState) {
        self.state = s;
    }
    /// The host state of a new host process (a fresh window of raw zeros, position 0): what a
    /// reset does not give back (contract §2.10 keeps the window), so a request started from it
    /// is the one a fresh `kvprobe` process makes.
    pub fn fresh_host_state(&self) -> HostState {
        HostState::fresh(self.state.window.zeroed(), self.prefill_len)
    }

    /// Reset as the server's "clear context": `init_cache(0)`, `U = 0`, position counter 0. The host
    /// window and the ring bytes are NOT cleared (contract §2.10).
    pub fn reset(&mut self, dev: &mut dyn Device) -> Result<()> {
        // a runtime failing to clear its state is the device's answer to this step
        dev.init_cache(0)
            .map_err(|e| e.by_device(&dev.describe().backend, "state reset before a request"))?;
        self.state.usage = 0;
        self.state.position = 0;
        self.saved = None;
        Ok(())
    }

    /// Prefill a prompt: remainder chunk first, then full chunks (contract §2.3). Returns the last
    /// chunk's output (one position's logits). A prompt of `L` tokens or more is refused.
    pub fn prefill(&mut self, dev: &mut dyn Device, ids: &[u32]) -> Result<RunOutput> {
        if ids.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        if self.caps.stateful {
            return self.stateful_prefill(dev, ids);
        }
        self.ring_prefill(dev, ids)
    }

    /// One tbt step with the token `token` (the server's path for every later read, contract §2.2).
    /// `mode` other than `Ring` is a probe's alternative mask. Saves the host state so
    /// [`Driver::step_back`] can undo it.
    pub fn step(&mut self, dev: &mut dyn Device, token: u32, mode: &MaskMode) -> Result<RunOutput> {
        self.check_ids(&[token])?;
        if self.caps.stateful {
            return self.stateful_step(dev, token, mode);
        }
        self.ring_step(dev, token, mode)
    }

    /// Undo the last [`Driver::step`]: `update_cache_offset(−1)` and the host state before it. The
    /// ring slot the step wrote keeps its bytes (it lies outside the next step's read window).
    pub fn step_back(&mut self, dev: &mut dyn Device) -> Result<()> {
        let saved = self
            .saved
            .take()
            .ok_or_else(|| Error::InvalidArgument("step_back without a preceding step".into()))?;
        // Both ring paths (tbt, or a 1-token prefill chunk) advanced R by exactly one; a stateful
        // device has no offset (the slot the step wrote is rewritten by the next step).
        if self.caps.ring_offset {
            dev.update_cache_offset(-1).map_err(|e| {
                e.by_device(
                    &dev.describe().backend,
                    "step back (update_cache_offset(-1))",
                )
            })?;
        }
        self.state = saved;
        Ok(())
    }

    /// A step that leaves the driver and the read offset as they were (for trial masks).
    pub fn trial_step(
        &mut self,
        dev: &mut dyn Device,
        token: u32,
        mode: &MaskMode,
    ) -> Result<RunOutput> {
        let out = self.step(dev, token, mode)?;
        self.step_back(dev)?;
        Ok(out)
    }

    /// Greedy generation as the server does with `do_sample = false`: prefill, then one tbt step per
    /// further token; the last token is not fed (contract §2.2). Returns `n_new` tokens.
    pub fn generate_greedy(
        &mut self,
        dev: &mut dyn Device,
        ids: &[u32],
        n_new: usize,
    ) -> Result<Vec<u32>> {
        let mut toks = Vec::with_capacity(n_new);
        if n_new == 0 {
            return Ok(toks);
        }
        let out = self.prefill(dev, ids)?;
        toks.push(argmax(&out.logits));
        while toks.len() < n_new {
            let last = *toks.last().unwrap_or(&0);
            let out = self.step(dev, last, &MaskMode::Ring)?;
            toks.push(argmax(&out.logits));
        }
        Ok(toks)
    }

    fn check_ids(&self, ids: &[u32]) -> Result<()> {
        if let Some(&bad) = ids.iter().find(|&&t| t as usize >= self.table.rows) {
            return Err(Error::InvalidArgument(format!(
                "token id {bad} is outside the embedding table of {} rows",
                self.table.rows
            )));
        }
        Ok(())
    }

    /// Drop the oldest `n` window rows, append the new ones, `U += n`, positions advance
    /// (contract §2.4).
    fn push_tokens(&mut self, ids: &[u32]) -> Result<()> {
        let n = ids.len().min(self.prefill_len);
        let ids = &ids[ids.len() - n..];
        let f = self.features;
        let p = self.prefill_len;
        // Driver::new checks that table and window have the same element type.
        match &mut self.state.window {
            Window::U16(w) => {
                w.copy_within(n * f.., 0);
                for (i, &id) in ids.iter().enumerate() {
                    let dst = (p - n + i) * f;
                    self.table.row_u16(id as usize, &mut w[dst..dst + f])?;
                }
            }
            Window::F32(w) => {
                w.copy_within(n * f.., 0);
                for (i, &id) in ids.iter().enumerate() {
                    let dst = (p - n + i) * f;
                    self.table.row_f32(id as usize, &mut w[dst..dst + f])?;
                }
            }
        }
        self.state.window_pos.copy_within(n.., 0);
        for i in 0..n {
            self.state.window_pos[p - n + i] = self.state.position + i as u64;
        }
        self.state.position += n as u64;
        self.state.usage += n;
        Ok(())
    }

    fn embeddings_rows(&self, first_row: usize) -> Buffer {
        let f = self.features;
        match &self.state.window {
            Window::U16(w) => Buffer::U16(w[first_row * f..].to_vec()),
            Window::F32(w) => Buffer::F32(w[first_row * f..].to_vec()),
        }
    }

    /// RoPE or position-id inputs for rows at `positions` (contract §2.6: cos/sin of θ·pos in
    /// float32 as the server computes them, q `[T][NH][D]`, k `[T][NKV][D]`).
    fn position_inputs(
        &self,
        g: &GroupInputs,
        positions: &[u64],
        out: &mut Vec<(String, Buffer)>,
    ) -> Result<()> {
        if let (Some(names), Some(theta)) = (&g.pe, &self.theta) {
            let d = theta.len();
            let t = positions.len();
            let mut qc = Vec::with_capacity(t * self.n_heads * d);
            let mut qs = Vec::with_capacity(t * self.n_heads * d);
            let mut kc = Vec::with_capacity(t * self.n_kv_heads * d);
            let mut ks = Vec::with_capacity(t * self.n_kv_heads * d);
            let mut cos = vec![0f32; d];
            let mut sin = vec![0f32; d];
            for &pos in positions {
                crate::rope::cos_sin_row(theta, pos, &mut cos, &mut sin);
                for _ in 0..self.n_heads {
                    qc.extend_from_slice(&cos);
                    qs.extend_from_slice(&sin);
                }
                for _ in 0..self.n_kv_heads {
                    kc.extend_from_slice(&cos);
                    ks.extend_from_slice(&sin);
                }
            }
            out.push((names[0].clone(), Buffer::F32(qc)));
            out.push((names[1].clone(), Buffer::F32(qs)));
            out.push((names[2].clone(), Buffer::F32(kc)));
            out.push((names[3].clone(), Buffer::F32(ks)));
            Ok(())
        } else if let Some(name) = &g.position_ids {
            out.push((
                name.clone(),
                Buffer::F32(positions.iter().map(|&p| p as f32).collect()),
            ));
            Ok(())
        } else {
            Err(Error::Device(
                "the device has pe_* inputs but no RoPE theta vector; it cannot be driven".into(),
            ))
        }
    }

    /// Several independent trial steps from the current state, in one [`Device::run_batch`]:
    /// each trial is what [`Driver::trial_step`] would run after
    /// `set_host_state(host_state().with_position_offset(trial.position_shift))`, and the driver
    /// and the read offset are left as they were. A device that batches (the emulator) serves all
    /// trials with one pass over the weights; others loop. Without a tbt group the trials run
    /// one by one as 1-token prefill chunks (ring mask only).
    pub fn trial_batch(
        &mut self,
        dev: &mut dyn Device,
        trials: &[Trial],
    ) -> Result<Vec<RunOutput>> {
        for t in trials {
            self.check_ids(&[t.token])?;
        }
        if self.caps.stateful {
            return self.stateful_trial_batch(dev, trials);
        }
        self.ring_trial_batch(dev, trials)
    }

    /// [`Driver::trial_batch`] of one token under several masks (colmap's single keys, maskconv's
    /// conventions): equal to calling [`Driver::trial_step`] once per mode.
    pub fn trial_steps(
        &mut self,
        dev: &mut dyn Device,
        token: u32,
        modes: &[MaskMode],
    ) -> Result<Vec<RunOutput>> {
        let trials: Vec<Trial> = modes
            .iter()
            .map(|m| Trial {
                token,
                mode: m.clone(),
                position_shift: 0,
            })
            .collect();
        self.trial_batch(dev, &trials)
    }
}

/// One trial of [`Driver::trial_batch`].
#[derive(Debug, Clone, PartialEq)]
pub struct Trial {
    pub token: u32,
    pub mode: MaskMode,
    /// Moves the trial's position from the driver's next position (position sweeps).
    pub position_shift: i64,
}

/// First maximal index (the server's argmax, contract §2.8); NaN never wins.
/// One run the host built inside the device's description: whatever the device answers (a
/// refusal, an error mid-run, logits of another size than declared) is its behaviour, typed
/// [`Error::ByDevice`] with the step named.
fn run_on(
    dev: &mut dyn Device,
    group: GroupKind,
    inputs: &[(String, Buffer)],
    step: impl FnOnce() -> String,
) -> Result<RunOutput> {
    let out = dev.run(group, inputs).and_then(|o| declared_logits(dev, o));
    out.map_err(|e| e.by_device(&dev.describe().backend, step()))
}

/// [`run_on`] for a batch of trial rows.
fn run_batch_on(
    dev: &mut dyn Device,
    group: GroupKind,
    batch: &[Vec<(String, Buffer)>],
    step: impl FnOnce() -> String,
) -> Result<Vec<RunOutput>> {
    let outs = dev.run_batch(group, batch).and_then(|outs| {
        if outs.len() != batch.len() {
            return Err(Error::Device(format!(
                "it answered {} rows for a batch of {}",
                outs.len(),
                batch.len()
            )));
        }
        outs.into_iter().map(|o| declared_logits(dev, o)).collect()
    });
    outs.map_err(|e| e.by_device(&dev.describe().backend, step()))
}

/// A run returns one position's logits, `vocab_size` of them (contract §2.8).
fn declared_logits(dev: &dyn Device, o: RunOutput) -> Result<RunOutput> {
    let vocab = dev.describe().shape.vocab_size;
    if o.logits.len() != vocab {
        return Err(Error::Device(format!(
            "it returned {} logits where its description declares one position of {vocab}",
            o.logits.len()
        )));
    }
    Ok(o)
}

/// [`Device::update_cache_offset`] as part of a step: a refusal is the device's.
fn move_offset(dev: &mut dyn Device, delta: i32, step: impl FnOnce() -> String) -> Result<()> {
    dev.update_cache_offset(delta)
        .map_err(|e| e.by_device(&dev.describe().backend, step()))
}

pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut bv = f32::NEG_INFINITY;
    for (i, &x) in v.iter().enumerate() {
        if x > bv {
            bv = x;
            best = i;
        }
    }
    best as u32
}
