//! The capacity faults (issue 20): a device that holds less than it declares and says nothing.
//! `prefill-truncate=N`: the prefill graph takes the newest N of its P window rows; the older
//! rows' keys are unseen and their K/V never reach the rings. `ring-capacity=N`: every ring
//! holds N entries, so slot `s` is stored at `s mod N` and a write lands on all its aliases
//! (what reading an N-entry ring through L-entry descriptors returns).

use kvprobe_schema::GroupKind;

use super::{FaultKind, GroupGeom, SimDevice};
use crate::Result;

impl SimDevice {
    /// Window rows the prefill graph drops (0 without `prefill-truncate`).
    pub(super) fn dropped_rows(&self, g: GroupKind, geom: GroupGeom) -> usize {
        if g != GroupKind::Prefill {
            return 0;
        }
        self.faults
            .iter()
            .find_map(|f| match f.kind {
                FaultKind::PrefillTruncate(n) => Some(geom.rows.saturating_sub(n)),
                _ => None,
            })
            .unwrap_or(0)
    }

    /// Entries every ring really holds (`L` without `ring-capacity`).
    pub(super) fn physical_len(&self) -> usize {
        self.faults
            .iter()
            .find_map(|f| match f.kind {
                FaultKind::RingCapacity(n) => Some(n),
                _ => None,
            })
            .unwrap_or(self.desc.cache_len)
    }

    /// No row sees the first `drop` new columns: those rows do not exist in the compiled graph.
    /// `mask` is `[T, n_heads, W + T]`.
    pub(super) fn block_dropped(&self, mask: &mut [bool], geom: GroupGeom, drop: usize) {
        let cols = geom.input_len + geom.rows;
        for row in mask.chunks_exact_mut(cols) {
            row[geom.input_len..geom.input_len + drop].fill(false);
        }
    }

    /// Puts back the bytes the first `drop` slots of the write window held before the run
    /// (`before`: every ring's bytes then): the dropped rows wrote nothing.
    pub(super) fn restore_dropped(
        &mut self,
        before: &std::collections::BTreeMap<u32, Vec<u8>>,
        geom: GroupGeom,
        drop: usize,
    ) -> Result<()> {
        let start = self.rings.write_start(geom.input_len);
        let l = self.desc.cache_len;
        for (&id, bytes) in before {
            let ring = self.rings.ring_mut(id)?;
            let (e, ep) = (ring.entry_size(), ring.padded_entry_size());
            for i in 0..drop {
                let s = (start + i) % l;
                ring.write_stream(s, &bytes[s * ep..s * ep + e])?;
            }
        }
        Ok(())
    }

    /// Under `ring-capacity=N`: the entries of `stream` just written from slot `start` copied
    /// onto every slot that shares their physical entry, in stream order (the later write wins).
    pub(super) fn alias_written(&mut self, id: u32, start: usize, stream: &[u8]) -> Result<()> {
        let (l, n) = (self.desc.cache_len, self.physical_len());
        if n >= l {
            return Ok(());
        }
        let ring = self.rings.ring_mut(id)?;
        let e = ring.entry_size();
        for (i, entry) in stream.chunks_exact(e).enumerate() {
            let s = (start + i) % l;
            for alias in (s % n..l).step_by(n).filter(|&a| a != s) {
                ring.write_stream(alias, entry)?;
            }
        }
        Ok(())
    }
}
