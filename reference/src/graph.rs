//! The one forward engine: T new rows attending over W cached keys plus themselves under an explicit
//! per-head mask. `Model::forward`, `prefix_state`, `step` and `step_many` all go through here so the
//! KV path and the full path share the same math (design.md "reference crate API").

use candle_core::Tensor;

use crate::kv::LayerKv;

/// What one compiled-graph run computes: T new rows attending over W cached keys + themselves.
#[derive(Debug, Clone)]
pub struct GraphInput {
    /// `[T, hidden]` input embeddings (already dequantised). GPT-2: token embeddings only; the
    /// learned positions are added from `positions`.
    pub hidden: Tensor,
    pub positions: PositionInput,
    /// Per layer `[h, W, head_dim]`, h = n_kv_heads or n_heads (already expanded).
    pub past: Vec<LayerKv>,
    /// `[T, n_heads, W + T]` "may attend"; key columns are the W past keys then the T new ones.
    pub mask: Vec<bool>,
    pub graph: GraphOptions,
    /// Logits for the last row only (genai groups emit one position).
    pub last_only: bool,
}

#[derive(Debug, Clone)]
pub enum PositionInput {
    /// Absolute positions, one per row: RoPE from inv_freq (Llama) or learned positions (GPT-2).
    Ids(Vec<f32>),
    /// Ready cos/sin tables as the genai `pe_*` inputs: q `[T][n_heads][hd]`, k `[T][n_kv][hd]`,
    /// used as `x*cos + rotate_half(x)*sin`. Llama family only.
    Rope {
        q_cos: Vec<f32>,
        q_sin: Vec<f32>,
        k_cos: Vec<f32>,
        k_sin: Vec<f32>,
    },
}

/// Default = correct math; the emulator's graph faults set the other values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GraphOptions {
    /// Multiplier on 1/sqrt(head_dim).
    pub attn_scale: f32,
    /// One softmax over the concatenation of all heads' score rows of a query (Hailo SDK bug F11).
    pub shared_softmax: bool,
    /// KV head for query head q is `q % n_kv` (ABAB) instead of HF repeat_kv `q / n_rep` (AABB).
    pub gqa_block_order: bool,
}

impl Default for GraphOptions {
    fn default() -> Self {
        Self {
            attn_scale: 1.0,
            shared_softmax: false,
            gqa_block_order: false,
        }
    }
}

#[derive(Debug, Clone)]
pub struct GraphOutput {
    /// `[rows, vocab]` row-major.
    pub logits: Vec<f32>,
    pub rows: usize,
    /// Per layer, the new rows' K (after RoPE) and V, `[n_kv, T, hd]`.
    pub new_kv: Vec<LayerKv>,
}
