//! The graphs' cache edges: reading a window from the rings and writing new rows, through the
//! edge's layout and quantisation and the cache faults (kv-swap, truncation, reader scale).

use std::collections::BTreeMap;

use candle_core::{Device as CDevice, Tensor};
use kvprobe_reference::LayerKv;
use kvprobe_schema::{CacheDirection, CacheKind, GroupKind};

use super::{cache_id, other, CacheQuant, Fault, FaultKind, GroupGeom, SimDevice, Taps};
use crate::layout::{self, StreamShape};
use crate::quant::{self, dequantize};
use crate::Result;

impl SimDevice {
    /// Read one cache edge's window as the graph sees it: `[in][features]` floats into `out`.
    pub(super) fn read_edge(
        &mut self,
        g: GroupKind,
        layer: usize,
        kind: CacheKind,
        n_in: usize,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let swap = g == GroupKind::Tbt
            && self
                .edge_fault(layer, kind, |k| *k == FaultKind::KvSwap)
                .is_some();
        let phys = cache_id(layer, if swap { other(kind) } else { kind });
        let mut stream = std::mem::take(&mut self.stream);
        let mut block = std::mem::take(&mut self.block);
        self.rings.read_window(phys, n_in, &mut stream)?;
        let shape = StreamShape {
            tokens: n_in,
            features: self.features,
            elem_bytes: self.elem_bytes,
            head_dim: self.head_dim,
        };
        let lay = self.layout_of(g, layer, kind, CacheDirection::Input);
        layout::decode(lay, shape, &stream, &mut block);
        let q = self.reader_quant(g, layer, kind);
        out.clear();
        match self.opts.cache_quant {
            CacheQuant::U8 => out.extend(block.iter().map(|&c| dequantize(c as f32, &q))),
            CacheQuant::U16 => out.extend(
                block
                    .chunks_exact(2)
                    .map(|c| dequantize(u16::from_le_bytes([c[0], c[1]]) as f32, &q)),
            ),
            // float edges: the declared scale still multiplies (the scale fault declares F)
            CacheQuant::Float => out.extend(
                block
                    .chunks_exact(4)
                    .map(|c| dequantize(f32::from_le_bytes([c[0], c[1], c[2], c[3]]), &q)),
            ),
        }
        self.stream = stream;
        self.block = block;
        Ok(())
    }

    /// Write one cache edge's new rows (`[T][features]` floats) through the writer's quant and layout.
    pub(super) fn write_edge(
        &mut self,
        g: GroupKind,
        layer: usize,
        kind: CacheKind,
        n_in: usize,
        rows: &[f32],
    ) -> Result<()> {
        let swap = g == GroupKind::Tbt
            && self
                .edge_fault(layer, kind, |k| *k == FaultKind::KvSwap)
                .is_some();
        let phys = cache_id(layer, if swap { other(kind) } else { kind });
        let q = self.quant.cache[cache_id(layer, kind) as usize];
        let mut block = std::mem::take(&mut self.block);
        let mut stream = std::mem::take(&mut self.stream);
        block.clear();
        match self.opts.cache_quant {
            CacheQuant::U8 => block.extend(rows.iter().map(|&x| quant::quantize_u8(x, &q))),
            CacheQuant::U16 => {
                for &x in rows {
                    block.extend_from_slice(&quant::quantize_u16(x, &q).to_le_bytes());
                }
            }
            CacheQuant::Float => {
                for &x in rows {
                    block.extend_from_slice(&x.to_le_bytes());
                }
            }
        }
        let tokens = rows.len() / self.features;
        let shape = StreamShape {
            tokens,
            features: self.features,
            elem_bytes: self.elem_bytes,
            head_dim: self.head_dim,
        };
        let lay = self.layout_of(g, layer, kind, CacheDirection::Output);
        layout::encode(lay, shape, &block, &mut stream);
        let trunc = self.faults.iter().find(|f| {
            matches!(f.kind, FaultKind::TruncateEntry(_))
                && f.scope.has_group(g)
                && f.scope.has_edge(kind, layer)
        });
        if let Some(Fault {
            kind: FaultKind::TruncateEntry(n),
            ..
        }) = trunc
        {
            let e = shape.entry_bytes();
            for entry in stream.chunks_exact_mut(e) {
                entry[*n..].fill(0);
            }
        }
        if self
            .faults
            .iter()
            .any(|f| f.kind == FaultKind::RingWriteRace)
        {
            self.race_low_bits(&mut stream);
        }
        let start = self.rings.write_start(n_in);
        let res = self
            .rings
            .write_window(phys, n_in, &stream)
            .and_then(|()| self.alias_written(phys, start, &stream));
        self.block = block;
        self.stream = stream;
        res
    }

    /// `ring-write-race`: the lowest bit of every element (little-endian: its first byte) from
    /// the device's race generator, 64 elements per draw.
    fn race_low_bits(&mut self, stream: &mut [u8]) {
        let mut bits = 0u64;
        for (i, e) in stream.chunks_exact_mut(self.elem_bytes).enumerate() {
            if i % 64 == 0 {
                bits = crate::race::splitmix64(&mut self.race);
            }
            e[0] = (e[0] & !1) | ((bits >> (i % 64)) & 1) as u8;
        }
    }

    /// `[n_kv, T, hd]` → `[T][features]`, expanded with HF repeat_kv (query head q uses KV head
    /// q / n_rep) when the cache holds expanded heads.
    pub(super) fn entries_from_heads(&self, t: &Tensor) -> Result<Vec<f32>> {
        let (h, rows, hd) = t.dims3()?;
        let v: Vec<f32> = t.flatten_all()?.to_vec1()?;
        let heads = self.features / hd;
        let rep = heads / h;
        let mut out = Vec::with_capacity(rows * self.features);
        for r in 0..rows {
            for qh in 0..heads {
                let kh = qh / rep;
                let o = (kh * rows + r) * hd;
                out.extend_from_slice(&v[o..o + hd]);
            }
        }
        Ok(out)
    }

    /// `[n][features]` entries → a `[h, n, hd]` tensor, transposed in one pass into the
    /// tensor's own buffer.
    pub(super) fn heads_tensor(&self, floats: &[f32], n: usize) -> Result<Tensor> {
        let hd = self.desc.shape.head_dim;
        let h = self.features / hd;
        let mut heads = Vec::with_capacity(h * n * hd);
        for head in 0..h {
            for entry in floats.chunks_exact(self.features).take(n) {
                heads.extend_from_slice(&entry[head * hd..(head + 1) * hd]);
            }
        }
        Ok(Tensor::from_vec(heads, (h, n, hd), &CDevice::Cpu)?)
    }

    /// All layers' past read up front: read and write windows are disjoint (contract §1.5).
    pub(super) fn read_past(
        &mut self,
        g: GroupKind,
        geom: GroupGeom,
    ) -> Result<(Vec<LayerKv>, Taps)> {
        let n_layers = self.desc.shape.n_layers;
        let mut past = Vec::with_capacity(n_layers);
        let mut taps = BTreeMap::new();
        // one window's floats at a time in a buffer the device keeps: a window of an 8192-entry
        // ring is megabytes, and fresh ones per edge per run cost a page fault per 4 KiB
        let mut floats = std::mem::take(&mut self.floats);
        for layer in 0..n_layers {
            let mut heads = |kind: CacheKind| -> Result<Tensor> {
                self.read_edge(g, layer, kind, geom.input_len, &mut floats)?;
                if self.opts.taps {
                    taps.insert(cache_id(layer, kind), floats.clone());
                }
                self.heads_tensor(&floats, geom.input_len)
            };
            let k = heads(CacheKind::K)?;
            let v = heads(CacheKind::V)?;
            past.push(LayerKv { k, v });
        }
        self.floats = floats;
        Ok((past, taps))
    }

    /// Write every layer's new K/V rows through the writers.
    pub(super) fn write_new(
        &mut self,
        g: GroupKind,
        geom: GroupGeom,
        new_kv: &[LayerKv],
    ) -> Result<()> {
        for (layer, kv) in new_kv.iter().enumerate() {
            let k = self.entries_from_heads(&kv.k)?;
            let v = self.entries_from_heads(&kv.v)?;
            self.write_edge(g, layer, CacheKind::K, geom.input_len, &k)?;
            self.write_edge(g, layer, CacheKind::V, geom.input_len, &v)?;
        }
        Ok(())
    }
}
