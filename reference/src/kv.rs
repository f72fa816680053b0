//! Cached keys/values and which of them a step may read.

use candle_core::Tensor;

/// Which entries of a [`KvState`] a single-token step attends to (besides itself, always).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySet {
    /// Every entry of the state.
    All,
    /// These indices into the state's entries (not absolute positions).
    Subset(Vec<usize>),
    /// The last `w` entries of the state (a sliding window; the step's own key comes on top).
    Window(usize),
    /// No cached entry: the token attends to itself only.
    None,
}

/// One layer's keys and values, `[heads, n, head_dim]`, K after RoPE.
#[derive(Debug, Clone)]
pub struct LayerKv {
    pub k: Tensor,
    pub v: Tensor,
}

/// Keys/values of a prefix, per layer `[n_kv_heads, n, head_dim]`, with the positions and ids they
/// were computed at.
#[derive(Debug, Clone)]
pub struct KvState {
    pub layers: Vec<LayerKv>,
    pub positions: Vec<usize>,
    pub ids: Vec<u32>,
}

impl KvState {
    pub fn len(&self) -> usize {
        self.positions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.positions.is_empty()
    }
}
