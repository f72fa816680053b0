//! The KV-cache ring of HailoRT (contract §1): one backing buffer of `L × Ep` bytes per cache_id,
//! shared by every group, and one device-wide read offset `R`.

use std::collections::BTreeMap;

use crate::{Error, Result};

/// HailoRT's default scatter-gather page (contract §1.2: `DEFAULT_SG_PAGE_SIZE` = 512; the
/// Hailo-10H `desc_max_page_size` is not visible, we assume it does not lower this).
pub const DEFAULT_PAGE_SIZE: usize = 512;

/// `page = min(nextpow2(E, ≥ 64), default_page)` (contract §1.2).
pub fn page_size(entry_size: usize) -> usize {
    let mut p = 64usize;
    while p < entry_size {
        p *= 2;
    }
    p.min(DEFAULT_PAGE_SIZE)
}

/// `Ep = align_up(E, page)` (contract §1.2).
pub fn padded_entry_size(entry_size: usize) -> usize {
    let page = page_size(entry_size);
    entry_size.div_ceil(page) * page
}

/// One window of a ring as at most two runs of consecutive slots (contract §1.5: each side is
/// programmed in at most two chunks, start slot → end of buffer, then from slot 0).
pub fn window_chunks(start: usize, count: usize, len: usize) -> [(usize, usize); 2] {
    let start = start % len;
    let first = count.min(len - start);
    [(start, first), (0, count - first)]
}

/// The bytes of one cache_id.
#[derive(Debug, Clone)]
pub struct CacheRing {
    entry_size: usize,
    padded_entry_size: usize,
    len: usize,
    bytes: Vec<u8>,
}

impl CacheRing {
    /// Zero-initialised, as the emulator's rings are (the real initial contents are not visible,
    /// contract §8).
    pub fn new(entry_size: usize, len: usize) -> Result<CacheRing> {
        if entry_size == 0 || len == 0 {
            return Err(Error::Geometry(format!(
                "a cache needs entries of at least one byte and at least one slot (got E = {entry_size}, L = {len})"
            )));
        }
        let ep = padded_entry_size(entry_size);
        if ep > 65535 {
            // contract §1.3: Ep ≤ 65535
            return Err(Error::Geometry(format!(
                "padded entry size {ep} exceeds HailoRT's 65535 bytes; use a smaller entry"
            )));
        }
        Ok(CacheRing {
            entry_size,
            padded_entry_size: ep,
            len,
            bytes: vec![0; ep * len],
        })
    }

    pub fn entry_size(&self) -> usize {
        self.entry_size
    }
    pub fn padded_entry_size(&self) -> usize {
        self.padded_entry_size
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The first `E` bytes of slot `s` (the slack `Ep − E` is never streamed, contract §1.5).
    pub fn slot(&self, s: usize) -> &[u8] {
        let o = (s % self.len) * self.padded_entry_size;
        &self.bytes[o..o + self.entry_size]
    }

    /// The read stream: `count` entries from slot `start` (entry 0 = slot `start`), concatenated.
    pub fn read_stream(&self, start: usize, count: usize, out: &mut Vec<u8>) {
        out.clear();
        out.reserve(count * self.entry_size);
        for (s, n) in window_chunks(start, count, self.len) {
            for i in 0..n {
                out.extend_from_slice(self.slot(s + i));
            }
        }
    }

    /// The write stream: chopped into `E`-byte entries stored at consecutive slots from `start`.
    /// Slack bytes stay as they were.
    pub fn write_stream(&mut self, start: usize, stream: &[u8]) -> Result<()> {
        if !stream.len().is_multiple_of(self.entry_size) {
            return Err(Error::InvalidArgument(format!(
                "cache write of {} bytes is not a whole number of {}-byte entries",
                stream.len(),
                self.entry_size
            )));
        }
        let count = stream.len() / self.entry_size;
        if count > self.len {
            return Err(Error::InvalidArgument(format!(
                "cache write of {count} entries exceeds the ring of {} entries",
                self.len
            )));
        }
        let mut k = 0;
        for (s, n) in window_chunks(start, count, self.len) {
            for i in 0..n {
                let o = (s + i) * self.padded_entry_size;
                let src = &stream[k * self.entry_size..(k + 1) * self.entry_size];
                self.bytes[o..o + self.entry_size].copy_from_slice(src);
                k += 1;
            }
        }
        Ok(())
    }

    /// `update_cache_buffer`: the size must be exactly `L × Ep` (contract §1.8).
    pub fn replace(&mut self, bytes: &[u8]) -> Result<()> {
        if bytes.len() != self.bytes.len() {
            return Err(Error::InvalidArgument(format!(
                "cache buffer of {} bytes given, the ring holds L × Ep = {} × {} = {} bytes",
                bytes.len(),
                self.len,
                self.padded_entry_size,
                self.bytes.len()
            )));
        }
        self.bytes.copy_from_slice(bytes);
        Ok(())
    }
}

/// The read offset arithmetic of contract §1.6: the delta is converted to u32, added mod 2^32,
/// then reduced mod `L`. A negative delta is right only when `R ≥ |delta|` or `L` divides 2^32.
pub fn apply_offset_delta(read_offset: u32, delta: i32, len: usize) -> u32 {
    (read_offset.wrapping_add(delta as u32)) % len as u32
}

/// All rings of a device plus the device-wide read offset (contract §1.4, §1.9).
#[derive(Debug, Clone)]
pub struct RingSet {
    len: usize,
    read_offset: u32,
    rings: BTreeMap<u32, CacheRing>,
}

impl RingSet {
    pub fn new(len: usize) -> Result<RingSet> {
        if len < 2 {
            return Err(Error::Geometry(format!(
                "cache length {len}: HailoRT needs 0 < in, out < L, so L ≥ 2"
            )));
        }
        if len > u32::MAX as usize {
            return Err(Error::Geometry(format!("cache length {len} exceeds u32")));
        }
        Ok(RingSet {
            len,
            read_offset: 0,
            rings: BTreeMap::new(),
        })
    }

    pub fn add(&mut self, cache_id: u32, entry_size: usize) -> Result<()> {
        if self.rings.contains_key(&cache_id) {
            return Err(Error::Geometry(format!(
                "cache_id {cache_id} registered twice"
            )));
        }
        self.rings
            .insert(cache_id, CacheRing::new(entry_size, self.len)?);
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.rings.is_empty()
    }
    pub fn read_offset(&self) -> u32 {
        self.read_offset
    }
    pub fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.rings.keys().copied()
    }

    pub fn ring(&self, cache_id: u32) -> Result<&CacheRing> {
        self.rings
            .get(&cache_id)
            .ok_or_else(|| Error::InvalidArgument(format!("no cache with cache_id {cache_id}")))
    }
    pub fn ring_mut(&mut self, cache_id: u32) -> Result<&mut CacheRing> {
        self.rings
            .get_mut(&cache_id)
            .ok_or_else(|| Error::InvalidArgument(format!("no cache with cache_id {cache_id}")))
    }

    /// `init_cache(r)`: requires `r < L` (contract §1.6).
    pub fn init_cache(&mut self, read_offset: u32) -> Result<()> {
        if read_offset as usize >= self.len {
            return Err(Error::InvalidArgument(format!(
                "init_cache({read_offset}) needs a read offset below the cache length {}",
                self.len
            )));
        }
        self.read_offset = read_offset;
        Ok(())
    }

    /// `update_cache_offset(delta)` with the u32 wrap of contract §1.6.
    pub fn update_cache_offset(&mut self, delta: i32) {
        self.read_offset = apply_offset_delta(self.read_offset, delta, self.len);
    }

    /// Slot of read-window entry 0 (contract §1.5).
    pub fn read_start(&self) -> usize {
        self.read_offset as usize
    }

    /// Slot of write-window entry 0 for a group reading `input_len` entries: `R + in` (contract §1.5).
    pub fn write_start(&self, input_len: usize) -> usize {
        (self.read_offset as usize + input_len) % self.len
    }

    /// Read window of `input_len` entries of one cache (entry 0 = slot R).
    pub fn read_window(&self, cache_id: u32, input_len: usize, out: &mut Vec<u8>) -> Result<()> {
        let start = self.read_start();
        self.ring(cache_id)?.read_stream(start, input_len, out);
        Ok(())
    }

    /// Write window of one cache for a group with `input_len` read entries: from slot `R + in`.
    pub fn write_window(&mut self, cache_id: u32, input_len: usize, stream: &[u8]) -> Result<()> {
        let start = self.write_start(input_len);
        self.ring_mut(cache_id)?.write_stream(start, stream)
    }

    /// `get_cache_buffers()`: every ring's whole `L × Ep` bytes (contract §1.8).
    pub fn buffers(&self) -> BTreeMap<u32, Vec<u8>> {
        self.rings
            .iter()
            .map(|(&id, r)| (id, r.bytes().to_vec()))
            .collect()
    }

    /// `update_cache_buffer(id, bytes)` (contract §1.8).
    pub fn write_buffer(&mut self, cache_id: u32, bytes: &[u8]) -> Result<()> {
        self.ring_mut(cache_id)?.replace(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padded_entry_table_of_contract_1_2() {
        for (e, ep) in [
            (48, 64),
            (96, 128),
            (256, 256),
            (272, 512),
            (640, 1024),
            (1536, 1536),
        ] {
            assert_eq!(padded_entry_size(e), ep, "E = {e}");
        }
    }

    #[test]
    fn u32_wrap_of_negative_deltas() {
        // L = 24 does not divide 2^32: from R = 0, −1 gives (2^32 − 1) mod 24 = 15, not 23.
        assert_eq!(apply_offset_delta(0, -1, 24), 15);
        // R ≥ |delta| is right.
        assert_eq!(apply_offset_delta(5, -1, 24), 4);
        // L = 16 divides 2^32: wrap is right.
        assert_eq!(apply_offset_delta(0, -1, 16), 15);
        assert_eq!(apply_offset_delta(20, 7, 24), 3);
    }

    #[test]
    fn init_cache_needs_offset_below_len() {
        let mut r = RingSet::new(8).unwrap();
        assert!(r.init_cache(8).is_err());
        r.init_cache(7).unwrap();
        assert_eq!(r.read_offset(), 7);
    }

    #[test]
    fn windows_wrap_in_two_chunks_and_slack_is_untouched() {
        let mut rs = RingSet::new(5).unwrap();
        rs.add(0, 3).unwrap(); // Ep = 64
        rs.init_cache(3).unwrap();
        // a group with in = 3, out = 2: writes slots 1, 2; reads 3, 4, 0
        rs.write_window(0, 3, &[1, 1, 1, 2, 2, 2]).unwrap();
        let ring = rs.ring(0).unwrap();
        assert_eq!(ring.slot(1), &[1, 1, 1]);
        assert_eq!(ring.slot(2), &[2, 2, 2]);
        assert!(ring.bytes()[64 + 3..128].iter().all(|&b| b == 0));
        // a write window that wraps: R = 4, in = 0 impossible, so use in = 3 → start 2
        rs.init_cache(4).unwrap();
        rs.write_window(0, 3, &[7, 7, 7, 8, 8, 8]).unwrap(); // slots 2, 3
        rs.init_cache(1).unwrap();
        let mut s = Vec::new();
        rs.read_window(0, 4, &mut s).unwrap(); // slots 1,2,3,4
        assert_eq!(s, vec![1, 1, 1, 7, 7, 7, 8, 8, 8, 0, 0, 0]);
        rs.init_cache(3).unwrap();
        rs.read_window(0, 4, &mut s).unwrap(); // slots 3,4,0,1 (wrap)
        assert_eq!(s, vec![8, 8, 8, 0, 0, 0, 0, 0, 0, 1, 1, 1]);
    }

    #[test]
    fn buffer_round_trip_and_size_check() {
        let mut rs = RingSet::new(4).unwrap();
        rs.add(3, 10).unwrap();
        let bytes: Vec<u8> = (0..4 * 64).map(|i| (i % 251) as u8).collect();
        rs.write_buffer(3, &bytes).unwrap();
        assert_eq!(rs.buffers()[&3], bytes);
        assert!(rs.write_buffer(3, &bytes[1..]).is_err());
        assert!(rs.write_buffer(9, &bytes).is_err());
    }
}
