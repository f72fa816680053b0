//! The device contract, modelled on HailoRT's infer model for LLMs (contract §6.3) so the hardware
//! backend stays thin.

use std::collections::BTreeMap;

use kvprobe_schema::{DeviceDescription, DeviceLimit, GroupKind};

use crate::{Buffer, Error, Result};

/// What one run returns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunOutput {
    /// The concatenated float32 outputs: one position's logits (contract §2.8).
    pub logits: Vec<f32>,
    /// Optional debug outputs: what the graph read from each cache, by cache_id, `[in][features]`
    /// row-major (dequantised as the graph sees it).
    pub taps: BTreeMap<u32, Vec<f32>>,
}

/// A device's whole request state between two runs (what `init_cache` and the runs since built),
/// opaque to the host. A host-cache device keeps it in host memory, so a copy restores it exactly
/// ([`crate::SharedRuns`]).
pub struct SavedState {
    state: Box<dyn std::any::Any>,
    /// Its size, for the keeper's memory bound.
    pub bytes: usize,
}

impl SavedState {
    pub fn new<T: 'static>(state: T, bytes: usize) -> SavedState {
        SavedState {
            state: Box::new(state),
            bytes,
        }
    }

    /// The state as the device that saved it wrote it.
    pub fn get<T: 'static>(&self) -> Result<&T> {
        self.state
            .downcast_ref()
            .ok_or_else(|| Error::InvalidArgument("a saved state of another kind of device".into()))
    }
}

/// What a device can do, asked before calling the optional parts of [`Device`]: a caller never
/// branches on which family it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// The KV cache is a ring with a host-moved read offset: [`Device::init_cache`] takes any
    /// offset below `L`, [`Device::update_cache_offset`] moves it, prompts of `L` tokens or more
    /// are refused and generation wraps (HailoRT genai, contract §1.6).
    pub ring_offset: bool,
    /// The KV cache is per-layer state written in-graph at absolute positions: `init_cache(0)`
    /// starts a request, there is no offset to move, and the context ends at `cache_len` (no
    /// wrap). The host sends an additive fp16 mask and position ids (Core ML / ANE).
    pub stateful: bool,
    /// [`RunOutput::taps`] can carry what the graph read from each cache.
    pub taps: bool,
    /// [`Device::cache_buffers`] returns the raw cache bytes.
    pub read_cache: bool,
    /// [`Device::write_cache_buffer`] replaces them.
    pub write_cache: bool,
}

impl Capabilities {
    /// A HailoRT genai ring device without taps (what a device that says nothing is).
    pub const GENAI_RING: Capabilities = Capabilities {
        ring_offset: true,
        stateful: false,
        taps: false,
        read_cache: true,
        write_cache: true,
    };
}

pub trait Device {
    fn describe(&self) -> &DeviceDescription;

    /// What this device can do; the default is a genai ring device without taps.
    fn capabilities(&self) -> Capabilities {
        Capabilities::GENAI_RING
    }

    /// Runtime, firmware and compiled-model versions for the run's provenance (name, value);
    /// a value the device could not read says why. Nothing by default.
    fn versions(&self) -> Vec<(String, String)> {
        Vec::new()
    }

    /// Why this device cannot apply a mask with holes (a self-only or single-key row): it reads
    /// the mask as a length (ONNX Runtime's GroupQueryAttention). The probes that need such a
    /// mask are then `not_applicable` with this reason. None (the default): it applies the mask
    /// per key column.
    fn mask_by_length(&self) -> Option<String> {
        None
    }

    /// What every output of a run on this device must say about it (e.g. "partial NPU" when
    /// part of the graph ran on a CPU fallback): the run's warnings, first. Nothing by default.
    fn warnings(&self) -> Vec<String> {
        Vec::new()
    }

    /// What this device computes that the precision-matched reference does not model, as the
    /// device itself knows it (OpenVINO's plugin at its bf16 / int8-activation defaults): the
    /// controls judged at the declared precision are then judged by their floors only. None (the
    /// default): the description declares everything it computes.
    fn unmodelled_precision(&self) -> Option<String> {
        None
    }

    /// The logits its control computed for the run that returned `logits`: the same graph on
    /// another execution provider with the same feeds, where the device runs one to measure its
    /// own arithmetic (QNN HTP's QDQ kernels against the CPU EP, docs/qnn.md). A measurement of
    /// the device's precision, never its result. None (the default): no control runs.
    fn control_logits(&self, _logits: &[f32]) -> Option<Vec<f32>> {
        None
    }

    /// Device time so far by kind of work (what, seconds) for the run's timings, read after the
    /// probes: e.g. a compile, the prompt windows, the decode steps. Nothing by default.
    fn timings(&self) -> Vec<(String, f64)> {
        Vec::new()
    }

    /// The limits this device declares (prompt rows, cache, context, window, compiled prompt
    /// length) and what its documented runtime does past each (issue 20). The default reads
    /// `prefill_len` and `cache_len` by runtime (`contract::limits::declared`).
    fn limits(&self) -> Vec<DeviceLimit> {
        super::limits::declared(self.describe(), self.capabilities().stateful)
    }

    /// The rules by which this device's host feeds the prompt and the tokens into a windowed
    /// cache, when it declares GenAI's (`decoder.sliding_window`, docs/onnx-genai.md W1–W6): its
    /// window, context, capacity and `pad_token_id`. A diagnosis replays a request under the feed
    /// they give (`onnx::window_feed`). None (the default): the host feeds positions `0..t` and
    /// a causal mask.
    fn host_window(&self) -> Option<crate::onnx::window::WindowGeom> {
        None
    }

    /// One run of a group with named host buffers (the server's formats, contract §2.1). Does not
    /// move the read offset: the caller updates it before (contract §2.3).
    fn run(&mut self, group: GroupKind, inputs: &[(String, Buffer)]) -> Result<RunOutput>;

    /// Several runs of one group at the *current* read offset, one per input set. Rings are
    /// written by every run; for tbt trials the write slot `R − 1` lies outside the next trial's
    /// read window, so the trials are independent. The default loops over [`Device::run`].
    fn run_batch(
        &mut self,
        group: GroupKind,
        batch: &[Vec<(String, Buffer)>],
    ) -> Result<Vec<RunOutput>> {
        batch.iter().map(|inputs| self.run(group, inputs)).collect()
    }

    /// A copy of the request state that [`Device::restore_state`] puts back exactly (a device
    /// whose state is host memory). None (the default): the state lives on the device.
    fn save_state(&self) -> Option<SavedState> {
        None
    }

    /// Back to a state [`Device::save_state`] gave.
    fn restore_state(&mut self, _state: &SavedState) -> Result<()> {
        Err(Error::InvalidArgument(
            "this device keeps its state itself; it cannot restore a saved one".into(),
        ))
    }

    /// From now on (`on`), answer a request whose runs since its reset equal an earlier
    /// request's from that request's outputs and state ([`crate::SharedRuns`]); `false` runs
    /// every request again. Returns whether sharing was on. A plain device never shares.
    fn share_identical_runs(&mut self, _on: bool) -> bool {
        false
    }

    /// `init_cache(read_offset)`: requires `read_offset < L` (contract §1.6).
    fn init_cache(&mut self, read_offset: u32) -> Result<()>;

    /// `update_cache_offset(delta)`: `R ← (R + delta as u32) mod L` (contract §1.6). Only called
    /// on a device with [`Capabilities::ring_offset`].
    fn update_cache_offset(&mut self, delta: i32) -> Result<()>;

    /// `get_cache_buffers()`: `L × Ep` bytes per cache_id (contract §1.8).
    fn cache_buffers(&mut self) -> Result<BTreeMap<u32, Vec<u8>>>;

    /// `update_cache_buffer(cache_id, bytes)`: the whole ring, exactly `L × Ep` bytes (contract §1.8).
    fn write_cache_buffer(&mut self, cache_id: u32, bytes: &[u8]) -> Result<()>;
}
