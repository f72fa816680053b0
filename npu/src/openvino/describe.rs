//! The [`DeviceDescription`] an OpenVINO IR presents to the generic driver: one prefill group
//! (the whole prompt in one run, as openvino.genai feeds it: `ctx − 1` rows on CPU/GPU, NPUW's
//! maximum prompt on NPU), one tbt group, embedding rows in (the device turns them back into
//! `input_ids`), and one cache edge per layer's K and V for the variables the runtime keeps.

use kvprobe_schema::{DType, DeviceDescription, GroupKind, ModelShape, QuantInfo, RuntimeKind};

use super::FAMILY;
use crate::contract::describe::{state_edges, StatefulGraph};

pub const ROWS: &str = "input_ids (as embedding rows)";
pub const POSITIONS: &str = "position_ids";
pub const MASK: &str = "attention_mask (as fp16 rows)";

/// What the description needs besides the model's shape.
pub struct Geometry {
    pub ctx: usize,
    pub prefill: usize,
    /// `true`: NPUW's static pipeline keeps the K/V in fp16 (its default KV-cache storage type),
    /// `false`: the CPU plugin keeps them in f32 (an f32 IR at f32 inference precision).
    pub kv_fp16: bool,
    pub format: String,
}

#[cfg_attr(not(feature = "openvino"), allow(dead_code))]
pub fn description(name: String, shape: ModelShape, g: &Geometry) -> DeviceDescription {
    let entry = shape.n_kv_heads * shape.head_dim * 2;
    let edges = state_edges(shape.n_layers, entry, g.ctx, &g.format, |_| {
        QuantInfo::IDENTITY
    });
    let graph = StatefulGraph {
        model: &name,
        hidden: shape.hidden_size,
        ctx: g.ctx,
        vocab: shape.vocab_size,
        names: [ROWS, POSITIONS, MASK],
        embeddings_dtype: DType::F32,
        logits_dtype: DType::F32,
        edges: &edges,
    };
    let groups = vec![
        graph.group(GroupKind::Prefill, g.prefill),
        graph.group(GroupKind::Tbt, 1),
    ];
    DeviceDescription {
        backend: FAMILY.name.into(),
        // NPUW rounds the cache to fp16 (the stateful fp16 precision model); the CPU plugin's
        // f32 variables are an f32 host-side cache as the matched reference models it
        runtime: if g.kv_fp16 {
            RuntimeKind::Stateful
        } else {
            RuntimeKind::HostCache
        },
        model_name: name,
        cache_len: g.ctx,
        prefill_len: g.prefill,
        shape,
        groups,
        weights: kvprobe_schema::DeclaredWeights::Checkpoint,
        arithmetic: kvprobe_schema::DeclaredArithmetic::Float32,
    }
}
