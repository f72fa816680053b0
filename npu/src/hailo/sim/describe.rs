//! What the emulated compile declares: its groups, inputs, outputs and cache edges (a real HEF
//! would say the same, so layout faults stay hidden), and which layout and quant info each edge
//! really uses under the faults.

use kvprobe_schema::{
    CacheDirection, CacheEdgeDescription, CacheKind, DType, EdgeLayout, GroupDescription,
    GroupKind, InputRole, IoDescription, Layout, QuantInfo,
};

use super::{cache_id, CacheQuant, Fault, FaultKind, GroupGeom, SimDevice};
use crate::hailo::ring::padded_entry_size;

impl SimDevice {
    pub(super) fn geom(&self, g: GroupKind) -> GroupGeom {
        let (l, p) = (self.desc.cache_len, self.desc.prefill_len);
        match g {
            GroupKind::Prefill => GroupGeom {
                rows: p,
                input_len: l - p,
            },
            GroupKind::Tbt => GroupGeom {
                rows: 1,
                input_len: l - 1,
            },
        }
    }

    pub(super) fn find_fault(
        &self,
        g: GroupKind,
        pred: impl Fn(&FaultKind) -> bool,
    ) -> Option<&Fault> {
        self.faults
            .iter()
            .find(|f| pred(&f.kind) && f.scope.has_group(g))
    }

    pub(super) fn edge_fault(
        &self,
        layer: usize,
        kind: CacheKind,
        pred: impl Fn(&FaultKind) -> bool,
    ) -> Option<&Fault> {
        self.faults
            .iter()
            .find(|f| pred(&f.kind) && f.scope.has_edge(kind, layer))
    }

    /// Layout of one (group, edge, direction); healthy = token-major (contract §7.5).
    pub(super) fn layout_of(
        &self,
        g: GroupKind,
        layer: usize,
        kind: CacheKind,
        dir: CacheDirection,
    ) -> Layout {
        let f = match (g, dir) {
            (GroupKind::Tbt, CacheDirection::Input) => {
                self.edge_fault(layer, kind, |k| matches!(k, FaultKind::TbtReadLayout(_)))
            }
            (GroupKind::Prefill, CacheDirection::Output) => self.edge_fault(layer, kind, |k| {
                matches!(k, FaultKind::PrefillWriteLayout(_))
            }),
            _ => None,
        };
        match f.map(|f| &f.kind) {
            Some(FaultKind::TbtReadLayout(l)) | Some(FaultKind::PrefillWriteLayout(l)) => *l,
            _ => Layout::TokenMajor,
        }
    }

    pub(super) fn layouts(&self) -> Vec<EdgeLayout> {
        let mut v = Vec::new();
        for g in [GroupKind::Prefill, GroupKind::Tbt] {
            for layer in 0..self.desc.shape.n_layers {
                for kind in [CacheKind::K, CacheKind::V] {
                    for dir in [CacheDirection::Input, CacheDirection::Output] {
                        v.push(EdgeLayout {
                            group: g,
                            cache_id: cache_id(layer, kind),
                            direction: if dir == CacheDirection::Input {
                                "input"
                            } else {
                                "output"
                            }
                            .into(),
                            layout: self.layout_of(g, layer, kind, dir),
                        });
                    }
                }
            }
        }
        v
    }

    /// The quant info a reader of (group, edge) dequantises with: the cache_id's, with the
    /// `tbt-cache-scale` factor on tbt inputs (declared so in describe, like a real HEF would).
    pub(super) fn reader_quant(&self, g: GroupKind, layer: usize, kind: CacheKind) -> QuantInfo {
        let mut q = self.quant.cache[cache_id(layer, kind) as usize];
        if g == GroupKind::Tbt {
            if let Some(FaultKind::TbtCacheScale(s)) = self
                .edge_fault(layer, kind, |k| matches!(k, FaultKind::TbtCacheScale(_)))
                .map(|f| &f.kind)
            {
                q.scale *= *s;
                q.min *= *s;
                q.max *= *s;
            }
        }
        q
    }

    pub(super) fn float(&self) -> bool {
        self.opts.cache_quant == CacheQuant::Float
    }

    pub(super) fn describe_group(&self, g: GroupKind) -> GroupDescription {
        let geom = self.geom(g);
        let t = geom.rows;
        let s = &self.desc.shape;
        let name = format!("{}__{}", self.desc.model_name, g.suffix());
        let float = self.float();
        let io = |suffix: &str,
                  role: Option<InputRole>,
                  shape: [usize; 3],
                  host: DType,
                  dev: DType,
                  q: QuantInfo| IoDescription {
            name: format!("{name}/{suffix}"),
            role,
            shape,
            host_dtype: host,
            device_dtype: dev,
            quant: q,
        };
        let emb_t = if float { DType::F32 } else { DType::U16 };
        let mut inputs = vec![
            io(
                "input_layer1",
                Some(InputRole::Embeddings),
                [1, t, s.hidden_size],
                emb_t,
                emb_t,
                self.quant.embeddings,
            ),
            io(
                "input_layer2",
                Some(InputRole::AttentionMask),
                [1, t, s.n_heads * self.desc.cache_len],
                DType::U8,
                DType::U8,
                self.quant.mask,
            ),
        ];
        let pe_dev = if float { DType::F32 } else { DType::U8 };
        if let Some(theta) = &self.theta {
            let d = theta.len();
            // input_layer3..6 in the prior art's order (k_cos, q_cos, k_sin, q_sin); roles say which
            for (sfx, role, heads) in [
                ("input_layer3", InputRole::PeKCos, s.n_kv_heads),
                ("input_layer4", InputRole::PeQCos, s.n_heads),
                ("input_layer5", InputRole::PeKSin, s.n_kv_heads),
                ("input_layer6", InputRole::PeQSin, s.n_heads),
            ] {
                inputs.push(io(
                    sfx,
                    Some(role),
                    [1, t, heads * d],
                    DType::F32,
                    pe_dev,
                    self.quant.pe,
                ));
            }
        } else {
            let pdev = if float { DType::F32 } else { DType::U16 };
            inputs.push(io(
                "input_layer3",
                Some(InputRole::PositionIds),
                [1, t, 1],
                DType::F32,
                pdev,
                self.quant.position_ids,
            ));
        }
        let logit_dev = if float { DType::F32 } else { DType::U16 };
        let outputs = vec![io(
            "logits",
            None,
            [1, 1, s.vocab_size],
            DType::F32,
            logit_dev,
            self.quant.logits,
        )];
        let cache_edges = self.cache_edges(g, geom);
        let taps = if self.opts.taps {
            (0..2 * s.n_layers as u32).collect()
        } else {
            Vec::new()
        };
        GroupDescription {
            name,
            kind: g,
            rows: t,
            inputs,
            outputs,
            cache_edges,
            taps,
        }
    }

    /// Both edges of every cache as group `g` declares them (contract §1.3 windows).
    fn cache_edges(&self, g: GroupKind, geom: GroupGeom) -> Vec<CacheEdgeDescription> {
        let s = &self.desc.shape;
        let entry = self.features * self.elem_bytes;
        let mut cache_edges = Vec::new();
        for layer in 0..s.n_layers {
            for kind in [CacheKind::K, CacheKind::V] {
                for (dir, len) in [
                    (CacheDirection::Input, geom.input_len),
                    (CacheDirection::Output, self.desc.cache_len - geom.input_len),
                ] {
                    let quant = if dir == CacheDirection::Input {
                        self.reader_quant(g, layer, kind)
                    } else {
                        self.quant.cache[cache_id(layer, kind) as usize]
                    };
                    cache_edges.push(CacheEdgeDescription {
                        cache_id: cache_id(layer, kind),
                        direction: dir,
                        entry_size: entry,
                        padded_entry_size: padded_entry_size(entry),
                        length: len,
                        data_bytes: self.elem_bytes,
                        quant,
                        // A real HEF would declare NHWC here whatever the core streams (F9 was
                        // silent): layout faults are not revealed.
                        format: Some("NHWC".into()),
                        layer: Some(layer),
                        kind: Some(kind),
                    });
                }
            }
        }
        cache_edges
    }
}
