//! How the precision-matched reference rounds what crosses a device's declared edges: one
//! [`Round`] per edge, the host edges of one group as [`Edges`] (see `matched`).

use kvprobe_npu::quant::fake_quantize_in_place;
use kvprobe_schema::{
    CacheKind, DType, DeviceDescription, GroupDescription, InputRole, QuantInfo, RuntimeKind,
};

use crate::rings::cache_infos;

/// How one edge rounds a float crossing it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Round {
    Exact,
    Quant(QuantInfo, u32),
    F16,
}

impl Round {
    pub(crate) fn of(dtype: DType, q: QuantInfo) -> Round {
        match dtype {
            DType::F32 => Round::Exact,
            DType::F16 => Round::F16,
            DType::U8 => Round::Quant(q, 8),
            DType::U16 => Round::Quant(q, 16),
        }
    }

    pub(crate) fn apply(&self, xs: &mut [f32]) {
        match self {
            Round::Exact => {}
            Round::Quant(q, bits) => fake_quantize_in_place(xs, q, *bits),
            Round::F16 => xs
                .iter_mut()
                .for_each(|x| *x = half::f16::from_f32(*x).to_f32()),
        }
    }

    pub(crate) fn exact(&self) -> bool {
        *self == Round::Exact
    }
}

/// What one group's host edges round: the embeddings input, the logits output and the four
/// RoPE tables (q cos, q sin, k cos, k sin).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Edges {
    pub(crate) emb: Round,
    pub(crate) logits: Round,
    pub(crate) pe: [Round; 4],
}

impl Edges {
    pub(crate) const FP16: Edges = Edges {
        emb: Round::F16,
        logits: Round::F16,
        pe: [Round::Exact; 4],
    };
    pub(crate) const EXACT: Edges = Edges {
        emb: Round::Exact,
        logits: Round::Exact,
        pe: [Round::Exact; 4],
    };

    pub(crate) fn of(g: &GroupDescription) -> Edges {
        let input = |role: InputRole| {
            g.inputs
                .iter()
                .find(|i| i.role == Some(role))
                .map_or(Round::Exact, |i| Round::of(i.device_dtype, i.quant))
        };
        Edges {
            emb: input(InputRole::Embeddings),
            logits: g
                .outputs
                .first()
                .map_or(Round::Exact, |o| Round::of(o.device_dtype, o.quant)),
            pe: [
                input(InputRole::PeQCos),
                input(InputRole::PeQSin),
                input(InputRole::PeKCos),
                input(InputRole::PeKSin),
            ],
        }
    }

    pub(crate) fn exact(&self) -> bool {
        self.emb.exact() && self.logits.exact() && self.pe.iter().all(Round::exact)
    }
}

/// Per layer, K and V as a host cache stores them: through each cache's declared quant info (the
/// writer's, else the past input's: a host cache declares only what it feeds back), with the
/// rings' element width. A windowed uint8 export (ONNX `--kv-dtype uint8`) declares one scale per
/// layer and K/V, zero point 128, and its later runs read the dequantised codes; a float32 host
/// cache declares the identity, so nothing is rounded. `None` when the caches cannot be mapped to
/// layers.
pub(crate) fn host_cache_kv(desc: &DeviceDescription, n_layers: usize) -> Option<Vec<[Round; 2]>> {
    let mut kv = vec![[Round::Exact; 2]; n_layers];
    for info in &cache_infos(desc).ok()? {
        let q = match info.writer_quant() {
            q if q == QuantInfo::IDENTITY => info.reader_quant(),
            q => q,
        };
        if q != QuantInfo::IDENTITY {
            let slot = kv.get_mut(info.layer)?;
            slot[usize::from(info.kind == CacheKind::V)] =
                Round::Quant(q, 8 * info.elem_bytes.min(2) as u32);
        }
    }
    Some(kv)
}

/// The matched reference computes everything `desc` declares, so a miss against it is the
/// device's own: a host-cache device (ONNX Runtime: f32 arithmetic, the declared weights
/// computed as declared). Not a stateful fp16 device, whose inner fp16 arithmetic is not
/// modelled (see the module doc).
pub fn models_everything(desc: &DeviceDescription) -> bool {
    desc.runtime == RuntimeKind::HostCache
}

/// The matched reference computes a prefill row (a prefix of the prompt from a reset) as `desc`
/// declares it, so the row's miss against it is the device's own: every device but a host cache
/// that declares a quantised cache. A windowed uint8 cache (ONNX `--kv-dtype uint8`) rounds the
/// earlier windows of a prefix longer than W inside its prefill, and the host-cache reference
/// rounds the cache only as it stores it
/// (`host_cache_kv`), not the rows a prefill chunk reads in-graph, which the QDQ graph reads
/// dequantised too: healthy SmolLM2 rows miss f32 by 3.7e-3 there
/// (docs/diagnosis.md, stateful rule 7), a cost nothing here computes.
pub fn computes_prefill(desc: &DeviceDescription) -> bool {
    desc.runtime != RuntimeKind::HostCache
        || desc
            .groups
            .iter()
            .flat_map(|g| &g.cache_edges)
            .all(|e| e.quant == kvprobe_schema::QuantInfo::IDENTITY)
}

pub(crate) fn name(r: &Round) -> String {
    match r {
        Round::Exact => "float32".into(),
        Round::F16 => "fp16".into(),
        Round::Quant(_, bits) => format!("uint{bits} (declared quant info)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_follows_the_declared_edge_type() {
        let q = QuantInfo {
            scale: 0.5,
            zero_point: 128.0,
            min: -64.0,
            max: 63.5,
        };
        let mut x = [0.3f32, 1.0e-4, 70.0];
        Round::of(DType::U8, q).apply(&mut x);
        assert_eq!(x, [0.5, 0.0, 63.5]);
        let mut y = [1.0e-4f32];
        Round::of(DType::F16, q).apply(&mut y);
        // fp16 keeps 11 significant bits: 1e-4 becomes 0.00010001659
        assert!((y[0] - 1.000_165_9e-4).abs() < 1e-10);
        let mut z = [0.123_456_7f32];
        Round::of(DType::F32, q).apply(&mut z);
        assert_eq!(z, [0.123_456_7]);
    }
}
