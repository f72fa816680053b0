//! What the converted model declares: one graph described as two groups of the same graph
//! (`Prefill` up to `max_query` rows, `Tbt` 1 row) with fp16 states as cache edges.

use kvprobe_reference::ModelConfig;
use kvprobe_schema::{
    CacheDirection, CacheEdgeDescription, CacheKind, DType, DeviceDescription, GroupDescription,
    GroupKind, InputRole, ModelShape, QuantInfo, RuntimeKind,
};

use super::{CAUSAL_MASK, EMBEDDINGS, POSITION_IDS};
use crate::contract::describe::io;

pub(super) fn description(
    name: String,
    cfg: &ModelConfig,
    ctx: usize,
    qmax: usize,
) -> DeviceDescription {
    let entry = cfg.n_kv_heads * cfg.head_dim * 2;
    let edges: Vec<CacheEdgeDescription> = (0..cfg.n_layers)
        .flat_map(|l| {
            [
                (2 * l as u32, CacheKind::K),
                (2 * l as u32 + 1, CacheKind::V),
            ]
            .map(|(id, kind)| CacheEdgeDescription {
                cache_id: id,
                direction: CacheDirection::Input,
                entry_size: entry,
                padded_entry_size: entry,
                length: ctx,
                data_bytes: 2,
                quant: QuantInfo::IDENTITY,
                format: Some("state [kv_heads, max_ctx, head_dim] fp16".into()),
                layer: Some(l),
                kind: Some(kind),
            })
        })
        .collect();
    let group = |kind: GroupKind, rows: usize| GroupDescription {
        name: format!("{name}__q{rows}"),
        kind,
        rows,
        inputs: vec![
            io(
                EMBEDDINGS,
                Some(InputRole::Embeddings),
                [1, rows, cfg.hidden_size],
                DType::F32,
                DType::F16,
            ),
            io(
                POSITION_IDS,
                Some(InputRole::PositionIds),
                [1, 1, rows],
                DType::F32,
                DType::F32,
            ),
            io(
                CAUSAL_MASK,
                Some(InputRole::AttentionMask),
                [1, rows, ctx],
                DType::F16,
                DType::F16,
            ),
        ],
        outputs: vec![io(
            "logits",
            None,
            [1, 1, cfg.vocab_size],
            DType::F32,
            DType::F16,
        )],
        cache_edges: edges.clone(),
        taps: Vec::new(),
    };
    let groups = vec![group(GroupKind::Prefill, qmax), group(GroupKind::Tbt, 1)];
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
    }
}
