//! Cache edges as the probes need them: which cache_id is which layer's K or V, the declared
//! quant info of each side, and the byte coding of ring entries (contract §1.2, §4).

use kvprobe_npu::quant::{dequantize, quantize_u16, quantize_u8};
use kvprobe_reference::KvState;
use kvprobe_schema::{CacheDirection, CacheKind, DeviceDescription, GroupKind, QuantInfo};

use crate::{Error, Result};

/// One cache_id, both groups' edges.
#[derive(Debug, Clone)]
pub struct CacheInfo {
    pub cache_id: u32,
    pub layer: usize,
    pub kind: CacheKind,
    /// True when the device said which layer and K/V this is; false = inferred from cache_id order.
    pub role_declared: bool,
    /// `E` bytes per entry as streamed.
    pub entry_size: usize,
    /// `Ep` slot stride.
    pub padded_entry_size: usize,
    pub elem_bytes: usize,
    /// Elements per entry (`E / b`).
    pub features: usize,
    /// Entries hold GQA-expanded K/V (`n_heads × hd`) instead of `n_kv_heads × hd`.
    pub expanded: bool,
    pub prefill_in: Option<QuantInfo>,
    pub prefill_out: Option<QuantInfo>,
    pub tbt_in: Option<QuantInfo>,
    pub tbt_out: Option<QuantInfo>,
    /// Entries the prefill writer streams per run (its window length `N`).
    pub prefill_out_len: usize,
}

impl CacheInfo {
    /// The quant info a reader of this ring dequantises with (tbt input, else prefill input).
    pub fn reader_quant(&self) -> QuantInfo {
        self.tbt_in
            .or(self.prefill_in)
            .unwrap_or(QuantInfo::IDENTITY)
    }
    /// The quant info the prefill writer quantised with.
    pub fn writer_quant(&self) -> QuantInfo {
        self.prefill_out
            .or(self.tbt_out)
            .unwrap_or(QuantInfo::IDENTITY)
    }
}

/// All cache_ids of the device, sorted by id. Roles come from the description; a device that
/// does not declare them gets layer `i / 2`, K for even `i`, V for odd (the order of the
/// emulator and of Hailo's compiled LLM graphs, K before V per layer).
pub fn cache_infos(desc: &DeviceDescription) -> Result<Vec<CacheInfo>> {
    let mut ids: Vec<u32> = desc
        .groups
        .iter()
        .flat_map(|g| g.cache_edges.iter().map(|e| e.cache_id))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    let s = &desc.shape;
    let mut out = Vec::with_capacity(ids.len());
    for (i, &id) in ids.iter().enumerate() {
        let edges: Vec<_> = desc
            .groups
            .iter()
            .flat_map(|g| {
                g.cache_edges
                    .iter()
                    .filter(move |e| e.cache_id == id)
                    .map(move |e| (g.kind, e))
            })
            .collect();
        let first = edges[0].1;
        let q = |k: GroupKind, d: CacheDirection| {
            edges
                .iter()
                .find(|(g, e)| *g == k && e.direction == d)
                .map(|(_, e)| e.quant)
        };
        let declared = edges.iter().find_map(|(_, e)| e.layer.zip(e.kind));
        let (layer, kind) = declared.unwrap_or((
            i / 2,
            if i % 2 == 0 {
                CacheKind::K
            } else {
                CacheKind::V
            },
        ));
        let elem_bytes = first.data_bytes.max(1);
        let features = first.entry_size / elem_bytes;
        let expanded = features == s.n_heads * s.head_dim && s.n_heads != s.n_kv_heads;
        if !expanded && features != s.n_kv_heads * s.head_dim {
            return Err(Error::Device(format!(
                "cache {id} has {features} elements per entry; expected {} (KV heads × head dim) or {} (expanded)",
                s.n_kv_heads * s.head_dim,
                s.n_heads * s.head_dim
            )));
        }
        let prefill_out_len = edges
            .iter()
            .find(|(g, e)| *g == GroupKind::Prefill && e.direction == CacheDirection::Output)
            .map(|(_, e)| e.length)
            .unwrap_or(desc.prefill_len);
        out.push(CacheInfo {
            cache_id: id,
            layer,
            kind,
            role_declared: declared.is_some(),
            entry_size: first.entry_size,
            padded_entry_size: first.padded_entry_size,
            elem_bytes,
            features,
            expanded,
            prefill_in: q(GroupKind::Prefill, CacheDirection::Input),
            prefill_out: q(GroupKind::Prefill, CacheDirection::Output),
            tbt_in: q(GroupKind::Tbt, CacheDirection::Input),
            tbt_out: q(GroupKind::Tbt, CacheDirection::Output),
            prefill_out_len,
        });
    }
    if out.is_empty() {
        return Err(Error::Device("the device declares no cache edges".into()));
    }
    Ok(out)
}

/// Element codes of an entry's bytes (uint8, or little-endian uint16).
pub fn codes(bytes: &[u8], elem_bytes: usize, out: &mut Vec<f32>) {
    out.clear();
    if elem_bytes == 2 {
        out.extend(
            bytes
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]) as f32),
        );
    } else {
        out.extend(bytes.iter().map(|&b| b as f32));
    }
}

/// Dequantised values of an entry.
pub fn dequantize_entry(bytes: &[u8], elem_bytes: usize, q: &QuantInfo, out: &mut Vec<f32>) {
    codes(bytes, elem_bytes, out);
    for x in out.iter_mut() {
        *x = dequantize(*x, q);
    }
}

/// Quantise values into entry bytes with HailoRT's input quantisation (contract §4).
pub fn quantize_entry(values: &[f32], elem_bytes: usize, q: &QuantInfo, out: &mut Vec<u8>) {
    out.clear();
    if elem_bytes == 2 {
        for &v in values {
            out.extend_from_slice(&quantize_u16(v, q).to_le_bytes());
        }
    } else {
        out.extend(values.iter().map(|&v| quantize_u8(v, q)));
    }
}

/// The reference K or V of one layer, token-major `[n][features]` as a cache entry holds it
/// (`[kv_head][hd]`, or HF repeat_kv order `AABB` when the cache is expanded).
pub fn reference_entries(state: &KvState, info: &CacheInfo, n_heads: usize) -> Result<Vec<f32>> {
    let l = &state.layers[info.layer];
    let t = match info.kind {
        CacheKind::K => &l.k,
        CacheKind::V => &l.v,
    };
    let (h, n, d) = t.dims3()?;
    let flat: Vec<f32> = t.flatten_all()?.to_vec1()?;
    let rep = if info.expanded { n_heads / h } else { 1 };
    let mut out = Vec::with_capacity(n * h * rep * d);
    for p in 0..n {
        for head in 0..h {
            for _ in 0..rep {
                let o = (head * n + p) * d;
                out.extend_from_slice(&flat[o..o + d]);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_coding_round_trip_u16_le() {
        let q = QuantInfo {
            scale: 0.5,
            zero_point: 100.0,
            min: -50.0,
            max: 1000.0,
        };
        let mut b = Vec::new();
        quantize_entry(&[0.0, 1.0, 200.0], 2, &q, &mut b);
        // codes 100, 102, 500 little-endian
        assert_eq!(b, vec![100, 0, 102, 0, 0xF4, 0x01]);
        let mut v = Vec::new();
        dequantize_entry(&b, 2, &q, &mut v);
        assert_eq!(v, vec![0.0, 1.0, 200.0]);
    }
}
