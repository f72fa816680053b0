//! Pieces of a [`DeviceDescription`](kvprobe_schema::DeviceDescription) the stateful families
//! share.

use kvprobe_schema::{
    CacheDirection, CacheEdgeDescription, CacheKind, DType, GroupDescription, GroupKind, InputRole,
    IoDescription, QuantInfo,
};

/// An unquantised input or output: `host` is what the host sends or reads, `dev` what the graph
/// holds.
pub fn io(
    name: &str,
    role: Option<InputRole>,
    shape: [usize; 3],
    host: DType,
    dev: DType,
) -> IoDescription {
    IoDescription {
        name: name.into(),
        role,
        shape,
        host_dtype: host,
        device_dtype: dev,
        quant: QuantInfo::IDENTITY,
    }
}

/// A stateful graph as the host drives it: embedding rows, their positions and an fp16 mask of
/// `ctx` columns in, the last row's logits out, the same cache edges in every group.
pub struct StatefulGraph<'a> {
    pub model: &'a str,
    pub hidden: usize,
    pub ctx: usize,
    pub vocab: usize,
    /// Input names: embedding rows, position ids, mask.
    pub names: [&'a str; 3],
    /// What the graph holds for the embedding rows and for the logits (the host sends and
    /// reads f32).
    pub embeddings_dtype: DType,
    pub logits_dtype: DType,
    pub edges: &'a [CacheEdgeDescription],
}

impl StatefulGraph<'_> {
    /// The group of `rows` query rows.
    pub fn group(&self, kind: GroupKind, rows: usize) -> GroupDescription {
        let [embeddings, positions, mask] = self.names;
        GroupDescription {
            name: format!("{}__q{rows}", self.model),
            kind,
            rows,
            inputs: vec![
                io(
                    embeddings,
                    Some(InputRole::Embeddings),
                    [1, rows, self.hidden],
                    DType::F32,
                    self.embeddings_dtype,
                ),
                io(
                    positions,
                    Some(InputRole::PositionIds),
                    [1, 1, rows],
                    DType::F32,
                    DType::F32,
                ),
                io(
                    mask,
                    Some(InputRole::AttentionMask),
                    [1, rows, self.ctx],
                    DType::F16,
                    DType::F16,
                ),
            ],
            outputs: vec![io(
                "logits",
                None,
                [1, 1, self.vocab],
                DType::F32,
                self.logits_dtype,
            )],
            cache_edges: self.edges.to_vec(),
            taps: Vec::new(),
        }
    }
}

/// One fp16 input edge per layer's K (id `2l`) and V (id `2l + 1`), `ctx` positions of `entry`
/// bytes, with the quantisation `quant(id)` gives and the storage `format` says.
pub fn state_edges(
    n_layers: usize,
    entry: usize,
    ctx: usize,
    format: &str,
    quant: impl Fn(u32) -> QuantInfo,
) -> Vec<CacheEdgeDescription> {
    (0..n_layers)
        .flat_map(|l| {
            [
                (2 * l as u32, CacheKind::K),
                (2 * l as u32 + 1, CacheKind::V),
            ]
            .map(|(id, kind)| (l, id, kind))
        })
        .map(|(l, id, kind)| CacheEdgeDescription {
            cache_id: id,
            direction: CacheDirection::Input,
            entry_size: entry,
            padded_entry_size: entry,
            length: ctx,
            data_bytes: 2,
            quant: quant(id),
            format: Some(format.to_string()),
            layer: Some(l),
            kind: Some(kind),
        })
        .collect()
}

/// A description of a one-unit model (every size 1, no groups) for the unit tests of what reads
/// only the runtime and the two lengths.
#[cfg(test)]
pub(crate) fn unit_description(
    runtime: kvprobe_schema::RuntimeKind,
    cache_len: usize,
    prefill_len: usize,
) -> kvprobe_schema::DeviceDescription {
    kvprobe_schema::DeviceDescription {
        backend: "t".into(),
        runtime,
        model_name: "m".into(),
        cache_len,
        prefill_len,
        shape: kvprobe_schema::ModelShape {
            vocab_size: 1,
            hidden_size: 1,
            n_layers: 1,
            n_heads: 1,
            n_kv_heads: 1,
            head_dim: 1,
            rope_theta: None,
        },
        groups: Vec::new(),
        weights: Default::default(),
        arithmetic: Default::default(),
    }
}
