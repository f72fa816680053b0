//! The host-side store of convention (b): the padded sequence's K/V entries in the cache's
//! storage type, the past tensors of a run cut from it (GenAI's right-aligned window, K
//! transposed), the presents appended back, and the stateful contract's fp16 view of it. The
//! faults `win-write-left`, `win-k-layout` and `win-u16-runner` act here (faults.rs).

#![cfg_attr(not(feature = "onnx"), allow(dead_code))]

use super::faults::HostFault;
use super::window::{Elems, WindowState};
use crate::{Error, Result};

/// Zero point of the uint8 cache (the exporter's; also GenAI's `pad_value`, so an unwritten
/// slot reads as 0).
pub const ZERO_POINT: f32 = 128.0;

#[derive(Clone)]
pub struct WindowCache {
    pub u8: bool,
    /// Per cache id (2l K, 2l+1 V): the uint8 scale (1 for float32).
    pub scales: Vec<f32>,
    /// Per cache id: entries `[s][h][d]` of the padded sequence.
    pub entries: Vec<Elems>,
    heads: usize,
    hd: usize,
}

impl WindowCache {
    pub fn new(caches: usize, heads: usize, hd: usize, u8: bool, scales: Vec<f32>) -> Self {
        let empty = if u8 {
            Elems::U8(Vec::new())
        } else {
            Elems::F32(Vec::new())
        };
        WindowCache {
            u8,
            scales,
            entries: vec![empty; caches],
            heads,
            hd,
        }
    }

    fn entry_len(&self) -> usize {
        self.heads * self.hd
    }

    /// Entries kept.
    pub fn len(&self) -> usize {
        match self.entries.first() {
            Some(Elems::F32(v)) => v.len() / self.entry_len(),
            Some(Elems::U8(v)) => v.len() / self.entry_len(),
            None => 0,
        }
    }

    pub fn truncate(&mut self, n: usize) {
        let e = n * self.entry_len();
        for c in &mut self.entries {
            match c {
                Elems::F32(v) => v.truncate(e),
                Elems::U8(v) => v.truncate(e),
            }
        }
    }

    /// The past input of cache `c` for a run whose first new token is padded index `first`
    /// (K `[H, 1, D, P]`, V `[H, 1, P, D]`), unwritten slots `pad`.
    pub fn past(&self, st: &WindowState, c: usize, first: usize, p: usize, pad: u8) -> Elems {
        let (h, d) = (self.heads, self.hd);
        let key = c.is_multiple_of(2);
        let k_layout = key && st.faults.contains(&HostFault::KLayout);
        let index = |hh: usize, slot: usize, dd: usize| {
            if key && !k_layout {
                (hh * d + dd) * p + slot
            } else {
                // V, and K under win-k-layout (the runner copies it as [H, 1, T, D])
                (hh * p + slot) * d + dd
            }
        };
        let lo = first.saturating_sub(p);
        let mut out = match &self.entries[c] {
            Elems::F32(_) => Elems::F32(vec![f32::from(pad); h * p * d]),
            Elems::U8(_) => Elems::U8(vec![pad; h * p * d]),
        };
        for s in lo..first.min(self.len()) {
            let Some(slot) = st.slot(s, first, p) else {
                continue;
            };
            for hh in 0..h {
                for dd in 0..d {
                    let src = (s * h + hh) * d + dd;
                    let dst = index(hh, slot, dd);
                    match (&mut out, &self.entries[c]) {
                        (Elems::F32(o), Elems::F32(e)) => o[dst] = e[src],
                        (Elems::U8(o), Elems::U8(e)) => o[dst] = e[src],
                        _ => {}
                    }
                }
            }
        }
        if let (Elems::U8(o), true) = (&mut out, st.faults.contains(&HostFault::U16Runner)) {
            // the runner writes uint16 elements (the value, then a zero byte) into the uint8
            // buffer: the graph reads the first half of them, interleaved with zeros
            let wide: Vec<u8> = o.iter().flat_map(|&b| [b, 0]).collect();
            let n = o.len();
            o.copy_from_slice(&wide[..n]);
        }
        out
    }

    /// Appends the `q` entries of a present (K `[H, 1, D, q]`, V `[H, 1, q, D]`) to cache `c`.
    pub fn append(&mut self, st: &WindowState, c: usize, present: Elems, q: usize) -> Result<()> {
        let (h, d) = (self.heads, self.hd);
        let key = c.is_multiple_of(2);
        let transposed = key && !st.faults.contains(&HostFault::KLayout);
        let src = |t: usize, hh: usize, dd: usize| {
            if transposed {
                (hh * d + dd) * q + t
            } else {
                (hh * q + t) * d + dd
            }
        };
        let n = h * q * d;
        match (&mut self.entries[c], present) {
            (Elems::F32(e), Elems::F32(p)) if p.len() == n => {
                for t in 0..q {
                    for hh in 0..h {
                        for dd in 0..d {
                            e.push(p[src(t, hh, dd)]);
                        }
                    }
                }
            }
            (Elems::U8(e), Elems::U8(p)) if p.len() == n => {
                for t in 0..q {
                    for hh in 0..h {
                        for dd in 0..d {
                            e.push(p[src(t, hh, dd)]);
                        }
                    }
                }
            }
            _ => {
                return Err(Error::Device(format!(
                    "present of cache {c}: not {h}×{q}×{d} values of the cache's type"
                )))
            }
        }
        Ok(())
    }

    fn value(&self, c: usize, e: &Elems, i: usize) -> f32 {
        match e {
            Elems::F32(v) => v[i],
            Elems::U8(v) => (f32::from(v[i]) - ZERO_POINT) * self.scales[c],
        }
    }

    /// The stateful contract's fp16 `[H, ctx, D]` view of cache `c`: the past the next token
    /// run would get, read through the documented layout (right-aligned, K `[H, 1, D, P]`), so a
    /// runner that writes elsewhere shows it. Real position p is padded index p + npad.
    pub fn view(&self, st: &WindowState, c: usize, ctx: usize, pad: u8) -> Vec<u8> {
        let (h, d) = (self.heads, self.hd);
        let p = st.geom.context - 1;
        let first = st.seq.len().min(self.len());
        let t = self.past(st, c, first, p, pad);
        let mut out = vec![0u8; h * ctx * d * 2];
        for pos in 0..st.real_len().min(ctx) {
            let s = pos + st.npad;
            if s >= first || first - s > p {
                continue;
            }
            let slot = p - (first - s);
            for hh in 0..h {
                for dd in 0..d {
                    let i = if c.is_multiple_of(2) {
                        (hh * d + dd) * p + slot
                    } else {
                        (hh * p + slot) * d + dd
                    };
                    let x = half::f16::from_f32(self.value(c, &t, i));
                    let o = ((hh * ctx + pos) * d + dd) * 2;
                    out[o..o + 2].copy_from_slice(&x.to_le_bytes());
                }
            }
        }
        out
    }

    /// Writes the fp16 `[H, ctx, D]` view into the entries of the request's real positions.
    pub fn write(&mut self, st: &WindowState, c: usize, ctx: usize, bytes: &[u8]) {
        let (h, d) = (self.heads, self.hd);
        let scale = self.scales[c];
        let n = self.len();
        for pos in 0..st.real_len().min(ctx) {
            let s = pos + st.npad;
            if s >= n {
                break;
            }
            for hh in 0..h {
                for dd in 0..d {
                    let o = ((hh * ctx + pos) * d + dd) * 2;
                    let x = half::f16::from_le_bytes([bytes[o], bytes[o + 1]]).to_f32();
                    let i = (s * h + hh) * d + dd;
                    match &mut self.entries[c] {
                        Elems::F32(e) => e[i] = x,
                        Elems::U8(e) => {
                            e[i] = (x / scale + ZERO_POINT).round().clamp(0.0, 255.0) as u8
                        }
                    }
                }
            }
        }
    }
}
