//! What the converted model declares: one graph described as two groups of the same graph
//! (`Prefill` up to `max_query` rows, `Tbt` 1 row) with fp16 states as cache edges.

use kvprobe_reference::ModelConfig;
use kvprobe_schema::{
    DType, DeclaredArithmetic, DeclaredNorm, DeviceDescription, GroupKind, ModelShape, QuantInfo,
    RuntimeKind,
};

use super::{CAUSAL_MASK, EMBEDDINGS, POSITION_IDS};
use crate::contract::describe::{state_edges, StatefulGraph};

pub(super) fn description(
    name: String,
    cfg: &ModelConfig,
    ctx: usize,
    qmax: usize,
) -> DeviceDescription {
    let entry = cfg.n_kv_heads * cfg.head_dim * 2;
    let edges = state_edges(
        cfg.n_layers,
        entry,
        ctx,
        "state [kv_heads, max_ctx, head_dim] fp16",
        |_| QuantInfo::IDENTITY,
    );
    let graph = StatefulGraph {
        model: &name,
        hidden: cfg.hidden_size,
        ctx,
        vocab: cfg.vocab_size,
        names: [EMBEDDINGS, POSITION_IDS, CAUSAL_MASK],
        embeddings_dtype: DType::F16,
        logits_dtype: DType::F16,
        edges: &edges,
    };
    let groups = vec![
        graph.group(GroupKind::Prefill, qmax),
        graph.group(GroupKind::Tbt, 1),
    ];
    DeviceDescription {
        backend: "ane-emulator".into(),
        runtime: RuntimeKind::Stateful,
        model_name: name,
        cache_len: ctx,
        prefill_len: qmax,
        shape: ModelShape {
            vocab_size: cfg.vocab_size,
            hidden_size: cfg.hidden_size,
            n_layers: cfg.n_layers,
            n_heads: cfg.n_heads,
            n_kv_heads: cfg.n_kv_heads,
            head_dim: cfg.head_dim,
            rope_theta: None,
        },
        groups,
        weights: kvprobe_schema::DeclaredWeights::Checkpoint,
        // what the graph computes (graph.rs): every op on fp16 values, products accumulating
        // wider, the ANE-port norm, fp16 RoPE tables, and candle's f16 reductions summing in
        // fp16 — a row with a massive activation loses the small squares after it
        arithmetic: DeclaredArithmetic::Fp16 {
            saturate_at: None,
            norm: DeclaredNorm::MaxDivided,
            rounded: None,
            norm_reads_f32_sum: false,
            rope_tables_fp16: true,
            fp16_sums: true,
        },
    }
}
