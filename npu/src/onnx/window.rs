//! Convention (b), the NPU-style windowed cache of ONNX Runtime GenAI (`decoder.sliding_window`,
//! docs/onnx-genai.md "Host rules (convention (b))", contract doc §3, sources G:wkv, G:ids, G:pos,
//! G:gen): what `Generator` builds for every run of a batch-1 request, as pure functions and one
//! state machine, unit-tested without ONNX Runtime.
//!
//! The cache is kept as the padded sequence of entries (one `[H, D]` entry per token, pads
//! included, in the cache's storage type); the tensors of a run are cut from it. That gives the
//! bytes GenAI's slide and transition copies give (W1–W4 in the docs) without copying the whole
//! cache every run, and a step back is a truncation. The faults of this family (`faults.rs`) are
//! applied where the host side builds the run.

use super::faults::HostFault;
use crate::{Error, Result};

/// A run's cache tensor or a sequence of entries, in the cache's storage type.
#[derive(Debug, Clone, PartialEq)]
pub enum Elems {
    F32(Vec<f32>),
    U8(Vec<u8>),
}

impl Elems {
    pub fn bytes(&self) -> usize {
        match self {
            Elems::F32(v) => 4 * v.len(),
            Elems::U8(v) => v.len(),
        }
    }
}

/// `decoder.sliding_window` and the shape of the model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WindowGeom {
    /// W: prompt chunk (window) length.
    pub window: usize,
    /// C: `model.context_length`, the slots every run attends over.
    pub context: usize,
    /// L: `search.max_length`, GenAI's capacity (pads count).
    pub max_length: usize,
    pub pad_value: u8,
    pub pad_token: u32,
    pub heads: usize,
    pub head_dim: usize,
}

/// GenAI's bookkeeping of the inputs (G:pos `WindowedPositionInputs`), kept literally.
#[derive(Debug, Clone, PartialEq)]
struct Inputs {
    /// `[1, C]` attention mask.
    mask: Vec<i32>,
    /// `attention_mask_backward_offset_`: the slot left of the run of ones.
    off: usize,
    /// The last position id fed.
    last_pos: i64,
}

/// One session run, as the host side built it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunPlan {
    pub ids: Vec<u32>,
    pub positions: Vec<i64>,
    pub mask: Vec<i32>,
    /// Length of the past inputs (C − W for a prompt chunk, C − 1 for a token).
    pub past_len: usize,
    /// Padded-sequence index of the run's first token.
    pub first: usize,
}

/// The request state: the padded sequence and GenAI's input bookkeeping.
#[derive(Debug, Clone)]
pub struct WindowState {
    pub geom: WindowGeom,
    /// Padded sequence of token ids (pads first, G:gen right alignment).
    pub seq: Vec<u32>,
    /// Leading pads of the prompt.
    pub npad: usize,
    /// Real prompt tokens (the prompt phase ends after it).
    pub prompt_len: usize,
    inputs: Inputs,
    /// Snapshots of `inputs` after each token run, by real length, for a step back.
    snaps: Vec<(usize, Inputs)>,
    pub faults: Vec<HostFault>,
}

impl WindowState {
    pub fn new(geom: WindowGeom, faults: Vec<HostFault>) -> WindowState {
        WindowState {
            geom,
            seq: Vec::new(),
            npad: 0,
            prompt_len: 0,
            inputs: Inputs {
                mask: vec![0; geom.context],
                off: 0,
                last_pos: -1,
            },
            snaps: Vec::new(),
            faults,
        }
    }

    fn has(&self, f: HostFault) -> bool {
        self.faults.contains(&f)
    }

    /// Real tokens of the request.
    pub fn real_len(&self) -> usize {
        self.seq.len() - self.npad
    }

    /// The runs of a prompt (the request must be empty): padded with `pad_token` to a multiple
    /// of W, pads first (W1), chunk 0's positions and mask by value (W2), later chunks
    /// continuing (W3). The healthy host refuses a padded prompt past L (W6).
    pub fn prompt(&mut self, ids: &[u32]) -> Result<Vec<RunPlan>> {
        let g = self.geom;
        let (w, c) = (g.window, g.context);
        let padded = ids.len().div_ceil(w) * w;
        if padded > g.max_length && !self.has(HostFault::CapacitySilent) {
            return Err(Error::ContextTooLong {
                tokens: padded,
                max_ctx: g.max_length,
            });
        }
        self.npad = padded - ids.len();
        self.prompt_len = ids.len();
        self.seq = vec![g.pad_token; self.npad];
        self.seq.extend_from_slice(ids);
        let mut plans: Vec<RunPlan> = Vec::with_capacity(padded / w);
        for k in 0..padded / w {
            let chunk = self.seq[k * w..(k + 1) * w].to_vec();
            let positions: Vec<i64> = if k == 0 {
                // G:pos: a pad-valued token gets position 0 and mask 0, the others count up
                let mut j = 0;
                chunk
                    .iter()
                    .map(|&t| {
                        if t == g.pad_token {
                            0
                        } else {
                            j += 1;
                            j - 1
                        }
                    })
                    .collect()
            } else {
                (1..=w as i64).map(|i| self.inputs.last_pos + i).collect()
            };
            if k == 0 {
                let m = &mut self.inputs.mask;
                m.iter_mut().for_each(|x| *x = 0);
                for (i, &t) in chunk.iter().enumerate() {
                    m[c - w + i] = i32::from(t != g.pad_token);
                }
                let first_one = (0..w).find(|&i| m[c - w + i] == 1).unwrap_or(w);
                self.inputs.off = (c - w + first_one).saturating_sub(1);
            } else {
                let lo = (self.inputs.off + 1).saturating_sub(w);
                for x in &mut self.inputs.mask[lo..=self.inputs.off] {
                    *x = 1;
                }
                self.inputs.off = self.inputs.off.saturating_sub(w);
            }
            self.inputs.last_pos = *positions.last().unwrap_or(&-1);
            plans.push(RunPlan {
                ids: chunk,
                positions,
                mask: self.run_mask((k + 1) * w),
                past_len: c - w,
                first: k * w,
            });
        }
        self.snaps = vec![(self.real_len(), self.inputs.clone())];
        Ok(plans)
    }

    /// One generated token (W4): position last + 1, one more mask slot. The healthy host refuses
    /// a token past L (GenAI stops there, W6).
    pub fn token(&mut self, id: u32) -> Result<RunPlan> {
        let g = self.geom;
        if self.seq.len() + 1 > g.max_length && !self.has(HostFault::CapacitySilent) {
            return Err(Error::ContextFull {
                max_ctx: g.max_length - self.npad,
            });
        }
        let first = self.seq.len();
        self.seq.push(id);
        // win-position-stall: the counter is not advanced when the window slides (every token
        // run slides it by one), so every token gets the last prompt position again
        if !self.has(HostFault::PositionStall) {
            self.inputs.last_pos += 1;
        }
        let off = self.inputs.off;
        self.inputs.mask[off] = 1;
        self.inputs.off = off.saturating_sub(1);
        self.snaps.push((self.real_len(), self.inputs.clone()));
        Ok(RunPlan {
            ids: vec![id],
            positions: vec![self.inputs.last_pos],
            mask: self.run_mask(first + 1),
            past_len: g.context - 1,
            first,
        })
    }

    /// The mask fed to the graph: GenAI's, or under `win-mask-all-valid` every slot that holds an
    /// entry of the request (pads included).
    /// `end`: padded index one past the run's last token.
    fn run_mask(&self, end: usize) -> Vec<i32> {
        if !self.has(HostFault::MaskAllValid) {
            return self.inputs.mask.clone();
        }
        // slot i holds the entry at padded index end - C + i (right-aligned)
        let c = self.geom.context;
        (0..c).map(|i| i32::from(end + i >= c)).collect()
    }

    /// Back to `real` real tokens (the driver stepped back). Within the generated tokens GenAI's
    /// bookkeeping is restored from the snapshot; `None` when `real` is inside the prompt (the
    /// caller replays the shorter prompt).
    pub fn rewind(&mut self, real: usize) -> Option<()> {
        let i = self.snaps.iter().rposition(|(n, _)| *n == real)?;
        self.inputs = self.snaps[i].1.clone();
        self.snaps.truncate(i + 1);
        self.seq.truncate(self.npad + real);
        Some(())
    }

    /// Slot of the past inputs that padded index `s` occupies in a run whose first new token is at
    /// `first` (right-aligned: the newest at the highest slot, W5), or `None` when it fell off or
    /// is not written yet. `win-write-left` puts them at the wrong (left) end.
    pub fn slot(&self, s: usize, first: usize, past_len: usize) -> Option<usize> {
        if s >= first || first - s > past_len {
            return None;
        }
        if self.has(HostFault::WriteLeft) {
            // the fault: the oldest kept entry at slot 0, newer ones to the right
            let kept = first.min(past_len);
            return Some(s + kept - first);
        }
        Some(past_len - (first - s))
    }
}

/// Translates the driver's logical attention mask (over real positions 0..total) into slots of
/// a run and ANDs it with GenAI's: a slot keeps GenAI's value where the logical mask allows its
/// token; pads and empty slots keep GenAI's value. The ring mask (all ones) leaves GenAI's mask
/// unchanged.
pub fn apply_logical_mask(st: &WindowState, plan: &mut RunPlan, logical: &[i64]) -> Result<()> {
    if st.faults.contains(&HostFault::MaskAllValid) {
        // the fault's mask ignores what the request asked for
        return Ok(());
    }
    let c = st.geom.context;
    let q = plan.ids.len();
    for slot in 0..c {
        // padded index of the slot: past slots end right before `first`, then the run's tokens
        let s = if slot < plan.past_len {
            (plan.first + slot) as i64 - plan.past_len as i64
        } else {
            (plan.first + slot - plan.past_len) as i64
        };
        if slot >= plan.past_len && slot - plan.past_len >= q {
            continue;
        }
        if s < st.npad as i64 {
            continue;
        }
        let p = s as usize - st.npad;
        if let Some(&allowed) = logical.get(p) {
            if allowed == 0 {
                plan.mask[slot] = 0;
            }
        } else if p < st.real_len() {
            return Err(Error::InvalidArgument(format!(
                "mask of {} positions for a run reaching position {p}",
                logical.len()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geom(w: usize, c: usize) -> WindowGeom {
        WindowGeom {
            window: w,
            context: c,
            max_length: c,
            pad_value: 128,
            pad_token: 0,
            heads: 1,
            head_dim: 1,
        }
    }

    #[test]
    fn the_worked_example_of_genai_pr_1138() {
        // W = 5, C = 12, an 8-token prompt: chunk 1 is [pad, pad, What, is, the], positions
        // [0, 0, 0, 1, 2], mask 9 zeros then 3 ones (contract doc §3, by hand)
        let mut st = WindowState::new(geom(5, 12), vec![]);
        let p = st.prompt(&[11, 12, 13, 14, 15, 16, 17, 18]).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].ids, vec![0, 0, 11, 12, 13]);
        assert_eq!(p[0].positions, vec![0, 0, 0, 1, 2]);
        assert_eq!(p[0].mask, [vec![0; 9], vec![1; 3]].concat());
        assert_eq!(p[0].past_len, 7);
        // chunk 2 continues the positions and adds W ones to the left of the run
        assert_eq!(p[1].positions, vec![3, 4, 5, 6, 7]);
        assert_eq!(p[1].mask, [vec![0; 4], vec![1; 8]].concat());
        // a token: past C - 1, position 8, one more slot
        let t = st.token(99).unwrap();
        assert_eq!((t.positions.clone(), t.past_len), (vec![8], 11));
        assert_eq!(t.mask, [vec![0; 3], vec![1; 9]].concat());
        // slots are right-aligned: for the token (first new index 10, past 11) the newest past
        // entry (padded index 9) sits at slot 10, the oldest (0) at slot 1; for chunk 2 (first 5,
        // past 7) index 4 at slot 6; an entry not written yet has no slot
        assert_eq!(st.slot(9, 10, 11), Some(10));
        assert_eq!(st.slot(0, 10, 11), Some(1));
        assert_eq!(st.slot(4, 5, 7), Some(6));
        assert_eq!(st.slot(10, 10, 11), None);
    }

    #[test]
    fn capacity_is_refused_and_the_fault_continues() {
        let mut st = WindowState::new(geom(4, 8), vec![]);
        assert!(st.prompt(&[1; 9]).is_err(), "12 padded > L = 8");
        st.prompt(&[1; 5]).unwrap();
        assert!(st.token(2).is_err(), "8 padded + 1 > 8");
        let mut bad = WindowState::new(geom(4, 8), vec![HostFault::CapacitySilent]);
        bad.prompt(&[1; 5]).unwrap();
        assert!(bad.token(2).is_ok());
    }

    #[test]
    fn faults_change_what_the_graph_gets() {
        let mut st = WindowState::new(geom(4, 12), vec![HostFault::PositionStall]);
        st.prompt(&[5, 6, 7, 8, 9, 10]).unwrap();
        assert_eq!(st.token(1).unwrap().positions, vec![5]);
        assert_eq!(st.token(2).unwrap().positions, vec![5]);
        let mut st = WindowState::new(geom(4, 12), vec![HostFault::MaskAllValid]);
        let p = st.prompt(&[5, 6, 7]).unwrap();
        assert_eq!(
            p[0].mask,
            [vec![0; 8], vec![1; 4]].concat(),
            "the pad is visible"
        );
        let st = WindowState::new(geom(4, 12), vec![HostFault::WriteLeft]);
        assert_eq!(
            st.slot(3, 4, 8),
            Some(3),
            "left end: padded index 3 of 4 at slot 3"
        );
        assert_eq!(st.slot(0, 4, 8), Some(0));
    }

    #[test]
    fn rewind_restores_the_bookkeeping_of_a_shorter_request() {
        let mut st = WindowState::new(geom(4, 12), vec![]);
        st.prompt(&[5, 6, 7]).unwrap();
        let a = st.token(1).unwrap();
        st.token(2).unwrap();
        // back to the 3 prompt tokens: the first token's run is built again, identically
        assert!(st.rewind(3).is_some());
        assert_eq!(st.token(1).unwrap(), a);
        assert!(st.rewind(2).is_none(), "inside the prompt: replay");
    }

    #[test]
    fn logical_masks_map_to_slots() {
        let mut st = WindowState::new(geom(4, 12), vec![]);
        st.prompt(&[5, 6, 7]).unwrap();
        let mut t = st.token(9).unwrap();
        // self only: real positions 0..3 blocked, the token (position 3) allowed
        apply_logical_mask(&st, &mut t, &[0, 0, 0, 1]).unwrap();
        assert_eq!(t.mask, [vec![0; 11], vec![1]].concat());
    }
}
